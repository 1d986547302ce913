// A group's side of the mailbox path (collective/small.cpp, shm/mailbox.hpp): whether its
// small collectives may run through the mailboxes it shares with its members,
// agreed with them, and the waits of their posts and takes. A wait spins (or yields, when
// the host is oversubscribed) for Config::spin, then sleeps on the mailbox's futex word; it
// looks for a revoked or closed communicator, a peer that closed, and the deadline every
// 64 tries while spinning and at least every millisecond while asleep.
#include <algorithm>
#include <bit>
#include <thread>

#include "collective/algorithms.hpp"
#include "comm/group.hpp"
#include "core/error_format.hpp"
#include "core/log.hpp"
#include "shm/mailbox.hpp"

namespace nexar::detail {

static_assert(CollectivePort::kMailboxBytes == shm::Mailbox::kPayload);

namespace {

// A message's number in the mailbox: two per collective, one per phase.
std::uint64_t label(const CollectivePort::Ticket& t, int phase) {
  return 2 * t.seq + static_cast<std::uint64_t>(phase);
}

inline void relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Tries `attempt` until it succeeds. `counter` reads the mailbox word a success needs to
// change (read before each try), `sleep(seen, for)` sleeps until it changes. `waiting_for`
// says what a timeout waited for.
template <class Counter, class Sleep, class Attempt>
void wait_for_mail(const Group& g, const CollectivePort::Ticket& t, int peer, const char* waiting_for,
                   Counter counter, Sleep sleep, Attempt attempt) {
  using Clock = CollectivePort::Clock;
  const Config& cfg = g.config();
  Clock::time_point spin_end{};
  bool asleep = false;
  for (unsigned i = 1;; ++i) {
    const std::uint32_t seen = counter();
    if (attempt()) return;
    if (!asleep && i % 64 != 0 && !g.is_revoked()) {
      if (cfg.yield_when_idle) {
        std::this_thread::yield();
      } else {
        relax();
      }
      continue;
    }
    g.check_open(t.op);  // throws the revocation (a member failed) or the closing
    const auto now = Clock::now();
    if (auto gone = g.node().departure(g.world_of(peer)); gone && gone->first == Errc::peer_closed) {
      // What it posted before it closed still counts (it became visible before the close).
      if (attempt()) return;
      throw make_error(gone->first, ErrorContext{t.op, g.rank(), peer, {}, {}}, gone->second);
    }
    if (now >= t.deadline) {
      throw make_error(Errc::timeout, ErrorContext{t.op, g.rank(), peer, {}, {}},
                       std::string("deadline passed waiting for rank ") + std::to_string(peer) + waiting_for);
    }
    if (spin_end == Clock::time_point{}) spin_end = now + cfg.spin;
    if (!asleep && now < spin_end) continue;
    asleep = true;
    const auto left = std::chrono::duration_cast<std::chrono::microseconds>(t.deadline - now);
    sleep(seen, std::clamp(left, std::chrono::microseconds(1), std::chrono::microseconds(1000)));
  }
}

}  // namespace

std::optional<CollectivePort::Ticket> Group::mailboxes(const char* op, std::size_t bytes,
                                                        const CollectiveOptions& o, bool blocking) {
  check_open(op);
  std::size_t limit = mailbox_limit_.load(std::memory_order_acquire);
  if (limit == 0) limit = vote_mailboxes();
  if (limit == 0 || bytes > limit) return std::nullopt;
  // Mailbox collectives of a communicator run one after another on each rank, in order:
  // a blocking one runs in its caller unless non-blocking ones wait on the collective
  // thread, and then joins them there. So a rank's messages of one key are taken by one
  // thread at a time, in order, and one numbered below what it waits for is stale.
  bool queued = true;
  if (blocking) {
    queued = mailbox_queued_.load(std::memory_order_acquire) != 0;
    // Inline, it takes the collective tag start() would have given it, so tags stay in
    // step whichever form each rank called.
    if (!queued) collectives_.fetch_add(1, std::memory_order_relaxed);
  } else {
    mailbox_queued_.fetch_add(1, std::memory_order_acq_rel);
  }
  return Ticket{op, mailbox_seq_.fetch_add(1, std::memory_order_relaxed) + 1,
                Clock::now() + o.timeout.value_or(config().op_timeout), queued};
}

void Group::finished(const Ticket&) noexcept { mailbox_queued_.fetch_sub(1, std::memory_order_acq_rel); }

std::size_t Group::vote_mailboxes() {
  const std::uint64_t n = mailbox_candidates_.fetch_add(1, std::memory_order_relaxed) + 1;
  if (mailbox_pending_at_ != 0 && n == mailbox_pending_at_ + 1) {
    // Every member started it one such call ago, behind only collectives that need no
    // call of anyone's to finish: waiting here cannot wait for this rank's own later work.
    Request r = std::move(mailbox_pending_);
    mailbox_pending_at_ = 0;
    r.wait();
    if (mailbox_agreed_ == 0) return 0;
    mailbox_boxes_ = std::move(mailbox_offered_);
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
  mailbox_pending_ = start_task("mailbox vote", {}, DataType::u64, ReduceOp::min,
                                [this](const Coll& c) { coll::all_reduce(c, &mailbox_vote_, &mailbox_agreed_, 1); },
                                false);
  mailbox_pending_at_ = n;
  return 0;
}

void Group::post(const Ticket& t, int phase, int to, const void* data, std::size_t len) {
  shm::Mailbox& box = *mailbox_boxes_[static_cast<std::size_t>(to)].out;
  wait_for_mail(
      *this, t, to, " to take earlier messages", [&] { return box.taken(); },
      [&](std::uint32_t seen, std::chrono::microseconds d) { box.wait_taken(seen, d); },
      [&] { return box.try_post(id_, label(t, phase), data, len); });
}

void Group::take(const Ticket& t, int phase, int from, void* out, std::size_t len) {
  shm::Mailbox& box = *mailbox_boxes_[static_cast<std::size_t>(from)].in;
  shm::Mailbox::Take got = shm::Mailbox::Take::absent;
  std::size_t sent = 0;
  wait_for_mail(
      *this, t, from, "'s message", [&] { return box.posted(); },
      [&](std::uint32_t seen, std::chrono::microseconds d) { box.wait_posted(seen, d); },
      [&] {
        got = box.try_take(id_, label(t, phase), out, len, sent);
        return got != shm::Mailbox::Take::absent;
      });
  if (got == shm::Mailbox::Take::wrong_length) {
    throw make_error(Errc::invalid_argument, ErrorContext{t.op, rank_, from, {}, {}},
                     "rank " + std::to_string(from) + " sent " + std::to_string(sent) + " bytes, this rank expects " +
                         std::to_string(len) + " (the ranks disagree on count or type)");
  }
}

}  // namespace nexar::detail
