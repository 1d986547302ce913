// all_reduce: ring (reduce-scatter + all-gather, bandwidth-optimal) for large messages,
// recursive halving-doubling (about 2 log2 n messages) for middle sizes, recursive doubling
// (log2 n messages) for the smallest; any world size. Also the fused forms: bucketed (many
// buffers as one operation) and sharded (reduce-scatter + all-gather with the shard kept).
#include <nexar/communicator.hpp>

#include <algorithm>
#include <cstring>
#include <optional>
#include <memory>
#include <vector>

#include "collective/algorithms.hpp"
#include "collective/checks.hpp"
#include "collective/collectives.hpp"
#include "collective/hierarchy.hpp"
#include "collective/mailbox_path.hpp"
#include "core/call_check.hpp"
#include "reduce/reduce.hpp"

namespace nexar::detail::coll {

namespace {

// Buffers that share bytes without being the same buffer: the algorithms that read one
// while writing the other would see their own writes.
bool overlap(const Coll& c, const void* a, const void* b, std::size_t count) {
  const auto* x = static_cast<const std::byte*>(a);
  const auto* y = static_cast<const std::byte*>(b);
  return x != y && x < y + c.bytes(count) && y < x + c.bytes(count);
}

// Reads `send` where the first step needs this rank's data, so an out-of-place call costs
// no copy of the whole vector.
void ring(const Coll& c, const void* send, void* recv, std::size_t count) {
  const int n = c.size();
  BlockFn block = [count, n](int b) { return block_of(count, n, b); };
  ring_reduce_scatter(c, recv, block, send);
  ring_all_gather(c, recv, block);
}

// The power-of-two core of the recursive algorithms. With n not a power of two, the first
// 2*rem ranks pair up: each even one hands its data to its odd neighbour and waits; the
// p = n - rem remaining ranks run the power-of-two algorithm; the odd neighbours hand the
// result back. Every element's final value is computed on one rank or by the same
// operands in the same order on several, so all ranks end bitwise identical.
class Fold {
 public:
  // Runs the first step; participant() is false for a rank that handed its data over and
  // already holds the result.
  Fold(const Coll& c, void* data, std::size_t count, std::byte* tmp) : c_(c), data_(data), count_(count) {
    const int n = c.size(), r = c.rank();
    while (p_ * 2 <= n) p_ *= 2;
    rem_ = n - p_;
    if (r < 2 * rem_) {
      if (r % 2 == 0) {
        c.send(r + 1, data, c.bytes(count));
        c.recv(r + 1, data, c.bytes(count));
        return;
      }
      c.recv(r - 1, tmp, c.bytes(count));
      c.accumulate(data, tmp, count);
      vr_ = r / 2;
    } else {
      vr_ = r - rem_;
    }
  }
  // Hands the result back to the neighbour that sat out.
  void finish() const {
    if (vr_ >= 0 && c_.rank() < 2 * rem_) c_.send(c_.rank() - 1, data_, c_.bytes(count_));
  }
  bool participant() const noexcept { return vr_ >= 0; }
  int p() const noexcept { return p_; }
  int vr() const noexcept { return vr_; }  // rank among the p participants
  int real(int v) const noexcept { return v < rem_ ? 2 * v + 1 : v + rem_; }

