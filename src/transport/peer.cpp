#include "transport/peer.hpp"

#include <cstring>

#include "core/log.hpp"
#include "engine/engine.hpp"
#include "transport/failures.hpp"
#include "transport/joiners.hpp"
#include "transport/matching.hpp"
#include "transport/routing.hpp"
#include "transport/rpc_lanes.hpp"
#include "wire/ballot.hpp"

namespace nexar::detail {

using wire::FrameHeader;
using wire::FrameType;
using wire::Lane;

Peer::Peer(PeerOwner& owner, const PeerContext& ctx, int rank, std::string name, quic::Address addr)
    : owner_(owner),
      ctx_(ctx),
      rank_(rank),
      name_(std::move(name)),
      addr_(addr),
      addr_text_(addr.to_string()),
      stripes_(*this, QuicLink::priority(Lane::collective)) {}

void Peer::attach(quic::Connection& c) {
  quic_.attach(c);
  c.set_handler(this);
  c.user = this;
}

std::string Peer::on_peer_identity(quic::Connection& c, const std::string& node) {
  if (std::string why = on_stripe_identity(node); !why.empty()) return why;
  const quic::Connection* conn = quic_.connection();
  if (conn && conn != &c && !conn->closed()) return "node '" + node + "' is already connected";
  return {};
}

Peer::~Peer() {
  // The engine stopped with a TCP grace still running: what waited for its verdict fails
  // now, not at its deadline.
  for (auto& op : awaiting_verdict_) op->complete(Errc::closed, "communicator closed");
}

quic::Completion Peer::chunk_done(PooledBuffer buf, std::shared_ptr<OpState> op) {
  return [this, buf = std::move(buf), op = std::move(op)](Errc code, const std::string& why) mutable {
    buf.reset();
    if (!op) return;
    if (code == Errc::ok) {
      op->succeed(op->status());
      return;
    }
    // A carrier fails its chunks with its own words ("connection closed") as it ends, before
    // this peer hears of it and the node declares the rank failed, and maybe on a shard's
    // thread. So the operation fails on the engine thread once that has happened, as every
    // other operation with this peer does: with the peer's verdict (rank_failed, say), its
    // message naming the rank.
    //
    // Once the engine stopped (the node is closing, and this peer may be being destroyed)
    // nothing runs posted work: the carrier's words have to do.
    if (ctx_.engine.stopped()) {
      op->complete(code, why);
      return;
    }
    ctx_.engine.post([this, op = std::move(op), code, why] {
      if (gone()) owner_.fail(op, gone_code_, rank_, gone_why_);
      else if (tcp_grace_) awaiting_verdict_.push_back(op);  // see on_link_closed
      else owner_.fail(op, code, rank_, why);
    });
  };
}

void Peer::on_established(quic::Connection& c) {
  // A lazy dial we gave up for the peer's own (abandon_dial) can still finish its handshake
  // before its close goes out (the peer refuses it as a duplicate once it reads our
  // certificate). It is not the pair's connection: nothing is attached to it and nothing
  // more goes on it.
  if (quic_.connection() != &c) return;
  attach(c);
  quic_.open_streams(ctx_.config.bulk_scavenger);
  const std::string& my_name = owner_.name_of(ctx_.rank);
  FrameHeader h;
  h.type = FrameType::hello;
  h.src = static_cast<std::uint32_t>(ctx_.rank);
  h.tag = static_cast<std::uint64_t>(owner_.size());
  PooledBuffer b = encode_frame(ctx_.pool, h, std::as_bytes(std::span(my_name)));
  const auto* hp = reinterpret_cast<const std::uint8_t*>(b.data());
  quic_.push_now(Lane::control, quic::Chunk{hp, wire::header_size + my_name.size(), chunk_done(std::move(b), nullptr)});
  // The side that accepted has taken this connection. The side that dialled knows only
  // that its handshake ended: the acceptor may still refuse it (its check of our
  // certificate comes after), so nothing more goes out until the acceptor's hello proves
  // it kept the connection.
  if (c.is_server()) confirm();
}

void Peer::confirm() {
  // What was queued while the connection was being set up follows the hello.
  state_.store(State::up, std::memory_order_release);
  quic_.confirm();
  owner_.on_peer_up(*this);
  log::debug("rank {}: peer {} ({}) up", ctx_.rank, rank_, addr_text_);
}

void Peer::send_frame(Lane lane, PooledBuffer buf, std::size_t len, std::shared_ptr<OpState> done, Link* via) {
  // A neighbour that said goodbye lingers until its own last bytes are acknowledged: what
  // we relay to it meanwhile (acknowledgements of those bytes among them) still goes.
  const bool lingering = gone_code_ == Errc::peer_closed && quic_.open(lane) && !done;
  if (gone() && !lingering) {
    if (done) owner_.fail(done, gone_code_ == Errc::ok ? Errc::peer_failed : gone_code_, rank_, gone_why_);
    return;
  }
  const auto* p = reinterpret_cast<const std::uint8_t*>(buf.data());
  push(lane, quic::Chunk{p, len, chunk_done(std::move(buf), std::move(done))}, via);
}

PooledBuffer encode_frame(BufferPool& pool, FrameHeader h, std::span<const std::byte> payload) {
  h.length = payload.size();
  PooledBuffer b = pool.acquire(wire::header_size + payload.size());
  wire::encode_header(h, std::span<std::byte, wire::header_size>(b.data(), wire::header_size));
  if (!payload.empty()) std::memcpy(b.data() + wire::header_size, payload.data(), payload.size());
  return b;
}

void Peer::send_frame(Lane lane, FrameHeader h, std::span<const std::byte> payload) {
  PooledBuffer b = encode_frame(ctx_.pool, h, payload);
  send_frame(lane, std::move(b), wire::header_size + payload.size());
}

void Peer::push(Lane lane, quic::Chunk c, Link* via) {
  Link& link = via ? *via : route(lane, 0, 0);
  lane_out_[static_cast<int>(lane)] += c.len;
  link.push(lane, std::move(c));
  // A chunk that waits for a connection nobody dialled yet (Config::lazy_connect) dials it.
  if (&link == &quic_ && !quic_.connection()) owner_.connect_lazily(rank_);
}

namespace {
// Collective messages smaller than this stay on the first connection: their time on the
// wire is latency, not a window's worth, and a connection that carries every small message
// has its acknowledgements ride on the next one instead of travelling alone.
constexpr std::uint64_t kStripeMinBytes = 64 * 1024;
// How long the end of a TCP connection waits for QUIC to tell why (on_link_closed): a
// round trip on any LAN, far below the failure detector's times.
constexpr std::chrono::milliseconds kTcpGrace{50};
}  // namespace

Link& Peer::route(Lane lane, Tag tag, std::uint64_t bytes) {
  if (sole_) return *sole_;
  if (relay_) return *relay_;
  // A neighbour still connecting (or not dialled yet): the chunks wait on the first
  // connection, in order, and go once it is confirmed (confirm() is also what ends
  // State::connecting).
  if (!quic_.ready()) return quic_;
  if (shm_ && shm_->sending(lane)) return *shm_;
  // Small collective messages stay on QUIC: measured when only QUIC's socket was polled by
  // waiters, each over TCP waited for the engine thread to wake (8 B all_reduce between 2
  // namespace hosts, 40 -> 250 us). Every collective message has a tag of its own, so the
  // two links need no order between them, as the stripes don't; other lanes keep theirs.
  // Bulk stays under QUIC's scavenger window while it is on: TCP's congestion control
  // fills the path's queue, and a barrier beside a 1 GiB bulk_send then took 17-23x its
  // idle time instead of 2.4-2.6x (docs/PERFORMANCE.md, "TCP link").
  if (tcp_ && tcp_->sending(lane) && (lane != Lane::collective || bytes >= kStripeMinBytes) &&
      (lane != Lane::bulk || !ctx_.config.bulk_scavenger))
    return *tcp_;
  if (lane != Lane::collective || stripes_.active() == 0 || bytes < kStripeMinBytes) return quic_;
  // Every collective message has a tag of its own (collective_message_tag), so any
  // connection will do: the message's number plus the operation's, round the connections,
  // so that operations of one message per neighbour spread too.
  const auto u = static_cast<std::uint64_t>(tag);
  const auto i = ((u & 0xffffffffu) + (u >> 32)) % static_cast<std::uint64_t>(stripes_.active() + 1);
  if (i == 0) return quic_;
  ++striped_;
  return stripes_.at(static_cast<int>(i) - 1);
}

void Peer::dial_stripes(const Stripes::Dialer& dialer) {
  if (stripes_dialled_ || gone() || relay_ || shm_ || !quic_.connection()) return;
  stripes_dialled_ = true;
  for (std::uint32_t i = 1; i < ctx_.config.connections_per_peer; ++i) stripes_.dial(dialer);
}

std::string Peer::stripe_refusal() const {
  const std::uint32_t want = ctx_.config.connections_per_peer;
  if (gone() || relay_ || shm_ || !quic_.connection() || quic_.connection()->closed())
    return "rank " + std::to_string(ctx_.rank) + " takes no extra connection from rank " + std::to_string(rank_) + " now";
  if (static_cast<std::uint32_t>(stripes_.live()) + 1 >= want)
    return "rank " + std::to_string(ctx_.rank) + " already has " + std::to_string(stripes_.live() + 1) +
           " connections with rank " + std::to_string(rank_) + " (connections_per_peer = " + std::to_string(want) + ")";
  return {};
}

std::string Peer::accept_stripe(quic::Connection& c) {
  std::string why = stripe_refusal();
  if (why.empty()) stripes_.accept(c);
  return why;
}

std::string Peer::accept_stripe(Hosted& h) {
  std::string why = stripe_refusal();
  if (why.empty()) stripes_.accept(h);
  return why;
}

std::string Peer::on_stripe_identity(const std::string& node) {
  // Every connection of the pair, the first one included, must name the peer's node.
  if (node != name_) return "certificate names '" + node + "', expected '" + name_ + "'";
  return {};
}

void Peer::on_stripe_ready(bool hosted) {
  log::debug("rank {}: peer {}: an extra connection is up{}", ctx_.rank, rank_, hosted ? " on a shard" : "");
}

std::optional<std::uint64_t> Peer::on_stripe_data(Link& link, std::uint64_t stream, const std::uint8_t* data,
                                                  std::size_t len) {
  return on_link_data(link, stream, data, len);
}

void Peer::on_stripe_closed(Errc code, const std::string& why) {
  link_ended(code, "an extra connection to the peer closed: " + why);
}

void Peer::link_ended(Errc code, const std::string& why) {
  if (gone()) return;
  // What was in flight on it is lost with it: the pair cannot go on, as when its first
  // connection ends. A peer that declared us failed closed with rank_failed: we are the
  // failed one.
  if (code == Errc::rank_failed) ctx_.failures.on_failed_notice(rank_, ctx_.rank, why);
  mark_gone(code == Errc::ok ? Errc::peer_closed : code, why);
}

void Peer::drop_connection() {
  quic_.detach();
  hello_seen_ = false;
  std::erase_if(in_, [this](const auto& e) { return e.first.first == &quic_; });
}

void Peer::abandon_dial() {
  abandoned_ = quic_.connection();
  drop_connection();
  // Inside the handshake of the incoming connection: close ours once that call unwinds,
  // unless it closed by itself meanwhile (on_closed then forgot it).
  ctx_.engine.post([this, c = abandoned_] {
    if (abandoned_ == c && c) c->close(quic::close_orderly, std::string(simultaneous_open));
  });
}

void Peer::shm_failed() {
  if (shm_) return;
  shm_expected_ = false;
  shm_settled_ = true;
  for (bool moved : shm_in_)
    if (moved) {
      abort("shared memory attach failed after the peer moved its lanes");
      return;
    }
}

void Peer::attach_shm(std::unique_ptr<ShmLink> link) {
  if (shm_ || gone() || !quic_.connection()) return;
  shm_ = std::move(link);
  shm_expected_ = true;
  shm_settled_ = true;
  // Each lane's last QUIC frame is the switch; its later frames go through the ring, and
  // the peer reads the ring only after the switch, so the lane keeps its order.
  for (int i = 0; i < shm::Segment::lanes; ++i) {
    FrameHeader h;
    h.type = FrameType::shm_switch;
    h.src = static_cast<std::uint32_t>(ctx_.rank);
    send_header(ShmLink::lane(i), h);
    shm_->start_sending(i);
    if (shm_in_[i]) shm_->start_reading(i);
  }
  owner_.on_shm_attached(rank_, *shm_);
  // The peer may have switched and written before we held the segment.
  shm_->ring_self();
  log::info("rank {}: peer {} is on this host: message lanes through shared memory", ctx_.rank, rank_);
}

bool Peer::poll_shm() {
  if (!shm_ || gone()) return false;
  const Link::Polled p = shm_->poll(*this);
  if (!p.broken.empty()) {
    abort(p.broken);
    return true;
  }
  // Lanes left with work: come back (the doorbell wakes a sleeping engine too).
  if (p.more) ctx_.engine.note_activity();
  return p.moved;
}

FrameHeader Peer::message_header(FrameType type, std::uint64_t comm, Tag tag, std::uint64_t seq,
                                 std::uint64_t length, std::uint16_t check) const {
  FrameHeader h;
  h.type = type;
  h.check = check;
  h.src = static_cast<std::uint32_t>(ctx_.rank);
  h.comm = comm;
  h.tag = static_cast<std::uint64_t>(tag);
  h.seq = seq;
  h.length = length;
  return h;
}

void Peer::send_header(Lane lane, const FrameHeader& h, Link* via) {
  PooledBuffer b = ctx_.pool.acquire(wire::header_size);
  wire::encode_header(h, std::span<std::byte, wire::header_size>(b.data(), wire::header_size));
  send_frame(lane, std::move(b), wire::header_size, {}, via);
}

void Peer::start_rendezvous(Domain d, std::uint64_t comm, Tag tag, std::uint16_t check,
                            std::vector<ConstBuffer> parts, std::uint64_t size, std::shared_ptr<OpState> op) {
  if (gone()) {
    owner_.fail(op, gone_code_, rank_, gone_why_);
    return;
  }
  if (ctx_.failures.fail_if_revoked(comm, op)) return;
  std::uint64_t seq = next_seq_++;
  rdv_out_[seq] = RdvOut{d, comm, tag, std::move(parts), size, std::move(op), false};
  send_header(lane_of(d), message_header(FrameType::rts, comm, tag, seq, size, check), &route(lane_of(d), tag, size));
}

void Peer::push_payload(Lane lane, const std::vector<ConstBuffer>& parts, const std::shared_ptr<OpState>& op,
                        Link* via) {
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const bool last = i + 1 == parts.size();
    quic::Chunk c{static_cast<const std::uint8_t*>(parts[i].data), parts[i].bytes,
                  last ? chunk_done({}, op) : quic::Completion{}};
    push(lane, std::move(c), via);
  }
  if (parts.empty()) op->succeed();
}

