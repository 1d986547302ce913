// One QUIC connection (ngtcp2 + GnuTLS) to one peer. Sans-I/O in spirit: it never touches
// the socket or the clock itself; the Endpoint hands it packets and timestamps and sends
// what it writes. What it carries for its user comes back through callbacks: stream bytes
// and events to the ConnectionHandler, the fate of each queued chunk to its Completion.
// Loop thread only.
#pragma once

#include <ngtcp2/ngtcp2.h>
#include <ngtcp2/ngtcp2_crypto.h>
#include <gnutls/gnutls.h>

#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nexar/config.hpp>
#include <nexar/error.hpp>

#include "core/impair_spec.hpp"
#include "quic/address.hpp"
#include "quic/completion.hpp"
#include "quic/scavenger.hpp"

namespace nexar::tls {
class TlsContext;
}

namespace nexar::quic {

class Connection;
class Endpoint;

/// Bytes queued on a stream. They must stay valid until `done` runs (ngtcp2 retransmits
/// from them): with Errc::ok once the peer acknowledged the last of them, or with the error
/// that made the connection drop them. `done` may own them.
struct Chunk {
  const std::uint8_t* data = nullptr;
  std::size_t len = 0;
  Completion done;
};

/// Events of a connection, delivered on the loop's thread.
class ConnectionHandler {
 public:
  virtual ~ConnectionHandler() = default;
  /// The peer's certificate verified and names `node`; return an empty string to accept
  /// or the reason to reject the handshake.
  virtual std::string on_peer_identity(Connection& c, const std::string& node) = 0;
  virtual void on_established(Connection& c) = 0;
  /// Bytes of a stream the peer opened, in order. Call Connection::consumed() once the
  /// bytes may be replaced by new ones (this extends the peer's flow-control credit).
  virtual void on_stream_data(Connection& c, std::int64_t stream, const std::uint8_t* data,
                              std::size_t len) = 0;
  /// The connection is gone; `why` explains. Called exactly once.
  virtual void on_closed(Connection& c, Errc code, const std::string& why) = 0;
};

/// Application error codes of a CONNECTION_CLOSE (docs/PROTOCOL.md): 0 an orderly close,
/// 1 an error, 2 the closing side declared the receiving side failed. A close with code 2
/// reaches the handler as Errc::rank_failed.
inline constexpr std::uint64_t close_orderly = 0;
inline constexpr std::uint64_t close_error = 1;
inline constexpr std::uint64_t close_declared_failed = 2;

struct ConnectionSettings {
  /// Largest UDP payload sent; 0: the route's MTU, probed off loopback (Endpoint::defaults).
  std::size_t udp_payload = 0;
  std::uint64_t stream_window = 16u << 20;
  std::uint64_t conn_window = 64u << 20;
  std::uint64_t idle_timeout_ns = 15'000'000'000ull;
  std::uint64_t handshake_timeout_ns = 20'000'000'000ull;
  /// The ALPN protocol ids an accepting endpoint takes; a dial offers one of them, the
  /// first unless Endpoint::connect names another. Peers of another protocol (a worker
  /// dialling a seed port with the mesh protocol, say) fail the handshake.
  std::vector<std::string> alpn{"nexar/1"};
  /// Faults injected on arrival (Config::tuning.impair); inactive by default.
  detail::ImpairSpec impair;
  /// Which of ngtcp2's congestion controllers the connection runs (Config::congestion).
  Congestion congestion = Congestion::cubic;
};

class Connection {
 public:
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  bool is_server() const noexcept { return server_; }
  bool established() const noexcept { return established_; }
  /// The ALPN protocol id the handshake settled on; empty until the TLS hello that settles
  /// it was read (an acceptor knows it by the time it checks the dialler's certificate).
  std::string alpn() const;
  bool closed() const noexcept { return closed_; }
  /// Whether the connection ended because the peer's UDP port answered unreachable: its
  /// process closed the socket (or is gone), as opposed to a silence or an error frame.
  bool port_gone() const noexcept { return port_gone_; }
  const Address& remote() const noexcept { return remote_; }
  const std::string& peer_node() const noexcept { return peer_node_; }

  /// The congestion window and slow-start threshold now (diagnostics, tests). CUBIC sets a
  /// threshold at its first loss; BBR never does (it stays UINT64_MAX).
  struct CongestionState {
    std::uint64_t cwnd = 0, ssthresh = 0;
  };
  CongestionState congestion_state() const;
  /// The path as loss recovery sees it (Communicator::stats()): round-trip times in ns, the
  /// congestion window, bytes in flight, and the packets carrying stream data that were
  /// declared lost (spurious losses included), over the streams opened here.
  struct PathStats {
    std::uint64_t rtt = 0, min_rtt = 0, latest_rtt = 0, rtt_var = 0;
    std::uint64_t cwnd = 0, bytes_in_flight = 0, lost_packets = 0;
  };
  PathStats path_stats() const;

  void set_handler(ConnectionHandler* h) noexcept { handler_ = h; }
  /// Opaque slot for the owner (the transport stores its peer here).
  void* user = nullptr;

