// MatchQueue (transport/match_queue): MPI-style matching of (communicator, source, tag)
// between posted receives and unexpected messages. An arriving message takes the oldest
// matching posted receive, a new receive finds the oldest matching unexpected message (so
// delivery between a pair is non-overtaking); any_source and any_tag match within one
// communicator only, and any_tag never matches a collective's tags; matching ignores sizes
// (a too-small receive still matches, Node reports the truncation); cancellation removes a
// posted receive once; a re-posted receive goes ahead of all others; an unexpected message
// already matched while still arriving is skipped and reported by awaits_arrival. Also the
// collective tag layout and RecvOp::status. A seeded randomized run checks every match
// against a plain list-based reference model.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <iterator>
#include <list>
#include <memory>
#include <optional>
#include <random>
#include <vector>

#include <nexar/request.hpp>

#include "engine/op_state.hpp"
#include "transport/match_queue.hpp"

using nexar::any_source;
using nexar::any_tag;
using nexar::max_tag;
using nexar::detail::collective_message_tag;
using nexar::detail::collective_tag;
using nexar::detail::internal_tag_base;
using nexar::detail::MatchQueue;
using nexar::detail::OpState;
using nexar::detail::RecvOp;
using nexar::detail::Tag;
using nexar::detail::Unexpected;

namespace {

std::shared_ptr<RecvOp> recv(std::uint64_t comm, int source, Tag tag, std::size_t cap = 64) {
  auto r = std::make_shared<RecvOp>();
  r->op = std::make_shared<OpState>("recv", OpState::Clock::now() + std::chrono::hours(1));
  r->comm = comm;
  r->source = source;
  r->tag = tag;
  r->cap = cap;
  return r;
}

// An arrived message; `seq` identifies it in the tests.
Unexpected msg(std::uint64_t comm, int source, Tag tag, std::uint64_t seq, std::uint64_t size = 8) {
  Unexpected u;
  u.comm = comm;
  u.source = source;
  u.tag = tag;
  u.seq = seq;
  u.size = size;
  u.complete = true;
  return u;
}

// The seq of the unexpected message a receive finds (and delivers: erased), or nullopt.
std::optional<std::uint64_t> deliver(MatchQueue& q, const RecvOp& r) {
  auto it = q.find_unexpected(r);
  if (it == q.end()) return std::nullopt;
  const std::uint64_t seq = (*it)->seq;
  q.erase(it);
  return seq;
}

}  // namespace

TEST(MatchQueue, ArrivalTakesOldestMatchingPostedReceive) {
  MatchQueue q;
  auto any = recv(1, any_source, 5);
  auto specific = recv(1, 2, 5);
  auto other_tag = recv(1, 2, 6);
  q.post(any);
  q.post(other_tag);
  q.post(specific);
  // The any_source receive was posted first: it wins over the more specific one.
  EXPECT_EQ(q.take_posted(1, 2, 5), any);
  EXPECT_EQ(q.take_posted(1, 2, 5), specific);
  EXPECT_EQ(q.take_posted(1, 2, 5), nullptr);
  EXPECT_EQ(q.take_posted(1, 2, 6), other_tag);
  EXPECT_TRUE(q.posted().empty());
}

TEST(MatchQueue, ReceiveFindsOldestUnexpectedNonOvertaking) {
  MatchQueue q;
  q.add_unexpected(msg(1, 3, 7, 100));
  q.add_unexpected(msg(1, 2, 7, 101));
  q.add_unexpected(msg(1, 2, 8, 102));
  q.add_unexpected(msg(1, 2, 7, 103));
  q.add_unexpected(msg(1, 2, 7, 104));
  // Messages of one (source, tag) come out in arrival order.
  EXPECT_EQ(deliver(q, *recv(1, 2, 7)), 101u);
  EXPECT_EQ(deliver(q, *recv(1, 2, 7)), 103u);
  // any_source takes the oldest of any source; any_tag the oldest of the source.
  EXPECT_EQ(deliver(q, *recv(1, any_source, 7)), 100u);
  EXPECT_EQ(deliver(q, *recv(1, 2, any_tag)), 102u);
  EXPECT_EQ(deliver(q, *recv(1, any_source, any_tag)), 104u);
  EXPECT_EQ(deliver(q, *recv(1, any_source, any_tag)), std::nullopt);
}

