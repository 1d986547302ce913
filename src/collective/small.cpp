// all_reduce and reduce_scatter (of any size up to Config::shm_collective_bytes per rank;
// with 2 ranks up to 128 KiB), all_gather (up to 1 MiB), broadcast (up to 256 KiB) and
// barrier on a communicator whose ranks share one host: through the mailboxes of the port
// (CollectivePort::mailboxes), in one or two exchanges instead of log2(n) or 2(n-1)
// dependent steps. A blocking call runs it in the calling thread, with no collective
// thread, operation state or matching queue in the way; a non-blocking one runs it as a
// collective of the port.
#include <nexar/error.hpp>

#include <algorithm>
#include <cstring>
#include <vector>

#include "collective/algorithms.hpp"
#include "collective/collectives.hpp"
#include "core/call_check.hpp"
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

namespace {

using Ticket = CollectivePort::Ticket;

// all_reduce: up to kOneRoundBytes one round, unless a rank would post more than
// kFanOutBytes in all (so does broadcast); above, two rounds, in one message per block
// while a block fits one, in chunks beyond. Two ranks take the chunks up to
// kTwoRanksMostBytes only: above it the ordinary ring through the shared-memory rings was
// faster (2 processes on this project's 2-core machine, busbw in 3 alternating runs: 128
// KiB 4.25-4.62 GB/s in chunks against 3.91-4.34; 256 KiB 4.20-4.26 against 5.22-6.06;
// 16 MiB 3.22-3.49 against 3.37-3.93). With more ranks the chunks were faster at every
// size measured, up to 64 MiB (docs/PERFORMANCE.md, "Collectives through mailboxes").
constexpr std::size_t kOneRoundBytes = 4096;
constexpr std::size_t kFanOutBytes = std::size_t{128} << 10;
constexpr std::size_t kTwoRanksMostBytes = std::size_t{128} << 10;
// all_gather takes them up to kAllGatherMostBytes (the whole result): with 4 processes on
// 2 cores it was 1.3-2x faster up to 512 KiB, and as fast as the ring's forwarding from 1
// to 16 MiB (3 alternating runs).
constexpr std::size_t kAllGatherMostBytes = std::size_t{1} << 20;
// broadcast in chunks up to kBroadcastMostBytes: with 4 processes on 2 cores 2-3x faster
// up to 64 KiB than the pipelined chain, as fast at 256 KiB and 1 MiB, slower at 4 MiB
// (2 alternating runs).
constexpr std::size_t kBroadcastMostBytes = std::size_t{256} << 10;
// A block of the largest vector Config::shm_collective_bytes allows numbers its chunks
// within a label's part.
static_assert((std::size_t{1} << 30) / CollectivePort::kMailboxBytes + 1 < CollectivePort::kMaxChunks);

// Runs `body` here (blocking: the caller waits anyway, so no collective thread, operation
// state or Request is needed) or as a collective of the port.
template <class Body>
Request run(CollectivePort& p, const Ticket& tk, bool blocking, const CollectiveOptions& o, DataType t, ReduceOp op,
            Body body) {
  if (blocking && !tk.queued) {
    struct Ran {
      CollectivePort& p;
      const Ticket& tk;
      int unwinding = std::uncaught_exceptions();
      ~Ran() { p.ran(tk, std::uncaught_exceptions() == unwinding); }
    } ran{p, tk};
    body();
    return {};
  }
  return p.start(tk.op, o, t, op, tk.shape, [&p, tk, blocking, body](const Coll&) {
    struct Finished {
      CollectivePort& p;
      const Ticket& tk;
      bool counted;
      ~Finished() {
        if (counted) p.finished(tk);
      }
    } f{p, tk, !blocking};
    body();
  });
}

// The reduction of the n parts of block `b` (this rank's part at `mine`) in rank order,
// (x0 op x1) op x2 ..., into `acc`: every rank that computes it gets the same bits. The
// others' parts come as messages of `phase`.
void reduce_parts(CollectivePort& p, const Ticket& t, int phase, const void* mine, std::byte* acc, std::size_t len,
                  DataType dt, ReduceOp op) {
  const int n = p.size(), me = p.rank();
  const std::size_t bytes = len * size_of(dt);
  alignas(64) std::byte part[CollectivePort::kMailboxBytes];
  if (me == 0) {
    if (bytes) std::memcpy(acc, mine, bytes);
  } else {
    p.take(t, CollectivePort::part(phase), 0, acc, bytes);
  }
  for (int r = 1; r < n; ++r) {
    const void* x = mine;
    if (r != me) {
      p.take(t, CollectivePort::part(phase), r, part, bytes);
      x = part;
    }
    reduce::accumulate(dt, op, acc, x, len);
  }
  reduce::finish(dt, op, acc, len, n);
}

// One round: every rank posts its whole vector to every other and reduces all of them.
// The least waiting (one exchange), the most copying ((n-1) x the vector each way).
void all_reduce_one_round(CollectivePort& p, const Ticket& t, const void* send, void* recv, std::size_t count,
                          DataType dt, ReduceOp op) {
  const int n = p.size(), me = p.rank();
  const std::size_t bytes = count * size_of(dt);
  for (int k = 1; k < n; ++k) p.post(t, CollectivePort::part(0), (me + k) % n, send, bytes);
  alignas(64) std::byte acc[CollectivePort::kMailboxBytes];
  reduce_parts(p, t, 0, send, acc, count, dt, op);
  if (bytes) std::memcpy(recv, acc, bytes);
}

// Two rounds, each rank the owner of one block (block_of): it posts block b to rank b,
// reduces the parts of its own block, and posts the result to every other rank. As much
// copying as a ring (2 (n-1)/n x the vector), with two exchanges instead of 2 (n-1) steps.
void all_reduce_two_rounds(CollectivePort& p, const Ticket& t, const void* send, void* recv, std::size_t count,
                           DataType dt, ReduceOp op) {
  const int n = p.size(), me = p.rank();
  const std::size_t es = size_of(dt);
  const auto* in = static_cast<const std::byte*>(send);
  auto* out = static_cast<std::byte*>(recv);
  for (int k = 1; k < n; ++k) {
    const int b = (me + k) % n;
    const auto [off, len] = block_of(count, n, b);
    p.post(t, CollectivePort::part(0), b, in + off * es, len * es);
  }
  const auto [off, len] = block_of(count, n, me);
  alignas(64) std::byte acc[CollectivePort::kMailboxBytes];
  reduce_parts(p, t, 0, in + off * es, acc, len, dt, op);
  for (int k = 1; k < n; ++k) p.post(t, CollectivePort::part(1), (me + k) % n, acc, len * es);
  // Only now: in place, recv is send, whose blocks went out above.
  if (len) std::memcpy(out + off * es, acc, len * es);
  for (int k = 1; k < n; ++k) {
    const int b = (me + k) % n;
    const auto [boff, blen] = block_of(count, n, b);
    p.take(t, CollectivePort::part(1), b, out + boff * es, blen * es);
  }
}

// The size a chunked collective's first message from rank `from` announced against this
// rank's: ranks that disagree fail at once, naming both.
void check_sizes_agree(const Ticket& t, int me, int from, std::uint64_t theirs, std::uint64_t ours) {
  if (theirs == ours) return;
  throw make_error(Errc::invalid_argument, ErrorContext{t.op, me, from, {}, {}},
                   "rank " + std::to_string(from) + " has " + std::to_string(theirs) + " bytes, this rank " +
                       std::to_string(ours) + " (the ranks disagree on count or type)");
}

// The two rounds when a block outgrows one message (all_reduce), or one of them
// (reduce_scatter: the first; all_gather: the second). Each rank sends every other rank
// the vector's size (8 bytes: ranks that disagree fail at once, naming both sizes); in
// the first round, its part of that rank's block in chunks of at most kMailboxBytes,
// which the owner reduces; in the second, its own block (reduced, for all_reduce) in
// chunks. One loop posts and takes whatever it can, so a rank never waits on one mailbox
// while another could move. The owner reduces chunk c once every rank's chunk c has come,
// straight from the mailboxes in rank order, and frees them. Only then (a reader frees
// its key's messages numbered below the one it takes) does it take the second round's
// chunks, which meanwhile wait in the mailboxes. The slots (8 per communicator and
// direction) are all that is in flight.
struct Chunked {
  std::size_t count;        // elements of the whole vector, in blocks (block_of)
  const std::byte* parts;   // first round: the vector whose block b goes to rank b; null: none
  std::byte* result;        // first round: where this rank's reduced block goes
  const std::byte* own;     // second round: this rank's block, sent to every rank; null: none
  std::byte* whole;         // second round: block b from rank b lands at its offset here
};

void exchange_in_chunks(CollectivePort& p, const Ticket& t, const Chunked& x, DataType dt, ReduceOp op) {
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

// broadcast beyond one message: the root sends every rank the size (8 bytes: ranks that
// disagree fail at once, naming both sizes), then the buffer in chunks, to all ranks in
// turn as their mailboxes take them; the others take theirs in order.
void broadcast_in_chunks(CollectivePort& p, const Ticket& t, std::byte* buf, std::uint64_t bytes, int root) {
  static constexpr std::size_t kChunk = CollectivePort::kMailboxBytes;
  const int n = p.size(), me = p.rank();
  const std::size_t chunks = (bytes + kChunk - 1) / kChunk;
  const auto piece = [bytes](std::size_t c) { return std::min<std::size_t>(kChunk, bytes - c * kChunk); };
  if (me != root) {
    std::uint64_t theirs = 0;
    p.take(t, CollectivePort::part(0), root, &theirs, sizeof theirs);
    check_sizes_agree(t, me, root, theirs, bytes);
    for (std::size_t c = 0; c < chunks; ++c) p.take(t, CollectivePort::part(0, 1 + c), root, buf + c * kChunk, piece(c));
    return;
  }
  std::vector<std::size_t> posted(static_cast<std::size_t>(n), 0);  // by rank: the size, then chunks
  for (CollectivePort::MailWait w;;) {
    bool moved = false;
    int waiting_for = -1;
    for (int k = 1; k < n; ++k) {
      const int r = (root + k) % n;
      std::size_t& c = posted[static_cast<std::size_t>(r)];
      while (c <= chunks &&
             (c == 0 ? p.try_post(t, CollectivePort::part(0), r, &bytes, sizeof bytes)
                     : p.try_post(t, CollectivePort::part(0, c), r, buf + (c - 1) * kChunk, piece(c - 1)))) {
        ++c;
        moved = true;
      }
      if (c <= chunks && waiting_for < 0) waiting_for = r;
    }
    if (waiting_for < 0) return;
    if (moved) {
      w = {};
    } else {
      p.idle(t, w, waiting_for, false);
    }
  }
}

}  // namespace

std::optional<CollectivePort::Ticket> mailbox_path(CollectivePort& p, const char* op, std::size_t bytes,
                                                   const CollectiveOptions& o, bool blocking, bool fits,
                                                   std::uint16_t check, CallShape shape) {
  if (o.algorithm != Algorithm::automatic || p.size() < 2 || !fits) return std::nullopt;
  shape.algorithm = "mailbox";
  return p.mailboxes(op, bytes, o, blocking, check, shape);
}

namespace {
// The collectives' numbers in a fingerprint, found once (a scan of the names would cost a
// tenth of an 8 B all_reduce through the mailboxes).
constexpr unsigned kAllReduce = call_kind("all_reduce");
constexpr unsigned kReduceScatter = call_kind("reduce_scatter");
constexpr unsigned kAllGather = call_kind("all_gather");
constexpr unsigned kBroadcast = call_kind("broadcast");
constexpr unsigned kBarrier = call_kind("barrier");
}  // namespace

namespace {
// Whether a vector of `bytes` per rank may go through the mailboxes in chunks.
bool chunks_fit(const CollectivePort& p, std::size_t bytes) { return p.size() > 2 || bytes <= kTwoRanksMostBytes; }
}  // namespace

std::optional<Request> small_all_reduce(CollectivePort& p, bool blocking, const void* send, void* recv,
                                        std::size_t count, DataType t, ReduceOp op, const CollectiveOptions& o) {
  const std::size_t n = static_cast<std::size_t>(p.size()), bytes = count * size_of(t);
  const bool one = bytes <= kOneRoundBytes && bytes * (n - 1) <= kFanOutBytes;
  const bool two = block_of(count, p.size(), 0).second * size_of(t) <= CollectivePort::kMailboxBytes;
  auto tk = mailbox_path(p, "all_reduce", bytes, o, blocking, chunks_fit(p, bytes), call_check(kAllReduce, t, op),
                         {count, -1});
  if (!tk) return std::nullopt;
  return run(p, *tk, blocking, o, t, op, [&p, tk = *tk, send, recv, count, t, op, one, two] {
    if (one) return all_reduce_one_round(p, tk, send, recv, count, t, op);
    if (two) return all_reduce_two_rounds(p, tk, send, recv, count, t, op);
    const auto* in = static_cast<const std::byte*>(send);
    auto* out = static_cast<std::byte*>(recv);
    const std::size_t mine = block_of(count, p.size(), p.rank()).first * size_of(t);
    exchange_in_chunks(p, tk, Chunked{count, in, out + mine, out + mine, out}, t, op);
  });
}

std::optional<Request> small_reduce_scatter(CollectivePort& p, bool blocking, const void* send, void* recv,
                                            std::size_t count, DataType t, ReduceOp op, const CollectiveOptions& o) {
  const std::size_t bytes = count * size_of(t);
  auto tk =
      mailbox_path(p, "reduce_scatter", bytes, o, blocking, chunks_fit(p, bytes), call_check(kReduceScatter, t, op),
                   {count, -1});
  if (!tk) return std::nullopt;
  return run(p, *tk, blocking, o, t, op, [&p, tk = *tk, send, recv, count, t, op] {
    exchange_in_chunks(p, tk,
                       Chunked{count, static_cast<const std::byte*>(send), static_cast<std::byte*>(recv), nullptr, nullptr},
                       t, op);
  });
}

std::optional<Request> small_all_gather(CollectivePort& p, bool blocking, const void* send, void* recv,
                                        std::size_t count, DataType t, const CollectiveOptions& o) {
  const std::size_t n = static_cast<std::size_t>(p.size()), bytes = n * count * size_of(t);
  auto tk = mailbox_path(p, "all_gather", bytes, o, blocking, chunks_fit(p, bytes) && bytes <= kAllGatherMostBytes,
                         call_check(kAllGather, t, ReduceOp::sum), {count, -1});
  if (!tk) return std::nullopt;
  return run(p, *tk, blocking, o, t, ReduceOp::sum, [&p, tk = *tk, send, recv, count, n, t] {
    const std::size_t block = count * size_of(t);
    std::byte* own = static_cast<std::byte*>(recv) + static_cast<std::size_t>(p.rank()) * block;
    // Before any block arrives, and sent from there: a send buffer inside recv is read
    // before anything lands on it.
    if (block && own != send) std::memmove(own, send, block);
    exchange_in_chunks(p, tk, Chunked{n * count, nullptr, nullptr, own, static_cast<std::byte*>(recv)}, t,
                       ReduceOp::sum);
  });
}

std::optional<Request> small_broadcast(CollectivePort& p, bool blocking, void* buf, std::size_t count, DataType t,
                                       int root, const CollectiveOptions& o) {
  const std::size_t bytes = count * size_of(t);
  const bool one = bytes <= CollectivePort::kMailboxBytes &&
                   bytes * static_cast<std::size_t>(p.size() - 1) <= kFanOutBytes;
  const bool chunked = chunks_fit(p, bytes) && bytes <= kBroadcastMostBytes;
  auto tk = mailbox_path(p, "broadcast", bytes, o, blocking, one || chunked, call_check(kBroadcast, t, ReduceOp::sum, root),
                         {count, root});
  if (!tk) return std::nullopt;
  return run(p, *tk, blocking, o, t, ReduceOp::sum, [&p, tk = *tk, buf, bytes, root, one] {
    const int n = p.size();
    if (one) {
      if (p.rank() != root) return p.take(tk, CollectivePort::part(0), root, buf, bytes);
      for (int k = 1; k < n; ++k) p.post(tk, CollectivePort::part(0), (root + k) % n, buf, bytes);
      return;
    }
    broadcast_in_chunks(p, tk, static_cast<std::byte*>(buf), bytes, root);
  });
}

std::optional<Request> small_barrier(CollectivePort& p, bool blocking, const CollectiveOptions& o) {
  auto tk = mailbox_path(p, "barrier", 0, o, blocking, true, call_check(kBarrier, DataType::u8, ReduceOp::sum), {});
  if (!tk) return std::nullopt;
  return run(p, *tk, blocking, o, DataType::u8, ReduceOp::sum, [&p, tk = *tk] {
    const int n = p.size(), me = p.rank();
    for (int k = 1; k < n; ++k) p.post(tk, CollectivePort::part(0), (me + k) % n, nullptr, 0);
    for (int k = 1; k < n; ++k) p.take(tk, CollectivePort::part(0), (me + k) % n, nullptr, 0);
  });
}

}  // namespace coll
}  // namespace nexar::detail
