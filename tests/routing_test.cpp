// transport/routing.*: worlds of MemoryNodes (memory_node.hpp) on a ring (k_regular:2),
// each pair of neighbours joined by an in-memory link (memory_link.hpp), every other pair
// relayed by the real Routing. No socket, TLS or engine thread: each order of arrival is a
// seed, and each test runs in milliseconds.
//
// Checked: a message between any two ranks arrives whole through relays, and its send
// completes once the destination acknowledged it, with a relay window far smaller than the
// message; a relay that forges a frame of another rank gets nothing delivered; bytes in
// flight through a rank that dies are sent again around it and arrive once; a rank that no
// route of live ranks reaches fails what waits for it; the hop limit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "memory_node.hpp"
#include "tls/mac.hpp"

using namespace nexar;
using detail::Domain;
using detail::OpState;
using detail::RecvOp;
using test::MemoryLink;
using test::MemoryNode;
using test::MemoryWorld;

namespace {

constexpr std::uint64_t kComm = 9;

Config ring_config(std::uint64_t window = 4ull << 20, std::uint32_t hop_limit = 0) {
  Config c;
  c.topology = Topology::parse("k_regular:2");
  c.relay_window = window;
  c.relay_hop_limit = hop_limit;
  return c;
}

std::vector<std::byte> bytes_of(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<std::byte> v(n);
  for (auto& x : v) x = static_cast<std::byte>(g());
  return v;
}

std::shared_ptr<OpState> send(MemoryNode& from, int dest, detail::Tag tag, const std::vector<std::byte>& msg) {
  auto op = std::make_shared<OpState>("send", OpState::Clock::now() + std::chrono::hours(1));
  from.peers[static_cast<std::size_t>(dest)]->send_eager_in_place(Domain::data, kComm, tag, 0,
                                                                  {ConstBuffer{msg.data(), msg.size()}}, msg.size(), op);
  return op;
}

TEST(Routing, NeighboursRoutesAndTheHopLimit) {
  MemoryNode n(0, 9, ring_config(), test::relay_keys_of(0, 9));
  EXPECT_TRUE(n.routing.direct(1));
  EXPECT_TRUE(n.routing.direct(8));
  EXPECT_FALSE(n.routing.direct(2));
  EXPECT_FALSE(n.routing.direct(0));
  EXPECT_EQ(n.routing.direct_peers(), (std::vector<int>{1, 8}));
  EXPECT_TRUE(n.peers[2]->relayed());
  EXPECT_FALSE(n.peers[1]->relayed());
  // The diameter of a ring of 9 is 4; the hop limit in force is 8 unless set.
  for (int r = 1; r < 9; ++r) {
    EXPECT_TRUE(n.routing.routable(r)) << r;
    EXPECT_EQ(n.routing.beyond_hop_limit(r), "") << r;
  }
  MemoryNode limited(0, 9, ring_config(4ull << 20, 2), test::relay_keys_of(0, 9));
  EXPECT_TRUE(limited.routing.routable(2));
  EXPECT_FALSE(limited.routing.routable(3));
  EXPECT_FALSE(limited.routing.routable(6));
  EXPECT_EQ(limited.routing.beyond_hop_limit(4),
            "rank 4 is 4 hops away under topology k_regular:2, beyond the hop limit of 2 "
            "(Config::relay_hop_limit, NEXAR_RELAY_HOPS)");
  // A rank that is no neighbour and has no key cannot be relayed to.
  try {
    MemoryNode keyless(0, 5, ring_config());
    FAIL() << "relayed without a key";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("no relay key was issued"), std::string::npos) << e.what();
  }
}

