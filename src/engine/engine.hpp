// The progress engine: one thread that owns all QUIC and matching state of a node and runs
// an Asio io_context. Other threads hand it work with post(). While traffic is flowing it
// polls without sleeping for Config::spin after the last activity, because waking a
// sleeping thread costs 50-100 us on small hosts; when idle it sleeps in epoll.
#pragma once

#include <asio/io_context.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/post.hpp>

#include <atomic>
#include <chrono>
#include <thread>

namespace nexar::detail {

class Engine {
 public:
  explicit Engine(std::chrono::microseconds spin);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  asio::io_context& io() noexcept { return io_; }

  /// Starts the progress thread.
  void start();
  /// Runs the remaining posted work, stops the thread and joins it. Idempotent; must not
  /// be called from the engine thread.
  void stop();

  /// Runs `f` on the engine thread.
  template <class F>
  void post(F&& f) {
    asio::post(io_, std::forward<F>(f));
  }

  /// Called on the engine thread whenever packets move; keeps the loop spinning a while.
  void note_activity() noexcept { busy_until_ = std::chrono::steady_clock::now() + spin_; }

  bool on_engine_thread() const noexcept {
    return std::this_thread::get_id() == thread_id_.load(std::memory_order_relaxed);
  }

 private:
  void run();

  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> guard_;
  std::chrono::microseconds spin_;
  std::chrono::steady_clock::time_point busy_until_{};
  std::atomic<bool> stopping_{false};
  std::thread thread_;
  std::atomic<std::thread::id> thread_id_{};
};

}  // namespace nexar::detail
