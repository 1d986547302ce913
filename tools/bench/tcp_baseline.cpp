#include "tcp_baseline.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

namespace nexar::bench {

namespace {

[[noreturn]] void fail(const std::string& what, int err = errno) {
  throw std::runtime_error("tcp " + what + ": " + std::strerror(err));
}

sockaddr_in loopback(std::uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

void set_nodelay(int fd) {
  int on = 1;
  if (::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on) != 0) fail("setsockopt(TCP_NODELAY)");
}

}  // namespace

TcpListener::TcpListener() {
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) fail("socket");
  sockaddr_in a = loopback(0);
  socklen_t len = sizeof a;
  if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd_, 1) != 0 ||
      ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    int err = errno;
    close();
    fail("listen on 127.0.0.1:0", err);
  }
  port_ = ntohs(a.sin_port);
}

TcpListener::~TcpListener() { close(); }

void TcpListener::close() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

int TcpListener::accept(std::chrono::milliseconds timeout) {
  pollfd p{fd_, POLLIN, 0};
  int n;
  do n = ::poll(&p, 1, static_cast<int>(timeout.count()));
  while (n < 0 && errno == EINTR);
  if (n < 0) fail("poll(listen)");
  if (n == 0) throw std::runtime_error("tcp accept: no connection within " + std::to_string(timeout.count()) + " ms");
  int fd = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) fail("accept");
  return fd;
}

TcpLink::TcpLink(int fd) : fd_(fd) {
  try {
    set_nodelay(fd_);
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

TcpLink TcpLink::connect_loopback(std::uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) fail("socket");
  sockaddr_in a = loopback(port);
  int rc;
  do rc = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    int err = errno;
    ::close(fd);
    fail("connect to 127.0.0.1:" + std::to_string(port), err);
  }
  return TcpLink(fd);
}

TcpLink::~TcpLink() {
  if (fd_ >= 0) ::close(fd_);
}

void TcpLink::write_all(const void* data, std::size_t bytes) {
  auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = ::send(fd_, p, bytes, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("send");
    }
    p += n;
    bytes -= static_cast<std::size_t>(n);
  }
}

void TcpLink::read_all(void* data, std::size_t bytes) {
  auto* p = static_cast<char*>(data);
  while (bytes > 0) {
    ssize_t n = ::recv(fd_, p, bytes, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("recv");
    }
    if (n == 0) throw std::runtime_error("tcp recv: peer closed the connection");
    p += n;
    bytes -= static_cast<std::size_t>(n);
  }
}

}  // namespace nexar::bench
