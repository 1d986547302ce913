// Faults injected where datagrams enter an endpoint (Config::tuning.impair, NEXAR_IMPAIR): each
// arriving datagram is dropped, delivered at once, or held back and delivered later
// (delay and jitter for all, an extra hold for the ones chosen to be reordered). The
// choices come from a generator seeded by the spec, so a run is reproducible as far as
// packet arrival is. Only built when the spec is active: the normal path pays one
// pointer test per datagram.
#pragma once

#include <cstdint>
#include <queue>
#include <random>
#include <vector>

#include "core/impair_spec.hpp"
#include "quic/address.hpp"

namespace nexar::quic {

class Impairment {
 public:
  explicit Impairment(const detail::ImpairSpec& spec);

  /// Decides the fate of a datagram arriving at `now`: true to deliver it now; false when it
  /// was dropped or copied to be delivered by release().
  bool admit(const Address& from, const std::uint8_t* pkt, std::size_t len, std::uint64_t now);

  /// Delivers every held datagram whose time has come, in time order, as fn(from, pkt, len).
  /// The buffer passed to fn is writable and lives until fn returns.
  template <class F>
  void release(std::uint64_t now, F&& fn) {
    while (!held_.empty() && held_.top().at <= now) {
      Held h = std::move(const_cast<Held&>(held_.top()));
      held_.pop();
      fn(h.from, h.bytes.data(), h.bytes.size());
    }
  }

  /// When the next held datagram is due; UINT64_MAX when none is held.
  std::uint64_t next_release() const noexcept { return held_.empty() ? UINT64_MAX : held_.top().at; }

  struct Stats {
    std::uint64_t seen = 0, dropped = 0, held = 0, reordered = 0;
  };
  const Stats& stats() const noexcept { return stats_; }

 private:
  struct Held {
    std::uint64_t at;
    std::uint64_t order;  // arrival order breaks ties: equal delays never reorder
    Address from;
    std::vector<std::uint8_t> bytes;
    bool operator>(const Held& o) const noexcept { return at != o.at ? at > o.at : order > o.order; }
  };
  double uniform() { return std::uniform_real_distribution<double>(0.0, 1.0)(rng_); }

  detail::ImpairSpec spec_;
  std::mt19937_64 rng_;
  std::priority_queue<Held, std::vector<Held>, std::greater<Held>> held_;
  std::uint64_t arrivals_ = 0;
  Stats stats_;
};

}  // namespace nexar::quic
