// transport/matching.*: a node's matching of messages with receives, alone. Its owner is a
// few lines that record what it is asked to do; no Peer, link or engine. The messages here
// arrived whole (a Peer is needed only for those still arriving or announced, which
// tests/peer_test.cpp covers through a pair of Peers).
//
// Checked: a whole message lands in its receive with the status the application sees; one
// too large fails the receive and leaves the buffer alone; a collective receive of another
// size fails, and revokes the communicator everywhere when it carries a call's fingerprint;
// fingerprints that differ fail the receive, copy nothing and revoke everywhere, in the words
// every member's error carries, while a zero fingerprint on either side agrees; a reposted
// receive takes a message already there, or goes back ahead of those posted after it; a
// collective's message nobody awaits is judged by the registry of calls.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/call_check.hpp"
#include "memory_node.hpp"  // recv_op
#include "transport/matching.hpp"

using namespace nexar;
using detail::Domain;
using detail::Matching;
using detail::OpState;
using detail::RecvOp;
using detail::Tag;
using detail::Unexpected;

namespace {

constexpr std::uint64_t kComm = 0x21;
constexpr int kMe = 1;  // this node's world rank, of 3

struct Recorder final : Matching::Owner {
  std::vector<std::string> revoked;  // "<comm>: <why>", in order
  int size() const noexcept override { return 3; }
  detail::Peer* peer(int) noexcept override { return nullptr; }
  void fail(const std::shared_ptr<OpState>& op, Errc code, int p, std::string_view why) override {
    if (op && !op->done()) op->complete(code, "peer " + std::to_string(p) + ": " + std::string(why));
  }
  void revoke_everywhere(std::uint64_t comm, const std::string& why) override {
    revoked.push_back(std::to_string(comm) + ": " + why);
  }
};

struct Fixture {
  Recorder owner;
  Matching m{owner, kMe};
};

std::shared_ptr<RecvOp> receive(int source, Tag tag, std::vector<std::byte>& buf, bool exact = false,
                                std::uint16_t check = 0) {
  return test::recv_op(kComm, source, tag, buf, exact, check);
}

std::vector<std::byte> pattern(std::size_t n, int salt) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 31 + static_cast<std::size_t>(salt)) & 0xff);
  return v;
}

// A whole message from world rank `source` waiting in `d`'s queue.
void arrived(Matching& m, Domain d, int source, Tag tag, std::vector<std::byte> data, std::uint16_t check = 0) {
  Unexpected u;
  u.comm = kComm;
  u.source = source;
  u.tag = tag;
  u.size = data.size();
  u.data = std::move(data);
  u.check = check;
  u.complete = true;
  m.queue(d).add_unexpected(std::move(u));
}

// Posts `r` as Node::irecv does: a waiting message first.
void post(Matching& m, Domain d, const std::shared_ptr<RecvOp>& r) {
  auto& q = m.queue(d);
  if (auto it = q.find_unexpected(*r); it != q.end())
    m.deliver_unexpected(d, r, it);
  else
    q.post(r);
}

const Tag kColl = detail::collective_message_tag(detail::collective_tag(5), 0);

TEST(Matching, AWholeMessageLandsWithTheStatusTheApplicationSees) {
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{4093}}) {
    Fixture f;
    const auto msg = pattern(n, 3);
    arrived(f.m, Domain::data, 2, 9, msg);
    std::vector<std::byte> buf(n + 7, std::byte{0xee});
    auto r = receive(2, 9, buf);
    post(f.m, Domain::data, r);
    ASSERT_TRUE(r->op->done());
    EXPECT_EQ(r->op->code(), Errc::ok) << r->op->message();
    EXPECT_EQ(r->op->status().source, 2);
    EXPECT_EQ(r->op->status().tag, 9);
    EXPECT_EQ(r->op->status().bytes, n);
    EXPECT_TRUE(std::equal(msg.begin(), msg.end(), buf.begin()));
    EXPECT_EQ(buf[n], std::byte{0xee}) << "nothing written past the message";
    EXPECT_TRUE(f.m.queue(Domain::data).unexpected().empty());
    EXPECT_TRUE(f.owner.revoked.empty());
  }
}

TEST(Matching, AMessageTooLargeFailsTheReceiveAndLeavesItsBuffer) {
  Fixture f;
  arrived(f.m, Domain::bulk, 0, 3, pattern(100, 1));
  std::vector<std::byte> buf(99, std::byte{0x5a});
  auto r = receive(0, 3, buf);
  post(f.m, Domain::bulk, r);
  ASSERT_TRUE(r->op->done());
  EXPECT_EQ(r->op->code(), Errc::truncated);
  EXPECT_NE(r->op->message().find("message of 100 bytes (tag 3) does not fit the receive buffer of 99 bytes"),
            std::string::npos)
      << r->op->message();
  EXPECT_EQ(buf, std::vector<std::byte>(99, std::byte{0x5a}));
  EXPECT_TRUE(f.m.queue(Domain::bulk).unexpected().empty()) << "the message is consumed";
}

