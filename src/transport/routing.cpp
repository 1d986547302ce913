// Routing (routing.hpp): neighbours and routes, sending a relayed peer's lanes toward it,
// forwarding what passes through, taking what arrives for us, and routing around ranks
// that went down. Byte layout in docs/PROTOCOL.md, "Relay".
#include "transport/routing.hpp"

#include <cstring>

#include "core/error_format.hpp"
#include "core/log.hpp"
#include "engine/engine.hpp"
#include "quic/endpoint.hpp"
#include "tls/mac.hpp"
#include "transport/peer.hpp"

namespace nexar::detail {

using wire::FrameHeader;
using wire::FrameType;
using wire::Lane;

namespace {

// What a relayed frame's MAC covers besides its data: every field but the hop count, which
// relays change (docs/PROTOCOL.md, "Relay").
std::array<std::byte, 32> mac_fields(FrameType type, Lane lane, std::uint32_t src, std::uint32_t dest,
                                     std::uint64_t seq, std::uint64_t tag) {
  std::array<std::byte, 32> f{};
  auto put = [&f](std::size_t at, std::uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) f[at + static_cast<std::size_t>(i)] = static_cast<std::byte>(v >> (8 * i));
  };
  put(0, static_cast<std::uint8_t>(type), 1);
  put(1, static_cast<std::uint8_t>(lane), 1);
  put(4, src, 4);
  put(8, dest, 4);
  put(16, seq, 8);
  put(24, tag, 8);
  return f;
}

}  // namespace

Routing::Routing(Owner& owner, int rank, int world, bool elastic, const Config& cfg, std::vector<RelayKey> keys,
                 BufferPool& pool, Engine& engine)
    : owner_(owner),
      rank_(rank),
      elastic_(elastic),
      cfg_(cfg),
      pool_(pool),
      engine_(engine),
      formed_(world),
      keys_(std::move(keys)),
      down_(static_cast<std::size_t>(world), 0),
      routes_(cfg.topology, world, rank, down_),
      plain_routes_(routes_),
      hop_limit_(hop_limit(cfg.topology, world, cfg.relay_hop_limit)) {
  // Elastic: the keys of the ranks announced later are appended (add_rank).
  if (elastic_) keys_.reserve(wire::max_node_ids);
}

void Routing::relay_to(Peer& p) {
  const int r = p.rank();
  const auto i = static_cast<std::size_t>(r);
  if (i >= keys_.size() || keys_[i] == RelayKey{}) {
    ErrorContext ctx{"connect", rank_, r, {}, {}};
    throw make_error(Errc::invalid_argument, ctx,
                     "rank " + std::to_string(r) + " is no neighbour under topology " + cfg_.topology.to_string() +
                         " and no relay key was issued for it (NodeOptions::relay_keys)");
  }
  p.make_relayed(std::make_unique<RelayLink>(
      cfg_.relay_window, [this, q = &p](Lane lane) { pump(*q, lane); }, [this, r](Lane lane) { owe_ack(r, lane); }));
}

void Routing::add_rank(int id, const RelayKey& key) {
  keys_.resize(static_cast<std::size_t>(id));
  keys_.push_back(key);
}

void Routing::grown(int world) {
  down_.resize(static_cast<std::size_t>(world), 0);
  routes_ = Routes(cfg_.topology, world, rank_, down_);
  // Frames kept for a rank unknown until now are handled again.
  auto parked = std::move(parked_);
  parked_.clear();
  for (auto& p : parked) {
    Peer* from = owner_.peer_locked(p.from);
    if (!from || from->gone()) continue;
    if (p.h.type == FrameType::relay)
      on_relay(*from, p.lane, p.h, std::move(p.seg));
    else
      on_relay_ack(*from, p.h, std::move(p.seg));
  }
}

bool Routing::direct(int r) const noexcept {
  return r != rank_ && neighbours(cfg_.topology, link_world(rank_, r), rank_, r);
}

std::vector<int> Routing::direct_peers() const {
  std::vector<int> out;
  for (int r = 0; r < owner_.size(); ++r)
    if (direct(r)) out.push_back(r);
  return out;
}

