// What the parts of a node (Routing, Failures, Joiners) read of the node itself: the world's
// size, its table of Peers and whether it is still open. Each part's owner interface adds
// what only that part needs, deriving from it virtually, so that a node implementing them
// all holds one PeerTable. The Node implements it; the unit tests' nodes
// (tests/memory_node.hpp) do too.
#pragma once

namespace nexar::detail {

class Peer;

class PeerTable {
 public:
  /// World ranks known here: the formed world, plus the nodes announced since (elastic).
  virtual int size() const noexcept = 0;
  /// The Peer of world rank `r`; null for this rank, out of the table, or once the node
  /// closed. Engine lock held.
  virtual Peer* peer_locked(int r) noexcept = 0;
  /// False once the node began to close.
  virtual bool is_open() const noexcept = 0;

 protected:
  ~PeerTable() = default;
};

}  // namespace nexar::detail