void Peer::send_eager_in_place(Domain d, std::uint64_t comm, Tag tag, std::uint16_t check,
                               std::vector<ConstBuffer> parts, std::uint64_t size, std::shared_ptr<OpState> op) {
  if (gone()) {
    owner_.fail(op, gone_code_, rank_, gone_why_);
    return;
  }
  if (ctx_.failures.fail_if_revoked(comm, op)) return;
  Link* via = &route(lane_of(d), tag, size);
  send_header(lane_of(d), message_header(FrameType::eager, comm, tag, 0, size, check), via);
  push_payload(lane_of(d), parts, op, via);
}

bool Peer::cancel_rendezvous(const OpState* op) {
  for (auto& [seq, r] : rdv_out_) {
    if (r.op.get() == op && !r.cancelled) {
      // The announcement is out; the peer will still answer it. Remember to send an empty,
      // cancelled data frame then, so its receive fails instead of waiting forever.
      r.cancelled = true;
      r.parts.clear();
      return true;
    }
  }
  return false;
}

void Peer::accept_rendezvous(Domain d, std::uint64_t seq, Tag tag, std::shared_ptr<RecvOp> r,
                             std::uint64_t size) {
  FrameHeader h;
  h.type = FrameType::cts;
  h.src = static_cast<std::uint32_t>(ctx_.rank);
  h.comm = r->comm;
  h.tag = static_cast<std::uint64_t>(tag);
  h.seq = seq;
  rdv_in_[static_cast<int>(d)][seq] = RdvIn{std::move(r), size};
  send_header(lane_of(d), h, &route(lane_of(d), tag, size));
}

