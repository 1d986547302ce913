// A communicator's side of the mailbox path (collective/mailbox_path.*, shm/mailbox.hpp):
// whether its collectives may run through the mailboxes it shares with its members, agreed
// with them, and the waits of their posts and takes. A wait spins (or yields, when
// the host is oversubscribed) for Config::spin, then sleeps on the mailbox's futex word; it
// looks for a revoked or closed communicator, a peer that closed, and the deadline every
// 64 tries while spinning and at least every millisecond while asleep.
#include <algorithm>
#include <bit>
#include <thread>

#include "collective/algorithms.hpp"
#include "comm/communicator_impl.hpp"
#include "engine/wait_meter.hpp"

#include "core/call_check.hpp"
#include "core/error_format.hpp"
#include "core/log.hpp"
#include "shm/mailbox.hpp"

namespace nexar::detail {

static_assert(CollectivePort::kMailboxBytes == shm::Mailbox::kPayload);

namespace {

// A message's number in the mailbox: the collective's number, then its part.
std::uint64_t label(const CollectivePort::Ticket& t, std::uint64_t part) { return (t.seq << 20) | part; }

inline void relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

std::optional<CollectivePort::Ticket> CommunicatorImpl::mailboxes(const char* op, std::size_t bytes,
                                                        const CollectiveOptions& o, bool blocking,
                                                        std::uint16_t check, CallShape shape) {
  check_open(op);
  std::size_t limit = mailbox_limit_.load(std::memory_order_acquire);
  if (limit == 0) limit = vote_mailboxes(op, o);
  if (limit == 0 || bytes > limit) return std::nullopt;
  // Mailbox collectives of a communicator run one after another on each rank, in order:
  // a blocking one runs in its caller unless non-blocking ones wait on the collective
  // thread, and then joins them there. So a rank's messages of one key are taken by one
  // thread at a time, in order, and one numbered below what it waits for is stale.
  bool queued = true;
  const auto now = Clock::now();
  std::uint64_t number = 0;
  if (blocking) {
    queued = mailbox_queued_.load(std::memory_order_acquire) != 0;
    // Inline, it takes the collective tag start() would have given it, so tags stay in
    // step whichever form each rank called; and it is recorded here (start() records the
    // others), with the clock read the deadline needs anyway.
    if (!queued) {
      number = recorder_->posted(Recorder::Call{op, "mailbox", check, shape.count, bytes, shape.root}, now, true);
      mail_clock_.store(0, std::memory_order_relaxed);
      mail_meter_.waited = {};
      mail_meter_.spans.clear();
      mail_meter_.keep_spans = recorder_->tracing();
    }
  } else {
    mailbox_queued_.fetch_add(1, std::memory_order_acq_rel);
  }
  const std::uint64_t seq = mailbox_seq_.fetch_add(1, std::memory_order_relaxed) + 1;
  mail_calls_[seq % mail_calls_.size()].store(seq << 16 | check, std::memory_order_relaxed);
  return Ticket{op, seq, now + o.timeout.value_or(config().op_timeout), queued, check, shape, number};
}

void CommunicatorImpl::finished(const Ticket&) noexcept { mailbox_queued_.fetch_sub(1, std::memory_order_acq_rel); }

void CommunicatorImpl::mail_unwanted(const Ticket& t, int from, const shm::Mailbox::Want& w) {
  const std::uint64_t seq = w.stale >> 20;
  if (seq >= t.seq || recorder_->failed_any()) return;
  const std::uint64_t entry = mail_calls_[seq % mail_calls_.size()].load(std::memory_order_relaxed);
  const auto mine = (entry >> 16) == seq ? static_cast<std::uint16_t>(entry) : std::uint16_t{0};
  std::string why = call_unwanted("mailbox collective #" + std::to_string(seq), id_, rank_, mine, from,
                                  static_cast<std::uint16_t>(w.stale_check), size());
  node_->revoke_comm(id_, why);
  throw make_error(Errc::invalid_argument, ErrorContext{t.op, rank_, from, {}, {}}, why);
}

void CommunicatorImpl::ran(const Ticket& t, bool ok) noexcept {
  // Its end is the last clock reading of its waits (idle()): an 8-byte collective through
  // the mailboxes is over before a reading of its own would be, which would cost a tenth
  // of it; one that never waited long enough to read the clock ends where it started.
  recorder_->ended(t.number, Clock::time_point(Clock::duration(mail_clock_.load(std::memory_order_relaxed))), ok,
                   &mail_meter_, true);
}

std::size_t CommunicatorImpl::vote_mailboxes(const char* op, const CollectiveOptions& o) {
  const std::uint64_t n = mailbox_candidates_.fetch_add(1, std::memory_order_relaxed) + 1;
  if (mailbox_pending_at_ != 0 && n == mailbox_pending_at_ + 1) {
    // Every member started it one such call ago, behind only collectives that need no
    // call of anyone's to finish: waiting here cannot wait for this rank's own later work.
    Request r = std::move(mailbox_pending_);
    mailbox_pending_at_ = 0;
    try {
      r.wait();
    } catch (const Error& e) {
      // Named as the call that meets it: the agreement is this library's, not the caller's.
      throw Error(e.code(),
                  std::string(op) + ": the members' agreement on shared-memory mailboxes, started by an earlier "
                                    "collective of this communicator, did not complete: " + e.what(),
                  e.failed_ranks());
    }
    if (mailbox_agreed_ == 0) return 0;
    mailbox_boxes_ = std::move(mailbox_offered_);
    mailbox_used_.assign(mailbox_boxes_.size(), 0);
    mailbox_limit_.store(static_cast<std::size_t>(mailbox_agreed_), std::memory_order_release);
    log::debug("rank {} of communicator {:#x}: collectives of up to {} bytes through mailboxes", rank_, id_,
               mailbox_agreed_);
    return static_cast<std::size_t>(mailbox_agreed_);
  }
  if (mailbox_pending_at_ != 0 || !std::has_single_bit(n)) return 0;
  // The vote: the bytes this rank allows, 0 unless it shares memory with every member.
  const Config& cfg = config();
  std::vector<Node::Mailboxes> boxes(members_.size());
  std::uint64_t mine = cfg.shm ? cfg.shm_collective_bytes : 0;
  for (int r = 0; r < size() && mine != 0; ++r) {
    if (r == rank_) continue;
    boxes[static_cast<std::size_t>(r)] = node_->mailboxes(world_of(r));
    if (!boxes[static_cast<std::size_t>(r)].out) mine = 0;
  }
  mailbox_vote_ = mine;
  mailbox_offered_ = std::move(boxes);
  // On the collective thread even from a blocking call: the caller does not wait for it now.
  // It takes the deadline of the call that started it: a member that never makes that call
  // must not hold the collectives queued behind the vote for longer than their own timeout.
  CollectiveOptions vote;
  vote.timeout = o.timeout;
  mailbox_pending_ = start_task("mailbox vote", vote, DataType::u64, ReduceOp::min, {1, -1},
                                [this](const Coll& c) { coll::all_reduce(c, &mailbox_vote_, &mailbox_agreed_, 1); },
                                false);
  mailbox_pending_at_ = n;
  return 0;
}

bool CommunicatorImpl::try_post(const Ticket& t, std::uint64_t part, int to, const void* data, std::size_t len) {
  shm::Mailbox& box = *mailbox_boxes_[static_cast<std::size_t>(to)].out;
  // At most half a mailbox's slots hold this communicator's messages, so the collectives
  // of two communicators that ranks run in different orders never wait on each other's
  // messages for a slot. Counted here, checked in the mailbox only near the limit.
  static_assert(2 * kMailboxShare == shm::Mailbox::kSlots);
  std::size_t& used = mailbox_used_[static_cast<std::size_t>(to)];
  if (used >= kMailboxShare) {
    used = box.count(id_);
    if (used >= kMailboxShare) return false;
  }
  if (!box.try_post(id_, label(t, part), t.check, data, len)) return false;
  ++used;
  return true;
}

void CommunicatorImpl::mail_disagrees(const Ticket& t, int from, const shm::Mailbox::Want& w) {
  // Every member's operations on the communicator fail with the same words: the others
  // may wait for mail from a rank that gave up, and would hear nothing else.
  std::string why =
      w.theirs != w.check
          ? calls_differ("mailbox collective #" + std::to_string(t.seq), id_, rank_, t.check, from,
                         static_cast<std::uint16_t>(w.theirs), size())
          : sizes_differ("mailbox collective #" + std::to_string(t.seq), id_, rank_, w.bytes, from, w.len);
  node_->revoke_comm(id_, why);
  throw make_error(Errc::invalid_argument, ErrorContext{t.op, rank_, from, {}, {}}, why);
}

bool CommunicatorImpl::try_take(const Ticket& t, std::uint64_t part, int from, void* out, std::size_t len) {
  shm::Mailbox::Want w{id_, label(t, part), t.check, len};
  const auto found = mailbox_boxes_[static_cast<std::size_t>(from)].in->try_take(w, out);
  if (w.stale) mail_unwanted(t, from, w);
  if (found == shm::Mailbox::Take::absent) return false;
  if (found != shm::Mailbox::Take::taken) mail_disagrees(t, from, w);
  return true;
}

const void* CommunicatorImpl::try_peek(const Ticket& t, std::uint64_t part, int from, std::size_t len) {
  shm::Mailbox::Want w{id_, label(t, part), t.check, len};
  const void* data = nullptr;
  const auto found = mailbox_boxes_[static_cast<std::size_t>(from)].in->try_peek(w, data);
  if (w.stale) mail_unwanted(t, from, w);
  if (found == shm::Mailbox::Take::absent) return nullptr;
  if (found != shm::Mailbox::Take::taken) mail_disagrees(t, from, w);
  return data;
}

void CommunicatorImpl::release(int from, const void* data) { mailbox_boxes_[static_cast<std::size_t>(from)].in->release(data); }

void CommunicatorImpl::idle(const Ticket& t, MailWait& w, int peer, bool taking) {
  const Config& cfg = config();
  if (!w.asleep && ++w.tries % 64 != 0 && !w.armed && !w.last_chance && !is_revoked()) {
    if (cfg.yield_when_idle) {
      std::this_thread::yield();
    } else {
      relax();
    }
    return;
  }
  check_open(t.op);  // throws the revocation (a member failed) or the closing
  const auto now = Clock::now();
  mail_clock_.store(now.time_since_epoch().count(), std::memory_order_relaxed);
  // The time between this wait's clock readings is time blocked on `peer`: the caller's
  // own collective's, or the one the collective thread runs (engine/wait_meter.hpp).
  if (WaitMeter* m = t.queued ? WaitMeter::current() : &mail_meter_) {
    if (w.read != Clock::time_point{}) m->add(w.read, now);
    w.read = now;
  }
  if (auto gone = node().departure(world_of(peer)); gone && gone->first == Errc::peer_closed) {
    // What it posted before it closed still counts (it became visible before the close):
    // the caller attempts once more before the error.
    if (!w.last_chance) {
      w.last_chance = true;
      return;
    }
    throw make_error(gone->first, ErrorContext{t.op, rank_, peer, {}, {}}, gone->second);
  }
  if (now >= t.deadline) {
    // Run by its caller, the collective is this Ticket's number; a queued one's error gets
    // the note where start() catches it.
    throw make_error(Errc::timeout, ErrorContext{t.op, rank_, peer, {}, {}},
                     std::string("deadline passed waiting for rank ") + std::to_string(peer) +
                         (taking ? "'s message" : " to take earlier messages") +
                         (t.queued ? std::string() : stall_note(t.number)));
  }
  if (w.spin_end == Clock::time_point{}) w.spin_end = now + cfg.spin;
  if (!w.asleep && now < w.spin_end) return;
  w.asleep = true;
  const Node::Mailboxes& boxes = mailbox_boxes_[static_cast<std::size_t>(peer)];
  // Read the word first and attempt once more, then sleep on it: a message posted (or
  // taken) in between changes it, and the sleep returns at once.
  if (!w.armed) {
    w.seen = taking ? boxes.in->posted() : boxes.out->taken();
    w.armed = true;
    return;
  }
  w.armed = false;
  const auto left = std::clamp(std::chrono::duration_cast<std::chrono::microseconds>(t.deadline - now),
                               std::chrono::microseconds(1), std::chrono::microseconds(1000));
  if (taking) {
    boxes.in->wait_posted(w.seen, left);
  } else {
    boxes.out->wait_taken(w.seen, left);
  }
}

}  // namespace nexar::detail
