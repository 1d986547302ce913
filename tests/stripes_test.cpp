// Several connections per pair of ranks (Config::connections_per_peer, transport/stripes.*):
// real QUIC between ranks of one process, shared memory off so every message takes the wire.
// Every collective gives exactly the reference while its messages take turns among the
// connections, also with several collectives in flight and under 5% loss; the extra
// connections are really used; two ranks that ask for different counts use the smaller; a
// rank's port never takes a first connection's dial for an extra one, nor the other way;
// and a rank whose extra connection breaks is failed, named by its peers. Several of these
// also run with extra connections on shards (Config::engine_threads; shard_test.cpp).
#include <nexar/nexar.hpp>

#include <gtest/gtest.h>

#include "stripes_support.hpp"
#include "local_processes.hpp"
#include "cluster/local.hpp"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
using namespace nexar::testing::stripes;

TEST(Stripes, EveryCollectiveExactAcrossFourConnections) {
  auto comms = nexar::bootstrap_local(3, config(4));
  every_collective_exact(comms);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(hosted_connections(comms[static_cast<std::size_t>(r)], (r + 1) % 3), 0);
}

// 5% of the datagrams arriving anywhere dropped: all_reduce of odd sizes over 4 connections
// per pair, two of them on a second engine thread at each end, stays exact, and nobody is
// declared failed.
TEST(Stripes, ExactUnderFivePercentLoss) {
  constexpr int world = 3;
  nexar::Config cfg = config(4, 2);
  cfg.tuning.impair = "drop=0.05,seed=7";
  cfg.udp_payload = 1452;
  auto comms = nexar::bootstrap_local(world, cfg);
  on_every_rank(comms, [&](int r) {
    Communicator& c = comms[static_cast<std::size_t>(r)];
    std::uint64_t salt = 50;
    for (std::size_t n : {std::size_t{1}, std::size_t{1001}, std::size_t{400009}}) {
      auto v = values(n, r, ++salt);
      c.all_reduce(v, ReduceOp::sum);
      EXPECT_EQ(v, sum_of_all(n, world, salt)) << "all_reduce of " << n;
    }
    c.barrier();
  });
  for (auto& c : comms) {
    EXPECT_TRUE(c.failed_ranks().empty());
    EXPECT_FALSE(c.is_revoked());
  }
}

// Rank 0 asks for 2 connections per pair, ranks 1 and 2 for 5: pairs with rank 0 use 2
// (rank 0 refuses the surplus its higher peers dial), the pair (1, 2) uses 5, and the
// results are exact. Their engine threads differ too (1, 3 and 2): each end places an extra
// connection by its own count, and any placement works.
TEST(Stripes, DifferentSettingsUseTheSmaller) {
  constexpr int world = 3;
  auto plans = nexar::cluster::plan_local(world, config(5));
  std::vector<Communicator> comms(world);
  {
    std::vector<std::thread> starts;
    for (int r = 0; r < world; ++r) {
      starts.emplace_back([&, r] {
        comms[static_cast<std::size_t>(r)] =
            nexar::cluster::start_node(std::move(plans[static_cast<std::size_t>(r)]),
                                       config(r == 0 ? 2 : 5, static_cast<std::uint32_t>(r == 0 ? 1 : r + 1)));
      });
    }
    for (auto& t : starts) t.join();
  }
  on_every_rank(comms, [&](int r) {
    Communicator& c = comms[static_cast<std::size_t>(r)];
    // A few rounds: the extra connections come up while the first ones run.
    for (std::uint64_t salt = 200; salt < 204; ++salt) {
      auto v = values(500003, r, salt);
      c.all_reduce(v, ReduceOp::sum);
      EXPECT_EQ(v, sum_of_all(500003, world, salt));
    }
  });
  EXPECT_EQ(pair_state(comms[0], 1).first, 2);
  EXPECT_EQ(pair_state(comms[0], 2).first, 2);
  EXPECT_EQ(pair_state(comms[1], 0).first, 2);
  EXPECT_EQ(pair_state(comms[1], 2).first, 5);
  EXPECT_EQ(pair_state(comms[2], 1).first, 5);
  // Of the extra connections 1..4 of the pair (1, 2), rank 2 (3 threads) hosts 1, 2 and 4
  // on its shards and rank 1 (2 threads) hosts 1 and 3; rank 0 has no shard. (Which of rank
  // 1's four dials rank 0 keeps is a race: the first to arrive.)
  EXPECT_EQ(hosted_connections(comms[2], 1), 3);
  EXPECT_EQ(hosted_connections(comms[1], 2), 2);
  EXPECT_EQ(hosted_connections(comms[0], 1), 0);
  for (auto& c : comms) EXPECT_TRUE(c.failed_ranks().empty());
}

