// nexar-seed: runs the seed node of one nexar cluster (nexar::Seed) as a program.
//
//   nexar-seed -n 8 --advertise node0 --env-file /run/nexar/cluster.env
//
// Once listening it prints where workers should go, as NEXAR_* lines a shell or a job
// script can pick up, then waits for the cluster to form:
//
//   nexar-seed: listening on 0.0.0.0:29400 for 8 ranks (cluster c-5f1e)
//   NEXAR_SEED_ADDR=node0:29400
//   NEXAR_CLUSTER_TOKEN=...          (only when the token was generated here)
//   NEXAR_SEED_FINGERPRINT=sha256:...
//
// With --elastic it keeps running after formation and admits joiners into the running job
// (they wait until the members grow) until SIGINT or SIGTERM; its normal end is then
// 128+signal.
//
// Exit status: 0 when the cluster formed, 1 when it did not (formation timeout, bind
// failure...), 2 on bad options (a bad --listen address included), 128+signal when stopped
// by SIGINT or SIGTERM.
#include <nexar/cluster.hpp>
#include <nexar/config.hpp>
#include <nexar/error.hpp>

#include <CLI/CLI.hpp>

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

namespace {

// Thrown for problems with the command line or its files that CLI11 cannot see: exit 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }


// "KEY=value", the value single-quoted when it holds anything a POSIX shell would treat
// specially, so the line can be sourced by sh as well as read by env-file parsers.
std::string env_line(const std::string& key, const std::string& value) {
  bool plain = !value.empty();
  for (char c : value) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    std::strchr("_.:/@%+=,-[]", c) != nullptr;
    if (!ok) {
      plain = false;
      break;
    }
  }
  if (plain) return key + "=" + value + "\n";
  std::string quoted = "'";
  for (char c : value) {
    if (c == '\'')
      quoted += "'\\''";
    else
      quoted += c;
  }
  return key + "=" + quoted + "'\n";
}

// Writes `content` to `path` atomically: `path`.tmp with `mode`, then rename over `path`.
void write_file_atomically(const std::string& path, const std::string& content, mode_t mode) {
  const std::string tmp = path + ".tmp";
  ::unlink(tmp.c_str());  // a stale one may have another owner or mode
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) throw std::runtime_error("cannot create " + tmp + ": " + errno_text(errno));
  // The umask may have cleared bits of `mode`; it never adds any, so 0600 stays 0600.
  if (::fchmod(fd, mode) != 0) {
    const int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    throw std::runtime_error("cannot set the mode of " + tmp + ": " + errno_text(err));
  }
  std::size_t done = 0;
  while (done < content.size()) {
    const ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      throw std::runtime_error("cannot write " + tmp + ": " + errno_text(err));
    }
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw std::runtime_error("cannot write " + tmp + ": " + errno_text(err));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw std::runtime_error("cannot rename " + tmp + " to " + path + ": " + errno_text(err));
  }
}

// "host:port" with the host of `bound` replaced by `host` (an IPv6 literal gets brackets).
std::string advertised_address(const std::string& bound, const std::string& host) {
  const auto colon = bound.rfind(':');
  const std::string port = colon == std::string::npos ? std::string() : bound.substr(colon + 1);
  std::string h = host;
  if (h.find(':') != std::string::npos && h.front() != '[') h = "[" + h + "]";
  return port.empty() ? h : h + ":" + port;
}

bool is_wildcard(const std::string& address) {
  return address.rfind("0.0.0.0:", 0) == 0 || address.rfind("[::]:", 0) == 0;
}

// Waits for SIGINT or SIGTERM (blocked in every thread) on its own thread and stops the seed
// when one comes; the main thread's Seed::wait() then throws and main exits 128+signal.
class SignalWatcher {
 public:
  // SIGUSR1 sent to the watcher thread itself ends it; from outside it is ignored.
  static constexpr int kQuit = SIGUSR1;

  explicit SignalWatcher(nexar::Seed& seed) : seed_(seed), thread_([this] { run(); }) {}
  ~SignalWatcher() {
    {
      std::lock_guard lock(mu_);
      done_ = true;
    }
    ::pthread_kill(thread_.native_handle(), kQuit);
    thread_.join();
  }
  SignalWatcher(const SignalWatcher&) = delete;
  SignalWatcher& operator=(const SignalWatcher&) = delete;

  // The signal that stopped the seed, or 0.
  int signal() const { return signal_.load(); }

  static sigset_t signals() {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, kQuit);
    return set;
  }

 private:
  void run() {
    const sigset_t set = signals();
    for (;;) {
      int sig = 0;
      if (::sigwait(&set, &sig) != 0) continue;
      std::lock_guard lock(mu_);
      if (done_) return;
      if (sig == kQuit) continue;
      if (signal_.load() == 0) {
        signal_.store(sig);
        seed_.stop();
      }
    }
  }

  nexar::Seed& seed_;
  std::mutex mu_;
  bool done_ = false;
  std::atomic<int> signal_{0};
  std::thread thread_;
};

