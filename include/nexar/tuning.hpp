// nexar — the unstable settings: algorithm thresholds and fault injection.
//
// These are Config::tuning. They are not part of the stable API: a field here may be
// renamed, change meaning or go away in any release, because it names an internal choice
// (which algorithm runs at which size) or exists for tests. (A CONFIG.md tier says who
// touches a setting; several "tuning" settings are stable fields of Config itself. Only
// what is in this struct is unstable.) The thresholds' defaults are measured
// (docs/PERFORMANCE.md). Each field has a NEXAR_* variable (docs/CONFIG.md), which is how a
// job should set them when it must; Config::from_env() reads them. Config::validate()
// checks them with the rest, and errors name them as "tuning.<field>".
#pragma once

#include <cstdint>
#include <string>

namespace nexar {

struct Tuning {
  /// Pipelining segment of collectives: ring and chain algorithms cut each block into
  /// segments of about this many bytes so the reduction of one overlaps the transfer of
  /// the next (NEXAR_SEGMENT_BYTES). Range 4 KiB .. 64 MiB. CollectiveOptions::segment_bytes
  /// overrides it for one call.
  std::uint64_t segment_bytes = 512 * 1024;
  /// all_reduce uses recursive halving-doubling below this many bytes (latency-bound) and
  /// the ring at or above it (bandwidth-bound) (NEXAR_ALLREDUCE_RING_BYTES).
  std::uint64_t allreduce_ring_bytes = 256 * 1024;
  /// all_reduce uses recursive doubling (log2 n rounds, whole vector each round) below this
  /// many bytes, where the number of rounds decides the time
  /// (NEXAR_ALLREDUCE_DOUBLING_BYTES).
  std::uint64_t allreduce_doubling_bytes = 16 * 1024;
  /// broadcast uses a binomial tree below this many bytes and a pipelined chain at or
  /// above it (NEXAR_BROADCAST_CHAIN_BYTES).
  std::uint64_t broadcast_chain_bytes = 1024 * 1024;
  /// Collectives send messages up to this size eagerly, from the caller's memory and
  /// without the rendezvous round trip; larger ones use the rendezvous
  /// (NEXAR_COLLECTIVE_EAGER_BYTES). Used capped at min(max_frame_bytes, stream_window,
  /// unexpected_limit), so an early message always fits one frame, one window and the
  /// receiver's unexpected buffer.
  std::uint64_t collective_eager_bytes = 1024 * 1024;
  /// For tests and benchmarks only: faults injected where datagrams arrive, to study the
  /// transport under loss, delay and reordering on one machine (NEXAR_IMPAIR). A list of
  /// key=value: drop=P and reorder=P (probabilities per datagram), delay_ms, jitter_ms,
  /// reorder_ms (how long a reordered datagram is held, default 1) and seed (of the random
  /// choices). Example: "drop=0.01,seed=7". Empty (the default): none.
  std::string impair;
};

}  // namespace nexar
