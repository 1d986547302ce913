#include "tls/psk_session.hpp"

#include <gnutls/gnutls.h>

#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include <nexar/error.hpp>

#include "tls/gnutls_util.hpp"

namespace nexar::tls {

struct PskSession::Transport {
  int fd = -1;
  gnutls_session_t session = nullptr;
  std::uint8_t in[64 * 1024];  // four records, read from the socket, not taken by GnuTLS yet
  std::size_t at = 0;
  std::size_t end = 0;
  // Records GnuTLS wrote between gather() and flush(), to leave in one write: it hands
  // them over one record per call, and a system call per 16 KiB record cost more in the
  // kernel than the encryption (docs/PERFORMANCE.md, "TCP link"). Bytes
  // out[out_at, out.size()) are not written yet. It grows to what one batch takes.
  std::vector<std::uint8_t> out;
  std::size_t out_at = 0;
  bool gathering = false;
};

namespace {

ssize_t pull(gnutls_transport_ptr_t p, void* data, size_t len) {
  auto& t = *static_cast<PskSession::Transport*>(p);
  if (t.at == t.end) {
    const ssize_t r = ::recv(t.fd, t.in, sizeof t.in, MSG_DONTWAIT);
    if (r < 0) {
      gnutls_transport_set_errno(t.session, errno);
      return -1;
    }
    if (r == 0) return 0;
    t.at = 0;
    t.end = static_cast<std::size_t>(r);
  }
  const std::size_t n = std::min(len, t.end - t.at);
  std::memcpy(data, t.in + t.at, n);
  t.at += n;
  return static_cast<ssize_t>(n);
}

// Writes the gathered records: 1 once none is left, 0 when the socket is full, -1 when the
// connection broke (errno says why).
int write_out(PskSession::Transport& t) {
  while (t.out_at < t.out.size()) {
    const ssize_t w = ::send(t.fd, t.out.data() + t.out_at, t.out.size() - t.out_at, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return -1;
      // What the socket took leaves the buffer, so that it never holds more than a batch.
      t.out.erase(t.out.begin(), t.out.begin() + static_cast<std::ptrdiff_t>(t.out_at));
      t.out_at = 0;
      return 0;
    }
    t.out_at += static_cast<std::size_t>(w);
  }
  t.out.clear();
  t.out_at = 0;
  return 1;
}

// Bytes gathered before the socket is offered some, at most: a batch of records
// (transport/tcp_link.cpp sends up to 256 KiB of plaintext between gather() and flush())
// with their headers and tags.
constexpr std::size_t kGatherMost = 272 * 1024;

ssize_t push(gnutls_transport_ptr_t p, const giovec_t* iov, int count) {
  auto& t = *static_cast<PskSession::Transport*>(p);
  if (t.gathering) {
    // Every record is taken, so that GnuTLS never holds one back: a full socket leaves the
    // rest here, and the caller stops sending until flush() got it all out (at most a batch
    // more than kGatherMost waits here).
    std::size_t len = 0;
    for (int i = 0; i < count; ++i) {
      const auto* b = static_cast<const std::uint8_t*>(iov[i].iov_base);
      t.out.insert(t.out.end(), b, b + iov[i].iov_len);
      len += iov[i].iov_len;
    }
    if (t.out.size() - t.out_at > kGatherMost && write_out(t) < 0) {
      gnutls_transport_set_errno(t.session, errno);
      return -1;
    }
    return static_cast<ssize_t>(len);
  }
  // A record GnuTLS sends by itself (an alert, a key update): what was gathered goes
  // first, so the stream keeps its order.
  const int f = write_out(t);
  if (f <= 0) {
    gnutls_transport_set_errno(t.session, f < 0 ? errno : EAGAIN);
    return -1;
  }
  msghdr m{};
  m.msg_iov = const_cast<iovec*>(reinterpret_cast<const iovec*>(iov));
  m.msg_iovlen = static_cast<std::size_t>(count);
  const ssize_t w = ::sendmsg(t.fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (w < 0) gnutls_transport_set_errno(t.session, errno);
  return w;
}

// TLS 1.3, AES-128-GCM, and the pre-shared key only together with ECDHE (psk_dhe_ke).
constexpr const char* kPriority =
    "NONE:+VERS-TLS1.3:+AES-128-GCM:+AEAD:+SHA256:+ECDHE-PSK:+GROUP-X25519:+GROUP-SECP256R1:+COMP-NULL:+SIGN-ALL";
// Both ends name the key alike: there is one per connection.
constexpr const char* kIdentity = "nexar-tcp-link";

int server_key(gnutls_session_t s, const char* /*identity*/, gnutls_datum_t* key) {
  const auto* mine = static_cast<const std::uint8_t*>(gnutls_session_get_ptr(s));
  key->data = static_cast<unsigned char*>(gnutls_malloc(32));
  if (key->data == nullptr) return -1;
  std::memcpy(key->data, mine, 32);
  key->size = 32;
  return 0;
}
}  // namespace

PskSession::PskSession(int fd, Role role, std::span<const std::uint8_t, 32> key, std::chrono::milliseconds limit) {
  std::memcpy(key_, key.data(), sizeof key_);
  try {
    const bool client = role == Role::client;
    detail::check_rc(gnutls_init(&s_, client ? GNUTLS_CLIENT : GNUTLS_SERVER), "gnutls_init");
    const char* err = nullptr;
    detail::check_rc(gnutls_priority_set_direct(s_, kPriority, &err), "TLS priority");
    if (client) {
      detail::check_rc(gnutls_psk_allocate_client_credentials(&client_), "PSK credentials");
      const gnutls_datum_t k{key_, sizeof key_};
      detail::check_rc(gnutls_psk_set_client_credentials(client_, kIdentity, &k, GNUTLS_PSK_KEY_RAW),
                       "PSK credentials");
      detail::check_rc(gnutls_credentials_set(s_, GNUTLS_CRD_PSK, client_), "PSK credentials");
    } else {
      detail::check_rc(gnutls_psk_allocate_server_credentials(&server_), "PSK credentials");
      gnutls_psk_set_server_credentials_function(server_, server_key);
      gnutls_session_set_ptr(s_, key_);
      detail::check_rc(gnutls_credentials_set(s_, GNUTLS_CRD_PSK, server_), "PSK credentials");
    }
    gnutls_transport_set_int(s_, fd);
    gnutls_handshake_set_timeout(s_, static_cast<unsigned>(limit.count()));
    int rc;
    do {
      rc = gnutls_handshake(s_);
    } while (rc < 0 && gnutls_error_is_fatal(rc) == 0);
    detail::check_rc(rc, "TLS handshake over the TCP link");
    io_ = std::make_unique<Transport>();
    io_->fd = fd;
    io_->session = s_;
    gnutls_transport_set_ptr(s_, io_.get());
    gnutls_transport_set_pull_function(s_, pull);
    gnutls_transport_set_vec_push_function(s_, push);
  } catch (...) {
    release();
    throw;
  }
}

PskSession::~PskSession() { release(); }

void PskSession::release() noexcept {
  if (s_) gnutls_deinit(s_);
  if (client_) gnutls_psk_free_client_credentials(client_);
  if (server_) gnutls_psk_free_server_credentials(server_);
  s_ = nullptr;
  client_ = nullptr;
  server_ = nullptr;
  std::memset(key_, 0, sizeof key_);
}

std::size_t PskSession::send(const std::uint8_t* data, std::size_t len) {
  const ssize_t n = gnutls_record_send(s_, data, len);
  if (n >= 0) return static_cast<std::size_t>(n);
  if (n == GNUTLS_E_AGAIN || n == GNUTLS_E_INTERRUPTED) return 0;
  throw Error(Errc::io, std::string("TLS send: ") + gnutls_strerror(static_cast<int>(n)));
}

void PskSession::gather() noexcept { io_->gathering = true; }

bool PskSession::flush() {
  io_->gathering = false;
  const int f = write_out(*io_);
  if (f < 0) throw Error(Errc::io, std::string("TLS send: ") + std::strerror(errno));
  return f > 0;
}

PskSession::Read PskSession::recv(std::uint8_t* out, std::size_t cap) {
  const ssize_t n = gnutls_record_recv(s_, out, cap);
  if (n > 0) return {static_cast<std::size_t>(n), false};
  if (n == 0 || n == GNUTLS_E_PREMATURE_TERMINATION) return {0, true};
  if (n == GNUTLS_E_AGAIN || n == GNUTLS_E_INTERRUPTED) return {};
  throw Error(Errc::io, std::string("TLS receive: ") + gnutls_strerror(static_cast<int>(n)));
}

bool PskSession::pending() const noexcept {
  return (io_ && io_->at < io_->end) || gnutls_record_check_pending(s_) > 0;
}

}  // namespace nexar::tls
