// transport/peer.*: two Peers, rank 0's view of rank 1 and rank 1's view of rank 0, joined by
// an in-memory link (memory_link.hpp) wired in through the routing rule (Peer::use_link),
// each owned by a few lines of PeerOwner instead of a Node, with the node's real matching
// (memory_node.hpp). No socket, TLS or engine thread:
// every order of arrival is a seed, and each test runs in milliseconds.
//
// Checked: eager messages match posted receives oldest first, and arrive whole however the
// link splits and interleaves them; unexpected ones wait in order; rendezvous moves a large
// message only once the receiver asked, and a withdrawn one puts the receive back; a revoked
// communicator's messages are dropped; a link lost fails what is in flight, naming the peer.
#include <algorithm>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/call_check.hpp"
#include "engine/engine.hpp"
#include "memory_link.hpp"
#include "memory_node.hpp"
#include "transport/matching.hpp"
#include "transport/peer.hpp"

using namespace nexar;
using detail::Domain;
using detail::OpState;
using detail::Peer;
using detail::RecvOp;
using detail::Tag;
using test::MemoryLink;

namespace {

constexpr std::uint64_t kComm = 7;

std::shared_ptr<OpState> op_state(const char* name) {
  return std::make_shared<OpState>(name, OpState::Clock::now() + std::chrono::hours(1));
}

// One rank's side (memory_node.hpp): rank `rank` of two, and its Peer of the other rank.
struct Side : test::MemoryNode {
  Peer* other;  // this rank's Peer of the other rank

  explicit Side(int rank) : MemoryNode(rank, 2), other(peers[static_cast<std::size_t>(1 - rank)].get()) {}

  detail::MatchQueue& queue(Domain d) { return matching.queue(d); }

  std::shared_ptr<RecvOp> recv(Domain d, Tag tag, std::vector<std::byte>& out, bool exact = false) {
    return post_recv(d, kComm, 1 - me, tag, out, exact);
  }
};

// Ranks 0 and 1 joined by one in-memory link drawn from `seed`.
struct Pair {
  Side a{0}, b{1};
  MemoryLink la, lb;
  explicit Pair(std::uint64_t seed, std::size_t max_piece = 4096) : la(seed, 1 << 20, max_piece), lb(seed ^ 0x9e37, 1 << 20, max_piece) {
    MemoryLink::join(la, lb);
    la.bind(a.other->use_link(la));
    lb.bind(b.other->use_link(lb));
  }
  // Moves bytes until neither link has any to move, then runs what the peers posted to
  // their engines (no engine thread here), and again while that moved anything.
  void run() {
    for (;;) {
      MemoryLink::run(la, lb);
      std::size_t ran = 0;
      for (Side* s : {&a, &b}) ran += s->poll();
      if (ran == 0) return;
    }
  }
};

std::vector<std::byte> bytes_of(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<std::byte> v(n);
  for (auto& x : v) x = static_cast<std::byte>(g());
  return v;
}

// Sends `msg` from `from` eagerly: header and payload, zero-copy.
std::shared_ptr<OpState> send_eager(Side& from, Domain d, Tag tag, const std::vector<std::byte>& msg) {
  auto op = op_state("send");
  from.other->send_eager_in_place(d, kComm, tag, 0, {ConstBuffer{msg.data(), msg.size()}}, msg.size(), op);
  return op;
}

TEST(Peer, EagerMessagesMatchPostedReceivesOldestFirstAcrossSeeds) {
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    Pair p(seed, 1 + seed * 97);
    std::vector<std::vector<std::byte>> msgs, outs;
    std::vector<std::shared_ptr<RecvOp>> recvs;
    for (std::size_t i = 0; i < 6; ++i) {
      msgs.push_back(bytes_of(i * 1000 + 1, seed * 10 + i));
      outs.emplace_back(msgs.back().size());
    }
    // Three receives posted before, three after their messages are in.
    for (std::size_t i = 0; i < 3; ++i) recvs.push_back(p.b.recv(Domain::data, 5, outs[i]));
    std::vector<std::shared_ptr<OpState>> sends;
    for (const auto& m : msgs) sends.push_back(send_eager(p.a, Domain::data, 5, m));
    p.run();
    EXPECT_EQ(p.b.queue(Domain::data).unexpected().size(), 3u) << "seed " << seed;
    for (std::size_t i = 3; i < 6; ++i) recvs.push_back(p.b.recv(Domain::data, 5, outs[i]));
    for (std::size_t i = 0; i < 6; ++i) {
      ASSERT_TRUE(recvs[i]->op->done()) << "seed " << seed << " message " << i;
      EXPECT_EQ(recvs[i]->op->code(), Errc::ok) << recvs[i]->op->message();
      EXPECT_EQ(outs[i], msgs[i]) << "seed " << seed << ": receive " << i << " got another message";
      EXPECT_TRUE(sends[i]->done() && sends[i]->code() == Errc::ok);
    }
    EXPECT_EQ(p.a.other->unacked(), 0u);
  }
}

