#include "transport/shm_hub.hpp"

#include <unistd.h>

#include <chrono>
#include <string_view>
#include <utility>

#include "core/log.hpp"
#include "shm/segment.hpp"
#include "transport/node.hpp"
#include "transport/peer.hpp"
#include "transport/shm_link.hpp"

namespace nexar::detail {

namespace {
// The exporter label of the attach proof: keying material of the pair's TLS session.
constexpr std::string_view kProofLabel = "EXPORTER-nexar-shm-attach";
// How long one step of an attach may block (connect, request, answer).
constexpr std::chrono::milliseconds kShmAttachStep{2000};
}  // namespace

ShmHub::ShmHub(Node& node) : node_(node), host_key_(shm::host_key()) {}

ShmHub::~ShmHub() {
  listener_.reset();
}

void ShmHub::offer(Peer& p) {
  if (p.rank() <= node_.rank() || !p.connection()) return;
  try {
    if (!listener_) {
      listener_ = std::make_unique<shm::Listener>(
          [this](std::uint32_t rank, const shm::Proof& proof, int doorbell) { return serve(rank, proof, doorbell); });
    }
    const shm::Proof proof = p.connection()->export_secret(kProofLabel);
    {
      std::lock_guard lk(mu_);
      offered_[static_cast<std::uint32_t>(p.rank())] = proof;
    }
  } catch (const Error& e) {
    log::info("rank {}: no shared memory with peer {}: {}", node_.rank(), p.rank(), e.what());
    say_no(node_, p);
    return;
  }
  const std::string payload = host_key_ + "\n" + listener_->name();
  wire::FrameHeader h;
  h.type = wire::FrameType::shm_offer;
  h.src = static_cast<std::uint32_t>(node_.rank());
  p.expect_shm();
  p.send_frame(wire::Lane::control, h, std::as_bytes(std::span(payload)));
}

void ShmHub::say_no(Node& node, Peer& p) {
  p.settle_shm();
  if (!p.connection()) return;
  wire::FrameHeader h;
  h.type = wire::FrameType::shm_offer;
  h.src = static_cast<std::uint32_t>(node.rank());
  p.send_frame(wire::Lane::control, h, {});
}

void ShmHub::declined(Peer& p) {
  {
    std::lock_guard lk(mu_);
    offered_.erase(static_cast<std::uint32_t>(p.rank()));
  }
  p.shm_failed();
}

std::optional<shm::Listener::Answer> ShmHub::serve(std::uint32_t rank, const shm::Proof& proof, int doorbell) {
  {
    std::lock_guard lk(mu_);
    auto it = offered_.find(rank);
    // One attach per offer, and only with the proof of that rank's own connection.
    if (it == offered_.end() || !shm::same_proof(proof, it->second)) {
      ::close(doorbell);
      log::warn("rank {}: refused a shared-memory attach claiming rank {}: no offer to it or a wrong proof",
                node_.rank(), rank);
      return std::nullopt;
    }
    offered_.erase(it);
  }
  std::shared_ptr<shm::Segment> seg;
  try {
    seg = shm::Segment::create(node_.config().shm_ring_bytes, node_.config().stream_window, populate_next());
  } catch (const Error& e) {
    ::close(doorbell);
    log::info("rank {}: no shared memory with peer {}: {}", node_.rank(), rank, e.what());
    return std::nullopt;
  }
  shm::Listener::Answer a;
  a.segment_fd = seg->fd();
  a.doorbell_fd = bell_.fd();
  Node* node = &node_;
  const int own = bell_.fd();
  a.then = [node, rank, seg, doorbell, own](bool confirmed) mutable {
    // The engine is stopped before the node is destroyed: queued work never outlives it.
    node->engine().post([node, rank, seg = std::move(seg), doorbell, own, confirmed]() mutable {
      Peer* p = node->peer_locked(static_cast<int>(rank));
      if (!p || !confirmed) {
        ::close(doorbell);
        if (p) p->shm_failed();
        return;
      }
      p->attach_shm(std::make_unique<ShmLink>(std::move(seg), true, doorbell, own, &node->shm_presence()));
    });
  };
  return a;
}

namespace {
// The attach socket name an offer may carry: "nexar-shm-" and 32 lowercase hex digits
// (docs/PROTOCOL.md); anything else is not connected to.
bool valid_name(std::string_view n) {
  constexpr std::string_view prefix = "nexar-shm-";
  if (n.size() != prefix.size() + 32 || n.substr(0, prefix.size()) != prefix) return false;
  for (char ch : n.substr(prefix.size()))
    if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f'))) return false;
  return true;
}
}  // namespace

void ShmHub::on_offer(Peer& p, std::string_view payload) {
  // Offers come from the lower rank of a pair, once per connection.
  if (p.rank() >= node_.rank() || p.shm_expected() || !p.connection()) return;
  const auto nl = payload.find('\n');
  if (nl == std::string_view::npos || payload.substr(0, nl) != host_key_ || !valid_name(payload.substr(nl + 1))) {
    // Another host (or no offer at all): say so, so that neither side waits for an attach.
    if (!payload.empty()) say_no(node_, p);
    p.settle_shm();
    return;
  }
  const std::string name(payload.substr(nl + 1));
  shm::Proof proof;
  try {
    proof = p.connection()->export_secret(kProofLabel);
  } catch (const Error&) {
    say_no(node_, p);
    return;
  }
  p.expect_shm();
  Node* node = &node_;
  const int me = node_.rank();
  const int peer = p.rank();
  const int bell = bell_.fd();
  const bool populate = populate_next();
  attacher_.run([node, me, peer, bell, name, proof, populate] {
    std::shared_ptr<shm::Segment> seg;
    int peer_bell = -1;
    try {
      shm::Attached a = shm::attach(name, static_cast<std::uint32_t>(me), proof, bell, kShmAttachStep);
      if (!shm::adopt_doorbell(a.doorbell_fd)) throw Error(Errc::protocol, "the peer's doorbell is not an eventfd");
      seg = shm::Segment::open(std::exchange(a.segment_fd, -1), populate);
      // Confirmed, the peer moves its lanes; unconfirmed, neither side does.
      a.confirm();
      peer_bell = std::exchange(a.doorbell_fd, -1);
    } catch (const Error& e) {
      log::info("rank {}: no shared memory with peer {}: {}", me, peer, e.what());
      node->engine().post([node, peer] {
        if (Peer* q = node->peer_locked(peer)) {
          q->shm_failed();
          say_no(*node, *q);
        }
      });
      return;
    }
    node->engine().post([node, peer, seg = std::move(seg), peer_bell, bell]() mutable {
      Peer* q = node->peer_locked(peer);
      if (!q) {
        ::close(peer_bell);
        return;
      }
      q->attach_shm(std::make_unique<ShmLink>(std::move(seg), false, peer_bell, bell, &node->shm_presence()));
    });
  });
}

}  // namespace nexar::detail
