// nexar — configuration.
//
// Every setting lives in Config, with its default below (or in nexar/tuning.hpp, for
// Config::tuning, the unstable ones) and its NEXAR_* environment variable documented in
// docs/CONFIG.md. Config::from_env() starts from the defaults and
// applies the environment; a malformed or out-of-range value throws
// nexar::Error(Errc::invalid_argument) naming the variable and the value.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include <nexar/tuning.hpp>

namespace nexar {

/// Log verbosity, NEXAR_DEBUG = off|error|warn|info|debug|trace.
enum class LogLevel { off, error, warn, info, debug, trace };

/// What a communicator does when one of its members fails (NEXAR_ON_FAILURE =
/// abort|manual|automatic). In every policy the failure is detected, every member learns
/// it, and the communicator's operations fail with Errc::rank_failed naming the failed
/// rank(s); communicators without the failed rank are untouched.
enum class FailurePolicy {
  /// Fail fast: the communicator stays revoked for good; agree() and shrink() refuse
  /// (Errc::invalid_argument), so a job that did not plan for failures stops clearly.
  abort,
  /// The application catches the error, then calls agree() and shrink() itself.
  manual,
  /// The operation that saw the failure throws (with the failed set); the runtime then
  /// agrees with the survivors and rebuilds the same Communicator object in place: its
  /// rank(), size() and id() change and the next call works.
  automatic,
};

/// "abort", "manual" or "automatic".
const char* to_string(FailurePolicy p) noexcept;

/// The congestion controller of every QUIC connection between ranks (NEXAR_CONGESTION =
/// cubic|bbr), both ngtcp2's. docs/CONFIG.md has the measured trade-off.
enum class Congestion {
  /// The default, as TCP's: loss-based. Each loss cuts the window by 30%, and it fills
  /// whatever queue the path has, which also absorbs a sender that is late to run.
  cubic,
  /// Paces at the bottleneck rate it measures and does not shrink its window at every
  /// loss. As fast as CUBIC on a clean link and faster under random loss or a long round
  /// trip, when each rank has a core of its own; slower than CUBIC when ranks are short of
  /// CPU (more ranks than cores), since it keeps the queue that would cover for them short.
  bbr,
};

/// "cubic" or "bbr".
const char* to_string(Congestion c) noexcept;

/// What carries the data, bulk and collective lanes between ranks on different hosts
/// (NEXAR_LINK = quic|tcp). Control, RPC, heartbeats, failure detection and membership stay
/// on QUIC either way, and ranks of one host keep shared memory (Config::shm).
enum class LinkKind {
  /// The pair's QUIC connections: every byte encrypted and acknowledged in user space.
  quic,
  /// One TCP connection per lane, attached only by a peer that proves a secret of the
  /// pair's QUIC session (docs/SECURITY.md), protected as Config::tcp_cipher says. The
  /// kernel segments, acknowledges and retransmits, so a byte costs less CPU than on QUIC.
  /// A pair uses it only when both ranks ask for it with the same tcp_cipher; otherwise
  /// the pair stays on QUIC and says so at info level.
  tcp,
};

/// "quic" or "tcp".
const char* to_string(LinkKind k) noexcept;

/// The protection of the TCP link (NEXAR_TCP_CIPHER = tls|none).
enum class TcpCipher {
  /// A TLS 1.3 session (AES-128-GCM) over each TCP connection, keyed from the pair's QUIC
  /// session: no byte travels in the clear.
  tls,
  /// Plaintext after the attach proof: for a fabric the user trusts. The peer is still
  /// authenticated when the connection attaches, but its bytes can be read and altered on
  /// the way (docs/SECURITY.md).
  none,
};

/// "tls" or "none".
const char* to_string(TcpCipher c) noexcept;

/// Which pairs of ranks hold a direct connection (NEXAR_TOPOLOGY). Messages between ranks
/// that are not neighbours are relayed hop by hop through neighbours, transparently: every
/// operation works on every topology, only the number of connections (and hops) changes.
struct Topology {
  enum class Kind {
    /// Every rank connects to every other: n-1 connections per rank (the default).
    full_mesh,
    /// A ring lattice: rank r connects to r±1 .. r±k/2 (mod n), k connections per rank.
    k_regular,
    /// Rank r connects to r xor 2^i for every i with r xor 2^i < n: log2 n connections.
    hypercube,
  };
  Kind kind = Kind::full_mesh;
  /// k_regular: neighbours per rank; even, at least 2.
  std::uint32_t k = 0;