// A collective message whose call differs from the posted receive's (the fingerprint its
// header carries) is refused, eager or announced: the owner hears of it, the receive fails,
// the payload is dropped, and the lane's next message is read as usual.
TEST(Peer, AMessageOfAnotherCallIsRefused) {
  Pair p(7, 700);
  const auto msg = bytes_of(3000, 1), big = bytes_of(5000, 2), next = bytes_of(100, 3);
  std::vector<std::byte> out(msg.size()), out_big(big.size()), out_next(next.size());
  auto r = p.b.recv(Domain::collective, 4, out, true);
  auto r_big = p.b.recv(Domain::collective, 5, out_big, true);
  auto r_next = p.b.recv(Domain::collective, 6, out_next, true);
  r->check = r_big->check = r_next->check = 0x8888;
  auto eager = op_state("send"), announced = op_state("send"), fine = op_state("send");
  p.a.other->send_eager_in_place(Domain::collective, kComm, 4, 0x8890, {ConstBuffer{msg.data(), msg.size()}}, msg.size(), eager);
  p.a.other->start_rendezvous(Domain::collective, kComm, 5, 0x8c88, {ConstBuffer{big.data(), big.size()}}, big.size(), announced);
  p.a.other->send_eager_in_place(Domain::collective, kComm, 6, 0x8888, {ConstBuffer{next.data(), next.size()}}, next.size(), fine);
  p.run();
  EXPECT_EQ(r->op->code(), Errc::invalid_argument);
  EXPECT_EQ(r_big->op->code(), Errc::invalid_argument);
  // Each refusal revokes the communicator on every member, in the words each error carries.
  auto refused = [](Tag tag, std::uint16_t theirs) {
    return "revoke everywhere " + std::to_string(kComm) + ": " +
           detail::calls_differ("collective #" + std::to_string(detail::collective_number(tag)), kComm, 1, 0x8888, 0,
                                theirs, 2);
  };
  const auto& ev = p.b.events;
  EXPECT_NE(std::find(ev.begin(), ev.end(), refused(4, 0x8890)), ev.end()) << ev.size() << " events";
  EXPECT_NE(std::find(ev.begin(), ev.end(), refused(5, 0x8c88)), ev.end()) << ev.size() << " events";
  EXPECT_NE(r->op->message().find(refused(4, 0x8890).substr(std::string("revoke everywhere 7: ").size())),
            std::string::npos)
      << r->op->message();
  EXPECT_EQ(out, std::vector<std::byte>(msg.size())) << "a refused payload reached the buffer";
  ASSERT_TRUE(r_next->op->done());
  EXPECT_EQ(r_next->op->code(), Errc::ok) << r_next->op->message();
  EXPECT_EQ(out_next, next);
  EXPECT_FALSE(announced->done()) << "no cts answers a refused announcement (the revocation withdraws it)";
}

TEST(Peer, LanesInterleaveButEachKeepsItsOrder) {
  for (std::uint64_t seed = 100; seed < 110; ++seed) {
    Pair p(seed, 700);
    const Domain ds[] = {Domain::data, Domain::bulk, Domain::collective};
    std::vector<std::vector<std::byte>> msgs[3];
    for (int d = 0; d < 3; ++d)
      for (int i = 0; i < 4; ++i) {
        msgs[d].push_back(bytes_of(static_cast<std::size_t>(500 * i + d), seed * 100 + static_cast<std::uint64_t>(10 * d + i)));
        send_eager(p.a, ds[d], 9, msgs[d].back());
      }
    p.run();
    for (int d = 0; d < 3; ++d) {
      auto& list = p.b.queue(ds[d]).unexpected();
      ASSERT_EQ(list.size(), 4u);
      int i = 0;
      for (const auto& u : list) {
        EXPECT_TRUE(u->complete);
        EXPECT_EQ(u->data, msgs[d][static_cast<std::size_t>(i)]) << "seed " << seed << " domain " << d << " message " << i;
        ++i;
      }
    }
  }
}

TEST(Peer, RendezvousMovesTheMessageOnlyOnceTheReceiverAsks) {
  for (std::uint64_t seed = 1; seed <= 5; ++seed) {
    Pair p(seed);
    const auto msg = bytes_of(300000 + seed, seed);
    auto send = op_state("send");
    p.a.other->start_rendezvous(Domain::data, kComm, 3, 0, {ConstBuffer{msg.data(), msg.size()}}, msg.size(), send);
    p.run();
    // Only the announcement came: nothing is sent before a receive asks.
    ASSERT_EQ(p.b.queue(Domain::data).unexpected().size(), 1u);
    EXPECT_TRUE(p.b.queue(Domain::data).unexpected().front()->rendezvous);
    EXPECT_FALSE(send->done());
    EXPECT_EQ(p.a.other->unacked(), 0u) << "the data stays with the sender until asked";
    std::vector<std::byte> out(msg.size());
    auto r = p.b.recv(Domain::data, 3, out);
    p.run();
    ASSERT_TRUE(r->op->done());
    EXPECT_EQ(r->op->code(), Errc::ok) << r->op->message();
    EXPECT_EQ(r->op->status().bytes, msg.size());
    EXPECT_TRUE(out == msg) << "seed " << seed;
    EXPECT_TRUE(send->done() && send->code() == Errc::ok);
  }
}

