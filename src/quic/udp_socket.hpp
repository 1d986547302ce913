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
  /// space when the socket's send buffer is full. A datagram a full queue further on (the
  /// device's qdisc) refuses is lost there, as at a full router: it is counted
  /// (queue_drops) and reported sent, and QUIC's loss recovery and congestion control
  /// answer it as any loss. Datagrams carry don't-fragment; one larger than
  /// the path MTU the kernel knows is sent as IP fragments when `may_fragment`, and
  /// dropped (-EMSGSIZE) otherwise (path MTU probes). Returns 0 or a negative errno.
  int send(const Address& to, const std::uint8_t* data, std::size_t len, std::size_t segment,
           bool may_fragment = true);

  /// The MTU of the route to `to` as the kernel knows it (the interface MTU, or a smaller
  /// path MTU learned from ICMP); 0 when there is no route.
  static std::size_t route_mtu(const Address& to);

  /// Datagrams sent as IP fragments because the path carried less than their size.
  std::uint64_t fragmented() const noexcept { return fragmented_; }
  /// Sends a full queue beyond the socket refused (ENOBUFS): lost there, not resent.
  std::uint64_t queue_drops() const noexcept { return queue_drops_; }
  /// Datagrams the kernel dropped on arrival because the receive queue was full (as of the
  /// last datagram received; SO_RXQ_OVFL).
  std::uint64_t receive_drops() const noexcept { return receive_drops_; }

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
  void set_dont_fragment(bool on);
  int send_one(const Address& to, const std::uint8_t* data, std::size_t len, std::size_t segment);
  /// send_one, tried again once on EMSGSIZE (which may belong to an earlier datagram).
  int send_df(const Address& to, const std::uint8_t* data, std::size_t len, std::size_t segment);

  int fd_ = -1;
  bool gso_ = false;
  bool gro_ = false;
  std::uint64_t fragmented_ = 0;
  std::uint64_t queue_drops_ = 0;
  std::uint64_t receive_drops_ = 0;
  Address local_;
};

}  // namespace nexar::quic