// With one connection per pair nothing else is dialled, and collectives are exact.
TEST(Stripes, OneConnectionDialsNoOther) {
  auto comms = nexar::bootstrap_local(2, config(1));
  on_every_rank(comms, [&](int r) {
    auto v = values(123457, r, 9);
    comms[static_cast<std::size_t>(r)].all_reduce(v, ReduceOp::sum);
    EXPECT_EQ(v, sum_of_all(123457, 2, 9));
  });
  for (int r = 0; r < 2; ++r) {
    auto [connections, striped] = pair_state(comms[static_cast<std::size_t>(r)], 1 - r);
    EXPECT_EQ(connections, 1);
    EXPECT_EQ(striped, 0u);
    auto& node = node_of(comms[static_cast<std::size_t>(r)]);
    EXPECT_EQ(nexar::testing::on_engine(node.engine(), [&] { return node.endpoint()->live_connections(); }), 1u);
  }
}

// A rank's first port tells a pair's first connection from an extra one by the ALPN the
// dialler offers. A first connection's dial from a rank already connected (a lazy dial its
// rank gave up for ours, which can arrive after the pair is up, its hello sent) is refused
// as a duplicate, never kept as an extra connection of the pair; an extra one from the
// lower rank of a pair is refused too. The pair carries on, its connections as they were.
TEST(Stripes, FirstPortTellsFirstFromExtraConnections) {
  Probe stale, lower;  // outlive the communicators, whose endpoints call them
  nexar::Config cfg = config(4);
  cfg.lazy_connect = true;
  auto comms = nexar::bootstrap_local(2, cfg);
  auto exact = [&](std::uint64_t seed) {
    on_every_rank(comms, [&](int r) {
      auto v = values(200003, r, seed);
      comms[static_cast<std::size_t>(r)].all_reduce(v, ReduceOp::sum);
      EXPECT_EQ(v, sum_of_all(200003, 2, seed));
    });
  };
  exact(13);
  for (int i = 0; i < 500 && (pair_state(comms[0], 1).first < 4 || pair_state(comms[1], 0).first < 4); ++i)
    std::this_thread::sleep_for(10ms);
  const int before = pair_state(comms[0], 1).first;
  ASSERT_EQ(before, 4);
  const std::string dup =
      refusal(stale, comms[1], node_of(comms[0]).endpoint()->local(), 0, nexar::wire::mesh_alpn);
  EXPECT_NE(dup.find("is already connected"), std::string::npos) << dup;
  const std::string up =
      refusal(lower, comms[0], node_of(comms[1]).endpoint()->local(), 1, nexar::wire::extra_alpn);
  EXPECT_NE(up.find("takes extra connections only from a higher rank"), std::string::npos) << up;
  exact(14);
  EXPECT_EQ(pair_state(comms[0], 1).first, before);
  EXPECT_EQ(pair_state(comms[1], 0).first, before);
  for (auto& c : comms) EXPECT_TRUE(c.failed_ranks().empty());
}

// Ranks as processes, 3 connections per pair (the second on another engine thread at each
// end), all_reduce of 1 MiB per step so every pair's extra connections are busy: rank 1 dies by SIGKILL, and each survivor's operation fails
// within a second with rank_failed naming rank 1, not a bystander.
TEST(Stripes, KilledRankIsNamedWithinASecond) {
  auto& shared = nexar::testing::fresh_shared<nexar::testing::Deaths>();
  nexar::Config cfg = config(3, 2);
  cfg.on_failure = nexar::FailurePolicy::manual;
  cfg.op_timeout = 30s;  // far above the bound checked: a hang shows as a failed bound
  cfg.yield_when_idle = true;
  cfg.log_level = nexar::LogLevel::off;
  auto status = nexar::testing::run_forked(3, cfg, [&](int rank, Communicator& c) {
    nexar::testing::all_reduce_until_killed(rank, c, shared, 1, 262147, [&](int step) {
      if (step != 5) return;
      auto [connections, striped] = pair_state(c, (rank + 1) % 3);
      RANK_CHECK(rank, connections == 3 && striped > 0,
                 "connections " + std::to_string(connections) + ", frames on the extra ones " + std::to_string(striped));
    });
  }, 60s);
  ASSERT_EQ(status.size(), 3u);
  nexar::testing::expect_named_in_time(status, 1, shared, 1s);
}

}  // namespace
