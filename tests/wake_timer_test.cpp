// The QUIC endpoint's expiry timer (quic/wake_timer.*): a timerfd that fires at its
// deadline, clears, disarms, re-arms, and can be watched through the engine's readiness gate.
#include <gtest/gtest.h>
#include <poll.h>

#include <chrono>
#include <cstdint>

#include "engine/readiness_gate.hpp"
#include "quic/wake_timer.hpp"

using namespace std::chrono_literals;
using nexar::detail::ReadinessGate;
using nexar::quic::WakeTimer;
using Clock = std::chrono::steady_clock;

namespace {

bool readable(int fd, int wait_ms = 0) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, wait_ms) == 1 && (p.revents & POLLIN);
}

std::uint64_t steady_ns() {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count());
}

}  // namespace

TEST(WakeTimer, FiresAtTheDeadlineAndClears) {
  WakeTimer t;
  EXPECT_FALSE(readable(t.fd()));
  EXPECT_FALSE(t.clear());
  const auto t0 = Clock::now();
  t.arm_at(steady_ns() + 5'000'000);
  EXPECT_FALSE(readable(t.fd()));
  ASSERT_TRUE(readable(t.fd(), 2000));
  EXPECT_GE(Clock::now() - t0, 4ms);
  EXPECT_TRUE(t.clear());
  EXPECT_FALSE(t.clear());
  EXPECT_FALSE(readable(t.fd()));

  t.arm_at(steady_ns() - 1'000'000);  // already past: fires at once
  EXPECT_TRUE(readable(t.fd(), 1000));
  EXPECT_TRUE(t.clear());

  t.arm_at(steady_ns() + 5'000'000);
  t.disarm();
  EXPECT_FALSE(readable(t.fd(), 20));

  // Re-arming later replaces the earlier deadline.
  t.arm_at(steady_ns() + 5'000'000);
  t.arm_at(steady_ns() + 200'000'000);
  EXPECT_FALSE(readable(t.fd(), 30));
}

TEST(WakeTimer, WatchedThroughTheGate) {
  WakeTimer t;
  ReadinessGate gate;
  const int g = gate.watch({t.fd()});
  t.arm_at(steady_ns() + 2'000'000);
  ASSERT_TRUE(readable(g, 2000));
  gate.consume();
  EXPECT_TRUE(t.clear());
  EXPECT_FALSE(readable(g));
}