bool Routing::routable(int r) const noexcept {
  if (!direct(r)) {
    const int h = routes_.hops(r);
    return h > 0 && h <= hop_limit_;
  }
  return true;
}

std::string Routing::beyond_hop_limit(int dest) const {
  const int hops = plain_routes_.hops(dest);
  if (hops <= hop_limit_) return {};
  return "rank " + std::to_string(dest) + " is " + std::to_string(hops) + " hops away under topology " +
         cfg_.topology.to_string() + ", beyond the hop limit of " + std::to_string(hop_limit_) +
         " (Config::relay_hop_limit, NEXAR_RELAY_HOPS)";
}

void Routing::pump(Peer& dest, Lane lane) {
  RelayLink* link = dest.relay_link();
  if (!link || dest.gone()) return;
  const int next = routes_.next(dest.rank());
  if (next < 0) return;  // route_around() decides what an unreachable rank means
  Peer* hop = owner_.peer_locked(next);
  if (!hop || hop->gone()) return;
  std::vector<RelayLink::Piece> pieces;
  std::uint64_t offset = 0;
  const std::uint64_t now = quic::Endpoint::now();
  while (link->next_segment(lane, wire::max_relay_segment, offset, pieces, now)) {
    std::size_t len = 0;
    for (const auto& p : pieces) len += p.len;
    const std::size_t total = wire::header_size + len + wire::relay_mac_size;
    PooledBuffer b = pool_.acquire(total);
    FrameHeader h;
    h.type = FrameType::relay;
    h.src = static_cast<std::uint32_t>(rank_);
    h.comm = wire::relay_route(static_cast<std::uint32_t>(dest.rank()), 1);
    h.seq = offset;
    h.length = len + wire::relay_mac_size;
    wire::encode_header(h, std::span<std::byte, wire::header_size>(b.data(), wire::header_size));
    std::byte* const data = b.data() + wire::header_size;
    std::byte* out = data;
    for (const auto& p : pieces) {
      std::memcpy(out, p.data, p.len);
      out += p.len;
    }
    pieces.clear();
    const auto fields = mac_fields(FrameType::relay, lane, h.src, static_cast<std::uint32_t>(dest.rank()), h.seq, 0);
    const tls::Mac tag = tls::mac(key_of(dest.rank()), {fields, std::span<const std::byte>(data, len)});
    std::memcpy(out, tag.data(), tag.size());
    hop->send_frame(lane, std::move(b), total);
  }
}

bool Routing::on_relay(Peer& from, Lane lane, const FrameHeader& h, PooledBuffer seg) {
  const std::uint32_t dest = wire::relay_dest(h.comm);
  const unsigned hops = wire::relay_hops(h.comm);
  if (park_unknown(from, lane, h, seg)) return true;
  const int world = owner_.size();
  if (h.src >= static_cast<std::uint32_t>(world) || dest >= static_cast<std::uint32_t>(world) ||
      h.src == dest || h.src == static_cast<std::uint32_t>(rank_) || hops == 0 || wire::relay_lane(h.comm) != 0) {
    from.protocol_error("relay frame from rank " + std::to_string(h.src) + " to rank " + std::to_string(dest) +
                               " with " + std::to_string(hops) + " hops");
    return false;
  }
  const int origin = static_cast<int>(h.src);
  if (dest == static_cast<std::uint32_t>(rank_)) {
    Peer* o = owner_.peer_locked(origin);
    if (!o || o->gone() || owner_.is_failed(origin) || !o->relayed()) return true;
    const std::size_t len = static_cast<std::size_t>(h.length - wire::relay_mac_size);
    const std::byte* data = seg.data() + wire::header_size;
    const auto fields = mac_fields(FrameType::relay, lane, h.src, dest, h.seq, h.tag);
    if (!tls::mac_matches(key_of(origin), {fields, std::span<const std::byte>(data, len)},
                          std::span<const std::byte, tls::mac_size>(data + len, tls::mac_size))) {
      // Not written by its claimed origin (or altered on the way): a relay forged it.
      log::error("rank {}: dropped a relayed segment claiming rank {} as its origin, received from rank {}: "
                 "its MAC is wrong",
                 rank_, origin, from.rank());
      return true;
    }
    o->relay_in(lane, h.seq, reinterpret_cast<const std::uint8_t*>(data), len);
    return true;
  }
  forward(from, lane, h, std::move(seg));
  return true;
}

