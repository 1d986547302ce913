#include "transport/tcp_attach.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <span>
#include <string>
#include <utility>

#include <nexar/error.hpp>

#include "core/log.hpp"
#include "tls/mac.hpp"

namespace nexar::detail {

namespace {

constexpr std::uint8_t kMagic[4] = {'N', 'X', 'T', 'L'};
constexpr std::uint8_t kVersion = 1;
constexpr std::size_t kNonce = 32;
// magic, version, cipher, lane, a zero byte, dialer's rank, listener's rank, nonce.
constexpr std::size_t kHello = 4 + 4 + 4 + 4 + kNonce;
constexpr std::string_view kListenerRole = "nexar tcp link: listener";
constexpr std::string_view kDialerRole = "nexar tcp link: dialer";
// Bytes the kernel may hold unsent on the bulk lane's connection: enough to keep a 25
// Gbit/s path busy for a scheduler tick, small enough that a collective's connection is
// not queued behind megabytes on the way out of the host (TCP_NOTSENT_LOWAT).
constexpr int kBulkNotSent = 256 * 1024;

[[noreturn]] void io_error(const std::string& what) {
  throw Error(Errc::io, what + ": " + std::strerror(errno));
}

void put_u32(std::uint8_t* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * (3 - i)));
}
std::uint32_t get_u32(const std::uint8_t* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) | p[3];
}

std::span<const std::byte> bytes(const void* p, std::size_t n) { return {static_cast<const std::byte*>(p), n}; }

tls::Mac role_mac(const TcpKeys& k, std::string_view role, const std::uint8_t* hello, const std::uint8_t* nonce) {
  return tls::mac(k.attach, {bytes(role.data(), role.size()), bytes(hello, kHello), bytes(nonce, kNonce)});
}
bool role_mac_ok(const TcpKeys& k, std::string_view role, const std::uint8_t* hello, const std::uint8_t* nonce,
                 const std::uint8_t* tag) {
  return tls::mac_matches(k.attach, {bytes(role.data(), role.size()), bytes(hello, kHello), bytes(nonce, kNonce)},
                          std::span<const std::byte, tls::mac_size>(reinterpret_cast<const std::byte*>(tag), tls::mac_size));
}

// Blocking I/O of the attach steps: each call waits at most `step` for the peer.
void wait_for(int fd, short events, std::chrono::milliseconds step, const char* what) {
  pollfd p{fd, events, 0};
  const int n = ::poll(&p, 1, static_cast<int>(step.count()));
  if (n < 0) io_error(what);
  if (n == 0) throw Error(Errc::timeout, std::string(what) + ": no answer within " + std::to_string(step.count()) + " ms");
}
void write_all(int fd, const std::uint8_t* p, std::size_t n, std::chrono::milliseconds step, const char* what) {
  while (n > 0) {
    wait_for(fd, POLLOUT, step, what);
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (w < 0) io_error(what);
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}
void read_all(int fd, std::uint8_t* p, std::size_t n, std::chrono::milliseconds step, const char* what) {
  while (n > 0) {
    wait_for(fd, POLLIN, step, what);
    const ssize_t r = ::recv(fd, p, n, MSG_DONTWAIT);
    if (r < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (r < 0) io_error(what);
    if (r == 0) throw Error(Errc::io, std::string(what) + ": the peer closed the connection");
    p += r;
    n -= static_cast<std::size_t>(r);
  }
}

// What an attached connection's socket keeps for the rest of its life.
void tune(int fd, wire::Lane lane) {
  const int one = 1;
  // Frames are gathered into one write per turn already; Nagle would only delay the last.
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (lane == wire::Lane::bulk) ::setsockopt(fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &kBulkNotSent, sizeof kBulkNotSent);
}

void nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

}  // namespace

TcpAttached::TcpAttached(TcpAttached&& o) noexcept
    : fd(std::exchange(o.fd, -1)), session(std::move(o.session)), lane(o.lane), rank(o.rank) {}

TcpAttached& TcpAttached::operator=(TcpAttached&& o) noexcept {
  if (this != &o) {
    session.reset();
    if (fd >= 0) ::close(fd);
    fd = std::exchange(o.fd, -1);
    session = std::move(o.session);
    lane = o.lane;
    rank = o.rank;
  }
  return *this;
}

TcpAttached::~TcpAttached() {
  session.reset();
  if (fd >= 0) ::close(fd);
}

TcpAttached tcp_dial(const quic::Address& to, std::uint32_t self, std::uint32_t peer, wire::Lane lane,
                     TcpCipher cipher, const TcpKeys& keys, std::chrono::milliseconds step) {
  TcpAttached a;
  a.lane = lane;
  a.rank = peer;
  a.fd = ::socket(to.family(), SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (a.fd < 0) io_error("TCP link: socket");
  if (::connect(a.fd, to.sa(), to.len) < 0 && errno != EINPROGRESS) io_error("TCP link: connect to " + to.to_string());
  wait_for(a.fd, POLLOUT, step, "TCP link: connect");
  int err = 0;
  socklen_t len = sizeof err;
  ::getsockopt(a.fd, SOL_SOCKET, SO_ERROR, &err, &len);
  if (err != 0) {
    errno = err;
    io_error("TCP link: connect to " + to.to_string());
  }
  std::uint8_t hello[kHello] = {};
  std::memcpy(hello, kMagic, 4);
  hello[4] = kVersion;
  hello[5] = cipher_code(cipher);
  hello[6] = static_cast<std::uint8_t>(lane);
  put_u32(hello + 8, self);
  put_u32(hello + 12, peer);
  tls::random_bytes(std::span<std::uint8_t>(hello + 16, kNonce));
  write_all(a.fd, hello, kHello, step, "TCP link: hello");
  std::uint8_t answer[kNonce + tls::mac_size];
  read_all(a.fd, answer, sizeof answer, step, "TCP link: the listener's proof");
  if (!role_mac_ok(keys, kListenerRole, hello, answer, answer + kNonce))
    throw Error(Errc::tls, "TCP link: rank " + std::to_string(peer) + "'s listener at " + to.to_string() +
                               " does not hold this pair's key");
  const tls::Mac mine = role_mac(keys, kDialerRole, hello, answer);
  write_all(a.fd, mine.data(), mine.size(), step, "TCP link: proof");
  std::uint8_t ok = 0;
  read_all(a.fd, &ok, 1, step, "TCP link: the listener's confirmation");
  if (ok != 1) throw Error(Errc::tls, "TCP link: rank " + std::to_string(peer) + " refused the attach");
  if (cipher == TcpCipher::tls) {
    ::fcntl(a.fd, F_SETFL, ::fcntl(a.fd, F_GETFL) & ~O_NONBLOCK);
    a.session = std::make_unique<tls::PskSession>(a.fd, tls::PskSession::Role::client, keys.tls, step);
  }
  tune(a.fd, lane);
  nonblocking(a.fd);
  return a;
}

TcpListener::TcpListener(const quic::Address& host, std::uint32_t self, TcpCipher cipher, Lookup lookup,
                         Attached attached, std::chrono::milliseconds step)
    : self_(self), cipher_(cipher), lookup_(std::move(lookup)), attached_(std::move(attached)), step_(step) {
  quic::Address at = host;
  at.set_port(0);
  fd_ = ::socket(at.family(), SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) io_error("TCP link: listening socket");
  const int one = 1;
  ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd_, at.sa(), at.len) < 0 || ::listen(fd_, 64) < 0 || ::pipe2(stop_, O_CLOEXEC) < 0) {
    const int e = errno;
    if (fd_ >= 0) ::close(fd_);
    errno = e;
    io_error("TCP link: listen on " + at.to_string());
  }
  quic::Address bound;
  bound.len = sizeof bound.storage;
  ::getsockname(fd_, bound.sa(), &bound.len);
  port_ = bound.port();
  thread_ = std::thread([this] { run(); });
}

