// Clusters formed without a seed: every rank's credentials and address are known up front.
// Used by bootstrap_local (threads of one process) and by tools that fork() one process
// per rank after planning (nexar-bench p2p).
#pragma once

#include <nexar/communicator.hpp>
#include <nexar/config.hpp>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "tls/node_key.hpp"
#include "transport/node.hpp"

namespace nexar::cluster {

/// Everything one rank needs to start.
struct NodePlan {
  int rank = 0;
  int world = 1;
  tls::NodeCredentials creds;
  int udp_fd = -1;                 ///< bound, non-blocking UDP socket; start_node owns it
  std::vector<std::string> addrs;  ///< "ip:port" of every rank, indexed by rank
  /// The relay key this rank shares with every rank, indexed by rank (its own zero).
  std::vector<detail::RelayKey> relay_keys;
};

/// Binds `n` UDP sockets on 127.0.0.1 (ephemeral ports), issues each rank credentials from a
/// fresh in-memory cluster CA, and gives each the relay keys of its pairs (derived from a
/// fresh master secret, as a seed does; the master is not kept). Starts no thread, so the
/// caller may fork() afterwards.
/// Throws nexar::Error (invalid_argument for n < 1, io, tls).
std::vector<NodePlan> plan_local(int n, const Config& config);

/// Whether `local_ranks` ranks on this host exceed their cores: then waiters must give up
/// their core between polls, or they take it from the ranks they wait for. The cores are
/// those this process may run on, or `local_cpus` (the job's CPUs on this host, from a
/// launcher that bound each rank to its own: NEXAR_LOCAL_CPUS) where that is more. A rank
/// bound to one CPU of several would otherwise count itself oversubscribed.
bool oversubscribed(int local_ranks, int local_cpus = 0);

/// The waiting behaviour for more ranks than cores: poll for up to 1 ms, yielding the core
/// after every poll (measured, 4 processes on 2 cores: 8 B all_reduce 0.16-0.21 ms, against
/// 0.42-0.47 ms sleeping at once and 0.37 ms spinning 100 us; 1-16 MiB 5-60% faster).
void wait_politely(Config& config);

/// Called with a node once it started, before its communicator is returned.
using NodeStarted = std::function<void(detail::Node&)>;

/// Starts a member whose identity, credentials, peers and socket are settled: creates its
/// progress engine, connects to every peer (ranks below it dial in, it dials the ranks
/// above it), and returns once every connection is established and authenticated.
/// Throws nexar::Error (timeout, tls, io).
Communicator start_member(detail::NodeOptions options, const Config& config, const NodeStarted& started = {});

/// Starts a node that joined a running elastic job (options.late): it dials nobody; the
/// members dial it. Returns the communicator of the first grow that admits it, once every
/// member of it is connected. Throws nexar::Error: timeout (no grow took it in by `until`,
/// or a member never connected), rank_failed, closed, tls, io.
Communicator start_joiner(detail::NodeOptions options, const Config& config, const NodeStarted& started,
                          std::chrono::steady_clock::time_point until);

/// What a Node of rank `plan.rank` is made from (its socket moves into it).
detail::NodeOptions node_options(NodePlan plan);

/// Starts rank `plan.rank`: creates its progress engine, connects to every peer (ranks
/// below it dial in, it dials the ranks above it), and returns once every connection is
/// established and authenticated. Throws nexar::Error (timeout, tls, io).
Communicator start_node(NodePlan plan, const Config& config);

/// Closes the sockets of plans a process will not start (after fork()).
void discard(std::vector<NodePlan>& plans, int keep_rank);

}  // namespace nexar::cluster
