// Which ranks are neighbours under a Config::Topology, and how a message reaches a rank
// that is not: the next hop on a shortest path through live ranks.
//
// Routes are shortest paths (breadth-first from this rank over the topology's edges,
// ranks taken in ascending order), so along any route every hop is one step nearer the
// destination: while all ranks agree on which ranks are down, relaying never loops. While
// they disagree (news of a failure still spreading) a message could be sent back and
// forth; the hop limit ends that.
#pragma once

#include <nexar/config.hpp>

#include <cstdint>
#include <vector>

namespace nexar::detail {

/// Whether world ranks `a` and `b` (a != b, both below `n`) are neighbours under `t`.
bool neighbours(const Topology& t, int n, int a, int b);

/// The neighbours of rank `r` in a world of `n`, ascending.
std::vector<int> neighbours_of(const Topology& t, int n, int r);

/// The longest shortest path between two ranks of a world of `n` (1 for a full mesh of 2
/// or more, 0 for one rank).
int diameter(const Topology& t, int n);

/// The hop limit in force: `configured`, or (0) the diameter plus 4.
int hop_limit(const Topology& t, int n, std::uint32_t configured);

/// The next hop from `self` to every rank of a world of `n`, relaying through no rank
/// marked in `down` (indexed by world rank; shorter than `n` means the rest are up). A
/// rank that is down is still routed to, when a neighbour of a live rank on the way.
class Routes {
 public:
  Routes() = default;
  Routes(const Topology& t, int n, int self, const std::vector<char>& down);

  /// The neighbour to hand a message for `dest` to: `dest` itself when it is a neighbour,
  /// -1 when no path of live ranks leads there (or dest is self).
  int next(int dest) const {
    return dest >= 0 && static_cast<std::size_t>(dest) < next_.size() ? next_[static_cast<std::size_t>(dest)] : -1;
  }
  /// Hops from self to `dest` on the route (1 for a neighbour), -1 when unreachable.
  int hops(int dest) const {
    return dest >= 0 && static_cast<std::size_t>(dest) < hops_.size() ? hops_[static_cast<std::size_t>(dest)] : -1;
  }

 private:
  std::vector<int> next_;
  std::vector<int> hops_;
};

}  // namespace nexar::detail
