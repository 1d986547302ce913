// The progress engine of a node. All QUIC and matching state of the node is guarded by one
// lock, the engine lock; whoever holds it may make progress:
//
//  * the engine thread runs an Asio io_context (socket readiness, ngtcp2 timers, posted
//    work) and takes the lock around every handler;
//  * a user thread that submits work runs it inline when the lock is free, so a send
//    reaches the socket without waking another thread;
//  * a user thread waiting for its operation polls the socket itself for a short while
//    (Config::spin) when the lock is free, so a reply is picked up without two thread
//    hand-offs. Waking a sleeping thread costs 50-100 us on small hosts.
//
// While user threads are progressing, the engine thread does not spin, leaving them the
// cores; after the last activity it spins for Config::spin, then sleeps in epoll.
#pragma once

#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <asio/post.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

#include "core/event_loop.hpp"
#include "engine/readiness_gate.hpp"

namespace nexar::detail {

class Engine final : public EventLoop {
 public:
  /// `polite`: more ranks than cores (Config::yield_when_idle). The progress thread then
  /// runs under SCHED_BATCH, so waking it (a timer, a packet nobody polls for) never
  /// preempts a thread that is running: it takes its turn when one yields. Measured with
  /// 4 processes on 2 cores: 8 B all_reduce 200-245 -> 67-114 us, 32 KiB-2 MiB up to 2x
  /// faster, 16 MiB 5-10% slower. Without it the default policy is kept: on a host with
  /// spare cores, background progress should not wait for a scheduler tick.
  explicit Engine(std::chrono::microseconds spin, bool polite = false);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  asio::io_context& io() noexcept { return io_; }

  /// Starts the progress thread.
  void start();
  /// Runs the remaining posted work, stops the thread and joins it. Idempotent; must not
  /// be called with the engine lock held.
  void stop();

  /// Runs `f` on the engine thread, under the engine lock.
  template <class F>
    requires(!std::is_same_v<std::decay_t<F>, std::function<void()>>)
  void post(F&& f) {
    asio::post(io_, guard(std::forward<F>(f)));
  }

  /// Wraps an Asio completion handler so it runs under the engine lock.
  template <class F>
  auto guard(F&& f) {
    return [this, f = std::forward<F>(f)](auto&&... args) mutable {
      // Announce ourselves first: polling user threads step aside rather than starve the
      // engine thread of its own lock (std::mutex is not fair).
      wanting_.fetch_add(1, std::memory_order_relaxed);
      std::lock_guard lk(mu_);
      wanting_.fetch_sub(1, std::memory_order_relaxed);
      f(std::forward<decltype(args)>(args)...);
    };
  }

  /// The engine lock, for callers that progress inline (try_lock / unlock).
  std::mutex& lock() noexcept { return mu_; }
  /// True while the engine thread waits for the lock; opportunistic pollers back off.
  bool engine_waiting() const noexcept { return wanting_.load(std::memory_order_relaxed) > 0; }

  /// While non-zero, user threads are polling for progress themselves: the engine thread
  /// does not spin, and once they settle() it does not wake for the watched socket's
  /// packets either (see ReadinessGate).
  void add_progressing(int d) noexcept {
    gate_.add_pollers(d);
    count_watchers(d);
  }

  /// A progressing thread has polled for a while: the engine thread stops waking for the
  /// socket's packets, which that thread will read (ReadinessGate::settle).
  void settle() noexcept { gate_.settle(); }
  /// How long a waiter polls before it settles(): at once while messages come through the
  /// socket (within the last millisecond), since the reply it waits for may be the next
  /// one; otherwise 50 us, which waits on shared memory mostly finish within.
  std::chrono::microseconds settle_delay(std::chrono::steady_clock::time_point now) const noexcept {
    return socket_busy(now) ? std::chrono::microseconds(0) : kSettleAfter;
  }
  /// Messages came through the socket within the millisecond before `now`
  /// (note_socket_messages); any thread.
  bool socket_busy(std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now()) const noexcept {
    const auto since = now.time_since_epoch().count() - messages_at_.load(std::memory_order_relaxed);
    return since < std::chrono::duration_cast<std::chrono::steady_clock::duration>(kSocketBusy).count();
  }
  /// Message bytes (any lane but control: heartbeats and connection set-up do not count)
  /// came in through the socket; engine lock held.
  void note_socket_messages() noexcept {
    messages_at_.store(std::chrono::steady_clock::now().time_since_epoch().count(), std::memory_order_relaxed);
  }