  /// Parses "full_mesh", "k_regular:K" or "hypercube" (case-insensitive). Throws
  /// nexar::Error(Errc::invalid_argument) naming the text and what was wrong.
  static Topology parse(std::string_view text);
  /// The form parse() reads: "full_mesh", "k_regular:4", "hypercube".
  std::string to_string() const;
  friend bool operator==(const Topology&, const Topology&) = default;
};

struct Config {
  /// Deadline of every blocking call that does not take its own (NEXAR_TIMEOUT_MS).
  std::chrono::milliseconds op_timeout{std::chrono::minutes(5)};
  /// Deadline of connection set-up, handshake included (NEXAR_CONNECT_TIMEOUT_MS).
  std::chrono::milliseconds connect_timeout{std::chrono::seconds(20)};
  /// QUIC idle timeout: a peer silent this long is declared failed (NEXAR_IDLE_TIMEOUT_MS).
  /// Keep-alive PINGs are sent at a third of it, so only a dead peer goes silent.
  std::chrono::milliseconds idle_timeout{std::chrono::seconds(15)};
  /// How long a peer may stay silent before it is declared failed
  /// (NEXAR_FAILURE_TIMEOUT_MS). Liveness is judged on what is received from the peer (any
  /// packet counts); heartbeats go out at a tenth of this while a peer is quiet. A peer
  /// whose port is unreachable (its process exited) is declared failed at once. The QUIC
  /// idle timeout (above) is raised to at least twice this, so this decides first.
  std::chrono::milliseconds failure_timeout{std::chrono::seconds(3)};
  /// What communicators do when a member fails (NEXAR_ON_FAILURE); see FailurePolicy.
  FailurePolicy on_failure = FailurePolicy::abort;
  /// Default deadline of an RPC call (NEXAR_RPC_TIMEOUT_MS).
  std::chrono::milliseconds rpc_timeout{std::chrono::seconds(30)};
  /// Most RPC handlers one rank runs at once (NEXAR_RPC_THREADS), range 1 .. 1024. A handler
  /// thread is added whenever a request arrives while every thread is busy, so handlers
  /// may call RPCs themselves (back to their caller too); a request that finds all of them
  /// waiting for their own nested calls fails at once with Errc::rpc_failed instead of
  /// waiting for a deadlock's timeout.
  std::uint32_t rpc_threads = 16;

  /// A collective that has waited this long is reported once, at warn level: the members
  /// that have not called it, the last one each completed and what each is doing
  /// (NEXAR_STALL_WARN_MS; 0 turns the reports off). The collective keeps waiting until its
  /// own deadline, and the timeout's error carries the same report. README, "Diagnosing a
  /// job".
  std::chrono::milliseconds stall_warn{std::chrono::seconds(10)};
  /// Collectives each communicator's flight recorder keeps (NEXAR_RECORDER_OPS), 0 .. 2^20
  /// (1 .. 15 keep 16); 0 keeps none: Communicator::recorder() is empty, and only sends and
  /// receives are reported as stalled.
  std::uint32_t recorder_ops = 1024;
  /// A directory (created if missing) where each rank writes a trace of its collectives,
  /// their waits and its sends and receives when its last communicator closes:
  /// `<dir>/nexar-trace-<rank>-<pid>.json`, Chrome trace-event JSON that Perfetto and
  /// chrome://tracing open; `tools/trace/nexar-trace merge` puts the ranks on one timeline
  /// and names the straggler (NEXAR_TRACE). Empty (the default): no trace.
  std::string trace;

