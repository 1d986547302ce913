// Runs the collectives of one communicator on a thread of their own, one after another in
// the order they were started. Every rank starts its collectives in the same order, so
// running them in that order can never deadlock, and non-blocking collectives progress
// while the application computes.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace nexar::detail {

class CollectiveRunner {
 public:
  struct Task {
    std::function<void()> run;      ///< the algorithm; completes its own Request
    std::function<void()> abandon;  ///< fails the Request when the runner stops first
  };

  CollectiveRunner();
  ~CollectiveRunner();
  CollectiveRunner(const CollectiveRunner&) = delete;
  CollectiveRunner& operator=(const CollectiveRunner&) = delete;

  /// Queues a task; after stop() it is abandoned at once.
  void submit(Task t);
  /// Finishes the running task, abandons queued ones, joins the thread. Idempotent.
  void stop();

 private:
  void loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> tasks_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace nexar::detail
