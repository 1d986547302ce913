// all_reduce, broadcast and barrier of a few hundred bytes on a communicator whose ranks
// share one host: through the mailboxes of the port (CollectivePort::mailboxes). Every
// rank posts its part to every other rank at once and takes theirs; at these sizes one
// round of n-1 copies beats log2(n) dependent steps. A blocking call runs it in the calling
// thread, with no collective thread, operation state or matching queue in the way; a
// non-blocking one runs it as a collective of the port.
#include <nexar/error.hpp>

#include <cstring>

#include "collective/algorithms.hpp"
#include "collective/checks.hpp"
#include "collective/collectives.hpp"
#include "reduce/reduce.hpp"

namespace nexar::detail {

void CollectivePort::post(const Ticket& t, int, const void*, std::size_t) {
  throw Error(Errc::invalid_argument, std::string(t.op) + ": this communicator has no mailboxes");
}
void CollectivePort::take(const Ticket& t, int, void*, std::size_t) {
  throw Error(Errc::invalid_argument, std::string(t.op) + ": this communicator has no mailboxes");
}

namespace coll {

namespace {

using Ticket = CollectivePort::Ticket;

constexpr std::size_t kFanOutBytes = std::size_t{64} << 10;

// Runs `body` here (blocking: the caller waits anyway, so no collective thread, operation
// state or Request is needed) or as a collective of the port.
template <class Body>
Request run(CollectivePort& p, const Ticket& tk, bool blocking, const CollectiveOptions& o, DataType t, ReduceOp op,
            Body body) {
  if (blocking) {
    body();
    return {};
  }
  return p.start(tk.op, o, t, op, [body](const Coll&) { body(); });
}

// Every rank reduces the n parts in rank order, (x0 op x1) op x2 ..., so all end with the
// same bits.
void exchange_all_reduce(CollectivePort& p, const Ticket& t, const void* send, void* recv, std::size_t count,
                         DataType dt, ReduceOp op) {
  const int n = p.size(), me = p.rank();
  const std::size_t bytes = count * size_of(dt);
  for (int k = 1; k < n; ++k) p.post(t, (me + k) % n, send, bytes);
  alignas(64) std::byte acc[CollectivePort::kMailboxBytes];
  alignas(64) std::byte part[CollectivePort::kMailboxBytes];
  if (me == 0) {
    if (bytes) std::memcpy(acc, send, bytes);
  } else {
    p.take(t, 0, acc, bytes);
  }
  for (int r = 1; r < n; ++r) {
    const void* x = send;
    if (r != me) {
      p.take(t, r, part, bytes);
      x = part;
    }
    reduce::accumulate(dt, op, acc, x, count);
  }
  reduce::finish(dt, op, acc, count, n);
  if (bytes) std::memcpy(recv, acc, bytes);
}

}  // namespace

std::optional<CollectivePort::Ticket> mailbox_path(CollectivePort& p, const char* op, std::size_t bytes,
                                                   const CollectiveOptions& o, bool blocking) {
  // Each rank copies its part out n-1 times: beyond kFanOutBytes in all, the ordinary
  // algorithms (about twice the part, in log2(n) or 2(n-1) steps) move less.
  const std::size_t others = static_cast<std::size_t>(p.size() - 1);
  if (o.algorithm != Algorithm::automatic || others == 0 || bytes > CollectivePort::kMailboxBytes ||
      bytes * others > kFanOutBytes)
    return std::nullopt;
  return p.mailboxes(op, bytes, o, blocking);
}

std::optional<Request> small_all_reduce(CollectivePort& p, bool blocking, const void* send, void* recv,
                                        std::size_t count, DataType t, ReduceOp op, const CollectiveOptions& o) {
  auto tk = mailbox_path(p, "all_reduce", count * size_of(t), o, blocking);
  if (!tk) return std::nullopt;
  return run(p, *tk, blocking, o, t, op,
             [&p, tk = *tk, send, recv, count, t, op] { exchange_all_reduce(p, tk, send, recv, count, t, op); });
}

std::optional<Request> small_broadcast(CollectivePort& p, bool blocking, void* buf, std::size_t count, DataType t,
                                       int root, const CollectiveOptions& o) {
  const std::size_t bytes = count * size_of(t);
  auto tk = mailbox_path(p, "broadcast", bytes, o, blocking);
  if (!tk) return std::nullopt;
  return run(p, *tk, blocking, o, t, ReduceOp::sum, [&p, tk = *tk, buf, bytes, root] {
    const int n = p.size();
    if (p.rank() != root) return p.take(tk, root, buf, bytes);
    for (int k = 1; k < n; ++k) p.post(tk, (root + k) % n, buf, bytes);
  });
}

std::optional<Request> small_barrier(CollectivePort& p, bool blocking, const CollectiveOptions& o) {
  auto tk = mailbox_path(p, "barrier", 0, o, blocking);
  if (!tk) return std::nullopt;
  return run(p, *tk, blocking, o, DataType::u8, ReduceOp::sum, [&p, tk = *tk] {
    const int n = p.size(), me = p.rank();
    for (int k = 1; k < n; ++k) p.post(tk, (me + k) % n, nullptr, 0);
    for (int k = 1; k < n; ++k) p.take(tk, (me + k) % n, nullptr, 0);
  });
}

}  // namespace coll
}  // namespace nexar::detail
