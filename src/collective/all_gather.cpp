// all_gather / all_gather_v: the all-gather half of the ring (ring.cpp), each rank's block
// starting at its owner.
#include <cstring>
#include <vector>

#include "collective/algorithms.hpp"
#include "collective/checks.hpp"
#include "collective/collectives.hpp"

namespace nexar::detail::coll {

void all_gather_v(const Coll& c, const void* send, std::size_t send_count, void* recv,
                  std::span<const std::size_t> counts, std::span<const std::size_t> displs) {
  const std::size_t mine = displs[static_cast<std::size_t>(c.rank())];
  if (send_count && at(recv, c.bytes(mine)) != send)
    std::memmove(at(recv, c.bytes(mine)), send, c.bytes(send_count));
  ring_all_gather(c, recv, [counts, displs](int b) {
    return std::pair{displs[static_cast<std::size_t>(b)], counts[static_cast<std::size_t>(b)]};
  });
}

void all_gather(const Coll& c, const void* send, void* recv, std::size_t count) {
  std::vector<std::size_t> counts(static_cast<std::size_t>(c.size()), count), displs(counts.size());
  for (std::size_t i = 0; i < displs.size(); ++i) displs[i] = i * count;
  all_gather_v(c, send, count, recv, counts, displs);
}

namespace {
Request call_all_gather(CollectivePort& p, bool blocking, const void* send, void* recv, std::size_t count,
                        DataType t, const CollectiveOptions& o) {
  const char* name = "all_gather";
  check_buffer(p, name, "send", send, count);
  check_buffer(p, name, "recv", recv, count);
  check_algorithm(p, name, o.algorithm, {Algorithm::ring});
  if (auto r = small_all_gather(p, blocking, send, recv, count, t, o)) return *r;
  return p.start(name, o, t, ReduceOp::sum, {count, -1}, [=](const Coll& c) { all_gather(c, send, recv, count); });
}
}  // namespace

Request iall_gather(CollectivePort& p, const void* send, void* recv, std::size_t count, DataType t,
                    const CollectiveOptions& o) {
  return call_all_gather(p, false, send, recv, count, t, o);
}
void blocking_all_gather(CollectivePort& p, const void* send, void* recv, std::size_t count, DataType t,
                         const CollectiveOptions& o) {
  call_all_gather(p, true, send, recv, count, t, o).wait();
}

Request iall_gather_v(CollectivePort& p, const void* send, std::size_t send_count, void* recv,
                      Counts counts, Counts displs, DataType t, const CollectiveOptions& o) {
  const char* name = "all_gather_v";
  check_v(p, name, counts, displs);
  check_buffer(p, name, "send", send, send_count);
  check_own(p, name, "send_count", send_count, counts, p.rank());
  check_algorithm(p, name, o.algorithm, {Algorithm::ring});
  auto cs = copy_of(counts), ds = copy_of(displs);
  return p.start(name, o, t, ReduceOp::sum, {send_count, -1},
                 [=](const Coll& c) { all_gather_v(c, send, send_count, recv, *cs, *ds); });
}

}  // namespace nexar::detail::coll
