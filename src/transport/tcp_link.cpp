#include "transport/tcp_link.hpp"

#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstring>

#include "core/log.hpp"

namespace nexar::detail {

namespace {
// One read's buffer: a few TLS records, or what a 64 KiB socket read typically returns
// several times over.
constexpr std::size_t kReadBytes = 256 * 1024;
// Reads per readiness event before the connection waits its turn again, so one busy lane
// does not hold the engine from the others.
constexpr int kReadsPerTurn = 16;
// Chunks gathered into one writev.
constexpr int kIov = 64;
// Largest piece handed to TLS at once: one record.
constexpr std::size_t kRecord = 16 * 1024;
// Bytes of records gathered into one write (PskSession::gather).
constexpr std::size_t kBatch = 256 * 1024;
}  // namespace

TcpLink::Conn::Conn(asio::io_context& io, TcpAttached a) : sock(std::move(a)), desc(io, sock.fd) {}

TcpLink::TcpLink(Engine& engine, LinkOwner& owner, std::uint64_t window)
    : engine_(engine), owner_(owner), window_(window), buf_(kReadBytes), alive_(std::make_shared<char>()) {}

TcpLink::~TcpLink() {
  alive_.reset();
  for (auto& c : conns_) {
    if (!c) continue;
    // The descriptor is the socket's (TcpAttached closes it): stop waiting without closing.
    asio::error_code ec;
    c->desc.cancel(ec);
    c->desc.release();
  }
}

int TcpLink::index(wire::Lane lane) noexcept {
  switch (lane) {
    case wire::Lane::data: return 0;
    case wire::Lane::bulk: return 1;
    case wire::Lane::collective: return 2;
    default: return -1;
  }
}

bool TcpLink::add(TcpAttached a) {
  const int i = index(a.lane);
  if (i < 0 || conns_[i] || failed_) return false;
  conns_[i] = std::make_unique<Conn>(engine_.io(), std::move(a));
  return true;
}

void TcpLink::start_sending(wire::Lane lane) noexcept { conns_[index(lane)]->sending = true; }

void TcpLink::start_reading(wire::Lane lane) {
  Conn& c = *conns_[index(lane)];
  if (c.reading) return;
  c.reading = true;
  arm_read(c);
}

int TcpLink::lanes() const noexcept {
  int n = 0;
  for (const auto& c : conns_) n += c && c->sending && c->reading ? 1 : 0;
  return n;
}

std::string TcpLink::describe(std::uint64_t stream) const {
  return std::string("TCP connection of lane ") + wire::to_string(static_cast<wire::Lane>(stream));
}

void TcpLink::push(wire::Lane lane, quic::Chunk c) {
  if (failed_) {
    if (c.done) c.done(Errc::peer_closed, "the TCP link to the peer is closed");
    return;
  }
  Conn& k = *conns_[index(lane)];
  k.queued += c.len;
  k.out.push_back({std::move(c), 0});
  // Behind a write that waits for room, the new chunk waits too.
  if (!k.write_armed) write(k);
}

void TcpLink::write(Conn& c) {
  std::vector<quic::Completion> done;
  std::string error;
  bool full = false;
  while ((!c.out.empty() || c.unflushed) && !full && error.empty()) {
    std::size_t n = 0;
    if (c.sock.session) {
      // Records of up to kBatch bytes leave in one write; a batch the socket could not take
      // whole is finished before anything else is sent.
      try {
        if (!c.unflushed) {
          c.sock.session->gather();
          std::size_t batch = 0;
          for (auto it = c.out.begin(); it != c.out.end() && batch < kBatch; ++it) {
            std::size_t at = it->done;
            while (at < it->chunk.len && batch < kBatch) {
              const std::size_t piece = std::min(it->chunk.len - at, kRecord);
              const std::size_t took = c.sock.session->send(it->chunk.data + at, piece);
              if (took == 0) break;  // gathering, every piece is taken: never expected
              at += took;
              batch += took;
              n += took;
            }
            if (at < it->chunk.len) break;
          }
        }
        c.unflushed = !c.sock.session->flush();
      } catch (const Error& e) {
        error = e.what();
      }
      full = c.unflushed;
    } else {
      iovec iov[kIov];
      int k = 0;
      for (auto it = c.out.begin(); it != c.out.end() && k < kIov; ++it, ++k)
        iov[k] = {const_cast<std::uint8_t*>(it->chunk.data + it->done), it->chunk.len - it->done};
      msghdr m{};
      m.msg_iov = iov;
      m.msg_iovlen = static_cast<std::size_t>(k);
      const ssize_t w = ::sendmsg(c.sock.fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w < 0 && errno != EAGAIN && errno != EINTR) error = std::string("send: ") + std::strerror(errno);
      n = w < 0 ? 0 : static_cast<std::size_t>(w);
      full = w < 0;
    }
    c.queued -= n;
    // Whole chunks written leave the queue; their completions run once it is consistent.
    while (!c.out.empty()) {
      Out& o = c.out.front();
      const std::size_t take = std::min(n, o.chunk.len - o.done);
      o.done += take;
      n -= take;
      if (o.done < o.chunk.len) break;
      done.push_back(std::move(o.chunk.done));
      c.out.pop_front();
    }
  }
  // Records GnuTLS holds count as waiting chunks do: the socket's room sends them.
  if ((!c.out.empty() || c.unflushed) && error.empty()) arm_write(c);
  if (!done.empty()) engine_.note_activity();
  for (auto& d : done)
    if (d) d(Errc::ok, {});
  if (!error.empty()) broken(c, error);
}

void TcpLink::arm_write(Conn& c) {
  if (c.write_armed) return;
  c.write_armed = true;
  std::weak_ptr<char> alive = alive_;
  c.desc.async_wait(asio::posix::stream_descriptor::wait_write,
                    engine_.guard([this, &c, alive](asio::error_code ec) {
                      if (alive.expired() || ec) return;
                      c.write_armed = false;
                      if (!failed_) write(c);
                    }));
}

void TcpLink::arm_read(Conn& c) {
  if (failed_) return;
  std::weak_ptr<char> alive = alive_;
  if (!c.read_waiting) {
    c.read_waiting = true;
    c.desc.async_wait(asio::posix::stream_descriptor::wait_read,
                      engine_.guard([this, &c, alive](asio::error_code ec) {
                        if (alive.expired() || ec) return;
                        c.read_waiting = false;
                        if (!failed_) read(c);
                      }));
  }
  // Records read from the socket but not taken yet (the pull buffer, GnuTLS's): the socket
  // will not announce them, and may stay quiet for good once the peer waits for an answer.
  // So they get a read of their own even while a wait is queued: a user thread's poll()
  // that ended its turn with them left behind would otherwise leave them to that wait.
  if (c.read_posted || !c.sock.session || !c.sock.session->pending()) return;
  c.read_posted = true;
  engine_.post([this, &c, alive] {
    if (alive.expired()) return;
    c.read_posted = false;
    if (!failed_) read(c);
  });
}

Link::Polled TcpLink::poll(LinkOwner&) {
  Polled p;
  for (auto& c : conns_)
    if (c && c->reading && !failed_) p.moved |= read(*c);
  return p;
}

bool TcpLink::read(Conn& c) {
  const auto stream = static_cast<std::uint64_t>(c.sock.lane);
  bool moved = false;
  for (int turn = 0; turn < kReadsPerTurn; ++turn) {
    // Over the window: the rest waits in the kernel until consumed() makes room.
    if (c.held >= window_) return moved;
    const std::size_t cap = static_cast<std::size_t>(std::min<std::uint64_t>(buf_.size(), window_ - c.held));
    std::size_t n = 0;
    bool eof = false;
    if (c.sock.session) {
      try {
        const tls::PskSession::Read r = c.sock.session->recv(buf_.data(), cap);
        n = r.bytes;
        eof = r.eof;
      } catch (const Error& e) {
        broken(c, e.what());
        return true;
      }
    } else {
      const ssize_t r = ::recv(c.sock.fd, buf_.data(), cap, MSG_DONTWAIT);
      if (r < 0 && errno != EAGAIN && errno != EINTR) {
        broken(c, std::string("receive: ") + std::strerror(errno));
        return true;
      }
      n = r < 0 ? 0 : static_cast<std::size_t>(r);
      eof = r == 0;
    }
    if (eof) {
      broken(c, "the peer ended the connection");
      return true;
    }
    if (n == 0) break;
    moved = true;
    engine_.note_activity();
    const std::optional<std::uint64_t> credit = owner_.on_link_data(*this, stream, buf_.data(), n);
    if (!credit) return true;  // the stream broke the protocol, or the peer is gone
    c.held += n - std::min<std::uint64_t>(*credit, n);
    if (failed_) return true;
  }
  arm_read(c);
  return moved;
}

void TcpLink::consumed(std::uint64_t stream, std::uint64_t n) {
  const int i = index(static_cast<wire::Lane>(stream));
  if (i < 0 || !conns_[i]) return;
  Conn& c = *conns_[i];
  const bool was_full = c.held >= window_;
  c.held -= std::min(c.held, n);
  if (was_full && c.held < window_ && c.reading) arm_read(c);
}

std::uint64_t TcpLink::unacked() const {
  std::uint64_t n = 0;
  for (const auto& c : conns_) {
    if (!c) continue;
    n += c->queued + (c->unflushed ? 1 : 0);
    int in_kernel = 0;  // sent, not acknowledged by the peer's kernel yet
    if (!failed_ && ::ioctl(c->sock.fd, SIOCOUTQ, &in_kernel) == 0 && in_kernel > 0)
      n += static_cast<std::uint64_t>(in_kernel);
  }
  return n;
}

void TcpLink::fail(Errc code, const std::string& why) {
  failed_ = true;
  std::vector<quic::Completion> done;
  for (auto& c : conns_) {
    if (!c) continue;
    asio::error_code ec;
    c->desc.cancel(ec);
    for (auto& o : c->out) done.push_back(std::move(o.chunk.done));
    c->out.clear();
    c->queued = 0;
  }
  for (auto& d : done)
    if (d) d(code, why);
}

void TcpLink::broken(Conn& c, const std::string& why) {
  if (failed_) return;
  const std::string text = describe(static_cast<std::uint64_t>(c.sock.lane)) + ": " + why;
  fail(Errc::peer_failed, text);
  owner_.on_link_closed(*this, Errc::peer_failed, text);
}

}  // namespace nexar::detail
