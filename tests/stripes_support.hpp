// What the tests of a pair's extra connections share (stripes_test.cpp, shard_test.cpp):
// their configuration, a look at a pair from one rank's engine thread, deterministic values
// any rank can compute for any other, and a battery of every collective checked against a
// reference computed here.
#pragma once

#include <nexar/nexar.hpp>

#include <gtest/gtest.h>

#include "support.hpp"
#include "comm/group.hpp"
#include "core/access.hpp"
#include "transport/node.hpp"
#include "transport/peer.hpp"

#include <algorithm>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace nexar::testing::stripes {

using nexar::Communicator;
using nexar::Errc;
using nexar::ReduceOp;
using nexar::testing::on_every_rank;

inline nexar::Config config(std::uint32_t connections, std::uint32_t engine_threads = 1) {
  nexar::Config c = nexar::testing::test_config();
  c.connections_per_peer = connections;
  c.engine_threads = engine_threads;
  c.shm = false;               // the ranks share a host: keep their messages on QUIC
  c.segment_bytes = 64 << 10;  // many segments, so many turns, per operation
  return c;
}

inline nexar::detail::Node& node_of(Communicator& c) { return nexar::detail::Access::group(c)->node(); }

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

// Values of rank r for a test case: deterministic, so any rank can compute anyone's.
inline std::vector<std::int64_t> values(std::size_t n, int r, std::uint64_t salt) {
  std::mt19937_64 g(salt * 131 + static_cast<std::uint64_t>(r));
  std::vector<std::int64_t> v(n);
  for (auto& x : v) x = static_cast<std::int64_t>(g() >> 24);
  return v;
}

inline std::vector<std::int64_t> sum_of_all(std::size_t n, int world, std::uint64_t salt) {
  std::vector<std::int64_t> want(n, 0);
  for (int q = 0; q < world; ++q) {
    const auto v = values(n, q, salt);
    for (std::size_t i = 0; i < n; ++i) want[i] += v[i];
  }
  return want;
}

// Every collective over 4 connections per pair, 3 ranks (odd), sizes from 0 elements to
// several MiB not divisible by the world: results equal a reference computed here, and
// each pair carried collective frames on its extra connections.
inline void every_collective_exact(std::vector<Communicator>& comms) {
  constexpr int world = 3;
  on_every_rank(comms, [&](int r) {
    Communicator& c = comms[static_cast<std::size_t>(r)];
    std::uint64_t salt = 0;
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{4099}, std::size_t{700001}}) {
      ++salt;
      auto v = values(n, r, salt);
      c.all_reduce(v, ReduceOp::sum);
      EXPECT_EQ(v, sum_of_all(n, world, salt)) << "all_reduce of " << n;

      ++salt;
      auto b = values(n, 1, salt);
      if (r != 1) std::fill(b.begin(), b.end(), 0);
      c.broadcast(b, 1);
      EXPECT_EQ(b, values(n, 1, salt)) << "broadcast of " << n;

      ++salt;
      std::vector<std::int64_t> all(n * world);
      c.all_gather(values(n, r, salt), all);
      for (int q = 0; q < world; ++q) {
        const auto want = values(n, q, salt);
        EXPECT_TRUE(std::equal(want.begin(), want.end(), all.begin() + static_cast<std::ptrdiff_t>(n * q)))
            << "all_gather of " << n << ", block of rank " << q;
      }

      ++salt;
      std::vector<std::int64_t> mine(n);
      c.reduce_scatter(values(n * world, r, salt), mine, ReduceOp::sum);
      const auto total = sum_of_all(n * world, world, salt);
      EXPECT_TRUE(std::equal(mine.begin(), mine.end(), total.begin() + static_cast<std::ptrdiff_t>(n * r)))
          << "reduce_scatter of " << n;

      ++salt;
      std::vector<std::int64_t> got(n * world);
      c.all_to_all(values(n * world, r, salt), got);
      for (int q = 0; q < world; ++q) {
        const auto theirs = values(n * world, q, salt);
        EXPECT_TRUE(std::equal(got.begin() + static_cast<std::ptrdiff_t>(n * q),
                               got.begin() + static_cast<std::ptrdiff_t>(n * (q + 1)),
                               theirs.begin() + static_cast<std::ptrdiff_t>(n * r)))
            << "all_to_all of " << n << ", block from rank " << q;
      }
    }
    // Several collectives in flight at once on one communicator, under different tags.
    std::vector<std::vector<std::int64_t>> bufs;
    for (int k = 0; k < 4; ++k) bufs.push_back(values(300007 + static_cast<std::size_t>(k), r, 100 + static_cast<std::uint64_t>(k)));
    std::vector<nexar::Request> reqs;
    for (auto& b : bufs) reqs.push_back(c.iall_reduce(b, ReduceOp::sum));
    for (auto& q : reqs) q.wait();
    for (int k = 0; k < 4; ++k)
      EXPECT_EQ(bufs[static_cast<std::size_t>(k)], sum_of_all(300007 + static_cast<std::size_t>(k), world, 100 + static_cast<std::uint64_t>(k)))
          << "concurrent all_reduce " << k;
    c.barrier();
  });
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
