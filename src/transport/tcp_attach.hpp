// How a TCP connection of the TCP link (transport/tcp_link.hpp) is attached to a pair of
// ranks that already share an authenticated QUIC connection (docs/SECURITY.md, "The TCP
// link"; docs/PROTOCOL.md, "The TCP link"). Both ends derive two keys from the pair's QUIC
// TLS session (the RFC 8446 exporter, Connection::export_secret), which only the two of
// them hold:
//
//  1. The dialer sends a hello: magic, version, cipher, lane, its rank, the rank it means
//     to reach, and a fresh nonce.
//  2. The listener finds the keys of its offer to that rank (none: refused), checks the
//     rest, and answers with a fresh nonce of its own and a MAC over the hello and that
//     nonce under the attach key.
//  3. The dialer checks that MAC (the listener holds the key) and answers with a MAC of its
//     own over the same bytes, in the other role.
//  4. The listener checks it and sends one byte: attached. With the tls cipher both then
//     run a TLS 1.3 handshake keyed by the second key (tls/psk_session.hpp).
//
// Both nonces enter both MACs, so a recorded exchange replayed to either end fails, and a
// rank of the same cluster that dials someone else's port fails at step 2 or 3: it holds
// its own pair's keys, not these. Every step is blocking with a deadline, on threads of the
// transport's own, never on the engine.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include <nexar/config.hpp>

#include "quic/address.hpp"
#include "tls/psk_session.hpp"
#include "wire/frame.hpp"

namespace nexar::detail {

/// The two keys of a pair's TCP connections, exported from its QUIC session.
struct TcpKeys {
  std::array<std::uint8_t, 32> attach{};  // the MACs of steps 2 and 3
  std::array<std::uint8_t, 32> tls{};     // the TLS session's pre-shared key
};

/// One attached TCP connection: the socket (non-blocking from now on, owned) and, with the
/// tls cipher, its session.
struct TcpAttached {
  int fd = -1;
  std::unique_ptr<tls::PskSession> session;
  wire::Lane lane = wire::Lane::data;
  std::uint32_t rank = 0;  // the peer's

  TcpAttached() = default;
  TcpAttached(TcpAttached&& o) noexcept;
  TcpAttached& operator=(TcpAttached&& o) noexcept;
  ~TcpAttached();
};

/// The cipher's number on the wire (the attach hello, the tcp_offer frame): 0 tls, 1 none.
constexpr std::uint8_t cipher_code(TcpCipher c) noexcept { return c == TcpCipher::tls ? 0 : 1; }

/// Dials `to` and attaches a connection for `lane` between this rank `self` and `peer`.
/// Each step may take up to `step`. Throws nexar::Error(Errc::io) when the connection
/// fails, Errc::tls when the listener fails the proof or the TLS handshake.
TcpAttached tcp_dial(const quic::Address& to, std::uint32_t self, std::uint32_t peer, wire::Lane lane,
                     TcpCipher cipher, const TcpKeys& keys, std::chrono::milliseconds step);

/// Accepts and attaches connections on a TCP port, on a thread of its own.
class TcpListener {
 public:
  /// The keys of this rank's standing offer to `rank` for `lane`, or nothing (refused).
  /// The listener's thread calls it; the callee guards its own state. Looking up takes
  /// nothing: the attach may still fail its proof.
  using Lookup = std::function<std::optional<TcpKeys>(std::uint32_t rank, wire::Lane lane)>;
  /// A connection attached: its dialer proved the keys (on the listener's thread).
  using Attached = std::function<void(TcpAttached)>;
  /// Binds `host` (the address QUIC listens on; its port is ignored: the kernel picks
  /// one) and starts accepting. `self` is this rank, `cipher` what it protects with.
  /// Throws nexar::Error(Errc::io).
  TcpListener(const quic::Address& host, std::uint32_t self, TcpCipher cipher, Lookup lookup, Attached attached,
              std::chrono::milliseconds step);
  /// Stops accepting and joins the thread.
  ~TcpListener();
  TcpListener(const TcpListener&) = delete;
  TcpListener& operator=(const TcpListener&) = delete;

  std::uint16_t port() const noexcept { return port_; }
  /// Attach attempts refused so far (no offer, a wrong proof, a malformed hello), for tests.
  std::uint64_t refused() const noexcept { return refused_.load(std::memory_order_relaxed); }

 private:
  void run();
  void serve(int fd);

  int fd_ = -1;
  int stop_[2] = {-1, -1};  // a pipe that wakes the thread to stop
  std::uint16_t port_ = 0;
  std::uint32_t self_;
  TcpCipher cipher_;
  Lookup lookup_;
  Attached attached_;
  std::chrono::milliseconds step_;
  std::atomic<std::uint64_t> refused_{0};
  std::thread thread_;
};

}  // namespace nexar::detail
