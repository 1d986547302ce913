// A TLS 1.3 session over one connected TCP socket, keyed by a secret both ends already
// share: the TCP link's protection (transport/tcp_link.hpp, docs/SECURITY.md, "The TCP
// link"). The key is an external pre-shared key combined with an ephemeral ECDHE exchange,
// so each connection gets fresh traffic keys and a recorded handshake cannot be replayed.
// No certificate is involved: whoever holds the key is the peer. AES-128-GCM only (the
// fastest cipher GnuTLS has on these CPUs: docs/PERFORMANCE.md).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

// GnuTLS's handle types, declared as gnutls.h does: users of this header need not see it.
typedef struct gnutls_session_int* gnutls_session_t;
typedef struct gnutls_psk_client_credentials_st* gnutls_psk_client_credentials_t;
typedef struct gnutls_psk_server_credentials_st* gnutls_psk_server_credentials_t;

namespace nexar::tls {

class PskSession {
 public:
  enum class Role { client, server };
  /// Handshakes over `fd` (a connected, blocking socket; not owned) within `limit`, with
  /// `key` as the pre-shared key. Throws nexar::Error(Errc::tls) naming what failed: a peer
  /// holding another key fails the handshake (GnuTLS's decryption or binder check).
  PskSession(int fd, Role role, std::span<const std::uint8_t, 32> key, std::chrono::milliseconds limit);
  ~PskSession();
  PskSession(const PskSession&) = delete;
  PskSession& operator=(const PskSession&) = delete;

  // After the handshake the socket may be made non-blocking; both calls then return 0
  // rather than wait.

  /// Encrypts and sends up to `len` bytes of `data`: returns how many were taken, 0 when
  /// the socket is full (call again later with the same bytes: GnuTLS holds a record it
  /// encrypted but could not send). Throws nexar::Error(Errc::io) when the connection broke.
  /// Between gather() and flush() every byte is taken.
  std::size_t send(const std::uint8_t* data, std::size_t len);
  /// From gather() to flush(), the records send() makes are gathered in the session (a
  /// batch of up to 272 KiB, more only while the socket is full) and leave in one write:
  /// GnuTLS hands them over one at a time, and a system call per 16 KiB record costs more
  /// in the kernel than the encryption. Encrypting straight from the caller's bytes, with
  /// nothing copied before, is why this is not GnuTLS's own cork.
  void gather() noexcept;
  /// Writes what was gathered: true once all left, false when the socket is full (call
  /// again later, before any other send). Throws nexar::Error(Errc::io) when the connection
  /// broke.
  bool flush();
  /// What recv() read.
  struct Read {
    std::size_t bytes = 0;  // decrypted into `out`
    bool eof = false;       // the peer closed (or the connection ended between records)
  };
  /// Reads and decrypts up to `cap` bytes into `out` (none when nothing waits). Throws
  /// nexar::Error(Errc::io) when the connection broke or a record does not authenticate.
  Read recv(std::uint8_t* out, std::size_t cap);
  /// Bytes read from the socket and not handed on yet, decrypted or not: the socket will
  /// not announce them again.
  bool pending() const noexcept;

  /// After the handshake, GnuTLS reads through a buffer of the session's: one recv() fills
  /// it with several records, where GnuTLS alone asks the socket twice per record (header,
  /// then body). Defined with the functions GnuTLS calls, in the .cpp.
  struct Transport;

 private:
  void release() noexcept;

  gnutls_session_t s_ = nullptr;
  gnutls_psk_client_credentials_t client_ = nullptr;
  gnutls_psk_server_credentials_t server_ = nullptr;
  std::uint8_t key_[32] = {};
  std::unique_ptr<Transport> io_;
};

}  // namespace nexar::tls
