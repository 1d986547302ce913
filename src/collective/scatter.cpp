// scatter / scatter_v: the root sends to every rank directly, all transfers in flight at
// once.
#include <nexar/communicator.hpp>

#include <cstring>

#include "collective/algorithms.hpp"
#include "collective/checks.hpp"
#include "collective/collectives.hpp"

namespace nexar::detail::coll {

void scatter_v(const Coll& c, const void* send, std::span<const std::size_t> counts,
               std::span<const std::size_t> displs, void* recv, std::size_t recv_count, int root) {
  if (c.rank() != root) {
    c.recv(root, recv, c.bytes(recv_count));
    return;
  }
  Requests reqs;
  for (int i = 0; i < c.size(); ++i) {
    auto ui = static_cast<std::size_t>(i);
    if (i == root) {
      if (recv_count && at(send, c.bytes(displs[ui])) != recv)
        std::memmove(recv, at(send, c.bytes(displs[ui])), c.bytes(recv_count));
      continue;
    }
    reqs.push_back(c.isend(i, at(send, c.bytes(displs[ui])), c.bytes(counts[ui])));
  }
  Coll::wait_all(reqs);
}

Request iscatter(CollectivePort& p, const void* send, void* recv, std::size_t count, DataType t,
                 int root, const CollectiveOptions& o) {
  const char* name = "scatter";
  check_root(p, name, root);
  if (p.rank() == root) check_buffer(p, name, "send", send, count);
  check_buffer(p, name, "recv", recv, count);
  check_algorithm(p, name, o.algorithm, {Algorithm::linear});
  auto [counts, displs] = uniform_layout(p.size(), count);
  return p.start(name, o, t, ReduceOp::sum, {count, root},
                 [=, counts = counts, displs = displs](const Coll& c) { scatter_v(c, send, *counts, *displs, recv, count, root); });
}

Request iscatter_v(CollectivePort& p, const void* send, Counts counts, Counts displs, void* recv,
                   std::size_t recv_count, DataType t, int root, const CollectiveOptions& o) {
  const char* name = "scatter_v";
  check_root(p, name, root);
  check_buffer(p, name, "recv", recv, recv_count);
  auto [cs, ds] = root_layout(p, name, root, counts, displs, "recv_count", recv_count);
  check_algorithm(p, name, o.algorithm, {Algorithm::linear});
  return p.start(name, o, t, ReduceOp::sum, {recv_count, root},
                 [=, cs = cs, ds = ds](const Coll& c) { scatter_v(c, send, *cs, *ds, recv, recv_count, root); });
}

}  // namespace nexar::detail::coll

namespace nexar {

Request Communicator::iscatter(const void* send, void* recv, std::size_t count, DataType t, int root,
                               const CollectiveOptions& o) {
  return detail::coll::iscatter(port(), send, recv, count, t, root, o);
}
Request Communicator::iscatter_v(const void* send, std::span<const std::size_t> counts,
                                 std::span<const std::size_t> displs, void* recv, std::size_t recv_count,
                                 DataType t, int root, const CollectiveOptions& o) {
  return detail::coll::iscatter_v(port(), send, counts, displs, recv, recv_count, t, root, o);
}

}  // namespace nexar