void Routing::forward(Peer& from, Lane lane, const FrameHeader& h, PooledBuffer seg) {
  // Dropped when it has gone as far as allowed (routes disagree while news of a failure
  // spreads), or when nothing leads on but back: the origin sends again once it learns of
  // the failure that rerouted it, or when no acknowledgement moves (resend_stalled).
  const std::uint32_t dest = wire::relay_dest(h.comm);
  const unsigned hops = wire::relay_hops(h.comm);
  if (static_cast<int>(hops) >= hop_limit_) {
    if (h.type == FrameType::relay)
      log::warn("rank {}: dropped a relayed segment from rank {} to rank {}: hop limit {} reached", rank_, h.src,
                dest, hop_limit_);
    return;
  }
  const int next = routes_.next(static_cast<int>(dest));
  Peer* hop = next >= 0 ? owner_.peer_locked(next) : nullptr;
  if (!hop || next == from.rank()) return;
  FrameHeader f = h;
  f.comm = wire::relay_route(dest, hops + 1, static_cast<Lane>(wire::relay_lane(h.comm)));
  wire::encode_header(f, std::span<std::byte, wire::header_size>(seg.data(), wire::header_size));
  hop->send_frame(lane, std::move(seg), wire::header_size + static_cast<std::size_t>(h.length));
}

bool Routing::on_relay_ack(Peer& from, const FrameHeader& h, PooledBuffer seg) {
  const std::uint32_t dest = wire::relay_dest(h.comm);
  const unsigned hops = wire::relay_hops(h.comm);
  const std::uint8_t lane = wire::relay_lane(h.comm);
  if (park_unknown(from, Lane::control, h, seg)) return true;
  const int world = owner_.size();
  if (h.src >= static_cast<std::uint32_t>(world) || dest >= static_cast<std::uint32_t>(world) || h.src == dest ||
      h.src == static_cast<std::uint32_t>(rank_) || hops == 0 || lane >= wire::lane_count) {
    from.protocol_error("relay_ack frame from rank " + std::to_string(h.src) + " to rank " +
                               std::to_string(dest));
    return false;
  }
  if (dest == static_cast<std::uint32_t>(rank_)) {
    Peer* d = owner_.peer_locked(static_cast<int>(h.src));
    if (!d || d->gone() || !d->relay_link()) return true;
    const auto fields = mac_fields(FrameType::relay_ack, static_cast<Lane>(lane), h.src, dest, h.seq, h.tag);
    if (!tls::mac_matches(key_of(d->rank()), {fields},
                          std::span<const std::byte, tls::mac_size>(seg.data() + wire::header_size, tls::mac_size))) {
      log::error("rank {}: dropped a relayed acknowledgement claiming rank {} as its origin, received from rank {}: "
                 "its MAC is wrong",
                 rank_, h.src, from.rank());
      return true;
    }
    if (!d->relay_link()->on_ack(static_cast<Lane>(lane), h.seq, h.tag, quic::Endpoint::now())) {
      d->abort("protocol error: relay_ack for bytes never sent");
      return true;
    }
    pump(*d, static_cast<Lane>(lane));
    return true;
  }
  forward(from, Lane::control, h, std::move(seg));
  return true;
}

bool Routing::park_unknown(Peer& from, Lane lane, const FrameHeader& h, PooledBuffer& seg) {
  // In an elastic world a rank may relay for (or hear from) a node announced to others but
  // not to it yet: keep the frame until the announcement comes (Node::add_peer, then
  // grown), within reason.
  const int world = owner_.size();
  const auto known = [world](std::uint32_t r) { return r < static_cast<std::uint32_t>(world); };
  const std::uint32_t dest = wire::relay_dest(h.comm);
  if (!elastic_ || (known(h.src) && known(dest)) || h.src >= wire::max_node_ids || dest >= wire::max_node_ids)
    return false;
  constexpr std::size_t kMostParked = 4096;
  if (parked_.size() >= kMostParked) {
    log::warn("rank {}: dropped a relayed frame from rank {} to rank {}: neither announced here yet", rank_, h.src,
              dest);
    return true;
  }
  parked_.push_back(Parked{from.rank(), lane, h, std::move(seg)});
  return true;
}

