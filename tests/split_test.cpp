// Point-to-point on communicators made by split(), over real QUIC between the ranks of
// bootstrap_local worlds of 4 and 5 ranks (one thread each): send/recv, isend/irecv,
// wildcard receives, the bulk lane (bulk_send/bulk_recv), separation of the traffic of a
// parent, its children and siblings with the same tags, rank validation in the range of the
// sub-communicator, collectives on parent and child interleaved with p2p, and neighbours()
// in the sub-communicator's numbering (full_mesh, and k_regular:4 in a world of 8).
//
// The layout every split must produce (who is in it, in which order) is computed here from
// the colors and keys: members of one color ordered by (key, rank in the parent). Keys are
// mostly reversed, so that sub-communicator ranks differ from world ranks and an
// implementation that mixed them up would send to, or report, the wrong rank.
#include <nexar/nexar.hpp>

#include <gtest/gtest.h>

#include "collective_support.hpp"
#include "support.hpp"

#include <numeric>
#include <set>

namespace {

using namespace nexar::coll_test;
using nexar::any_source;
using nexar::any_tag;
using nexar::Communicator;
using nexar::ConstBuffer;
using nexar::DataType;
using nexar::Errc;
using nexar::ReduceOp;
using nexar::Request;
using nexar::Status;
using nexar::testing::contains;
using nexar::testing::expect_error;

using RankFn = std::function<int(int)>;  // world rank -> color or key

// One split of every world rank's communicator in `parent` (indexed by world rank; empty
// entries stay out): the resulting communicators, and for each world rank the world ranks
// of its new communicator in sub-rank order (empty if it got none).
struct Split {
  std::vector<Communicator> comm;
  std::vector<std::vector<int>> members;

