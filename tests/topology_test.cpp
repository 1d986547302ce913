// Sparse topologies (src/transport/topology.hpp): which ranks are neighbours under
// full_mesh, k_regular:K and hypercube (power-of-two worlds and others), the routes through
// live ranks (next hops always neighbours, shortest, loop-free, around ranks that are down),
// diameters and hop limits; and the public side: Topology::parse / to_string, the
// NEXAR_TOPOLOGY, NEXAR_RELAY_HOPS and NEXAR_RELAY_WINDOW_BYTES variables and the ranges
// Config::validate() enforces.
//
// Every expectation is computed here independently of the library: neighbour sets from the
// definitions in config.hpp, distances by a breadth-first search written below.
#include <nexar/config.hpp>
#include <nexar/error.hpp>

#include <gtest/gtest.h>

#include "support.hpp"
#include "transport/topology.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <functional>
#include <ostream>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace nexar {
// How gtest prints a Topology in a failed expectation.
void PrintTo(const Topology& t, std::ostream* os) { *os << t.to_string() << " (k=" << t.k << ")"; }
}  // namespace nexar

namespace {

using nexar::Config;
using nexar::Errc;
using nexar::Topology;
using nexar::detail::Routes;
using nexar::testing::contains;
using nexar::testing::expect_error;

constexpr std::uint64_t KiB = 1024, GiB = 1024ull * 1024 * 1024;

Topology k_regular(std::uint32_t k) {
  Topology t;
  t.kind = Topology::Kind::k_regular;
  t.k = k;
  return t;
}

Topology hypercube() {
  Topology t;
  t.kind = Topology::Kind::hypercube;
  return t;
}

Topology full_mesh() { return Topology{}; }

std::string describe(const Topology& t, int n) { return t.to_string() + " n=" + std::to_string(n); }

// ---- independent definitions ------------------------------------------------------------

// The neighbour set straight from the documentation of Topology::Kind.
std::set<int> expected_neighbours(const Topology& t, int n, int r) {
  std::set<int> s;
  switch (t.kind) {
    case Topology::Kind::full_mesh:
      for (int p = 0; p < n; ++p) s.insert(p);
      break;
    case Topology::Kind::k_regular:
      // r±1 .. r±k/2 (mod n); with k >= n-1 that is every other rank.
      for (int d = 1; d <= static_cast<int>(t.k / 2) && d < n; ++d) {
        s.insert((r + d) % n);
        s.insert(((r - d) % n + n) % n);
      }
      break;
    case Topology::Kind::hypercube:
      for (int bit = 1; bit < 2 * n && bit > 0; bit <<= 1)
        if ((r ^ bit) < n) s.insert(r ^ bit);
      break;
  }
  s.erase(r);
  return s;
}

// Adjacency from the expected neighbour sets.
std::vector<std::set<int>> adjacency(const Topology& t, int n) {
  std::vector<std::set<int>> adj(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) adj[static_cast<std::size_t>(r)] = expected_neighbours(t, n, r);
  return adj;
}

// Distances from `src` over the live ranks (down[r] true: r is skipped); -1 = unreachable.
// src itself gets 0.
std::vector<int> bfs(const std::vector<std::set<int>>& adj, int src, const std::vector<bool>& down) {
  const auto n = adj.size();
  std::vector<int> dist(n, -1);
  dist[static_cast<std::size_t>(src)] = 0;
  std::deque<int> q{src};
  while (!q.empty()) {
    const int at = q.front();
    q.pop_front();
    for (int nb : adj[static_cast<std::size_t>(at)]) {
      const auto i = static_cast<std::size_t>(nb);
      if (dist[i] >= 0 || (i < down.size() && down[i])) continue;
      dist[i] = dist[static_cast<std::size_t>(at)] + 1;
      q.push_back(nb);
    }
  }
  return dist;
}

std::vector<char> to_chars(const std::vector<bool>& down) {
  return std::vector<char>(down.begin(), down.end());
}

// ---- neighbours -------------------------------------------------------------------------

// neighbours_of() equals the definition, is ascending without duplicates or self, and agrees
// with neighbours(); the relation is symmetric and irreflexive.
void check_neighbours(const Topology& t, int n) {
  const std::string ctx = describe(t, n);
  for (int r = 0; r < n; ++r) {
    const auto got = nexar::detail::neighbours_of(t, n, r);
    const auto want = expected_neighbours(t, n, r);
    EXPECT_TRUE(std::is_sorted(got.begin(), got.end())) << ctx << " rank " << r;
    EXPECT_EQ(std::set<int>(got.begin(), got.end()).size(), got.size())
        << ctx << " rank " << r << ": duplicates";
    EXPECT_EQ(std::vector<int>(want.begin(), want.end()), got) << ctx << " rank " << r;
    for (int p = 0; p < n; ++p) {
      const bool nb = nexar::detail::neighbours(t, n, r, p);
      EXPECT_EQ(nb, want.count(p) == 1) << ctx << ": neighbours(" << r << ", " << p << ")";
      EXPECT_EQ(nb, nexar::detail::neighbours(t, n, p, r))
          << ctx << ": neighbours(" << r << ", " << p << ") is not symmetric";
    }
    EXPECT_FALSE(nexar::detail::neighbours(t, n, r, r)) << ctx << ": rank " << r << " its own neighbour";
  }
}

TEST(Topology, KRegularNeighboursOnARing) {
  for (std::uint32_t k : {2u, 4u, 6u}) {
    const Topology t = k_regular(k);
    check_neighbours(t, 16);
    // Exactly k neighbours each when k < n - 1, spelled out for two ranks.
    for (int r = 0; r < 16; ++r)
      EXPECT_EQ(nexar::detail::neighbours_of(t, 16, r).size(), k) << describe(t, 16) << " rank " << r;
  }
  EXPECT_EQ(nexar::detail::neighbours_of(k_regular(2), 16, 0), (std::vector<int>{1, 15}));
  EXPECT_EQ(nexar::detail::neighbours_of(k_regular(4), 16, 0), (std::vector<int>{1, 2, 14, 15}));
  EXPECT_EQ(nexar::detail::neighbours_of(k_regular(6), 16, 7), (std::vector<int>{4, 5, 6, 8, 9, 10}));
  EXPECT_EQ(nexar::detail::neighbours_of(k_regular(4), 16, 15), (std::vector<int>{0, 1, 13, 14}));
  // Odd worlds.
  check_neighbours(k_regular(2), 13);
  check_neighbours(k_regular(4), 13);
  EXPECT_EQ(nexar::detail::neighbours_of(k_regular(2), 13, 12), (std::vector<int>{0, 11}));
  EXPECT_FALSE(nexar::detail::neighbours(k_regular(2), 13, 0, 6));
  EXPECT_FALSE(nexar::detail::neighbours(k_regular(4), 16, 0, 8));
  EXPECT_FALSE(nexar::detail::neighbours(k_regular(4), 16, 0, 3));
  EXPECT_TRUE(nexar::detail::neighbours(k_regular(4), 16, 0, 14));
}

TEST(Topology, KRegularSmallWorldsAreFullMeshes) {
  // k >= n - 1: every other rank is a neighbour.
  const std::pair<std::uint32_t, int> cases[] = {{2, 2}, {2, 3}, {4, 3}, {4, 4}, {4, 5},
                                                 {6, 3}, {6, 5}, {6, 7}, {8, 5}, {100, 9}};
  for (const auto& [k, n] : cases) {
    const Topology t = k_regular(k);
    check_neighbours(t, n);
    for (int r = 0; r < n; ++r)
      EXPECT_EQ(nexar::detail::neighbours_of(t, n, r).size(), static_cast<std::size_t>(n - 1))
          << describe(t, n) << " rank " << r;
    EXPECT_EQ(nexar::detail::diameter(t, n), 1) << describe(t, n);
  }
  // Just above: k = 2 at n = 4 is a ring, 0 and 2 are not neighbours.
  check_neighbours(k_regular(2), 4);
  EXPECT_FALSE(nexar::detail::neighbours(k_regular(2), 4, 0, 2));
  EXPECT_EQ(nexar::detail::diameter(k_regular(2), 4), 2);
  // One rank: nobody.
  EXPECT_TRUE(nexar::detail::neighbours_of(k_regular(4), 1, 0).empty());
  EXPECT_EQ(nexar::detail::diameter(k_regular(4), 1), 0);
}

TEST(Topology, HypercubeNeighbours) {
  for (int n : {1, 2, 3, 5, 8, 12, 13, 16, 17}) check_neighbours(hypercube(), n);
  EXPECT_EQ(nexar::detail::neighbours_of(hypercube(), 16, 0), (std::vector<int>{1, 2, 4, 8}));
  EXPECT_EQ(nexar::detail::neighbours_of(hypercube(), 16, 5), (std::vector<int>{1, 4, 7, 13}));
  for (int r = 0; r < 16; ++r) EXPECT_EQ(nexar::detail::neighbours_of(hypercube(), 16, r).size(), 4u);
  // Not a power of two: partners beyond the world are missing.
  EXPECT_EQ(nexar::detail::neighbours_of(hypercube(), 12, 3), (std::vector<int>{1, 2, 7, 11}));
  EXPECT_EQ(nexar::detail::neighbours_of(hypercube(), 12, 7), (std::vector<int>{3, 5, 6}));
  EXPECT_EQ(nexar::detail::neighbours_of(hypercube(), 13, 12), (std::vector<int>{4, 8}));
  EXPECT_EQ(nexar::detail::neighbours_of(hypercube(), 13, 4), (std::vector<int>{0, 5, 6, 12}));
  EXPECT_TRUE(nexar::detail::neighbours_of(hypercube(), 1, 0).empty());
}

TEST(Topology, FullMeshNeighbours) {
  for (int n : {1, 2, 3, 7, 16}) check_neighbours(full_mesh(), n);
  EXPECT_EQ(nexar::detail::diameter(full_mesh(), 1), 0);
  EXPECT_EQ(nexar::detail::diameter(full_mesh(), 2), 1);
  EXPECT_EQ(nexar::detail::diameter(full_mesh(), 16), 1);
}

// ---- routes -----------------------------------------------------------------------------

struct Case {
  Topology t;
  int n;
};

std::vector<Case> route_cases() {
  return {{full_mesh(), 7},    {k_regular(2), 16}, {k_regular(4), 16}, {k_regular(6), 16},
          {k_regular(2), 13},  {k_regular(4), 13}, {k_regular(2), 4},  {k_regular(4), 5},
          {hypercube(), 16},   {hypercube(), 12},  {hypercube(), 13},  {hypercube(), 5},
          {hypercube(), 2},    {k_regular(2), 2},  {full_mesh(), 1},   {hypercube(), 1}};
}

// Against the BFS over live ranks (down as given; every rank's Routes sees the same set):
// hops equal the distance, next() is a neighbour of self one step nearer, and following
// next() from any live source reaches dest in exactly hops(dest) steps relayed by live ranks
// only. A rank that is down is never a relay but is still a destination: reached through a
// live rank next to it (or directly, from a neighbour), one hop beyond the nearest such rank.
// Unreachable ranks and self give -1.
void check_routes(const Topology& t, int n, const std::vector<bool>& down, const std::string& ctx) {
  const auto adj = adjacency(t, n);
  const auto down_c = to_chars(down);
  auto is_down = [&](int r) { return static_cast<std::size_t>(r) < down.size() && down[static_cast<std::size_t>(r)]; };
  std::vector<std::optional<Routes>> routes(static_cast<std::size_t>(n));
  auto routes_of = [&](int r) -> const Routes& {
    auto& slot = routes[static_cast<std::size_t>(r)];
    if (!slot) slot.emplace(t, n, r, down_c);
    return *slot;
  };
  for (int self = 0; self < n; ++self) {
    if (is_down(self)) continue;
    const Routes& rt = routes_of(self);
    const auto dist = bfs(adj, self, down);
    EXPECT_EQ(rt.next(self), -1) << ctx << ": next(self) from " << self;
    EXPECT_EQ(rt.hops(self), -1) << ctx << ": hops(self) from " << self;
    EXPECT_EQ(rt.next(-1), -1) << ctx;
    EXPECT_EQ(rt.next(n), -1) << ctx;
    EXPECT_EQ(rt.hops(n), -1) << ctx;
    for (int dest = 0; dest < n; ++dest) {
      if (dest == self) continue;
      const std::string where = ctx + ": " + std::to_string(self) + " -> " + std::to_string(dest);
      int want = dist[static_cast<std::size_t>(dest)];
      if (is_down(dest)) {  // one hop beyond its nearest reachable live neighbour
        want = -1;
        for (int nb : adj[static_cast<std::size_t>(dest)]) {
          const int d = dist[static_cast<std::size_t>(nb)];
          if (d >= 0 && (want < 0 || d + 1 < want)) want = d + 1;
        }
      }
      ASSERT_EQ(rt.hops(dest), want) << where;
      const int next = rt.next(dest);
      if (want < 0) {
        EXPECT_EQ(next, -1) << where << " is unreachable, yet next() is " << next;
        continue;
      }
      ASSERT_GE(next, 0) << where;
      EXPECT_TRUE(adj[static_cast<std::size_t>(self)].count(next)) << where << ": next hop " << next
                                                                   << " is not a neighbour";
      EXPECT_TRUE(nexar::detail::neighbours(t, n, self, next)) << where << ": next hop " << next;
      if (next != dest) {
        EXPECT_FALSE(is_down(next)) << where << ": next hop " << next << " is down but not the destination";
      }
      if (want == 1) {
        EXPECT_EQ(next, dest) << where << ": a neighbour is reached directly";
      }
      // Walk the route hop by hop, each rank using its own table.
      int at = self, steps = 0;
      std::vector<int> path{self};
      while (at != dest && steps <= n) {
        const int nx = routes_of(at).next(dest);
        ASSERT_GE(nx, 0) << where << ": route breaks at " << at;
        ASSERT_TRUE(nexar::detail::neighbours(t, n, at, nx)) << where << ": hop " << at << " -> " << nx;
        if (nx != dest) {
          ASSERT_FALSE(is_down(nx)) << where << ": route relays through down rank " << nx;
          EXPECT_EQ(routes_of(nx).hops(dest), routes_of(at).hops(dest) - 1)
              << where << ": hop " << at << " -> " << nx << " is not one step nearer";
        }
        at = nx;
        path.push_back(at);
        ++steps;
      }
      std::string p;
      for (int x : path) p += std::to_string(x) + " ";
      EXPECT_EQ(steps, want) << where << ": path " << p;
    }
  }
}

TEST(Topology, RoutesAreShortestAndLoopFree) {
  for (const auto& c : route_cases()) check_routes(c.t, c.n, {}, describe(c.t, c.n));
}

TEST(Topology, DiameterIsTheLongestShortestPath) {
  for (const auto& c : route_cases()) {
    const auto adj = adjacency(c.t, c.n);
    int longest = 0;
    for (int a = 0; a < c.n; ++a)
      for (int d : bfs(adj, a, {})) longest = std::max(longest, d);
    int by_routes = 0;
    for (int a = 0; a < c.n; ++a) {
      const Routes rt(c.t, c.n, a, {});
      for (int b = 0; b < c.n; ++b) by_routes = std::max(by_routes, rt.hops(b));
    }
    EXPECT_EQ(nexar::detail::diameter(c.t, c.n), longest) << describe(c.t, c.n);
    EXPECT_EQ(by_routes, longest) << describe(c.t, c.n);
  }
  // A few figures spelled out.
  EXPECT_EQ(nexar::detail::diameter(k_regular(2), 16), 8);
  EXPECT_EQ(nexar::detail::diameter(k_regular(4), 16), 4);
  EXPECT_EQ(nexar::detail::diameter(k_regular(6), 16), 3);
  EXPECT_EQ(nexar::detail::diameter(k_regular(2), 13), 6);
  EXPECT_EQ(nexar::detail::diameter(hypercube(), 16), 4);
  EXPECT_EQ(nexar::detail::diameter(hypercube(), 12), 4);  // 7 = 0111 to 8 = 1000
  EXPECT_EQ(nexar::detail::diameter(hypercube(), 13), 4);
  // More sizes, without spelling them out.
  for (int n = 1; n <= 40; ++n)
    for (const Topology& t : {k_regular(2), k_regular(4), k_regular(6), hypercube(), full_mesh()}) {
      const auto adj = adjacency(t, n);
      int longest = 0;
      for (int a = 0; a < n; ++a)
        for (int d : bfs(adj, a, {})) longest = std::max(longest, d);
      EXPECT_EQ(nexar::detail::diameter(t, n), longest) << describe(t, n);
    }
}

TEST(Topology, HopLimit) {
  EXPECT_EQ(nexar::detail::hop_limit(k_regular(2), 16, 0), 8 + 4);
  EXPECT_EQ(nexar::detail::hop_limit(k_regular(4), 16, 0), 4 + 4);
  EXPECT_EQ(nexar::detail::hop_limit(hypercube(), 16, 0), 4 + 4);
  EXPECT_EQ(nexar::detail::hop_limit(full_mesh(), 16, 0), 1 + 4);
  EXPECT_EQ(nexar::detail::hop_limit(k_regular(2), 16, 2), 2);
  EXPECT_EQ(nexar::detail::hop_limit(hypercube(), 16, 255), 255);
  EXPECT_EQ(nexar::detail::hop_limit(full_mesh(), 1, 1), 1);
  // Automatic stays within the 1 .. 255 a relay accepts, even for a huge ring.
  EXPECT_EQ(nexar::detail::hop_limit(k_regular(2), 1000, 0), 255);
  EXPECT_GE(nexar::detail::hop_limit(full_mesh(), 1, 0), 1);
}

TEST(Topology, RoutesAvoidRanksThatAreDown) {
  auto down_set = [](int n, std::initializer_list<int> ranks) {
    std::vector<bool> d(static_cast<std::size_t>(n), false);
    for (int r : ranks) d[static_cast<std::size_t>(r)] = true;
    return d;
  };
  // Detours still exist.
  check_routes(k_regular(4), 16, down_set(16, {1, 2}), "k_regular:4 n=16 down {1,2}");
  check_routes(k_regular(4), 16, down_set(16, {4, 12}), "k_regular:4 n=16 down {4,12}");
  check_routes(hypercube(), 16, down_set(16, {1, 2}), "hypercube n=16 down {1,2}");
  check_routes(hypercube(), 12, down_set(12, {3, 5}), "hypercube n=12 down {3,5}");
  check_routes(k_regular(2), 13, down_set(13, {6}), "k_regular:2 n=13 down {6}");
  check_routes(full_mesh(), 6, down_set(6, {0, 5}), "full_mesh n=6 down {0,5}");
  // Partitions: some ranks unreachable.
  check_routes(k_regular(2), 16, down_set(16, {3, 11}), "k_regular:2 n=16 down {3,11}");
  check_routes(hypercube(), 8, down_set(8, {1, 2, 4}), "hypercube n=8 down {1,2,4}");
  check_routes(k_regular(4), 16, down_set(16, {5, 6, 13, 14}), "k_regular:4 n=16 down {5,6,13,14}");
  // A `down` vector shorter than the world: the rest are up.
  check_routes(k_regular(2), 16, {false, true}, "k_regular:2 n=16 down {1} (short vector)");

  // Spelled out: the ring of 16 with 3 and 11 down splits into 4..10 and 12..2; 3 and 11
  // themselves are still reached, from 2 and 12.
  const std::vector<char> down(16, 0);
  auto d = down;
  d[3] = d[11] = 1;
  const Routes from0(k_regular(2), 16, 0, d);
  EXPECT_EQ(from0.next(5), -1);
  EXPECT_EQ(from0.hops(5), -1);
  EXPECT_EQ(from0.next(4), -1);
  EXPECT_EQ(from0.hops(4), -1);
  EXPECT_EQ(from0.next(3), 1);
  EXPECT_EQ(from0.hops(3), 3);
  EXPECT_EQ(from0.next(11), 15);
  EXPECT_EQ(from0.hops(11), 5);
  EXPECT_EQ(from0.next(2), 1);
  EXPECT_EQ(from0.hops(2), 2);
  EXPECT_EQ(from0.next(12), 15);
  EXPECT_EQ(from0.hops(12), 4);
  // Without failures 0 -> 2 goes through 1; with 1 down on k_regular:2 it goes the long way.
  auto d1 = down;
  d1[1] = 1;
  const Routes around(k_regular(2), 16, 0, d1);
  EXPECT_EQ(around.next(2), 15);
  EXPECT_EQ(around.hops(2), 14);
  EXPECT_EQ(around.next(1), 1);  // down, but a neighbour: still reached directly
  EXPECT_EQ(around.hops(1), 1);
  // Every neighbour of 0 down in a hypercube: only they are reachable (directly), nothing
  // beyond them.
  std::vector<char> iso(8, 0);
  iso[1] = iso[2] = iso[4] = 1;
  const Routes alone(hypercube(), 8, 0, iso);
  for (int r : {1, 2, 4}) {
    EXPECT_EQ(alone.next(r), r) << r;
    EXPECT_EQ(alone.hops(r), 1) << r;
  }
  for (int r : {3, 5, 6, 7}) {
    EXPECT_EQ(alone.next(r), -1) << r;
    EXPECT_EQ(alone.hops(r), -1) << r;
  }
}

// ---- parse, to_string -------------------------------------------------------------------

TEST(Topology, ParseAcceptsTheDocumentedForms) {
  EXPECT_EQ(Topology::parse("full_mesh"), full_mesh());
  EXPECT_EQ(Topology::parse("hypercube"), hypercube());
  EXPECT_EQ(Topology::parse("k_regular:4"), k_regular(4));
  EXPECT_EQ(Topology::parse("k_regular:2"), k_regular(2));
  EXPECT_EQ(Topology::parse("k_regular:100"), k_regular(100));
  // Case-insensitive.
  EXPECT_EQ(Topology::parse("FULL_MESH"), full_mesh());
  EXPECT_EQ(Topology::parse("HyperCube"), hypercube());
  EXPECT_EQ(Topology::parse("K_Regular:6"), k_regular(6));
  EXPECT_EQ(Topology::parse("K_REGULAR:8"), k_regular(8));
  const Topology t = Topology::parse("k_regular:4");
  EXPECT_EQ(t.kind, Topology::Kind::k_regular);
  EXPECT_EQ(t.k, 4u);
  EXPECT_EQ(Topology::parse("hypercube").k, 0u);
  EXPECT_EQ(Topology{}.kind, Topology::Kind::full_mesh);
}

TEST(Topology, ParseRejectsMalformedText) {
  for (const char* bad : {"k_regular:3", "k_regular:1", "k_regular:0", "k_regular:x",
                          "k_regular:", "k_regular", "k_regular:-2", "k_regular:+4",
                          "k_regular:4x", "k_regular: 4", "k_regular:4 ", "k_regular:4.0",
                          "k_regular:99999999999999999999999", "ring", "", "mesh", "full",
                          "hypercube:4", "full_mesh:2", " hypercube", "hyper_cube"}) {
    const std::string what = expect_error(Errc::invalid_argument, [&] { (void)Topology::parse(bad); });
    EXPECT_TRUE(contains(what, std::string("'") + bad + "'"))
        << "'" << bad << "': the message should quote the text: " << what;
  }
  // The reason is given.
  const std::string odd = expect_error(Errc::invalid_argument, [] { (void)Topology::parse("k_regular:3"); });
  EXPECT_TRUE(contains(odd, "even")) << odd;
  const std::string ring = expect_error(Errc::invalid_argument, [] { (void)Topology::parse("ring"); });
  EXPECT_TRUE(contains(ring, "full_mesh") && contains(ring, "hypercube") && contains(ring, "k_regular"))
      << "should list the accepted forms: " << ring;
}

TEST(Topology, ToStringRoundTrips) {
  EXPECT_EQ(full_mesh().to_string(), "full_mesh");
  EXPECT_EQ(hypercube().to_string(), "hypercube");
  EXPECT_EQ(k_regular(4).to_string(), "k_regular:4");
  for (const Topology& t : {full_mesh(), hypercube(), k_regular(2), k_regular(4), k_regular(6),
                            k_regular(1000), k_regular(65536)})
    EXPECT_EQ(Topology::parse(t.to_string()), t) << t.to_string();
  for (const char* s : {"full_mesh", "hypercube", "k_regular:2", "k_regular:16"})
    EXPECT_EQ(Topology::parse(s).to_string(), s);
  EXPECT_EQ(Topology::parse("HYPERCUBE").to_string(), "hypercube");
  EXPECT_EQ(Topology::parse("K_REGULAR:4").to_string(), "k_regular:4");
  EXPECT_NE(k_regular(4), k_regular(6));
  EXPECT_NE(k_regular(4), hypercube());
}

// ---- Config: environment and ranges -----------------------------------------------------

// Clears the variables of these tests for its scope (restoring them afterwards), so a
// developer's environment cannot change the outcome.
class RelayEnv : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : kVars) {
      if (const char* old = std::getenv(v)) saved_.emplace_back(v, old);
      ::unsetenv(v);
    }
  }
  void TearDown() override {
    for (const char* v : kVars) ::unsetenv(v);
    for (const auto& [k, v] : saved_) ::setenv(k.c_str(), v.c_str(), 1);
  }
  static constexpr const char* kVars[] = {"NEXAR_TOPOLOGY", "NEXAR_RELAY_HOPS", "NEXAR_RELAY_WINDOW_BYTES",
                                          "NEXAR_LAZY_CONNECT"};
  std::vector<std::pair<std::string, std::string>> saved_;
};

