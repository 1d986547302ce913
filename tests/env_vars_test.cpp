// Tests of the table of NEXAR_* variables (src/core/env_vars.*): the warning
// Config::from_env() gives for a variable nothing reads, and that the table's Config
// entries are exactly what from_env() reads (the launcher's are checked in
// launch_env_test.cpp).
#include <gtest/gtest.h>

#include <nexar/config.hpp>
#include <nexar/error.hpp>

#include <cstdlib>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "core/env_vars.hpp"
#include "core/log.hpp"

using nexar::Config;
using nexar::LogLevel;
using nexar::detail::closest_env_var;
using nexar::detail::EnvReader;
using nexar::detail::kEnvVars;
using nexar::detail::unknown_env_message;
using nexar::detail::unknown_env_vars;

namespace {

bool contains(std::string_view s, std::string_view part) {
  return s.find(part) != std::string_view::npos;
}

// Unsets the given variables for the test and puts the original values back after it.
class ScopedClear {
 public:
  explicit ScopedClear(std::vector<std::string> names) : names_(std::move(names)) {
    for (const auto& n : names_) {
      if (const char* old = std::getenv(n.c_str())) saved_[n] = old;
      ::unsetenv(n.c_str());
    }
  }
  ~ScopedClear() {
    for (const auto& n : names_) {
      auto it = saved_.find(n);
      if (it != saved_.end()) {
        ::setenv(n.c_str(), it->second.c_str(), 1);
      } else {
        ::unsetenv(n.c_str());
      }
    }
  }
  ScopedClear(const ScopedClear&) = delete;
  ScopedClear& operator=(const ScopedClear&) = delete;

 private:
  std::vector<std::string> names_;
  std::map<std::string, std::string> saved_;
};

std::vector<std::string> config_vars() {
  std::vector<std::string> out;
  for (const auto& v : kEnvVars) {
    if (v.reader == EnvReader::config) out.emplace_back(v.name);
  }
  return out;
}

// What from_env() writes to stderr, at log level warn.
std::string from_env_stderr() {
  const LogLevel saved = nexar::log::level();
  nexar::log::set_level(LogLevel::warn);
  testing::internal::CaptureStderr();
  (void)Config::from_env();
  std::string out = testing::internal::GetCapturedStderr();
  nexar::log::set_level(saved);
  return out;
}

}  // namespace

TEST(EnvVars, TableIsWellFormed) {
  std::set<std::string_view> seen;
  for (const auto& v : kEnvVars) {
    EXPECT_EQ(v.name.substr(0, 6), "NEXAR_") << v.name;
    EXPECT_TRUE(seen.insert(v.name).second) << "listed twice: " << v.name;
    EXPECT_EQ(nexar::detail::find_env_var(v.name), &v);
  }
  EXPECT_EQ(nexar::detail::find_env_var("NEXAR_NOPE"), nullptr);
}

TEST(EnvVars, ClosestKnownName) {
  EXPECT_EQ(closest_env_var("NEXAR_FAILURE_TIMOUT_MS"), "NEXAR_FAILURE_TIMEOUT_MS");
  EXPECT_EQ(closest_env_var("NEXAR_TIEMOUT_MS"), "NEXAR_TIMEOUT_MS");  // transposition
  EXPECT_EQ(closest_env_var("NEXAR_TIMEOUT"), "NEXAR_TIMEOUT_MS");
  EXPECT_EQ(closest_env_var("NEXAR_SEED_ADDRESS"), "NEXAR_SEED_ADDR");
  EXPECT_EQ(closest_env_var("NEXAR_EAGER_LIMIT"), "NEXAR_EAGER_LIMIT_BYTES");  // a word less
  EXPECT_EQ(closest_env_var("NEXAR_SHM_RING_BYTES_MAX"), "NEXAR_SHM_RING_BYTES");  // a word more
  EXPECT_EQ(closest_env_var("NEXAR_relay_hops"), "NEXAR_RELAY_HOPS");  // names are upper case
  EXPECT_EQ(closest_env_var("NEXAR_WIBBLE"), "");  // nothing close
  EXPECT_EQ(closest_env_var("NEXAR_"), "");
}