void Peer::release_unexpected(Domain d, std::uint64_t bytes) {
  std::uint64_t& held = unexpected_bytes_[static_cast<int>(d)];
  held -= std::min(held, bytes);
  if (held >= ctx_.config.unexpected_limit) return;
  for (auto& [key, s] : in_) {
    if (s->deferred && domain_of(s->reader.lane()) == d) {
      s->link->consumed(s->stream, s->deferred);
      s->deferred = 0;
    }
  }
}

std::uint64_t Peer::unacked() const {
  if (gone()) return 0;
  if (sole_) return sole_->unacked();
  if (relay_) return relay_->unacked();
  std::uint64_t n = quic_.unacked();
  if (!quic_.connection()) return n;
  n += stripes_.unacked();
  if (shm_) n += shm_->unacked();
  if (tcp_) n += tcp_->unacked();
  return n;
}

void Peer::say_goodbye() {
  if (!up()) return;
  FrameHeader h;
  h.type = FrameType::goodbye;
  h.src = static_cast<std::uint32_t>(ctx_.rank);
  send_header(Lane::control, h);
}

// ---- inbound ---------------------------------------------------------------------------

struct Peer::Reader {
  Peer& p;
  InStream& s;
  bool on_preamble(Lane lane) {
    // An extra connection of the pair carries the collective lane only.
    if (!s.link->carries(lane)) {
      p.protocol_error(s.link->describe(s.stream) + " carries lane " + std::to_string(static_cast<int>(lane)));
      return false;
    }
    for (auto& [key, other] : p.in_) {
      if (other.get() != &s && other->link == s.link && other->reader.lane() == lane) {
        p.protocol_error("second stream for lane " + std::to_string(static_cast<int>(lane)));
        return false;
      }
    }
    return true;
  }
  bool on_header(const FrameHeader& h) { return p.on_header(s, h); }
  void on_payload(std::span<const std::byte> chunk) { p.on_payload(s, chunk); }
  bool on_frame_end(const FrameHeader& h) { return p.on_frame_end(s, h); }
};

