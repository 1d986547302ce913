// The shared-memory path with one peer on the same host, as one side sees it: for each
// message lane (data, bulk, collective) a ring out and a ring in, chunks waiting for room
// in the rings out, and the peer's doorbell. A lane switches to it in each direction
// separately: the sender puts a shm_switch frame on the lane's QUIC stream, then writes
// the lane's later frames into the ring; the receiver reads the ring only after that
// frame, so the lane's order holds across the switch. Engine thread only.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>

#include <nexar/error.hpp>

#include "shm/segment.hpp"
#include "transport/link.hpp"

namespace nexar::detail {

class ShmPresence;

class ShmLink final : public Link {
 public:
  /// `creator`: this side made the segment (it writes direction 0). Owns `peer_doorbell`;
  /// `own_doorbell` (this node's, not owned) is rung to come back to unfinished work.
  /// `presence` (may be null: this side's word then stays set, and the peer always rings)
  /// keeps this side's asleep word in step with the node's pollers; it must outlive the link.
  ShmLink(std::shared_ptr<shm::Segment> seg, bool creator, int peer_doorbell, int own_doorbell,
          ShmPresence* presence = nullptr);
  ~ShmLink() override;
  ShmLink(const ShmLink&) = delete;
  ShmLink& operator=(const ShmLink&) = delete;

  /// The lane's ring index (0 .. Segment::lanes-1), or -1 for lanes that stay on QUIC.
  static int index(wire::Lane lane) noexcept;
  static wire::Lane lane(int index) noexcept;

  /// Frames of ring `i` go through shared memory from now on.
  void start_sending(int i) noexcept { sending_[i] = true; }
  bool sending(int i) const noexcept { return sending_[i]; }

  /// Queues a chunk on ring `i` and writes what fits; its completion runs once all of it
  /// is in the ring (the peer's process holds the memory from then on).
  void push(int i, quic::Chunk c);
  /// The same on `lane`'s ring (Link); the lane must be one that switched (sending()).
  void push(wire::Lane lane, quic::Chunk c) override { push(index(lane), std::move(c)); }
  /// Whether `lane` has a ring and switched to it.
  bool sending(wire::Lane lane) const noexcept {
    const int i = index(lane);
    return i >= 0 && sending_[i];
  }
  /// Writes waiting chunks as room allows, at most quantum(i) bytes on lane i, and rings
  /// the peer if anything moved; `more` is set when a lane stopped at its quantum with room
  /// left. Returns false if the peer broke a ring's indices.
  bool flush(bool& moved, bool& more);
  /// Bytes lane `i` moves per turn of the engine (flush, or a read in poll). Data
  /// and collective take what the ring holds: turns would only cost a collective's own
  /// throughput (16 MiB all_reduce, 2 ranks: 3.2-4.0 GB/s whole, 2.4-2.6 in 64 KiB turns).
  /// The bulk lane takes turns, because whoever copies a turn holds up every other lane of
  /// this node meanwhile: 64 KiB while the other lanes are quiet, and 8 KiB while one of
  /// them moved bytes on this link in the last `kBusyWindow`. Measured, 2 ranks beside a
  /// bulk_send, barrier (idle about 7 us): whole rings 254-258 us; 64 KiB turns 15.7-18.9
  /// us; 16 KiB 11.3-14.8 us (up to 2.03x idle), bulk 2.3 GB/s beside a barrier loop; 8 KiB
  /// 0.9-1.7x idle for barrier and 8 B all_reduce, bulk 1.3 GB/s beside the loop. Bulk
  /// alone keeps the large turns (3.9-4.3 GB/s).
  std::size_t quantum(int i) const noexcept {
    if (i != kBulk) return ~std::size_t{0};
    return Clock::now() - others_moved_ < kBusyWindow ? kBulkTurnBusy : kBulkTurn;
  }
  /// The clock of the window above: the kernel's coarse monotonic clock (a tick, 1-4 ms,
  /// behind), which a 10 ms window can afford. note_moved reads it for every message of a
  /// lane other than bulk, and unlike steady_clock it costs no timestamp-counter read
  /// (about 30 ns here, a measurable part of an 8 B message).
  struct Clock {
    using duration = std::chrono::nanoseconds;
    using rep = duration::rep;
    using period = duration::period;
    using time_point = std::chrono::time_point<Clock>;
    static constexpr bool is_steady = true;
    static time_point now() noexcept;
  };
  /// A lane other than bulk moved bytes through this link (either direction), now or at `at`.
  void note_moved(int i) noexcept {
    if (i != kBulk) others_moved_ = Clock::now();
  }
  void note_moved(int i, Clock::time_point at) noexcept {
    if (i != kBulk) others_moved_ = at;
  }
  /// How long after another lane's bytes the bulk lane keeps its small turns.
  static constexpr std::chrono::milliseconds kBusyWindow{10};
  /// Bytes queued or in the rings out and not yet read by the peer.
  std::uint64_t unacked() const noexcept override;
  /// Fails every waiting chunk, and takes the link out of the node's presence (the peer is
  /// gone: nothing on this link is worth waking for any more).
  void fail(Errc code, const std::string& why) override;
  /// `n` bytes read from ring in(`stream`) were consumed: the peer may write that many more.
  void consumed(std::uint64_t stream, std::uint64_t n) override;
  // Link: an incoming stream is a ring, numbered by its index, without a preamble.
  std::optional<wire::Lane> stream_lane(std::uint64_t stream) const override {
    return lane(static_cast<int>(stream));
  }
  bool carries(wire::Lane l) const noexcept override { return index(l) >= 0; }
  /// Rings have no events of their own: the node polls them.
  bool polled() const noexcept override { return true; }
  /// Writes what waits for room out (flush) and reads each lane the peer switched, at most
  /// a quantum per lane, handing the bytes to `owner`.
  Polled poll(LinkOwner& owner) override;
  bool on_socket() const noexcept override { return false; }
  std::string describe(std::uint64_t stream) const override {
    return std::string("shared-memory lane ") + wire::to_string(lane(static_cast<int>(stream)));
  }

