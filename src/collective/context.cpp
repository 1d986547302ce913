#include "collective/context.hpp"

#include <algorithm>
#include <exception>

#include "collective/runner.hpp"
#include "reduce/reduce.hpp"

namespace nexar::detail {

std::size_t Coll::segment_elems() const noexcept {
  return std::max<std::size_t>(1, segment_bytes / elem());
}

static std::chrono::milliseconds left(std::chrono::steady_clock::time_point deadline) {
  auto d = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  return std::max(d, std::chrono::milliseconds(1));
}

Request Coll::isend(int to, const void* data, std::size_t bytes) const {
  CommImpl::P2p a{Domain::collective, name, g.id(), tag, left(deadline), g.local_of()};
  const Config& cfg = g.node().config();
  a.eager_in_place = std::min({cfg.collective_eager_bytes, cfg.max_frame_bytes, cfg.stream_window, cfg.unexpected_limit});
  ConstBuffer b{data, bytes};
  return g.node().isend(a, g.world_of(to), std::span<const ConstBuffer>(&b, 1));
}

Request Coll::irecv(int from, void* data, std::size_t bytes) const {
  CommImpl::P2p a{Domain::collective, name, g.id(), tag, left(deadline), g.local_of(), true};
  return g.node().irecv(a, g.world_of(from), data, bytes);
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

std::byte* Coll::scratch(int slot, std::size_t bytes) const { return g.runner().scratch(slot, bytes); }

void Coll::finish_over(void* data, std::size_t n, int ranks) const {
  reduce::finish(dtype, op, data, n, ranks);
}

}  // namespace nexar::detail
