// all_reduce (up to 64 KiB per rank), broadcast (up to 8 KiB) and barrier on a
// communicator whose ranks share one host: through the mailboxes of the port
// (CollectivePort::mailboxes), in one or two exchanges instead of log2(n) or 2(n-1)
// dependent steps. A blocking call runs it in the calling thread, with no collective
// thread, operation state or matching queue in the way; a non-blocking one runs it as a
// collective of the port.
#include <nexar/error.hpp>

#include <cstring>

#include "collective/algorithms.hpp"
#include "collective/collectives.hpp"
#include "reduce/reduce.hpp"

namespace nexar::detail {

void CollectivePort::post(const Ticket& t, int, int, const void*, std::size_t) {
  throw Error(Errc::invalid_argument, std::string(t.op) + ": this communicator has no mailboxes");
}
void CollectivePort::take(const Ticket& t, int, int, void*, std::size_t) {
  throw Error(Errc::invalid_argument, std::string(t.op) + ": this communicator has no mailboxes");
}

namespace coll {

namespace {

using Ticket = CollectivePort::Ticket;

// Up to kOneRoundBytes all_reduce takes one round; above, two. Neither runs once a rank
// would post more than kFanOutBytes in all (the ordinary algorithms: fewer copies, more
// steps), nor the two rounds once a block exceeds a mailbox's message.
constexpr std::size_t kOneRoundBytes = 4096;
constexpr std::size_t kFanOutBytes = std::size_t{128} << 10;

// Runs `body` here (blocking: the caller waits anyway, so no collective thread, operation
// state or Request is needed) or as a collective of the port.
template <class Body>
Request run(CollectivePort& p, const Ticket& tk, bool blocking, const CollectiveOptions& o, DataType t, ReduceOp op,
            Body body) {
  if (blocking && !tk.queued) {
    body();
    return {};
  }
  return p.start(tk.op, o, t, op, [&p, tk, blocking, body](const Coll&) {
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
    p.take(t, phase, 0, acc, bytes);
  }
  for (int r = 1; r < n; ++r) {
    const void* x = mine;
    if (r != me) {
      p.take(t, phase, r, part, bytes);
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
  for (int k = 1; k < n; ++k) p.post(t, 0, (me + k) % n, send, bytes);
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
    p.post(t, 0, b, in + off * es, len * es);
  }
  const auto [off, len] = block_of(count, n, me);
  alignas(64) std::byte acc[CollectivePort::kMailboxBytes];
  reduce_parts(p, t, 0, in + off * es, acc, len, dt, op);
  for (int k = 1; k < n; ++k) p.post(t, 1, (me + k) % n, acc, len * es);
  // Only now: in place, recv is send, whose blocks went out above.
  if (len) std::memcpy(out + off * es, acc, len * es);
  for (int k = 1; k < n; ++k) {
    const int b = (me + k) % n;
    const auto [boff, blen] = block_of(count, n, b);
    p.take(t, 1, b, out + boff * es, blen * es);
  }
}

}  // namespace

std::optional<CollectivePort::Ticket> mailbox_path(CollectivePort& p, const char* op, std::size_t bytes,
                                                   const CollectiveOptions& o, bool blocking, bool fits) {
  if (o.algorithm != Algorithm::automatic || p.size() < 2 || !fits) return std::nullopt;
  return p.mailboxes(op, bytes, o, blocking);
}

std::optional<Request> small_all_reduce(CollectivePort& p, bool blocking, const void* send, void* recv,
                                        std::size_t count, DataType t, ReduceOp op, const CollectiveOptions& o) {
  const std::size_t n = static_cast<std::size_t>(p.size()), bytes = count * size_of(t);
  const bool one = bytes <= kOneRoundBytes && bytes * (n - 1) <= kFanOutBytes;
  const bool two = block_of(count, p.size(), 0).second * size_of(t) <= CollectivePort::kMailboxBytes &&
                   2 * bytes <= kFanOutBytes;
  auto tk = mailbox_path(p, "all_reduce", bytes, o, blocking, one || two);
  if (!tk) return std::nullopt;
  return run(p, *tk, blocking, o, t, op, [&p, tk = *tk, send, recv, count, t, op, one] {
    if (one) return all_reduce_one_round(p, tk, send, recv, count, t, op);
    all_reduce_two_rounds(p, tk, send, recv, count, t, op);
  });
}

std::optional<Request> small_broadcast(CollectivePort& p, bool blocking, void* buf, std::size_t count, DataType t,
                                       int root, const CollectiveOptions& o) {
  const std::size_t bytes = count * size_of(t);
  const bool fits = bytes <= CollectivePort::kMailboxBytes &&
                    bytes * static_cast<std::size_t>(p.size() - 1) <= kFanOutBytes;
  auto tk = mailbox_path(p, "broadcast", bytes, o, blocking, fits);
  if (!tk) return std::nullopt;
  return run(p, *tk, blocking, o, t, ReduceOp::sum, [&p, tk = *tk, buf, bytes, root] {
    const int n = p.size();
    if (p.rank() != root) return p.take(tk, 0, root, buf, bytes);
    for (int k = 1; k < n; ++k) p.post(tk, 0, (root + k) % n, buf, bytes);
  });
}

std::optional<Request> small_barrier(CollectivePort& p, bool blocking, const CollectiveOptions& o) {
  auto tk = mailbox_path(p, "barrier", 0, o, blocking, true);
  if (!tk) return std::nullopt;
  return run(p, *tk, blocking, o, DataType::u8, ReduceOp::sum, [&p, tk = *tk] {
    const int n = p.size(), me = p.rank();
    for (int k = 1; k < n; ++k) p.post(tk, 0, (me + k) % n, nullptr, 0);
    for (int k = 1; k < n; ++k) p.take(tk, 0, (me + k) % n, nullptr, 0);
  });
}

}  // namespace coll
}  // namespace nexar::detail
