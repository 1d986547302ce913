#include "quic/udp_socket.hpp"

#include <fcntl.h>
#include <linux/errqueue.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <nexar/error.hpp>

#include "core/log.hpp"

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif

namespace nexar::quic {

int UdpSocket::open_bound(const Address& addr) {
  int fd = ::socket(addr.family(), SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    throw Error(Errc::io, "udp socket for " + addr.to_string() + ": " + std::strerror(errno));
  }
  // Deep kernel buffers absorb bursts of a whole congestion window; FORCE works as root.
  int sz = 16 * 1024 * 1024;
  for (int opt : {SO_RCVBUF, SO_SNDBUF}) {
    int force = opt == SO_RCVBUF ? SO_RCVBUFFORCE : SO_SNDBUFFORCE;
    if (::setsockopt(fd, SOL_SOCKET, force, &sz, sizeof sz) != 0) {
      ::setsockopt(fd, SOL_SOCKET, opt, &sz, sizeof sz);
    }
  }
  if (addr.family() == AF_INET6) {
    int on = 1;
    ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &on, sizeof on);
  }
  if (::bind(fd, addr.sa(), addr.len) != 0) {
    int e = errno;
    ::close(fd);
    throw Error(Errc::io, "bind udp " + addr.to_string() + ": " + std::strerror(e));
  }
  return fd;
}

UdpSocket::UdpSocket(int fd, bool try_gso) : fd_(fd) {
  local_.len = sizeof(local_.storage);
  ::getsockname(fd_, local_.sa(), &local_.len);
  int fl = ::fcntl(fd_, F_GETFL);
  ::fcntl(fd_, F_SETFL, fl | O_NONBLOCK);
  // ICMP errors (a peer's port closed because its process died) come back on the error
  // queue, which lets a dead peer's connection fail at once instead of at the idle timeout.
  int on_err = 1;
  if (local_.family() == AF_INET6) {
    ::setsockopt(fd_, IPPROTO_IPV6, IPV6_RECVERR, &on_err, sizeof on_err);
  } else {
    ::setsockopt(fd_, IPPROTO_IP, IP_RECVERR, &on_err, sizeof on_err);
  }
  // Don't-fragment on every datagram: a path MTU probe must not pass as IP fragments (it
  // would prove a size the path does not carry), and a datagram larger than the path MTU
  // the kernel knows fails at once with EMSGSIZE instead of being fragmented silently;
  // send() then decides what to do with it.
  set_dont_fragment(true);
  if (try_gso) {
    int seg = 1200;
    // Probe GSO support by setting it once on the socket, then clear it: per-send cmsgs
    // carry the real segment size.
    if (::setsockopt(fd_, SOL_UDP, UDP_SEGMENT, &seg, sizeof seg) == 0) {
      seg = 0;
      ::setsockopt(fd_, SOL_UDP, UDP_SEGMENT, &seg, sizeof seg);
      gso_ = true;
    }
    int on = 1;
    gro_ = ::setsockopt(fd_, SOL_UDP, UDP_GRO, &on, sizeof on) == 0;
  }
  int on = 1;
  (void)::setsockopt(fd_, SOL_SOCKET, SO_RXQ_OVFL, &on, sizeof on);  // counts receive drops
  log::debug("udp socket {} bound to {} (gso {}, gro {})", fd_, local_.to_string(), gso_, gro_);
}

UdpSocket::~UdpSocket() {
  if (fd_ >= 0) ::close(fd_);
}

static bool wait_writable(int fd) {
  pollfd p{fd, POLLOUT, 0};
  return ::poll(&p, 1, 50) > 0;
}

int UdpSocket::send_one(const Address& to, const std::uint8_t* data, std::size_t len,
                        std::size_t segment) {
  iovec iov{const_cast<std::uint8_t*>(data), len};
  msghdr msg{};
  msg.msg_name = const_cast<sockaddr*>(to.sa());
  msg.msg_namelen = to.len;
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(std::uint16_t))] = {};
  if (segment > 0 && len > segment) {
    msg.msg_control = ctrl;
    msg.msg_controllen = sizeof ctrl;
    cmsghdr* cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_UDP;
    cm->cmsg_type = UDP_SEGMENT;
    cm->cmsg_len = CMSG_LEN(sizeof(std::uint16_t));
    auto s = static_cast<std::uint16_t>(segment);
    std::memcpy(CMSG_DATA(cm), &s, sizeof s);
  }
  for (int tries = 0; tries < 200; ++tries) {
    ssize_t n = ::sendmsg(fd_, &msg, 0);
    if (n >= 0) return 0;
    if (errno == EINTR) continue;
    if (errno == ENOBUFS) {
      // A queue beyond the socket, the device's qdisc, is full and dropped the datagram
      // (IP_RECVERR reports it). Sending it again at once had it dropped again, GSO batch
      // after GSO batch, in a busy loop under the engine lock: 17-23% of the packets
      // offered to 1 Gbit/s tbf links were dropped so (docs/PERFORMANCE.md, "A full queue
      // on the way out"). Lost here as at a full router: QUIC resends it and slows down.
      ++queue_drops_;
      return 0;
    }
    if (errno == EAGAIN) {
      wait_writable(fd_);
      continue;
    }
    return -errno;
  }
  return -EAGAIN;
}

