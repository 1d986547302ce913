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
// (world: the members at the end; failures: every member lost over the whole run). In an
// elastic job the loop also admits joiners, and a lost rank can be replaced:
//
//   nexar-run -n 4 --max-restarts 3 build/bin/resilient_loop --steps 600 --step-ms 20
//
// restarts a killed rank as a joiner of the running job; the members grow it in at the start
// of a step, it catches up, and the run ends with world=4 failures=1 wrong=0.
//
// It must be started by a launcher (nexar-run, or anything nexar::join_from_env()
// understands: nexar-seed's environment file, torchrun, mpirun, srun); every process is one
// rank. Every step all-reduces (sum) --count float64 values; element i of world rank w at
// step s is a small integer f(s, w, i), so every sum is exact and each rank checks the
// result against the sum over the members present in the communicator at that step
// (Communicator::world_ranks()). A mismatch counts as `wrong`.
//
// Failure policy (Config::on_failure): --policy, else NEXAR_ON_FAILURE, else automatic.
//  * automatic: an all_reduce that meets a failed member throws nexar::Error(rank_failed);
//    the next call on the communicator rebuilds it in place (the runtime agrees with the
//    survivors and shrinks); the loop retries the step.
//  * manual: the loop catches rank_failed, calls agree() and shrink() itself (timing both)
//    and retries the step on the shrunk communicator.
//  * abort: a failure is fatal (exit 1).
// Survivors may be a step apart after a failure: one may have finished the step the others
// failed. So every all_reduce carries more elements after the data, among them 1 and the step
// index: its result says how many members took part and the sum of their steps, the same for
// all of them, and when the steps differ everybody goes back to the earliest one.
// Joiners (elastic jobs: nexar-run --elastic or --max-restarts, nexar-seed --elastic): each
// all_reduce also counts the members whose Communicator::pending_joiners() is at least
// --min-joiners; when that is every member, every member calls grow() at the start of the
// next step (manual policy: agree() first, so
// that it pairs with the agree() of a member recovering meanwhile). A joiner (its communicator
// is joined_by_grow()) does not know the step or the failure count: it contributes neither,
// the result shows that one member did not, and everybody takes the step (the earliest, as
// above) and the count from that result, which counts for nothing else. A grow right after a
// recovery works the same; a grow that meets a member's shrink (it did not see the joiners
// because its all_reduce failed) admits nobody, and the joiners wait for the next one.
// The run ends with an all_reduce of
// the `wrong` counts, then (manual) an agree() that every live member leaves with the same
// answer: if a member was still recovering, everybody recovers and ends again together.
// Under automatic there is no such closing agreement (the runtime's own would interleave
// with it): a rank failing during that very last all_reduce can leave a survivor that
// finished while another recovers alone.
//
// Options:
//   --steps N          steps to run (default 100)
//   --count ELEMENTS   float64 elements per all_reduce (default 1024)
//   --step-ms MS       minimum wall time of a step: sleep the remainder (default 0)
//   --min-joiners N    grow once every member sees at least N joiners waiting (default 1;
//                      bench/elastic.sh waits for all of a batch to grow once)
//   --policy P         manual | automatic (default: NEXAR_ON_FAILURE, else automatic)
//   --report FILE      per failure event and survivor, one line (appended with one write, so
//                      several ranks can share FILE; "-" is stderr):
//                        resilient_loop_event world_rank=W policy=P step=S size_before=B
//                        size_after=A failed=N error_ns=T notice_ns=T agree_ms=X shrink_ms=Y
//                        first_ms=Z
//                      error_ns: CLOCK_REALTIME when the operation failed (automatic: or when
//                      the rank found the communicator rebuilt); notice_ns: when
//                      Communicator::on_failure first fired (0 if not yet by the report); agree_ms and
//                      shrink_ms: durations of agree() and shrink() (manual policy); under
//                      automatic agree_ms is -1 and shrink_ms is the in-place rebuild (agree
//                      and shrink inside the runtime); first_ms: from the end of the recovery
//                      to the end of the first all_reduce of the loop's data that checked
//                      correct. size_before/size_after: members before and after; failed: how
//                      many failed, as far as this rank learned. Also, per grow and member:
//                        resilient_loop_grow world_rank=W policy=P step=S size_before=B
//                        size_after=A joined=J agree_ms=X grow_ms=Y end_ns=T
//                      (agree_ms: the agree() before grow() under manual, else -1; end_ns:
//                      CLOCK_REALTIME when grow() returned), and per joiner, once it caught up:
//                        resilient_loop_joined world_rank=W rank=R size=N step=S failures=F
//                        first_ms=X first_ns=T
//                      (first_ms: from the start of main to the end of its first all_reduce;
//                      first_ns: CLOCK_REALTIME then).
//   --pid-dir DIR      write this process's pid to DIR/rank<N>.pid (N: world rank, a new one
//                      for a joiner of the running job) once joined
//   --verbose          diagnostics on stderr (also when NEXAR_DEBUG is info or above)
// Stdout carries only the summary line. Exit status: 0 when every check passed, 1 on a
// wrong result or an error that is not a member's failure, 2 for bad usage.
#include <nexar/cluster.hpp>
#include <nexar/nexar.hpp>

