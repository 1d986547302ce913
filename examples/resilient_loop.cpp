// resilient_loop — a training-like loop that survives the loss of ranks.
//
//   nexar-run -n 4 --on-failure continue build/bin/resilient_loop --steps 300 --step-ms 20
//
// and, while it runs, kill one rank from another terminal (`kill -9 <pid>`; --pid-dir DIR
// writes each rank's pid to DIR/rank<N>.pid). The survivors notice, drop the dead rank and
// go on; at the end the lowest surviving rank prints
//
//   resilient_loop: steps=300 world=3 failures=1 wrong=0
//
// It must be started by a launcher (nexar-run, or anything nexar::join_from_env()
// understands: nexar-seed's environment file, torchrun, mpirun, srun); every process is one
// rank. Every step all-reduces (sum) --count float64 values; element i of world rank w at
// step s is a small integer f(s, w, i), so every sum is exact and each rank checks the
// result against the sum over the members present in the communicator at that step
// (Communicator::world_ranks()). A mismatch counts as `wrong`.
//
// Failure policy (Config::on_failure): --policy, else NEXAR_ON_FAILURE, else automatic.
//  * automatic: an all_reduce that meets a failed member throws nexar::Error(rank_failed)
//    and the runtime rebuilds the communicator in place; the loop retries the step.
//  * manual: the loop catches rank_failed, calls agree() and shrink() itself (timing both)
//    and retries the step on the shrunk communicator.
//  * abort: a failure is fatal (exit 1).
// Survivors may be one step apart when a failure strikes (some finished the step before
// the failure reached them), so after every recovery they all-reduce (min) the step to run
// next and carry on from there. The run ends with an all_reduce of the `wrong` counts and an
// agree(), which every live member leaves with the same answer: if a member was still
// recovering, everybody recovers and redoes the ending together.
//
// Options:
//   --steps N          steps to run (default 100)
//   --count ELEMENTS   float64 elements per all_reduce (default 1024)
//   --step-ms MS       minimum wall time of a step: sleep the remainder (default 0)
//   --policy P         manual | automatic (default: NEXAR_ON_FAILURE, else automatic)
//   --report FILE      per failure event and survivor, one line (appended with one write, so
//                      several ranks can share FILE; "-" is stderr):
//                        resilient_loop_event world_rank=W policy=P step=S size_before=B
//                        size_after=A failed=N error_ns=T notice_ns=T agree_ms=X shrink_ms=Y
//                        first_ms=Z
//                      error_ns: CLOCK_REALTIME when the operation failed; notice_ns: when
//                      Communicator::on_failure fired first (0 if it did not); agree_ms and
//                      shrink_ms: durations of agree() and shrink() (manual policy; -1 under
//                      automatic, where the runtime runs them); first_ms: from the end of the
//                      recovery (automatic: the error) to the end of the first all_reduce of
//                      the loop's data that checked correct.
//   --pid-dir DIR      write this process's pid to DIR/rank<N>.pid (N: world rank) once joined
//   --verbose          diagnostics on stderr (also when NEXAR_DEBUG is info or above)
// Stdout carries only the summary line. Exit status: 0 when every check passed, 1 on a
// wrong result or an error that is not a member's failure, 2 for bad usage.
#include <nexar/cluster.hpp>
#include <nexar/nexar.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
using nexar::Communicator;
using nexar::Errc;
using nexar::FailurePolicy;
using nexar::ReduceOp;

struct Options {
  std::int64_t steps = 100;
  std::int64_t count = 1024;
  std::int64_t step_ms = 0;
  std::optional<FailurePolicy> policy;
  std::string report;
  std::string pid_dir;
  bool verbose = false;
};

struct UsageError {
  std::string what;
};

bool g_verbose = false;
int g_world_rank = -1;