void Peer::on_stream_data(quic::Connection& c, std::int64_t stream, const std::uint8_t* data,
                          std::size_t len) {
  if (quic_.connection() != &c) return;  // a dial we gave up (see on_established)
  const auto n = on_link_data(quic_, static_cast<std::uint64_t>(stream), data, len);
  if (n && !c.closed()) c.consumed(stream, *n);
}

std::optional<std::uint64_t> Peer::on_link_data(Link& link, std::uint64_t stream, const std::uint8_t* data,
                                                std::size_t len) {
  if (gone()) return std::nullopt;
  auto& slot = in_[{&link, stream}];
  if (!slot) {
    slot = std::make_unique<InStream>(ctx_.config.max_frame_bytes);
    slot->link = &link;
    slot->stream = stream;
    if (auto lane = link.stream_lane(stream)) slot->reader.start_without_preamble(*lane);
  }
  InStream& s = *slot;
  s.deferred_now = 0;
  Reader r{*this, s};
  auto in = std::span<const std::byte>(reinterpret_cast<const std::byte*>(data), len);
  if (auto err = s.reader.feed(in, r)) {
    if (!gone()) {
      protocol_error(link.describe(stream) + ": " + err.error);
    }
    return std::nullopt;
  }
  ctx_.engine.note_activity();
  lane_in_[static_cast<int>(s.reader.lane())] += len;
  // Everything not parked as over-budget unexpected data is credited back at once.
  return len - s.deferred_now;
}

PeerStats Peer::stats() const {
  PeerStats s;
  s.connected = up() && !relayed();
  if (quic::Connection* c = quic_.connection(); c && !c->closed()) {
    s.links.emplace_back("quic");
    const auto p = c->path_stats();
    s.rtt = std::chrono::nanoseconds(p.rtt);
    s.min_rtt = std::chrono::nanoseconds(p.min_rtt);
    s.latest_rtt = std::chrono::nanoseconds(p.latest_rtt);
    s.rtt_var = std::chrono::nanoseconds(p.rtt_var);
    s.cwnd = p.cwnd;
    s.bytes_in_flight = p.bytes_in_flight;
    s.lost_packets = p.lost_packets;
  }
  if (const int n = stripes_.active(); n > 0) s.links.push_back("quic-stripes x" + std::to_string(n));
  if (shm_) s.links.emplace_back("shm");
  if (tcp_) s.links.emplace_back("tcp");
  if (relay_) s.links.emplace_back("relay");
  for (int l = 0; l < wire::lane_count; ++l)
    s.lanes.push_back(LaneStats{wire::to_string(static_cast<wire::Lane>(l)), lane_out_[l], lane_in_[l]});
  return s;
}

LinkOwner& Peer::use_link(Link& link) {
  sole_ = &link;
  hello_seen_ = true;
  state_.store(State::up, std::memory_order_release);
  return *this;
}

void Peer::on_link_closed(Link& link, Errc code, const std::string& why) {
  if (&link != tcp_.get() || !quic_.connection()) {
    link_ended(code, why);
    return;
  }
  // A peer that closes in order, or that declared us failed, ends its TCP connections
  // after it told us so on QUIC; the two travel separately, so give QUIC a moment to say
  // it before the end counts as the peer failing. A killed process also loses its QUIC
  // port, which the kernel answers as soon as a datagram reaches it (the connection then
  // closes by itself): so one goes now, or with the lanes on TCP QUIC may carry nothing
  // until the grace ends. Operations failed meanwhile wait for the verdict.
  if (gone() || tcp_grace_) return;
  tcp_grace_ = std::make_unique<asio::steady_timer>(ctx_.engine.io(), kTcpGrace);
  tcp_grace_->async_wait(ctx_.engine.guard([this, code, why](asio::error_code ec) {
    if (!ec) link_ended(code, "the TCP link with the peer ended: " + why);
  }));
  FrameHeader h;
  h.type = FrameType::heartbeat;
  h.src = static_cast<std::uint32_t>(ctx_.rank);
  send_header(Lane::control, h);
}

bool Peer::poll_tcp() {
  if (!tcp_ || gone()) return false;
  return tcp_->poll(*this).moved;
}

void Peer::attach_tcp(TcpAttached a) {
  if (gone() || relay_ || shm_ || !quic_.connection()) return;
  const wire::Lane lane = a.lane;
  if (!tcp_) tcp_ = std::make_unique<TcpLink>(ctx_.engine, static_cast<LinkOwner&>(*this), ctx_.config.stream_window);
  if (!tcp_->add(std::move(a))) return;
  // The lane's last QUIC frame is the switch; its later frames go on the TCP connection,
  // which the peer reads only after the switch, so the lane keeps its order.
  FrameHeader h;
  h.type = FrameType::tcp_switch;
  h.src = static_cast<std::uint32_t>(ctx_.rank);
  send_header(lane, h, &quic_);
  tcp_->start_sending(lane);
  if (tcp_in_[TcpLink::index(lane)]) tcp_->start_reading(lane);
  log::info("rank {}: peer {}: lane {} over TCP ({})", ctx_.rank, rank_, wire::to_string(lane),
            to_string(ctx_.config.tcp_cipher));
}

