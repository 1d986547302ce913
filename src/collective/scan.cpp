// scan / exclusive_scan: a chain from rank 0 upward; rank r combines the prefix of ranks
// below it with its own contribution and passes the result on.
#include <cstring>
#include <vector>

#include "collective/algorithms.hpp"

namespace nexar::detail::coll {

void scan(const Coll& c, const void* send, void* recv, std::size_t count, bool exclusive) {
  const int r = c.rank(), n = c.size();
  std::vector<std::byte> prefix(c.bytes(count)), mine(c.bytes(count));
  if (count) std::memcpy(mine.data(), send, c.bytes(count));
  if (r > 0) {
    c.recv(r - 1, prefix.data(), c.bytes(count));
    if (exclusive && count) std::memcpy(recv, prefix.data(), c.bytes(count));
    // prefix(0..r-1) op own, in rank order.
    c.accumulate(prefix.data(), mine.data(), count);
  } else {
    prefix = mine;
  }
  if (r + 1 < n) c.send(r + 1, prefix.data(), c.bytes(count));
  if (!exclusive && count) std::memcpy(recv, prefix.data(), c.bytes(count));
}

}  // namespace nexar::detail::coll