TEST(Peer, AWithdrawnRendezvousSendPutsTheReceiveBackFirst) {
  Pair p(42);
  const auto msg = bytes_of(200000, 1);
  auto send = op_state("send");
  p.a.other->start_rendezvous(Domain::data, kComm, 3, 0, {ConstBuffer{msg.data(), msg.size()}}, msg.size(), send);
  p.run();
  EXPECT_TRUE(p.a.other->cancel_rendezvous(send.get()));
  std::vector<std::byte> out(msg.size()), later(msg.size());
  auto r = p.b.recv(Domain::data, 3, out);  // matches the announcement: asks for the data
  auto r2 = p.b.recv(Domain::data, 3, later);
  p.run();
  EXPECT_FALSE(r->op->done()) << "a withdrawn send was never sent: its receive waits on";
  EXPECT_TRUE(p.b.events.empty()) << "nothing failed or was revoked";
  ASSERT_EQ(p.b.queue(Domain::data).posted().size(), 2u);
  EXPECT_EQ(p.b.queue(Domain::data).posted().front(), r) << "ahead of the receive posted after it";
  // The next message goes to the first receive.
  const auto next = bytes_of(10, 2);
  send_eager(p.a, Domain::data, 3, next);
  p.run();
  ASSERT_TRUE(r->op->done());
  EXPECT_TRUE(std::equal(next.begin(), next.end(), out.begin()));
  EXPECT_FALSE(r2->op->done());
}

TEST(Peer, ARevokedCommunicatorsMessagesAreDropped) {
  Pair p(7);
  p.b.failures.on_revoke_notice(0, kComm, Errc::revoked, "");
  const auto msg = bytes_of(5000, 3);
  auto sent = send_eager(p.a, Domain::collective, 11, msg);
  auto rdv = op_state("send");
  p.a.other->start_rendezvous(Domain::collective, kComm, 12, 0, {ConstBuffer{msg.data(), msg.size()}}, msg.size(), rdv);
  p.run();
  EXPECT_TRUE(p.b.queue(Domain::collective).unexpected().empty()) << "nobody will receive them";
  EXPECT_TRUE(sent->done() && sent->code() == Errc::ok) << "the bytes reached the receiver, which dropped them";
  EXPECT_FALSE(rdv->done()) << "never asked for: the sender withdraws it when it learns of the revocation";
  // The sender learns; what it still holds of that communicator fails.
  p.a.failures.on_revoke_notice(1, kComm, Errc::revoked, "");
  p.a.other->fail_comm(kComm, [&](const std::shared_ptr<OpState>& op) { p.a.fail(op, Errc::revoked, 1, "revoked"); });
  EXPECT_TRUE(rdv->done());
  EXPECT_EQ(rdv->code(), Errc::revoked);
  auto late = op_state("send");
  p.a.other->send_eager_in_place(Domain::collective, kComm, 13, 0, {ConstBuffer{msg.data(), msg.size()}}, msg.size(), late);
  EXPECT_EQ(late->code(), Errc::revoked) << "a send on a revoked communicator fails at once";
}

TEST(Peer, ALostLinkFailsEverythingInFlightNamingThePeer) {
  Pair p(9);
  std::vector<std::byte> out(100000);
  auto r = p.b.recv(Domain::data, 1, out);
  const auto msg = bytes_of(100000, 4);
  auto send = op_state("send");
  p.a.other->start_rendezvous(Domain::data, kComm, 1, 0, {ConstBuffer{msg.data(), msg.size()}}, msg.size(), send);
  p.la.cut_after(60000);  // somewhere in the data
  p.run();
  EXPECT_TRUE(p.a.other->gone());
  EXPECT_TRUE(p.b.other->gone());
  ASSERT_TRUE(send->done()) << "its data was on the way";
  EXPECT_EQ(send->code(), Errc::peer_failed) << send->message();
  EXPECT_NE(send->message().find("rank 1"), std::string::npos)
      << "the send failed mid-data names the peer, as the receive does: " << send->message();
  ASSERT_TRUE(r->op->done()) << "the receive whose data was arriving";
  EXPECT_EQ(r->op->code(), Errc::peer_failed);
  EXPECT_NE(r->op->message().find("rank 0"), std::string::npos) << r->op->message();
  // Later operations fail at once.
  auto late = op_state("send");
  p.a.other->send_eager_in_place(Domain::data, kComm, 1, 0, {ConstBuffer{msg.data(), 8}}, 8, late);
  EXPECT_EQ(late->code(), Errc::peer_failed);
}

}  // namespace
