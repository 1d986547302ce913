#include "collective/context.hpp"

#include <algorithm>
#include <exception>

#include "reduce/reduce.hpp"

namespace nexar::detail {

std::size_t Coll::segment_elems() const noexcept {
  return std::max<std::size_t>(1, segment_bytes / elem());
}

Request Coll::isend(int to, const void* data, std::size_t bytes) const {
  return port.isend(name, tag, deadline, to, data, bytes);
}

Request Coll::irecv(int from, void* data, std::size_t bytes) const {
  return port.irecv(name, tag, deadline, from, data, bytes);
}

Requests::~Requests() {
  for (auto& r : *this)
    if (!r.test()) r.cancel();
  for (auto& r : *this) {
    try {
      r.wait();
    } catch (...) {
      // Already failing: the first error is what the caller reports.
    }
  }
}

void Coll::wait_all(Requests& reqs) {
  std::exception_ptr first;
  for (auto& r : reqs) {
    try {
      r.wait();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  reqs.clear();
  if (first) std::rethrow_exception(first);
}

void Coll::sendrecv(int to, const void* sdata, std::size_t sbytes, int from, void* rdata,
                    std::size_t rbytes) const {
  Requests r;
  r.push_back(irecv(from, rdata, rbytes));
  r.push_back(isend(to, sdata, sbytes));
  wait_all(r);
}

void Coll::accumulate(void* dst, const void* src, std::size_t n) const {
  reduce::accumulate(dtype, op, dst, src, n);
}

void Coll::combine(void* dst, const void* a, const void* b, std::size_t n) const {
  reduce::combine(dtype, op, dst, a, b, n);
}

void Coll::finish_over(void* data, std::size_t n, int ranks) const {
  reduce::finish(dtype, op, data, n, ranks);
}

}  // namespace nexar::detail
