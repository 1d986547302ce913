// What a Peer is given by its node: the things that stay fixed for the node's life
// (PeerContext, held as references), and the calls it makes upward (PeerOwner). The Node
// implements PeerOwner; the unit tests (tests/memory_node.hpp) implement it with a few lines
// each, so that Peers run over in-memory links with no node, socket or TLS. Engine thread
// only, like Peer.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nexar/config.hpp>
#include <nexar/error.hpp>

#include "engine/buffer_pool.hpp"
#include "engine/op_state.hpp"
#include "wire/ballot.hpp"
#include "wire/frame.hpp"

namespace nexar::detail {

class Engine;
class Peer;
class RpcLanes;
class Matching;
class Routing;
class Failures;
class Joiners;
class ShmLink;

/// Fixed for the life of the node a Peer belongs to.
struct PeerContext {
  int rank;  // this node's world rank
  /// Whether the world may grow while it runs (its nodes then know different sizes).
  bool elastic;
  const Config& config;
  BufferPool& pool;
  Engine& engine;
  /// Where arriving messages meet receives.
  Matching& matching;
  /// Where relay frames go, and what makes a peer that is no neighbour relayed.
  Routing& routing;
  /// Failed ranks and revoked communicators: what the pair's frames and failures report to.
  Failures& failures;
  /// Joiners waiting for admission, and the welcome that admits this node if it is one.
  Joiners& joiners;
};

class PeerOwner {
 public:
  // ---- what the pair belongs to, where it changes while the node runs ----
  /// World ranks known here: the formed world, plus the nodes announced since (elastic).
  virtual int size() const noexcept = 0;
  /// The node name of world rank `r` (what its certificate names).
  virtual const std::string& name_of(int r) const = 0;
  /// Where RPC frames go; null when no RPC service is attached (it may attach after the
  /// Peers exist).
  virtual RpcLanes* rpc() const noexcept = 0;

  // ---- errors ----
  /// Fails `op` (unless done) with `code`, its message naming world rank `peer` and `why`.
  virtual void fail(const std::shared_ptr<OpState>& op, Errc code, int peer, std::string_view why) = 0;

  // ---- the pair's life ----
  /// The pair works both ways now.
  virtual void on_peer_up(Peer& p) = 0;
  /// The peer is gone (Peer::gone_code says how): receives naming it fail.
  virtual void on_peer_closed(Peer& p) = 0;
  /// A chunk waits for a connection nobody dialled yet (Config::lazy_connect).
  virtual void connect_lazily(int r) = 0;
  /// Our dial to `r` lost a simultaneous open (`attempt` times so far).
  virtual void redial_later(int r, int attempt) = 0;

  // ---- control frames the node answers ----
  /// An agree or decided frame (for the membership module).
  virtual void on_ballot(int from, const wire::FrameHeader& h, wire::Ballot b) = 0;
  /// A shm_offer frame (the segment's name and key, or empty: declined).
  virtual void on_shm_offer(Peer& p, std::string_view payload) = 0;
  /// World rank `rank`'s message lanes moved to the shared-memory `link`.
  virtual void on_shm_attached(int rank, const ShmLink& link) = 0;
  /// A tcp_offer frame: `port` 0 declines ours, else the peer's port to dial with `cipher`
  /// (cipher_code, transport/tcp_attach.hpp).
  virtual void on_tcp_offer(Peer& p, std::uint16_t port, std::uint64_t cipher) = 0;

 protected:
  ~PeerOwner() = default;
};

}  // namespace nexar::detail