  /// Opens a unidirectional stream; lower `priority` values are written first, and streams
  /// of equal priority take turns, packet by packet. A `scavenger` stream's bytes in flight
  /// are also held under a delay-based window (quic/scavenger.hpp), so that what it queues
  /// on the path never holds the other streams' packets up for long.
  std::int64_t open_stream(int priority, bool scavenger = false);
  /// Queues bytes on a stream opened with open_stream; they go out at the next flush.
  void push(std::int64_t stream, Chunk chunk);
  /// Bytes queued on `stream` and not yet acknowledged.
  std::uint64_t unacked(std::int64_t stream) const;
  /// Returns `n` bytes of flow-control credit to the peer on `stream`.
  void consumed(std::int64_t stream, std::uint64_t n);

  /// 32 bytes of keying material exported from the TLS session under `label` (RFC 5705 /
  /// RFC 8446 7.5): equal on both ends of this connection only, so a proof computed over it
  /// cannot be replayed on another. Throws nexar::Error(Errc::tls) before the handshake ends.
  std::array<std::uint8_t, 32> export_secret(std::string_view label) const;

  /// When the last packet from the peer was read and authenticated (Endpoint::now()
  /// clock), or when the connection was created: what failure detection judges by.
  std::uint64_t last_rx() const noexcept { return last_rx_; }

  /// Closes with an application error code; the peer sees `reason`. Idempotent.
  void close(std::uint64_t app_code, const std::string& reason);

 private:
  friend class Endpoint;
  struct SendStream {
    std::int64_t id = -1;
    int priority = 0;
    std::deque<Chunk> q;
    std::uint64_t base = 0;    // stream offset of q.front()
    std::size_t send_idx = 0;  // first chunk with unsent bytes
    std::size_t send_off = 0;  // unsent position inside it
    std::uint64_t queued = 0;  // stream offset of the end of queued data
    std::uint64_t sent = 0;    // stream offset handed to ngtcp2
    std::uint64_t last_turn = 0;  // turns_ when it last got bytes into a packet
    std::uint64_t acked = 0;      // stream offset acknowledged (contiguously) so far
    bool blocked = false;
    bool scavenger = false;
  };

  Connection(Endpoint& ep, bool server, const Address& remote);
  void init_tls(const tls::TlsContext& tls, const std::vector<std::string>& alpn);
  static ngtcp2_callbacks callbacks(bool server);

  int read(const ngtcp2_path& path, const std::uint8_t* pkt, std::size_t len, std::uint64_t ts);
  /// Writes everything sendable into packets handed to the endpoint.
  void flush(std::uint64_t ts);
  /// Whether stream data is queued that ngtcp2 has not taken yet (pacing, congestion or
  /// flow control holds it back).
  bool has_unsent() const noexcept;
  void handle_expiry(std::uint64_t ts);
  /// Fails everything queued and notifies the handler once.
  void finish(Errc code, const std::string& why);
  void check_liberr(int rv, const char* where);

  SendStream* stream(std::int64_t id);
  SendStream* next_writable();
  void acked(std::int64_t stream, std::uint64_t offset, std::uint64_t len);

  // ngtcp2 / GnuTLS callbacks
  static int cb_recv_stream_data(ngtcp2_conn*, std::uint32_t, std::int64_t, std::uint64_t,
                                 const std::uint8_t*, std::size_t, void*, void*);
  static int cb_acked(ngtcp2_conn*, std::int64_t, std::uint64_t, std::uint64_t, void*, void*);
  static int cb_handshake_completed(ngtcp2_conn*, void*);
  static int cb_new_cid(ngtcp2_conn*, ngtcp2_cid*, std::uint8_t*, std::size_t, void*);
  static int cb_remove_cid(ngtcp2_conn*, const ngtcp2_cid*, void*);
  static int cb_extend_stream(ngtcp2_conn*, std::int64_t, std::uint64_t, void*, void*);
  static int cb_stream_close(ngtcp2_conn*, std::uint32_t, std::int64_t, std::uint64_t, void*,
                             void*);
  static void cb_rand(std::uint8_t*, std::size_t, const ngtcp2_rand_ctx*);
  static ngtcp2_conn* cb_get_conn(ngtcp2_crypto_conn_ref*);
  static int cb_verify(gnutls_session_t);

  Endpoint& ep_;
  bool server_;
  Address remote_;
  ngtcp2_conn* conn_ = nullptr;
  gnutls_session_t session_ = nullptr;
  ngtcp2_crypto_conn_ref conn_ref_{};
  ngtcp2_path_storage path_{};
  ConnectionHandler* handler_ = nullptr;
  std::string expected_node_;  // client: the node we dialled
  std::string peer_node_;
  std::string verify_error_;
  std::vector<std::unique_ptr<SendStream>> streams_;  // sorted by priority
  std::uint64_t turns_ = 0;  // packets written with stream data, for round-robin
  Scavenger scavenger_{NGTCP2_MAX_UDP_PAYLOAD_SIZE};  // until the path's size is known
  std::uint64_t scavenger_in_flight_ = 0;  // bytes of scavenger streams sent, not yet acked
  std::vector<ngtcp2_cid> cids_;     // our source CIDs, registered at the endpoint
  bool established_ = false;
  bool port_gone_ = false;
  bool closed_ = false;
  bool flush_pending_ = false;
  bool fragmenting_ = false;      // the path's MTU shrank below our packets (logged once)
  std::size_t path_payload_ = 0;  // the path's datagram size last seen, to log its growth
  std::uint64_t id_ = 0;
  std::uint64_t last_rx_ = 0;
};

}  // namespace nexar::quic
