// A thread of its own that runs jobs one after another, for blocking work the engine must
// never wait for (attaching shared memory, dialling the TCP link). Started by the first
// job, so a node that never needs it holds no thread.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace nexar::detail {

class JobThread {
 public:
  /// `name` is the thread's (top -H, gdb), at most 15 characters.
  explicit JobThread(std::string name) : name_(std::move(name)) {}
  /// Drops the jobs not begun and joins the thread (after the job under way).
  ~JobThread();
  JobThread(const JobThread&) = delete;
  JobThread& operator=(const JobThread&) = delete;

  /// Runs `job` on the thread, after the jobs before it. Any thread.
  void run(std::function<void()> job);

 private:
  std::string name_;
  std::mutex mu_;  // jobs_ and stop_
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace nexar::detail