// Every ordered pair of ranks, odd world sizes, sizes from 0 bytes to several relay
// segments, a relay window smaller than most messages: each arrives whole at the right
// receive, and each send completes, which it does only once the destination acknowledged
// every byte.
TEST(Routing, EveryPairReachesEveryOtherThroughRelays) {
  for (int n : {5, 7}) {
    for (std::uint64_t seed = 1; seed <= 3; ++seed) {
      MemoryWorld ring(n, seed, ring_config(20000));
      std::mt19937_64 g(seed);
      const std::size_t sizes[] = {0, 1, 4093, 65537, 150001};
      struct Sent {
        int from, to;
        std::vector<std::byte> msg, out;
        std::shared_ptr<OpState> send;
        std::shared_ptr<RecvOp> recv;
      };
      std::vector<Sent> all;
      all.reserve(static_cast<std::size_t>(n * n));
      for (int a = 0; a < n; ++a) {
        for (int b = 0; b < n; ++b) {
          if (a == b) continue;
          Sent s{a, b, bytes_of(sizes[g() % std::size(sizes)], g()), {}, {}, {}};
          s.out.resize(s.msg.size());
          const auto tag = static_cast<detail::Tag>(a * 100 + b);
          // Half the receives are posted before the message comes, half after.
          if (g() % 2) s.recv = ring.node(b).post_recv(Domain::data, kComm, a, tag, s.out);
          s.send = send(ring.node(a), b, tag, s.msg);
          all.push_back(std::move(s));
        }
      }
      ring.run();
      for (auto& s : all)
        if (!s.recv) s.recv = ring.node(s.to).post_recv(Domain::data, kComm, s.from, static_cast<detail::Tag>(s.from * 100 + s.to), s.out);
      ring.run();
      for (const auto& s : all) {
        const std::string what = "world " + std::to_string(n) + " seed " + std::to_string(seed) + ": " +
                                 std::to_string(s.from) + " -> " + std::to_string(s.to) + ", " +
                                 std::to_string(s.msg.size()) + " bytes";
        ASSERT_TRUE(s.recv->op->done()) << what;
        EXPECT_EQ(s.recv->op->code(), Errc::ok) << what << ": " << s.recv->op->message();
        EXPECT_EQ(s.out, s.msg) << what;
        ASSERT_TRUE(s.send->done()) << what << ": the send was never acknowledged";
        EXPECT_EQ(s.send->code(), Errc::ok) << what;
      }
      for (int a = 0; a < n; ++a) {
        for (int b = 0; b < n; ++b) {
          if (a == b) continue;
          EXPECT_EQ(ring.peer(a, b).unacked(), 0u) << a << " -> " << b;
        }
      }
    }
  }
}

// Rank 1 sits between 0 and 2. It writes a relay frame that claims rank 0 as its origin:
// rank 2 drops it (the MAC is under the key of 0 and 2, which 1 does not hold), keeps its
// link with 1, and takes 0's real message after it.
TEST(Routing, ARelayCannotForgeAnotherRanksFrame) {
  MemoryWorld ring(5, 4, ring_config());
  // An eager message frame of 4 bytes as rank 0's lane stream would carry it.
  const std::vector<std::byte> fake = bytes_of(4, 99);
  wire::FrameHeader inner = ring.peer(0, 2).message_header(wire::FrameType::eager, kComm, 5, 0, fake.size());
  std::vector<std::byte> body(wire::header_size + fake.size() + wire::relay_mac_size);
  wire::encode_header(inner, std::span<std::byte, wire::header_size>(body.data(), wire::header_size));
  std::memcpy(body.data() + wire::header_size, fake.data(), fake.size());
  // The MAC under a key rank 1 does hold (its own with 2): still not the pair's.
  const detail::RelayKey wrong = test::relay_key(1, 2);
  const std::span<const std::byte> data(body.data(), wire::header_size + fake.size());
  const tls::Mac mac = tls::mac(wrong, {data});
  std::memcpy(body.data() + data.size(), mac.data(), mac.size());
  wire::FrameHeader h;
  h.type = wire::FrameType::relay;
  h.src = 0;
  h.comm = wire::relay_route(2, 1);
  h.seq = 0;
  ring.peer(1, 2).send_frame(wire::Lane::data, h, body);
  ring.run();
  EXPECT_TRUE(ring.node(2).matching.queue(Domain::data).unexpected().empty()) << "a forged message was delivered";
  EXPECT_FALSE(ring.peer(2, 1).gone());
  EXPECT_FALSE(ring.peer(2, 0).gone());

  const auto real = bytes_of(4, 100);
  std::vector<std::byte> out(real.size());
  auto r = ring.node(2).post_recv(Domain::data, kComm, 0, 5, out);
  auto s = send(ring.node(0), 2, 5, real);
  ring.run();
  ASSERT_TRUE(r->op->done());
  EXPECT_EQ(r->op->code(), Errc::ok) << r->op->message();
  EXPECT_EQ(out, real);
  EXPECT_TRUE(s->done() && s->code() == Errc::ok);
}

