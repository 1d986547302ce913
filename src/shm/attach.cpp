#include "shm/attach.hpp"

#include <fcntl.h>
#include <gnutls/crypto.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string_view>
#include <utility>

#include <nexar/error.hpp>

#include "core/log.hpp"

namespace nexar::shm {

namespace {
// Request: "NXSA", rank (u32 little-endian), proof (32 bytes); one descriptor attached.
// Answer: one status byte (0 accepted, 1 refused); two descriptors attached when accepted.
constexpr std::uint8_t kRequestMagic[4] = {'N', 'X', 'S', 'A'};
constexpr std::size_t kRequestBytes = 4 + 4 + 32;

[[noreturn]] void fail(Errc code, const std::string& what) { throw Error(code, "shared memory attach: " + what); }

sockaddr_un abstract_addr(const std::string& name, socklen_t& len) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  // Abstract namespace: a leading NUL, no file, gone with the socket.
  std::memcpy(a.sun_path + 1, name.data(), name.size());
  len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return a;
}

void set_timeouts(int fd, std::chrono::milliseconds t) {
  timeval tv{static_cast<time_t>(t.count() / 1000), static_cast<suseconds_t>((t.count() % 1000) * 1000)};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

// Sends `len` bytes with up to two descriptors attached.
bool send_with_fds(int s, const void* data, std::size_t len, const int* fds, int nfds) {
  iovec iov{const_cast<void*>(data), len};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  alignas(cmsghdr) char ctrl[CMSG_SPACE(2 * sizeof(int))] = {};
  if (nfds > 0) {
    m.msg_control = ctrl;
    m.msg_controllen = CMSG_SPACE(static_cast<std::size_t>(nfds) * sizeof(int));
    cmsghdr* c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(static_cast<std::size_t>(nfds) * sizeof(int));
    std::memcpy(CMSG_DATA(c), fds, static_cast<std::size_t>(nfds) * sizeof(int));
  }
  return ::sendmsg(s, &m, MSG_NOSIGNAL) == static_cast<ssize_t>(len);
}

// Receives exactly `len` bytes in one message and the descriptors attached to it (closed
// beyond `max_fds`). Returns the number of descriptors, or -1.
int recv_with_fds(int s, void* data, std::size_t len, int* fds, int max_fds) {
  iovec iov{data, len};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  alignas(cmsghdr) char ctrl[CMSG_SPACE(4 * sizeof(int))] = {};
  m.msg_control = ctrl;
  m.msg_controllen = sizeof ctrl;
  const ssize_t n = ::recvmsg(s, &m, MSG_CMSG_CLOEXEC);
  int got = 0;
  for (cmsghdr* c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const std::size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < k; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      if (got < max_fds) {
        fds[got++] = fd;
      } else {
        ::close(fd);
      }
    }
  }
  if (n != static_cast<ssize_t>(len) || (m.msg_flags & (MSG_TRUNC | MSG_CTRUNC))) {
    for (int i = 0; i < got; ++i) {
      ::close(fds[i]);
      fds[i] = -1;
    }
    return -1;
  }
  return got;
}

}  // namespace

bool same_proof(const Proof& a, const Proof& b) noexcept {
  std::uint8_t d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d |= static_cast<std::uint8_t>(a[i] ^ b[i]);
  return d == 0;
}

std::string host_key() {
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  struct stat ns {};
  ::stat("/proc/self/ns/net", &ns);
  return boot + "/" + std::to_string(ns.st_dev) + ":" + std::to_string(ns.st_ino) + "/" +
         std::to_string(::geteuid());
}

Listener::Listener(Serve serve) : serve_(std::move(serve)) {
  std::uint8_t rnd[16];
  gnutls_rnd(GNUTLS_RND_NONCE, rnd, sizeof rnd);
  name_ = "nexar-shm-";
  for (std::uint8_t b : rnd) {
    static constexpr char hex[] = "0123456789abcdef";
    name_ += hex[b >> 4];
    name_ += hex[b & 15];
  }
  fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) fail(Errc::io, std::string("socket: ") + std::strerror(errno));
  socklen_t len;
  sockaddr_un a = abstract_addr(name_, len);
  if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), len) != 0 || ::listen(fd_, 16) != 0) {
    int e = errno;
    ::close(fd_);
    fail(Errc::io, std::string("bind: ") + std::strerror(e));
  }
  thread_ = std::thread([this] { run(); });
}

Listener::~Listener() {
  stop_.store(true);
  // Wakes the blocked accept(); the thread then sees stop_.
  ::shutdown(fd_, SHUT_RDWR);
  thread_.join();
  ::close(fd_);
}

void Listener::run() {
  while (!stop_.load()) {
    int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return;  // shut down
    }
    serve_one(c);
    ::close(c);
  }
}

