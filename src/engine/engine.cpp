#include "engine/engine.hpp"

#include <pthread.h>
#include <sched.h>

namespace nexar::detail {

Engine::Engine(std::chrono::microseconds spin, bool polite)
    : io_(1), guard_(asio::make_work_guard(io_)), spin_(spin), polite_(polite) {}

Engine::~Engine() {
  stop();
  unwatch();
}

void Engine::watch(std::vector<int> fds, std::function<bool()> ready) {
  ready_ = std::move(ready);
  fds_ = std::move(fds);
  std::vector<int> all = fds_;
  if (extra_fd_ >= 0) all.push_back(extra_fd_);
  gate_fd_.assign(gate_.watch(std::move(all)));
  wait_ready();
}

void Engine::watch_extra(int fd, std::function<void()> ready) {
  extra_fd_ = fd;
  extra_ready_ = std::move(ready);
}

void Engine::wait_ready() {
  gate_fd_.async_wait(asio::posix::stream_descriptor::wait_read, guard([this](asio::error_code ec) {
                        if (ec || !gate_fd_.is_open()) return;
                        gate_.consume();
                        if (extra_ready_) extra_ready_();
                        if (ready_()) wait_ready();
                      }));
}

void Engine::unwatch() {
  if (!gate_fd_.is_open()) return;
  // The descriptor is the gate's: stop waiting on it without closing it.
  asio::error_code ec;
  gate_fd_.cancel(ec);
  gate_fd_.release();
  gate_.unwatch();
}

void Engine::start() {
  thread_ = std::thread([this] {
    // Named so that top -H, perf and gdb tell the threads of a rank apart.
    pthread_setname_np(pthread_self(), "nexar-engine");
    if (polite_) {
      // Needs no privilege; if refused, the default policy merely costs latency.
      sched_param sp{};
      pthread_setschedparam(pthread_self(), SCHED_BATCH, &sp);
    }
    run();
  });
}

void Engine::stop() {
  if (!thread_.joinable()) return;
  asio::post(io_, [this] { stopping_.store(true, std::memory_order_relaxed); });
  thread_.join();
}

void Engine::run() {
  thread_id_.store(std::this_thread::get_id(), std::memory_order_relaxed);
  bool spinning = false;  // counted among the watchers
  while (!stopping_.load(std::memory_order_relaxed)) {
    const bool spin = spin_.count() > 0 && gate_.pollers() == 0 &&
                      std::chrono::steady_clock::now() < busy_until_.load(std::memory_order_relaxed);
    if (spin != spinning) {
      // Leaving: before the reactor may block, so that peers ring again.
      count_watchers(spin ? 1 : -1);
      spinning = spin;
    }
    if (spin) {
      if (io_.poll() == 0) {
        if (spin_hook_) {
          std::unique_lock lk(mu_, std::try_to_lock);
          if (lk.owns_lock()) spin_hook_();
        }
        // Yield between polls: on small hosts the thread we wait for may need this core.
        std::this_thread::yield();
      }
    } else {
      io_.run_one();
      // Handlers that keep re-arming (a bulk transfer's turns ring this node's doorbell
      // after each one) would otherwise hold the core until the scheduler's tick, while a
      // polling user thread that shares it (more ranks than cores, or a rank bound to one
      // core) waits: 4 ms per barrier beside a bulk transfer in that case.
      if (gate_.pollers() > 0) std::this_thread::yield();
    }
  }
  if (spinning) count_watchers(-1);
  // Let handlers already queued (completions, close notifications) run once more.
  io_.poll();
  thread_id_.store(std::thread::id{}, std::memory_order_relaxed);
  exited_.store(true, std::memory_order_release);
}

}  // namespace nexar::detail
