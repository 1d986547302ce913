#include "comm/notifier.hpp"

namespace nexar::detail {

Notifier::~Notifier() {
  {
    std::lock_guard lk(s_->mu);
    s_->stop = true;
  }
  s_->cv.notify_all();
  if (!thread_.joinable()) return;
  // The last reference to the communicator may be dropped by a callback, on this thread:
  // it then finishes on its own, holding the state it needs.
  if (thread_.get_id() == std::this_thread::get_id()) {
    thread_.detach();
  } else {
    thread_.join();
  }
}

void Notifier::post(std::function<void()> fn) {
  std::lock_guard lk(s_->mu);
  if (s_->stop) return;
  s_->q.push_back(std::move(fn));
  if (!thread_.joinable()) thread_ = std::thread([s = s_] { run(s); });
  s_->cv.notify_one();
}

void Notifier::run(const std::shared_ptr<State>& s) {
  std::unique_lock lk(s->mu);
  for (;;) {
    s->cv.wait(lk, [&] { return s->stop || !s->q.empty(); });
    if (s->q.empty()) return;
    auto fn = std::move(s->q.front());
    s->q.pop_front();
    lk.unlock();
    try {
      fn();
    } catch (...) {
      // A throwing callback must not take the process down; nothing is there to catch it.
    }
    fn = nullptr;  // what it holds is released outside the lock
    lk.lock();
  }
}

}  // namespace nexar::detail
