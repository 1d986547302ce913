// The mailbox path's shared pieces (mailbox_path.hpp), and the CollectivePort defaults for
// a port without mailboxes.
#include "collective/mailbox_path.hpp"

#include <nexar/error.hpp>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "core/error_format.hpp"
#include "reduce/reduce.hpp"

namespace nexar::detail {

namespace {
[[noreturn]] void no_mailboxes(const CollectivePort::Ticket& t) {
  throw Error(Errc::invalid_argument, std::string(t.op) + ": this communicator has no mailboxes");
}
}  // namespace

bool CollectivePort::try_post(const Ticket& t, std::uint64_t, int, const void*, std::size_t) { no_mailboxes(t); }
bool CollectivePort::try_take(const Ticket& t, std::uint64_t, int, void*, std::size_t) { no_mailboxes(t); }
const void* CollectivePort::try_peek(const Ticket& t, std::uint64_t, int, std::size_t) { no_mailboxes(t); }
void CollectivePort::release(int, const void*) {}
void CollectivePort::idle(const Ticket& t, MailWait&, int, bool) { no_mailboxes(t); }

namespace coll {

// A block of the largest vector Config::shm_collective_bytes allows numbers its chunks
// within a label's part.
static_assert((std::size_t{1} << 30) / CollectivePort::kMailboxBytes + 1 < CollectivePort::kMaxChunks);

std::optional<CollectivePort::Ticket> mailbox_path(CollectivePort& p, const char* op, std::size_t bytes,
                                                   const CollectiveOptions& o, bool blocking, bool fits,
                                                   std::uint16_t check, CallShape shape) {
  if (o.algorithm != Algorithm::automatic || p.size() < 2 || !fits) return std::nullopt;
  shape.algorithm = "mailbox";
  return p.mailboxes(op, bytes, o, blocking, check, shape);
}

void check_sizes_agree(const CollectivePort::Ticket& t, int me, int from, std::uint64_t theirs, std::uint64_t ours) {
  if (theirs == ours) return;
  throw make_error(Errc::invalid_argument, ErrorContext{t.op, me, from, {}, {}},
                   "rank " + std::to_string(from) + " has " + std::to_string(theirs) + " bytes, this rank " +
                       std::to_string(ours) + " (the ranks disagree on count or type)");
}

void exchange_in_chunks(CollectivePort& p, const CollectivePort::Ticket& t, const Chunked& x, DataType dt,
                        ReduceOp op) {
  static constexpr std::size_t kChunk = CollectivePort::kMailboxBytes;
  const int n = p.size(), me = p.rank();
  const std::size_t es = size_of(dt);
  const std::uint64_t total = x.count * es;
  const auto bytes_of = [&](int b) {
    const auto [off, len] = block_of(x.count, n, b);
    return std::pair{off * es, len * es};
  };
  const auto chunks = [](std::size_t bytes) { return (bytes + kChunk - 1) / kChunk; };
  const auto piece = [](std::size_t bytes, std::size_t c) { return std::min(kChunk, bytes - c * kChunk); };
  // Not a structured binding: lambdas below capture them (C++20 allows it, clang 14 not).
  const std::size_t mine_off = bytes_of(me).first, mine = bytes_of(me).second;
  // Chunks this rank reduces, and sends in the second round.
  const std::size_t to_reduce = x.parts ? chunks(mine) : 0, to_send = x.own ? chunks(mine) : 0;

  // Per other rank: what was posted to it (the size, its block's chunks, then this rank's
  // chunks: post_all in all) and taken from it (the size, then its block's chunks), and
  // its chunk of the reduction in progress, found in the mailbox.
  struct Pair {
    int rank;
    std::size_t off, len;  // its block
    std::size_t posted = 0, post_all = 0;
    bool sized = false;
    std::size_t taken = 0, take_all = 0;
    const void* part = nullptr;
  };
  std::vector<Pair> pairs;
  pairs.reserve(static_cast<std::size_t>(n - 1));
  for (int k = 1; k < n; ++k) {
    const int r = (me + k) % n;
    const auto [off, len] = bytes_of(r);
    pairs.push_back(Pair{r, off, len, 0, 1 + (x.parts ? chunks(len) : 0) + to_send, false, 0,
                         x.whole ? chunks(len) : 0});
  }
  // Pairs by rank, for the reduction's order.
  std::vector<Pair*> by_rank(static_cast<std::size_t>(n), nullptr);
  for (Pair& q : pairs) by_rank[static_cast<std::size_t>(q.rank)] = &q;
  std::size_t reduced = 0;  // chunks of this rank's block reduced (and in x.result)
  alignas(64) std::byte acc_memory[kChunk];
  // In place, the reduced block holds this rank's part until the reduction has read it.
  const std::byte* const my_part = x.parts ? x.parts + mine_off : nullptr;
  std::byte* const acc_aside =
      my_part && x.result < my_part + mine && my_part < x.result + mine ? acc_memory : nullptr;

  const auto take_some = [&](Pair& q) {
    bool moved = false;
    if (!q.sized) {
      std::uint64_t theirs = 0;
      if (!p.try_take(t, CollectivePort::part(0), q.rank, &theirs, sizeof theirs)) return false;
      check_sizes_agree(t, me, q.rank, theirs, total);
      q.sized = moved = true;
    }
    // Its second round comes after its parts of ours in its mailbox: only once ours is done.
    while (reduced == to_reduce && q.taken < q.take_all) {
      const std::size_t c = q.taken;
      if (!p.try_take(t, CollectivePort::part(1, c), q.rank, x.whole + q.off + c * kChunk, piece(q.len, c))) break;
      ++q.taken;
      moved = true;
    }
    return moved;
  };
  const auto reduce_some = [&] {
    bool moved = false;
    while (reduced < to_reduce) {
      const std::size_t c = reduced, len = piece(mine, c);
      for (Pair& q : pairs) {
        if (!q.part && q.sized) q.part = p.try_peek(t, CollectivePort::part(0, 1 + c), q.rank, len);
        if (!q.part) return moved;
      }
      std::byte* acc = acc_aside ? acc_aside : x.result + c * kChunk;
      const std::size_t elems = len / es;
      for (int r = 0; r < n; ++r) {
        const void* from = r == me ? my_part + c * kChunk : by_rank[static_cast<std::size_t>(r)]->part;
        if (r == 0) {
          std::memcpy(acc, from, len);
        } else {
          reduce::accumulate(dt, op, acc, from, elems);
        }
      }
      reduce::finish(dt, op, acc, elems, n);
      if (acc_aside) std::memcpy(x.result + c * kChunk, acc, len);
      for (Pair& q : pairs) {
        p.release(q.rank, q.part);
        q.part = nullptr;
      }
      ++reduced;
      moved = true;
    }
    return moved;
  };
  const auto post_some = [&](Pair& q) {
    bool moved = false;
    const std::size_t theirs = x.parts ? chunks(q.len) : 0;
    while (q.posted < q.post_all) {
      const std::size_t c = q.posted;
      bool ok = false;
      if (c == 0) {
        ok = p.try_post(t, CollectivePort::part(0), q.rank, &total, sizeof total);
      } else if (c <= theirs) {
        const std::size_t i = c - 1;
        ok = p.try_post(t, CollectivePort::part(0, c), q.rank, x.parts + q.off + i * kChunk, piece(q.len, i));
      } else {
        const std::size_t i = c - 1 - theirs;
        if (x.parts && i >= reduced) break;  // not reduced yet
        ok = p.try_post(t, CollectivePort::part(1, i), q.rank, x.own + i * kChunk, piece(mine, i));
      }
      if (!ok) break;
      ++q.posted;
      moved = true;
    }
    return moved;
  };

  for (CollectivePort::MailWait w;;) {
    bool moved = false;
    // Posts first: a rank that finds the sizes differ has sent its own first, so the
    // other finds it too.
    for (Pair& q : pairs) moved |= post_some(q);
    for (Pair& q : pairs) moved |= take_some(q);
    moved |= reduce_some();
    // What to wait for: the first rank whose message is missing (its size or its part of
    // the next chunk to reduce, then its second round), else the first whose mailbox is
    // full.
    int peer = -1;
    bool taking = true;
    for (const Pair& q : pairs) {
      if (!q.sized || (reduced < to_reduce && !q.part)) {
        peer = q.rank;
        break;
      }
    }
    for (const Pair& q : pairs) {
      if (peer < 0 && reduced == to_reduce && q.taken < q.take_all) peer = q.rank;
    }
    if (peer < 0) {
      for (const Pair& q : pairs) {
        if (q.posted < q.post_all) {
          peer = q.rank;
          taking = false;
          break;
        }
      }
    }
    if (peer < 0) return;
    if (moved) {
      w = {};
    } else {
      p.idle(t, w, peer, taking);
    }
  }
}

}  // namespace coll
}  // namespace nexar::detail
