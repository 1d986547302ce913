// Runs the collectives of one communicator on a thread of their own, one after another in
// the order they were started. Every rank starts its collectives in the same order, so
// running them in that order can never deadlock, and non-blocking collectives progress
// while the application computes.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

namespace nexar::detail {

class CollectiveRunner {
 public:
  struct Task {
    std::function<void()> run;      ///< the algorithm; completes its own Request
    std::function<void()> abandon;  ///< fails the Request when the runner stops first
    std::uint64_t id = 0;           ///< set by submit()
    bool caller_waits = false;      ///< set by submit(); cleared by kick(id)
  };

  CollectiveRunner();
  ~CollectiveRunner();
  CollectiveRunner(const CollectiveRunner&) = delete;
  CollectiveRunner& operator=(const CollectiveRunner&) = delete;

  /// Queues a task and returns its id; after stop() it is abandoned at once. With
  /// `caller_waits` the caller is about to wait for the task and runs it itself through
  /// help() when it is next: the runner thread leaves it alone until kick(id) hands it
  /// over. (Were the runner thread free to take it, a runner that finished one task just
  /// as its caller submitted the next would take that one too, and so on: two threads per
  /// rank busy for every collective, 20-30x slower small collectives on small hosts.)
  std::uint64_t submit(bool caller_waits, Task t);
  /// Runs task `id` on the calling thread if it is next and nothing is running: a thread
  /// that waits for its collective does the work itself instead of waking the runner
  /// thread (a wake-up costs more than a small collective). Returns whether it ran.
  bool help(std::uint64_t id);
  /// Whether help(id) would run the task now (it may no longer when called).
  bool ready(std::uint64_t id);
  /// Hands task `id` to the runner thread (its waiter stops helping: it sleeps, or its
  /// wait is too short to run a collective) and wakes the thread.
  void kick(std::uint64_t id);
  /// Finishes the running task, abandons queued ones, joins the thread. Idempotent.
  void stop();

  /// Scratch memory for the task running now (tasks run one at a time): `bytes` of
  /// uninitialised memory in `slot` (0, 1 or 2, for areas used together). Kept for the
  /// next task up to kKeptScratch bytes, so a collective called in a loop neither zeroes
  /// nor page-faults fresh memory every time.
  std::byte* scratch(int slot, std::size_t bytes);
  static constexpr std::size_t kKeptScratch = 64u << 20;

 private:
  void loop();
  void run(Task& t);

  struct Area {
    std::unique_ptr<std::byte[]> mem;
    std::size_t size = 0;
  };
  Area scratch_[3];

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> tasks_;
  bool stopping_ = false;
  bool busy_ = false;
  std::uint64_t next_id_ = 1;
  std::thread thread_;
};

}  // namespace nexar::detail
