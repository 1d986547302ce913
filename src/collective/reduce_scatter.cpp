// reduce_scatter: the reduce-scatter half of the ring (ring.cpp); rank r ends with block r
// (block_of(count, n, r)) of the element-wise reduction.
#include <nexar/communicator.hpp>

#include <cstring>

#include "collective/algorithms.hpp"
#include "collective/checks.hpp"
#include "collective/collectives.hpp"
#include "collective/mailbox_path.hpp"
#include "core/call_check.hpp"

namespace nexar::detail::coll {

void reduce_scatter(const Coll& c, const void* send, void* recv, std::size_t count) {
  const int n = c.size();
  auto [off, len] = block_of(count, n, c.rank());
  if (n == 1) {
    if (count && send != recv) std::memmove(recv, send, c.bytes(count));
  } else {
    // The reductions land in scratch memory, so `send` stays untouched.
    std::byte* work = c.scratch(1, c.bytes(count));
    ring_reduce_scatter(c, work, [count, n](int b) { return block_of(count, n, b); }, send);
    if (len) std::memcpy(recv, work + c.bytes(off), c.bytes(len));
  }
  c.finish(recv, len);
}

namespace {
// The call's number in a fingerprint, found once.
constexpr unsigned kReduceScatterKind = call_kind("reduce_scatter");

// The mailbox form: the first round of exchange_in_chunks, in which each rank reduces its
// own block from every rank's part of it.
std::optional<Request> through_mailboxes(CollectivePort& p, bool blocking, const void* send, void* recv,
                                         std::size_t count, DataType t, ReduceOp op, const CollectiveOptions& o) {
  const std::size_t bytes = count * size_of(t);
  auto tk =
      mailbox_path(p, "reduce_scatter", bytes, o, blocking, chunks_fit(p, bytes), call_check(kReduceScatterKind, t, op),
                   {count, -1});
  if (!tk) return std::nullopt;
  return mailbox_run(p, *tk, blocking, o, t, op, [&p, tk = *tk, send, recv, count, t, op] {
    exchange_in_chunks(p, tk,
                       Chunked{count, static_cast<const std::byte*>(send), static_cast<std::byte*>(recv), nullptr, nullptr},
                       t, op);
  });
}

Request call_reduce_scatter(CollectivePort& p, bool blocking, const void* send, void* recv, std::size_t count,
                            DataType t, ReduceOp op, const CollectiveOptions& o) {
  const char* name = "reduce_scatter";
  check_op(p, name, t, op);
  check_buffer(p, name, "send", send, count);
  check_buffer(p, name, "recv", recv, block_of(count, p.size(), p.rank()).second);
  check_algorithm(p, name, o.algorithm, {Algorithm::ring});
  if (auto r = through_mailboxes(p, blocking, send, recv, count, t, op, o)) return *r;
  return p.start(name, o, t, op, {count, -1}, [=](const Coll& c) { reduce_scatter(c, send, recv, count); });
}
}  // namespace

Request ireduce_scatter(CollectivePort& p, const void* send, void* recv, std::size_t count,
                        DataType t, ReduceOp op, const CollectiveOptions& o) {
  return call_reduce_scatter(p, false, send, recv, count, t, op, o);
}

}  // namespace nexar::detail::coll

namespace nexar {

Request Communicator::ireduce_scatter(const void* send, void* recv, std::size_t count, DataType t,
                                      ReduceOp op, const CollectiveOptions& o) {
  return detail::coll::ireduce_scatter(port(), send, recv, count, t, op, o);
}
void Communicator::reduce_scatter(const void* send, void* recv, std::size_t count, DataType t, ReduceOp op,
                                  const CollectiveOptions& o) {
  BlockingCall b;
  detail::coll::call_reduce_scatter(port(), true, send, recv, count, t, op, o).wait();
}

}  // namespace nexar
