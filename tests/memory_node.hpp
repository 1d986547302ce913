// One rank's transport for unit tests, without a Node: the real matching
// (transport/matching.hpp), routing (transport/routing.hpp), failures
// (transport/failures.hpp) and joiners (transport/joiners.hpp), a Peer for every other rank,
// and a few lines for each call they make upward (PeerOwner and the owner interfaces of the
// four). Ranks are joined by in-memory links (memory_link.hpp); no socket, TLS or engine
// thread: the test steps the links and polls the engines (MemoryNode::poll). Nothing judges liveness (there
// is no endpoint), and no membership module is attached.
//
// Upcalls that a test looks for are written to `events`. A MemoryWorld is n of them, each
// pair of neighbours joined by an in-memory link.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nexar/config.hpp>

#include "engine/engine.hpp"
#include "memory_link.hpp"
#include "transport/failures.hpp"
#include "transport/joiners.hpp"
#include "transport/matching.hpp"
#include "transport/peer.hpp"
#include "transport/routing.hpp"

namespace nexar::test {

/// A receive of communicator `comm` from world rank `source` into `out`, as Node::irecv
/// makes it (`check`: the fingerprint of its collective call, 0 for none), not yet posted.
inline std::shared_ptr<detail::RecvOp> recv_op(std::uint64_t comm, int source, detail::Tag tag,
                                               std::vector<std::byte>& out, bool exact = false,
                                               std::uint16_t check = 0) {
  auto r = std::make_shared<detail::RecvOp>();
  r->op = std::make_shared<detail::OpState>("recv", detail::OpState::Clock::now() + std::chrono::hours(1));
  r->comm = comm;
  r->source = source;
  r->tag = tag;
  r->buf = out.data();
  r->cap = out.size();
  r->exact = exact;
  r->check = check;
  return r;
}

struct MemoryNode : detail::PeerOwner,
                    detail::Matching::Owner,
                    detail::Routing::Owner,
                    detail::Failures::Owner {  // with Routing::Owner, the PeerTable Joiners reads
  Config cfg;
  detail::BufferPool pool;
  detail::Engine engine{std::chrono::microseconds(0)};
  int me;
  int world;
  std::vector<std::string> names;
  std::atomic<bool> open{true};     // is_open()
  std::vector<std::string> events;  // upcalls the tests look for
  detail::Matching matching{*this, me};
  detail::Routing routing;
  detail::Failures failures;
  detail::Joiners joiners;
  std::vector<std::unique_ptr<detail::Peer>> peers;  // by world rank; none for `me`

  /// World rank `rank` of `world`, under `config` (its topology decides which peers are
  /// relayed: those get `keys`, by world rank).
  MemoryNode(int rank, int n, Config config = {}, std::vector<detail::RelayKey> keys = {})
      : cfg(std::move(config)),
        me(rank),
        world(n),
        routing(*this, rank, n, false, cfg, std::move(keys), pool, engine),
        failures(*this, rank, n, cfg, engine, matching, routing),
        joiners(*this, rank, n, false, {}, engine, failures) {
    for (int r = 0; r < n; ++r) names.push_back("node-" + std::to_string(r));
    for (int r = 0; r < n; ++r) {
      peers.push_back(r == me ? nullptr
                              : std::make_unique<detail::Peer>(*this, detail::PeerContext{me, false, cfg, pool, engine, matching, routing, failures, joiners},
                                                               r, names[static_cast<std::size_t>(r)], quic::Address{}));
      if (r != me && !routing.direct(r)) routing.relay_to(*peers.back());
    }
  }

  virtual ~MemoryNode() = default;
  MemoryNode(const MemoryNode&) = delete;
  MemoryNode& operator=(const MemoryNode&) = delete;

  /// A receive as Node::irecv makes it, from world rank `source` into `out`: it takes an
  /// unexpected message if one waits, else it is posted.
  std::shared_ptr<detail::RecvOp> post_recv(detail::Domain d, std::uint64_t comm, int source, detail::Tag tag,
                                            std::vector<std::byte>& out, bool exact = false) {
    auto r = recv_op(comm, source, tag, out, exact);
    auto& q = matching.queue(d);
    if (auto it = q.find_unexpected(*r); it != q.end()) {
      matching.deliver_unexpected(d, r, it);
    } else {
      q.post(r);
    }
    return r;
  }

  /// Runs what the peers and the routing posted to the engine; returns how much ran.
  std::size_t poll() {
    const std::size_t ran = engine.io().poll();
    engine.io().restart();
    return ran;
  }

  // PeerOwner, Matching::Owner, Routing::Owner, Failures::Owner
  int size() const noexcept override { return world; }
  const std::string& name_of(int r) const override { return names.at(static_cast<std::size_t>(r)); }
  detail::RpcLanes* rpc() const noexcept override { return nullptr; }
  void fail(const std::shared_ptr<detail::OpState>& op, Errc code, int p, std::string_view why) override {
    if (op && !op->done()) op->complete(code, "rank " + std::to_string(p) + ": " + std::string(why));
  }
  detail::Peer* peer(int r) noexcept override { return peer_locked(r); }
  detail::Peer* peer_locked(int r) noexcept override {
    return r >= 0 && r < world ? peers[static_cast<std::size_t>(r)].get() : nullptr;
  }
  bool is_failed(int r) const override { return failures.is_failed(r); }
  bool judging_failures() const noexcept override { return failures.judging(); }
  bool is_open() const noexcept override { return open.load(); }
  quic::Endpoint* endpoint() noexcept override { return nullptr; }
  detail::MembershipLanes* membership() const noexcept override { return nullptr; }
  void revoke_everywhere(std::uint64_t comm, const std::string& why) override {
    events.push_back("revoke everywhere " + std::to_string(comm) + ": " + why);
  }
  void on_peer_up(detail::Peer&) override { events.push_back("up"); }
  void on_peer_closed(detail::Peer& p) override {
    events.push_back("closed " + std::to_string(p.rank()) + " " + std::to_string(static_cast<int>(p.gone_code())));
  }
  void connect_lazily(int) override { events.push_back("connect_lazily"); }
  void redial_later(int, int) override { events.push_back("redial_later"); }
  void on_ballot(int, const wire::FrameHeader&, wire::Ballot) override { events.push_back("ballot"); }
  void on_shm_offer(detail::Peer&, std::string_view) override { events.push_back("shm_offer"); }
  void on_shm_attached(int, const detail::ShmLink&) override { events.push_back("shm_attached"); }
  void on_tcp_offer(detail::Peer&, std::uint16_t, std::uint64_t) override { events.push_back("tcp_offer"); }
};

/// The key ranks `a` and `b` share: one per pair, the same at both ends.
inline detail::RelayKey relay_key(int a, int b) {
  detail::RelayKey k{};
  std::mt19937_64 g(static_cast<std::uint64_t>(std::min(a, b)) * 1000 + static_cast<std::uint64_t>(std::max(a, b)));
  for (auto& x : k) x = static_cast<std::uint8_t>(g());
  return k;
}

/// The keys rank `r` of `n` shares with every other rank, by world rank.
inline std::vector<detail::RelayKey> relay_keys_of(int r, int n) {
  std::vector<detail::RelayKey> keys(static_cast<std::size_t>(n));
  for (int o = 0; o < n; ++o)
    if (o != r) keys[static_cast<std::size_t>(o)] = relay_key(r, o);
  return keys;
}

/// `n` MemoryNodes under one Config: each pair of neighbours under its topology joined by an
/// in-memory link drawn from `seed`, the others relayed.
struct MemoryWorld {
  std::vector<std::unique_ptr<MemoryNode>> nodes;
  /// One pair of link ends per pair of neighbours (a < b): a's end, b's end.
  std::map<std::pair<int, int>, std::pair<std::unique_ptr<MemoryLink>, std::unique_ptr<MemoryLink>>> links;

