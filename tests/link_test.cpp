// transport/link.hpp: every carrier keeps the Link contract the Peer relies on. Each test
// drives a link through the interface alone, with no network: chunks complete once and in
// order, with the code that ended them; unacked() counts what the peer does not hold yet;
// consumed() hands credit back the carrier's way; the links say which lanes they carry and
// how their incoming streams are numbered.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shm/doorbell.hpp"
#include "shm/segment.hpp"
#include "transport/link.hpp"
#include "transport/quic_link.hpp"
#include "transport/relay_link.hpp"
#include "transport/shm_link.hpp"

using namespace nexar;
using detail::Link;
using wire::Lane;

namespace {

// What each chunk's completion reported, in the order they ran.
struct Fates {
  std::vector<std::pair<int, Errc>> seen;
  quic::Chunk chunk(int id, const std::vector<std::uint8_t>& bytes, std::size_t len) {
    return quic::Chunk{bytes.data(), len, [this, id](Errc code, const std::string&) { seen.emplace_back(id, code); }};
  }
};

constexpr std::size_t kRing = 64 * 1024;  // the smallest ring a segment takes
const std::vector<std::uint8_t> kBytes(kRing, 7);

TEST(QuicLink, ChunksWaitForTheConnectionAndFailOnceInOrder) {
  detail::QuicLink q;
  Link& link = q;
  Fates f;
  EXPECT_FALSE(q.ready());
  link.push(Lane::data, f.chunk(1, kBytes, 100));
  link.push(Lane::control, f.chunk(2, kBytes, 40));
  link.push(Lane::bulk, f.chunk(3, kBytes, 0));
  EXPECT_EQ(link.unacked(), 140u) << "chunks waiting for the connection were promised all the same";
  EXPECT_TRUE(f.seen.empty());
  link.fail(Errc::peer_failed, "gone");
  ASSERT_EQ(f.seen.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(f.seen[static_cast<std::size_t>(i)].first, i + 1);
    EXPECT_EQ(f.seen[static_cast<std::size_t>(i)].second, Errc::peer_failed);
  }
  EXPECT_EQ(link.unacked(), 0u);
  link.fail(Errc::peer_failed, "again");
  EXPECT_EQ(f.seen.size(), 3u) << "a chunk completes once";
}

TEST(QuicLink, LanesComeInPriorityClassesAndStreamsNameTheirLane) {
  using detail::QuicLink;
  EXPECT_LT(QuicLink::priority(Lane::control), QuicLink::priority(Lane::rpc_request));
  EXPECT_EQ(QuicLink::priority(Lane::rpc_request), QuicLink::priority(Lane::rpc_response));
  EXPECT_LT(QuicLink::priority(Lane::rpc_request), QuicLink::priority(Lane::data));
  EXPECT_EQ(QuicLink::priority(Lane::data), QuicLink::priority(Lane::collective));
  EXPECT_LT(QuicLink::priority(Lane::collective), QuicLink::priority(Lane::bulk));
  QuicLink q;
  EXPECT_FALSE(q.stream_lane(2).has_value()) << "a QUIC stream's preamble names its lane";
  for (int l = 0; l < wire::lane_count; ++l) EXPECT_TRUE(q.carries(static_cast<Lane>(l)));
  EXPECT_TRUE(q.on_socket());
  EXPECT_EQ(q.describe(6), "stream 6");
}

struct Relay {
  std::vector<Lane> pumped, acks;
  detail::RelayLink link{1000, [this](Lane l) { pumped.push_back(l); }, [this](Lane l) { acks.push_back(l); }};
};

TEST(RelayLink, PushPumpsItsLaneAndAcknowledgementsCompleteInOrder) {
  Relay r;
  Link& link = r.link;
  Fates f;
  link.push(Lane::data, f.chunk(1, kBytes, 10));
  link.push(Lane::data, f.chunk(2, kBytes, 20));
  EXPECT_EQ(r.pumped, (std::vector<Lane>{Lane::data, Lane::data}));
  EXPECT_EQ(link.unacked(), 30u);
  std::vector<detail::RelayLink::Piece> pieces;
  std::uint64_t offset = 99;
  ASSERT_TRUE(r.link.next_segment(Lane::data, 1024, offset, pieces, 0));
  EXPECT_EQ(offset, 0u);
  std::size_t len = 0;
  for (const auto& p : pieces) len += p.len;
  EXPECT_EQ(len, 30u);
  ASSERT_TRUE(r.link.on_ack(Lane::data, 10, 1010, 1));
  EXPECT_EQ(f.seen, (std::vector<std::pair<int, Errc>>{{1, Errc::ok}}));
  EXPECT_EQ(link.unacked(), 20u);
  EXPECT_FALSE(r.link.on_ack(Lane::data, 31, 1031, 2)) << "an acknowledgement of bytes never sent";
  ASSERT_TRUE(r.link.on_ack(Lane::data, 30, 1030, 3));
  EXPECT_EQ(f.seen.size(), 2u);
  EXPECT_EQ(link.unacked(), 0u);
}

TEST(RelayLink, ConsumedBytesOweAnAcknowledgementWithTheirCredit) {
  Relay r;
  Link& link = r.link;
  std::uint64_t delivered = 0;
  const bool ok = r.link.on_segment(Lane::collective, 0, kBytes.data(), 300, [&](const std::uint8_t*, std::size_t n) {
    delivered += n;
    return std::optional<std::uint64_t>(0);  // nothing consumed yet
  });
  ASSERT_TRUE(ok);
  EXPECT_EQ(delivered, 300u);
  EXPECT_EQ(r.acks, (std::vector<Lane>{Lane::collective})) << "what arrived is acknowledged";
  std::uint64_t received = 0, limit = 0;
  ASSERT_TRUE(r.link.take_ack(Lane::collective, received, limit));
  EXPECT_EQ(received, 300u);
  EXPECT_EQ(limit, 1000u) << "no credit beyond the window until the bytes are consumed";
  link.consumed(static_cast<std::uint64_t>(Lane::collective), 300);
  EXPECT_EQ(r.acks, (std::vector<Lane>{Lane::collective, Lane::collective}));
  ASSERT_TRUE(r.link.take_ack(Lane::collective, received, limit));
  EXPECT_EQ(limit, 1300u);
  EXPECT_FALSE(r.link.on_segment(Lane::collective, 300, kBytes.data(), 1001,
                                 [](const std::uint8_t*, std::size_t) { return std::optional<std::uint64_t>(0); }))
      << "a segment beyond the credit granted";
  EXPECT_EQ(link.stream_lane(static_cast<std::uint64_t>(Lane::bulk)), Lane::bulk);
  EXPECT_EQ(link.describe(static_cast<std::uint64_t>(Lane::bulk)), "relayed lane bulk");
  EXPECT_FALSE(link.on_socket());
}

TEST(RelayLink, FailCompletesEveryQueuedChunkWithItsCode) {
  Relay r;
  Fates f;
  r.link.push(Lane::control, f.chunk(1, kBytes, 5));
  r.link.push(Lane::bulk, f.chunk(2, kBytes, 5));
  static_cast<Link&>(r.link).fail(Errc::rank_failed, "declared failed");
  ASSERT_EQ(f.seen.size(), 2u);
  for (const auto& [id, code] : f.seen) EXPECT_EQ(code, Errc::rank_failed) << "chunk " << id;
  EXPECT_EQ(r.link.unacked(), 0u);
}

TEST(ShmLink, ThroughTheLinkInterface) {
  std::shared_ptr<shm::Segment> seg = shm::Segment::create(kRing, kRing);  // credit binds, as room does
  shm::Doorbell a_bell, b_bell;
  detail::ShmLink a(seg, true, ::dup(b_bell.fd()), a_bell.fd());
  detail::ShmLink b(seg, false, ::dup(a_bell.fd()), b_bell.fd());
  const int coll = detail::ShmLink::index(Lane::collective);
  a.start_sending(coll);
  EXPECT_TRUE(a.sending(Lane::collective));
  EXPECT_FALSE(a.sending(Lane::data));
  EXPECT_FALSE(a.sending(Lane::control)) << "control has no ring";
  Link& link = a;
  Fates f;
  link.push(Lane::collective, f.chunk(1, kBytes, kRing));
  link.push(Lane::collective, f.chunk(2, kBytes, 100));
  EXPECT_EQ(f.seen, (std::vector<std::pair<int, Errc>>{{1, Errc::ok}})) << "a chunk completes once all of it is in the ring";
  EXPECT_EQ(link.unacked(), kRing + 100);
  // B reads the ring whole, then hands the credit back through the interface.
  bool broken = false;
  auto bytes = b.in(coll).readable(broken);
  ASSERT_FALSE(broken);
  EXPECT_EQ(bytes.size(), kRing);
  b.in(coll).release(bytes.size());
  static_cast<Link&>(b).consumed(static_cast<std::uint64_t>(coll), bytes.size());
  bool moved = false, more = false;
  ASSERT_TRUE(a.flush(moved, more));
  EXPECT_EQ(f.seen.size(), 2u) << "the credit B returned let the second chunk in";
  EXPECT_EQ(link.stream_lane(static_cast<std::uint64_t>(coll)), Lane::collective);
  EXPECT_FALSE(link.carries(Lane::control));
  EXPECT_TRUE(link.carries(Lane::bulk));
  EXPECT_FALSE(link.on_socket());
  // What waits for room when the peer goes fails with the peer's code.
  link.push(Lane::collective, f.chunk(3, kBytes, kRing));
  link.push(Lane::collective, f.chunk(4, kBytes, kRing));
  link.fail(Errc::peer_closed, "goodbye");
  ASSERT_EQ(f.seen.size(), 4u);
  EXPECT_EQ(f.seen[3], (std::pair<int, Errc>{4, Errc::peer_closed}));
}

}  // namespace