void Listener::serve_one(int c) {
  set_timeouts(c, std::chrono::milliseconds(2000));
  // The kernel's word for who connected, not the request's: another user's process is
  // refused before anything it sent is looked at.
  ucred cred{};
  socklen_t cl = sizeof cred;
  std::uint8_t req[kRequestBytes];
  int peer_bell = -1;
  const std::uint8_t refused = 1;
  if (::getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0 || cred.uid != ::geteuid()) {
    ++refused_;
    log::warn("shm: refused an attach from pid {} of uid {}: not this user", cred.pid, cred.uid);
    send_with_fds(c, &refused, 1, nullptr, 0);
    return;
  }
  if (recv_with_fds(c, req, sizeof req, &peer_bell, 1) != 1 || std::memcmp(req, kRequestMagic, 4) != 0 ||
      !adopt_doorbell(peer_bell)) {
    if (peer_bell >= 0) ::close(peer_bell);
    ++refused_;
    send_with_fds(c, &refused, 1, nullptr, 0);
    return;
  }
  std::uint32_t rank = 0;
  for (int i = 0; i < 4; ++i) rank |= static_cast<std::uint32_t>(req[4 + i]) << (8 * i);
  Proof proof;
  std::memcpy(proof.data(), req + 8, proof.size());
  std::optional<Answer> a = serve_(rank, proof, peer_bell);
  if (!a) {
    ++refused_;
    send_with_fds(c, &refused, 1, nullptr, 0);
    return;
  }
  const std::uint8_t ok = 0;
  const int fds[2] = {a->segment_fd, a->doorbell_fd};
  // The requester confirms once it mapped the segment; without that nothing moves.
  std::uint8_t confirmed = 0;
  const bool done = send_with_fds(c, &ok, 1, fds, 2) && ::recv(c, &confirmed, 1, 0) == 1 && confirmed == 1;
  if (a->then) a->then(done);
}

Attached attach(const std::string& name, std::uint32_t rank, const Proof& proof, int doorbell,
                std::chrono::milliseconds timeout) {
  int s = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) fail(Errc::io, std::string("socket: ") + std::strerror(errno));
  set_timeouts(s, timeout);
  socklen_t len;
  sockaddr_un a = abstract_addr(name, len);
  if (::connect(s, reinterpret_cast<sockaddr*>(&a), len) != 0) {
    int e = errno;
    ::close(s);
    fail(Errc::io, "connect to '" + name + "': " + std::strerror(e));
  }
  std::uint8_t req[kRequestBytes];
  std::memcpy(req, kRequestMagic, 4);
  for (int i = 0; i < 4; ++i) req[4 + i] = static_cast<std::uint8_t>(rank >> (8 * i));
  std::memcpy(req + 8, proof.data(), proof.size());
  // A listener that refuses the connecting process outright answers before reading the
  // request, and may have closed by the time it is sent: its answer still tells.
  const bool sent = send_with_fds(s, req, sizeof req, &doorbell, 1);
  const int send_errno = errno;
  std::uint8_t status = 2;
  int fds[2] = {-1, -1};
  const int got = recv_with_fds(s, &status, 1, fds, 2);
  if (!sent && status != 1) {
    ::close(s);
    fail(Errc::io, std::string("send: ") + std::strerror(send_errno));
  }
  if (status != 0 || got != 2) {
    ::close(s);
    for (int fd : fds)
      if (fd >= 0) ::close(fd);
    fail(Errc::protocol, status == 1 ? "refused by the listener" : "malformed answer");
  }
  Attached out;
  out.segment_fd = fds[0];
  out.doorbell_fd = fds[1];
  out.socket_ = s;
  return out;
}

Attached::Attached(Attached&& o) noexcept
    : segment_fd(std::exchange(o.segment_fd, -1)), doorbell_fd(std::exchange(o.doorbell_fd, -1)),
      socket_(std::exchange(o.socket_, -1)) {}

Attached& Attached::operator=(Attached&& o) noexcept {
  if (this != &o) {
    this->~Attached();
    segment_fd = std::exchange(o.segment_fd, -1);
    doorbell_fd = std::exchange(o.doorbell_fd, -1);
    socket_ = std::exchange(o.socket_, -1);
  }
  return *this;
}

Attached::~Attached() {
  for (int fd : {segment_fd, doorbell_fd, socket_})
    if (fd >= 0) ::close(fd);
}

void Attached::confirm() {
  const std::uint8_t yes = 1;
  const bool ok = ::send(socket_, &yes, 1, MSG_NOSIGNAL) == 1;
  const int e = errno;
  ::close(socket_);
  socket_ = -1;
  if (!ok) fail(Errc::io, std::string("confirm: ") + std::strerror(e));
}

bool adopt_doorbell(int fd) noexcept {
  char link[64] = {};
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  const ssize_t n = ::readlink(path.c_str(), link, sizeof link - 1);
  if (n <= 0 || std::string_view(link, static_cast<std::size_t>(n)) != "anon_inode:[eventfd]") return false;
  const int fl = ::fcntl(fd, F_GETFL);
  return fl >= 0 && ::fcntl(fd, F_SETFL, fl | O_NONBLOCK) == 0;
}

}  // namespace nexar::shm