void Peer::protocol_error(const std::string& why) {
  if (gone()) return;
  log::warn("rank {}: protocol error from peer {} ({}): {}", ctx_.rank, rank_, addr_text_, why);
  mark_gone(Errc::protocol, "protocol error: " + why);
  // We are inside ngtcp2's packet processing here, which must not be re-entered.
  close_later(quic::close_error, "protocol error: " + why);
}

void Peer::close_later(std::uint64_t app_code, std::string why) {
  quic::Connection* c = quic_.connection();
  if (!c) return;
  // Posted work does not always run in the order it was posted: work a user thread posts
  // while it makes progress inline can run before work the engine thread posted a moment
  // earlier. So the connection may have closed by itself and been freed (its own posted
  // work) by the time this runs: close it only if it is still ours. A closed connection
  // is no longer ours (on_closed forgot it), and the generation tells a new connection at
  // the same address from it.
  const std::uint64_t gen = quic_.generation();
  ctx_.engine.post([this, c, gen, app_code, why = std::move(why)] {
    if (quic_.connection() == c && quic_.generation() == gen) c->close(app_code, why);
  });
}

void Peer::abort(const std::string& why) {
  if (gone()) return;
  log::warn("rank {}: giving up on peer {} ({}): {}", ctx_.rank, rank_, addr_text_, why);
  mark_gone(Errc::peer_failed, why);
  if (quic::Connection* c = quic_.connection()) c->close(quic::close_error, why);
}

void Peer::lost(const std::string& why) {
  if (gone()) return;
  log::info("rank {}: peer {} ({}) out of reach: {}", ctx_.rank, rank_, addr_text_, why);
  mark_gone(Errc::peer_closed, why);
}

namespace {
// The ways a live peer's connection ends that mean the peer (or its host) failed, as
// opposed to an orderly goodbye or our own close.
bool is_failure(Errc code) noexcept {
  return code == Errc::peer_failed || code == Errc::protocol || code == Errc::timeout ||
         code == Errc::tls || code == Errc::io;
}
}  // namespace

void Peer::cut_off(const std::string& why) {
  if (gone() && gone_code_ == Errc::rank_failed) return;
  mark_gone(Errc::rank_failed, why);
  // Possibly inside packet processing (of this connection or another): close it afterwards,
  // telling the peer (should it still hear us) that it was declared failed.
  close_later(quic::close_declared_failed, why);
}

void Peer::heartbeat(std::uint64_t now, std::uint64_t period) {
  if (!up() || !quic_.connection()) return;
  if (now - quic_.connection()->last_rx() < period || now - last_heartbeat_ < period) return;
  last_heartbeat_ = now;
  FrameHeader h;
  h.type = FrameType::heartbeat;
  h.src = static_cast<std::uint32_t>(ctx_.rank);
  send_header(Lane::control, h);
}

void Peer::mark_gone(Errc code, const std::string& why) {
  if (!gone() && is_failure(code) && ctx_.failures.judging()) {
    // A member failed: the node declares it, revokes what contains it, tells everyone,
    // and comes back here through cut_off().
    ctx_.failures.declare_failed(rank_, why);
    if (gone()) return;
  }
  if (!gone()) {
    gone_code_ = code;
    gone_why_ = why;
    state_.store(State::gone, std::memory_order_release);
  }
  // Everything in flight with this peer fails now, naming it.
  for (auto& op : awaiting_verdict_) owner_.fail(op, gone_code_, rank_, gone_why_);
  awaiting_verdict_.clear();
  if (sole_) sole_->fail(gone_code_, gone_why_);
  if (shm_) shm_->fail(gone_code_, gone_why_);
  if (tcp_) tcp_->fail(gone_code_, gone_why_);
  if (relay_) relay_->fail(gone_code_, gone_why_);
  quic_.fail(gone_code_, gone_why_);
  for (auto& [seq, r] : rdv_out_)
    if (!r.cancelled) owner_.fail(r.op, gone_code_, rank_, gone_why_);
  rdv_out_.clear();
  for (auto& m : rdv_in_) {
    for (auto& [seq, r] : m) owner_.fail(r.recv->op, gone_code_, rank_, gone_why_);
    m.clear();
  }
  for (auto& [id, s] : in_) {
    if (s->sink.kind == Sink::user) owner_.fail(s->sink.recv->op, gone_code_, rank_, gone_why_);
    if (s->sink.kind == Sink::unexpected && s->sink.unexp->waiter)
      owner_.fail(s->sink.unexp->waiter->op, gone_code_, rank_, gone_why_);
  }
  // Messages from it that will never be completed (eager ones cut off mid-way, announced
  // rendezvous ones) must not be matched by later receives; whole ones stay receivable.
  for (int di = 0; di < domain_count; ++di) {
    auto& list = ctx_.matching.queue(static_cast<Domain>(di)).unexpected();
    std::uint64_t& held = unexpected_bytes_[di];
    for (auto it = list.begin(); it != list.end();) {
      const Unexpected& u = **it;
      if (u.source == rank_ && (u.rendezvous || !u.complete) && !u.waiter) {
        held -= std::min<std::uint64_t>(held, u.data.size());
        it = list.erase(it);
      } else {
        ++it;
      }
    }
  }
  // The extra connections go too, after the current packet processing (one of them may be
  // its connection). A peer that said goodbye closes its own once its last bytes are in.
  if (stripes_.live() > 0 && gone_code_ != Errc::peer_closed) {
    const std::uint64_t app_code = gone_code_ == Errc::rank_failed ? quic::close_declared_failed : quic::close_error;
    ctx_.engine.post([this, app_code, why = gone_why_] { stripes_.close_all(app_code, why); });
  }
  // A frame reader of one of these streams may be running below us: free them later.
  if (!in_.empty()) {
    auto dead = std::make_shared<decltype(in_)>(std::move(in_));
    in_.clear();
    ctx_.engine.post([dead] {});
  }
  owner_.on_peer_closed(*this);
}

