// Pipelined rings. Every block is cut into segments of c.segment_elems() elements; the
// cut depends only on the block's index, so sender and receiver always agree. A segment
// is forwarded to the next rank as soon as it has been received (and reduced), so the
// reduction of one segment overlaps the transfer of the next, across steps too.
#include <algorithm>
#include <cstring>
#include <vector>

#include "collective/algorithms.hpp"

namespace nexar::detail::coll {

namespace {

int mod(int a, int n) { return ((a % n) + n) % n; }

// Scratch a ring reduce-scatter may use to post its receives ahead (see there).
constexpr std::size_t kRingScratch = 64u << 20;

struct Segments {
  std::size_t off, len, seg;
  std::size_t count() const { return len == 0 ? 0 : (len + seg - 1) / seg; }
  std::pair<std::size_t, std::size_t> at(std::size_t j) const {
    std::size_t o = j * seg;
    return {off + o, std::min(seg, len - o)};
  }
};

}  // namespace

void ring_reduce_scatter(const Coll& c, void* data, const BlockFn& block, const void* local) {
  const Step phase(c, "reduce-scatter (ring)");
  const int n = c.size(), r = c.rank();
  if (!local) local = data;
  if (n == 1) {
    if (local != data) {
      auto [off, len] = block(0);
      if (len) std::memmove(at(data, c.bytes(off)), at(local, c.bytes(off)), c.bytes(len));
    }
    return;
  }
  const int next = mod(r + 1, n), prev = mod(r - 1, n);
  const std::size_t seg = c.segment_elems();
  // At step s rank r sends block r-1-s and receives block r-2-s; after n-1 steps the
  // block it received last, block r, has been reduced by every rank.
  auto seg_of = [&](int step, bool sending) {
    auto [off, len] = block(mod(r - (sending ? 1 : 2) - step, n));
    return Segments{off, len, seg};
  };
  std::size_t max_len = 0;
  for (int b = 0; b < n; ++b) max_len = std::max(max_len, block(b).second);
  // Step s receives into scratch area s % areas, with receives posted `areas` - 1 steps
  // ahead: a neighbour running ahead then lands in place instead of being buffered as an
  // unexpected message (an allocation and a second copy). One area per step up to
  // kRingScratch bytes, at least two (one being received while the other is reduced)
  // unless there is only one step.
  const std::size_t area = c.bytes(max_len);
  const std::size_t fit = area ? kRingScratch / area : static_cast<std::size_t>(n);
  const int areas = static_cast<int>(std::clamp<std::size_t>(fit, std::min(2, n - 1), n - 1));
  std::byte* const scratch = c.scratch(0, static_cast<std::size_t>(areas) * area);
  std::vector<Requests> recvs(static_cast<std::size_t>(n));
  auto post_recvs = [&](int step) {
    Segments sg = seg_of(step, false);
    std::byte* base = scratch + static_cast<std::size_t>(step % areas) * area;
    for (std::size_t j = 0; j < sg.count(); ++j) {
      auto [o, l] = sg.at(j);
      recvs[static_cast<std::size_t>(step)].push_back(
          c.irecv(prev, base + c.bytes(o - sg.off), c.bytes(l)));
    }
  };
  Requests sends;
  for (int s = 0; s < std::min(areas - 1, n - 1); ++s) post_recvs(s);
  Segments first = seg_of(0, true);
  for (std::size_t j = 0; j < first.count(); ++j) {
    auto [o, l] = first.at(j);
    sends.push_back(c.isend(next, at(local, c.bytes(o)), c.bytes(l)));
  }
  for (int s = 0; s < n - 1; ++s) {
    // Area (s - 1) % areas is free again: step s - 1 finished with it.
    if (s + areas - 1 < n - 1) post_recvs(s + areas - 1);
    Segments sg = seg_of(s, false);
    const std::byte* base = scratch + static_cast<std::size_t>(s % areas) * area;
    auto& rs = recvs[static_cast<std::size_t>(s)];
    for (std::size_t j = 0; j < sg.count(); ++j) {
      rs[j].wait();
      auto [o, l] = sg.at(j);
      // Every block but r-1 is reduced here exactly once, with this rank's contribution
      // on the left, as accumulate() would put it.
      if (local == data) {
        c.accumulate(at(data, c.bytes(o)), base + c.bytes(o - sg.off), l);
      } else {
        c.combine(at(data, c.bytes(o)), at(local, c.bytes(o)), base + c.bytes(o - sg.off), l);
      }
      // Step s+1 sends exactly this block: forward the segment now.
      if (s + 1 < n - 1) sends.push_back(c.isend(next, at(data, c.bytes(o)), c.bytes(l)));
    }
    rs.clear();
    // Keep the number of sends in flight bounded by about two steps.
    if (sends.size() > 4 * sg.count() + 8) Coll::wait_all(sends);
  }
  Coll::wait_all(sends);
}

void ring_all_gather(const Coll& c, void* data, const BlockFn& block) {
  const Step phase(c, "all-gather (ring)");
  const int n = c.size(), r = c.rank();
  if (n == 1) return;
  const int next = mod(r + 1, n), prev = mod(r - 1, n);
  const std::size_t seg = c.segment_elems();
  // Step s sends block r-s and receives block r-1-s straight into place; a received
  // segment is forwarded at once (step s+1 sends it).
  std::vector<Requests> recvs(static_cast<std::size_t>(n));
  for (int s = 0; s < n - 1; ++s) {
    auto [off, len] = block(mod(r - 1 - s, n));
    Segments sg{off, len, seg};
    for (std::size_t j = 0; j < sg.count(); ++j) {
      auto [o, l] = sg.at(j);
      recvs[static_cast<std::size_t>(s)].push_back(c.irecv(prev, at(data, c.bytes(o)), c.bytes(l)));
    }
  }
  Requests sends;
  {
    auto [off, len] = block(r);
    Segments sg{off, len, seg};
    for (std::size_t j = 0; j < sg.count(); ++j) {
      auto [o, l] = sg.at(j);
      sends.push_back(c.isend(next, at(data, c.bytes(o)), c.bytes(l)));
    }
  }
  for (int s = 0; s < n - 1; ++s) {
    auto [off, len] = block(mod(r - 1 - s, n));
    Segments sg{off, len, seg};
    auto& rs = recvs[static_cast<std::size_t>(s)];
    for (std::size_t j = 0; j < sg.count(); ++j) {
      rs[j].wait();
      if (s + 1 < n - 1) {
        auto [o, l] = sg.at(j);
        sends.push_back(c.isend(next, at(data, c.bytes(o)), c.bytes(l)));
      }
    }
  }
  Coll::wait_all(sends);
}

}  // namespace nexar::detail::coll
