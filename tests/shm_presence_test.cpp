// transport/shm_presence.*: whether a node polls its shared-memory rings, as its same-host
// peers see it. Two links over one real segment stand for two nodes; each node's doorbell
// is a real eventfd whose count shows every ring. Checked: a writer rings a peer that may
// sleep and leaves a polling one alone; a node that stops polling finds the bytes that came
// meanwhile (only on lanes it reads) and the room its waiting writer was not rung for; a
// link joins in its node's state and leaves on failure.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "shm/doorbell.hpp"
#include "shm/segment.hpp"
#include "transport/shm_link.hpp"
#include "transport/shm_presence.hpp"
#include "wire/frame.hpp"

using namespace nexar;
using detail::ShmLink;
using detail::ShmPresence;

namespace {

// Rings since the last call (the eventfd's count, which reading resets).
std::uint64_t rings(const shm::Doorbell& bell) {
  std::uint64_t n = 0;
  return ::read(bell.fd(), &n, sizeof n) == sizeof n ? n : 0;
}

// Two nodes on one segment: A created it, B opened it.
struct Pair {
  std::vector<std::uint8_t> payload = std::vector<std::uint8_t>(256 * 1024, 9);
  std::shared_ptr<shm::Segment> seg = shm::Segment::create(64 * 1024, std::uint64_t{1} << 30);
  shm::Doorbell a_bell, b_bell;
  ShmPresence a_presence, b_presence;
  std::unique_ptr<ShmLink> a, b;
  Pair() {
    a = std::make_unique<ShmLink>(seg, true, ::dup(b_bell.fd()), a_bell.fd(), &a_presence);
    b = std::make_unique<ShmLink>(seg, false, ::dup(a_bell.fd()), b_bell.fd(), &b_presence);
    for (int i = 0; i < shm::Segment::lanes; ++i) {
      a->start_sending(i);
      b->start_sending(i);
    }
  }
  // A sends `n` bytes on lane `i` and flushes.
  void a_sends(int i, std::size_t n) {
    a->push(i, quic::Chunk{payload.data(), n, {}});
  }
  // B reads and releases everything in lane `i`, as its poll would, and wakes A's writer.
  std::size_t b_reads(int i) {
    std::size_t total = 0;
    for (;;) {
      bool broken = false;
      auto bytes = b->in(i).readable(broken);
      EXPECT_FALSE(broken);
      if (bytes.empty()) break;
      b->in(i).release(bytes.size());
      total += bytes.size();
    }
    b->wake_writer(i);
    return total;
  }
};

// Whether `p`'s node, polled once more and stopping again, finds work.
bool finds_work(ShmPresence& p) {
  p.watched();
  return p.unwatched();
}

const int coll = ShmLink::index(wire::Lane::collective);
const int data = ShmLink::index(wire::Lane::data);

}  // namespace

TEST(ShmPresence, AWriterRingsOnlyAPeerThatMaySleep) {
  Pair p;
  // Nobody polls B yet: its word is set, so each write rings it.
  p.a_sends(coll, 8);
  EXPECT_EQ(rings(p.b_bell), 1u);
  // A thread of B polls: writes go unannounced.
  p.b_presence.watched();
  p.a_sends(coll, 8);
  p.a_sends(data, 8);
  EXPECT_EQ(rings(p.b_bell), 0u);
  EXPECT_EQ(rings(p.a_bell), 0u);
  p.b_reads(coll);
  p.b_reads(data);
  EXPECT_FALSE(p.b_presence.unwatched()) << "it read everything before it stopped";
  p.a_sends(coll, 8);
  EXPECT_EQ(rings(p.b_bell), 1u) << "stopped polling: ring again";
}

