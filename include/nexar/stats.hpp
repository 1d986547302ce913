// nexar — statistics of a communicator on this rank: what its collectives cost, and how
// the paths to its members behave (Communicator::stats()).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace nexar {

/// The collectives of one kind a communicator ran on this rank (those the flight recorder
/// held when they ended: with Config::recorder_ops 0 there are none).
struct OpStats {
  /// "all_reduce", "broadcast", ... as errors name it.
  std::string op;
  /// Collectives that ended, and how many of those failed.
  std::uint64_t calls = 0;
  std::uint64_t failed = 0;
  /// Bytes this rank passed to them (a v-form's total).
  std::uint64_t bytes = 0;
  /// Time from each call to its end, summed.
  std::chrono::nanoseconds total{0};
  /// The part of `total` this rank spent blocked: waiting for members' messages (a late
  /// member costs the others here) or for the network to carry its own, or for room in
  /// their mailboxes. The rest (total - waiting) it spent working: reducing, copying,
  /// posting, or queued behind earlier collectives. A bandwidth-bound collective over the
  /// network is mostly waiting; compare ranks to find the one the others wait for.
  std::chrono::nanoseconds waiting{0};
};

/// Bytes of one lane between this rank and a peer, over every link that carried them
/// (frame headers included). Bytes relayed through a neighbour (sparse topologies) count on
/// the pair with that neighbour too.
struct LaneStats {
  std::string lane;  ///< "control", "data", "rpc_request", "rpc_response", "bulk", "collective"
  std::uint64_t sent = 0;
  std::uint64_t received = 0;
};

/// The path from this rank to one member of the communicator.
struct PeerStats {
  /// The member's rank in the communicator, and in the world.
  int rank = -1;
  int world_rank = -1;
  /// Whether a working connection to it exists (one dialled, not relayed, not gone).
  bool connected = false;
  /// The links that carry its lanes now, e.g. {"quic"}, {"quic", "shm"},
  /// {"quic", "quic-stripes x3", "tcp"}, {"relay"}.
  std::vector<std::string> links;
  /// Of the pair's first QUIC connection (all zero without one): the smoothed, smallest
  /// and latest round-trip time and its variation, the congestion window, bytes in flight,
  /// and the packets declared lost that carried stream data (retransmitted since; losses
  /// that turned out spurious included).
  std::chrono::nanoseconds rtt{0}, min_rtt{0}, latest_rtt{0}, rtt_var{0};
  std::uint64_t cwnd = 0;
  std::uint64_t bytes_in_flight = 0;
  std::uint64_t lost_packets = 0;
  /// Per lane, in the order of LaneStats::lane above.
  std::vector<LaneStats> lanes;
};

/// Communicator::stats(): counters since the communicator (operations) or the rank's
/// connections (peers) began.
struct Stats {
  /// One entry per collective kind that ran, ordered by name.
  std::vector<OpStats> ops;
  /// One entry per other member, by rank.
  std::vector<PeerStats> peers;
  /// Datagrams of this rank's QUIC socket (its connections together; the sockets of extra
  /// engine threads, Config::engine_threads, are not counted) that the kernel
  /// dropped because the socket's receive queue was full, and datagrams it refused to send
  /// because a queue on the way out was full (both lost, then recovered by QUIC).
  std::uint64_t receive_drops = 0;
  std::uint64_t send_drops = 0;
};

}  // namespace nexar