// Rank 0 sends to 2 through 1; rank 1 dies after part of it passed. Every rank routes
// around 1, rank 0 sends what 2 had not acknowledged again the long way (0-4-3-2), and 2
// takes each byte once: the message arrives whole, the send completes.
TEST(Routing, BytesInFlightThroughADeadRelayArriveAroundIt) {
  for (std::uint64_t seed = 1; seed <= 6; ++seed) {
    MemoryWorld ring(5, seed, ring_config(50000));
    const auto msg = bytes_of(300001, seed);
    std::vector<std::byte> out(msg.size());
    auto r = ring.node(2).post_recv(Domain::data, kComm, 0, 7, out);
    auto s = send(ring.node(0), 2, 7, msg);
    // Let some of it through 1, then kill 1.
    auto& l12 = ring.links.at({1, 2});
    l12.first->cut_after(20000 + seed * 9000);
    ring.run();
    EXPECT_FALSE(r->op->done()) << "seed " << seed << ": all of it passed before the cut";
    ring.kill(1);
    ring.run();
    ASSERT_TRUE(r->op->done()) << "seed " << seed;
    EXPECT_EQ(r->op->code(), Errc::ok) << r->op->message();
    EXPECT_EQ(out, msg) << "seed " << seed;
    ASSERT_TRUE(s->done()) << "seed " << seed;
    EXPECT_EQ(s->code(), Errc::ok) << s->message();
  }
}

// Ranks 1 and 4, rank 0's two neighbours, go down: no route of live ranks leads from 0 to
// 2 or 3 any more. When they failed, 2 and 3 are declared failed from 0 (its failures, run
// for real: a communicator containing them is revoked naming one); when they left in
// order, 2 and 3 are only out of reach, and nothing is declared.
TEST(Routing, ARankNoRouteReachesIsGivenUp) {
  for (const bool failed : {true, false}) {
    MemoryNode n(0, 5, ring_config(), test::relay_keys_of(0, 5));
    n.failures.start_liveness();  // judging from now on (no endpoint: nothing is timed)
    std::vector<std::string> heard;
    n.failures.watch(kComm, {0, 1, 2, 3, 4}, 0, [&](int r, Errc code, const std::string&) {
      heard.push_back(std::to_string(r) + " " + std::to_string(static_cast<int>(code)));
    });
    n.routing.route_around(1, failed);
    EXPECT_FALSE(n.peers[2]->gone()) << "2 is still reached through 3 and 4";
    EXPECT_TRUE(n.routing.routable(2));
    n.routing.route_around(4, failed);
    for (int d : {2, 3}) {
      const auto& p = *n.peers[static_cast<std::size_t>(d)];
      EXPECT_TRUE(p.gone()) << d;
      EXPECT_FALSE(n.routing.routable(d)) << d;
      EXPECT_EQ(p.gone_code(), failed ? Errc::rank_failed : Errc::peer_closed) << d << ": " << p.gone_why();
      EXPECT_EQ(n.failures.is_failed(d), failed) << d;
      EXPECT_NE(p.gone_why().find("unreachable: every route to it runs through failed or departed ranks"),
                std::string::npos)
          << p.gone_why();
    }
    EXPECT_FALSE(n.peers[1]->gone()) << "routing declares nothing about the rank that went down itself";
    EXPECT_FALSE(n.failures.is_failed(1));
    auto op = std::make_shared<OpState>("all_reduce", OpState::Clock::now() + std::chrono::hours(1));
    EXPECT_EQ(n.failures.fail_if_revoked(kComm, op), failed);
    if (failed) {
      const auto rank_failed = std::to_string(static_cast<int>(Errc::rank_failed));
      EXPECT_EQ(heard, (std::vector<std::string>{"2 " + rank_failed, "3 " + rank_failed}));
      EXPECT_EQ(op->code(), Errc::rank_failed);
      EXPECT_NE(op->message().find("rank 2 failed: unreachable"), std::string::npos) << op->message();
    } else {
      EXPECT_TRUE(heard.empty());
    }
  }
}

}  // namespace
