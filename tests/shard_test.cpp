// Several engine threads (Config::engine_threads, transport/shard.*): real QUIC between ranks
// of one process, shared memory off. With extra connections on shards at both ends every
// collective stays exact, and a shard's port keeps only what is an extra connection.
#include <nexar/nexar.hpp>

#include <gtest/gtest.h>

#include "stripes_support.hpp"
#include "quic/address.hpp"
#include "quic/connection.hpp"

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>

namespace {

using namespace std::chrono_literals;
using namespace nexar::testing::stripes;

// Every collective, as stripes_test checks it, with 4 connections per pair and 3 engine
// threads per rank: extra connections 1 and 2 of each pair live on the two shards at both
// ends (3 on the node's own thread), so their bytes are encrypted, decrypted and
// acknowledged on other threads than the one that matches them.
TEST(Shard, EveryCollectiveExactOnThreeEngineThreads) {
  auto comms = nexar::bootstrap_local(3, config(4, 3));
  every_collective_exact(comms);
  for (int r = 0; r < 3; ++r) {
    for (int q = 0; q < 3; ++q) {
      if (q == r) continue;
      EXPECT_EQ(hosted_connections(comms[static_cast<std::size_t>(r)], q), 2) << "rank " << r << " with rank " << q;
    }
  }
}

// A shard's port is no softer door than the first one: a member that dials it other than
// as the higher rank of a pair that is up (here the lower rank dials the higher's shard) gets
// through the handshake, since its certificate is good, and is then closed with the reason.
// The pair carries on as before.
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

TEST(Shard, KeepsOnlyExtraConnections) {
  Probe probe;  // outlives the communicators, whose endpoint calls it
  auto comms = nexar::bootstrap_local(2, config(2, 2));
  on_every_rank(comms, [&](int r) {
    auto v = values(200003, r, 11);
    comms[static_cast<std::size_t>(r)].all_reduce(v, ReduceOp::sum);
    EXPECT_EQ(v, sum_of_all(200003, 2, 11));
  });
  auto& low = node_of(comms[0]);
  auto& high = node_of(comms[1]);
  nexar::quic::Address to = high.endpoint()->local();
  to.set_port(high.shard_port(0));
  nexar::testing::on_engine(low.engine(), [&] { low.endpoint()->connect(to, low.peer(1)->name(), &probe); });
  for (int i = 0; i < 500 && !probe.closed.load(); ++i) std::this_thread::sleep_for(10ms);
  ASSERT_TRUE(probe.closed.load()) << "rank 1's shard kept a connection rank 0 dialled";
  EXPECT_NE(probe.why.find("takes only extra connections from a higher rank"), std::string::npos) << probe.why;
  on_every_rank(comms, [&](int r) {
    auto v = values(200003, r, 12);
    comms[static_cast<std::size_t>(r)].all_reduce(v, ReduceOp::sum);
    EXPECT_EQ(v, sum_of_all(200003, 2, 12));
  });
  EXPECT_EQ(hosted_connections(comms[1], 0), 1);
  for (auto& c : comms) EXPECT_TRUE(c.failed_ranks().empty());
}

}  // namespace
