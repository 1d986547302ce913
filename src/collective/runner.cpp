#include "collective/runner.hpp"

namespace nexar::detail {

CollectiveRunner::CollectiveRunner() : thread_([this] { loop(); }) {}

CollectiveRunner::~CollectiveRunner() { stop(); }

std::uint64_t CollectiveRunner::submit(Task t) {
  {
    std::lock_guard lk(mu_);
    if (!stopping_) {
      t.id = next_id_++;
      tasks_.push_back(std::move(t));
      cv_.notify_one();
      return tasks_.back().id;
    }
  }
  if (t.abandon) t.abandon();
  return 0;
}

bool CollectiveRunner::help(std::uint64_t id) {
  Task t;
  {
    std::lock_guard lk(mu_);
    if (busy_ || tasks_.empty() || tasks_.front().id != id) return false;
    t = std::move(tasks_.front());
    tasks_.pop_front();
    busy_ = true;
  }
  t.run();
  {
    std::lock_guard lk(mu_);
    busy_ = false;
  }
  cv_.notify_all();
  return true;
}

void CollectiveRunner::stop() {
  std::deque<Task> left;
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
    left.swap(tasks_);
  }
  cv_.notify_all();
  for (auto& t : left)
    if (t.abandon) t.abandon();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

void CollectiveRunner::loop() {
  for (;;) {
    Task t;
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stopping_ || (!tasks_.empty() && !busy_); });
      if (tasks_.empty()) return;
      t = std::move(tasks_.front());
      tasks_.pop_front();
      busy_ = true;
    }
    t.run();
    {
      std::lock_guard lk(mu_);
      busy_ = false;
    }
    cv_.notify_all();
  }
}

}  // namespace nexar::detail