void Routing::owe_ack(int origin, Lane lane) {
  for (const auto& [o, l] : acks_owed_)
    if (o == origin && l == lane) return;
  acks_owed_.emplace_back(origin, lane);
  if (acks_posted_) return;
  acks_posted_ = true;
  engine_.post([this] { send_acks(); });
}

void Routing::send_acks() {
  acks_posted_ = false;
  auto owed = std::move(acks_owed_);
  acks_owed_.clear();
  // Acknowledgements still go out while this node closes: the peers' closes wait for them.
  // (Once it closed, owner_.peer_locked finds nobody.)
  for (const auto& [origin, lane] : owed) {
    // Even to a peer gone meanwhile: its goodbye, say, waits for this acknowledgement.
    Peer* o = owner_.peer_locked(origin);
    if (!o || !o->relay_link()) continue;
    std::uint64_t received = 0, limit = 0;
    if (!o->relay_link()->take_ack(lane, received, limit)) continue;
    const int next = routes_.next(origin);
    Peer* hop = next >= 0 ? owner_.peer_locked(next) : nullptr;
    if (!hop) continue;
    FrameHeader h;
    h.type = FrameType::relay_ack;
    h.src = static_cast<std::uint32_t>(rank_);
    h.comm = wire::relay_route(static_cast<std::uint32_t>(origin), 1, lane);
    h.seq = received;
    h.tag = limit;
    const auto fields = mac_fields(FrameType::relay_ack, lane, h.src, static_cast<std::uint32_t>(origin), h.seq, h.tag);
    const tls::Mac tag = tls::mac(key_of(origin), {fields});
    hop->send_frame(Lane::control, h, std::as_bytes(std::span(tag)));
  }
}

void Routing::resend_stalled(std::uint64_t now, std::uint64_t rto) {
  for (int d = 0; d < owner_.size(); ++d) {
    Peer* p = owner_.peer_locked(d);
    if (!p || !p->relayed() || p->gone() || !p->relay_link()->stalled(now, rto)) continue;
    resend(*p);
  }
}

void Routing::resend(Peer& p) {
  p.relay_link()->rewind();
  for (int l = 0; l < wire::lane_count; ++l) pump(p, static_cast<Lane>(l));
}

void Routing::route_around(int r, bool failed) {
  if (r < 0 || r >= owner_.size() || r == rank_) return;
  if (down_.size() < static_cast<std::size_t>(owner_.size())) down_.resize(static_cast<std::size_t>(owner_.size()), 0);
  if (down_[static_cast<std::size_t>(r)]) return;
  down_[static_cast<std::size_t>(r)] = 1;
  Routes before = std::move(routes_);
  routes_ = Routes(cfg_.topology, owner_.size(), rank_, down_);
  for (int d = 0; d < owner_.size(); ++d) {
    Peer* p = owner_.peer_locked(d);
    if (!p || !p->relayed() || p->gone()) continue;
    if (!routable(d)) {
      // Every path to it runs through ranks that are down, or is longer than relays carry:
      // nothing sent to it can arrive. (While this node closes, its own connections end:
      // nothing to tell.)
      if (owner_.judging_failures()) {
        const std::string why = routes_.next(d) < 0
                                    ? "unreachable: every route to it runs through failed or departed ranks"
                                    : "unreachable: its shortest route around failed or departed ranks takes " +
                                          std::to_string(routes_.hops(d)) + " hops, beyond the hop limit of " +
                                          std::to_string(hop_limit_);
        // Cut off by a failure: it counts as failed, and everyone is told (operations that
        // need it cannot complete). Cut off by ranks that closed in order: it is alive and
        // may still reach others, so it is only out of reach from here.
        if (failed) {
          p->abort(why);
        } else {
          p->lost(why + " (rank " + std::to_string(r) + " left)");
        }
      }
      continue;
    }
    if (failed || routes_.next(d) != before.next(d)) resend(*p);
  }
}

}  // namespace nexar::detail