  shm::Ring& in(int i) const noexcept { return seg_->ring(creator_ ? 1 : 0, i); }
  const std::shared_ptr<shm::Segment>& segment() const noexcept { return seg_; }
  /// This side made the segment (it writes direction 0).
  bool creator() const noexcept { return creator_; }
  /// The peer switched lane `i` to its ring: this side reads it from now on.
  void start_reading(int i) noexcept { reading_.fetch_or(1u << i, std::memory_order_relaxed); }
  bool reading(int i) const noexcept { return (reading_.load(std::memory_order_relaxed) >> i) & 1u; }
  /// Room was freed or credit granted in ring in(i): wakes the peer if it waits for that and
  /// may be asleep (otherwise it finds the room by polling).
  void wake_writer(int i) const noexcept;

  // ---- this side's presence (transport/shm_presence.hpp); any thread ----
  /// Sets or clears this side's asleep word.
  void set_asleep(bool asleep) noexcept;
  /// Whether a ring holds work for this side: bytes in a lane it reads, room for a writer
  /// of this side that waits for it, or a lane that stopped at its quantum.
  bool has_work() const noexcept;
  /// Wakes this node's engine: work is left that no event of the peer's will announce (a
  /// lane stopped at its quantum; a lane just switched, whose bytes may have been announced
  /// before the switch was read).
  void ring_self() const noexcept;
  /// After a pass over the rings (engine lock held): whether a lane stopped at its quantum
  /// with work left. If so and no thread polls this node, its doorbell brings the engine
  /// back; a thread that polls goes on with the work itself (waking the engine for it
  /// would take the lock, and on a shared core the core, from that thread: a barrier
  /// beside a bulk transfer 20 us instead of 12), and if it stops first, it finds the mark
  /// (has_work).
  void left_over(bool more) noexcept;

 private:
  static constexpr int kBulk = 1;  // index(wire::Lane::bulk)
  static constexpr std::size_t kBulkTurn = std::size_t{64} * 1024;
  static constexpr std::size_t kBulkTurnBusy = std::size_t{8} * 1024;

  shm::Ring& out(int i) const noexcept { return seg_->ring(creator_ ? 0 : 1, i); }
  /// Whether the peer may be asleep: read after this side's bytes or room are published.
  bool peer_asleep() const noexcept;
  void ring_peer() const noexcept;

  std::shared_ptr<shm::Segment> seg_;
  bool creator_;
  int peer_doorbell_;
  int own_doorbell_;
  ShmPresence* presence_;
  std::atomic<unsigned> reading_{0};  // bit i: lane i is read from its ring
  std::atomic<bool> left_over_{false};  // a lane stopped at its quantum with work left
  bool sending_[shm::Segment::lanes] = {};
  struct Waiting {
    quic::Chunk chunk;
    std::size_t done = 0;  // bytes of it already in the ring
  };
  std::deque<Waiting> waiting_[shm::Segment::lanes];
  std::uint64_t waiting_bytes_ = 0;
  Clock::time_point others_moved_{};
};

}  // namespace nexar::detail
