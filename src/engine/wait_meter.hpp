// How long the thread running a collective was blocked on its peers: Request::wait() and
// the mailbox waits (comm/communicator_impl_mailboxes.cpp) add to the meter the thread
// installed, if any; the flight recorder splits a collective's time into waiting and
// moving with it (Communicator::stats()), and the trace draws the waits inside the
// collective's span.
// Only a wait that blocks reads the clock: an operation already done costs a load.
#pragma once

#include <chrono>
#include <cstdint>
#include <utility>
#include <vector>

namespace nexar::detail {

struct WaitMeter {
  using Clock = std::chrono::steady_clock;

  Clock::duration waited{0};
  /// When tracing (Config::trace): each wait's start and end, up to kMaxSpans (the last
  /// one then stretches to the end of the later waits).
  bool keep_spans = false;
  std::vector<std::pair<Clock::time_point, Clock::time_point>> spans;
  static constexpr std::size_t kMaxSpans = 256;
  /// When tracing: the algorithm's steps (CollectivePort::step), up to kMaxSpans.
  struct Step {
    const char* name;
    Clock::time_point from, to;
  };
  std::vector<Step> steps;
  /// An algorithm's step over [from, to), kept when tracing, as add() keeps a wait.
  void add_step(const char* name, Clock::time_point from, Clock::time_point to) noexcept {
    if (!keep_spans || steps.size() >= kMaxSpans) return;
    try {
      steps.push_back(Step{name, from, to});
    } catch (...) {
    }
  }

  /// A wait that blocked over [from, to). Called from destructors (Request::wait), so it
  /// never throws: a span that finds no memory is left out of the trace.
  void add(Clock::time_point from, Clock::time_point to) noexcept {
    waited += to - from;
    if (!keep_spans) return;
    if (spans.size() >= kMaxSpans) {
      spans.back().second = to;
      return;
    }
    try {
      spans.emplace_back(from, to);
    } catch (...) {
    }
  }

  /// The meter of the calling thread, or null.
  static WaitMeter* current() noexcept { return slot(); }

  /// Installs `m` on the calling thread for its lifetime, then puts back what was there.
  class Scope {
   public:
    explicit Scope(WaitMeter* m) noexcept : prev_(slot()) { slot() = m; }
    ~Scope() { slot() = prev_; }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    WaitMeter* prev_;
  };

 private:
  static WaitMeter*& slot() noexcept {
    thread_local WaitMeter* m = nullptr;
    return m;
  }
};

}  // namespace nexar::detail
