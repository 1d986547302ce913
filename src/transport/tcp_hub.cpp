#include "transport/tcp_hub.hpp"

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>

#include "core/log.hpp"
#include "quic/endpoint.hpp"
#include "transport/node.hpp"
#include "transport/peer.hpp"
#include "transport/tcp_link.hpp"

namespace nexar::detail {

namespace {
// The exporter labels of the pair's two TCP keys (keying material of its QUIC TLS session).
constexpr std::string_view kAttachLabel = "EXPORTER-nexar-tcp-attach";
constexpr std::string_view kTlsLabel = "EXPORTER-nexar-tcp-tls";
// How long one step of an attach may block (connect, hello, proof, TLS handshake).
constexpr std::chrono::milliseconds kTcpAttachStep{2000};
constexpr wire::Lane kLanes[] = {wire::Lane::data, wire::Lane::bulk, wire::Lane::collective};
}  // namespace

TcpHub::TcpHub(Node& node) : node_(node) {}

TcpHub::~TcpHub() {
  listener_.reset();
}

TcpKeys TcpHub::keys_of(Peer& p) const {
  TcpKeys k;
  k.attach = p.connection()->export_secret(kAttachLabel);
  k.tls = p.connection()->export_secret(kTlsLabel);
  return k;
}

void TcpHub::send_offer(Peer& p, std::uint16_t port) {
  wire::FrameHeader h;
  h.type = wire::FrameType::tcp_offer;
  h.src = static_cast<std::uint32_t>(node_.rank());
  h.tag = port;
  h.seq = cipher_code(node_.config().tcp_cipher);
  p.send_header(wire::Lane::control, h);
}

void TcpHub::hand_over(TcpAttached a) {
  auto held = std::make_shared<TcpAttached>(std::move(a));
  // The engine is stopped before the node (and this hub) is destroyed: queued work never
  // outlives them.
  node_.engine().post([this, held] {
    const int r = static_cast<int>(held->rank);
    Peer* p = node_.peer_locked(r);
    if (!p) return;
    p->attach_tcp(std::move(*held));
    if (std::find(linked_.begin(), linked_.end(), r) == linked_.end()) linked_.push_back(r);
  });
}

void TcpHub::poll() {
  // By index: a peer's poll can run code that attaches another.
  for (std::size_t i = 0; i < linked_.size(); ++i)
    if (Peer* p = node_.peer_locked(linked_[i])) p->poll_tcp();
}

TcpHub::Offer* TcpHub::standing(std::uint32_t rank, wire::Lane lane) {
  auto it = offers_.find(rank);
  const int i = TcpLink::index(lane);
  // One connection per lane, and only to a rank we offered to.
  if (it == offers_.end() || i < 0 || (it->second.taken & (1u << i)) != 0) return nullptr;
  return &it->second;
}

void TcpHub::offer(Peer& p) {
  if (p.rank() >= node_.rank() || !p.connection() || p.relayed()) return;
  try {
    if (!listener_) {
      listener_ = std::make_unique<TcpListener>(
          node_.endpoint()->local(), static_cast<std::uint32_t>(node_.rank()), node_.config().tcp_cipher,
          [this](std::uint32_t rank, wire::Lane lane) -> std::optional<TcpKeys> {
            std::lock_guard lk(mu_);
            const Offer* o = standing(rank, lane);
            if (!o) return std::nullopt;
            return o->keys;
          },
          [this](TcpAttached a) {
            // The lane is taken only by a dialer that proved itself: a stranger's failed
            // attempt cannot use up the rank's offer. (One listener thread: no race between
            // the lookup above and this.)
            {
              std::lock_guard lk(mu_);
              Offer* o = standing(a.rank, a.lane);
              if (!o) return;
              o->taken |= 1u << TcpLink::index(a.lane);
            }
            hand_over(std::move(a));
          },
          kTcpAttachStep);
    }
    const TcpKeys keys = keys_of(p);
    std::lock_guard lk(mu_);
    offers_[static_cast<std::uint32_t>(p.rank())] = Offer{keys, 0};
  } catch (const Error& e) {
    log::info("rank {}: no TCP link with peer {}: {}", node_.rank(), p.rank(), e.what());
    return;
  }
  send_offer(p, listener_->port());
}

void TcpHub::on_offer(Peer& p, std::uint16_t port, std::uint64_t cipher) {
  const Config& cfg = node_.config();
  if (port == 0) {
    log::info("rank {}: peer {} keeps its lanes on QUIC (NEXAR_LINK or NEXAR_TCP_CIPHER differ): no TCP link",
              node_.rank(), p.rank());
    std::lock_guard lk(mu_);
    offers_.erase(static_cast<std::uint32_t>(p.rank()));
    return;
  }
  if (cfg.link != LinkKind::tcp || cipher != cipher_code(cfg.tcp_cipher) || p.rank() <= node_.rank() ||
      !p.connection()) {
    log::info("rank {}: peer {} offers a TCP link with cipher {}; this rank has link {} and cipher {}: "
              "the pair stays on QUIC",
              node_.rank(), p.rank(), cipher == 0 ? "tls" : "none", to_string(cfg.link), to_string(cfg.tcp_cipher));
    send_offer(p, 0);
    return;
  }
  TcpKeys keys;
  try {
    keys = keys_of(p);
  } catch (const Error& e) {
    log::info("rank {}: no TCP link with peer {}: {}", node_.rank(), p.rank(), e.what());
    send_offer(p, 0);
    return;
  }
  quic::Address to = p.addr();
  to.set_port(port);
  const auto self = static_cast<std::uint32_t>(node_.rank());
  const auto peer = static_cast<std::uint32_t>(p.rank());
  const TcpCipher c = cfg.tcp_cipher;
  dialer_.run([this, to, self, peer, c, keys] {
    for (wire::Lane lane : kLanes) {
      try {
        hand_over(tcp_dial(to, self, peer, lane, c, keys, kTcpAttachStep));
      } catch (const Error& e) {
        log::info("rank {}: lane {} with peer {} stays on QUIC: {}", self, wire::to_string(lane), peer, e.what());
      }
    }
  });
}

}  // namespace nexar::detail
