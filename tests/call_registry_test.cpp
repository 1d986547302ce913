// The verdicts on collective messages that no receive awaits (transport/call_registry.*):
// one for a collective running here with another fingerprint, one counted before its
// collective started here and compared when it does, one still unawaited when its
// collective completes here, and one that arrives after; messages of a collective that
// failed here are ignored; the reasons name communicator ranks and both calls.
#include <gtest/gtest.h>

#include "core/call_check.hpp"
#include "support.hpp"
#include "transport/call_registry.hpp"

namespace {

using nexar::DataType;
using nexar::ReduceOp;
using nexar::detail::call_check;
using nexar::detail::CallRegistry;
using nexar::testing::contains;

const std::uint16_t kRoot0 = call_check("broadcast", DataType::f32, ReduceOp::sum, 0);
const std::uint16_t kRoot1 = call_check("broadcast", DataType::f32, ReduceOp::sum, 1);
constexpr std::uint64_t kComm = 0x77;

// World ranks 10, 11, 12 are communicator ranks 0, 1, 2; this rank is 0.
void watch(CallRegistry& reg) { reg.watch(kComm, {10, 11, 12}, 0); }

TEST(CallRegistry, AMessageForARunningCallOfAnotherFingerprintDisagrees) {
  CallRegistry reg;
  watch(reg);
  EXPECT_EQ(reg.started(kComm, 4, kRoot0), "");
  const std::string why = reg.unawaited(kComm, 4, 11, kRoot1);
  EXPECT_TRUE(contains(why, "collective #4 of communicator 0x77")) << why;
  EXPECT_TRUE(contains(why, "rank 0 called broadcast(f32, root 0) but rank 1 called broadcast(f32, root 1)")) << why;
  EXPECT_EQ(reg.unawaited(kComm, 4, 12, kRoot0), "") << "the same call awaits its receive";
}

TEST(CallRegistry, AnEarlyMessageIsComparedWhenItsCallStarts) {
  CallRegistry reg;
  watch(reg);
  EXPECT_EQ(reg.unawaited(kComm, 9, 12, kRoot1), "");
  const std::string why = reg.started(kComm, 9, kRoot0);
  EXPECT_TRUE(contains(why, "rank 0 called broadcast(f32, root 0) but rank 2 called broadcast(f32, root 1)")) << why;
}

TEST(CallRegistry, AMessageTakenByAReceiveLeavesNothingBehind) {
  CallRegistry reg;
  watch(reg);
  EXPECT_EQ(reg.unawaited(kComm, 2, 11, kRoot0), "");
  EXPECT_EQ(reg.started(kComm, 2, kRoot0), "");
  reg.matched(kComm, 2);
  EXPECT_EQ(reg.ended(kComm, 2, true), "");
}

TEST(CallRegistry, AMessageLeftWhenItsCallCompletesDisagrees) {
  CallRegistry reg;
  watch(reg);
  EXPECT_EQ(reg.started(kComm, 3, kRoot0), "");
  EXPECT_EQ(reg.unawaited(kComm, 3, 11, kRoot0), "");  // same fingerprint, never taken
  const std::string why = reg.ended(kComm, 3, true);
  EXPECT_TRUE(contains(why, "rank 1 sent rank 0 a message of its broadcast(f32, root 0)")) << why;
  EXPECT_TRUE(contains(why, "disagree on its root, counts or algorithm")) << why;
}

TEST(CallRegistry, AMessageAfterItsCallCompletedDisagrees) {
  CallRegistry reg;
  watch(reg);
  EXPECT_EQ(reg.started(kComm, 5, kRoot0), "");
  EXPECT_EQ(reg.ended(kComm, 5, true), "");
  const std::string why = reg.unawaited(kComm, 5, 12, kRoot1);
  EXPECT_TRUE(contains(why, "rank 0 called broadcast(f32, root 0) but rank 2 called broadcast(f32, root 1)")) << why;
}

TEST(CallRegistry, MessagesOfACallThatFailedHereAreIgnored) {
  CallRegistry reg;
  watch(reg);
  EXPECT_EQ(reg.started(kComm, 6, kRoot0), "");
  EXPECT_EQ(reg.unawaited(kComm, 6, 11, kRoot0), "");
  EXPECT_EQ(reg.ended(kComm, 6, false), "") << "a failed call leaves its messages";
  EXPECT_EQ(reg.unawaited(kComm, 6, 11, kRoot1), "");
}

TEST(CallRegistry, AnUnwatchedCommunicatorNamesWorldRanks) {
  CallRegistry reg;
  EXPECT_EQ(reg.started(0x5, 1, kRoot0), "");
  const std::string why = reg.unawaited(0x5, 1, 7, kRoot1);
  EXPECT_TRUE(contains(why, "but rank 7 called broadcast(f32, root 1)")) << why;
  reg.forget(0x5);
  EXPECT_EQ(reg.unawaited(0x5, 1, 7, kRoot1), "") << "forgotten: a fresh count";
}

}  // namespace