TEST(EnvVars, Messages) {
  EXPECT_EQ(unknown_env_message("NEXAR_FAILURE_TIMOUT_MS"),
            "NEXAR_FAILURE_TIMOUT_MS is not a nexar setting "
            "(did you mean NEXAR_FAILURE_TIMEOUT_MS?)");
  EXPECT_EQ(unknown_env_message("NEXAR_WIBBLE"),
            "NEXAR_WIBBLE is not a nexar setting (docs/CONFIG.md lists them)");
}

TEST(EnvVars, UnknownNamesOfAnEnvironment) {
  const char* const env[] = {"PATH=/bin",
                             "NEXAR_TIMEOUT_MS=5",
                             "NEXAR_TIMEOUTMS=5",
                             "NEXAR_RANK=0",
                             "NEXAR_RUN_GRACE_MS=10",
                             "NEXAR_JOBS=2",
                             "NEXAR_EMPTY=",
                             "NEXAR_NO_VALUE",
                             "nexar_timeout_ms=1",
                             "XNEXAR_FOO=1",
                             nullptr};
  EXPECT_EQ(unknown_env_vars(env),
            (std::vector<std::string>{"NEXAR_TIMEOUTMS", "NEXAR_EMPTY", "NEXAR_NO_VALUE"}));
  EXPECT_TRUE(unknown_env_vars(nullptr).empty());
}

// The warning itself, as from_env() logs it: once per variable and process.
TEST(EnvVars, FromEnvWarnsOfAMisspelledVariableOnce) {
  const ScopedClear clear(config_vars());
  const ScopedClear typo({"NEXAR_FAILURE_TIMOUT_MS"});
  ::setenv("NEXAR_FAILURE_TIMOUT_MS", "5000", 1);
  const std::string out = from_env_stderr();
  EXPECT_TRUE(contains(out, "[nexar] [warning] [t")) << out;
  EXPECT_TRUE(contains(out, "] NEXAR_FAILURE_TIMOUT_MS is not a nexar setting (did you mean "
                            "NEXAR_FAILURE_TIMEOUT_MS?)\n"))
      << out;
  EXPECT_FALSE(contains(from_env_stderr(), "NEXAR_FAILURE_TIMOUT_MS")) << "reported twice";
}

TEST(EnvVars, FromEnvIsQuietAboutKnownVariables) {
  const ScopedClear clear(config_vars());
  ::setenv("NEXAR_FAILURE_TIMEOUT_MS", "5000", 1);
  ::setenv("NEXAR_SHM_RING_BYTES", "2M", 1);
  const std::string out = from_env_stderr();
  EXPECT_FALSE(contains(out, "NEXAR_FAILURE_TIMEOUT_MS")) << out;
  EXPECT_FALSE(contains(out, "NEXAR_SHM_RING_BYTES")) << out;
  EXPECT_EQ(Config::from_env().failure_timeout, std::chrono::milliseconds(5000));
}

TEST(EnvVars, TheTraceDirectoryIsRead) {
  const ScopedClear clear(config_vars());
  ::setenv("NEXAR_TRACE", "/tmp/nexar traces", 1);
  EXPECT_EQ(Config::from_env().trace, "/tmp/nexar traces");
  ::unsetenv("NEXAR_TRACE");
  EXPECT_EQ(Config::from_env().trace, "");
}

// Every Config entry of the table is read by from_env(): a bad value is refused naming the
// variable. (from_env() can read only listed variables: EnvName checks at compile time.)
TEST(EnvVars, FromEnvReadsEveryConfigEntry) {
  const ScopedClear clear(config_vars());
  for (const std::string& name : config_vars()) {
    SCOPED_TRACE(name);
    if (name == "NEXAR_TRACE") continue;  // any text names a directory (settings_test reads it)
    ::setenv(name.c_str(), "?", 1);
    std::optional<std::string> what;
    try {
      (void)Config::from_env();
    } catch (const nexar::Error& e) {
      EXPECT_EQ(e.code(), nexar::Errc::invalid_argument);
      what = e.what();
    }
    ::unsetenv(name.c_str());
    ASSERT_TRUE(what) << name << "='?' was accepted: is it still read?";
    EXPECT_TRUE(contains(*what, name)) << *what;
  }
}