 private:
  const Coll& c_;
  void* data_;
  std::size_t count_;
  int p_ = 1, rem_ = 0, vr_ = -1;
};

// Recursive halving-doubling: about 2 log2 n messages, each rank sending about 2x the data.
void halving_doubling(const Coll& c, void* data, std::size_t count) {
  std::byte* const tmp = c.scratch(0, c.bytes(count));
  Fold f(c, data, count, tmp);
  if (!f.participant()) return;
  const int p = f.p(), vr = f.vr();

  // Reduce-scatter by recursive halving: keep the half named by our bit, send the other.
  std::vector<std::pair<std::size_t, std::size_t>> ranges;  // [lo, hi) before each halving
  std::size_t lo = 0, hi = count;
  std::optional<Step> step(std::in_place, c, "reduce-scatter (halving)");
  for (int mask = p / 2; mask >= 1; mask /= 2) {
    const int partner = f.real(vr ^ mask);
    const std::size_t mid = lo + (hi - lo) / 2;
    ranges.emplace_back(lo, hi);
    const bool keep_low = (vr & mask) == 0;
    const std::size_t klo = keep_low ? lo : mid, khi = keep_low ? mid : hi;
    const std::size_t slo = keep_low ? mid : lo, shi = keep_low ? hi : mid;
    c.sendrecv(partner, at(data, c.bytes(slo)), c.bytes(shi - slo), partner, tmp, c.bytes(khi - klo));
    c.accumulate(at(data, c.bytes(klo)), tmp, khi - klo);
    lo = klo;
    hi = khi;
  }
  // All-gather by recursive doubling, retracing the halvings.
  step.emplace(c, "all-gather (doubling)");
  for (int mask = 1; mask < p; mask *= 2) {
    const int partner = f.real(vr ^ mask);
    auto [plo, phi] = ranges.back();
    ranges.pop_back();
    const std::size_t mid = plo + (phi - plo) / 2;
    const bool have_low = (vr & mask) == 0;
    const std::size_t olo = have_low ? mid : plo, ohi = have_low ? phi : mid;
    c.sendrecv(partner, at(data, c.bytes(lo)), c.bytes(hi - lo), partner, at(data, c.bytes(olo)),
               c.bytes(ohi - olo));
    lo = plo;
    hi = phi;
  }
  f.finish();
}

// Recursive doubling: log2 n rounds, each exchanging the whole vector; the fewest messages,
// for latency-bound sizes. Both partners of a round combine (lower half) op (upper half)
// in that order, so they hold the same bits afterwards.
void recursive_doubling(const Coll& c, void* data, std::size_t count) {
  std::byte* const tmp = c.scratch(0, c.bytes(count));
  Fold f(c, data, count, tmp);
  if (!f.participant()) return;
  const std::size_t bytes = c.bytes(count);
  const Step step(c, "exchange (doubling)");
  for (int mask = 1; mask < f.p(); mask *= 2) {
    const int partner = f.real(f.vr() ^ mask);
    c.sendrecv(partner, data, bytes, partner, tmp, bytes);
    if ((f.vr() & mask) == 0) {
      c.accumulate(data, tmp, count);
    } else {
      c.accumulate(tmp, data, count);
      std::memcpy(data, tmp, bytes);
    }
  }
  f.finish();
}

// Hierarchical: each host's ranks reduce into their leader (the lowest rank of the host),
// the leaders run the ring among themselves, and each leader hands the result back to its
// host. Inside a host the messages go through shared memory; between hosts only one
// rank's share of the ring crosses the network, where the flat ring sends several ranks'
// shares over each host's link. The vector goes in chunks (an eighth of it, at least a
// segment, at most 8 MiB over all the host's ranks together), so that while the leaders
// ring one chunk, the next is on its way up to them and the last one on its way back down.
// Works in `data` (the result's buffer), which holds this rank's contribution on entry.
void hierarchical(const Coll& c, void* data, std::size_t count, const Hierarchy& h) {
  const int leader = h.locals.front();
  const std::size_t others = h.locals.size() - 1;
  // The leader holds two chunks of each of the others' at once: 8 MiB in all bounds it.
  const std::size_t seg = std::max<std::size_t>(1, c.segment_elems());
  const std::size_t cap = std::max<std::size_t>(seg, (std::size_t{8} << 20) / std::max<std::size_t>(1, others) / c.elem());
  const std::size_t chunk = std::clamp<std::size_t>((count + 7) / 8, seg, cap);
  const std::size_t chunks = (count + chunk - 1) / chunk;
  auto span_of = [&](std::size_t j) { return std::pair{j * chunk, std::min(chunk, count - j * chunk)}; };

  const Step step(c, leader == c.rank() ? "host leader: reduce, ring, hand back (hierarchical)"
                                        : "to the host's leader and back (hierarchical)");
  if (leader != c.rank()) {
    // Everything goes up at once (it moves as the leader asks for it); results come back
    // chunk by chunk.
    Requests up;
    for (std::size_t j = 0; j < chunks; ++j) {
      auto [off, len] = span_of(j);
      up.push_back(c.isend(leader, at(data, c.bytes(off)), c.bytes(len)));
    }
    for (std::size_t j = 0; j < chunks; ++j) {
      auto [off, len] = span_of(j);
      c.recv(leader, at(data, c.bytes(off)), c.bytes(len));
    }
    Coll::wait_all(up);
    return;
  }

  // Two areas of `others` chunks: one being added in while the other fills.
  std::byte* const tmp = others ? c.scratch(2, 2 * others * c.bytes(chunk)) : nullptr;
  auto area = [&](std::size_t j, std::size_t i) { return tmp + ((j % 2) * others + i) * c.bytes(chunk); };
  Requests up, down;
  auto post = [&](std::size_t j) {
    auto [off, len] = span_of(j);
    for (std::size_t i = 0; i < others; ++i) up.push_back(c.irecv(h.locals[i + 1], area(j, i), c.bytes(len)));
  };
  std::optional<SubPort> among;
  if (h.leaders.size() > 1) among.emplace(c.port, h.leaders);
  post(0);
  for (std::size_t j = 0; j < chunks; ++j) {
    auto [off, len] = span_of(j);
    void* part = at(data, c.bytes(off));
    // A fixed order (ascending rank) for every element.
    for (std::size_t i = 0; i < others; ++i) {
      up[j * others + i].wait();
      c.accumulate(part, area(j, i), len);
    }
    if (j + 1 < chunks) post(j + 1);
    if (among) {
      Coll leaders{*among, c.name, c.tag, c.deadline, c.segment_bytes, c.algorithm, c.dtype, c.op};
      ring(leaders, part, part, len);
    }
    for (std::size_t i = 0; i < others; ++i) down.push_back(c.isend(h.locals[i + 1], part, c.bytes(len)));
  }
  Coll::wait_all(up);
  Coll::wait_all(down);
}

}  // namespace

void all_reduce(const Coll& c, const void* send, void* recv, std::size_t count) {
  if (overlap(c, send, recv, count)) {
    std::memmove(recv, send, c.bytes(count));
    send = recv;
  }
  if (c.size() > 1 && count > 0) {
    Algorithm a = c.algorithm;
    std::optional<Hierarchy> h;
    if (a == Algorithm::automatic) {
      const Config& cfg = c.config();
      const std::size_t b = c.bytes(count);
      // On a hypercube the recursive algorithms' partners (rank xor 2^i) are exactly the
      // direct links, where half of the ring's neighbours would be two relayed hops away.
      const bool cube = cfg.topology.kind == Topology::Kind::hypercube;
      a = b < cfg.tuning.allreduce_doubling_bytes            ? Algorithm::recursive_doubling
          : b < cfg.tuning.allreduce_ring_bytes || cube ? Algorithm::halving_doubling
                                                        : Algorithm::ring;
      // Every rank makes the same choice from the same sizes, so all of them learn the
      // hosts in this collective when none knows them yet.
      if (a == Algorithm::ring) {
        h = hierarchy(c);
        if (h->useful()) a = Algorithm::hierarchical;
      }
    }
    if (a == Algorithm::ring) {
      ring(c, send, recv, count);
    } else if (a == Algorithm::hierarchical) {
      if (!h) h = hierarchy(c);
      if (send != recv) std::memcpy(recv, send, c.bytes(count));
      hierarchical(c, recv, count, *h);
    } else {
      if (send != recv) std::memcpy(recv, send, c.bytes(count));
      if (a == Algorithm::recursive_doubling) {
        recursive_doubling(c, recv, count);
      } else {
        halving_doubling(c, recv, count);
      }
    }
  } else if (send != recv && count) {
    std::memcpy(recv, send, c.bytes(count));
  }
  c.finish(recv, count);
}

void all_reduce_sharded(const Coll& c, const void* send, void* recv, void* shard, std::size_t count) {
  const int n = c.size();
  BlockFn block = [count, n](int b) { return block_of(count, n, b); };
  auto [off, len] = block(c.rank());
  // Work in recv when there is one (the result lands there), else in scratch memory.
  void* work = recv ? recv : c.scratch(1, c.bytes(count));
  if (overlap(c, send, work, count)) {
    std::memmove(work, send, c.bytes(count));
    send = work;
  }
  ring_reduce_scatter(c, work, block, send);
  c.finish(at(work, c.bytes(off)), len);
  if (shard && len) std::memcpy(shard, at(work, c.bytes(off)), c.bytes(len));
  if (recv) ring_all_gather(c, work, block);
}

namespace {
using Ticket = CollectivePort::Ticket;

// The mailbox form. Up to kOneRoundBytes, one round, unless a rank would post more than
// kFanOutBytes in all; above, two rounds, in one message per block while a block fits one,
// in chunks beyond (mailbox_path.hpp).
constexpr std::size_t kOneRoundBytes = 4096;
// The call's number in a fingerprint, found once (a scan of the names would cost a tenth
// of an 8 B all_reduce through the mailboxes).
constexpr unsigned kAllReduceKind = call_kind("all_reduce");

// The reduction of the n parts of one block (this rank's part at `mine`) in rank order,
// (x0 op x1) op x2 ..., into `acc`: every rank that computes it gets the same bits. The
// others' parts come as messages of `phase`.
void reduce_parts(CollectivePort& p, const Ticket& t, int phase, const void* mine, std::byte* acc, std::size_t len,
                  DataType dt, ReduceOp op) {
  const int n = p.size(), me = p.rank();
  const std::size_t bytes = len * size_of(dt);
  alignas(64) std::byte part[CollectivePort::kMailboxBytes];
  if (me == 0) {
    if (bytes) std::memcpy(acc, mine, bytes);
  } else {
    p.take(t, CollectivePort::part(phase), 0, acc, bytes);
  }
  for (int r = 1; r < n; ++r) {
    const void* x = mine;
    if (r != me) {
      p.take(t, CollectivePort::part(phase), r, part, bytes);
      x = part;
    }
    reduce::accumulate(dt, op, acc, x, len);
  }
  reduce::finish(dt, op, acc, len, n);
}

// One round: every rank posts its whole vector to every other and reduces all of them.
// The least waiting (one exchange), the most copying ((n-1) x the vector each way).
void all_reduce_one_round(CollectivePort& p, const Ticket& t, const void* send, void* recv, std::size_t count,
                          DataType dt, ReduceOp op) {
  const int n = p.size(), me = p.rank();
  const std::size_t bytes = count * size_of(dt);
  for (int k = 1; k < n; ++k) p.post(t, CollectivePort::part(0), (me + k) % n, send, bytes);
  alignas(64) std::byte acc[CollectivePort::kMailboxBytes];
  reduce_parts(p, t, 0, send, acc, count, dt, op);
  if (bytes) std::memcpy(recv, acc, bytes);
}

// Two rounds, each rank the owner of one block (block_of): it posts block b to rank b,
// reduces the parts of its own block, and posts the result to every other rank. As much
// copying as a ring (2 (n-1)/n x the vector), with two exchanges instead of 2 (n-1) steps.
void all_reduce_two_rounds(CollectivePort& p, const Ticket& t, const void* send, void* recv, std::size_t count,
                           DataType dt, ReduceOp op) {
  const int n = p.size(), me = p.rank();
  const std::size_t es = size_of(dt);
  const auto* in = static_cast<const std::byte*>(send);
  auto* out = static_cast<std::byte*>(recv);
  for (int k = 1; k < n; ++k) {
    const int b = (me + k) % n;
    const auto [off, len] = block_of(count, n, b);
    p.post(t, CollectivePort::part(0), b, in + off * es, len * es);
  }
  const auto [off, len] = block_of(count, n, me);
  alignas(64) std::byte acc[CollectivePort::kMailboxBytes];
  reduce_parts(p, t, 0, in + off * es, acc, len, dt, op);
  for (int k = 1; k < n; ++k) p.post(t, CollectivePort::part(1), (me + k) % n, acc, len * es);
  // Only now: in place, recv is send, whose blocks went out above.
  if (len) std::memcpy(out + off * es, acc, len * es);
  for (int k = 1; k < n; ++k) {
    const int b = (me + k) % n;
    const auto [boff, blen] = block_of(count, n, b);
    p.take(t, CollectivePort::part(1), b, out + boff * es, blen * es);
  }
}

std::optional<Request> through_mailboxes(CollectivePort& p, bool blocking, const void* send, void* recv,
                                         std::size_t count, DataType t, ReduceOp op, const CollectiveOptions& o) {
  const std::size_t n = static_cast<std::size_t>(p.size()), bytes = count * size_of(t);
  const bool one = bytes <= kOneRoundBytes && bytes * (n - 1) <= kFanOutBytes;
  const bool two = block_of(count, p.size(), 0).second * size_of(t) <= CollectivePort::kMailboxBytes;
  auto tk = mailbox_path(p, "all_reduce", bytes, o, blocking, chunks_fit(p, bytes), call_check(kAllReduceKind, t, op),
                         {count, -1});
  if (!tk) return std::nullopt;
  return mailbox_run(p, *tk, blocking, o, t, op, [&p, tk = *tk, send, recv, count, t, op, one, two] {
    if (one) return all_reduce_one_round(p, tk, send, recv, count, t, op);
    if (two) return all_reduce_two_rounds(p, tk, send, recv, count, t, op);
    const auto* in = static_cast<const std::byte*>(send);
    auto* out = static_cast<std::byte*>(recv);
    const std::size_t mine = block_of(count, p.size(), p.rank()).first * size_of(t);
    exchange_in_chunks(p, tk, Chunked{count, in, out + mine, out + mine, out}, t, op);
  });
}

Request call_all_reduce(CollectivePort& p, bool blocking, const void* send, void* recv, std::size_t count,
                        DataType t, ReduceOp op, const CollectiveOptions& o) {
  const char* name = "all_reduce";
  check_op(p, name, t, op);
  check_buffer(p, name, "send", send, count);
  check_buffer(p, name, "recv", recv, count);
  check_all_reduce_algorithm(p, name, o.algorithm);
  if (auto r = through_mailboxes(p, blocking, send, recv, count, t, op, o)) return *r;
  return p.start(name, o, t, op, {count, -1}, [=](const Coll& c) { all_reduce(c, send, recv, count); });
}
}  // namespace

Request iall_reduce(CollectivePort& p, const void* send, void* recv, std::size_t count, DataType t,
                    ReduceOp op, const CollectiveOptions& o) {
  return call_all_reduce(p, false, send, recv, count, t, op, o);
}

Request iall_reduce_bucketed(CollectivePort& p, std::span<const MutableBuffer> buffers, DataType t,
                             ReduceOp op, const CollectiveOptions& o) {
  const char* name = "all_reduce_bucketed";
  check_op(p, name, t, op);
  check_all_reduce_algorithm(p, name, o.algorithm);
  auto bufs = std::make_shared<const std::vector<MutableBuffer>>(buffers.begin(), buffers.end());
  std::size_t total = 0;
  for (auto& b : *bufs) {
    check_buffer(p, name, "bucket", b.data, b.count);
    total += b.count;
  }
  return p.start(name, o, t, op, {total, -1}, [bufs, total](const Coll& c) {
    // One operation over the concatenation: pack, reduce, unpack.
    std::byte* flat = c.scratch(1, c.bytes(total));
    std::size_t off = 0;
    for (auto& b : *bufs) {
      if (b.count) std::memcpy(flat + off, b.data, c.bytes(b.count));
      off += c.bytes(b.count);
    }
    all_reduce(c, flat, flat, total);
    off = 0;
    for (auto& b : *bufs) {
      if (b.count) std::memcpy(b.data, flat + off, c.bytes(b.count));
      off += c.bytes(b.count);
    }
  });
}

Request iall_reduce_sharded(CollectivePort& p, const void* send, void* recv, void* shard,
                            std::size_t count, DataType t, ReduceOp op, const CollectiveOptions& o) {
  const char* name = "all_reduce_sharded";
  check_op(p, name, t, op);
  check_buffer(p, name, "send", send, count);
  if (!recv && !shard) bad(p, name, "recv and shard are both null: nothing to produce");
  check_algorithm(p, name, o.algorithm, {Algorithm::ring});
  return p.start(name, o, t, op, {count, -1}, [=](const Coll& c) { all_reduce_sharded(c, send, recv, shard, count); });
}

}  // namespace nexar::detail::coll

namespace nexar {

Request Communicator::iall_reduce(const void* send, void* recv, std::size_t count, DataType t,
                                  ReduceOp op, const CollectiveOptions& o) {
  return detail::coll::iall_reduce(port(), send, recv, count, t, op, o);
}
Request Communicator::iall_reduce_bucketed(std::span<const MutableBuffer> buffers, DataType t,
                                           ReduceOp op, const CollectiveOptions& o) {
  return detail::coll::iall_reduce_bucketed(port(), buffers, t, op, o);
}
Request Communicator::iall_reduce_sharded(const void* send, void* recv, void* shard, std::size_t count,
                                          DataType t, ReduceOp op, const CollectiveOptions& o) {
  return detail::coll::iall_reduce_sharded(port(), send, recv, shard, count, t, op, o);
}
void Communicator::all_reduce(const void* send, void* recv, std::size_t count, DataType t, ReduceOp op,
                              const CollectiveOptions& o) {
  BlockingCall b;
  detail::coll::call_all_reduce(port(), true, send, recv, count, t, op, o).wait();
}

}  // namespace nexar