TEST_F(RelayEnv, Defaults) {
  const Config c;
  EXPECT_EQ(c.topology, full_mesh());
  EXPECT_EQ(c.relay_hop_limit, 0u);
  EXPECT_EQ(c.relay_window, 4ull * 1024 * 1024);
  const Config e = Config::from_env();
  EXPECT_EQ(e.topology, c.topology);
  EXPECT_EQ(e.relay_hop_limit, c.relay_hop_limit);
  EXPECT_EQ(e.relay_window, c.relay_window);
  EXPECT_NO_THROW(c.validate());
  EXPECT_TRUE(contains(c.describe(), "topology = full_mesh")) << c.describe();
  EXPECT_FALSE(c.lazy_connect);
  EXPECT_FALSE(e.lazy_connect);
  EXPECT_TRUE(contains(c.describe(), "lazy_connect = off")) << c.describe();
}

// Config::lazy_connect: from NEXAR_LAZY_CONNECT, and only with a full mesh.
TEST_F(RelayEnv, LazyConnect) {
  {
    nexar::testing::ScopedEnv l("NEXAR_LAZY_CONNECT", "1");
    const Config c = Config::from_env();
    EXPECT_TRUE(c.lazy_connect);
    EXPECT_TRUE(contains(c.describe(), "lazy_connect = on")) << c.describe();
  }
  {
    nexar::testing::ScopedEnv l("NEXAR_LAZY_CONNECT", "0");
    EXPECT_FALSE(Config::from_env().lazy_connect);
  }
  {
    nexar::testing::ScopedEnv l("NEXAR_LAZY_CONNECT", "maybe");
    const std::string what = expect_error(Errc::invalid_argument, [] { (void)Config::from_env(); });
    EXPECT_TRUE(contains(what, "NEXAR_LAZY_CONNECT")) << what;
  }
  {
    // A sparse topology connects its neighbours at start, to relay through them.
    nexar::testing::ScopedEnv l("NEXAR_LAZY_CONNECT", "1");
    nexar::testing::ScopedEnv t("NEXAR_TOPOLOGY", "hypercube");
    const std::string what = expect_error(Errc::invalid_argument, [] { (void)Config::from_env(); });
    EXPECT_TRUE(contains(what, "Config::lazy_connect")) << what;
    EXPECT_TRUE(contains(what, "hypercube")) << what;
  }
  Config c;
  c.lazy_connect = true;
  EXPECT_NO_THROW(c.validate());
  c.topology = k_regular(4);
  const std::string what = expect_error(Errc::invalid_argument, [&] { c.validate(); });
  EXPECT_TRUE(contains(what, "k_regular:4")) << what;
}

