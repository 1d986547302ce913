// One non-blocking UDP socket with batched send (UDP GSO) and coalesced receive (UDP GRO),
// falling back to one datagram per syscall where the kernel lacks them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <sys/types.h>

#include "quic/address.hpp"

namespace nexar::quic {

class UdpSocket {
 public:
  /// Creates a non-blocking UDP socket bound to `addr` (port 0 picks one), with large
  /// kernel buffers. Throws nexar::Error(Errc::io) naming the address on failure.
  static int open_bound(const Address& addr);

  /// Takes ownership of `fd`. `try_gso` enables GSO/GRO when the kernel accepts them.
  UdpSocket(int fd, bool try_gso);
  ~UdpSocket();
  UdpSocket(const UdpSocket&) = delete;
  UdpSocket& operator=(const UdpSocket&) = delete;

  int fd() const noexcept { return fd_; }
  const Address& local() const noexcept { return local_; }
  bool gso() const noexcept { return gso_; }

  /// Sends `len` bytes made of back-to-back packets of `segment` bytes (the last may be
  /// shorter) to `to`: one syscall with GSO, else one per packet. Waits briefly for buffer
  /// space when the kernel queue is full. Returns 0 or a negative errno.
  int send(const Address& to, const std::uint8_t* data, std::size_t len, std::size_t segment);

  /// Receives one datagram (with GRO possibly several coalesced packets of `segment` bytes
  /// each). Returns its size, or -EAGAIN when nothing is queued, or another -errno.
  ssize_t recv(std::uint8_t* buf, std::size_t cap, Address& from, std::size_t& segment);

  /// Reads queued ICMP errors (IP_RECVERR) and reports each unreachable destination.
  /// A "port unreachable" from a peer's address means no process listens there any more.
  template <class F>
  void drain_errors(F&& on_unreachable) {
    Address a;
    while (read_error(a)) on_unreachable(a);
  }

  /// Largest batch one send() accepts.
  static constexpr std::size_t max_batch_bytes = 65000;
  static constexpr std::size_t max_batch_segments = 64;

 private:
  bool read_error(Address& offender);
  int send_one(const Address& to, const std::uint8_t* data, std::size_t len, std::size_t segment);

  int fd_ = -1;
  bool gso_ = false;
  bool gro_ = false;
  Address local_;
};

}  // namespace nexar::quic
