// What the tests of a pair's extra connections share (stripes_test.cpp, shard_test.cpp):
// their configuration, a look at a pair from one rank's engine thread, a dial made by hand
// to see what a port refuses, and the collective battery (collective_battery.hpp) with a
// check that the extra connections carried it.
#pragma once

#include <nexar/nexar.hpp>

#include <gtest/gtest.h>

#include "collective_battery.hpp"
#include "support.hpp"
#include "comm/communicator_impl.hpp"
#include "core/access.hpp"
#include "quic/address.hpp"
#include "quic/connection.hpp"
#include "transport/node.hpp"
#include "transport/peer.hpp"
#include "wire/frame.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <thread>
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

// A connection dialled by hand, to learn why the far end closes it. It must outlive the
// communicators, whose endpoints call it.
struct Probe final : nexar::quic::ConnectionHandler {
  std::atomic<bool> closed{false};
  std::string why;
  std::string on_peer_identity(nexar::quic::Connection&, const std::string&) override { return {}; }
  void on_established(nexar::quic::Connection&) override {}
  void on_stream_data(nexar::quic::Connection&, std::int64_t, const std::uint8_t*, std::size_t) override {}
  void on_closed(nexar::quic::Connection&, Errc, const std::string& w) override {
    why = w;
    closed.store(true);
  }
};

// Dials `to` from `from`'s endpoint (with its certificate), expecting `to_rank`'s node and
// offering ALPN `alpn`; returns why the far end closed it, or "(kept)" after 5 s.
inline std::string refusal(Probe& probe, Communicator& from, nexar::quic::Address to, int to_rank,
                           const std::string& alpn) {
  auto& node = node_of(from);
  nexar::testing::on_engine(node.engine(),
                            [&] { node.endpoint()->connect(to, node.peer(to_rank)->name(), &probe, alpn); });
  for (int i = 0; i < 500 && !probe.closed.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return probe.closed.load() ? probe.why : "(kept)";
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
