#include "dump.hpp"

#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <nlohmann/json.hpp>

namespace nexar_run {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The finished dumps in `dir`: a rank writes another name and renames it when done.
std::vector<fs::path> finished(const std::string& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("nexar-dump-", 0) == 0 && e.path().extension() == ".json") out.push_back(e.path());
  }
  return out;
}

}  // namespace

DumpCollector::DumpCollector(std::string file) : file_(std::move(file)) {
  std::string pattern = (fs::temp_directory_path() / "nexar-run-dump-XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("cannot make a directory for --dump");
  dir_ = pattern;
}

DumpCollector::~DumpCollector() {
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

void DumpCollector::clear() {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir_, ec)) fs::remove(e.path(), ec);
}

std::vector<std::string> DumpCollector::collect(std::size_t expected, std::chrono::milliseconds wait) {
  const auto until = std::chrono::steady_clock::now() + wait;
  while (finished(dir_).size() < expected && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));

  json ranks = json::array();
  std::vector<std::string> lines;
  for (const auto& path : finished(dir_)) {
    try {
      std::ifstream in(path);
      const json process = json::parse(in);
      for (const auto& r : process.at("ranks")) ranks.push_back(r);
    } catch (const std::exception& e) {
      lines.push_back("cannot read " + path.filename().string() + ": " + e.what());
    }
  }
  std::sort(ranks.begin(), ranks.end(),
            [](const json& a, const json& b) { return a.value("world_rank", -1) < b.value("world_rank", -1); });

  // Per communicator, each member's progress: the most collectives any member has called is
  // where the communicator stands; a member that called fewer is behind.
  struct Progress {
    int world_rank;
    std::uint64_t called, completed;
    std::string doing;
  };
  std::map<std::string, std::vector<Progress>> comms;
  for (const auto& r : ranks)
    for (const auto& c : r.value("comms", json::array()))
      comms[c.value("comm", "?")].push_back(Progress{r.value("world_rank", -1), c.value("called", std::uint64_t{0}),
                                                     c.value("completed", std::uint64_t{0}),
                                                     r.value("doing", std::string())});
  json behind = json::object();
  lines.insert(lines.begin(), "dump of " + std::to_string(ranks.size()) + " rank(s) written to " + file_ +
                                  (ranks.size() < expected ? " (" + std::to_string(expected - ranks.size()) +
                                                                 " did not answer in time)"
                                                           : ""));
  for (const auto& [comm, members] : comms) {
    std::uint64_t most = 0;
    for (const auto& m : members) most = std::max(most, m.called);
    std::ostringstream line;
    line << "communicator " << comm << ":";
    json late = json::array();
    for (const auto& m : members) {
      line << " rank " << m.world_rank << " called " << m.called << ", completed " << m.completed << " ("
           << m.doing << ");";
      if (m.called < most) late.push_back(m.world_rank);
    }
    if (late.empty()) {
      line << " nobody behind";
    } else {
      line << " behind: world rank" << (late.size() > 1 ? "s" : "");
      for (std::size_t i = 0; i < late.size(); ++i) line << (i ? ", " : " ") << late[i].get<int>();
    }
    behind[comm] = late;
    lines.push_back(line.str());
  }
  const json merged = {{"time_us", std::chrono::duration_cast<std::chrono::microseconds>(
                                       std::chrono::system_clock::now().time_since_epoch())
                                       .count()},
                       {"ranks", ranks},
                       {"behind", behind}};
  std::ofstream out(file_);
  out << merged.dump(1) << "\n";
  if (!out) lines.push_back("cannot write " + file_);
  return lines;
}

}  // namespace nexar_run