TEST(MatchQueue, FindDoesNotRemove) {
  MatchQueue q;
  auto stored = q.add_unexpected(msg(1, 0, 1, 7));
  EXPECT_EQ(stored, q.unexpected().back());
  auto r = recv(1, 0, 1);
  auto it = q.find_unexpected(*r);
  ASSERT_NE(it, q.end());
  EXPECT_EQ(it->get(), stored.get());
  EXPECT_EQ(q.find_unexpected(*r), it);
  EXPECT_EQ(q.unexpected().size(), 1u);
}

TEST(MatchQueue, CommunicatorsAreSeparate) {
  MatchQueue q;
  q.add_unexpected(msg(2, 1, 4, 1));
  EXPECT_EQ(q.find_unexpected(*recv(1, 1, 4)), q.end());
  EXPECT_EQ(q.find_unexpected(*recv(1, any_source, any_tag)), q.end());
  EXPECT_EQ(deliver(q, *recv(2, any_source, any_tag)), 1u);

  auto r = recv(1, any_source, any_tag);
  q.post(r);
  EXPECT_EQ(q.take_posted(2, 1, 4), nullptr);
  EXPECT_EQ(q.take_posted(1, 1, 4), r);
}

TEST(MatchQueue, AnyTagNeverMatchesCollectiveTags) {
  const Tag coll = collective_message_tag(collective_tag(3), 1);
  MatchQueue q;
  q.add_unexpected(msg(1, 0, coll, 1));
  q.add_unexpected(msg(1, 0, Tag{max_tag} + 1, 2));  // past the application's range
  q.add_unexpected(msg(1, 0, max_tag, 3));
  EXPECT_EQ(deliver(q, *recv(1, 0, any_tag)), 3u);
  EXPECT_EQ(deliver(q, *recv(1, any_source, any_tag)), std::nullopt);
  EXPECT_EQ(deliver(q, *recv(1, 0, coll)), 1u);
  EXPECT_EQ(deliver(q, *recv(1, any_source, Tag{max_tag} + 1)), 2u);

  auto wild = recv(1, any_source, any_tag);
  auto exact = recv(1, 0, coll);
  q.post(wild);
  q.post(exact);
  EXPECT_EQ(q.take_posted(1, 0, coll), exact);  // skips the older any_tag receive
  EXPECT_EQ(q.take_posted(1, 0, collective_tag(0)), nullptr);
  EXPECT_EQ(q.take_posted(1, 0, 0), wild);

  EXPECT_TRUE(recv(1, 0, any_tag)->matches(1, 0, 0));
  EXPECT_TRUE(recv(1, 0, any_tag)->matches(1, 0, max_tag));
  EXPECT_FALSE(recv(1, 0, any_tag)->matches(1, 0, internal_tag_base));
  EXPECT_FALSE(recv(1, 0, 5)->matches(1, 0, 6));
  EXPECT_FALSE(recv(1, 0, 5)->matches(1, 1, 5));
}

