// all_to_all(_v): pairwise exchange; in step s rank r sends to r+s and receives from r-s,
// so every step is a perfect matching and no rank is flooded.
#include <cstring>

#include "collective/algorithms.hpp"

namespace nexar::detail::coll {

void all_to_all_v(const Coll& c, const void* send, std::span<const std::size_t> send_counts,
                  std::span<const std::size_t> send_displs, void* recv,
                  std::span<const std::size_t> recv_counts, std::span<const std::size_t> recv_displs) {
  const int n = c.size(), r = c.rank();
  const auto ur = static_cast<std::size_t>(r);
  if (send_counts[ur])
    std::memmove(at(recv, c.bytes(recv_displs[ur])), at(send, c.bytes(send_displs[ur])),
                 c.bytes(send_counts[ur]));
  for (int s = 1; s < n; ++s) {
    const auto to = static_cast<std::size_t>((r + s) % n), from = static_cast<std::size_t>((r - s + n) % n);
    c.sendrecv(static_cast<int>(to), at(send, c.bytes(send_displs[to])), c.bytes(send_counts[to]),
               static_cast<int>(from), at(recv, c.bytes(recv_displs[from])), c.bytes(recv_counts[from]));
  }
}

}  // namespace nexar::detail::coll
