// gather / gather_v: the root receives from every rank directly, all transfers in flight
// at once.
#include <nexar/communicator.hpp>

#include <cstring>

#include "collective/algorithms.hpp"
#include "collective/checks.hpp"
#include "collective/collectives.hpp"

namespace nexar::detail::coll {

void gather_v(const Coll& c, const void* send, std::size_t send_count, void* recv,
              std::span<const std::size_t> counts, std::span<const std::size_t> displs, int root) {
  if (c.rank() != root) {
    c.send(root, send, c.bytes(send_count));
    return;
  }
  Requests reqs;
  for (int i = 0; i < c.size(); ++i) {
    auto ui = static_cast<std::size_t>(i);
    if (i == root) {
      if (send_count && at(recv, c.bytes(displs[ui])) != send)
        std::memmove(at(recv, c.bytes(displs[ui])), send, c.bytes(send_count));
      continue;
    }
    reqs.push_back(c.irecv(i, at(recv, c.bytes(displs[ui])), c.bytes(counts[ui])));
  }
  Coll::wait_all(reqs);
}

Request igather(CollectivePort& p, const void* send, void* recv, std::size_t count, DataType t,
                int root, const CollectiveOptions& o) {
  const char* name = "gather";
  check_root(p, name, root);
  check_buffer(p, name, "send", send, count);
  if (p.rank() == root) check_buffer(p, name, "recv", recv, count);
  check_algorithm(p, name, o.algorithm, {Algorithm::linear});
  auto [counts, displs] = uniform_layout(p.size(), count);
  return p.start(name, o, t, ReduceOp::sum, {count, root},
                 [=, counts = counts, displs = displs](const Coll& c) { gather_v(c, send, count, recv, *counts, *displs, root); });
}

Request igather_v(CollectivePort& p, const void* send, std::size_t send_count, void* recv,
                  Counts counts, Counts displs, DataType t, int root, const CollectiveOptions& o) {
  const char* name = "gather_v";
  check_root(p, name, root);
  check_buffer(p, name, "send", send, send_count);
  auto [cs, ds] = root_layout(p, name, root, counts, displs, "send_count", send_count);
  check_algorithm(p, name, o.algorithm, {Algorithm::linear});
  return p.start(name, o, t, ReduceOp::sum, {send_count, root},
                 [=, cs = cs, ds = ds](const Coll& c) { gather_v(c, send, send_count, recv, *cs, *ds, root); });
}

}  // namespace nexar::detail::coll

namespace nexar {

Request Communicator::igather(const void* send, void* recv, std::size_t count, DataType t, int root,
                              const CollectiveOptions& o) {
  return detail::coll::igather(port(), send, recv, count, t, root, o);
}
Request Communicator::igather_v(const void* send, std::size_t send_count, void* recv,
                                std::span<const std::size_t> counts, std::span<const std::size_t> displs,
                                DataType t, int root, const CollectiveOptions& o) {
  return detail::coll::igather_v(port(), send, send_count, recv, counts, displs, t, root, o);
}

}  // namespace nexar