TEST_F(RelayEnv, FromEnvironment) {
  {
    nexar::testing::ScopedEnv t("NEXAR_TOPOLOGY", "k_regular:4");
    EXPECT_EQ(Config::from_env().topology, k_regular(4));
  }
  EXPECT_EQ(Config::from_env().topology, full_mesh()) << "NEXAR_TOPOLOGY was restored";
  {
    nexar::testing::ScopedEnv t("NEXAR_TOPOLOGY", "Hypercube");
    EXPECT_EQ(Config::from_env().topology, hypercube());
  }
  {
    nexar::testing::ScopedEnv t("NEXAR_TOPOLOGY", "full_mesh");
    EXPECT_EQ(Config::from_env().topology, full_mesh());
  }
  {
    nexar::testing::ScopedEnv t("NEXAR_TOPOLOGY", "k_regular:6");
    nexar::testing::ScopedEnv h("NEXAR_RELAY_HOPS", "7");
    nexar::testing::ScopedEnv w("NEXAR_RELAY_WINDOW_BYTES", "1M");
    const Config c = Config::from_env();
    EXPECT_EQ(c.topology, k_regular(6));
    EXPECT_EQ(c.relay_hop_limit, 7u);
    EXPECT_EQ(c.relay_window, 1024u * 1024);
    EXPECT_TRUE(contains(c.describe(), "topology = k_regular:6")) << c.describe();
  }
  for (const char* hops : {"0", "1", "255"}) {
    nexar::testing::ScopedEnv h("NEXAR_RELAY_HOPS", hops);
    EXPECT_EQ(Config::from_env().relay_hop_limit, static_cast<std::uint32_t>(std::stoul(hops)));
  }
  for (const char* w : {"64K", "1G", "65536"}) {
    nexar::testing::ScopedEnv e("NEXAR_RELAY_WINDOW_BYTES", w);
    EXPECT_NO_THROW((void)Config::from_env()) << w;
  }
}

