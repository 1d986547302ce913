#include "comm/runner.hpp"

#include <pthread.h>

namespace nexar::detail {

CollectiveRunner::CollectiveRunner() : thread_([this] {
  pthread_setname_np(pthread_self(), "nexar-coll");
  loop();
}) {}

CollectiveRunner::~CollectiveRunner() { stop(); }

std::uint64_t CollectiveRunner::submit(bool caller_waits, Task t) {
  {
    std::lock_guard lk(mu_);
    if (!stopping_) {
      t.id = next_id_++;
      t.caller_waits = caller_waits;
      tasks_.push_back(std::move(t));
      if (!caller_waits) cv_.notify_one();
      return tasks_.back().id;
    }
  }
  if (t.abandon) t.abandon();
  return 0;
}

void CollectiveRunner::kick(std::uint64_t id) {
  std::lock_guard lk(mu_);
  for (auto& t : tasks_)
    if (t.id == id) t.caller_waits = false;
  cv_.notify_one();
}

bool CollectiveRunner::ready(std::uint64_t id) {
  std::lock_guard lk(mu_);
  return !busy_ && !tasks_.empty() && tasks_.front().id == id;
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
  run(t);
  std::lock_guard lk(mu_);
  busy_ = false;
  // Only tasks queued meanwhile need the runner thread; waking it for nothing costs a
  // context switch per collective.
  if (!tasks_.empty()) cv_.notify_one();
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
      cv_.wait(lk, [&] { return stopping_ || (!tasks_.empty() && !busy_ && !tasks_.front().caller_waits); });
      if (tasks_.empty()) return;
      t = std::move(tasks_.front());
      tasks_.pop_front();
      busy_ = true;
    }
    run(t);
    std::lock_guard lk(mu_);
    busy_ = false;
  }
}

void CollectiveRunner::run(Task& t) {
  t.run();
  for (auto& a : scratch_) {
    if (a.size > kKeptScratch) {
      a.mem.reset();
      a.size = 0;
    }
  }
}

std::byte* CollectiveRunner::scratch(int slot, std::size_t bytes) {
  Area& a = scratch_[slot];
  if (a.size < bytes) {
    a.mem.reset();
    // Not value-initialised: every byte is written before it is read.
    a.mem.reset(new std::byte[bytes]);
    a.size = bytes;
  }
  return a.mem.get();
}

}  // namespace nexar::detail