  /// Run when the number of threads polling the node (user threads counted by
  /// add_progressing, and the engine thread while it spins) leaves zero (`watched`) and when
  /// it comes back to zero (`unwatched`), on the thread that changed it, with or without the
  /// engine lock: the shared-memory path tells same-host peers whether a write needs a
  /// doorbell (transport/shm_presence.hpp). Set before start().
  void set_watch_hooks(std::function<void()> watched, std::function<void()> unwatched) {
    watched_ = std::move(watched);
    unwatched_ = std::move(unwatched);
  }

  // EventLoop. The watched descriptors (a socket and its timer) sit in the readiness gate,
  // whose one descriptor the engine thread waits on; `ready` runs under the engine lock.
  void watch(std::vector<int> fds, std::function<bool()> ready) override;
  void unwatch() override;
  void post(std::function<void()> f) override { asio::post(io_, guard(std::move(f))); }

  /// Also watches `fd` (a doorbell other processes ring: the shared-memory path) in the
  /// same gate: `ready` runs, under the engine lock, whenever the gate reports input, before
  /// the main watch's. One extra descriptor at most; it joins the gate at the next watch(),
  /// so call it before.
  void watch_extra(int fd, std::function<void()> ready);

  /// Called (under the engine lock) on every turn of the spinning loop: the owner polls
  /// its socket and timers there rather than waiting for the reactor to report them.
  void set_spin_hook(std::function<void()> f) { spin_hook_ = std::move(f); }

  /// Whenever packets move; keeps the loop spinning a while.
  void note_activity() noexcept override {
    busy_until_.store(std::chrono::steady_clock::now() + spin_, std::memory_order_relaxed);
  }

  /// True once the progress thread has exited: posted work will not run any more.
  bool stopped() const noexcept { return exited_.load(std::memory_order_acquire); }

  bool on_engine_thread() const noexcept {
    return std::this_thread::get_id() == thread_id_.load(std::memory_order_relaxed);
  }

 private:
  // A socket that carried messages this recently is busy (settle_delay).
  static constexpr std::chrono::milliseconds kSocketBusy{1};
  // A quiet socket rarely wakes the engine thread, so the gate can stay open through waits
  // on shared memory, long ones included (ranks waiting for a descheduled peer when there
  // are more ranks than cores); the first packet that does come makes the socket busy.
  static constexpr std::chrono::microseconds kSettleAfter{50};

  void run();
  void wait_ready();
  // Each thread adds and takes back its own +1, so a watched hook always runs before the
  // unwatched hook of the next return to zero.
  void count_watchers(int d) noexcept {
    const int before = watchers_.fetch_add(d, std::memory_order_acq_rel);
    if (d > 0 && before == 0 && watched_) watched_();
    if (d < 0 && before + d == 0 && unwatched_) unwatched_();
  }

  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> guard_;
  std::chrono::microseconds spin_;
  bool polite_;
  std::mutex mu_;
  std::atomic<std::chrono::steady_clock::time_point> busy_until_{};
  ReadinessGate gate_;
  asio::posix::stream_descriptor gate_fd_{io_};  // the gate's descriptor, while watched
  std::function<bool()> ready_;
  std::vector<int> fds_;  // of the main watch
  int extra_fd_ = -1;
  std::function<void()> extra_ready_;
  std::atomic<int> wanting_{0};
  std::function<void()> spin_hook_;
  std::function<void()> watched_, unwatched_;
  std::atomic<int> watchers_{0};
  std::atomic<std::chrono::steady_clock::rep> messages_at_{0};
  std::atomic<bool> stopping_{false};
  std::atomic<bool> exited_{false};
  std::thread thread_;
  std::atomic<std::thread::id> thread_id_{};
};

}  // namespace nexar::detail