TEST(ShmPresence, StoppingFindsBytesThatCameOnALaneItReads) {
  Pair p;
  p.b_presence.watched();
  p.a_sends(coll, 100);
  EXPECT_EQ(rings(p.b_bell), 0u);
  // B has not read the collective lane's switch yet: its bytes are not B's work.
  EXPECT_FALSE(p.b_presence.unwatched());
  p.b_presence.watched();
  p.b->start_reading(coll);
  EXPECT_TRUE(p.b_presence.unwatched()) << "100 unread bytes on a lane it reads";
  EXPECT_TRUE(finds_work(p.b_presence));
  p.b_presence.ring();
  EXPECT_EQ(rings(p.b_bell), 1u) << "ring() wakes B's own engine";
  EXPECT_EQ(p.b_reads(coll), 100u);
  EXPECT_FALSE(finds_work(p.b_presence));
}

TEST(ShmPresence, AWaitingWriterIsRungOrFindsTheRoomItself) {
  Pair p;
  p.b_presence.watched();
  // Fill A's ring on the data lane: the rest waits, with A's mark set.
  p.a_sends(data, p.payload.size());
  EXPECT_TRUE(p.a->unacked() > 64 * 1024) << "some of it waits for room";
  // A polls, so B frees room without ringing it...
  p.a_presence.watched();
  p.b_reads(data);
  EXPECT_EQ(rings(p.a_bell), 0u);
  // ...and A, stopping without having written again, finds the room itself.
  EXPECT_TRUE(p.a_presence.unwatched());
  bool moved = false, more = false;
  ASSERT_TRUE(p.a->flush(moved, more));
  EXPECT_TRUE(moved);
  // Full again, A asleep now: B's read rings it.
  EXPECT_FALSE(finds_work(p.a_presence)) << "full again: nothing to write yet";
  p.b_reads(data);
  EXPECT_EQ(rings(p.a_bell), 1u);
  // Once everything is written, the mark goes and nothing is pending.
  while (p.a->unacked() > 0) {
    ASSERT_TRUE(p.a->flush(moved, more));
    p.b_reads(data);
  }
  EXPECT_FALSE(p.a->in(data).writer_waiting());
  EXPECT_FALSE(p.b->in(data).writer_waiting()) << "A took back its mark";
  EXPECT_FALSE(finds_work(p.a_presence));
}

TEST(ShmPresence, ALinkJoinsInItsNodesStateAndLeavesWhenItsPeerIsGone) {
  std::shared_ptr<shm::Segment> seg = shm::Segment::create(64 * 1024, std::uint64_t{1} << 30);
  shm::Doorbell a_bell, b_bell;
  ShmPresence b_presence;
  b_presence.watched();
  ShmLink a(seg, true, ::dup(b_bell.fd()), a_bell.fd());
  ShmLink b(seg, false, ::dup(a_bell.fd()), b_bell.fd(), &b_presence);
  a.start_sending(coll);
  b.start_reading(coll);
  std::vector<std::uint8_t> msg(32, 1);
  a.push(coll, quic::Chunk{msg.data(), msg.size(), {}});
  EXPECT_EQ(rings(b_bell), 0u) << "B joined a polled node: its word was cleared";
  b.fail(Errc::peer_failed, "gone");
  EXPECT_FALSE(b_presence.unwatched()) << "the link left: its bytes are nobody's work";
  a.push(coll, quic::Chunk{msg.data(), msg.size(), {}});
  EXPECT_EQ(rings(b_bell), 1u) << "a link that left keeps its word set";
}

// A lane that stops at its quantum with bytes left is taken up again by a thread that polls
// the node, so only an unpolled node rings its own doorbell for it; a poller that stops
// first finds the mark.
TEST(ShmPresence, ALaneLeftAtItsQuantumRingsOnlyAnUnpolledNode) {
  Pair p;
  const int bulk = ShmLink::index(wire::Lane::bulk);
  p.a_presence.watched();
  p.a_sends(bulk, 200 * 1024);  // more than one turn
  EXPECT_EQ(rings(p.a_bell), 0u) << "A is polled: the poller goes on with the turns";
  EXPECT_TRUE(p.a_presence.unwatched()) << "stopping, A finds the turn it left";
  p.a->left_over(true);
  EXPECT_EQ(rings(p.a_bell), 1u) << "nobody polls A: its engine is rung";
  p.a->left_over(false);
  EXPECT_FALSE(finds_work(p.a_presence)) << "the last pass finished its turns";
}
