// The bulk lane's delay-based window (quic/scavenger.*), driven by hand: acknowledged bytes
// and RTT samples in, the window out.
#include <gtest/gtest.h>

#include <cstdint>

#include "quic/scavenger.hpp"

using nexar::quic::Scavenger;

namespace {

constexpr std::uint64_t kMss = 1452;
constexpr std::uint64_t kUs = 1000;

// A scavenger that has seen the path's base RTT `base` (one sample at time 0).
Scavenger on_path(std::uint64_t base, std::uint64_t mss = kMss) {
  Scavenger s(mss);
  s.on_ack(0, base, 0);
  return s;
}

// Acknowledges one window's worth of bytes, in packets, every one with RTT sample `rtt`, at
// time `now`; `limited`: the window held bytes back meanwhile.
void round_trip(Scavenger& s, std::uint64_t rtt, bool limited = true, std::uint64_t now = 0) {
  const std::uint64_t w = s.window();
  if (limited) s.note_limited();
  for (std::uint64_t done = 0; done < w; done += kMss) s.on_ack(kMss, rtt, now);
}

}  // namespace

TEST(Scavenger, StartsAtTenPackets) { EXPECT_EQ(Scavenger(kMss).window(), 10 * kMss); }

TEST(Scavenger, TargetIsAQuarterOfTheBaseRttWithAFloor) {
  EXPECT_EQ(Scavenger::target_ns(20'000 * kUs), 5'000 * kUs);
  EXPECT_EQ(Scavenger::target_ns(8 * kUs), Scavenger::min_target_ns);
  EXPECT_EQ(Scavenger::target_ns(0), Scavenger::min_target_ns);
}

// An empty path (every sample at the base): the window grows, at most doubling a round.
TEST(Scavenger, GrowsWhileNothingQueues) {
  const std::uint64_t base = 1'000 * kUs;
  Scavenger s = on_path(base);
  std::uint64_t before = s.window();
  for (int i = 0; i < 5; ++i) {
    round_trip(s, base);
    EXPECT_GT(s.window(), before) << "round " << i;
    EXPECT_LE(s.window(), before * Scavenger::max_growth) << "round " << i;
    before = s.window();
  }
}

// A sender that never fills its window learns nothing: the window stays where it is.
TEST(Scavenger, DoesNotGrowUnused) {
  Scavenger s = on_path(100 * kUs);
  const std::uint64_t w = s.window();
  for (int i = 0; i < 5; ++i) round_trip(s, 100 * kUs, false);
  EXPECT_EQ(s.window(), w);
}

// Queueing far above the target: the window shrinks in proportion, down to two packets.
TEST(Scavenger, ShrinksWhileBulkQueuesAndKeepsTwoPackets) {
  const std::uint64_t base = 50 * kUs;
  Scavenger s = on_path(base);
  for (int i = 0; i < 12; ++i) round_trip(s, base);
  const std::uint64_t grown = s.window();
  ASSERT_GT(grown, 100 * kMss);
  // A hundred times the target: the window falls to what leaves the target queued, at once.
  round_trip(s, base + 5'000 * kUs);
  EXPECT_LT(s.window(), grown / 20);
  for (int i = 0; i < 10; ++i) round_trip(s, base + 5'000 * kUs);
  EXPECT_EQ(s.window(), Scavenger::min_packets * kMss);
}

// Queueing at the target exactly: the window holds (up to rounding).
TEST(Scavenger, HoldsAtTheTarget) {
  const std::uint64_t base = 400 * kUs;
  Scavenger s = on_path(base);
  for (int i = 0; i < 4; ++i) round_trip(s, base);
  const std::uint64_t w = s.window();
  for (int i = 0; i < 10; ++i) round_trip(s, base + Scavenger::target_ns(base));
  EXPECT_NEAR(static_cast<double>(s.window()), static_cast<double>(w), static_cast<double>(kMss));
}

// One late ACK is noise: the least of the recent samples stands for the delay, so a single
// high sample among low ones does not shrink the window.
TEST(Scavenger, OneLateSampleIsNotQueueing) {
  const std::uint64_t base = 100 * kUs;
  Scavenger s = on_path(base);
  round_trip(s, base);
  const std::uint64_t w = s.window();
  s.note_limited();
  for (std::uint64_t done = 0; done + kMss < w; done += kMss) s.on_ack(kMss, base, 0);
  s.on_ack(kMss, base + 10'000 * kUs, 0);  // the ACK that moves the window
  EXPECT_GE(s.window(), w);
}

// The base is the least sample of the last two periods: a path whose round trip grew for
// good (a new route) is not taken for a queue forever.
TEST(Scavenger, BaseFollowsAPathThatChanged) {
  Scavenger s = on_path(100 * kUs);
  EXPECT_EQ(s.base_rtt(), 100 * kUs);
  const std::uint64_t p = Scavenger::base_period_ns;
  s.on_ack(kMss, 900 * kUs, p / 2);
  EXPECT_EQ(s.base_rtt(), 100 * kUs) << "within the period";
  s.on_ack(kMss, 900 * kUs, p + 1);
  EXPECT_EQ(s.base_rtt(), 100 * kUs) << "one period later the old least still counts";
  s.on_ack(kMss, 800 * kUs, 2 * p + 2);
  EXPECT_EQ(s.base_rtt(), 800 * kUs) << "two periods later only the new path's samples count";
}

// ACKs without an RTT sample change nothing.
TEST(Scavenger, IgnoresAckWithoutRtt) {
  Scavenger s(kMss);
  const std::uint64_t w = s.window();
  s.note_limited();
  for (int i = 0; i < 100; ++i) s.on_ack(kMss, 0, 0);
  EXPECT_EQ(s.window(), w);
}

// Larger packets raise the floor with them.
TEST(Scavenger, FloorFollowsThePacketSize) {
  Scavenger s = on_path(50 * kUs, 1200);
  for (int i = 0; i < 60; ++i) round_trip(s, 10'000 * kUs);
  EXPECT_EQ(s.window(), Scavenger::min_packets * 1200);
  s.set_mss(8952);
  EXPECT_EQ(s.window(), Scavenger::min_packets * 8952);
}