  int rank_of(int w) const {
    const auto& m = members[static_cast<std::size_t>(w)];
    return static_cast<int>(std::find(m.begin(), m.end(), w) - m.begin());
  }
  bool in(int w) const { return !members[static_cast<std::size_t>(w)].empty(); }
};

// Splits parent[w] with color(w), key(w) on one thread per world rank, and checks that
// every rank got the communicator the definition gives: open, size, rank, an id of its own.
Split split(std::vector<Communicator>& world, std::vector<Communicator>& parent,
            const RankFn& color, const RankFn& key, const std::string& ctx) {
  const int n = static_cast<int>(world.size());
  const auto un = static_cast<std::size_t>(n);
  Split s;
  s.comm.resize(un);
  s.members.resize(un);
  for (int w = 0; w < n; ++w) {
    const Communicator& p = parent[static_cast<std::size_t>(w)];
    if (!p.is_open() || color(w) < 0) continue;
    std::vector<int> m;
    for (int v = 0; v < n; ++v) {
      const Communicator& q = parent[static_cast<std::size_t>(v)];
      if (q.is_open() && q.id() == p.id() && color(v) == color(w)) m.push_back(v);
    }
    std::sort(m.begin(), m.end(), [&](int a, int b) {
      const int ka = key(a), kb = key(b);
      return ka != kb ? ka < kb : parent[static_cast<std::size_t>(a)].rank() < parent[static_cast<std::size_t>(b)].rank();
    });
    s.members[static_cast<std::size_t>(w)] = std::move(m);
  }
  const bool ok = run_ranks(world, ctx + ": split", [&](int w) {
    const auto uw = static_cast<std::size_t>(w);
    if (parent[uw].is_open()) s.comm[uw] = parent[uw].split(color(w), key(w));
  });
  if (!ok) return s;
  for (int w = 0; w < n; ++w) {
    const auto uw = static_cast<std::size_t>(w);
    const Communicator& c = s.comm[uw];
    if (!s.in(w)) {
      EXPECT_FALSE(c.is_open()) << ctx << ": world rank " << w << " (color " << color(w)
                                << ") should have got an empty communicator";
      continue;
    }
    if (!c.is_open()) {
      ADD_FAILURE() << ctx << ": world rank " << w << " got no communicator";
      continue;
    }
    EXPECT_EQ(c.size(), static_cast<int>(s.members[uw].size())) << ctx << ": world rank " << w;
    EXPECT_EQ(c.rank(), s.rank_of(w)) << ctx << ": world rank " << w;
    EXPECT_NE(c.id(), parent[uw].id()) << ctx << ": world rank " << w;
    const int first = s.members[uw].front();
    EXPECT_EQ(c.id(), s.comm[static_cast<std::size_t>(first)].id())
        << ctx << ": members of one communicator disagree on id()";
  }
  return s;
}

// The splits the tests run on, for a world of n: every rank reversed; parity with one rank
// left out (negative color) and reversed keys; and a nested split of the reversed one into
// halves (reversed again).
struct Splits {
  Split reversed, parity, nested;
};

Splits make_splits(std::vector<Communicator>& world, const std::string& ctx) {
  const int n = static_cast<int>(world.size());
  Splits s;
  s.reversed = split(world, world, [](int) { return 0; }, [](int w) { return -w; }, ctx + " reversed");
  s.parity = split(
      world, world, [](int w) { return w == 2 ? -1 : w % 2; }, [](int w) { return -w; },
      ctx + " parity without world rank 2");
  const Split& rv = s.reversed;
  s.nested = split(
      world, s.reversed.comm, [&](int w) { return rv.rank_of(w) < (n + 1) / 2 ? 7 : 3; },
      [&](int w) { return -rv.rank_of(w); }, ctx + " nested halves of reversed");
  return s;
}

constexpr int worlds[] = {4, 5};

// What a p2p message carries: who sent it (world and sub rank), on which communicator, when.
struct Msg {
  int world_src = -1;
  int sub_src = -1;
  std::uint64_t comm = 0;
  int seq = -1;
};

// Checks a received Msg and its Status against the expected sender.
void check_msg(const std::string& ctx, int w, const Split& s, const Msg& m, const Status& st,
               int want_sub_src, int want_tag, int seq) {
  const auto& mem = s.members[static_cast<std::size_t>(w)];
  const int sub = s.rank_of(w);
  const Communicator& c = s.comm[static_cast<std::size_t>(w)];
  const std::string where = ctx + ": world rank " + std::to_string(w) + " (sub-rank " +
                            std::to_string(sub) + ")";
  if (want_sub_src < 0 || want_sub_src >= c.size()) {
    ADD_FAILURE() << where << ": sender's sub-rank " << want_sub_src << " (Status::source " << st.source
                  << ") out of range";
    return;
  }
  EXPECT_EQ(st.source, want_sub_src) << where << ": Status::source is not the sub-rank of the sender";
  EXPECT_EQ(st.tag, want_tag) << where;
  EXPECT_EQ(st.bytes, sizeof(Msg)) << where;
  EXPECT_EQ(m.sub_src, want_sub_src) << where << ": got the message of another sender";
  EXPECT_EQ(m.world_src, mem[static_cast<std::size_t>(want_sub_src)])
      << where << ": the message came from another process than sub-rank " << want_sub_src;
  EXPECT_EQ(m.comm, c.id()) << where << ": the message was sent on another communicator";
  EXPECT_EQ(m.seq, seq) << where;
}

Msg msg_of(const Split& s, int w, int seq) {
  return Msg{w, s.rank_of(w), s.comm[static_cast<std::size_t>(w)].id(), seq};
}

const char* which(const Splits& all, const Split* s) {
  return s == &all.reversed ? " reversed" : s == &all.parity ? " parity" : " nested";
}

// Runs `body(split, context, world rank, communicator)` on every member of each test split,
// in worlds of 4 and 5 ranks (ranks as threads); `suffix` ends the context of its messages.
template <class Body>
void on_every_split(const char* suffix, Body body) {
  for (int n : worlds) {
    auto& world = pooled_world(n);
    const std::string wctx = "world=" + std::to_string(n);
    Splits all = make_splits(world, wctx);
    if (::testing::Test::HasFailure()) return;
    for (const Split* sp : {&all.reversed, &all.parity, &all.nested}) {
      const Split& s = *sp;
      const std::string ctx = wctx + which(all, sp) + suffix;
      run_ranks(world, ctx, [&](int w) {
        if (s.in(w)) body(s, ctx, w, s.comm[static_cast<std::size_t>(w)]);
      });
    }
  }
}

// ---- layout --------------------------------------------------------------------------------

// The splits of make_splits (checked inside split()), plus a split in which every rank has a
// negative color, and one with keys that tie (order by parent rank).
TEST(Split, LayoutFollowsColorAndKey) {
  for (int n : worlds) {
    auto& world = pooled_world(n);
    const std::string ctx = "world=" + std::to_string(n);
    Splits s = make_splits(world, ctx);
    if (::testing::Test::HasFailure()) return;
    // Sub-ranks differ from world ranks in the reversed split (except the middle one).
    for (int w = 0; w < n; ++w) EXPECT_EQ(s.reversed.rank_of(w), n - 1 - w) << ctx;
    Split none = split(world, world, [](int w) { return -1 - w; }, [](int) { return 0; }, ctx + " all negative");
    for (const auto& c : none.comm) EXPECT_FALSE(c.is_open()) << ctx;
    // Keys 0,0,1,1,...: ties broken by the parent's rank, here the reversed split's.
    split(world, s.reversed.comm, [](int) { return 0; }, [](int w) { return w / 2; }, ctx + " tied keys");
  }
}

// ---- send / recv ---------------------------------------------------------------------------

// Blocking send/recv in pairs (sub-ranks 2i, 2i+1: the lower one sends first, the upper one
// receives first), then isend/irecv from every member to every other, on every split.
TEST(Split, SendRecvAddressSubCommunicatorRanks) {
  on_every_split("", [&](const Split& s, const std::string& ctx, int w, Communicator c) {
    const int me = c.rank(), m = c.size();
    // Pairs.
    const int peer = me ^ 1;
    if (peer < m) {
      const Msg out = msg_of(s, w, 1);
      Msg in;
      if (me < peer) {
        c.send(peer, 11, &out, sizeof out);
        const Status st = c.recv(peer, 11, &in, sizeof in);
        check_msg(ctx + " send/recv", w, s, in, st, peer, 11, 1);
      } else {
        const Status st = c.recv(peer, 11, &in, sizeof in);
        check_msg(ctx + " send/recv", w, s, in, st, peer, 11, 1);
        c.send(peer, 11, &out, sizeof out);
      }
    }
    // Everyone to everyone, non-blocking; tag = 100 + the sender's sub-rank.
    std::vector<Msg> in(static_cast<std::size_t>(m));
    std::vector<Request> rq(static_cast<std::size_t>(m)), sq;
    const Msg out = msg_of(s, w, 2);
    for (int src = 0; src < m; ++src)
      if (src != me) rq[static_cast<std::size_t>(src)] = c.irecv(src, 100 + src, &in[static_cast<std::size_t>(src)], sizeof(Msg));
    for (int dst = 0; dst < m; ++dst)
      if (dst != me) sq.push_back(c.isend(dst, 100 + me, &out, sizeof out));
    for (auto& q : sq) q.wait();
    for (int src = 0; src < m; ++src) {
      if (src == me) continue;
      const Status st = rq[static_cast<std::size_t>(src)].wait();
      check_msg(ctx + " isend/irecv", w, s, in[static_cast<std::size_t>(src)], st, src, 100 + src, 2);
    }
  });
}

// ---- wildcards -----------------------------------------------------------------------------

// At the last sub-rank (whose world rank is another number): first recv(any_source, any_tag)
// of one message from every other member (tag 40 + its sub-rank), then, after a barrier on
// the split, irecv(any_source, 7) of a second one from each. Status::source is the sender's
// sub-rank, and matches the payload.
TEST(Split, AnySourceReportsTheSubCommunicatorRank) {
  on_every_split("", [&](const Split& s, const std::string& ctx, int w, Communicator c) {
    const int me = c.rank(), m = c.size(), root = m - 1;
    if (me != root) {
      const Msg a = msg_of(s, w, 1), b = msg_of(s, w, 2);
      c.send(root, 40 + me, &a, sizeof a);
      c.barrier();
      c.send(root, 7, &b, sizeof b);
      return;
    }
    std::set<int> seen;
    for (int i = 0; i < m - 1; ++i) {
      Msg in;
      const Status st = c.recv(any_source, any_tag, &in, sizeof in);
      check_msg(ctx + " recv(any_source, any_tag)", w, s, in, st, in.sub_src, 40 + in.sub_src, 1);
      seen.insert(st.source);
    }
    EXPECT_EQ(seen.size(), static_cast<std::size_t>(m - 1)) << ctx << ": not one message per sender";
    c.barrier();
    std::vector<Msg> in(static_cast<std::size_t>(m - 1));
    std::vector<Request> rq;
    for (auto& x : in) rq.push_back(c.irecv(any_source, 7, &x, sizeof x));
    seen.clear();
    for (std::size_t i = 0; i < rq.size(); ++i) {
      const Status st = rq[i].wait();
      EXPECT_EQ(rq[i].status().source, st.source) << ctx;
      check_msg(ctx + " irecv(any_source, 7)", w, s, in[i], st, in[i].sub_src, 7, 2);
      seen.insert(st.source);
    }
    EXPECT_EQ(seen.size(), static_cast<std::size_t>(m - 1)) << ctx << ": not one message per sender";
  });
}

// ---- bulk lane -------------------------------------------------------------------------------

// A ring on every split: each member streams a few hundred KiB (a size of its own, so the
// receiver can tell whose it got) to the next sub-rank, received with bulk_recv(any_source,
// tag), then a small one received with bulk_recv(source, any_tag).
TEST(Split, StreamSendRecvOnSplits) {
  auto size_of_world = [](int w) { return std::size_t{200003} + 4099 * static_cast<std::size_t>(w); };
  on_every_split(" stream", [&](const Split& s, const std::string& ctx, int w, Communicator c) {
    const int me = c.rank(), m = c.size();
    if (m < 2) return;
    const int next = (me + 1) % m, prev = (me + m - 1) % m;
    const int prev_world = s.members[static_cast<std::size_t>(w)][static_cast<std::size_t>(prev)];
    const auto out = random_bytes(size_of_world(w), mix(c.id(), static_cast<std::uint64_t>(w)));
    // Room for the largest stream of the world (members has one entry per world rank).
    std::vector<std::byte> in(size_of_world(static_cast<int>(s.members.size())) + 100);
    Request sq = c.ibulk_send(next, 3, out.data(), out.size());
    const Status st = c.bulk_recv(any_source, 3, in.data(), in.size());
    sq.wait();
    const std::string where = ctx + ": world rank " + std::to_string(w);
    EXPECT_EQ(st.source, prev) << where << ": Status::source is not the sub-rank of the sender";
    EXPECT_EQ(st.tag, 3) << where;
    ASSERT_EQ(st.bytes, size_of_world(prev_world)) << where << ": got another sender's stream";
    const auto want = random_bytes(st.bytes, mix(c.id(), static_cast<std::uint64_t>(prev_world)));
    EXPECT_TRUE(std::equal(want.begin(), want.end(), in.begin())) << where << ": stream content differs";
    const Msg small = msg_of(s, w, 9);
    Msg got;
    Request sq2 = c.ibulk_send(next, 12, &small, sizeof small);
    const Status st2 = c.bulk_recv(prev, any_tag, &got, sizeof got);
    sq2.wait();
    check_msg(ctx + " bulk_recv(source, any_tag)", w, s, got, st2, prev, 12, 9);
  });
}

// ---- separation --------------------------------------------------------------------------

// Every process sends to the next world rank, with the same tag, on four communicators with
// the same members: the world, a reversed split, its sibling (the same split made again) and a
// split of the split. The receiver takes them in the opposite order (after a barrier, so the
// messages have had time to arrive and wait in the unexpected queue): with explicit sources,
// then with any_source/any_tag, then on the bulk lane. Each receive must get the message of
// its own communicator, with the source as a rank of that communicator.
TEST(Split, ParentChildAndSiblingTrafficWithTheSameTagNeverMixes) {
  for (int n : worlds) {
    auto& world = pooled_world(n);
    const auto un = static_cast<std::size_t>(n);
    const std::string wctx = "world=" + std::to_string(n);
    Split child = split(world, world, [](int) { return 0; }, [](int w) { return -w; }, wctx + " child");
    Split sibling = split(world, world, [](int) { return 0; }, [](int w) { return -w; }, wctx + " sibling");
    Split grand = split(
        world, child.comm, [](int) { return 0; }, [&](int w) { return (child.rank_of(w) + 2) % n; },
        wctx + " grandchild");
    if (::testing::Test::HasFailure()) return;
    for (std::size_t w = 0; w < un; ++w) {
      EXPECT_NE(child.comm[w].id(), sibling.comm[w].id()) << wctx << ": siblings share an id";
      EXPECT_NE(grand.comm[w].id(), child.comm[w].id()) << wctx;
    }
    // comms[k][w] and rank_in(k, w): the k-th communicator of world rank w, and the rank
    // there of world rank w.
    const std::vector<Communicator>* comms[] = {&world, &child.comm, &sibling.comm, &grand.comm};
    const char* names[] = {"world", "child", "sibling", "grandchild"};
    auto rank_in = [&](std::size_t k, int w) {
      return k == 0 ? w : k == 3 ? grand.rank_of(w) : child.rank_of(w);  // sibling = child order
    };
    for (int round = 0; round < 3; ++round) {
      const char* how = round == 0 ? "recv(source, 5)" : round == 1 ? "recv(any_source, any_tag)"
                                                                    : "bulk_recv(any_source, any_tag)";
      const std::string ctx = wctx + " " + how;
      run_ranks(world, ctx, [&](int w) {
        const int next = (w + 1) % n, prev = (w + n - 1) % n;
        Msg out[4];
        std::vector<Request> sq;
        for (std::size_t k = 0; k < 4; ++k) {
          Communicator c = (*comms[k])[static_cast<std::size_t>(w)];
          out[k] = Msg{w, rank_in(k, w), c.id(), 10 * round + static_cast<int>(k)};
          sq.push_back(round == 2 ? c.ibulk_send(rank_in(k, next), 5, &out[k], sizeof(Msg))
                                  : c.isend(rank_in(k, next), 5, &out[k], sizeof(Msg)));
        }
        world[static_cast<std::size_t>(w)].barrier();
        for (std::size_t k = 4; k-- > 0;) {
          Communicator c = (*comms[k])[static_cast<std::size_t>(w)];
          Msg in;
          const Status st = round == 0 ? c.recv(rank_in(k, prev), 5, &in, sizeof in)
                            : round == 1 ? c.recv(any_source, any_tag, &in, sizeof in)
                                         : c.bulk_recv(any_source, any_tag, &in, sizeof in);
          const std::string where = ctx + ": world rank " + std::to_string(w) + " on the " + names[k];
          EXPECT_EQ(in.comm, c.id()) << where << ": got a message sent on another communicator (seq "
                                     << in.seq << ")";
          EXPECT_EQ(in.seq, 10 * round + static_cast<int>(k)) << where;
          EXPECT_EQ(in.world_src, prev) << where;
          EXPECT_EQ(st.source, rank_in(k, prev)) << where << ": Status::source";
          EXPECT_EQ(in.sub_src, st.source) << where;
          EXPECT_EQ(st.tag, 5) << where;
        }
        for (auto& q : sq) q.wait();
      });
    }
  }
}

// ---- validation ------------------------------------------------------------------------------

// A split of n-1 ranks (the last world rank left out): ranks are validated against the
// split's size, not the world's; this rank is this rank's sub-rank; the left-out rank's
// empty communicator refuses every call; the split stays usable after the refusals.
TEST(Split, RankValidationUsesTheSubCommunicatorRange) {
  for (int n : worlds) {
    auto& world = pooled_world(n);
    const std::string wctx = "world=" + std::to_string(n);
    Split s = split(
        world, world, [n](int w) { return w < n - 1 ? 0 : -1; }, [](int w) { return -w; },
        wctx + " without the last rank");
    if (::testing::Test::HasFailure()) return;
    const int m = n - 1;
    const std::string range = "[0, " + std::to_string(m) + ")";
    run_ranks(world, wctx + " validation", [&](int w) {
      Communicator c = s.comm[static_cast<std::size_t>(w)];
      std::vector<std::byte> buf(64);
      const std::string where = wctx + " world rank " + std::to_string(w);
      auto expect_invalid = [&](const char* op, const std::string& part, const std::string& what,
                                auto&& call) {
        const std::string msg = expect_error(Errc::invalid_argument, call);
        EXPECT_TRUE(contains(msg, op)) << where << " " << what << ": does not name " << op << ": " << msg;
        EXPECT_TRUE(contains(msg, part)) << where << " " << what << ": does not say " << part << ": " << msg;
      };
      if (!s.in(w)) {
        EXPECT_FALSE(c.is_open()) << where;
        expect_error(Errc::invalid_argument, [&] { c.send(0, 0, buf.data(), 1); });
        expect_error(Errc::invalid_argument, [&] { c.recv(0, 0, buf.data(), 1); });
        expect_error(Errc::invalid_argument, [&] { c.bulk_send(0, 0, buf.data(), 1); });
        expect_error(Errc::invalid_argument, [&] { (void)c.rank(); });
        return;
      }
      const int me = c.rank(), peer = (me + 1) % m;
      const ConstBuffer parts[] = {{buf.data(), 3}, {buf.data() + 3, 5}};
      // World rank m exists; sub-rank m does not.
      expect_invalid("send", range, "send(dest = size)", [&] { c.send(m, 0, buf.data(), 4); });
      expect_invalid("send", range, "isend(dest = -1)", [&] { c.isend(-1, 0, buf.data(), 4).wait(); });
      expect_invalid("send_iov", range, "send_iov(dest = size)", [&] { c.send_iov(m, 0, parts); });
      expect_invalid("recv", range, "recv(source = size)", [&] { c.recv(m, 0, buf.data(), buf.size()); });
      expect_invalid("recv", range, "irecv(source = -2)", [&] { c.irecv(-2, 0, buf.data(), buf.size()).wait(); });
      expect_invalid("bulk_send", range, "bulk_send(dest = size)", [&] { c.bulk_send(m, 0, buf.data(), 4); });
      expect_invalid("bulk_recv", range, "ibulk_recv(source = size + 1)",
                     [&] { c.ibulk_recv(m + 1, 0, buf.data(), buf.size()).wait(); });
      // This rank, by its sub-rank (which is another process's world rank here).
      expect_invalid("send", "this rank", "send to itself", [&] { c.send(me, 0, buf.data(), 4); });
      expect_invalid("recv", "this rank", "recv from itself", [&] { c.recv(me, 0, buf.data(), buf.size()); });
      expect_invalid("send", "tag", "tag max_tag + 1", [&] { c.send(peer, nexar::max_tag + 1, buf.data(), 4); });
      expect_invalid("recv", "tag", "tag -5", [&] { c.recv(peer, -5, buf.data(), buf.size()); });
      // Still usable: a ring with the ranks validated away above as neighbours.
      const Msg out = msg_of(s, w, 4);
      Msg in;
      Request rq = c.irecv((me + m - 1) % m, 0, &in, sizeof in);
      c.send(peer, 0, &out, sizeof out);
      check_msg(wctx + " after the refusals", w, s, in, rq.wait(), (me + m - 1) % m, 0, 4);
    });
  }
}

// ---- neighbours ------------------------------------------------------------------------------

// neighbours(): under full_mesh every other rank, on the world and on its splits; under
// k_regular:4 at 8 ranks, r±1 and r±2 mod 8, and on a split (parity, reversed keys) the
// members among those, in the split's numbering, ascending. A closed communicator refuses.
TEST(Split, NeighboursFollowTheTopologyInTheCommunicatorsNumbering) {
  auto ascending = [](std::vector<int> v) {
    std::sort(v.begin(), v.end());
    return v;
  };
  {
    auto& world = pooled_world(4);
    Splits all = make_splits(world, "full_mesh world=4");
    if (::testing::Test::HasFailure()) return;
    for (int w = 0; w < 4; ++w) {
      std::vector<int> others;
      for (int v = 0; v < 4; ++v)
        if (v != w) others.push_back(v);
      EXPECT_EQ(world[static_cast<std::size_t>(w)].neighbours(), others) << "full_mesh world rank " << w;
      for (const Split* sp : {&all.reversed, &all.parity, &all.nested}) {
        if (!sp->in(w)) continue;
        const Communicator& c = sp->comm[static_cast<std::size_t>(w)];
        std::vector<int> want;
        for (int r = 0; r < c.size(); ++r)
          if (r != c.rank()) want.push_back(r);
        EXPECT_EQ(c.neighbours(), want) << "full_mesh" << which(all, sp) << " world rank " << w;
      }
    }
  }

  constexpr int n = 8;
  nexar::Config cfg = test_config();
  cfg.topology = nexar::Topology::parse("k_regular:4");
  std::vector<Communicator> world = nexar::bootstrap_local(n, cfg);
  const auto near = [](int a, int b) {
    const int d = std::abs(a - b);
    return a != b && std::min(d, n - d) <= 2;
  };
  for (int w = 0; w < n; ++w) {
    const std::vector<int> want = ascending({(w + 1) % n, (w + 2) % n, (w + n - 1) % n, (w + n - 2) % n});
    EXPECT_EQ(world[static_cast<std::size_t>(w)].neighbours(), want) << "k_regular:4 world rank " << w;
  }
  Split parity = split(world, world, [](int w) { return w % 2; }, [](int w) { return -w; }, "k_regular:4 parity");
  Split reversed = split(world, world, [](int) { return 0; }, [](int w) { return -w; }, "k_regular:4 reversed");
  if (!::testing::Test::HasFailure()) {
    for (const Split* sp : {&parity, &reversed}) {
      for (int w = 0; w < n; ++w) {
        std::vector<int> want;
        for (int v : sp->members[static_cast<std::size_t>(w)])
          if (near(w, v)) want.push_back(sp->rank_of(v));
        EXPECT_EQ(sp->comm[static_cast<std::size_t>(w)].neighbours(), ascending(want))
            << "k_regular:4" << (sp == &parity ? " parity" : " reversed") << " world rank " << w;
      }
    }
    // World rank 0 in the even half {6, 4, 2, 0} (sub-ranks 0..3): its neighbours 2 and 6.
    EXPECT_EQ(parity.comm[0].neighbours(), (std::vector<int>{0, 2}));
  }
  for (auto& c : world) c.close();
  expect_error(Errc::closed, [&] { (void)world[0].neighbours(); });
  expect_error(Errc::closed, [&] { (void)parity.comm[3].neighbours(); });
}

// ---- collectives and p2p interleaved -----------------------------------------------------------

// Non-blocking collectives on the world and on a split by parity (reversed keys) in flight
// together, a blocking all_reduce on a split of the split in between, p2p on the split
// meanwhile, and a bulk_recv(any_source, any_tag) posted on the split before all of it
// (collectives travel on the bulk lane too, and must not match it). Three rounds.
TEST(Split, CollectivesOnParentAndChildInterleavedWithP2p) {
  for (int n : worlds) {
    auto& world = pooled_world(n);
    const auto un = static_cast<std::size_t>(n);
    const std::string wctx = "world=" + std::to_string(n);
    Split child = split(world, world, [](int w) { return w % 2; }, [](int w) { return -w; }, wctx + " parity");
    Split grand = split(
        world, child.comm, [](int) { return 0; }, [&](int w) { return -child.rank_of(w); }, wctx + " grandchild");
    if (::testing::Test::HasFailure()) return;
    constexpr std::size_t count = 1001;
    for (int it = 0; it < 3; ++it) {
      const std::string ctx = wctx + " round " + std::to_string(it);
      run_ranks(world, ctx, [&](int w) {
        const auto uw = static_cast<std::size_t>(w);
        Communicator p = world[uw], c = child.comm[uw], g = grand.comm[uw];
        const auto& mem = child.members[uw];
        const int me = c.rank(), m = c.size();
        const std::string where = ctx + ": world rank " + std::to_string(w);
        // Posted first, completed last.
        Msg streamed;
        Request sr = c.ibulk_recv(any_source, any_tag, &streamed, sizeof streamed);

        std::vector<std::int64_t> ar_in(count), ar_out(count, -1);
        for (std::size_t i = 0; i < count; ++i) ar_in[i] = static_cast<std::int64_t>(i) * (w + 1) + it;
        std::vector<double> cr(count);
        for (std::size_t i = 0; i < count; ++i) cr[i] = 0.5 * (w + 1) + static_cast<double>(i % 7);
        std::vector<std::int32_t> bc(5, w == mem.back() ? 10 * w + it : -1);
        const std::int32_t mine = w;
        std::vector<std::int32_t> pg(un, -1), cg(static_cast<std::size_t>(m), -1);

        std::vector<Request> q;
        q.push_back(p.iall_reduce(ar_in.data(), ar_out.data(), count, DataType::i64, ReduceOp::sum));
        q.push_back(c.iall_reduce(cr.data(), cr.data(), count, DataType::f64, ReduceOp::sum));
        q.push_back(c.ibroadcast(bc.data(), bc.size(), DataType::i32, m - 1));
        q.push_back(p.iall_gather(&mine, pg.data(), 1, DataType::i32));
        // p2p on the split between collectives.
        const Msg out = msg_of(child, w, it);
        Msg in;
        Request rq = c.irecv((me + m - 1) % m, 9, &in, sizeof in);
        Request sq = c.isend((me + 1) % m, 9, &out, sizeof out);
        q.push_back(c.iall_gather(&mine, cg.data(), 1, DataType::i32));
        std::int32_t gmax = w;
        g.all_reduce(std::span<std::int32_t>(&gmax, 1), ReduceOp::max);
        q.push_back(p.ibarrier());
        for (std::size_t k = q.size(); k-- > 0;) q[k].wait();
        check_msg(where + " isend/irecv on the split", w, child, in, rq.wait(), (me + m - 1) % m, 9, it);
        sq.wait();
        // Now the stream message the early receive waits for.
        c.bulk_send((me + 1) % m, 21, &out, sizeof out);
        const Status st = sr.wait();
        check_msg(where + " early bulk_recv(any_source, any_tag)", w, child, streamed, st, (me + m - 1) % m, 21, it);

        const std::int64_t tri = static_cast<std::int64_t>(n) * (n + 1) / 2;
        for (std::size_t i = 0; i < count; ++i)
          if (ar_out[i] != static_cast<std::int64_t>(i) * tri + static_cast<std::int64_t>(n) * it) {
            ADD_FAILURE() << where << ": all_reduce on the world [" << i << "] = " << ar_out[i];
            break;
          }
        double half_sum = 0;
        for (int v : mem) half_sum += 0.5 * (v + 1);
        for (std::size_t i = 0; i < count; ++i)
          if (cr[i] != half_sum + static_cast<double>(m) * static_cast<double>(i % 7)) {
            ADD_FAILURE() << where << ": all_reduce on the split [" << i << "] = " << cr[i];
            break;
          }
        EXPECT_EQ(bc, std::vector<std::int32_t>(5, 10 * mem.back() + it)) << where << ": broadcast on the split";
        std::vector<std::int32_t> all(un);
        std::iota(all.begin(), all.end(), 0);
        EXPECT_EQ(pg, all) << where << ": all_gather on the world";
        EXPECT_EQ(cg, std::vector<std::int32_t>(mem.begin(), mem.end()))
            << where << ": all_gather on the split (world ranks in sub-rank order)";
        EXPECT_EQ(gmax, *std::max_element(mem.begin(), mem.end())) << where << ": all_reduce on the split of the split";
      });
    }
  }
}

}  // namespace
