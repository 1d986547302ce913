#include "quic/endpoint.hpp"

#include <gnutls/crypto.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "core/log.hpp"
#include "tls/tls_context.hpp"

namespace nexar::quic {

namespace {
std::string cid_key(const std::uint8_t* data, std::size_t len) {
  return std::string(reinterpret_cast<const char*>(data), len);
}

// How far the timer may be off ngtcp2's expiry before it is moved.
constexpr std::uint64_t kTimerSlackNs = 200'000;
// How much later than ngtcp2 asks a connection with nothing waiting to be sent has its
// timer run. What falls due there is an acknowledgement (ngtcp2 delays them by an eighth
// of the smoothed RTT only, microseconds on loopback), a loss timer or a keep-alive: the
// grace lets the acknowledgement ride on the next message instead of costing a packet of
// its own each way (8 B all_reduce between two processes: 11.5-12.8 -> 8.0-8.4 us; 64 KiB
// to 64 MiB unchanged). 50 us is far inside kMaxAckDelayNs, and inside the 1 ms timer
// granularity every probe timeout adds on top of it.
constexpr std::uint64_t kAckGraceNs = 50'000;
// The max_ack_delay we announce (RFC 9000's default is 25 ms). A sender's probe timeout
// (RFC 9002: srtt + max(4 rttvar, 1 ms) + the peer's max_ack_delay) is how long a lost
// packet at the tail of a flight, one that no later packet reveals, costs; collectives
// send in bursts with such tails, and every stall on one link stalls the ring. We
// acknowledge within min(this, srtt / 8) plus the grace above, so 0.5 ms is a promise
// kept. Measured (bench/netns_loss.sh -r 3, 4 hosts at 1 Gbit/s, all_reduce 64 MiB busbw,
// medians): with 5% random loss 0.012 -> 0.081 GB/s, with 1% 0.081 -> 0.102 GB/s, none
// 0.112 -> 0.110 (docs/PERFORMANCE.md, "QUIC under loss"). An ACK held up longer (a
// descheduled process) costs at most a spurious probe packet, which RFC 9002 does not
// punish.
constexpr std::uint64_t kMaxAckDelayNs = 500'000;

void random_cid(ngtcp2_cid& cid, std::size_t len) {
  cid.datalen = len;
  gnutls_rnd(GNUTLS_RND_RANDOM, cid.data, len);
}
}  // namespace

std::uint64_t Endpoint::now() noexcept {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
}

Endpoint::Endpoint(detail::EventLoop& loop, int fd, const tls::TlsContext& tls,
                   ConnectionSettings settings, bool try_gso)
    : loop_(loop), tls_(tls), settings_(settings), sock_(fd, try_gso), rxbuf_(65536), txbuf_(65536) {
  if (settings_.impair.active()) impair_ = std::make_unique<Impairment>(settings_.impair);
}

Endpoint::~Endpoint() {
  // Before the socket and the timer close.
  if (watching_) loop_.unwatch();
}

void Endpoint::start(AcceptFn accept) {
  accept_ = std::move(accept);
  watching_ = true;
  loop_.watch({sock_.fd(), timer_.fd()}, [this] { return on_ready(); });
}

bool Endpoint::on_ready() {
  if (stopped_) return false;
  if (timer_.clear()) timer_at_ = 0;
  // Reading ends with flush_dirty(), whose re-arm runs due timers.
  on_readable();
  return true;
}

bool Endpoint::on_readable() {
  Batch batch(*this);
  rearm_due_ = true;
  bool check_errors = false;
  bool got = false;
  // Bounded batch so timers and submitted work are not starved under a flood.
  for (int i = 0; i < 256; ++i) {
    Address from;
    std::size_t seg = 0;
    ssize_t n = sock_.recv(rxbuf_.data(), rxbuf_.size(), from, seg);
    if (n == -ECONNREFUSED || n == -EMSGSIZE || n == -EHOSTUNREACH || n == -ENETUNREACH) {
      // An ICMP error arrived (a closed port; "fragmentation needed", which the kernel has
      // already applied to the path MTU); its details wait on the error queue.
      check_errors = true;
      continue;
    }
    if (n < 0) {
      if (n != -EAGAIN && n != -EWOULDBLOCK) log::debug("udp recv: {}", std::strerror(static_cast<int>(-n)));
      break;
    }
    got = true;
    std::uint64_t ts = now();
    auto len = static_cast<std::size_t>(n);
    if (seg == 0) seg = len;
    for (std::size_t off = 0; off < len; off += seg) {
      ++stats_.datagrams_in;
      const std::size_t n1 = std::min(seg, len - off);
      if (impair_ && !impair_->admit(from, rxbuf_.data() + off, n1, ts)) continue;
      dispatch(from, rxbuf_.data() + off, n1, ts);
    }
  }
  if (impair_) {
    impair_->release(now(), [&](const Address& a, std::uint8_t* pkt, std::size_t n1) {
      got = true;
      dispatch(a, pkt, n1, now());
    });
  }
  if (errors_queued_) {
    check_errors = true;
    errors_queued_ = false;
  }
  if (check_errors) sock_.drain_errors([this](const Address& gone) {
    for (auto& c : conns_) {
      // Only established connections: during start-up a peer may not be bound yet.
      if (!c->closed() && c->established() && c->remote() == gone) {
        c->port_gone_ = true;
        c->finish(Errc::peer_failed, "peer's port " + gone.to_string() +
                                         " is unreachable (its process is gone)");
      }
    }
  });
  // Only packets count as activity: an empty poll must not keep the loop spinning.
  if (got) loop_.note_activity();
  return got;
}

void Endpoint::dispatch(const Address& from, std::uint8_t* pkt, std::size_t len, std::uint64_t ts) {
  ngtcp2_version_cid vc;
  int rv = ngtcp2_pkt_decode_version_cid(&vc, pkt, len, scid_len);
  if (rv != 0) {
    ++stats_.datagrams_dropped;
    return;
  }
  Connection* c = nullptr;
  if (auto it = cids_.find(cid_key(vc.dcid, vc.dcidlen)); it != cids_.end()) {
    c = it->second;
  } else {
    c = accept(from, pkt, len, ts);
    if (!c) {
      ++stats_.datagrams_dropped;
      return;
    }
  }
  if (c->closed()) return;
  ngtcp2_path path = c->path_.path;
  path.remote.addr = const_cast<sockaddr*>(from.sa());
  path.remote.addrlen = from.len;
  if (c->read(path, pkt, len, ts) == 0) schedule_flush(*c);
}

namespace {
// The largest payload of a UDP datagram (65535 less its 8-byte header), as ngtcp2 allows.
constexpr std::size_t kMaxUdpPayload = 65527;
// UDP payload under a path MTU: minus the IPv4 (20) or IPv6 (40) header and UDP's 8 bytes.
std::size_t payload_under(std::size_t mtu, const Address& remote) {
  const std::size_t headers = remote.family() == AF_INET6 ? 48 : 28;
  return std::clamp<std::size_t>(mtu > headers ? mtu - headers : 0, NGTCP2_MAX_UDP_PAYLOAD_SIZE,
                                 kMaxUdpPayload);
}
}  // namespace

void Endpoint::defaults(std::uint64_t ts, const Address& remote, ngtcp2_settings& st,
                        ngtcp2_transport_params& params, std::vector<std::uint16_t>& probes) const {
  ngtcp2_settings_default(&st);
  st.initial_ts = ts;
  st.cc_algo = settings_.congestion == Congestion::bbr ? NGTCP2_CC_ALGO_BBR : NGTCP2_CC_ALGO_CUBIC;
  if (settings_.udp_payload != 0 || remote.is_loopback()) {
    // A size set by hand, or loopback (nothing between the ends but the 64 KiB MTU of lo):
    // a fixed size from the first packet, no probing.
    st.max_tx_udp_payload_size = settings_.udp_payload != 0
                                     ? settings_.udp_payload
                                     : payload_under(UdpSocket::route_mtu(remote), remote);
    st.no_tx_udp_payload_size_shaping = 1;
    st.no_pmtud = 1;
  } else {
    // Start at QUIC's safe 1200 bytes and probe up to the MTU of the route (9000 on a
    // jumbo-frame network): the largest size acknowledged is what the path carries. The
    // candidates go largest first, so a path that carries its interface's MTU gets it with
    // one probe; the others are common MTUs below it (Ethernet, the IPv6 minimum).
    const std::size_t route = UdpSocket::route_mtu(remote);
    const std::size_t top = payload_under(route ? route : 1500, remote);
    st.max_tx_udp_payload_size = top;
    probes.clear();
    for (std::size_t mtu : {std::size_t{0}, std::size_t{9000}, std::size_t{1500}, std::size_t{1280}}) {
      const std::size_t p = mtu ? payload_under(mtu, remote) : top;
      if (p > NGTCP2_MAX_UDP_PAYLOAD_SIZE && p <= top && (probes.empty() || p < probes.back()))
        probes.push_back(static_cast<std::uint16_t>(p));
    }
    st.pmtud_probes = probes.data();
    st.pmtud_probeslen = probes.size();
    st.no_pmtud = probes.empty();
  }
  st.handshake_timeout = settings_.handshake_timeout_ns;
  ngtcp2_transport_params_default(&params);
  params.initial_max_streams_uni = 16;
  params.initial_max_stream_data_uni = settings_.stream_window;
  params.initial_max_data = settings_.conn_window;
  params.max_idle_timeout = settings_.idle_timeout_ns;
  params.max_ack_delay = kMaxAckDelayNs;
}

Connection* Endpoint::accept(const Address& from, std::uint8_t* pkt, std::size_t len,
                             std::uint64_t ts) {
  if (stopped_ || !accept_) return nullptr;
  ngtcp2_pkt_hd hd;
  if (ngtcp2_accept(&hd, pkt, len) != 0) return nullptr;
  auto c = std::unique_ptr<Connection>(new Connection(*this, true, from));
  c->id_ = next_id_++;

  ngtcp2_settings st;
  ngtcp2_transport_params params;
  std::vector<std::uint16_t> probes;
  defaults(ts, from, st, params, probes);
  params.original_dcid = hd.dcid;
  params.original_dcid_present = 1;

  ngtcp2_cid scid;
  random_cid(scid, scid_len);
  ngtcp2_callbacks cb = Connection::callbacks(true);
  int rv = ngtcp2_conn_server_new(&c->conn_, &hd.scid, &scid, &c->path_.path, hd.version, &cb,
                                  &st, &params, nullptr, c.get());
  if (rv != 0) {
    log::warn("quic: cannot accept from {}: {}", from.to_string(), ngtcp2_strerror(rv));
    return nullptr;
  }
  try {
    c->init_tls(tls_, settings_.alpn);
  } catch (const std::exception& e) {
    log::warn("quic: cannot accept from {}: {}", from.to_string(), e.what());
    return nullptr;
  }
  ngtcp2_conn_set_keep_alive_timeout(c->conn_, settings_.idle_timeout_ns / 3);
  ConnectionHandler* h = accept_(*c);
  if (!h) return nullptr;
  c->set_handler(h);
  Connection* raw = c.get();
  add_cid(scid, raw);
  raw->cids_.push_back(scid);
  // The client keeps addressing us by the DCID it picked until it learns ours.
  add_cid(hd.dcid, raw);
  raw->cids_.push_back(hd.dcid);
  conns_.push_back(std::move(c));
  log::debug("quic: accepted connection from {}", from.to_string());
  return raw;
}

Connection& Endpoint::connect(const Address& to, const std::string& node, ConnectionHandler* h,
                              const std::string& alpn) {
  auto c = std::unique_ptr<Connection>(new Connection(*this, false, to));
  c->id_ = next_id_++;
  c->expected_node_ = node;
  c->set_handler(h);
  ngtcp2_settings st;
  ngtcp2_transport_params params;
  std::vector<std::uint16_t> probes;
  defaults(now(), to, st, params, probes);
  ngtcp2_cid dcid, scid;
  random_cid(dcid, 18);
  random_cid(scid, scid_len);
  ngtcp2_callbacks cb = Connection::callbacks(false);
  int rv = ngtcp2_conn_client_new(&c->conn_, &dcid, &scid, &c->path_.path, NGTCP2_PROTO_VER_V1,
                                  &cb, &st, &params, nullptr, c.get());
  if (rv != 0) throw Error(Errc::protocol, std::string("ngtcp2_conn_client_new: ") + ngtcp2_strerror(rv));
  c->init_tls(tls_, {alpn.empty() ? settings_.alpn.front() : alpn});
  ngtcp2_conn_set_keep_alive_timeout(c->conn_, settings_.idle_timeout_ns / 3);
  Connection& ref = *c;
  add_cid(scid, &ref);
  ref.cids_.push_back(scid);
  conns_.push_back(std::move(c));
  schedule_flush(ref);
  return ref;
}

void Endpoint::add_cid(const ngtcp2_cid& cid, Connection* c) { cids_[cid_key(cid.data, cid.datalen)] = c; }

void Endpoint::remove_cid(const ngtcp2_cid& cid) { cids_.erase(cid_key(cid.data, cid.datalen)); }

void Endpoint::schedule_flush(Connection& c) {
  if (!c.flush_pending_) {
    c.flush_pending_ = true;
    dirty_.push_back(&c);
  }
  if (batching_ == 0 && !flush_posted_) {
    flush_posted_ = true;
    loop_.post([this] { flush_dirty(); });
  }
}

void Endpoint::flush_dirty() {
  flush_posted_ = false;
  if (dirty_.empty()) {
    if (rearm_due_) rearm_timer();
    return;
  }
  std::uint64_t ts = now();
  // flush() may close a connection, and closing may schedule more work: iterate a copy.
  std::vector<Connection*> todo;
  todo.swap(dirty_);
  for (Connection* c : todo) {
    c->flush_pending_ = false;
    if (!c->closed()) c->flush(ts);
  }
  rearm_timer();
}

void Endpoint::rearm_timer() {
  rearm_due_ = false;
  std::uint64_t next = UINT64_MAX;
  for (int round = 0; round < 4; ++round) {
    next = UINT64_MAX;
    for (auto& c : conns_)
      if (!c->closed()) next = std::min<std::uint64_t>(next, due_at(*c));
    // Already due (ngtcp2 often wants an ACK or a paced packet right now): handle it here
    // instead of arming a timer that fires at once and wakes the loop thread.
    if (next > now()) break;
    service_due(now());
  }
  // Held datagrams of the impairment are due then too (the timer's firing reads them out).
  if (impair_) next = std::min(next, impair_->next_release());
  if (next == UINT64_MAX || stopped_) return;  // a pending timer just finds nothing due
  // ngtcp2's expiry moves on every packet: only pull the timer in, and only by more than
  // the slack, to spare a syscall per packet (timerfd_settime reprograms the CPU's timer,
  // a VM exit on virtual machines; pushing it out on every ACK tripled 8 B all_reduce
  // latency). A timer that fires early re-checks and re-arms itself.
  if (timer_at_ != 0 && timer_at_ <= next + kTimerSlackNs) return;
  timer_at_ = next;
  timer_.arm_at(next);
}

std::uint64_t Endpoint::due_at(Connection& c) const {
  const std::uint64_t t = ngtcp2_conn_get_expiry(c.conn_);
  if (t == UINT64_MAX || c.has_unsent()) return t;
  return t + kAckGraceNs;
}

bool Endpoint::service_due(std::uint64_t ts) {
  bool any = false;
  for (auto& c : conns_) {
    if (!c->closed() && due_at(*c) <= ts) {
      c->handle_expiry(ts);
      any = true;
    }
  }
  return any;
}

void Endpoint::service_timers() {
  if (service_due(now())) rearm_timer();
}

void Endpoint::send(Connection& c, const std::uint8_t* data, std::size_t len, std::size_t segment, bool probe) {
  const std::uint64_t fragmented = sock_.fragmented();
  int rc = sock_.send(c.remote(), data, len, segment, !probe);
  if (sock_.fragmented() != fragmented) {
    if (!c.fragmenting_) {
      log::warn("quic: the path to {} no longer carries {}-byte datagrams; sending them as IP fragments",
                c.remote().to_string(), segment);
      c.fragmenting_ = true;
    }
    stats_.datagrams_fragmented += sock_.fragmented() - fragmented;
    errors_queued_ = true;
  }
  if (rc != 0) {
    // A send can consume the error an ICMP message left pending on the socket (on
    // loopback the ICMP for one datagram arrives before the next is sent). The wake-up
    // then finds nothing to receive, yet the details still wait on the error queue.
    if (rc == -EMSGSIZE || rc == -ECONNREFUSED || rc == -EHOSTUNREACH || rc == -ENETUNREACH)
      errors_queued_ = true;
    log::debug("udp send to {}: {}", c.remote().to_string(), std::strerror(-rc));
    return;  // QUIC treats it as loss and retransmits.
  }
  ++stats_.batches_out;
  stats_.bytes_out += len;
  stats_.packets_out += (len + segment - 1) / segment;
  stats_.largest_datagram_out = std::max<std::uint64_t>(stats_.largest_datagram_out, std::min(len, segment));
}

void Endpoint::retire(Connection& c) {
  for (auto& cid : c.cids_) remove_cid(cid);
  c.cids_.clear();
  // Free it after the current call chain unwinds; it may be deep inside its own callbacks.
  Connection* p = &c;
  loop_.post([this, p] {
    std::erase_if(dirty_, [p](Connection* x) { return x == p; });
    std::erase_if(conns_, [p](const std::unique_ptr<Connection>& x) { return x.get() == p; });
  });
}

std::size_t Endpoint::live_connections() const noexcept {
  std::size_t n = 0;
  for (const auto& c : conns_)
    if (!c->closed()) ++n;
  return n;
}

void Endpoint::shutdown(const std::string& reason, std::uint64_t app_code) {
  if (stopped_) return;
  for (auto& c : conns_)
    if (!c->closed()) c->close(app_code, reason);
  stopped_ = true;
  timer_.disarm();
  timer_at_ = 0;
  if (watching_) {
    watching_ = false;
    loop_.unwatch();
  }
}

}  // namespace nexar::quic