  /// Largest payload one frame may claim; larger claims are a protocol error
  /// (NEXAR_MAX_FRAME_BYTES). Messages larger than this are refused at send().
  std::uint64_t max_frame_bytes = std::uint64_t{1} << 31;
  /// Messages up to this size are sent eagerly; larger ones wait for the receiver
  /// to post a matching receive and then land straight in its buffer
  /// (NEXAR_EAGER_LIMIT_BYTES).
  std::uint64_t eager_limit = 64 * 1024;
  /// Bytes of unexpected (not yet received) eager messages buffered per peer and per
  /// message lane (data, bulk, collective) before the receiver stops extending
  /// flow-control credit to that peer's lane (NEXAR_UNEXPECTED_LIMIT_BYTES).
  std::uint64_t unexpected_limit = 64ull * 1024 * 1024;
  /// QUIC per-stream receive window (NEXAR_STREAM_WINDOW_BYTES).
  std::uint64_t stream_window = 16ull * 1024 * 1024;
  /// Largest UDP payload sent (NEXAR_UDP_PAYLOAD_BYTES), range 1200..65527, fixed for
  /// every connection. 0 (the default): per connection, the MTU of the route to the peer
  /// less the IP and UDP headers; on loopback from the first packet, elsewhere confirmed
  /// by path MTU probes (starting from 1200 bytes), so a jumbo-frame network gets about
  /// 8950-byte datagrams and a 1500-byte one 1450-1470.
  std::uint32_t udp_payload = 0;
  /// Use UDP GSO/GRO when the kernel supports them (NEXAR_UDP_GSO=0 disables).
  bool udp_gso = true;
  /// Hold the bulk lane's bytes in flight on QUIC under a delay-based window, so that
  /// bulk_send yields the path to every other lane instead of filling its queues
  /// (NEXAR_BULK_SCAVENGER=0 disables). A barrier or small message to a peer that is also
  /// receiving a bulk transfer then waits tens of microseconds behind it on a LAN, not the
  /// milliseconds a full queue holds. Off, bulk competes under congestion control alone.
  bool bulk_scavenger = true;
  /// Congestion controller of the QUIC connections between ranks (NEXAR_CONGESTION); see
  /// Congestion. Connections to and from the seed always use CUBIC.
  Congestion congestion = Congestion::cubic;
  /// What carries the data, bulk and collective lanes between ranks on different hosts
  /// (NEXAR_LINK); see LinkKind. Both ranks of a pair must ask for tcp.
  LinkKind link = LinkKind::quic;
  /// The TCP link's protection (NEXAR_TCP_CIPHER); see TcpCipher. Both ranks of a pair must
  /// agree, or the pair stays on QUIC.
  TcpCipher tcp_cipher = TcpCipher::tls;
  /// QUIC connections between two ranks on different hosts (NEXAR_CONNECTIONS_PER_PEER),
  /// range 1 .. 16. Beyond the first, each extra connection carries only collective
  /// traffic: every collective message has a tag of its own (docs/PROTOCOL.md), so a
  /// collective's messages to one neighbour go round the connections and matching needs no
  /// order between them. Each connection has its own congestion window, so a lost packet
  /// shrinks one window of several, as parallel TCP streams do; that is what keeps a lossy
  /// link full (docs/CONFIG.md). Control, RPC, point-to-point and bulk traffic stay on the
  /// first connection. The higher rank of a pair dials the extra ones once the pair is up;
  /// a rank whose own setting is lower refuses the surplus, so the pair uses the smaller
  /// of the two. Ranks that share memory (shm) never open extra connections.
  std::uint32_t connections_per_peer = 4;
  /// Threads that encrypt and move packets for this rank (NEXAR_ENGINE_THREADS), range
  /// 1 .. 16. The first is the engine thread that holds every connection's first QUIC
  /// connection and all matching; each further one (a shard) has a UDP socket, a timer and a
  /// lock of its own and hosts a share of the extra connections (connections_per_peer): the
  /// extra connection number i of a pair lives on thread i mod engine_threads at each end.
  /// A pair's collective traffic is then encrypted, decrypted and acknowledged on several
  /// cores, where one thread caps a rank at what one core can push. Worth it only with a
  /// core to spare per thread (docs/CONFIG.md); 1 keeps everything on one thread.
  std::uint32_t engine_threads = 1;
  /// Carry the message lanes (data, bulk, collective) between ranks of one host through
  /// shared memory instead of QUIC (NEXAR_SHM=0 disables). Control, RPC, heartbeats and
  /// everything to other hosts stay on QUIC. Two ranks use it when both have it on and
  /// run as the same user in the same network namespace of the same kernel.
  bool shm = true;
  /// Bytes of each shared-memory ring: one per message lane and direction between two
  /// ranks of a host (NEXAR_SHM_RING_BYTES). A power of two, 64 KiB .. 256 MiB.
  std::uint64_t shm_ring_bytes = 1024 * 1024;
  /// all_reduce, reduce_scatter, all_gather, broadcast and barrier of at most this many
  /// bytes per rank (all_gather: its whole result; algorithm automatic), on a communicator whose members all share memory with each other, go
  /// through mailboxes in shared memory instead of the collective lane; a blocking call
  /// runs them in the calling thread (NEXAR_SHM_COLLECTIVE_BYTES; 0 disables; at most
  /// 1 GiB). The members agree on it: the smallest value among them applies. What the
  /// path is fastest for applies too: all_reduce and reduce_scatter of any size up to it
  /// (with 2 ranks up to 128 KiB), all_gather up to 1 MiB and broadcast up to 256 KiB
  /// (both 128 KiB with 2 ranks) (docs/CONFIG.md).
  std::uint64_t shm_collective_bytes = std::uint64_t{1} << 30;
  /// Which ranks connect directly (NEXAR_TOPOLOGY = full_mesh | k_regular:K | hypercube);
  /// see Topology. Every rank of a job must use the same.
  Topology topology;
  /// Open the connections of a full mesh on first use instead of at start
  /// (NEXAR_LAZY_CONNECT=1). A rank then connects only to the ranks it exchanges messages
  /// with: a ring all_reduce over 256 ranks costs each rank 2 connections, not 255, and
  /// forming the cluster costs no handshake at all. The first message to a rank waits for
  /// the handshake (about one round trip, plus TLS). Either rank of a pair may dial first;
  /// when both do at once, the lower rank's connection wins. Failures are judged for every
  /// connected rank as usual, and a receive from a specific rank connects to it, so a dead
  /// sender is noticed; a rank nobody exchanged anything with is noticed only when someone
  /// first tries. Off by default; only with topology full_mesh (sparse topologies connect
  /// their neighbours at start, to relay through them).
  bool lazy_connect = false;
  /// Most hops a relayed message may take (NEXAR_RELAY_HOPS), 1 .. 255; 0 (the default):
  /// the topology's diameter plus 4, room to route around a few failed ranks. A message
  /// whose route is longer fails at once with Errc::invalid_argument naming the
  /// destination and both figures; a relay drops one that exceeded it.
  std::uint32_t relay_hop_limit = 0;
  /// Bytes one rank may have in flight to one non-neighbour per lane, unacknowledged by
  /// the destination (NEXAR_RELAY_WINDOW_BYTES), 64 KiB .. 1 GiB. It bounds what every
  /// relay holds for that pair, so a slow destination never stalls other traffic through
  /// the same relay.
  std::uint64_t relay_window = 4ull * 1024 * 1024;
  /// How long a waiting thread (user or engine) spins before sleeping, while transfers
  /// are active (NEXAR_SPIN_US). Waking a sleeping thread costs 50-100 us on small hosts.
  std::chrono::microseconds spin{std::chrono::microseconds(100)};
  /// While spinning, give up the core after every poll (sched_yield), like Open MPI's
  /// mpi_yield_when_idle, and run the progress thread under SCHED_BATCH so that its
  /// wake-ups never preempt a running rank (NEXAR_YIELD_WHEN_IDLE). Set automatically when
  /// a host runs more ranks than it has cores, where the rank a waiter waits for may need
  /// that very core.
  bool yield_when_idle = false;

  /// Algorithm thresholds and fault injection: not part of the stable API (tuning.hpp).
  Tuning tuning;

  /// Log level (NEXAR_DEBUG).
  LogLevel log_level = LogLevel::warn;

  /// Returns the defaults overridden by NEXAR_* environment variables.
  /// Throws nexar::Error(Errc::invalid_argument) on a malformed value. A NEXAR_* variable
  /// that nexar does not read is logged at warn level, once per process, naming the
  /// closest one that exists (docs/CONFIG.md).
  static Config from_env();

  /// Throws nexar::Error(Errc::invalid_argument) if a value is out of range.
  void validate() const;

  /// One line per setting, "name = value", for logs (impair only when set); the same as
  /// describe(true).
  std::string describe() const;
  /// all = true: every setting, as describe(). all = false: only the settings whose value
  /// differs from the default Config{}'s (an empty string when none does).
  std::string describe(bool all) const;
};

}  // namespace nexar
