// nexar-run --dump FILE: a dump of the whole job on demand. The ranks get NEXAR_DUMP_DIR, a
// directory of nexar-run's own; on SIGUSR1 nexar-run sends SIGUSR1 to every running rank
// (which writes its dump there: the library's comm/dump_signal), waits for their files,
// and merges them into FILE, one JSON object:
//   {"time_us": ..., "ranks": [<each rank's dump, by world rank>], "behind": {<comm>: [world ranks]}}
// and prints a summary: per communicator, how far each rank has got (collectives called and
// completed, what it is doing), and the ranks behind the others.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

namespace nexar_run {

class DumpCollector {
 public:
  /// Collects into `file`; makes the directory the ranks write to.
  explicit DumpCollector(std::string file);
  /// Removes the directory and what is left in it.
  ~DumpCollector();
  DumpCollector(const DumpCollector&) = delete;
  DumpCollector& operator=(const DumpCollector&) = delete;

  /// The ranks' NEXAR_DUMP_DIR.
  const std::string& dir() const noexcept { return dir_; }
  /// Forgets the files of an earlier dump: call before signalling the ranks.
  void clear();
  /// Waits until `expected` processes wrote their dump or `wait` passed, then merges what
  /// came into the file. Returns the summary, one line per entry.
  std::vector<std::string> collect(std::size_t expected, std::chrono::milliseconds wait);

 private:
  std::string file_;
  std::string dir_;
};

}  // namespace nexar_run
