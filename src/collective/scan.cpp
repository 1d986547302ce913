// scan / exclusive_scan: a chain from rank 0 upward; rank r combines the prefix of ranks
// below it with its own contribution and passes the result on.
#include <nexar/communicator.hpp>

#include <cstring>
#include <vector>

#include "collective/algorithms.hpp"
#include "collective/checks.hpp"
#include "collective/collectives.hpp"

namespace nexar::detail::coll {

void scan(const Coll& c, const void* send, void* recv, std::size_t count, bool exclusive) {
  const int r = c.rank(), n = c.size();
  std::vector<std::byte> prefix(c.bytes(count)), mine(c.bytes(count));
  if (count) std::memcpy(mine.data(), send, c.bytes(count));
  // The chain carries the raw prefix (for avg: the sum); each rank's output is finished
  // over the number of ranks it covers (avg: divided by it).
  if (r > 0) {
    c.recv(r - 1, prefix.data(), c.bytes(count));
    if (exclusive && count) {
      std::memcpy(recv, prefix.data(), c.bytes(count));
      c.finish_over(recv, count, r);
    }
    // prefix(0..r-1) op own, in rank order.
    c.accumulate(prefix.data(), mine.data(), count);
  } else {
    prefix = mine;
  }
  if (r + 1 < n) c.send(r + 1, prefix.data(), c.bytes(count));
  if (!exclusive && count) {
    std::memcpy(recv, prefix.data(), c.bytes(count));
    c.finish_over(recv, count, r + 1);
  }
}

Request iscan(CollectivePort& p, const void* send, void* recv, std::size_t count, DataType t,
              ReduceOp op, bool exclusive, const CollectiveOptions& o) {
  const char* name = exclusive ? "exclusive_scan" : "scan";
  check_op(p, name, t, op);
  check_buffer(p, name, "send", send, count);
  check_buffer(p, name, "recv", recv, count);
  check_algorithm(p, name, o.algorithm, {Algorithm::linear});
  return p.start(name, o, t, op, {count, -1}, [=](const Coll& c) { scan(c, send, recv, count, exclusive); });
}

}  // namespace nexar::detail::coll

namespace nexar {

Request Communicator::iscan(const void* send, void* recv, std::size_t count, DataType t, ReduceOp op,
                            const CollectiveOptions& o) {
  return detail::coll::iscan(port(), send, recv, count, t, op, false, o);
}
Request Communicator::iexclusive_scan(const void* send, void* recv, std::size_t count, DataType t,
                                      ReduceOp op, const CollectiveOptions& o) {
  return detail::coll::iscan(port(), send, recv, count, t, op, true, o);
}

}  // namespace nexar
