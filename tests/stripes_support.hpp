// What the tests of a pair's extra connections share (stripes_test.cpp, shard_test.cpp):
// their configuration, a look at a pair from one rank's engine thread, and the collective
// battery (collective_battery.hpp) with a check that the extra connections carried it.
#pragma once

#include <nexar/nexar.hpp>

#include <gtest/gtest.h>

#include "collective_battery.hpp"
#include "support.hpp"
#include "comm/communicator_impl.hpp"
#include "core/access.hpp"
#include "transport/node.hpp"
#include "transport/peer.hpp"

#include <algorithm>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace nexar::testing::stripes {

using battery::sum_of_all;
using battery::values;
using nexar::Communicator;
using nexar::Errc;
using nexar::ReduceOp;
using nexar::testing::on_every_rank;

inline nexar::Config config(std::uint32_t connections, std::uint32_t engine_threads = 1) {
  nexar::Config c = nexar::testing::test_config();
  c.connections_per_peer = connections;
  c.engine_threads = engine_threads;
  c.shm = false;               // the ranks share a host: keep their messages on QUIC
  c.tuning.segment_bytes = 64 << 10;  // many segments, so many turns, per operation
  return c;
}

inline nexar::detail::Node& node_of(Communicator& c) { return nexar::detail::Access::impl(c)->node(); }

// What rank `c` sees of its pair with world rank `peer`: connections carrying collectives
// now, and collective frames sent on the extra ones so far.
inline std::pair<int, std::uint64_t> pair_state(Communicator& c, int peer) {
  auto& node = node_of(c);
  return nexar::testing::on_engine(node.engine(), [&] {
    nexar::detail::Peer* p = node.peer(peer);
    return std::make_pair(p->collective_connections(), p->striped_frames());
  });
}

// Of those connections, how many live on a shard of rank `c` (Config::engine_threads).
inline int hosted_connections(Communicator& c, int peer) {
  auto& node = node_of(c);
  return nexar::testing::on_engine(node.engine(), [&] { return node.peer(peer)->hosted_connections(); });
}

// Every collective over 4 connections per pair (collective_battery.hpp), and each pair
// carried collective frames on its extra connections.
inline void every_collective_exact(std::vector<Communicator>& comms) {
  constexpr int world = 3;
  battery::every_collective_exact(comms);
  for (int r = 0; r < world; ++r) {
    for (int q = 0; q < world; ++q) {
      if (q == r) continue;
      auto [connections, striped] = pair_state(comms[static_cast<std::size_t>(r)], q);
      EXPECT_EQ(connections, 4) << "rank " << r << " with rank " << q;
      // A ring sends each segment on to the next rank: many messages per operation, so
      // many turns. (A collective that sends one message per pair sends it on turn 0,
      // the first connection.)
      if (q == (r + 1) % world) {
        EXPECT_GT(striped, 0u) << "rank " << r << " sent rank " << q << " nothing on its extra connections";
      }
    }
    EXPECT_TRUE(comms[static_cast<std::size_t>(r)].failed_ranks().empty());
  }
}

}  // namespace nexar::testing::stripes