void debug(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void debug(const char* fmt, ...) {
  if (!g_verbose) return;
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  std::fprintf(stderr, "resilient_loop[%d]: %s\n", g_world_rank, line);
}

std::int64_t realtime_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

double ms_since(Clock::time_point t0, Clock::time_point t1 = Clock::now()) {
  return std::chrono::duration<double, std::milli>(t1 - t0).count();
}

// ---- the data ------------------------------------------------------------------------

/// Element i of world rank w at step s: an integer in -500..499, so that a float64 sum over
/// any number of ranks a job can have is exact.
double value(std::int64_t s, int w, std::size_t i) {
  const auto x = static_cast<std::uint64_t>(s) * 7 + static_cast<std::uint64_t>(w) * 13 + i * 3;
  return static_cast<double>(x % 1000) - 500;
}

void fill(std::vector<double>& v, std::int64_t s, int w) {
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = value(s, w, i);
}

/// Whether `got` is the sum over `members` (world ranks) of step s's values.
bool correct(const std::vector<double>& got, std::int64_t s, const std::vector<int>& members) {
  for (std::size_t i = 0; i < got.size(); ++i) {
    double want = 0;
    for (const int w : members) want += value(s, w, i);
    if (got[i] != want) return false;
  }
  return true;
}

// ---- output --------------------------------------------------------------------------

/// Appends lines to the --report file, each with a single write(2) so that ranks sharing
/// the file do not interleave.
class Report {
 public:
  explicit Report(const std::string& path) {
    if (path.empty()) return;
    if (path == "-") {
      fd_ = 2;
      return;
    }
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd_ < 0) throw UsageError{"cannot open --report " + path + ": " + std::strerror(errno)};
    owned_ = true;
  }
  ~Report() {
    if (owned_) ::close(fd_);
  }
  Report(const Report&) = delete;
  Report& operator=(const Report&) = delete;

  void line(const std::string& s) const {
    if (fd_ < 0) return;
    const std::string l = s + "\n";
    [[maybe_unused]] const ssize_t n = ::write(fd_, l.data(), l.size());
  }

 private:
  int fd_ = -1;
  bool owned_ = false;
};

void write_pid_file(const std::string& dir, int world_rank) {
  const std::string path = dir + "/rank" + std::to_string(world_rank) + ".pid";
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) throw UsageError{"cannot write " + tmp + ": " + std::strerror(errno)};
  std::fprintf(f, "%ld\n", static_cast<long>(::getpid()));
  const bool ok = std::fclose(f) == 0 && std::rename(tmp.c_str(), path.c_str()) == 0;
  if (!ok) throw UsageError{"cannot write " + path + ": " + std::strerror(errno)};
}

std::string join_ints(const std::vector<int>& v) {
  // Appended piece by piece: `"[" + std::string&&` trips GCC 12's bogus -Wrestrict at -O3.
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s.append(i == 0 ? "" : ",").append(std::to_string(v[i]));
  return s.append("]");
}

// ---- the loop ------------------------------------------------------------------------

/// One recovery, from the failed operation to the first correct all_reduce after it.
struct Event {
  std::int64_t step = 0;
  int size_before = 0;
  std::size_t failed = 0;
  std::int64_t error_ns = 0;
  std::int64_t notice_ns = 0;
  double agree_ms = -1;
  double shrink_ms = -1;
  Clock::time_point recovered;
};

class Loop {
 public:
  Loop(Communicator comm, const Options& o, FailurePolicy policy, const Report& report)
      : comm_(std::move(comm)),
        o_(o),
        policy_(policy),
        report_(report),
        world_rank_(comm_.rank()),
        world_size_(comm_.size()),
        data_(static_cast<std::size_t>(o.count)) {
    watch();
  }

  /// Runs every step and the ending; returns the process's exit status.
  int run() {
    for (;;) {
      try {
        if (resync_) {
          // Survivors may be a step apart: the earliest one's step is redone by all.
          std::int64_t next = next_;
          comm_.all_reduce(std::span<std::int64_t>(&next, 1), ReduceOp::min);
          if (next != next_) debug("resync: step %lld -> %lld", static_cast<long long>(next_),
                                   static_cast<long long>(next));
          next_ = next;
          resync_ = false;
        }
        if (next_ < o_.steps) {
          step();
        } else if (finish()) {
          break;
        }
      } catch (const nexar::Error& e) {
        if (e.code() != Errc::rank_failed || policy_ == FailurePolicy::abort) throw;
        recover(&e);
      }
    }
    const int final_rank = comm_.rank();
    const int final_size = comm_.size();
    if (final_rank == lowest_live_) {
      std::printf("resilient_loop: steps=%lld world=%d failures=%d wrong=%lld\n",
                  static_cast<long long>(o_.steps), final_size - closing_failed_,
                  world_size_ - final_size + closing_failed_, static_cast<long long>(total_wrong_));
      std::fflush(stdout);
    }
    debug("done: rank %d of %d, %lld steps run (retries included), %lld wrong here, %d failure "
          "events seen",
          final_rank, final_size, static_cast<long long>(runs_), static_cast<long long>(wrong_),
          events_);
    comm_.close();
    return total_wrong_ == 0 ? 0 : 1;
  }

