#include "transport/topology.hpp"

#include <algorithm>
#include <deque>

namespace nexar::detail {

namespace {
// Distance around a ring of n between a and b.
int ring_distance(int n, int a, int b) {
  const int d = a > b ? a - b : b - a;
  return std::min(d, n - d);
}
}  // namespace

bool neighbours(const Topology& t, int n, int a, int b) {
  if (a == b || a < 0 || b < 0 || a >= n || b >= n) return false;
  switch (t.kind) {
    case Topology::Kind::full_mesh: return true;
    case Topology::Kind::k_regular: return ring_distance(n, a, b) <= static_cast<int>(t.k / 2);
    case Topology::Kind::hypercube: {
      const unsigned x = static_cast<unsigned>(a ^ b);
      return (x & (x - 1)) == 0;  // exactly one bit differs
    }
  }
  return false;
}

std::vector<int> neighbours_of(const Topology& t, int n, int r) {
  std::vector<int> out;
  if (t.kind == Topology::Kind::hypercube) {
    for (int bit = 1; bit > 0 && bit < 2 * n; bit <<= 1)
      if ((r ^ bit) < n) out.push_back(r ^ bit);
    std::sort(out.begin(), out.end());
    return out;
  }
  if (t.kind == Topology::Kind::k_regular && static_cast<std::uint64_t>(t.k) < static_cast<std::uint64_t>(n - 1)) {
    for (int d = 1; d <= static_cast<int>(t.k / 2); ++d) {
      out.push_back((r + d) % n);
      out.push_back((r - d + n) % n);
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    std::erase(out, r);
    return out;
  }
  for (int p = 0; p < n; ++p)
    if (p != r) out.push_back(p);
  return out;
}

int diameter(const Topology& t, int n) {
  if (n <= 1) return 0;
  switch (t.kind) {
    case Topology::Kind::full_mesh: return 1;
    case Topology::Kind::k_regular: {
      const int half = static_cast<int>(t.k / 2);
      return (n / 2 + half - 1) / half;
    }
    case Topology::Kind::hypercube: {
      int bits = 0;
      while ((1 << bits) < n) ++bits;
      return bits;
    }
  }
  return n - 1;
}

int hop_limit(const Topology& t, int n, std::uint32_t configured) {
  if (configured != 0) return static_cast<int>(configured);
  return std::min(diameter(t, n) + 4, 255);
}

Routes::Routes(const Topology& t, int n, int self, const std::vector<char>& down) {
  next_.assign(static_cast<std::size_t>(n), -1);
  hops_.assign(static_cast<std::size_t>(n), -1);
  if (self < 0 || self >= n) return;
  auto is_down = [&](int r) { return static_cast<std::size_t>(r) < down.size() && down[static_cast<std::size_t>(r)]; };
  hops_[static_cast<std::size_t>(self)] = 0;
  std::deque<int> frontier{self};
  while (!frontier.empty()) {
    const int at = frontier.front();
    frontier.pop_front();
    for (int nb : neighbours_of(t, n, at)) {
      auto i = static_cast<std::size_t>(nb);
      if (hops_[i] >= 0) continue;
      hops_[i] = hops_[static_cast<std::size_t>(at)] + 1;
      next_[i] = at == self ? nb : next_[static_cast<std::size_t>(at)];
      // A rank that is down is still a destination (its last acknowledgements, say) but
      // never a relay.
      if (!is_down(nb)) frontier.push_back(nb);
    }
  }
  hops_[static_cast<std::size_t>(self)] = -1;
}

}  // namespace nexar::detail
