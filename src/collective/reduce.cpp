// reduce to a root: binomial tree; each inner node adds its children's partial results.
#include <nexar/communicator.hpp>

#include <cstring>
#include <vector>

#include "collective/algorithms.hpp"
#include "collective/checks.hpp"
#include "collective/collectives.hpp"

namespace nexar::detail::coll {

void reduce(const Coll& c, const void* send, void* recv, std::size_t count, int root) {
  const int n = c.size();
  const int vr = (c.rank() - root + n) % n;
  auto real = [&](int v) { return (v + root) % n; };
  std::vector<std::byte> acc(c.bytes(count)), tmp(c.bytes(count));
  if (count) std::memcpy(acc.data(), send, c.bytes(count));
  for (int mask = 1; mask < n; mask <<= 1) {
    if (vr & mask) {
      c.send(real(vr - mask), acc.data(), c.bytes(count));
      return;
    }
    if (vr + mask < n) {
      c.recv(real(vr + mask), tmp.data(), c.bytes(count));
      c.accumulate(acc.data(), tmp.data(), count);
    }
  }
  c.finish(acc.data(), count);
  if (count) std::memcpy(recv, acc.data(), c.bytes(count));
}

Request ireduce(CollectivePort& p, const void* send, void* recv, std::size_t count, DataType t,
                ReduceOp op, int root, const CollectiveOptions& o) {
  const char* name = "reduce";
  check_root(p, name, root);
  check_op(p, name, t, op);
  check_buffer(p, name, "send", send, count);
  if (p.rank() == root) check_buffer(p, name, "recv", recv, count);
  check_algorithm(p, name, o.algorithm, {Algorithm::tree});
  return p.start(name, o, t, op, {count, root}, [=](const Coll& c) { reduce(c, send, recv, count, root); });
}

}  // namespace nexar::detail::coll

namespace nexar {

Request Communicator::ireduce(const void* send, void* recv, std::size_t count, DataType t, ReduceOp op,
                              int root, const CollectiveOptions& o) {
  return detail::coll::ireduce(port(), send, recv, count, t, op, root, o);
}

}  // namespace nexar