  MemoryWorld(int n, std::uint64_t seed, const Config& cfg = {}, std::size_t max_piece = 1500) {
    for (int r = 0; r < n; ++r) nodes.push_back(std::make_unique<MemoryNode>(r, n, cfg, relay_keys_of(r, n)));
    for (int a = 0; a < n; ++a) {
      for (int b = a + 1; b < n; ++b) {
        if (!node(a).routing.direct(b)) continue;
        auto la = std::make_unique<MemoryLink>(seed * 131 + static_cast<std::uint64_t>(a * n + b), 1 << 20, max_piece);
        auto lb = std::make_unique<MemoryLink>(seed * 137 + static_cast<std::uint64_t>(b * n + a), 1 << 20, max_piece);
        MemoryLink::join(*la, *lb);
        la->bind(peer(a, b).use_link(*la));
        lb->bind(peer(b, a).use_link(*lb));
        links[{a, b}] = {std::move(la), std::move(lb)};
      }
    }
  }

  MemoryNode& node(int r) { return *nodes[static_cast<std::size_t>(r)]; }
  /// Rank `at`'s Peer of rank `of`.
  detail::Peer& peer(int at, int of) { return *node(at).peers[static_cast<std::size_t>(of)]; }

  /// Moves bytes on every link and runs what the nodes posted, until nothing moves (or
  /// `limit` rounds).
  void run(int limit = 100000) {
    for (int round = 0; round < limit; ++round) {
      int moved = 0;
      for (auto& [ab, l] : links) moved += MemoryLink::run(*l.first, *l.second, 64);
      for (auto& n : nodes) moved += static_cast<int>(n->poll());
      if (moved == 0) return;
    }
  }

  /// Rank `r` dies: its links are cut, and every other rank routes around it (what
  /// Node::on_peer_closed does; nobody declares it failed).
  void kill(int r) {
    for (auto& [ab, l] : links)
      if (ab.first == r || ab.second == r) l.first->cut(Errc::peer_failed, "rank " + std::to_string(r) + " died");
    for (auto& n : nodes)
      if (n->me != r) n->routing.route_around(r, true);
  }
};

}  // namespace nexar::test