TcpListener::~TcpListener() {
  const std::uint8_t b = 0;
  [[maybe_unused]] const ssize_t w = ::write(stop_[1], &b, 1);
  if (thread_.joinable()) thread_.join();
  ::close(fd_);
  ::close(stop_[0]);
  ::close(stop_[1]);
}

void TcpListener::run() {
  pthread_setname_np(pthread_self(), "nexar-tcp-attach");
  for (;;) {
    pollfd p[2] = {{fd_, POLLIN, 0}, {stop_[0], POLLIN, 0}};
    if (::poll(p, 2, -1) < 0 && errno != EINTR) return;
    if (p[1].revents != 0) return;
    if ((p[0].revents & POLLIN) == 0) continue;
    const int fd = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) continue;
    serve(fd);
  }
}

void TcpListener::serve(int fd) {
  TcpAttached a;
  a.fd = fd;
  std::string why;
  try {
    std::uint8_t hello[kHello];
    read_all(fd, hello, kHello, step_, "TCP link: hello");
    const std::uint32_t from = get_u32(hello + 8);
    const std::uint8_t lane = hello[6];
    std::optional<TcpKeys> keys;
    if (std::memcmp(hello, kMagic, 4) != 0 || hello[4] != kVersion) {
      why = "not a nexar TCP link hello (or another version)";
    } else if (get_u32(hello + 12) != self_) {
      why = "it meant to reach rank " + std::to_string(get_u32(hello + 12));
    } else if (hello[5] != cipher_code(cipher_)) {
      why = "its cipher differs from ours";
    } else if (lane != static_cast<std::uint8_t>(wire::Lane::data) && lane != static_cast<std::uint8_t>(wire::Lane::bulk) &&
               lane != static_cast<std::uint8_t>(wire::Lane::collective)) {
      why = "lane " + std::to_string(lane) + " is no message lane";
    } else if (keys = lookup_(from, static_cast<wire::Lane>(lane)); !keys) {
      why = "no offer to rank " + std::to_string(from) + " stands for that lane";
    }
    if (why.empty()) {
      std::uint8_t answer[kNonce + tls::mac_size];
      tls::random_bytes(std::span<std::uint8_t>(answer, kNonce));
      const tls::Mac m = role_mac(*keys, kListenerRole, hello, answer);
      std::memcpy(answer + kNonce, m.data(), m.size());
      write_all(fd, answer, sizeof answer, step_, "TCP link: proof");
      std::uint8_t theirs[tls::mac_size];
      read_all(fd, theirs, sizeof theirs, step_, "TCP link: the dialer's proof");
      if (!role_mac_ok(*keys, kDialerRole, hello, answer, theirs)) {
        why = "a wrong proof for rank " + std::to_string(from);
      } else {
        const std::uint8_t ok = 1;
        write_all(fd, &ok, 1, step_, "TCP link: confirmation");
        a.lane = static_cast<wire::Lane>(lane);
        a.rank = from;
        if (cipher_ == TcpCipher::tls) {
          ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
          a.session = std::make_unique<tls::PskSession>(fd, tls::PskSession::Role::server, keys->tls, step_);
        }
        tune(fd, a.lane);
        nonblocking(fd);
        attached_(std::move(a));
        return;
      }
    }
  } catch (const Error& e) {
    why = e.what();
  }
  refused_.fetch_add(1, std::memory_order_relaxed);
  log::warn("rank {}: refused a TCP link attach: {}", self_, why);
}

}  // namespace nexar::detail
