// Tests of the settings table (src/core/settings.hpp, kSettings in src/core/config.cpp): it
// names every Config variable of kEnvVars and nothing else, docs/CONFIG.md's settings tables
// show each variable with the table's default and tier, and describe() prints from it. The
// other variables of kEnvVars (launchers, nexar-run, dumps) are documented too, and
// CONFIG.md names no variable that kEnvVars lacks.
#include <gtest/gtest.h>

#include <nexar/config.hpp>
#include <nexar/error.hpp>

#include <cstdlib>

#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "core/env_vars.hpp"
#include "core/settings.hpp"

#ifndef NEXAR_SOURCE_DIR
#error "NEXAR_SOURCE_DIR (the source tree, for docs/CONFIG.md) must be defined"
#endif

using nexar::Config;
using nexar::detail::EnvReader;
using nexar::detail::kEnvVars;
using nexar::detail::settings;
using nexar::detail::to_string;

namespace {

std::string trim(std::string_view s) {
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  return std::string(s);
}

std::string strip_backticks(std::string s) {
  std::string out;
  for (char c : s) {
    if (c != '`') out += c;
  }
  return out;
}

std::vector<std::string> cells(const std::string& line) {
  std::vector<std::string> out;
  std::size_t start = line.find('|');
  while (start != std::string::npos) {
    const std::size_t next = line.find('|', start + 1);
    if (next == std::string::npos) break;
    out.push_back(trim(std::string_view(line).substr(start + 1, next - start - 1)));
    start = next;
  }
  return out;
}

struct DocRow {
  std::string field, def, tier;
  int count = 0;
};

// The rows of the tables under "## Settings" of docs/CONFIG.md that name a NEXAR_ variable,
// by variable, with the cells of the columns "field", "default" and "tier".
std::map<std::string, DocRow> doc_rows() {
  std::ifstream in(std::string(NEXAR_SOURCE_DIR) + "/docs/CONFIG.md");
  EXPECT_TRUE(in) << "cannot read docs/CONFIG.md under " << NEXAR_SOURCE_DIR;
  std::map<std::string, DocRow> rows;
  std::string line;
  bool in_settings = false;
  std::vector<std::string> header;
  while (std::getline(in, line)) {
    if (line.rfind("## ", 0) == 0) in_settings = line == "## Settings";
    if (!in_settings) continue;
    if (line.rfind("| field |", 0) == 0) {
      header = cells(line);
      continue;
    }
    if (line.rfind("| `", 0) != 0 || header.empty()) continue;
    const auto c = cells(line);
    std::map<std::string, std::string> by_name;
    for (std::size_t i = 0; i < header.size() && i < c.size(); ++i) by_name[header[i]] = c[i];
    const std::string var = strip_backticks(by_name["variable"]);
    if (var.rfind("NEXAR_", 0) != 0) continue;
    DocRow& r = rows[var];
    r.field = strip_backticks(by_name["field"]);
    r.def = strip_backticks(by_name["default"]);
    r.tier = by_name["tier"];
    ++r.count;
  }
  return rows;
}

}  // namespace

TEST(Settings, TableMatchesEnvVars) {
  std::set<std::string> table_vars, fields;
  for (const auto& s : settings()) {
    EXPECT_TRUE(table_vars.insert(std::string(s.var)).second) << s.var << " twice in the table";
    EXPECT_TRUE(fields.insert(std::string(s.field)).second) << s.field << " twice in the table";
    EXPECT_FALSE(s.doc.empty()) << s.field << " has no doc line";
    EXPECT_EQ(s.doc.find('\n'), std::string_view::npos) << s.field << ": doc is one line";
  }
  std::set<std::string> config_vars;
  for (const auto& v : kEnvVars) {
    if (v.reader == EnvReader::config) config_vars.insert(std::string(v.name));
  }
  for (const auto& v : config_vars) {
    EXPECT_TRUE(table_vars.count(v)) << v << " is read by Config::from_env() (kEnvVars) but is "
                                     << "not in the settings table";
  }
  for (const auto& v : table_vars) {
    EXPECT_TRUE(config_vars.count(v)) << v << " is in the settings table but not in kEnvVars "
                                      << "with reader config";
  }
}

