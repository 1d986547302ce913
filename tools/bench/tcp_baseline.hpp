// A plain TCP connection over loopback, the baseline nexar is compared against.
// Blocking sockets, TCP_NODELAY, read/write loops: what a careful hand-written
// point-to-point transport would do. Errors throw std::runtime_error naming the call.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace nexar::bench {

/// A socket listening on 127.0.0.1 on an ephemeral port. Create it before fork() so the
/// child can connect to port() without any rendezvous.
class TcpListener {
 public:
  TcpListener();
  ~TcpListener();
  TcpListener(const TcpListener&) = delete;
  TcpListener& operator=(const TcpListener&) = delete;

  std::uint16_t port() const noexcept { return port_; }
  /// Closes the listening socket (the child does this after fork()).
  void close() noexcept;
  /// Accepts one connection, waiting at most `timeout`; returns the connected fd.
  int accept(std::chrono::milliseconds timeout);

 private:
  int fd_ = -1;
  std::uint16_t port_ = 0;
};

/// One connected TCP socket with TCP_NODELAY set.
class TcpLink {
 public:
  /// Takes ownership of a connected socket.
  explicit TcpLink(int fd);
  /// Connects to 127.0.0.1:`port`.
  static TcpLink connect_loopback(std::uint16_t port);
  ~TcpLink();
  TcpLink(TcpLink&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  TcpLink& operator=(TcpLink&&) = delete;
  TcpLink(const TcpLink&) = delete;
  TcpLink& operator=(const TcpLink&) = delete;

  /// Writes all `bytes` bytes (looping over partial writes).
  void write_all(const void* data, std::size_t bytes);
  /// Reads exactly `bytes` bytes; throws if the peer closes first.
  void read_all(void* data, std::size_t bytes);

 private:
  int fd_ = -1;
};

}  // namespace nexar::bench