bool Peer::receiving(const OpState* op) const {
  for (const auto& [id, s] : in_) {
    if (s->sink.kind == Sink::user && s->sink.recv->op.get() == op) return true;
    if (s->sink.kind == Sink::unexpected && s->sink.unexp->waiter && s->sink.unexp->waiter->op.get() == op)
      return true;
  }
  for (const auto& m : rdv_in_)
    for (const auto& [seq, r] : m)
      if (r.recv->op.get() == op) return true;
  return false;
}

bool Peer::on_header(InStream& s, const FrameHeader& h) {
  // Messages over QUIC are moving (not control frames, nor the switch to shared memory):
  // waiters keep the engine thread from waking for the replies (Engine::settle_delay).
  if (s.link->on_socket() && s.reader.lane() != Lane::control && h.type != FrameType::shm_switch)
    ctx_.engine.note_socket_messages();
  // Relayed frames name their origin, which need not be this neighbour.
  if (h.type == FrameType::relay || h.type == FrameType::relay_ack) {
    if (s.link == relay_.get()) {
      protocol_error(std::string(wire::to_string(h.type)) + " frame inside a relayed lane");
      return false;
    }
    s.sink = Sink{};
    s.sink.kind = Sink::relay;
    s.sink.segment = ctx_.pool.acquire(wire::header_size + h.length);
    return true;
  }
  if (h.src != static_cast<std::uint32_t>(rank_)) {
    protocol_error("frame claims source rank " + std::to_string(h.src));
    return false;
  }
  s.sink = Sink{};
  const Lane lane = s.reader.lane();
  switch (h.type) {
    case FrameType::hello:
      s.sink.kind = Sink::hello;
      return true;
    case FrameType::goodbye:
      return true;
    case FrameType::eager: {
      if (ctx_.failures.revoked(h.comm)) {  // nobody will receive it: drop it as it comes
        s.sink.kind = Sink::discard;
        return true;
      }
      Domain d = domain_of(lane);
      Tag tag = static_cast<Tag>(h.tag);
      if (auto r = ctx_.matching.queue(d).take_posted(h.comm, rank_, tag)) {
        if (!ctx_.matching.calls_agree(*r, rank_, tag, h.check)) {
          s.sink.kind = Sink::discard;
          return true;
        }
        s.sink.kind = Sink::user;
        s.sink.truncated = h.length > r->cap;
        s.sink.recv = std::move(r);
      } else {
        // Nobody awaits it (yet): its collective may show the ranks disagree.
        if (h.check != 0 && !ctx_.matching.unawaited(h.comm, rank_, tag, h.check)) {
          s.sink.kind = Sink::discard;
          return true;
        }
        Unexpected u;
        u.comm = h.comm;
        u.source = rank_;
        u.tag = tag;
        u.check = h.check;
        u.size = h.length;
        u.data.reserve(static_cast<std::size_t>(std::min<std::uint64_t>(h.length, 1u << 20)));
        u.complete = h.length == 0;
        s.sink.kind = Sink::unexpected;
        s.sink.unexp = ctx_.matching.queue(d).add_unexpected(std::move(u));
      }
      return true;
    }
    case FrameType::rts: {
      // The sender withdraws it when it learns of the revocation; never asked for, the data
      // never comes.
      if (ctx_.failures.revoked(h.comm)) return true;
      Domain d = domain_of(lane);
      Tag tag = static_cast<Tag>(h.tag);
      if (auto r = ctx_.matching.queue(d).take_posted(h.comm, rank_, tag)) {
        // Disagreeing calls revoke the communicator, which withdraws the sender's announcement.
        if (ctx_.matching.calls_agree(*r, rank_, tag, h.check)) accept_rendezvous(d, h.seq, tag, std::move(r), h.length);
      } else {
        if (h.check != 0 && !ctx_.matching.unawaited(h.comm, rank_, tag, h.check)) return true;  // revoked: withdrawn
        Unexpected u;
        u.comm = h.comm;
        u.source = rank_;
        u.tag = tag;
        u.check = h.check;
        u.rendezvous = true;
        u.seq = h.seq;
        u.size = h.length;
        ctx_.matching.queue(d).add_unexpected(std::move(u));
      }
      return true;
    }
    case FrameType::cts: {
      auto it = rdv_out_.find(h.seq);
      if (it == rdv_out_.end()) {
        protocol_error("cts for unknown message " + std::to_string(h.seq));
        return false;
      }
      RdvOut r = std::move(it->second);
      rdv_out_.erase(it);
      FrameHeader d;
      d.type = FrameType::rdata;
      d.src = static_cast<std::uint32_t>(ctx_.rank);
      d.comm = r.comm;
      d.tag = static_cast<std::uint64_t>(r.tag);
      d.seq = h.seq;
      Lane out_lane = lane_of(r.domain);
      Link* via = &route(out_lane, r.tag, r.size);
      if (r.cancelled) {
        d.flags = wire::flag_cancelled;
        send_header(out_lane, d, via);
        return true;
      }
      d.length = r.size;
      send_header(out_lane, d, via);
      push_payload(out_lane, r.parts, r.op, via);
      return true;
    }
    case FrameType::rdata: {
      Domain d = domain_of(lane);
      auto& m = rdv_in_[static_cast<int>(d)];
      auto it = m.find(h.seq);
      if (it == m.end()) {
        protocol_error("data for unrequested message " + std::to_string(h.seq));
        return false;
      }
      auto r = std::move(it->second.recv);
      std::uint64_t announced = it->second.size;
      m.erase(it);
      if (!(h.flags & wire::flag_cancelled) && h.length != announced) {
        owner_.fail(r->op, Errc::protocol, rank_, "rendezvous data size differs from its announcement");
        protocol_error("rdata of " + std::to_string(h.length) + " bytes for a message announced as " +
                       std::to_string(announced));
        return false;
      }
      if (h.flags & wire::flag_cancelled) {
        // As with MPI_Cancel, a withdrawn send was never sent: the receive it had matched
        // goes back to waiting, ahead of receives posted after it.
        ctx_.matching.repost(d, std::move(r));
        return true;
      }
      s.sink.kind = Sink::user;
      s.sink.truncated = h.length > r->cap;
      s.sink.recv = std::move(r);
      return true;
    }
    case FrameType::heartbeat:
      return true;
    case FrameType::revoke:
    case FrameType::shm_offer:
    case FrameType::ports:
      s.sink.kind = Sink::control;
      s.sink.bytes.reserve(static_cast<std::size_t>(h.length));
      return true;
    case FrameType::tcp_offer:
      return true;
    case FrameType::tcp_switch: {
      const int i = TcpLink::index(lane);
      // Only once per lane, on its QUIC stream, and only where this rank wants TCP.
      if (s.link != &quic_ || i < 0 || tcp_in_[i] || ctx_.config.link != LinkKind::tcp) {
        protocol_error("unexpected tcp_switch on lane " + std::string(wire::to_string(lane)));
        return false;
      }
      tcp_in_[i] = true;
      if (tcp_ && tcp_->has(lane)) tcp_->start_reading(lane);
      return true;
    }
    case FrameType::shm_switch: {
      const int i = ShmLink::index(lane);
      // Only once per lane, on its QUIC stream, and only where shared memory was offered:
      // a switch into memory nobody maps would leave the lane's messages unread.
      if (s.link != &quic_ || i < 0 || shm_in_[i] || !shm_expected_) {
        protocol_error("unexpected shm_switch on lane " + std::string(wire::to_string(lane)));
        return false;
      }
      shm_in_[i] = true;
      // What the peer wrote after the switch may have rung us before the switch was read.
      if (shm_) {
        shm_->start_reading(i);
        shm_->ring_self();
      }
      return true;
    }
    case FrameType::failed:
      if (h.tag >= static_cast<std::uint64_t>(owner_.size()) && ctx_.elastic) {
        // A rank announced to the sender and not to us yet: nothing here can involve it.
        s.sink.kind = Sink::discard;
        return true;
      }
      if (h.tag >= static_cast<std::uint64_t>(owner_.size())) {
        protocol_error("failure notice for rank " + std::to_string(h.tag) + " in a world of " +
                       std::to_string(owner_.size()));
        return false;
      }
      [[fallthrough]];
    case FrameType::agree:
    case FrameType::decided:
    case FrameType::welcome:
      s.sink.kind = Sink::control;
      s.sink.bytes.reserve(static_cast<std::size_t>(h.length));
      return true;
    case FrameType::rpc_request:
      s.sink.kind = Sink::rpc_request;
      s.sink.bytes.reserve(static_cast<std::size_t>(std::min<std::uint64_t>(h.length, 1u << 20)));
      return true;
    case FrameType::rpc_response:
      s.sink.kind = owner_.rpc() && owner_.rpc()->awaits(h.seq) ? Sink::rpc_response : Sink::discard;
      if (s.sink.kind == Sink::rpc_response)
        s.sink.bytes.reserve(static_cast<std::size_t>(std::min<std::uint64_t>(h.length, 1u << 20)));
      return true;
    case FrameType::relay:
    case FrameType::relay_ack:
      break;  // taken above
  }
  protocol_error("unexpected frame type");
  return false;
}

