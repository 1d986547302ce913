// all_gather / all_gather_v: the all-gather half of the ring (ring.cpp), each rank's block
// starting at its owner.
#include <nexar/communicator.hpp>

#include <cstring>
#include <vector>

#include "collective/algorithms.hpp"
#include "collective/checks.hpp"
#include "collective/collectives.hpp"
#include "collective/mailbox_path.hpp"
#include "core/call_check.hpp"

namespace nexar::detail::coll {

void all_gather_v(const Coll& c, const void* send, std::size_t send_count, void* recv,
                  std::span<const std::size_t> counts, std::span<const std::size_t> displs) {
  const std::size_t mine = displs[static_cast<std::size_t>(c.rank())];
  if (send_count && at(recv, c.bytes(mine)) != send)
    std::memmove(at(recv, c.bytes(mine)), send, c.bytes(send_count));
  ring_all_gather(c, recv, [counts, displs](int b) {
    return std::pair{displs[static_cast<std::size_t>(b)], counts[static_cast<std::size_t>(b)]};
  });
}

void all_gather(const Coll& c, const void* send, void* recv, std::size_t count) {
  std::vector<std::size_t> counts(static_cast<std::size_t>(c.size()), count), displs(counts.size());
  for (std::size_t i = 0; i < displs.size(); ++i) displs[i] = i * count;
  all_gather_v(c, send, count, recv, counts, displs);
}

namespace {
// The mailbox form, up to kAllGatherMostBytes (the whole result): with 4 processes on 2
// cores it was 1.3-2x faster than the ring up to 512 KiB, and as fast as the ring's
// forwarding from 1 to 16 MiB (3 alternating runs).
constexpr std::size_t kAllGatherMostBytes = std::size_t{1} << 20;
// The call's number in a fingerprint, found once.
constexpr unsigned kAllGatherKind = call_kind("all_gather");

std::optional<Request> through_mailboxes(CollectivePort& p, bool blocking, const void* send, void* recv,
                                         std::size_t count, DataType t, const CollectiveOptions& o) {
  const std::size_t n = static_cast<std::size_t>(p.size()), bytes = n * count * size_of(t);
  auto tk = mailbox_path(p, "all_gather", bytes, o, blocking, chunks_fit(p, bytes) && bytes <= kAllGatherMostBytes,
                         call_check(kAllGatherKind, t, ReduceOp::sum), {count, -1});
  if (!tk) return std::nullopt;
  return mailbox_run(p, *tk, blocking, o, t, ReduceOp::sum, [&p, tk = *tk, send, recv, count, n, t] {
    const std::size_t block = count * size_of(t);
    std::byte* own = static_cast<std::byte*>(recv) + static_cast<std::size_t>(p.rank()) * block;
    // Before any block arrives, and sent from there: a send buffer inside recv is read
    // before anything lands on it.
    if (block && own != send) std::memmove(own, send, block);
    exchange_in_chunks(p, tk, Chunked{n * count, nullptr, nullptr, own, static_cast<std::byte*>(recv)}, t,
                       ReduceOp::sum);
  });
}

Request call_all_gather(CollectivePort& p, bool blocking, const void* send, void* recv, std::size_t count,
                        DataType t, const CollectiveOptions& o) {
  const char* name = "all_gather";
  check_buffer(p, name, "send", send, count);
  check_buffer(p, name, "recv", recv, count);
  check_algorithm(p, name, o.algorithm, {Algorithm::ring});
  if (auto r = through_mailboxes(p, blocking, send, recv, count, t, o)) return *r;
  return p.start(name, o, t, ReduceOp::sum, {count, -1}, [=](const Coll& c) { all_gather(c, send, recv, count); });
}
}  // namespace

Request iall_gather(CollectivePort& p, const void* send, void* recv, std::size_t count, DataType t,
                    const CollectiveOptions& o) {
  return call_all_gather(p, false, send, recv, count, t, o);
}

Request iall_gather_v(CollectivePort& p, const void* send, std::size_t send_count, void* recv,
                      Counts counts, Counts displs, DataType t, const CollectiveOptions& o) {
  const char* name = "all_gather_v";
  check_v(p, name, counts, displs);
  check_buffer(p, name, "send", send, send_count);
  check_own(p, name, "send_count", send_count, counts, p.rank());
  check_algorithm(p, name, o.algorithm, {Algorithm::ring});
  auto cs = copy_of(counts), ds = copy_of(displs);
  return p.start(name, o, t, ReduceOp::sum, {send_count, -1},
                 [=](const Coll& c) { all_gather_v(c, send, send_count, recv, *cs, *ds); });
}

}  // namespace nexar::detail::coll

namespace nexar {

Request Communicator::iall_gather(const void* send, void* recv, std::size_t count, DataType t,
                                  const CollectiveOptions& o) {
  return detail::coll::iall_gather(port(), send, recv, count, t, o);
}
void Communicator::all_gather(const void* send, void* recv, std::size_t count, DataType t,
                              const CollectiveOptions& o) {
  BlockingCall b;
  detail::coll::call_all_gather(port(), true, send, recv, count, t, o).wait();
}
Request Communicator::iall_gather_v(const void* send, std::size_t send_count, void* recv,
                                    std::span<const std::size_t> counts,
                                    std::span<const std::size_t> displs, DataType t,
                                    const CollectiveOptions& o) {
  return detail::coll::iall_gather_v(port(), send, send_count, recv, counts, displs, t, o);
}

}  // namespace nexar