 private:
  /// Runs step next_, checks it, and moves on.
  void step() {
    const auto t0 = Clock::now();
    const std::int64_t s = next_;
    const std::vector<int> members = comm_.world_ranks();
    size_ = static_cast<int>(members.size());
    fill(data_, s, world_rank_);
    comm_.all_reduce(data_, ReduceOp::sum);
    ++runs_;
    bool ok = correct(data_, s, members);
    if (!ok) {
      // Rebuilt in place during the call (automatic policy)? Then it ran on the new members.
      const std::vector<int> now = comm_.world_ranks();
      ok = now != members && correct(data_, s, now);
    }
    if (!ok) {
      ++wrong_;
      debug("step %lld: WRONG all_reduce result over members %s", static_cast<long long>(s),
            join_ints(members).c_str());
    }
    if (pending_ && ok) {
      const Event& ev = *pending_;
      report_.line("resilient_loop_event world_rank=" + std::to_string(world_rank_) +
                   " policy=" + nexar::to_string(policy_) + " step=" + std::to_string(ev.step) +
                   " size_before=" + std::to_string(ev.size_before) + " size_after=" +
                   std::to_string(comm_.size()) + " failed=" + std::to_string(ev.failed) +
                   " error_ns=" + std::to_string(ev.error_ns) + " notice_ns=" +
                   std::to_string(ev.notice_ns) + " agree_ms=" + fmt_ms(ev.agree_ms) +
                   " shrink_ms=" + fmt_ms(ev.shrink_ms) + " first_ms=" +
                   fmt_ms(ms_since(ev.recovered)));
      pending_.reset();
    }
    ++next_;
    if (o_.step_ms > 0) std::this_thread::sleep_until(t0 + std::chrono::milliseconds(o_.step_ms));
  }

  /// The ending: the sum of everybody's wrong counts, then an agree() that every live member
  /// leaves with the same answer. True when the run is over; false when a member was still
  /// recovering from a failure (value 0 in the agreement), in which case this rank has
  /// recovered too and the loop goes on from the agreed step.
  bool finish() {
    std::int64_t wrong = wrong_;
    comm_.all_reduce(std::span<std::int64_t>(&wrong, 1), ReduceOp::sum);
    total_wrong_ = wrong;
    if (policy_ == FailurePolicy::abort) {  // agree() refuses; nothing to recover anyway
      comm_.barrier();
      return true;
    }
    const Communicator::Agreement a = comm_.agree(kDone);
    if ((a.value & kDone) != 0) {
      // Everybody got here. Members that failed after the sum are gone but counted.
      closing_failed_ = static_cast<int>(a.failed.size());
      lowest_live_ = 0;
      while (std::find(a.failed.begin(), a.failed.end(), lowest_live_) != a.failed.end()) ++lowest_live_;
      return true;
    }
    // Somebody is recovering (its agree() carried 0): recover with it.
    debug("ending: a member is still recovering; recovering too");
    recover(nullptr, &a);
    return false;
  }

  /// After a member failed (`e`: the error, or null when this rank learned it from the
  /// ending's agreement `agreed`): the agreement and shrink under the manual policy (the
  /// runtime does both under automatic), then a resync of the step.
  void recover(const nexar::Error* e, const Communicator::Agreement* agreed = nullptr) {
    Event ev;
    ev.error_ns = realtime_ns();
    ev.notice_ns = notice_ns_.exchange(0);
    ev.step = next_;
    ev.size_before = size_;
    ev.failed = e != nullptr ? std::max<std::size_t>(1, e->failed_ranks().size()) : agreed->failed.size();
    ++events_;
    if (e != nullptr)
      debug("step %lld: %s (failed %s)", static_cast<long long>(next_), e->what(),
            join_ints(e->failed_ranks()).c_str());
    if (policy_ == FailurePolicy::manual) {
      auto t0 = Clock::now();
      if (agreed == nullptr) {
        const Communicator::Agreement a = comm_.agree(0);  // 0: "not done", see finish()
        ev.failed = std::max(ev.failed, a.failed.size());
      }
      auto t1 = Clock::now();
      Communicator next = comm_.shrink();
      auto t2 = Clock::now();
      comm_ = std::move(next);
      ev.agree_ms = agreed == nullptr ? ms_since(t0, t1) : 0;
      ev.shrink_ms = ms_since(t1, t2);
      watch();
    }
    ev.recovered = Clock::now();
    debug("recovered: now rank %d of %d, members %s (agree %.3f ms, shrink %.3f ms)", comm_.rank(),
          comm_.size(), join_ints(comm_.world_ranks()).c_str(), ev.agree_ms, ev.shrink_ms);
    if (!pending_) pending_ = ev;  // a second failure before a correct step: keep the first
    resync_ = true;
  }

  /// Notes when this rank first hears of a failure (for --report).
  void watch() {
    size_ = comm_.size();
    comm_.on_failure([this](const std::vector<int>& failed) {
      std::int64_t zero = 0;
      if (!failed.empty()) notice_ns_.compare_exchange_strong(zero, realtime_ns());
    });
  }