TEST(Settings, DocsListEveryVariableWithDefaultAndTier) {
  const auto rows = doc_rows();
  const Config defaults;
  std::set<std::string> table_vars;
  for (const auto& s : settings()) {
    const std::string var(s.var);
    table_vars.insert(var);
    const auto it = rows.find(var);
    if (it == rows.end()) {
      ADD_FAILURE() << var << " (" << s.field << ") is missing from docs/CONFIG.md's settings tables";
      continue;
    }
    const DocRow& r = it->second;
    EXPECT_EQ(r.count, 1) << var << " appears in " << r.count << " settings rows";
    EXPECT_EQ(r.field, s.field) << var;
    const std::string plain = s.plain(defaults);
    const bool starts = r.def.rfind(plain, 0) == 0 &&
                        (r.def.size() == plain.size() || r.def[plain.size()] == ' ');
    EXPECT_TRUE(starts) << var << ": docs/CONFIG.md says default '" << r.def
                        << "', the table '" << plain << "'";
    EXPECT_EQ(r.tier, to_string(s.tier)) << var << ": tier in docs/CONFIG.md";
  }
  for (const auto& [var, r] : rows) {
    EXPECT_TRUE(table_vars.count(var)) << var << " is documented as a setting but not in the table";
  }
}

// Every variable of kEnvVars outside the settings tables (launcher, nexar-run and dump
// readers) is named in docs/CONFIG.md, and every NEXAR_* name there, but for the build
// options and the examples of a misspelling, is one kEnvVars knows: a variable added to
// the code and not the docs, or one the docs still name after the code dropped it, fails.
TEST(Settings, DocsNameEveryOtherVariableAndNoUnknownOne) {
  std::ifstream in(std::string(NEXAR_SOURCE_DIR) + "/docs/CONFIG.md");
  ASSERT_TRUE(in) << "cannot read docs/CONFIG.md under " << NEXAR_SOURCE_DIR;
  std::set<std::string> named;
  const std::regex var(R"(NEXAR_[A-Z0-9_]+)");
  std::string line;
  bool build_options = false;
  while (std::getline(in, line)) {
    if (line.rfind("## ", 0) == 0) build_options = line == "## Build options";
    if (build_options) continue;  // CMake options (NEXAR_BUILD_TESTS ...), not variables
    for (auto it = std::sregex_iterator(line.begin(), line.end(), var); it != std::sregex_iterator(); ++it) {
      named.insert(it->str());
    }
  }
  // The misspellings CONFIG.md shows the unknown-variable warning with.
  const std::set<std::string> examples = {"NEXAR_FAILURE_TIMOUT_MS", "NEXAR_WIBBLE"};
  std::set<std::string> known;
  for (const auto& v : kEnvVars) {
    known.insert(std::string(v.name));
    if (v.reader == EnvReader::scripts) continue;  // the project's own scripts' variables
    EXPECT_TRUE(named.count(std::string(v.name))) << v.name << " is in kEnvVars but docs/CONFIG.md never names it";
  }
  for (const auto& n : named) {
    EXPECT_TRUE(known.count(n) || examples.count(n))
        << n << " is named in docs/CONFIG.md but kEnvVars does not know it";
  }
}

TEST(Settings, DescribeAllOrChanged) {
  Config c;
  EXPECT_EQ(c.describe(), c.describe(true));
  EXPECT_EQ(c.describe(false), "");
  // One line per setting, in the table's order (text settings only when set).
  std::istringstream lines(c.describe());
  std::string line;

  for (const auto& s : settings()) {
    if (s.kind == nexar::detail::SettingKind::text) continue;  // tuning.impair, trace: only when set
    ASSERT_TRUE(std::getline(lines, line)) << s.field;
    EXPECT_EQ(line, std::string(s.field) + " = " + s.show(c));
  }
  EXPECT_FALSE(std::getline(lines, line)) << line;

  c.rpc_threads = 4;
  c.udp_gso = false;
  c.tuning.impair = "seed=1";
  EXPECT_EQ(c.describe(false), "rpc_threads = 4\nudp_gso = off\ntuning.impair = seed=1");
  EXPECT_NE(c.describe().find("op_timeout = 300000 ms\n"), std::string::npos);
}

TEST(Settings, FromEnvReadsEveryVariable) {
  // Every entry's parser reads its own variable: a malformed value is refused naming it.
  for (const auto& s : settings()) {
    const std::string var(s.var);
    if (var == "NEXAR_TRACE") continue;  // any text names a directory
    ASSERT_EQ(setenv(var.c_str(), "bogus!", 1), 0);
    std::string what;
    try {
      (void)Config::from_env();
    } catch (const nexar::Error& e) {
      what = e.what();
    }
    unsetenv(var.c_str());
    EXPECT_NE(what.find(var), std::string::npos) << var << ": '" << what << "'";
  }
}
