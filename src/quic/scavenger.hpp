// A delay-based limit on the bytes in flight of a connection's lowest-priority streams (the
// bulk lane): it yields the path to every other stream before congestion control would.
//
// Why: CUBIC fills whatever queue the path has before it backs off: a 10 ms tbf queue, or
// megabytes in the receiver's UDP socket when its CPU is the bottleneck. Streams of higher
// priority are written first, but a packet written after bulk ones still waits behind every
// bulk packet already queued on the path. Measured, two hosts at 1 Gbit/s: an 8 B all_reduce
// took 18.6 us idle and 7.1 ms beside a bulk_send.
//
// How (the idea of LEDBAT, RFC 6817, and of FAST TCP, with a target in time): the queueing
// delay is the least of the last few RTT samples less the base RTT, the least sample of the
// last minute or so. Once per window of acknowledged bytes (about a round trip) the window
// moves towards the in-flight that would leave `target` of queue: window x (base + target)
// / (base + queueing). It grows while the path is empty (at most doubling a round trip),
// and falls at once, in proportion, when bulk bytes queue. The target is a quarter of the
// base RTT, at least 50 us: RTT samples on a loaded host jitter by tens of microseconds
// (ACK delays, scheduling), and a target below that noise pinned the window at its floor,
// which on a fast link starves the lane. Congestion control (CUBIC) still applies on top:
// ngtcp2's window covers every stream.
//
// Measured (bench/beside_bulk.sh), 2 hosts joined by tbf-shaped 1 Gbit/s links, while a
// bulk_send runs: 8 B all_reduce and barrier 83-104 us at MTU 1500 (idle 16-26 us; 7.5 ms
// without the window) and 201-218 us at MTU 9000, where one 8952-byte packet alone takes
// 72 us on the link (7.1 ms without). The bulk lane kept the link's rate (0.12 GB/s).
//
// Sans-I/O: it is given acknowledged bytes and RTT samples, and answers with the window.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

namespace nexar::quic {

class Scavenger {
 public:
  /// `mss`: the path's packet size; the window never goes below `min_packets` of them.
  explicit Scavenger(std::uint64_t mss) noexcept;

  /// Bytes of scavenger streams that may be in flight now.
  std::uint64_t window() const noexcept { return window_; }

  /// `acked` bytes of scavenger streams were acknowledged at `now_ns`; `rtt_ns` is the latest
  /// RTT sample (ngtcp2's, not adjusted for ACK delay). 0: no sample yet.
  void on_ack(std::uint64_t acked, std::uint64_t rtt_ns, std::uint64_t now_ns) noexcept;

  /// The least RTT of the last one or two `base_period`s: the path with nothing queued.
  std::uint64_t base_rtt() const noexcept { return std::min(base_[0], base_[1]); }

  /// A scavenger stream had bytes to write and the window held them back. The window grows
  /// only in rounds where this happened: a sender that does not use its window learns
  /// nothing about the path, and an unused window grown large would go out as one burst.
  void note_limited() noexcept { limited_ = true; }

  /// The path's packets grew or shrank.
  void set_mss(std::uint64_t mss) noexcept;

  /// The queueing delay the window aims for, given the base RTT.
  static std::uint64_t target_ns(std::uint64_t base_rtt_ns) noexcept;

  static constexpr std::uint64_t min_packets = 2;
  static constexpr std::uint64_t initial_packets = 10;
  static constexpr std::uint64_t min_target_ns = 50'000;
  /// Recent RTT samples whose least stands for the current delay (one late ACK is noise).
  static constexpr std::size_t samples = 4;
  /// Growth per round trip is capped at this factor (slow start's doubling).
  static constexpr std::uint64_t max_growth = 2;
  /// The base RTT is the least sample of the current and the previous period, so that it
  /// follows a path that changed (LEDBAT keeps minutes of history; a cluster's paths change
  /// seldom but a route can).
  static constexpr std::uint64_t base_period_ns = 30'000'000'000;

 private:
  std::uint64_t mss_;
  std::uint64_t window_;
  std::uint64_t acked_in_round_ = 0;  // bytes acknowledged since the window last moved
  bool limited_ = false;              // note_limited() since the window last moved
  std::array<std::uint64_t, samples> rtt_{};
  std::size_t next_ = 0;
  std::array<std::uint64_t, 2> base_{};  // least sample of the previous and current period
  std::uint64_t period_end_ = 0;
};

}  // namespace nexar::quic
