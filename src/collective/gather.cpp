// gather / gather_v and scatter / scatter_v: the root exchanges with every rank directly,
// all transfers in flight at once.
#include <cstring>

#include "collective/algorithms.hpp"

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

}  // namespace nexar::detail::coll