TEST(MatchQueue, MatchingIgnoresSizes) {
  // A message larger than the receive still matches it (and is not skipped for a later,
  // larger receive): Matching::finish_recv fails it with Errc::truncated, as MPI does.
  MatchQueue q;
  q.add_unexpected(msg(1, 0, 1, 1, 1u << 20));
  auto small = recv(1, 0, 1, 4);
  auto big = recv(1, 0, 1, 2u << 20);
  EXPECT_EQ(deliver(q, *small), 1u);
  q.post(small);
  q.post(big);
  EXPECT_EQ(q.take_posted(1, 0, 1), small);
  // Rendezvous announcements match exactly like eager messages, in the same order.
  Unexpected rts = msg(1, 0, 1, 2, 100u << 20);
  rts.rendezvous = true;
  rts.complete = false;
  q.add_unexpected(rts);
  q.add_unexpected(msg(1, 0, 1, 3));
  EXPECT_EQ(deliver(q, *recv(1, 0, 1, 0)), 2u);
  EXPECT_EQ(deliver(q, *recv(1, 0, 1, 0)), 3u);
}

TEST(MatchQueue, RemovePostedOnceAndKeepsOrder) {
  MatchQueue q;
  auto a = recv(1, 0, 1), b = recv(1, 0, 1), c = recv(1, 0, 1);
  q.post(a);
  q.post(b);
  q.post(c);
  EXPECT_TRUE(q.remove_posted(b->op.get()));
  EXPECT_FALSE(q.remove_posted(b->op.get()));
  EXPECT_FALSE(q.remove_posted(recv(1, 0, 1)->op.get()));  // never posted
  EXPECT_EQ(q.take_posted(1, 0, 1), a);
  EXPECT_FALSE(q.remove_posted(a->op.get()));  // matched already
  EXPECT_EQ(q.take_posted(1, 0, 1), c);
  EXPECT_EQ(q.take_posted(1, 0, 1), nullptr);
}

TEST(MatchQueue, PostFirstGoesAheadOfEveryReceive) {
  MatchQueue q;
  auto a = recv(1, any_source, 1), b = recv(1, 0, 1), again = recv(1, 0, any_tag);
  q.post(a);
  q.post(b);
  q.post_first(again);
  EXPECT_EQ(q.take_posted(1, 0, 1), again);
  EXPECT_EQ(q.take_posted(1, 0, 1), a);
  EXPECT_EQ(q.take_posted(1, 0, 1), b);
}

TEST(MatchQueue, MessageStillArrivingIsMatchedOnce) {
  MatchQueue q;
  Unexpected partial = msg(1, 0, 1, 1, 1000);
  partial.complete = false;
  auto first = q.add_unexpected(std::move(partial));
  q.add_unexpected(msg(1, 0, 1, 2));
  auto r1 = recv(1, 0, 1);
  auto it = q.find_unexpected(*r1);
  ASSERT_NE(it, q.end());
  EXPECT_EQ((*it)->seq, 1u);
  // Matching::deliver_unexpected: the rest goes to r1's buffer; the entry stays until complete.
  (*it)->waiter = r1;
  EXPECT_TRUE(q.awaits_arrival(r1->op.get()));
  auto r2 = recv(1, 0, 1);
  EXPECT_FALSE(q.awaits_arrival(r2->op.get()));
  EXPECT_EQ(deliver(q, *r2), 2u);  // the claimed one is skipped
  EXPECT_EQ(q.find_unexpected(*recv(1, any_source, any_tag)), q.end());
  q.erase(first.get());  // arrived in full
  EXPECT_FALSE(q.awaits_arrival(r1->op.get()));
  EXPECT_TRUE(q.unexpected().empty());
}

TEST(MatchQueue, EraseByIdentityRemovesOnlyThatEntry) {
  MatchQueue q;
  auto a = q.add_unexpected(msg(1, 0, 1, 1));
  auto b = q.add_unexpected(msg(1, 0, 1, 2));
  auto c = q.add_unexpected(msg(1, 0, 1, 3));
  q.erase(b.get());
  Unexpected stranger = msg(1, 0, 1, 4);
  q.erase(&stranger);  // not in the queue: nothing happens
  ASSERT_EQ(q.unexpected().size(), 2u);
  EXPECT_EQ(q.unexpected().front(), a);
  EXPECT_EQ(q.unexpected().back(), c);
}