void UdpSocket::set_dont_fragment(bool on) {
  if (local_.family() == AF_INET6) {
    int v = on ? IPV6_PMTUDISC_DO : IPV6_PMTUDISC_DONT;
    ::setsockopt(fd_, IPPROTO_IPV6, IPV6_MTU_DISCOVER, &v, sizeof v);
  } else {
    int v = on ? IP_PMTUDISC_DO : IP_PMTUDISC_DONT;
    ::setsockopt(fd_, IPPROTO_IP, IP_MTU_DISCOVER, &v, sizeof v);
  }
}

std::size_t UdpSocket::route_mtu(const Address& to) {
  int fd = ::socket(to.family(), SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  int mtu = 0;
  socklen_t len = sizeof mtu;
  // connect() on a datagram socket sends nothing: it only looks the route up.
  bool ok = ::connect(fd, to.sa(), to.len) == 0 &&
            (to.family() == AF_INET6 ? ::getsockopt(fd, IPPROTO_IPV6, IPV6_MTU, &mtu, &len)
                                     : ::getsockopt(fd, IPPROTO_IP, IP_MTU, &mtu, &len)) == 0;
  ::close(fd);
  return ok && mtu > 0 ? static_cast<std::size_t>(mtu) : 0;
}

int UdpSocket::send_df(const Address& to, const std::uint8_t* data, std::size_t len, std::size_t segment) {
  int rc = send_one(to, data, len, segment);
  // An ICMP "fragmentation needed" for an earlier datagram (a probe, say) is reported by the
  // next send, whatever its size: once more tells whether it is this one that is too big.
  if (rc == -EMSGSIZE) rc = send_one(to, data, len, segment);
  return rc;
}

int UdpSocket::send(const Address& to, const std::uint8_t* data, std::size_t len,
                    std::size_t segment, bool may_fragment) {
  bool gso_refused = false;
  if (gso_ && len > segment) {
    int rc = send_df(to, data, len, segment);
    if (rc != -EIO && rc != -EINVAL && rc != -EMSGSIZE) return rc;
    // Either the route's device cannot segment (some tunnels), or the segments are larger
    // than the path now carries (both fail the same way): one packet per send tells which.
    gso_refused = true;
  }
  bool oversize = false;
  std::size_t too_big = 0;  // while non-zero, the socket fragments: the size that failed
  int result = 0;
  for (std::size_t off = 0; off < len; off += segment) {
    const std::size_t n = std::min(segment, len - off);
    int rc = too_big ? send_one(to, data + off, n, 0) : send_df(to, data + off, n, 0);
    if (rc == -EMSGSIZE) {
      oversize = true;
      if (!may_fragment) {
        result = rc;  // a probe the path cannot carry: lost, as it would be further on
        continue;
      }
      // The path MTU shrank below packets QUIC already sized (ngtcp2 1.11 cannot lower a
      // path's packet size once probed): let the kernel fragment them rather than lose them
      // all. Slower, but the connection lives.
      set_dont_fragment(false);
      too_big = n;
      rc = send_one(to, data + off, n, 0);
    }
    if (rc == 0 && too_big && n >= too_big) ++fragmented_;
    if (rc != 0) {
      result = rc;
      break;
    }
  }
  if (too_big) set_dont_fragment(true);
  if (gso_refused && !oversize) {
    log::info("udp: GSO rejected, falling back to one packet per send");
    gso_ = false;
  }
  return result;
}

bool UdpSocket::read_error(Address& offender) {
  for (;;) {
    std::uint8_t scratch[64];
    iovec iov{scratch, sizeof scratch};
    msghdr msg{};
    offender.len = sizeof(offender.storage);
    msg.msg_name = offender.sa();
    msg.msg_namelen = offender.len;
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char ctrl[512];
    msg.msg_control = ctrl;
    msg.msg_controllen = sizeof ctrl;
    if (::recvmsg(fd_, &msg, MSG_ERRQUEUE) < 0) return false;
    offender.len = msg.msg_namelen;
    for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
      bool v4 = cm->cmsg_level == IPPROTO_IP && cm->cmsg_type == IP_RECVERR;
      bool v6 = cm->cmsg_level == IPPROTO_IPV6 && cm->cmsg_type == IPV6_RECVERR;
      if (!v4 && !v6) continue;
      sock_extended_err ee;
      std::memcpy(&ee, CMSG_DATA(cm), sizeof ee);
      if (ee.ee_errno == ECONNREFUSED) return true;
    }
  }
}

ssize_t UdpSocket::recv(std::uint8_t* buf, std::size_t cap, Address& from, std::size_t& segment) {
  iovec iov{buf, cap};
  msghdr msg{};
  from.len = sizeof(from.storage);
  msg.msg_name = from.sa();
  msg.msg_namelen = from.len;
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int)) + CMSG_SPACE(sizeof(std::uint32_t))] = {};
  msg.msg_control = ctrl;
  msg.msg_controllen = sizeof ctrl;
  ssize_t n;
  do {
    n = ::recvmsg(fd_, &msg, 0);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return -errno;
  from.len = msg.msg_namelen;
  segment = static_cast<std::size_t>(n);
  for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
    if (cm->cmsg_level == SOL_UDP && cm->cmsg_type == UDP_GRO) {
      int s = 0;
      std::memcpy(&s, CMSG_DATA(cm), sizeof s);
      if (s > 0) segment = static_cast<std::size_t>(s);
    } else if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SO_RXQ_OVFL) {
      std::uint32_t d = 0;
      std::memcpy(&d, CMSG_DATA(cm), sizeof d);
      receive_drops_ = d;
    }
  }
  return n;
}

}  // namespace nexar::quic
