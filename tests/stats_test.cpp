// Communicator::stats() between real ranks: the collectives counted per kind with their
// bytes and times; the time a late member costs the others counted as waiting, on the
// runner's path (QUIC) and on the mailbox path (shared memory) alike; and per peer the
// links that carry the pair, its round-trip time and congestion window, and bytes per lane
// that grow on the lane used and no other. Losses on one path only are checked between
// namespace hosts (tests/netns_test.sh).
#include <nexar/nexar.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "support.hpp"

namespace {

using namespace std::chrono_literals;
using nexar::Communicator;
using nexar::DataType;
using nexar::OpStats;
using nexar::PeerStats;
using nexar::ReduceOp;
using nexar::Stats;

const OpStats* op_of(const Stats& s, const std::string& name) {
  for (const auto& o : s.ops)
    if (o.op == name) return &o;
  return nullptr;
}

std::uint64_t lane(const PeerStats& p, const std::string& name, bool sent) {
  for (const auto& l : p.lanes)
    if (l.lane == name) return sent ? l.sent : l.received;
  ADD_FAILURE() << "no lane " << name;
  return 0;
}

TEST(Stats, CollectivesAreCountedPerKindWithTheirBytesAndTimes) {
  nexar::Config cfg = nexar::testing::test_config();
  cfg.shm = false;
  auto comms = nexar::bootstrap_local(3, cfg);
  nexar::testing::on_every_rank(comms, [&](int r) {
    Communicator& c = comms[static_cast<std::size_t>(r)];
    std::vector<float> x(1001, 1.0f);
    for (int i = 0; i < 5; ++i) c.all_reduce(x, ReduceOp::sum);
    std::vector<std::int64_t> y(7, r);
    c.broadcast(y, 1);
    c.iall_reduce(x, ReduceOp::max).wait();
    c.barrier();
  });
  for (int r = 0; r < 3; ++r) {
    const Stats s = comms[static_cast<std::size_t>(r)].stats();
    const OpStats* ar = op_of(s, "all_reduce");
    ASSERT_NE(ar, nullptr) << "rank " << r;
    EXPECT_EQ(ar->calls, 6u);
    EXPECT_EQ(ar->failed, 0u);
    EXPECT_EQ(ar->bytes, 6u * 1001 * 4);
    EXPECT_GT(ar->total.count(), 0);
    EXPECT_LE(ar->waiting, ar->total);
    const OpStats* bc = op_of(s, "broadcast");
    ASSERT_NE(bc, nullptr);
    EXPECT_EQ(bc->calls, 1u);
    EXPECT_EQ(bc->bytes, 7u * 8);
    ASSERT_NE(op_of(s, "barrier"), nullptr);
    EXPECT_EQ(op_of(s, "barrier")->calls, 1u);
    EXPECT_EQ(op_of(s, "gather"), nullptr);
    EXPECT_TRUE(std::is_sorted(s.ops.begin(), s.ops.end(),
                               [](const OpStats& a, const OpStats& b) { return a.op < b.op; }));
  }
}

// Rank 2 comes `late` after the others to each of 3 all_reduces: ranks 0 and 1 count most
// of that as waiting, rank 2 almost none.
void late_member_is_waited_for(bool shm) {
  nexar::Config cfg = nexar::testing::test_config();
  cfg.shm = shm;
  auto comms = nexar::bootstrap_local(3, cfg);
  constexpr auto late = 150ms;
  nexar::testing::on_every_rank(comms, [&](int r) {
    Communicator& c = comms[static_cast<std::size_t>(r)];
    float x = 1;
    c.all_reduce(&x, &x, 1, DataType::f32, ReduceOp::sum);  // every pair connected, mailboxes agreed
    c.all_reduce(&x, &x, 1, DataType::f32, ReduceOp::sum);
    c.barrier();
  });
  std::vector<Stats> before;
  for (auto& c : comms) before.push_back(c.stats());
  nexar::testing::on_every_rank(comms, [&](int r) {
    Communicator& c = comms[static_cast<std::size_t>(r)];
    for (int i = 0; i < 3; ++i) {
      if (r == 2) std::this_thread::sleep_for(late);
      float x = 1;
      c.all_reduce(&x, &x, 1, DataType::f32, ReduceOp::sum);
    }
  });
  for (int r = 0; r < 3; ++r) {
    const Stats s = comms[static_cast<std::size_t>(r)].stats();
    const OpStats* now = op_of(s, "all_reduce");
    const OpStats* then = op_of(before[static_cast<std::size_t>(r)], "all_reduce");
    ASSERT_TRUE(now && then);
    EXPECT_EQ(now->calls - then->calls, 3u);
    const auto waited = now->waiting - then->waiting;
    const auto total = now->total - then->total;
    if (r == 2) {
      EXPECT_LT(waited, 3 * late / 2) << "the late rank waited for nobody";
    } else {
      EXPECT_GE(waited, 3 * late * 2 / 3) << "rank " << r << " (shm " << shm << ") waited for rank 2";
      EXPECT_LE(waited, total);
    }
  }
}

TEST(Stats, TheLateMemberCostsTheOthersWaitingOverQuic) { late_member_is_waited_for(false); }
TEST(Stats, TheLateMemberCostsTheOthersWaitingThroughTheMailboxes) { late_member_is_waited_for(true); }

TEST(Stats, EachPeerShowsItsLinksPathAndBytesPerLane) {
  nexar::Config cfg = nexar::testing::test_config();
  cfg.shm = false;
  auto comms = nexar::bootstrap_local(3, cfg);
  std::vector<Stats> before;
  nexar::testing::on_every_rank(comms, [&](int r) {
    Communicator& c = comms[static_cast<std::size_t>(r)];
    std::vector<double> x(4096, 1.0);
    c.all_reduce(x, ReduceOp::sum);
    c.barrier();
  });
  for (auto& c : comms) before.push_back(c.stats());
  // Rank 0 sends 1 MiB to rank 1 on the bulk lane, and nothing else moves but the barrier.
  nexar::testing::on_every_rank(comms, [&](int r) {
    Communicator& c = comms[static_cast<std::size_t>(r)];
    std::vector<std::byte> m(1 << 20);
    if (r == 0) c.bulk_send(1, 3, m);
    if (r == 1) c.bulk_recv(0, 3, m);
  });
  const Stats s0 = comms[0].stats();
  ASSERT_EQ(s0.peers.size(), 2u);
  EXPECT_EQ(s0.peers[0].rank, 1);
  EXPECT_EQ(s0.peers[1].rank, 2);
  for (const PeerStats& p : s0.peers) {
    EXPECT_TRUE(p.connected);
    EXPECT_EQ(p.world_rank, p.rank);
    ASSERT_FALSE(p.links.empty());
    EXPECT_EQ(p.links[0], "quic");
    EXPECT_EQ(std::count(p.links.begin(), p.links.end(), "shm"), 0);
    EXPECT_GT(p.rtt.count(), 0);
    EXPECT_GT(p.min_rtt.count(), 0);
    EXPECT_LE(p.min_rtt, p.latest_rtt + p.rtt);
    EXPECT_GT(p.cwnd, 0u);
    EXPECT_EQ(p.lanes.size(), 6u);
    EXPECT_GT(lane(p, "collective", true), 0u);
    EXPECT_GT(lane(p, "collective", false), 0u);
    EXPECT_GT(lane(p, "control", true), 0u);
  }
  const PeerStats& to1 = s0.peers[0];
  const PeerStats& to1_before = before[0].peers[0];
  EXPECT_GE(lane(to1, "bulk", true) - lane(to1_before, "bulk", true), std::uint64_t{1} << 20);
  EXPECT_EQ(lane(s0.peers[1], "bulk", true), lane(before[0].peers[1], "bulk", true)) << "nothing went to rank 2";
  EXPECT_EQ(lane(to1, "collective", true), lane(to1_before, "collective", true));
  const Stats s1 = comms[1].stats();
  EXPECT_GE(lane(s1.peers[0], "bulk", false) - lane(before[1].peers[0], "bulk", false), std::uint64_t{1} << 20);
}

TEST(Stats, RanksOfOneHostShowTheSharedMemoryLink) {
  nexar::Config cfg = nexar::testing::test_config();
  auto comms = nexar::bootstrap_local(2, cfg);
  nexar::testing::on_every_rank(comms, [&](int r) {
    Communicator& c = comms[static_cast<std::size_t>(r)];
    std::vector<float> x(100, 1.0f);
    if (r == 0) c.send(1, 1, x);
    else c.recv(0, 1, x);
  });
  const Stats s = comms[0].stats();
  ASSERT_EQ(s.peers.size(), 1u);
  const auto& links = s.peers[0].links;
  EXPECT_NE(std::find(links.begin(), links.end(), "shm"), links.end());
  EXPECT_GE(lane(s.peers[0], "data", true), 400u);
}

}  // namespace
