// The elastic half of a node (node.hpp, "elastic membership"): nodes added while the job
// runs, the joiners waiting for admission, and the welcome that admits one.
//
// World ranks are handed out by the membership service, once each and in order, so every
// node numbers every other the same way and failure notices (which name world ranks) mean
// the same everywhere. A joiner's own table starts with every rank the service had handed
// out before it; the ranks announced after it are appended as they come.
#include <algorithm>
#include <thread>

#include "core/error_format.hpp"
#include "core/log.hpp"
#include "transport/node.hpp"

namespace nexar::detail {

using wire::FrameHeader;
using wire::FrameType;

void Node::add_peer(int id, std::string name, quic::Address addr, bool joiner, RelayKey key) {
  engine_.post([this, id, name = std::move(name), addr, joiner, key]() mutable {
    if (!elastic_ || !is_open() || !ep_) return;
    const int n = size();
    if (id < n) return;  // known already (the list we joined with named it)
    if (id != n || id >= static_cast<int>(wire::max_node_ids)) {
      // Announcements come in order on one stream: a gap means a broken service.
      log::warn("rank {}: membership service announced world rank {}, expected {}: ignored", rank_, id, n);
      return;
    }
    if (rank_of_node(name) >= 0) {
      log::warn("rank {}: membership service announced '{}' again as world rank {}: ignored", rank_, name, id);
      return;
    }
    names_.push_back(std::move(name));
    addrs_.push_back(addr);
    routing_.add_rank(id, key);
    failures_.add_rank();
    if (joiner) {
      std::lock_guard lk(join_mu_);
      waiting_.push_back(id);  // ids only grow: stays ascending
    }
    peers_.push_back(std::make_unique<Peer>(*this, peer_context(), id, names_.back(), addrs_.back()));
    if (!routing_.direct(id)) {
      try {
        routing_.relay_to(*peers_.back());
      } catch (const Error& e) {
        log::warn("rank {}: world rank {}: {}", rank_, id, e.what());
      }
    }
    world_.store(n + 1, std::memory_order_release);
    routing_.grown(n + 1);
    log::info("rank {}: world rank {} ({}, {}) {}", rank_, id, names_.back(), addr.to_string(),
              joiner ? "waits to join" : "announced");
    if (id > rank_ && routing_.direct(id)) dial(id);
  });
}

std::vector<int> Node::waiting_joiners() const {
  std::vector<int> v;
  {
    std::lock_guard lk(join_mu_);
    v = waiting_;
  }
  std::erase_if(v, [this](int j) { return failures_.is_failed(j); });
  return v;
}

Peer* Node::peer_locked(int r) noexcept {
  // close() empties the table (engine lock held) but leaves size() as it was.
  return r >= 0 && static_cast<std::size_t>(r) < peers_.size() ? peers_[static_cast<std::size_t>(r)].get() : nullptr;
}

std::vector<int> Node::ready_joiners() {
  std::vector<int> waiting = waiting_joiners();
  std::vector<int> ready;
  std::lock_guard lk(engine_.lock());
  for (int j : waiting) {
    Peer* p = peer_locked(j);
    if (p && p->up() && p->hello_seen()) ready.push_back(j);
  }
  return ready;
}

int Node::joiners_connecting() {
  std::vector<int> waiting = waiting_joiners();
  int n = 0;
  std::lock_guard lk(engine_.lock());
  for (int j : waiting) {
    // Only a handshake under way is worth waiting for: a joiner this node never dialled (an
    // earlier joiner the table we joined with flags, long gone) never gets ready.
    Peer* p = peer_locked(j);
    if (p && p->connection() && !p->gone() && !(p->up() && p->hello_seen())) ++n;
  }
  return n;
}

void Node::admitted(const std::vector<int>& ids) {
  std::lock_guard lk(join_mu_);
  std::erase_if(waiting_, [&](int j) { return std::find(ids.begin(), ids.end(), j) != ids.end(); });
}

void Node::send_welcome(int dest, std::uint64_t comm, std::uint64_t seq, std::vector<std::uint32_t> members) {
  submit([this, dest, comm, seq, members = std::move(members)] {
    Peer* p = dest < size() ? peer(dest) : nullptr;
    if (!p || !p->up() || failures_.is_failed(dest)) return;
    const std::vector<std::byte> payload = wire::encode_members(members);
    FrameHeader h;
    h.type = FrameType::welcome;
    h.src = static_cast<std::uint32_t>(rank_);
    h.comm = comm;
    h.seq = seq;
    p->send_frame(wire::Lane::control, h, payload);
  });
}

void Node::on_welcome(int from, std::uint64_t comm, std::vector<std::uint32_t> members) {
  std::lock_guard lk(join_mu_);
  if (!late_ || welcome_) return;  // every member of the grow sends one: the first counts
  auto names = [&](int r) {
    return std::find(members.begin(), members.end(), static_cast<std::uint32_t>(r)) != members.end();
  };
  if (!names(rank_) || !names(from)) {
    log::warn("rank {}: a welcome from rank {} does not name this rank and its sender: ignored", rank_, from);
    return;
  }
  Welcome w;
  w.comm = comm;
  w.members.assign(members.begin(), members.end());
  welcome_ = std::move(w);
  welcome_cv_.notify_all();
}

Node::Welcome Node::wait_welcome(std::chrono::steady_clock::time_point until) {
  Welcome w;
  {
    std::unique_lock lk(join_mu_);
    welcome_cv_.wait_until(lk, until, [&] { return welcome_.has_value() || !is_open(); });
    if (!is_open()) throw make_error(Errc::closed, ErrorContext{"join", rank_, -1, {}, {}}, "communicator closed");
    if (!welcome_) {
      throw make_error(Errc::timeout, ErrorContext{"join", rank_, -1, {}, {}},
                       "admitted by the membership service, but no grow of the members took this rank in "
                       "before the join timeout");
    }
    w = *welcome_;
  }
  admitted(w.members);
  // Every member of the grow was connected to us when it contributed; the other joiners of
  // the same grow dial us (or we them) as the service announces them. Wait until all are.
  for (;;) {
    int missing = -1;
    std::string why;
    Errc code = Errc::peer_closed;
    {
      std::lock_guard lk(engine_.lock());
      if (!is_open()) throw make_error(Errc::closed, ErrorContext{"join", rank_, -1, {}, {}}, "communicator closed");
      for (int m : w.members) {
        if (m == rank_) continue;
        // A member that failed since the decision is no reason to give up: the communicator
        // is revoked as soon as it is made, like any with a failed member, and a shrink of
        // everyone, this rank included, removes it. Leaving instead would hold the
        // members' shrink up until their op_timeout, waiting for this rank.
        if (failures_.is_failed(m)) continue;
        Peer* p = peer_locked(m);
        if (p && p->gone()) {
          missing = m;
          code = p->gone_code();
          why = p->gone_why().empty() ? "gone" : p->gone_why();
          break;
        }
        if (!p || !p->up() || !p->hello_seen()) {
          missing = m;
          break;
        }
      }
    }
    if (missing < 0) return w;
    ErrorContext ctx{"join", rank_, missing, {}, {}};
    if (!why.empty()) throw make_error(code, ctx, "a member of the communicator we were welcomed into: " + why);
    if (std::chrono::steady_clock::now() > until)
      throw make_error(Errc::timeout, ctx,
                       missing < size() ? "welcomed, but this member never connected"
                                        : "welcomed, but the membership service never announced this member here");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace nexar::detail
