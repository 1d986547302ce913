// Runs callbacks one after another on a thread of its own, started on first use: failure
// callbacks must never run inside the engine (which holds its lock) nor inside the failing
// operation, and they may call anything, blocking collectives included.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

namespace nexar::detail {

class Notifier {
 public:
  Notifier() = default;
  /// Runs what is queued, then joins (detaches when called from the callback itself).
  ~Notifier();
  Notifier(const Notifier&) = delete;
  Notifier& operator=(const Notifier&) = delete;

  /// Queues `fn`. Any thread.
  void post(std::function<void()> fn);

 private:
  // Shared with the thread, which may outlive the Notifier when detached.
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::function<void()>> q;
    bool stop = false;
  };
  static void run(const std::shared_ptr<State>& s);
  std::shared_ptr<State> s_ = std::make_shared<State>();
  std::thread thread_;
};

}  // namespace nexar::detail