void print_stdout(const std::string& text) {
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Runs the seed of a nexar cluster. Workers join it (NEXAR_SEED_ADDR, "
      "NEXAR_CLUSTER_TOKEN); when the world has joined it assigns ranks, signs their "
      "certificates and leaves.",
      "nexar-seed"};
  std::string listen = "0.0.0.0:29400";
  int world = 0;
  int min_world = 0;
  std::int64_t formation_timeout_ms = 120000;
  std::string token;
  std::string token_file;
  bool elastic = false;
  std::string cluster;
  std::string ca_out;
  std::string env_file;
  std::string advertise;

  app.add_option("--listen", listen, "HOST:PORT to listen on (port 0: any free port)")
      ->capture_default_str();
  app.add_option("-n,--world", world, "number of ranks that form the cluster")
      ->required()
      ->check(CLI::Range(1, 1 << 30));
  app.add_option("--min", min_world,
                 "form the cluster with at least N ranks when the formation timeout passes")
      ->check(CLI::Range(1, 1 << 30));
  app.add_option("--formation-timeout-ms", formation_timeout_ms,
                 "how long to wait for the world to join")
      ->capture_default_str()
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 40));
  auto* token_opt = app.add_option("--token", token,
                                   "cluster token (visible to other users in the process list: "
                                   "prefer --token-file or NEXAR_CLUSTER_TOKEN)");
  auto* token_file_opt =
      app.add_option("--token-file", token_file, "file holding the cluster token");
  token_opt->excludes(token_file_opt);
  app.add_option("--cluster", cluster, "cluster name (default: random)");
  app.add_flag("--elastic", elastic,
               "after formation keep admitting nodes into the running job until stopped (the members' "
               "grow() admits them); needs a real token, never one derived from a launcher's job id");
  app.add_option("--ca-out", ca_out, "write the cluster CA certificate (PEM) to PATH");
  app.add_option("--env-file", env_file,
                 "once listening, write the NEXAR_* lines (token included) to PATH, mode 0600");
  app.add_option("--advertise", advertise,
                 "host to print in NEXAR_SEED_ADDR instead of the bound one");
  app.footer(
      "Token: --token, --token-file, else NEXAR_CLUSTER_TOKEN or NEXAR_CLUSTER_TOKEN_FILE, "
      "else a random one is generated and printed.\n"
      "Exit status: 0 cluster formed, 1 it did not, 2 bad options, 130/143 stopped by "
      "SIGINT/SIGTERM.");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }

  std::string token_source;
  try {
    if (min_world > world)
      throw UsageError("--min " + std::to_string(min_world) + " is larger than --world " +
                       std::to_string(world));
    if (*token_file_opt) {
      token = nexar::read_token_file(token_file);
      token_source = "--token-file " + token_file;
    } else if (*token_opt) {
      if (token.empty()) throw UsageError("--token is empty");
      token_source = "--token";
    } else {
      // As join_from_env reads them.
      token = nexar::token_from_env();
      if (!token.empty()) token_source = "the NEXAR_CLUSTER_TOKEN(_FILE) environment";
    }
  } catch (const std::runtime_error& e) {  // UsageError, or the token readers' nexar::Error
    std::cerr << "nexar-seed: " << e.what() << "\nRun with --help for more information.\n";
    return 2;
  }

  // A reader of stdout that went away (nexar-seed | grep -m1 ...) must not kill the seed.
  std::signal(SIGPIPE, SIG_IGN);

  // Block the stop signals before any thread exists, so every thread (the seed's included)
  // inherits the mask and only the watcher's sigwait() sees them.
  const sigset_t stop_signals = SignalWatcher::signals();
  if (const int err = ::pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr); err != 0) {
    std::cerr << "nexar-seed: cannot block signals: " << errno_text(err) << "\n";
    return 1;
  }

  nexar::SeedOptions options;
  options.listen = listen;
  options.world = world;
  options.min_world = min_world;
  options.formation_timeout = std::chrono::milliseconds(formation_timeout_ms);
  options.token = token;
  options.cluster = cluster;
  options.elastic = elastic;

  int stop_signal = 0;
  try {
    nexar::Seed seed(options, nexar::Config::from_env());
    SignalWatcher watcher(seed);
    try {
      const std::string bound = seed.address();
      const std::string addr = advertise.empty() ? bound : advertised_address(bound, advertise);
      if (!ca_out.empty()) write_file_atomically(ca_out, seed.ca_pem(), 0644);
      const std::string addr_line = env_line("NEXAR_SEED_ADDR", addr);
      const std::string token_line = env_line("NEXAR_CLUSTER_TOKEN", seed.token());
      const std::string fp_line = env_line("NEXAR_SEED_FINGERPRINT", seed.fingerprint());
      if (!env_file.empty())
        write_file_atomically(env_file, addr_line + token_line + fp_line, 0600);

      std::string out = "nexar-seed: listening on " + bound + " for " + std::to_string(world) +
                        " ranks (cluster " + seed.cluster() + ")\n" + addr_line;
      out += token_source.empty() ? token_line : "nexar-seed: token: from " + token_source + "\n";
      out += fp_line;
      print_stdout(out);
      if (advertise.empty() && is_wildcard(bound))
        std::cerr << "nexar-seed: note: listening on a wildcard address; pass --advertise HOST "
                     "so NEXAR_SEED_ADDR names a host workers on other machines can reach\n";

      const int formed = seed.wait();
      print_stdout("nexar-seed: cluster formed with " + std::to_string(formed) + " ranks\n");
      if (!elastic) return 0;
      // The membership service of a running job: it admits joiners until stopped.
      print_stdout("nexar-seed: elastic: admitting joiners into the running job until stopped\n");
      while (watcher.signal() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      throw std::runtime_error("stopped");
    } catch (const std::exception&) {
      stop_signal = watcher.signal();
      if (stop_signal == 0) throw;
    }
  } catch (const nexar::Error& e) {
    std::cerr << "nexar-seed: " << e.what() << "\n";
    // A bad --listen address (or NEXAR_* setting) is a usage error.
    return e.code() == nexar::Errc::invalid_argument ? 2 : 1;
  } catch (const std::exception& e) {
    std::cerr << "nexar-seed: " << e.what() << "\n";
    return 1;
  }
  std::cerr << "nexar-seed: stopped by " << (stop_signal == SIGINT ? "SIGINT" : "SIGTERM") << "\n";
  return 128 + stop_signal;
}
