// Completion state shared between the progress engine (which finishes operations) and user
// threads (which test or wait on them through nexar::Request).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nexar/error.hpp>
#include <nexar/request.hpp>

namespace nexar::detail {

/// Lets a thread waiting for an operation drive the engine that will complete it.
class Progress {
 public:
  virtual ~Progress() = default;
  /// Makes progress if the engine is free right now; returns whether it ran. With
  /// `bounded`, the caller has a short deadline of its own: do nothing that may take long
  /// (such as running a whole collective).
  virtual bool poll(bool bounded) = 0;
  /// A waiter starts (+1) or stops (-1) polling. While any polls, the engine thread does
  /// not watch the socket, so a waiter counted here must really poll (or stop counting
  /// before it blocks on anything else).
  virtual void waiting(int delta) = 0;
  /// A counted waiter has polled for a while without finishing: the engine thread should
  /// stop waking for what the waiter will read itself. Waits shorter than that (most on
  /// shared memory) then cost no system call for it.
  virtual void settle() {}
  /// How long a waiter that starts polling at `now` polls before it settle()s.
  virtual std::chrono::microseconds settle_delay(std::chrono::steady_clock::time_point /*now*/) {
    return std::chrono::microseconds(0);
  }
  /// Before polling: runs the work that completes the operation on the waiting thread, if
  /// it can; returns whether it ran. Not for bounded waits.
  virtual bool run_here() { return false; }
  /// A waiter is about to sleep until the operation completes: whatever completes it must
  /// be running now.
  virtual void sleeping() {}
  /// The waiter that called sleeping() is awake again.
  virtual void woke() {}
};

class OpState {
 public:
  using Clock = std::chrono::steady_clock;

  /// `start` defaults to now; a caller that just read the clock for `deadline` passes that
  /// reading instead of paying for a second one (tens of ns, per operation).
  OpState(const char* op, Clock::time_point deadline, Clock::time_point start = Clock::now())
      : op_(op), start_(start), deadline_(deadline) {}

  /// Finishes the operation; the first call wins, later ones are ignored. Any thread.
  /// Returns true if this call finished it.
  bool complete(Errc code, std::string message = {}, Status status = {});
  bool succeed(Status status = {}) { return complete(Errc::ok, {}, status); }
  /// Fails the operation because members of its communicator failed: `failed` are their
  /// ranks there, handed to the nexar::Error the waiter throws.
  bool fail_ranks(Errc code, std::string message, std::vector<int> failed);

  bool done() const noexcept { return state_.load(std::memory_order_acquire) == done_state; }

  /// Waits until done or `until`; spins for `spin` first. Returns done(). `bounded`: the
  /// caller's deadline is its own (wait_for), see Progress::poll.
  bool wait_until(Clock::time_point until, std::chrono::microseconds spin, bool bounded = false);

  Errc code() const noexcept { return code_; }
  const std::string& message() const noexcept { return message_; }
  const Status& status() const noexcept { return status_; }
  /// Adds `text` to the timeout this operation may still end with (a stall report): its
  /// message then ends with " (<text>)". Any thread; a note that comes while the operation
  /// completes may be left out.
  void annotate(std::string text);
  /// Set by fail_ranks(); empty otherwise. Valid once done().
  const std::vector<int>& failed_ranks() const noexcept { return failed_; }
  const char* op() const noexcept { return op_; }
  Clock::time_point start() const noexcept { return start_; }
  /// When it completed, if `stamp_end` was set before it did (a trace wants it; the
  /// clock is not read otherwise); the clock's epoch until then. Valid once done().
  Clock::time_point ended() const noexcept { return ended_; }
  Clock::time_point deadline() const noexcept { return deadline_; }

  /// Installed by whoever started the operation: asks the engine to cancel it with `code`
  /// (Errc::cancelled or Errc::timeout). Must be callable from any thread.
  std::function<void(Errc)> canceller;
  /// Runs in the waiting thread just before Request::wait() or wait_for() throws this
  /// operation's failure (its communicator learns that the application saw it). Set by
  /// whoever started the operation, before the Request is handed out.
  std::function<void(Errc)> before_throw;
  /// Set before the operation can complete: it reads the clock when it does (ended()).
  bool stamp_end = false;
  /// Spin budget for waiters (from the communicator's Config).
  std::chrono::microseconds spin{0};
  /// Waiters give up the core after every poll while they spin (Config::yield_when_idle).
  bool yield_when_idle = false;
  /// The engine a waiter may drive while it spins; empty for standalone operations.
  std::weak_ptr<Progress> progress;
  /// Owned alternative to `progress` (collectives: the waiter may run the collective).
  std::shared_ptr<Progress> helper;

 private:
  static constexpr std::uint32_t pending = 0, pending_waiters = 1, done_state = 2;
  /// Stores the result and wakes the waiters, once the caller claimed the completion.
  bool finish(Errc code, std::string message, Status status);
  std::atomic<std::uint32_t> state_{pending};
  std::atomic<bool> claimed_{false};
  const char* op_;
  Clock::time_point start_;
  Clock::time_point deadline_;
  Clock::time_point ended_{};
  Errc code_ = Errc::ok;
  std::string message_;
  Status status_;
  std::vector<int> failed_;
  std::atomic<bool> noted_{false};
  std::mutex note_mu_;
  std::string note_;
};

}  // namespace nexar::detail
