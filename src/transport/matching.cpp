#include "transport/matching.hpp"

#include <algorithm>
#include <cstring>

#include "core/call_check.hpp"
#include "transport/peer.hpp"

namespace nexar::detail {

void Matching::deliver_unexpected(Domain d, const std::shared_ptr<RecvOp>& r,
                                  std::list<std::shared_ptr<Unexpected>>::iterator it) {
  auto u = *it;
  Peer* p = owner_.peer(u->source);
  // Disagreeing calls revoke the communicator, which drops its unreceived messages.
  if (!calls_agree(*r, u->source, u->tag, u->check)) return;
  // Counted once: a message still arriving comes here again when its last byte does.
  if (u->check != 0 && u->waiter == nullptr) calls_.matched(u->comm, collective_number(u->tag));
  if (u->rendezvous) {
    queue(d).erase(it);
    if (p->gone()) {
      owner_.fail(r->op, p->gone_code(), u->source, p->gone_why());
      return;
    }
    p->accept_rendezvous(d, u->seq, u->tag, r, u->size);
    return;
  }
  if (!u->complete) {
    if (p->gone()) {  // the rest will never come
      queue(d).erase(it);
      owner_.fail(r->op, p->gone_code(), u->source, p->gone_why());
      return;
    }
    // Still arriving: the rest goes straight to the receive buffer.
    if (u->size <= r->cap) std::memcpy(r->buf, u->data.data(), u->data.size());
    p->release_unexpected(d, u->data.size());
    u->data.clear();
    u->data.shrink_to_fit();
    u->waiter = r;
    return;
  }
  queue(d).erase(it);
  if (u->size <= r->cap && u->waiter == nullptr && !u->data.empty())
    std::memcpy(r->buf, u->data.data(), u->data.size());
  finish_recv(*r, u->source, u->tag, u->size);
  if (p && !u->data.empty()) p->release_unexpected(d, u->data.size());
}

bool Matching::unawaited(std::uint64_t comm, int source, Tag tag, std::uint16_t theirs) {
  const std::string why = calls_.unawaited(comm, collective_number(tag), source, theirs);
  if (why.empty()) return true;
  owner_.revoke_everywhere(comm, why);
  return false;
}

bool Matching::calls_agree(const RecvOp& r, int source, Tag tag, std::uint16_t theirs) {
  if (r.check == 0 || theirs == 0 || r.check == theirs) return true;
  // The communicator's size decides whether roots show exactly (its members' local ranks).
  const int members = r.local_of ? static_cast<int>(std::count_if(r.local_of->begin(), r.local_of->end(),
                                                                  [](int l) { return l >= 0; }))
                                 : owner_.size();
  const std::string why = calls_differ("collective #" + std::to_string(collective_number(tag)), r.comm,
                                      r.local(rank_), r.check, r.local(source), theirs, members);
  owner_.fail(r.op, Errc::invalid_argument, source, why);
  // Every member's operations on it fail with the same words, within a round trip: the
  // others may wait for a message from a rank that gave up, and would hear nothing else.
  owner_.revoke_everywhere(r.comm, why);
  return false;
}

void Matching::finish_recv(const RecvOp& r, int source, Tag tag, std::uint64_t size) {
  if (r.exact && size != r.cap) {
    // Collectives know the exact size of every message: a difference means the ranks
    // called the collective with different counts or types. Every member hears of it, as
    // of calls that differ (calls_agree): the others may wait for this rank's messages.
    const std::string why = sizes_differ("collective #" + std::to_string(collective_number(tag)), r.comm,
                                         r.local(rank_), r.cap, r.local(source), size);
    owner_.fail(r.op, Errc::invalid_argument, source, why);
    if (r.check != 0) owner_.revoke_everywhere(r.comm, why);
  } else if (size > r.cap) {
    owner_.fail(r.op, Errc::truncated, source,
         "message of " + std::to_string(size) + " bytes (tag " + std::to_string(tag) +
             ") does not fit the receive buffer of " + std::to_string(r.cap) + " bytes");
  } else {
    r.op->succeed(r.status(source, tag, static_cast<std::size_t>(size)));
  }
}

void Matching::repost(Domain d, std::shared_ptr<RecvOp> r) {
  if (r->op->done()) return;
  auto& q = queue(d);
  auto it = q.find_unexpected(*r);
  if (it != q.end()) {
    deliver_unexpected(d, r, it);
    return;
  }
  if (Peer* p = r->source != any_source ? owner_.peer(r->source) : nullptr; p && p->gone()) {
    owner_.fail(r->op, p->gone_code(), r->source, p->gone_why());
    return;
  }
  q.post_first(std::move(r));
}

}  // namespace nexar::detail