void Peer::on_payload(InStream& s, std::span<const std::byte> chunk) {
  Sink& k = s.sink;
  switch (k.kind) {
    case Sink::user:
      // A receive that failed meanwhile (its deadline passed) may have lost its buffer: the
      // rest of its message is dropped.
      if (!k.truncated && !k.recv->op->done()) std::memcpy(k.recv->buf + k.got, chunk.data(), chunk.size());
      break;
    case Sink::unexpected:
      if (k.unexp->waiter && !k.unexp->waiter->op->done()) {
        // Matched while arriving: the rest lands directly in the receive buffer.
        auto& w = *k.unexp->waiter;
        if (k.unexp->size <= w.cap) std::memcpy(w.buf + k.got, chunk.data(), chunk.size());
      } else {
        k.unexp->data.insert(k.unexp->data.end(), chunk.begin(), chunk.end());
        std::uint64_t& held = unexpected_bytes_[static_cast<int>(domain_of(s.reader.lane()))];
        held += chunk.size();
        if (held > ctx_.config.unexpected_limit) {
          s.deferred += chunk.size();
          s.deferred_now += chunk.size();
        }
      }
      break;
    case Sink::rpc_request:
    case Sink::rpc_response:
    case Sink::hello:
    case Sink::control:
      k.bytes.insert(k.bytes.end(), chunk.begin(), chunk.end());
      break;
    case Sink::relay:
      std::memcpy(k.segment.data() + wire::header_size + k.got, chunk.data(), chunk.size());
      break;
    case Sink::none:
    case Sink::discard:
      break;
  }
  k.got += chunk.size();
}

