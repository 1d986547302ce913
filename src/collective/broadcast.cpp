// broadcast: binomial tree (log2 n rounds) for small messages, pipelined chain for large
// ones (each link carries the data once, segments overlap along the chain).
#include <algorithm>

#include "collective/algorithms.hpp"
#include "collective/checks.hpp"
#include "collective/collectives.hpp"

namespace nexar::detail::coll {

namespace {

void tree(const Coll& c, void* buf, std::size_t count, int root) {
  const int n = c.size();
  const int vr = (c.rank() - root + n) % n;
  auto real = [&](int v) { return (v + root) % n; };
  int mask = 1;
  while (mask < n) {
    if (vr & mask) {
      c.recv(real(vr - mask), buf, c.bytes(count));
      break;
    }
    mask <<= 1;
  }
  Requests sends;
  for (mask >>= 1; mask > 0; mask >>= 1)
    if (vr + mask < n) sends.push_back(c.isend(real(vr + mask), buf, c.bytes(count)));
  Coll::wait_all(sends);
}

void chain(const Coll& c, void* buf, std::size_t count, int root) {
  const int n = c.size();
  const int vr = (c.rank() - root + n) % n;
  const int prev = (c.rank() - 1 + n) % n, next = (c.rank() + 1) % n;
  const std::size_t seg = c.segment_elems();
  const std::size_t nseg = (count + seg - 1) / seg;
  Requests recvs, sends;
  if (vr > 0)
    for (std::size_t j = 0; j < nseg; ++j) {
      std::size_t o = j * seg, l = std::min(seg, count - o);
      recvs.push_back(c.irecv(prev, at(buf, c.bytes(o)), c.bytes(l)));
    }
  for (std::size_t j = 0; j < nseg; ++j) {
    if (vr > 0) recvs[j].wait();
    if (vr + 1 < n) {
      std::size_t o = j * seg, l = std::min(seg, count - o);
      sends.push_back(c.isend(next, at(buf, c.bytes(o)), c.bytes(l)));
    }
  }
  Coll::wait_all(sends);
}

}  // namespace

void broadcast(const Coll& c, void* buf, std::size_t count, int root) {
  if (c.size() == 1 || count == 0) return;
  Algorithm a = c.algorithm;
  if (a == Algorithm::automatic)
    a = c.bytes(count) < c.config().tuning.broadcast_chain_bytes ? Algorithm::tree : Algorithm::ring;
  if (a == Algorithm::tree) {
    tree(c, buf, count, root);
  } else {
    chain(c, buf, count, root);
  }
}

namespace {
Request call_broadcast(CollectivePort& p, bool blocking, void* buf, std::size_t count, DataType t, int root,
                       const CollectiveOptions& o) {
  const char* name = "broadcast";
  check_root(p, name, root);
  check_buffer(p, name, "", buf, count);
  check_algorithm(p, name, o.algorithm, {Algorithm::tree, Algorithm::ring});
  if (auto r = small_broadcast(p, blocking, buf, count, t, root, o)) return *r;
  return p.start(name, o, t, ReduceOp::sum, {count, root}, [=](const Coll& c) { broadcast(c, buf, count, root); });
}
}  // namespace

Request ibroadcast(CollectivePort& p, void* buf, std::size_t count, DataType t, int root,
                   const CollectiveOptions& o) {
  return call_broadcast(p, false, buf, count, t, root, o);
}
void blocking_broadcast(CollectivePort& p, void* buf, std::size_t count, DataType t, int root,
                        const CollectiveOptions& o) {
  call_broadcast(p, true, buf, count, t, root, o).wait();
}

}  // namespace nexar::detail::coll