TEST(MatchQueue, CollectiveTagLayout) {
  EXPECT_EQ(collective_tag(0), internal_tag_base);
  EXPECT_GT(collective_tag(1), max_tag);
  EXPECT_NE(collective_tag(1), collective_tag(2));
  EXPECT_EQ(collective_tag(std::uint64_t{1} << 30), collective_tag(0));  // mod 2^30
  EXPECT_GT(collective_tag((std::uint64_t{1} << 30) - 1), 0);          // bits 32..61 only
  EXPECT_EQ(collective_message_tag(collective_tag(5), std::uint64_t{1} << 32), collective_tag(5));
  // The message numbers of one collective never reach the next collective's tag.
  EXPECT_LT(collective_message_tag(collective_tag(5), 0xffffffffu), collective_tag(6));
  EXPECT_NE(collective_message_tag(collective_tag(5), 1), collective_message_tag(collective_tag(6), 1));
}

TEST(MatchQueue, StatusNamesTheCommunicatorRank) {
  auto r = recv(1, any_source, any_tag);
  auto s = r->status(4, 9, 12);
  EXPECT_EQ(s.source, 4);
  EXPECT_EQ(s.tag, 9);
  EXPECT_EQ(s.bytes, 12u);
  r->local_of = std::make_shared<const std::vector<int>>(std::vector<int>{-1, 0, -1, 1});
  EXPECT_EQ(r->status(3, 9, 0).source, 1);
  EXPECT_EQ(r->status(7, 9, 0).source, -1);  // a rank the communicator does not know
  EXPECT_EQ(r->status(1, collective_tag(2), 0).tag, -1);
}

// The reference: plain lists in post/arrival order, matched by a rule written out again.
namespace {

struct RefRecv {
  std::shared_ptr<RecvOp> r;
};
struct RefMsg {
  std::uint64_t comm;
  int source;
  Tag tag;
  std::uint64_t seq;
  bool claimed;  // matched while still arriving
};

bool ref_match(std::uint64_t rc, int rs, Tag rt, std::uint64_t c, int s, Tag t) {
  if (rc != c) return false;
  if (rs != any_source && rs != s) return false;
  if (rt == any_tag) return t >= 0 && t <= max_tag;
  return rt == t;
}

}  // namespace