bool Peer::on_frame_end(InStream& s, const FrameHeader& h) {
  Sink& k = s.sink;
  switch (h.type) {
    case FrameType::hello: {
      std::string name(reinterpret_cast<const char*>(k.bytes.data()), k.bytes.size());
      // An elastic world grows while it runs: its nodes know different sizes of it.
      if (name != name_ || (h.tag != static_cast<std::uint64_t>(owner_.size()) && !ctx_.elastic)) {
        protocol_error("hello from '" + name + "' with world " + std::to_string(h.tag) +
                       ", expected '" + name_ + "' with world " + std::to_string(owner_.size()));
        return false;
      }
      hello_seen_ = true;
      // The acceptor's hello: the connection we dialled is ours.
      if (state_.load(std::memory_order_relaxed) == State::connecting && quic_.connection() &&
          !quic_.connection()->is_server())
        confirm();
      break;
    }
    case FrameType::goodbye:
      log::debug("rank {}: peer {} said goodbye", ctx_.rank, rank_);
      // Mark it now so new operations fail fast; the connection close follows.
      mark_gone(Errc::peer_closed, "peer closed its communicator");
      break;
    case FrameType::eager:
    case FrameType::rdata:
      if (k.kind == Sink::user) {
        ctx_.matching.finish_recv(*k.recv, rank_, static_cast<Tag>(h.tag), h.length);
      } else if (k.kind == Sink::unexpected) {
        auto u = k.unexp;
        u->complete = true;
        if (u->waiter) {
          Domain d = domain_of(s.reader.lane());
          auto& q = ctx_.matching.queue(d);
          for (auto it = q.unexpected().begin(); it != q.unexpected().end(); ++it) {
            if (it->get() == u.get()) {
              ctx_.matching.deliver_unexpected(d, u->waiter, it);
              break;
            }
          }
        }
      }
      break;
    case FrameType::failed:
      if (k.kind == Sink::discard) break;
      ctx_.failures.on_failed_notice(rank_, static_cast<int>(h.tag),
                             std::string(reinterpret_cast<const char*>(k.bytes.data()), k.bytes.size()));
      break;
    case FrameType::revoke: {
      // tag: the code its operations fail with (docs/PROTOCOL.md); payload: why, if said.
      const bool disagreement = h.tag == static_cast<std::uint64_t>(Errc::invalid_argument);
      ctx_.failures.on_revoke_notice(rank_, h.comm, disagreement ? Errc::invalid_argument : Errc::revoked,
                              std::string(reinterpret_cast<const char*>(k.bytes.data()), k.bytes.size()));
      break;
    }
    case FrameType::shm_offer:
      owner_.on_shm_offer(*this, std::string_view(reinterpret_cast<const char*>(k.bytes.data()), k.bytes.size()));
      break;
    case FrameType::tcp_offer:
      if (h.tag > 0xffff) {
        protocol_error("a tcp_offer frame names port " + std::to_string(h.tag));
        return false;
      }
      owner_.on_tcp_offer(*this, static_cast<std::uint16_t>(h.tag), h.seq);
      break;
    case FrameType::ports:
      // The frame's length was checked (even, at most 15 ports); port 0 is nowhere to dial.
      shard_ports_.clear();
      for (std::size_t i = 0; i + 1 < k.bytes.size(); i += 2) {
        const auto port = static_cast<std::uint16_t>((std::to_integer<unsigned>(k.bytes[i]) << 8) |
                                                      std::to_integer<unsigned>(k.bytes[i + 1]));
        if (port == 0) {
          protocol_error("a ports frame names port 0");
          return false;
        }
        shard_ports_.push_back(port);
      }
      break;
    case FrameType::agree:
    case FrameType::decided: {
      wire::Ballot b;
      // In an elastic world a ballot may name a joiner not announced here yet.
      const auto bound = ctx_.elastic ? wire::max_node_ids : static_cast<std::uint32_t>(owner_.size());
      if (auto err = wire::decode_ballot(k.bytes, bound, b)) {
        protocol_error(std::string(wire::to_string(h.type)) + " frame: " + err.error);
        return false;
      }
      owner_.on_ballot(rank_, h, std::move(b));
      break;
    }
    case FrameType::welcome: {
      std::vector<std::uint32_t> members;
      if (auto err = wire::decode_members(k.bytes, wire::max_node_ids, members)) {
        protocol_error(std::string("welcome frame: ") + err.error);
        return false;
      }
      ctx_.joiners.on_welcome(rank_, h.comm, members);
      break;
    }
    case FrameType::rpc_request:
      if (owner_.rpc()) owner_.rpc()->on_request(rank_, h.comm, h.tag, h.seq, std::move(k.bytes));
      break;
    case FrameType::rpc_response:
      if (k.kind == Sink::rpc_response)
        owner_.rpc()->on_response(rank_, h.seq, static_cast<wire::RpcStatus>(h.flags), std::move(k.bytes));
      break;
    case FrameType::relay:
      if (!ctx_.routing.on_relay(*this, s.reader.lane(), h, std::move(k.segment))) return false;
      break;
    case FrameType::relay_ack:
      if (!ctx_.routing.on_relay_ack(*this, h, std::move(k.segment))) return false;
      break;
    default:
      break;
  }
  k = Sink{};
  return true;
}

void Peer::on_closed(quic::Connection& c, Errc code, const std::string& why) {
  if (&c == abandoned_) {
    abandoned_ = nullptr;
    return;
  }
  quic::Connection* conn = quic_.connection();
  if (&c != conn && conn) return;  // a duplicate connection we refused, or a dial we gave up
  if (&c == conn && code == Errc::tls && !c.is_server() && !gone() &&
      state_.load(std::memory_order_relaxed) == State::connecting &&
      why.find(simultaneous_open) != std::string::npos) {
    // Lazy connections: the lower rank refused our dial because its own dial to us is under
    // way, and its connection is the one the pair keeps. It arrives by itself; should it
    // not (lost on the way), we dial again shortly.
    drop_connection();
    owner_.redial_later(rank_, ++refusals_);
    return;
  }
  quic_.detach();
  // The peer gave up on us (we were silent too long for it): we are the failed one, not it.
  if (code == Errc::rank_failed && !gone()) ctx_.failures.on_failed_notice(rank_, ctx_.rank, why);
  mark_gone(code, why);
}

void Peer::make_relayed(std::unique_ptr<RelayLink> link) {
  relay_ = std::move(link);
  hello_seen_ = true;
  state_.store(State::up, std::memory_order_release);
}

void Peer::relay_in(Lane lane, std::uint64_t offset, const std::uint8_t* data, std::size_t len) {
  if (gone()) return;
  if (!relay_) {
    protocol_error("relayed bytes from a neighbour, which never relays to us");
    return;
  }
  const bool ok = relay_->on_segment(lane, offset, data, len, [&](const std::uint8_t* p, std::size_t n) {
    return on_link_data(*relay_, static_cast<std::uint64_t>(lane), p, n);
  });
  if (!ok) {
    if (!gone()) protocol_error(std::string("relayed lane ") + wire::to_string(lane) + ": segment at offset " +
                                std::to_string(offset) + " lies beyond the credit granted");
    return;
  }
}

}  // namespace nexar::detail