  static std::string fmt_ms(double ms) {
    if (ms < 0) return "-1";
    char b[32];
    std::snprintf(b, sizeof b, "%.3f", ms);
    return b;
  }

  static constexpr std::uint64_t kDone = 1;

  // Before comm_: the on_failure callback may run until comm_ is gone.
  std::atomic<std::int64_t> notice_ns_{0};
  Communicator comm_;
  const Options& o_;
  const FailurePolicy policy_;
  const Report& report_;
  const int world_rank_;
  const int world_size_;
  int size_ = 0;
  std::vector<double> data_;
  std::int64_t next_ = 0;  // the step to run next; == steps: the ending
  bool resync_ = false;
  std::optional<Event> pending_;
  std::int64_t runs_ = 0;
  std::int64_t wrong_ = 0;
  std::int64_t total_wrong_ = 0;
  int events_ = 0;
  int closing_failed_ = 0;
  int lowest_live_ = 0;
};

// ---- command line --------------------------------------------------------------------

void usage(std::FILE* f) {
  std::fprintf(f,
               "usage: resilient_loop [--steps N] [--count ELEMENTS] [--step-ms MS]\n"
               "                      [--policy manual|automatic] [--report FILE] [--pid-dir DIR]\n"
               "                      [--verbose]\n"
               "Run under a launcher, e.g.\n"
               "  nexar-run -n 4 --on-failure continue resilient_loop --steps 300 --step-ms 20\n"
               "and kill -9 one rank while it runs. The header of examples/resilient_loop.cpp\n"
               "describes every option and the --report format.\n");
}

std::int64_t number(std::string_view opt, std::string_view s, std::int64_t min) {
  std::int64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc{} || end != s.data() + s.size() || v < min)
    throw UsageError{std::string(opt) + " wants an integer >= " + std::to_string(min) + ", not '" +
                     std::string(s) + "'"};
  return v;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    auto arg = [&]() -> std::string_view {
      if (i + 1 >= argc) throw UsageError{std::string(a) + " needs a value"};
      return argv[++i];
    };
    if (a == "--steps") {
      o.steps = number(a, arg(), 0);
    } else if (a == "--count") {
      o.count = number(a, arg(), 1);
    } else if (a == "--step-ms") {
      o.step_ms = number(a, arg(), 0);
    } else if (a == "--policy") {
      const std::string_view p = arg();
      if (p == "manual") o.policy = FailurePolicy::manual;
      else if (p == "automatic") o.policy = FailurePolicy::automatic;
      else throw UsageError{"--policy wants manual or automatic, not '" + std::string(p) + "'"};
    } else if (a == "--report") {
      o.report = arg();
    } else if (a == "--pid-dir") {
      o.pid_dir = arg();
    } else if (a == "--verbose" || a == "-v") {
      o.verbose = true;
    } else if (a == "--help" || a == "-h") {
      usage(stdout);
      std::exit(0);
    } else {
      throw UsageError{"unknown argument '" + std::string(a) + "'"};
    }
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  try {
    o = parse(argc, argv);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "resilient_loop: %s\n", e.what.c_str());
    usage(stderr);
    return 2;
  }
  if (!nexar::launched_from_env()) {
    std::fprintf(stderr, "resilient_loop: start it with a launcher (nexar-run -n 4 ...); see --help\n");
    return 2;
  }
  try {
    nexar::Config cfg = nexar::Config::from_env();
    if (o.policy) cfg.on_failure = *o.policy;
    else if (std::getenv("NEXAR_ON_FAILURE") == nullptr) cfg.on_failure = FailurePolicy::automatic;
    g_verbose = o.verbose || cfg.log_level >= nexar::LogLevel::info;
    const Report report(o.report);
    Communicator comm = nexar::join_from_env(cfg);
    g_world_rank = comm.rank();
    if (!o.pid_dir.empty()) write_pid_file(o.pid_dir, comm.rank());
    debug("joined: rank %d of %d, policy %s, %lld steps of %lld elements, %lld ms each", comm.rank(),
          comm.size(), nexar::to_string(cfg.on_failure), static_cast<long long>(o.steps),
          static_cast<long long>(o.count), static_cast<long long>(o.step_ms));
    Loop loop(std::move(comm), o, cfg.on_failure, report);
    return loop.run();
  } catch (const UsageError& e) {
    std::fprintf(stderr, "resilient_loop: %s\n", e.what.c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "resilient_loop[%d]: %s\n", g_world_rank, e.what());
    return 1;
  }
}
