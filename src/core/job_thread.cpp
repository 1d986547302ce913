#include "core/job_thread.hpp"

#include <pthread.h>

namespace nexar::detail {

JobThread::~JobThread() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
    jobs_.clear();
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void JobThread::run(std::function<void()> job) {
  std::lock_guard lk(mu_);
  jobs_.push_back(std::move(job));
  cv_.notify_one();
  if (thread_.joinable()) return;
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), name_.c_str());
    std::unique_lock held(mu_);
    for (;;) {
      cv_.wait(held, [this] { return stop_ || !jobs_.empty(); });
      if (stop_) return;
      auto next = std::move(jobs_.front());
      jobs_.pop_front();
      held.unlock();
      next();
      held.lock();
    }
  });
}

}  // namespace nexar::detail
