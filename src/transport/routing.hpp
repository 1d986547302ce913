// Which ranks a node reaches by a connection of its own and how it reaches the others:
// the neighbours of Config::topology, the routes through live ranks, and the relay frames
// that carry a relayed peer's lanes hop by hop (docs/ARCHITECTURE.md, "Sparse topologies";
// byte layout in docs/PROTOCOL.md, "Relay").
//
// A relayed peer's lanes are one RelayLink each end (transport/relay_link.hpp); Routing
// cuts what the link's credit allows into relay frames toward the next hop, forwards the
// frames that pass through this rank, checks and hands over those that end here, and
// acknowledges them. When a rank goes down, routes avoid it and what was in flight on a
// changed route is sent again. Every relayed frame carries a MAC under the key its two end
// ranks share (RelayKey), so a rank on the way cannot forge or alter another's bytes.
//
// It reaches its node through Routing::Owner (its peer table, transport/peer_table.hpp, and
// two calls more), and each pair through its Peer. Engine thread only, except where a member
// says "any thread".
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nexar/config.hpp>

#include "engine/buffer_pool.hpp"
#include "transport/peer_table.hpp"
#include "transport/topology.hpp"
#include "wire/frame.hpp"

namespace nexar::detail {

class Engine;
class Peer;

/// A secret shared by one pair of ranks and by nobody else: it authenticates the frames
/// they relay to each other (docs/SECURITY.md, "Relays"). Issued by the seed.
using RelayKey = std::array<std::uint8_t, 32>;

class Routing {
 public:
  /// What Routing asks of its node, besides its peer table.
  class Owner : public virtual PeerTable {
   public:
    /// Whether world rank `r` was declared failed: its frames are not taken any more.
    virtual bool is_failed(int r) const = 0;
    /// Whether a rank cut off by the ranks that went down counts against it now (the mesh
    /// is up and the node is not closing).
    virtual bool judging_failures() const noexcept = 0;

   protected:
    ~Owner() = default;
  };

  /// This node is world rank `rank` of a world formed with `world` ranks; `keys` holds the
  /// key it shares with each rank (by world rank; those of neighbours unused). `cfg` gives
  /// the topology, the hop limit and the relay window, and outlives this.
  Routing(Owner& owner, int rank, int world, bool elastic, const Config& cfg, std::vector<RelayKey> keys,
          BufferPool& pool, Engine& engine);
  Routing(const Routing&) = delete;
  Routing& operator=(const Routing&) = delete;

  // ---- who is a neighbour, and how far the others are ----
  /// Whether world rank `r` is our neighbour (has a connection of its own). Any thread.
  bool direct(int r) const noexcept;
  /// Direct neighbours, ascending (for tools' headers). Any thread.
  std::vector<int> direct_peers() const;
  /// Whether `r` can be reached now: a neighbour, or a relayed peer with a route of live
  /// ranks within the hop limit (nothing sent to any other rank arrives, and nothing is
  /// waited for from it).
  bool routable(int r) const noexcept;
  /// Why `dest` cannot be reached within the hop limit when every rank is up (for an
  /// operation's error), or empty. Any thread.
  std::string beyond_hop_limit(int dest) const;

  // ---- the peers it relays to ----
  /// Makes `p` (no neighbour) relayed: its lanes travel through relays from now on, and it
  /// counts as up. Throws Errc::invalid_argument when no key was issued for it.
  void relay_to(Peer& p);
  /// Elastic: world rank `id` (the next one) was announced with `key`. Before the world
  /// grows, so that relay_to can make its peer relayed.
  void add_rank(int id, const RelayKey& key);
  /// Elastic: the world grew to `world` ranks. Routes cover it, and frames kept for a rank
  /// that was unknown (park_unknown) are taken again.
  void grown(int world);

  // ---- frames from the neighbours (Peer hands them over whole) ----
  /// A relay frame `h` arrived from neighbour `from` on `lane` (`seg`: header and payload):
  /// delivered here or forwarded. False: `from` broke the protocol (and is gone).
  bool on_relay(Peer& from, wire::Lane lane, const wire::FrameHeader& h, PooledBuffer seg);
  /// A relay_ack frame arrived from neighbour `from` (`seg`, whole): taken here or forwarded.
  bool on_relay_ack(Peer& from, const wire::FrameHeader& h, PooledBuffer seg);

  // ---- ranks going down, and bytes that stall ----
  /// World rank `r` went down (failed, or its connection ended): routes avoid it from now
  /// on, and relayed lanes whose first hop changed (every one, when `failed`: a relay in
  /// the middle may have held their bytes) send their unacknowledged bytes again. A
  /// relayed peer no route reaches any more is failed (cut off by a failure) or lost.
  void route_around(int r, bool failed);
  /// Sends again what relayed peers have had in flight for `rto` ns without an
  /// acknowledgement moving: bytes a relay lost by dying before it knew of an earlier
  /// failure, after the origin had already rerouted (the destination drops duplicates).
  void resend_stalled(std::uint64_t now, std::uint64_t rto);

 private:
  /// Sends what the credit allows of relayed peer `dest`'s `lane` toward it.
  void pump(Peer& dest, wire::Lane lane);
  /// Relayed peer `origin` is owed an acknowledgement of `lane`: it goes out once the
  /// current batch of work is done, one for all the segments that batch took.
  void owe_ack(int origin, wire::Lane lane);
  void send_acks();
  /// Passes a relay or relay_ack frame (`seg`, whole) from neighbour `from` on toward its
  /// destination, on `lane`, one hop more.
  void forward(Peer& from, wire::Lane lane, const wire::FrameHeader& h, PooledBuffer seg);
  /// Sends relayed peer `p`'s unacknowledged bytes again, from the first, on every lane.
  void resend(Peer& p);
  /// Keeps a relayed frame naming a rank not announced here yet (elastic); true if kept.
  bool park_unknown(Peer& from, wire::Lane lane, const wire::FrameHeader& h, PooledBuffer& seg);
  /// The key shared with relayed peer `r`; its presence is checked by relay_to.
  const RelayKey& key_of(int r) const { return keys_[static_cast<std::size_t>(r)]; }
  /// The world size that decides whether ranks `a` and `b` are neighbours: the formed
  /// world's, or for a rank added later, the world it made.
  int link_world(int a, int b) const noexcept { return std::max(formed_, std::max(a, b) + 1); }

  struct Parked {
    int from;
    wire::Lane lane;
    wire::FrameHeader h;
    PooledBuffer seg;
  };

  Owner& owner_;
  const int rank_;
  const bool elastic_;
  const Config& cfg_;
  BufferPool& pool_;
  Engine& engine_;
  const int formed_;              // world size at formation
  std::vector<RelayKey> keys_;    // by world rank; grown by add_rank (elastic)
  std::vector<char> down_;        // ranks routes avoid
  Routes routes_;                 // around the ranks down
  const Routes plain_routes_;     // nobody down; read by any thread
  const int hop_limit_;
  std::vector<std::pair<int, wire::Lane>> acks_owed_;
  bool acks_posted_ = false;
  std::vector<Parked> parked_;
};

}  // namespace nexar::detail
