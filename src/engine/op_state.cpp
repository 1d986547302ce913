#include "engine/op_state.hpp"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <climits>
#include <thread>

#include "core/error_format.hpp"

namespace nexar::detail {

namespace {

// std::atomic::wait has no timeout, and every nexar wait has a deadline: use the futex
// directly. The word is a 32-bit atomic, as the futex requires.
void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t expected,
                std::chrono::nanoseconds timeout) {
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1000000000);
  ts.tv_nsec = static_cast<long>(timeout.count() % 1000000000);
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAIT_PRIVATE, expected, &ts,
          nullptr, 0);
}

void futex_wake_all(std::atomic<std::uint32_t>& word) {
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAKE_PRIVATE, INT_MAX,
          nullptr, nullptr, 0);
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

bool OpState::fail_ranks(Errc code, std::string message, std::vector<int> failed) {
  if (claimed_.exchange(true, std::memory_order_acq_rel)) return false;
  failed_ = std::move(failed);
  return finish(code, std::move(message), {});
}

bool OpState::complete(Errc code, std::string message, Status status) {
  if (claimed_.exchange(true, std::memory_order_acq_rel)) return false;
  return finish(code, std::move(message), status);
}

void OpState::annotate(std::string text) {
  std::lock_guard lk(note_mu_);
  note_ = std::move(text);
  noted_.store(true, std::memory_order_release);
}

bool OpState::finish(Errc code, std::string message, Status status) {
  code_ = code;
  message_ = std::move(message);
  if (code == Errc::timeout && noted_.load(std::memory_order_acquire)) {
    std::lock_guard lk(note_mu_);
    message_ += " (" + note_ + ")";
  }
  status_ = status;
  if (stamp_end) ended_ = Clock::now();
  if (state_.exchange(done_state, std::memory_order_acq_rel) == pending_waiters) {
    futex_wake_all(state_);
  }
  return true;
}

bool OpState::wait_until(Clock::time_point until, std::chrono::microseconds spin_for, bool bounded) {
  if (done()) return true;
  auto spin_end = Clock::now() + spin_for;
  std::shared_ptr<Progress> engine = helper ? helper : progress.lock();
  if (engine && !bounded && engine->run_here() && done()) return true;
  if (spin_for.count() > 0) {
    // Poll the engine ourselves: picking the reply off the socket here saves the two
    // thread wake-ups of the engine thread handing it to us.
    if (engine) engine->waiting(1);
    // Set from the first iteration's clock reading: one read fewer per wait.
    auto settle_at = engine ? Clock::time_point::min() : Clock::time_point::max();
    for (Clock::time_point now; (now = Clock::now()) < spin_end && !done();) {
      if (settle_at == Clock::time_point::min()) settle_at = now + engine->settle_delay(now);
      if (engine && now >= settle_at) {
        engine->settle();
        settle_at = Clock::time_point::max();
      }
      if (!(engine && engine->poll(bounded))) {
        for (int i = 0; i < 16 && !done(); ++i) cpu_relax();
        // The thread that will complete us may be waiting for this very core.
        std::this_thread::yield();
      } else if (yield_when_idle && !done()) {
        // More ranks than cores: the peer we wait for may need this core to answer.
        std::this_thread::yield();
      }
    }
    if (engine) engine->waiting(-1);
    if (done()) return true;
  }
  // No strong reference while asleep: dropping the last handle of a communicator must
  // still close it, which fails this operation and wakes us.
  struct Woke {
    OpState& s;
    bool slept;
    ~Woke() {
      if (!slept) return;
      if (auto e = s.helper ? s.helper : s.progress.lock()) e->woke();
    }
  } woke{*this, engine != nullptr};
  if (engine) engine->sleeping();
  engine.reset();
  for (;;) {
    std::uint32_t s = state_.load(std::memory_order_acquire);
    if (s == done_state) return true;
    auto now = Clock::now();
    if (now >= until) return false;
    if (s == pending &&
        !state_.compare_exchange_weak(s, pending_waiters, std::memory_order_acq_rel)) {
      continue;
    }
    auto left = until - now;
    futex_wait(state_, pending_waiters, std::min<std::chrono::nanoseconds>(left, std::chrono::seconds(1)));
  }
}

}  // namespace nexar::detail