#include <fcntl.h>
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
#include <stdexcept>
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
  std::int64_t min_joiners = 1;
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

/// One recovery, from the failure to the first correct all_reduce after it.
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
  Loop(Communicator comm, const Options& o, FailurePolicy policy, const Report& report,
       Clock::time_point started)
      : comm_(std::move(comm)),
        o_(o),
        policy_(policy),
        report_(report),
        started_(started),
        world_rank_(comm_.world_ranks()[static_cast<std::size_t>(comm_.rank())]),
        size_(comm_.size()),
        id_(comm_.id()),
        members_(comm_.world_ranks()),
        know_(!comm_.joined_by_grow()),
        buf_(static_cast<std::size_t>(o.count) + kTail) {
    watch();
  }

  /// Runs every step and the ending; returns the process's exit status.
  int run() {
    for (;;) {
      try {
        if (op()) break;
      } catch (const nexar::Error& e) {
        if (e.code() != Errc::rank_failed || policy_ == FailurePolicy::abort) throw;
        // The others gave up on this rank (it was cut off longer than the failure timeout):
        // there is nothing to recover here.
        const std::vector<int>& failed = e.failed_ranks();
        if (std::find(failed.begin(), failed.end(), rank_) != failed.end()) throw;
        if (++failures_in_a_row_ > kMaxFailuresInARow) throw;
        recover(&e, nullptr, Clock::now());
      }
    }
    const int final_size = comm_.size();
    if (comm_.rank() == lowest_live_) {
      std::printf("resilient_loop: steps=%lld world=%d failures=%lld wrong=%lld\n",
                  static_cast<long long>(o_.steps), final_size - closing_failed_,
                  static_cast<long long>(failures_ + closing_failed_), static_cast<long long>(total_wrong_));
      std::fflush(stdout);
    }
    debug("done: rank %d of %d; %lld all_reduces, %lld out of step, %lld wrong here; %d failure events, "
          "%d grows",
          comm_.rank(), final_size, static_cast<long long>(runs_), static_cast<long long>(out_of_step_),
          static_cast<long long>(wrong_), events_, grows_);
    comm_.close();
    return total_wrong_ == 0 ? 0 : 1;
  }

 private:
  // Every all_reduce carries more elements after the data (the tail), so that its result,
  // the same on every member, tells every member the same things:
  //  * 1 from everybody: how many took part;
  //  * 1 from each member that knows the run's state (every one but a joiner not yet caught
  //    up), and from those the step index, the failure count and its square: a survivor
  //    that finished a step the others failed (the failure reached it a moment later) is
  //    one step ahead, everybody sees it in the same result and goes back to the earliest
  //    step together; a joiner learns the step and the count (all knowers agree on the
  //    count exactly when (sum F)^2 == knowers * sum F^2);
  //  * 1 from each member that sees at least --min-joiners joiners waiting
  //    (pending_joiners()): when every member does, everybody grows at the start of the next
  //    step (grow() admits the joiners every member is connected to).
  static constexpr std::size_t kTail = 6;
  enum Tail : std::size_t { kOne = 0, kKnows, kStep, kFailures, kFailuresSquared, kWaiting };
  static constexpr std::uint64_t kDone = 1;
  // Errors without a single all_reduce in between: past this, give up rather than spin.
  static constexpr int kMaxFailuresInARow = 100;

  /// One all_reduce: step next_ (or, at next_ == steps, the ending's sum of the `wrong`
  /// counts). True when the run is over.
  bool op() {
    const auto t0 = Clock::now();
    // Under the automatic policy any call on a revoked communicator first rebuilds it in
    // place (a collective among the survivors): id() does it here, visibly.
    const auto before_id = Clock::now();
    if (comm_.id() != id_) recover(nullptr, nullptr, before_id);
    if (grow_next_) admit();
    const std::int64_t s = next_;
    const std::size_t n = buf_.size() - kTail;
    std::fill(buf_.begin(), buf_.end(), 0.0);
    if (know_ && s < o_.steps) {
      for (std::size_t i = 0; i < n; ++i) buf_[i] = value(s, world_rank_, i);
    } else if (know_) {
      buf_[0] = static_cast<double>(wrong_);
    }
    double* tail = buf_.data() + n;
    tail[kOne] = 1;
    if (know_) {
      tail[kKnows] = 1;
      tail[kStep] = static_cast<double>(s);
      tail[kFailures] = static_cast<double>(failures_);
      tail[kFailuresSquared] = static_cast<double>(failures_ * failures_);
    }
    tail[kWaiting] = comm_.pending_joiners() >= o_.min_joiners ? 1 : 0;
    rank_ = comm_.rank();
    std::vector<int> members = comm_.world_ranks();
    comm_.all_reduce(buf_, ReduceOp::sum);
    ++runs_;
    failures_in_a_row_ = 0;
    const auto participants = static_cast<std::int64_t>(tail[kOne]);
    const auto taking_part = static_cast<std::int64_t>(tail[kKnows]);
    const auto step_sum = static_cast<std::int64_t>(tail[kStep]);
    const auto failure_sum = static_cast<std::int64_t>(tail[kFailures]);
    if (taking_part < 1) throw std::runtime_error("no member of the communicator knows the run's state");
    if (failure_sum * failure_sum != taking_part * static_cast<std::int64_t>(tail[kFailuresSquared])) {
      // A member has not counted a failure the others have (it had not looked at the rebuilt
      // communicator yet): once it has, the counts agree.
      ++out_of_step_;
      debug("step %lld: the members' failure counts differ: step redone", static_cast<long long>(s));
      return false;
    }
    if (taking_part < participants) {
      // A joiner took part: everybody goes (back) to the earliest step, and the joiner learns
      // it and the failure count. This all_reduce's data counts for nothing.
      next_ = step_sum / taking_part;
      failures_ = failure_sum / taking_part;
      if (!know_) {
        know_ = true;
        report_joined();
      }
      debug("step %lld: %lld joiner(s) caught up: all at step %lld, %lld failure(s) so far",
            static_cast<long long>(s), static_cast<long long>(participants - taking_part),
            static_cast<long long>(next_), static_cast<long long>(failures_));
      return false;
    }
    if (step_sum != taking_part * s) {
      // Out of step: redo the earliest step (they differ by one at most: floor is the min).
      ++out_of_step_;
      next_ = taking_part > 0 ? step_sum / taking_part : next_;
      debug("step %lld: members were out of step (%lld taking part, steps summing to %lld): back to step %lld",
            static_cast<long long>(s), static_cast<long long>(taking_part), static_cast<long long>(step_sum),
            static_cast<long long>(next_));
      return false;
    }
    if (static_cast<std::size_t>(participants) != members.size()) {
      members = comm_.world_ranks();  // rebuilt during the call: it ran on the new members
      if (static_cast<std::size_t>(participants) != members.size()) {
        ++out_of_step_;
        debug("step %lld: %lld members took part, the communicator has %zu: step redone",
              static_cast<long long>(s), static_cast<long long>(participants), members.size());
        return false;
      }
    }
    size_ = static_cast<int>(members.size());
    // Every member sees joiners waiting: everybody saw it in this result, everybody grows next.
    grow_next_ = static_cast<std::int64_t>(tail[kWaiting]) == participants;
    if (s == o_.steps) return finish(static_cast<std::int64_t>(buf_[0]));

    bool ok = true;
    for (std::size_t i = 0; ok && i < n; ++i) {
      double want = 0;
      for (const int w : members) want += value(s, w, i);
      ok = buf_[i] == want;
    }
    if (!ok) {
      ++wrong_;
      std::fprintf(stderr, "resilient_loop[%d]: step %lld: WRONG all_reduce result over members %s\n", world_rank_,
                   static_cast<long long>(s), join_ints(members).c_str());
    } else if (pending_) {
      // The callback runs on a thread of its own: it may come a little after the error.
      pending_->notice_ns = notice_ns_.exchange(0);
      report_event(*pending_);
      pending_.reset();
    }
    ++next_;
    if (o_.step_ms > 0) std::this_thread::sleep_until(t0 + std::chrono::milliseconds(o_.step_ms));
    return false;
  }

  /// The ending, once the sum of everybody's `wrong` counts is in. Under the manual
  /// policy an agree() follows, which every live member leaves with the same answer: if a
  /// member was still recovering from a failure (it agreed 0, see recover()), everybody
  /// recovers and the loop goes on. True when the run is over.
  bool finish(std::int64_t total_wrong) {
    total_wrong_ = total_wrong;
    grow_next_ = false;  // joiners that arrive now are too late: the run is over
    if (policy_ != FailurePolicy::manual) return true;
    const Communicator::Agreement a = comm_.agree(kDone);
    if ((a.value & kDone) == 0) {
      debug("ending: a member is still recovering; recovering with it");
      recover(nullptr, &a, Clock::now());
      return false;
    }
    // Everybody got here. Members that failed since the sum are gone but were counted.
    closing_failed_ = static_cast<int>(a.failed.size());
    lowest_live_ = 0;
    while (std::binary_search(a.failed.begin(), a.failed.end(), lowest_live_)) ++lowest_live_;
    return true;
  }

  /// After a member failed. `e`: the error that said so; null when this rank found the
  /// communicator rebuilt (automatic) or learned it from the ending's agreement `agreed`
  /// (manual). `since`: when this rank found out. Under the manual policy, agrees and
  /// shrinks; under automatic the runtime does both when the communicator is next used, which
  /// this times too.
  void recover(const nexar::Error* e, const Communicator::Agreement* agreed, Clock::time_point since) {
    Event ev;
    ev.error_ns = realtime_ns() - static_cast<std::int64_t>(std::chrono::nanoseconds(Clock::now() - since).count());
    ev.step = next_;
    ev.size_before = size_;
    ev.failed = e != nullptr ? std::max<std::size_t>(1, e->failed_ranks().size())
                : agreed != nullptr ? agreed->failed.size() : 0;
    ++events_;
    // A grow decided on the last all_reduce is off: members whose all_reduce failed did not
    // decide it. The next all_reduce after the recovery decides again, for everybody.
    grow_next_ = false;
    if (e != nullptr)
      debug("step %lld: %s (failed: %s)", static_cast<long long>(next_), e->what(), join_ints(e->failed_ranks()).c_str());
    if (policy_ == FailurePolicy::manual) {
      const auto t0 = Clock::now();
      if (agreed == nullptr) {
        const Communicator::Agreement a = comm_.agree(0);  // 0: "not done", see finish()
        ev.failed = std::max(ev.failed, a.failed.size());
      }
      const auto t1 = Clock::now();
      Communicator next = comm_.shrink();
      const auto t2 = Clock::now();
      comm_ = std::move(next);
      ev.agree_ms = agreed == nullptr ? ms_since(t0, t1) : 0;
      ev.shrink_ms = ms_since(t1, t2);
      watch();
    } else {
      // The rebuild, unless it just happened in op() (then `since` is when it started).
      comm_.id();
      ev.shrink_ms = ms_since(since);
    }
    id_ = comm_.id();
    adopt_members();
    if (ev.failed == 0) ev.failed = static_cast<std::size_t>(std::max(0, size_ - comm_.size()));
    ev.recovered = Clock::now();
    debug("recovered: now rank %d of %d, members %s (agree %.3f ms, %s %.3f ms)", comm_.rank(), comm_.size(),
          join_ints(comm_.world_ranks()).c_str(), ev.agree_ms,
          policy_ == FailurePolicy::manual ? "shrink" : "rebuild", ev.shrink_ms);
    if (!pending_) {
      pending_ = ev;
      return;
    }
    // Again before a correct step (another failure, or the same one seen twice): one
    // recovery, from the first error to now.
    Event& p = *pending_;
    p.failed = std::max(p.failed, ev.failed);
    if (ev.agree_ms >= 0) p.agree_ms = std::max(0.0, p.agree_ms) + ev.agree_ms;
    if (ev.shrink_ms >= 0) p.shrink_ms = std::max(0.0, p.shrink_ms) + ev.shrink_ms;
    p.recovered = ev.recovered;
  }

  /// Admits the waiting joiners: grow() on every member, at the start of the same step.
  /// Under the manual policy an agree() comes first: a member whose last all_reduce failed
  /// (so it did not decide to grow) recovers with agree() and shrink() meanwhile, and the
  /// two calls must pair up; a shrink() meeting a grow() admits nobody and gives both the
  /// same communicator (Communicator::grow). Under automatic the runtime's rebuild is a
  /// shrink() alone, which meets the grow() alike. The joiners catch up in the next
  /// all_reduce (see kTail).
  void admit() {
    grow_next_ = false;
    const int before = comm_.size();
    const std::int64_t step = next_;
    const auto t0 = Clock::now();
    if (policy_ == FailurePolicy::manual) comm_.agree(0);
    const auto t1 = Clock::now();
    Communicator next = comm_.grow();
    const auto t2 = Clock::now();
    comm_ = std::move(next);
    watch();
    id_ = comm_.id();
    const int joined = adopt_members();
    ++grows_;
    const double agree_ms = policy_ == FailurePolicy::manual ? ms_since(t0, t1) : -1.0;
    const double grow_ms = ms_since(t1, t2);
    debug("step %lld: grew from %d to %d members %s (%d joined; agree %.3f ms, grow %.3f ms)",
          static_cast<long long>(step), before, comm_.size(), join_ints(members_).c_str(), joined, agree_ms,
          grow_ms);
    report_.line("resilient_loop_grow world_rank=" + std::to_string(world_rank_) + " policy=" +
                 nexar::to_string(policy_) + " step=" + std::to_string(step) + " size_before=" +
                 std::to_string(before) + " size_after=" + std::to_string(comm_.size()) + " joined=" +
                 std::to_string(joined) + " agree_ms=" + fmt_ms(agree_ms) + " grow_ms=" + fmt_ms(grow_ms) +
                 " end_ns=" + std::to_string(realtime_ns()));
  }

  /// After the communicator changed: members gone count as failures (nobody leaves in an
  /// orderly way here); returns how many members are new.
  int adopt_members() {
    std::vector<int> now = comm_.world_ranks();
    int added = 0;
    for (int w : now) added += std::find(members_.begin(), members_.end(), w) == members_.end() ? 1 : 0;
    for (int w : members_) failures_ += std::find(now.begin(), now.end(), w) == now.end() ? 1 : 0;
    members_ = std::move(now);
    return added;
  }

  /// A joiner's first all_reduce completed: it knows the run's state now.
  void report_joined() const {
    report_.line("resilient_loop_joined world_rank=" + std::to_string(world_rank_) + " rank=" +
                 std::to_string(comm_.rank()) + " size=" + std::to_string(comm_.size()) + " step=" +
                 std::to_string(next_) + " failures=" + std::to_string(failures_) + " first_ms=" +
                 fmt_ms(ms_since(started_)) + " first_ns=" + std::to_string(realtime_ns()));
  }

  void report_event(const Event& ev) const {
    report_.line("resilient_loop_event world_rank=" + std::to_string(world_rank_) + " policy=" +
                 nexar::to_string(policy_) + " step=" + std::to_string(ev.step) + " size_before=" +
                 std::to_string(ev.size_before) + " size_after=" + std::to_string(size_) + " failed=" +
                 std::to_string(ev.failed) + " error_ns=" + std::to_string(ev.error_ns) + " notice_ns=" +
                 std::to_string(ev.notice_ns) + " agree_ms=" + fmt_ms(ev.agree_ms) + " shrink_ms=" +
                 fmt_ms(ev.shrink_ms) + " first_ms=" + fmt_ms(ms_since(ev.recovered)));
  }

  /// Notes when this rank first hears of a failure (for --report).
  void watch() {
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

  // Before comm_: the on_failure callback may run until comm_ is gone.
  std::atomic<std::int64_t> notice_ns_{0};
  Communicator comm_;
  const Options& o_;
  const FailurePolicy policy_;
  const Report& report_;
  const Clock::time_point started_;  // when the process started (main)
  const int world_rank_;
  int size_;                 // members at the last step that ran
  int rank_ = -1;            // this rank's number in the communicator of the last step
  int failures_in_a_row_ = 0;
  std::uint64_t id_;         // the communicator's id as this loop last knew it
  std::vector<int> members_;  // its world ranks then
  // Whether this rank knows the run's state (step, failures): a joiner learns it in its
  // first all_reduce.
  bool know_;
  bool grow_next_ = false;   // the last all_reduce said joiners wait: grow before the next
  std::int64_t failures_ = 0;  // members lost over the whole run
  int grows_ = 0;
  std::vector<double> buf_;  // count values, then the tail (kTail)
  std::int64_t next_ = 0;    // the step to run next; == steps: the ending
  std::optional<Event> pending_;
  std::int64_t runs_ = 0;
  std::int64_t out_of_step_ = 0;
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
               "                      [--min-joiners N] [--policy manual|automatic] [--report FILE]\n"
               "                      [--pid-dir DIR] [--verbose]\n"
               "Run under a launcher, e.g.\n"
               "  nexar-run -n 4 --on-failure continue resilient_loop --steps 300 --step-ms 20\n"
               "and kill -9 one rank while it runs (with --max-restarts 3 instead of --on-failure\n"
               "continue, nexar-run starts it again and the loop admits it). The header of\n"
               "examples/resilient_loop.cpp describes every option and the --report format.\n");
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
    } else if (a == "--min-joiners") {
      o.min_joiners = number(a, arg(), 1);
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
  const auto started = Clock::now();
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
    // A process joining a running (elastic) job waits here until the members grow.
    Communicator comm = nexar::join_from_env(cfg);
    g_world_rank = comm.world_ranks()[static_cast<std::size_t>(comm.rank())];
    if (!o.pid_dir.empty()) write_pid_file(o.pid_dir, g_world_rank);
    debug("%s: rank %d of %d, policy %s, %lld steps of %lld elements, %lld ms each",
          comm.joined_by_grow() ? "joined the running job" : "joined", comm.rank(), comm.size(),
          nexar::to_string(cfg.on_failure), static_cast<long long>(o.steps), static_cast<long long>(o.count),
          static_cast<long long>(o.step_ms));
    Loop loop(std::move(comm), o, cfg.on_failure, report, started);
    return loop.run();
  } catch (const UsageError& e) {
    std::fprintf(stderr, "resilient_loop: %s\n", e.what.c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "resilient_loop[%d]: %s\n", g_world_rank, e.what());
    return 1;
  }
}
