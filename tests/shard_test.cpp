// Several engine threads (Config::engine_threads, transport/shard.*): real QUIC between ranks
// of one process, shared memory off. With extra connections on shards at both ends every
// collective stays exact, and a shard's port keeps only what is an extra connection.
#include <nexar/nexar.hpp>

#include <gtest/gtest.h>

#include "stripes_support.hpp"
#include "wire/frame.hpp"

#include <cstdint>
#include <string>

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

// A shard's port is no softer door than the first one. A dial that does not say it is an
// extra connection (ALPN) fails the handshake. One that says so but comes other than from
// the higher rank of a pair that is up (here the lower rank dials the higher's shard) gets
// through the handshake, since its certificate is good, and is then closed with the reason.
// The pair carries on as before.
TEST(Shard, KeepsOnlyExtraConnections) {
  Probe first, extra;  // outlive the communicators, whose endpoint calls them
  auto comms = nexar::bootstrap_local(2, config(2, 2));
  on_every_rank(comms, [&](int r) {
    auto v = values(200003, r, 11);
    comms[static_cast<std::size_t>(r)].all_reduce(v, ReduceOp::sum);
    EXPECT_EQ(v, sum_of_all(200003, 2, 11));
  });
  auto& high = node_of(comms[1]);
  nexar::quic::Address to = high.endpoint()->local();
  to.set_port(high.shard_port(0));
  const std::string not_extra = refusal(first, comms[0], to, 1, nexar::wire::mesh_alpn);
  EXPECT_NE(not_extra.find("alert 120"), std::string::npos) << not_extra;  // no_application_protocol
  const std::string lower = refusal(extra, comms[0], to, 1, nexar::wire::extra_alpn);
  EXPECT_NE(lower.find("takes only extra connections from a higher rank"), std::string::npos) << lower;
  on_every_rank(comms, [&](int r) {
    auto v = values(200003, r, 12);
    comms[static_cast<std::size_t>(r)].all_reduce(v, ReduceOp::sum);
    EXPECT_EQ(v, sum_of_all(200003, 2, 12));
  });
  EXPECT_EQ(hosted_connections(comms[1], 0), 1);
  for (auto& c : comms) EXPECT_TRUE(c.failed_ranks().empty());
}

}  // namespace