TEST(Matching, ACollectiveReceiveOfAnotherSizeFailsAndRevokesWhenItHasAFingerprint) {
  for (std::uint16_t check : {std::uint16_t{0}, std::uint16_t{0x8888}}) {
    SCOPED_TRACE(check);
    Fixture f;
    arrived(f.m, Domain::collective, 2, kColl, pattern(40, 2), check);
    std::vector<std::byte> buf(48);
    auto r = receive(2, kColl, buf, true, check);
    post(f.m, Domain::collective, r);
    ASSERT_TRUE(r->op->done());
    EXPECT_EQ(r->op->code(), Errc::invalid_argument);
    const std::string why = detail::sizes_differ("collective #5", kComm, kMe, 48, 2, 40);
    EXPECT_NE(r->op->message().find(why), std::string::npos) << r->op->message();
    if (check == 0)
      EXPECT_TRUE(f.owner.revoked.empty()) << "a plain exact receive fails alone";
    else
      EXPECT_EQ(f.owner.revoked, std::vector<std::string>{std::to_string(kComm) + ": " + why});
  }
}

TEST(Matching, DifferentFingerprintsFailCopyNothingAndRevokeEverywhere) {
  Fixture f;
  arrived(f.m, Domain::collective, 0, kColl, pattern(16, 4), 0x8890);
  std::vector<std::byte> buf(16, std::byte{0x11});
  auto r = receive(0, kColl, buf, true, 0x8888);
  post(f.m, Domain::collective, r);
  ASSERT_TRUE(r->op->done());
  EXPECT_EQ(r->op->code(), Errc::invalid_argument);
  const std::string why = detail::calls_differ("collective #5", kComm, kMe, 0x8888, 0, 0x8890, 3);
  EXPECT_NE(r->op->message().find(why), std::string::npos) << r->op->message();
  EXPECT_EQ(f.owner.revoked, std::vector<std::string>{std::to_string(kComm) + ": " + why});
  EXPECT_EQ(buf, std::vector<std::byte>(16, std::byte{0x11})) << "a refused payload reached the buffer";
  // The message stays queued: the revocation drops the communicator's messages.
  EXPECT_EQ(f.m.queue(Domain::collective).unexpected().size(), 1u);
}

TEST(Matching, AZeroFingerprintOnEitherSideAgrees) {
  for (auto [mine, theirs] : {std::pair<std::uint16_t, std::uint16_t>{0, 0x8890}, {0x8888, 0}}) {
    Fixture f;
    const auto msg = pattern(16, 5);
    arrived(f.m, Domain::collective, 0, kColl, msg, theirs);
    std::vector<std::byte> buf(16);
    auto r = receive(0, kColl, buf, true, mine);
    post(f.m, Domain::collective, r);
    ASSERT_TRUE(r->op->done());
    EXPECT_EQ(r->op->code(), Errc::ok) << r->op->message();
    EXPECT_EQ(buf, msg);
    EXPECT_TRUE(f.owner.revoked.empty());
  }
}

TEST(Matching, ARepostedReceiveTakesAWaitingMessageOrGoesBackFirst) {
  Fixture f;
  std::vector<std::byte> b1(8), b2(8), b3(8);
  auto first = receive(2, 4, b1), later = receive(2, 4, b2);
  f.m.queue(Domain::data).post(later);
  // Nothing waiting: back in the queue, ahead of the receive posted after it.
  f.m.repost(Domain::data, first);
  ASSERT_EQ(f.m.queue(Domain::data).posted().size(), 2u);
  EXPECT_EQ(f.m.queue(Domain::data).posted().front(), first);
  // A message waiting: the reposted receive takes it.
  auto third = receive(2, 4, b3);
  const auto msg = pattern(8, 6);
  arrived(f.m, Domain::data, 2, 4, msg);
  f.m.repost(Domain::data, third);
  ASSERT_TRUE(third->op->done());
  EXPECT_EQ(b3, msg);
  // A receive that ended meanwhile (cancelled, timed out) is not posted again.
  auto ended = receive(2, 4, b1);
  ended->op->complete(Errc::cancelled, "cancelled");
  f.m.repost(Domain::data, ended);
  EXPECT_EQ(f.m.queue(Domain::data).posted().size(), 2u);
}

TEST(Matching, ACollectivesMessageNobodyAwaitsIsJudgedByTheRegistryOfCalls) {
  Fixture f;
  f.m.calls().watch(kComm, {0, 1, 2}, kMe);
  // Its collective has not started here: kept, to be compared when it does.
  EXPECT_TRUE(f.m.unawaited(kComm, 2, kColl, 0x8888));
  EXPECT_TRUE(f.owner.revoked.empty());
  // It starts here with another call: the ranks disagree, and every member hears why.
  const std::string why = f.m.calls().started(kComm, detail::collective_number(kColl), 0x8890);
  EXPECT_FALSE(why.empty());
  // A message of a collective that ended here: nobody will take it.
  Fixture g;
  g.m.calls().watch(kComm, {0, 1, 2}, kMe);
  EXPECT_TRUE(g.m.calls().started(kComm, 5, 0x8888).empty());
  EXPECT_TRUE(g.m.calls().ended(kComm, 5, true).empty());
  EXPECT_FALSE(g.m.unawaited(kComm, 0, kColl, 0x8888)) << "the message is to be dropped";
  ASSERT_EQ(g.owner.revoked.size(), 1u);
  EXPECT_EQ(g.owner.revoked[0].rfind(std::to_string(kComm) + ": ", 0), 0u) << g.owner.revoked[0];
}

}  // namespace
