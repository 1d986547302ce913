// barrier: dissemination. In round k every rank signals rank r+2^k and waits for rank
// r-2^k; after ceil(log2 n) rounds every rank has heard, transitively, from all others.
#include "collective/algorithms.hpp"
#include "collective/checks.hpp"
#include "collective/collectives.hpp"

namespace nexar::detail::coll {

void barrier(const Coll& c) {
  const int n = c.size(), r = c.rank();
  for (int k = 1; k < n; k <<= 1) c.sendrecv((r + k) % n, nullptr, 0, (r - k + n) % n, nullptr, 0);
}

Request ibarrier(CollectivePort& p, const CollectiveOptions& o) {
  check_algorithm(p, "barrier", o.algorithm, {Algorithm::dissemination});
  return p.start("barrier", o, DataType::u8, ReduceOp::sum, [](const Coll& c) { barrier(c); });
}

}  // namespace nexar::detail::coll
