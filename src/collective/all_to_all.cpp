// all_to_all(_v): pairwise exchange; in step s rank r sends to r+s and receives from r-s,
// so every step is a perfect matching and no rank is flooded.
#include <algorithm>
#include <cstring>
#include <vector>

#include "collective/algorithms.hpp"

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

}  // namespace nexar::detail::coll