TEST(MatchQueue, RandomizedAgainstReference) {
  std::mt19937_64 rng(20240601);
  auto pick = [&rng](int n) { return static_cast<int>(rng() % static_cast<std::uint64_t>(n)); };
  const Tag tags[] = {0, 1, 2, max_tag, collective_message_tag(collective_tag(1), 0),
                      collective_message_tag(collective_tag(1), 1)};
  constexpr int n_tags = static_cast<int>(std::size(tags));
  constexpr int n_sources = 3;

  std::uint64_t matches = 0, checks = 0;
  for (int round = 0; round < 20; ++round) {
    MatchQueue q;
    std::list<RefRecv> posted;
    std::list<RefMsg> unexpected;
    std::uint64_t next_seq = 1;
    for (int step = 0; step < 2000; ++step) {
      const int what = pick(100);
      const std::uint64_t comm = 1 + static_cast<std::uint64_t>(pick(2));
      if (what < 40) {
        // A message arrives.
        const int src = pick(n_sources);
        const Tag tag = tags[pick(n_tags)];
        auto got = q.take_posted(comm, src, tag);
        auto want = std::find_if(posted.begin(), posted.end(), [&](const RefRecv& p) {
          return ref_match(p.r->comm, p.r->source, p.r->tag, comm, src, tag);
        });
        ++checks;
        if (want == posted.end()) {
          ASSERT_EQ(got, nullptr) << "round " << round << " step " << step;
          Unexpected u = msg(comm, src, tag, next_seq);
          const bool still_arriving = pick(4) == 0;
          u.complete = !still_arriving;
          u.rendezvous = pick(5) == 0;
          q.add_unexpected(std::move(u));
          unexpected.push_back(RefMsg{comm, src, tag, next_seq, false});
          ++next_seq;
        } else {
          ASSERT_EQ(got, want->r) << "round " << round << " step " << step;
          posted.erase(want);
          ++matches;
        }
      } else if (what < 80) {
        // A receive is posted (sometimes re-posted ahead of all others).
        const int src = pick(4) == 0 ? any_source : pick(n_sources);
        const int t = pick(n_tags + 2);
        const Tag tag = t >= n_tags ? Tag{any_tag} : tags[t];
        auto r = recv(comm, src, tag);
        auto got = q.find_unexpected(*r);
        auto want = std::find_if(unexpected.begin(), unexpected.end(), [&](const RefMsg& m) {
          return !m.claimed && ref_match(comm, src, tag, m.comm, m.source, m.tag);
        });
        ++checks;
        if (want == unexpected.end()) {
          ASSERT_EQ(got, q.end()) << "round " << round << " step " << step;
          if (pick(10) == 0) {
            q.post_first(r);
            posted.push_front(RefRecv{r});
          } else {
            q.post(r);
            posted.push_back(RefRecv{r});
          }
        } else {
          ASSERT_NE(got, q.end()) << "round " << round << " step " << step;
          ASSERT_EQ((*got)->seq, want->seq) << "round " << round << " step " << step;
          ++matches;
          if (!(*got)->complete && !(*got)->rendezvous) {
            (*got)->waiter = r;  // the rest of it lands in r's buffer
            want->claimed = true;
          } else {
            q.erase(got);
            unexpected.erase(want);
          }
        }
      } else if (what < 88) {
        // A posted receive is cancelled (or one already matched: nothing to remove).
        if (posted.empty()) continue;
        auto it = std::next(posted.begin(), pick(static_cast<int>(posted.size())));
        auto op = it->r->op;
        ASSERT_TRUE(q.remove_posted(op.get()));
        posted.erase(it);
        ASSERT_FALSE(q.remove_posted(op.get()));
      } else if (what < 96) {
        // A message still arriving completes.
        std::vector<std::list<RefMsg>::iterator> partial;
        for (auto it = unexpected.begin(); it != unexpected.end(); ++it) partial.push_back(it);
        if (partial.empty()) continue;
        auto it = partial[static_cast<std::size_t>(pick(static_cast<int>(partial.size())))];
        auto stored = std::find_if(q.unexpected().begin(), q.unexpected().end(),
                                   [&](const std::shared_ptr<Unexpected>& u) { return u->seq == it->seq; });
        ASSERT_NE(stored, q.unexpected().end());
        if ((*stored)->waiter) {
          auto op = (*stored)->waiter->op;
          ASSERT_TRUE(q.awaits_arrival(op.get()));
          q.erase(stored->get());  // delivered to its waiter
          unexpected.erase(it);
          ASSERT_FALSE(q.awaits_arrival(op.get()));
        } else {
          (*stored)->complete = true;
        }
      } else {
        // The whole state, in order.
        ASSERT_EQ(q.posted().size(), posted.size());
        ASSERT_TRUE(std::equal(posted.begin(), posted.end(), q.posted().begin(),
                               [](const RefRecv& a, const std::shared_ptr<RecvOp>& b) { return a.r == b; }));
        ASSERT_EQ(q.unexpected().size(), unexpected.size());
        ASSERT_TRUE(std::equal(unexpected.begin(), unexpected.end(), q.unexpected().begin(),
                               [](const RefMsg& a, const std::shared_ptr<Unexpected>& b) {
                                 return a.seq == b->seq && a.claimed == (b->waiter != nullptr);
                               }));
      }
    }
  }
  // The run exercised both paths many times.
  EXPECT_GT(matches, 10000u);
  EXPECT_GT(checks, 20000u);
}
