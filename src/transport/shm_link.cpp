#include "transport/shm_link.hpp"

#include <time.h>
#include <unistd.h>

#include "shm/doorbell.hpp"
#include "transport/shm_presence.hpp"

namespace nexar::detail {

using wire::Lane;

ShmLink::Clock::time_point ShmLink::Clock::now() noexcept {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return time_point(duration(static_cast<rep>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec));
}

ShmLink::ShmLink(std::shared_ptr<shm::Segment> seg, bool creator, int peer_doorbell, int own_doorbell,
                 ShmPresence* presence)
    : seg_(std::move(seg)),
      creator_(creator),
      peer_doorbell_(peer_doorbell),
      own_doorbell_(own_doorbell),
      presence_(presence) {
  if (presence_) presence_->add(*this);
}

ShmLink::~ShmLink() {
  fail(Errc::closed, "connection closed");
  ::close(peer_doorbell_);
}

int ShmLink::index(Lane lane) noexcept {
  switch (lane) {
    case Lane::data: return 0;
    case Lane::bulk: return 1;
    case Lane::collective: return 2;
    default: return -1;
  }
}

Lane ShmLink::lane(int index) noexcept {
  static constexpr Lane lanes[shm::Segment::lanes] = {Lane::data, Lane::bulk, Lane::collective};
  return lanes[index];
}

void ShmLink::push(int i, quic::Chunk c) {
  waiting_bytes_ += c.len;
  waiting_[i].push_back(Waiting{std::move(c), 0});
  bool moved = false, more = false;
  // A broken ring shows at the next poll too, which reports it.
  (void)flush(moved, more);
  if (more) left_over(true);
}

void ShmLink::left_over(bool more) noexcept {
  // Runs after every pass of a spinning poller: nothing to store in the usual case.
  if (!more && !left_over_.load(std::memory_order_relaxed)) return;
  left_over_.store(more, std::memory_order_seq_cst);
  // Published before the presence is read: a poller that stops after this read finds it.
  if (more && !(presence_ && presence_->is_watched())) ring_self();
}

bool ShmLink::flush(bool& moved, bool& more) {
  bool wrote = false;
  for (int i = 0; i < shm::Segment::lanes; ++i) {
    auto& q = waiting_[i];
    shm::Ring& r = out(i);
    std::size_t turn = 0;
    const std::size_t limit = q.empty() ? 0 : quantum(i);
    bool marked = false;  // left waiting for room, with the mark set
    while (!q.empty()) {
      if (turn >= limit) {
        more = true;
        break;
      }
      Waiting& w = q.front();
      const std::ptrdiff_t n =
          r.write(w.chunk.data + w.done, std::min(w.chunk.len - w.done, limit - turn));
      if (n < 0) return false;
      turn += static_cast<std::size_t>(n);
      w.done += static_cast<std::size_t>(n);
      waiting_bytes_ -= static_cast<std::uint64_t>(n);
      if (n > 0) wrote = true;
      if (w.done == w.chunk.len) {
        quic::Completion done = std::move(w.chunk.done);
        q.pop_front();
        if (done) done(Errc::ok, {});
        continue;
      }
      if (turn >= limit) continue;
      // Full: ask the reader to ring us when it frees room, unless it just did.
      if (!r.wait_for_room()) {
        marked = true;
        break;
      }
    }
    // A mark left from an earlier turn would have the reader ring for room nobody awaits.
    if (!marked) r.clear_writer_waiting();
    if (turn > 0) note_moved(i);
  }
  if (wrote) {
    if (peer_asleep()) ring_peer();
    moved = true;
  }
  return true;
}

void ShmLink::wake_writer(int i) const noexcept {
  shm::Ring& r = in(i);
  // The room or credit was published (sequentially consistent) before these reads.
  if (r.writer_waiting() && peer_asleep() && r.take_writer_waiting()) ring_peer();
}

bool ShmLink::peer_asleep() const noexcept {
  // Our bytes, room or credit were stored before: order those stores before this read.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return seg_->asleep(creator_ ? 1 : 0).load(std::memory_order_seq_cst) != 0;
}

void ShmLink::set_asleep(bool asleep) noexcept {
  seg_->asleep(creator_ ? 0 : 1).store(asleep ? 1 : 0, std::memory_order_seq_cst);
}

bool ShmLink::has_work() const noexcept {
  if (left_over_.load(std::memory_order_seq_cst)) return true;
  for (int i = 0; i < shm::Segment::lanes; ++i) {
    if (reading(i) && in(i).has_bytes()) return true;
    if (out(i).writer_waits_with_room()) return true;
  }
  return false;
}

std::uint64_t ShmLink::unacked() const noexcept {
  std::uint64_t n = waiting_bytes_;
  for (int i = 0; i < shm::Segment::lanes; ++i) n += out(i).unread();
  return n;
}

void ShmLink::consumed(std::uint64_t stream, std::uint64_t n) {
  const int i = static_cast<int>(stream);
  in(i).grant(n);
  wake_writer(i);
}

void ShmLink::fail(Errc code, const std::string& why) {
  if (presence_) {
    presence_->remove(*this);
    presence_ = nullptr;
    set_asleep(true);
  }
  for (int i = 0; i < shm::Segment::lanes; ++i) {
    auto& q = waiting_[i];
    out(i).clear_writer_waiting();
    while (!q.empty()) {
      quic::Completion done = std::move(q.front().chunk.done);
      q.pop_front();
      if (done) done(code, why);
    }
  }
  waiting_bytes_ = 0;
}

void ShmLink::ring_peer() const noexcept { shm::Doorbell::ring(peer_doorbell_); }

void ShmLink::ring_self() const noexcept { shm::Doorbell::ring(own_doorbell_); }

Link::Polled ShmLink::poll(LinkOwner& owner) {
  Polled out;
  static const std::string kBroken = "protocol error: the peer broke a shared-memory ring's indices";
  if (!flush(out.moved, out.more)) {
    out.broken = kBroken;
    return out;
  }
  for (int i = 0; i < shm::Segment::lanes; ++i) {
    if (!reading(i)) continue;
    shm::Ring& r = in(i);
    // At most a quantum per lane and turn, in up to two parts (the readable bytes may
    // wrap around the ring's end).
    // The quantum is read only once there is something to read: the bulk lane's looks at
    // the clock, and this runs on every turn of a spinning loop.
    std::size_t turn = 0, limit = 0;
    for (int part = 0; part < 2 && (part == 0 || turn < limit); ++part) {
      bool broken = false;
      auto bytes = r.readable(broken);
      if (broken) {
        out.broken = kBroken;
        return out;
      }
      if (bytes.empty()) break;
      if (part == 0) limit = quantum(i);
      bytes = bytes.first(std::min(bytes.size(), limit - turn));
      const auto credit = owner.on_link_data(*this, static_cast<std::uint64_t>(i), bytes.data(), bytes.size());
      out.moved = true;
      if (!credit) return out;  // the peer is gone (or broke the protocol): nothing more
      r.release(bytes.size());
      if (*credit) r.grant(*credit);
      turn += bytes.size();
    }
    if (turn > 0) {
      note_moved(i);
      if (turn >= limit) out.more = true;
    }
    wake_writer(i);
  }
  left_over(out.more);
  return out;
}

}  // namespace nexar::detail
