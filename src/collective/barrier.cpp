// barrier: dissemination. In round k every rank signals rank r+2^k and waits for rank
// r-2^k; after ceil(log2 n) rounds every rank has heard, transitively, from all others.
// On a hypercube of a power-of-two size the rounds pair rank r with r xor 2^k instead, the
// same number of rounds over direct links only.
#include <nexar/communicator.hpp>

#include "collective/algorithms.hpp"
#include "collective/checks.hpp"
#include "collective/collectives.hpp"
#include "collective/mailbox_path.hpp"
#include "core/call_check.hpp"

namespace nexar::detail::coll {

void barrier(const Coll& c) {
  const int n = c.size(), r = c.rank();
  if (c.config().topology.kind == Topology::Kind::hypercube && (n & (n - 1)) == 0) {
    for (int k = 1; k < n; k <<= 1) c.sendrecv(r ^ k, nullptr, 0, r ^ k, nullptr, 0);
    return;
  }
  for (int k = 1; k < n; k <<= 1) c.sendrecv((r + k) % n, nullptr, 0, (r - k + n) % n, nullptr, 0);
}

namespace {
// The call's number in a fingerprint, found once.
constexpr unsigned kBarrierKind = call_kind("barrier");

// The mailbox form: every rank posts an empty message to every other and takes theirs.
std::optional<Request> through_mailboxes(CollectivePort& p, bool blocking, const CollectiveOptions& o) {
  auto tk = mailbox_path(p, "barrier", 0, o, blocking, true, call_check(kBarrierKind, DataType::u8, ReduceOp::sum), {});
  if (!tk) return std::nullopt;
  return mailbox_run(p, *tk, blocking, o, DataType::u8, ReduceOp::sum, [&p, tk = *tk] {
    const int n = p.size(), me = p.rank();
    for (int k = 1; k < n; ++k) p.post(tk, CollectivePort::part(0), (me + k) % n, nullptr, 0);
    for (int k = 1; k < n; ++k) p.take(tk, CollectivePort::part(0), (me + k) % n, nullptr, 0);
  });
}

Request call_barrier(CollectivePort& p, bool blocking, const CollectiveOptions& o) {
  check_algorithm(p, "barrier", o.algorithm, {Algorithm::dissemination});
  if (auto r = through_mailboxes(p, blocking, o)) return *r;
  return p.start("barrier", o, DataType::u8, ReduceOp::sum, {}, [](const Coll& c) { barrier(c); });
}
}  // namespace

Request ibarrier(CollectivePort& p, const CollectiveOptions& o) { return call_barrier(p, false, o); }

}  // namespace nexar::detail::coll

namespace nexar {

Request Communicator::ibarrier(const CollectiveOptions& o) { return detail::coll::ibarrier(port(), o); }
void Communicator::barrier(const CollectiveOptions& o) {
  BlockingCall b;
  detail::coll::call_barrier(port(), true, o).wait();
}

}  // namespace nexar
