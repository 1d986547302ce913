// all_to_all(_v): pairwise exchange; in step s rank r sends to r+s and receives from r-s,
// so every step is a perfect matching and no rank is flooded.
#include <nexar/communicator.hpp>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "collective/algorithms.hpp"
#include "collective/checks.hpp"
#include "collective/collectives.hpp"

namespace nexar::detail::coll {

void all_to_all_v(const Coll& c, const void* send, std::span<const std::size_t> send_counts,
                  std::span<const std::size_t> send_displs, void* recv,
                  std::span<const std::size_t> recv_counts, std::span<const std::size_t> recv_displs) {
  const int n = c.size(), r = c.rank();
  const auto ur = static_cast<std::size_t>(r);
  // In place (send and recv overlap): exchanged blocks would overwrite blocks not yet
  // sent, so send from a copy.
  std::vector<std::byte> copy;
  std::size_t send_end = 0, recv_end = 0;
  for (std::size_t i = 0; i < send_counts.size(); ++i) {
    send_end = std::max(send_end, c.bytes(send_displs[i] + send_counts[i]));
    recv_end = std::max(recv_end, c.bytes(recv_displs[i] + recv_counts[i]));
  }
  const auto* s0 = static_cast<const std::byte*>(send);
  const auto* r0 = static_cast<const std::byte*>(recv);
  if (send_end && recv_end && s0 < r0 + recv_end && r0 < s0 + send_end) {
    copy.assign(s0, s0 + send_end);
    send = copy.data();
  }
  if (send_counts[ur])
    std::memmove(at(recv, c.bytes(recv_displs[ur])), at(send, c.bytes(send_displs[ur])),
                 c.bytes(send_counts[ur]));
  for (int s = 1; s < n; ++s) {
    const auto to = static_cast<std::size_t>((r + s) % n), from = static_cast<std::size_t>((r - s + n) % n);
    c.sendrecv(static_cast<int>(to), at(send, c.bytes(send_displs[to])), c.bytes(send_counts[to]),
               static_cast<int>(from), at(recv, c.bytes(recv_displs[from])), c.bytes(recv_counts[from]));
  }
}

Request iall_to_all(CollectivePort& p, const void* send, void* recv, std::size_t count, DataType t,
                    const CollectiveOptions& o) {
  const char* name = "all_to_all";
  check_buffer(p, name, "send", send, count);
  check_buffer(p, name, "recv", recv, count);
  check_algorithm(p, name, o.algorithm, {Algorithm::pairwise});
  auto [counts, displs] = uniform_layout(p.size(), count);
  return p.start(name, o, t, ReduceOp::sum, {count, -1}, [=, counts = counts, displs = displs](const Coll& c) {
    all_to_all_v(c, send, *counts, *displs, recv, *counts, *displs);
  });
}

Request iall_to_all_v(CollectivePort& p, const void* send, Counts send_counts, Counts send_displs,
                      void* recv, Counts recv_counts, Counts recv_displs, DataType t,
                      const CollectiveOptions& o) {
  const char* name = "all_to_all_v";
  check_v(p, name, send_counts, send_displs);
  check_v(p, name, recv_counts, recv_displs);
  check_own(p, name, "send_counts[rank]", send_counts[static_cast<std::size_t>(p.rank())], recv_counts,
            p.rank());
  check_algorithm(p, name, o.algorithm, {Algorithm::pairwise});
  auto sc = copy_of(send_counts), sd = copy_of(send_displs), rc = copy_of(recv_counts),
       rd = copy_of(recv_displs);
  return p.start(name, o, t, ReduceOp::sum, {std::accumulate(send_counts.begin(), send_counts.end(), std::uint64_t{0}), -1},
                 [=](const Coll& c) { all_to_all_v(c, send, *sc, *sd, recv, *rc, *rd); });
}

}  // namespace nexar::detail::coll

namespace nexar {

Request Communicator::iall_to_all(const void* send, void* recv, std::size_t count, DataType t,
                                  const CollectiveOptions& o) {
  return detail::coll::iall_to_all(port(), send, recv, count, t, o);
}
Request Communicator::iall_to_all_v(const void* send, std::span<const std::size_t> send_counts,
                                    std::span<const std::size_t> send_displs, void* recv,
                                    std::span<const std::size_t> recv_counts,
                                    std::span<const std::size_t> recv_displs, DataType t,
                                    const CollectiveOptions& o) {
  return detail::coll::iall_to_all_v(port(), send, send_counts, send_displs, recv, recv_counts, recv_displs, t, o);
}

}  // namespace nexar
