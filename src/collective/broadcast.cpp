// broadcast: binomial tree (log2 n rounds) for small messages, pipelined chain for large
// ones (each link carries the data once, segments overlap along the chain).
#include <nexar/communicator.hpp>

#include <algorithm>
#include <vector>

#include "collective/algorithms.hpp"
#include "collective/checks.hpp"
#include "collective/collectives.hpp"
#include "collective/mailbox_path.hpp"
#include "core/call_check.hpp"

namespace nexar::detail::coll {

namespace {

void tree(const Coll& c, void* buf, std::size_t count, int root) {
  const int n = c.size();
  const int vr = (c.rank() - root + n) % n;
  auto real = [&](int v) { return (v + root) % n; };
  int mask = 1;
  while (mask < n) {
    if (vr & mask) {
      c.recv(real(vr - mask), buf, c.bytes(count));
      break;
    }
    mask <<= 1;
  }
  Requests sends;
  for (mask >>= 1; mask > 0; mask >>= 1)
    if (vr + mask < n) sends.push_back(c.isend(real(vr + mask), buf, c.bytes(count)));
  Coll::wait_all(sends);
}

void chain(const Coll& c, void* buf, std::size_t count, int root) {
  const int n = c.size();
  const int vr = (c.rank() - root + n) % n;
  const int prev = (c.rank() - 1 + n) % n, next = (c.rank() + 1) % n;
  const std::size_t seg = c.segment_elems();
  const std::size_t nseg = (count + seg - 1) / seg;
  Requests recvs, sends;
  if (vr > 0)
    for (std::size_t j = 0; j < nseg; ++j) {
      std::size_t o = j * seg, l = std::min(seg, count - o);
      recvs.push_back(c.irecv(prev, at(buf, c.bytes(o)), c.bytes(l)));
    }
  for (std::size_t j = 0; j < nseg; ++j) {
    if (vr > 0) recvs[j].wait();
    if (vr + 1 < n) {
      std::size_t o = j * seg, l = std::min(seg, count - o);
      sends.push_back(c.isend(next, at(buf, c.bytes(o)), c.bytes(l)));
    }
  }
  Coll::wait_all(sends);
}

}  // namespace

void broadcast(const Coll& c, void* buf, std::size_t count, int root) {
  if (c.size() == 1 || count == 0) return;
  Algorithm a = c.algorithm;
  if (a == Algorithm::automatic)
    a = c.bytes(count) < c.config().tuning.broadcast_chain_bytes ? Algorithm::tree : Algorithm::ring;
  if (a == Algorithm::tree) {
    tree(c, buf, count, root);
  } else {
    chain(c, buf, count, root);
  }
}

namespace {
using Ticket = CollectivePort::Ticket;

// The mailbox form: one message to each rank while it fits one and the root posts at
// most kFanOutBytes in all; in chunks up to kBroadcastMostBytes: with 4 processes on 2
// cores 2-3x faster than the pipelined chain up to 64 KiB, as fast at 256 KiB and 1 MiB,
// slower at 4 MiB (2 alternating runs).
constexpr std::size_t kBroadcastMostBytes = std::size_t{256} << 10;
// The call's number in a fingerprint, found once.
constexpr unsigned kBroadcastKind = call_kind("broadcast");

// broadcast beyond one message: the root sends every rank the size (8 bytes: ranks that
// disagree fail at once, naming both sizes), then the buffer in chunks, to all ranks in
// turn as their mailboxes take them; the others take theirs in order.
void broadcast_in_chunks(CollectivePort& p, const Ticket& t, std::byte* buf, std::uint64_t bytes, int root) {
  static constexpr std::size_t kChunk = CollectivePort::kMailboxBytes;
  const int n = p.size(), me = p.rank();
  const std::size_t chunks = (bytes + kChunk - 1) / kChunk;
  const auto piece = [bytes](std::size_t c) { return std::min<std::size_t>(kChunk, bytes - c * kChunk); };
  if (me != root) {
    std::uint64_t theirs = 0;
    p.take(t, CollectivePort::part(0), root, &theirs, sizeof theirs);
    check_sizes_agree(t, me, root, theirs, bytes);
    for (std::size_t c = 0; c < chunks; ++c) p.take(t, CollectivePort::part(0, 1 + c), root, buf + c * kChunk, piece(c));
    return;
  }
  std::vector<std::size_t> posted(static_cast<std::size_t>(n), 0);  // by rank: the size, then chunks
  for (CollectivePort::MailWait w;;) {
    bool moved = false;
    int waiting_for = -1;
    for (int k = 1; k < n; ++k) {
      const int r = (root + k) % n;
      std::size_t& c = posted[static_cast<std::size_t>(r)];
      while (c <= chunks &&
             (c == 0 ? p.try_post(t, CollectivePort::part(0), r, &bytes, sizeof bytes)
                     : p.try_post(t, CollectivePort::part(0, c), r, buf + (c - 1) * kChunk, piece(c - 1)))) {
        ++c;
        moved = true;
      }
      if (c <= chunks && waiting_for < 0) waiting_for = r;
    }
    if (waiting_for < 0) return;
    if (moved) {
      w = {};
    } else {
      p.idle(t, w, waiting_for, false);
    }
  }
}

std::optional<Request> through_mailboxes(CollectivePort& p, bool blocking, void* buf, std::size_t count, DataType t,
                                         int root, const CollectiveOptions& o) {
  const std::size_t bytes = count * size_of(t);
  const bool one = bytes <= CollectivePort::kMailboxBytes &&
                   bytes * static_cast<std::size_t>(p.size() - 1) <= kFanOutBytes;
  const bool chunked = chunks_fit(p, bytes) && bytes <= kBroadcastMostBytes;
  auto tk = mailbox_path(p, "broadcast", bytes, o, blocking, one || chunked, call_check(kBroadcastKind, t, ReduceOp::sum, root),
                         {count, root});
  if (!tk) return std::nullopt;
  return mailbox_run(p, *tk, blocking, o, t, ReduceOp::sum, [&p, tk = *tk, buf, bytes, root, one] {
    const int n = p.size();
    if (one) {
      if (p.rank() != root) return p.take(tk, CollectivePort::part(0), root, buf, bytes);
      for (int k = 1; k < n; ++k) p.post(tk, CollectivePort::part(0), (root + k) % n, buf, bytes);
      return;
    }
    broadcast_in_chunks(p, tk, static_cast<std::byte*>(buf), bytes, root);
  });
}

Request call_broadcast(CollectivePort& p, bool blocking, void* buf, std::size_t count, DataType t, int root,
                       const CollectiveOptions& o) {
  const char* name = "broadcast";
  check_root(p, name, root);
  check_buffer(p, name, "", buf, count);
  check_algorithm(p, name, o.algorithm, {Algorithm::tree, Algorithm::ring});
  if (auto r = through_mailboxes(p, blocking, buf, count, t, root, o)) return *r;
  return p.start(name, o, t, ReduceOp::sum, {count, root}, [=](const Coll& c) { broadcast(c, buf, count, root); });
}
}  // namespace

Request ibroadcast(CollectivePort& p, void* buf, std::size_t count, DataType t, int root,
                   const CollectiveOptions& o) {
  return call_broadcast(p, false, buf, count, t, root, o);
}

}  // namespace nexar::detail::coll

namespace nexar {

Request Communicator::ibroadcast(void* buf, std::size_t count, DataType t, int root,
                                 const CollectiveOptions& o) {
  return detail::coll::ibroadcast(port(), buf, count, t, root, o);
}
void Communicator::broadcast(void* buf, std::size_t count, DataType t, int root, const CollectiveOptions& o) {
  BlockingCall b;
  detail::coll::call_broadcast(port(), true, buf, count, t, root, o).wait();
}

}  // namespace nexar
