#include "comm/dump_signal.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "comm/watchdog.hpp"
#include "core/log.hpp"

namespace nexar::detail {
namespace {

struct Dumps {
  std::mutex mu;
  std::set<const Watchdog*> watchdogs;
  bool installed = false;
  int pipe_fds[2] = {-1, -1};
};

// Leaked on purpose: the signal's thread and a late signal may outlive static destruction.
Dumps& dumps() {
  static Dumps* const d = new Dumps;
  return *d;
}

int g_signal_pipe = -1;  // write end, read by the handler

extern "C" void on_dump_signal(int) {
  const int saved = errno;
  const char byte = 1;
  [[maybe_unused]] const ssize_t n = ::write(g_signal_pipe, &byte, 1);
  errno = saved;
}

void write_dump() {
  namespace fs = std::filesystem;
  const char* dir = std::getenv("NEXAR_DUMP_DIR");
  const fs::path base = dir && *dir ? fs::path(dir) : fs::temp_directory_path();
  const fs::path path = base / fmt::format("nexar-dump-{}.json", ::getpid());
  const fs::path tmp = base / fmt::format(".nexar-dump-{}.json.part", ::getpid());
  const std::string text = process_dump();
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f) {
    log::warn("dump: cannot write {}", tmp.string());
    return;
  }
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok) {
    log::warn("dump: cannot write {}", tmp.string());
    return;
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) log::warn("dump: cannot rename {} to {}: {}", tmp.string(), path.string(), ec.message());
  else log::warn("dump: wrote {}", path.string());
}

// The handler and its thread, once per process (dumps().mu held).
void install(Dumps& d) {
  d.installed = true;
  struct sigaction old {};
  if (::sigaction(SIGUSR1, nullptr, &old) != 0 || old.sa_handler != SIG_DFL) return;
  if (::pipe2(d.pipe_fds, O_CLOEXEC) != 0) return;
  g_signal_pipe = d.pipe_fds[1];
  std::thread([fd = d.pipe_fds[0]] {
    for (;;) {
      char byte;
      const ssize_t n = ::read(fd, &byte, 1);
      if (n == 1) write_dump();
      else if (n < 0 && errno != EINTR) return;
    }
  }).detach();
  struct sigaction sa {};
  sa.sa_handler = on_dump_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ::sigaction(SIGUSR1, &sa, nullptr);
}

}  // namespace

void add_to_dumps(const Watchdog* w) {
  Dumps& d = dumps();
  std::lock_guard lk(d.mu);
  d.watchdogs.insert(w);
  if (!d.installed) install(d);
}

void remove_from_dumps(const Watchdog* w) {
  Dumps& d = dumps();
  std::lock_guard lk(d.mu);
  d.watchdogs.erase(w);
}

std::string process_dump() {
  Dumps& d = dumps();
  std::string out = fmt::format(R"({{"pid":{},"time_us":{},"ranks":[)", ::getpid(),
                                std::chrono::duration_cast<std::chrono::microseconds>(
                                    std::chrono::system_clock::now().time_since_epoch())
                                    .count());
  std::lock_guard lk(d.mu);
  bool first = true;
  for (const Watchdog* w : d.watchdogs) {
    if (!first) out += ',';
    out += w->dump();
    first = false;
  }
  return out + "]}";
}

}  // namespace nexar::detail