TEST_F(RelayEnv, MalformedOrOutOfRangeEnvironment) {
  auto expect_bad = [](const char* var, const char* value) {
    nexar::testing::ScopedEnv e(var, value);
    const std::string what = expect_error(Errc::invalid_argument, [] { (void)Config::from_env(); });
    EXPECT_TRUE(contains(what, var)) << var << "='" << value << "': " << what;
  };
  for (const char* v : {"ring", "k_regular:3", "k_regular:0", "k_regular:x", "", "hypercube:2"})
    expect_bad("NEXAR_TOPOLOGY", v);
  for (const char* v : {"256", "1000", "-1", "x", "2.5"}) expect_bad("NEXAR_RELAY_HOPS", v);
  for (const char* v : {"32K", "65535", "2G", "1T", "x"}) expect_bad("NEXAR_RELAY_WINDOW_BYTES", v);
  // The text of a bad topology is quoted.
  nexar::testing::ScopedEnv e("NEXAR_TOPOLOGY", "ring");
  const std::string what = expect_error(Errc::invalid_argument, [] { (void)Config::from_env(); });
  EXPECT_TRUE(contains(what, "'ring'")) << what;
}

TEST_F(RelayEnv, ValidateRanges) {
  struct Bad {
    const char* setting;
    std::function<void(Config&)> mutate;
  };
  const std::vector<Bad> bad = {
      {"relay_hop_limit", [](Config& c) { c.relay_hop_limit = 256; }},
      {"relay_hop_limit", [](Config& c) { c.relay_hop_limit = 100000; }},
      {"relay_window", [](Config& c) { c.relay_window = 64 * KiB - 1; }},
      {"relay_window", [](Config& c) { c.relay_window = 0; }},
      {"relay_window", [](Config& c) { c.relay_window = GiB + 1; }},
      {"topology", [](Config& c) { c.topology = k_regular(3); }},
      {"topology", [](Config& c) { c.topology = k_regular(0); }},
      {"topology", [](Config& c) { c.topology = k_regular(1); }},
  };
  for (const auto& b : bad) {
    Config c;
    b.mutate(c);
    const std::string what = expect_error(Errc::invalid_argument, [&] { c.validate(); });
    EXPECT_TRUE(contains(what, std::string("Config::") + b.setting)) << b.setting << ": " << what;
  }
  // A k with another kind is refused too.
  Config h;
  h.topology = hypercube();
  h.topology.k = 4;
  expect_error(Errc::invalid_argument, [&] { h.validate(); });

  // The exact message of the hop limit.
  Config c;
  c.relay_hop_limit = 256;
  EXPECT_EQ(expect_error(Errc::invalid_argument, [&] { c.validate(); }),
            "Config::relay_hop_limit = 256 (NEXAR_RELAY_HOPS) is out of range: allowed 0 "
            "(automatic) or 1 .. 255");

  // Boundaries accepted.
  for (std::uint32_t hops : {0u, 1u, 255u}) {
    Config ok;
    ok.relay_hop_limit = hops;
    EXPECT_NO_THROW(ok.validate()) << hops;
  }
  for (std::uint64_t w : {64 * KiB, GiB}) {
    Config ok;
    ok.relay_window = w;
    EXPECT_NO_THROW(ok.validate()) << w;
  }
  for (const Topology& t : {k_regular(2), k_regular(65536), hypercube(), full_mesh()}) {
    Config ok;
    ok.topology = t;
    EXPECT_NO_THROW(ok.validate()) << t.to_string();
  }
}

}  // namespace
