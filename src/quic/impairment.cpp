#include "quic/impairment.hpp"

namespace nexar::quic {

Impairment::Impairment(const detail::ImpairSpec& spec) : spec_(spec), rng_(spec.seed) {}

bool Impairment::admit(const Address& from, const std::uint8_t* pkt, std::size_t len, std::uint64_t now) {
  ++stats_.seen;
  const std::uint64_t order = arrivals_++;
  if (spec_.drop > 0 && uniform() < spec_.drop) {
    ++stats_.dropped;
    return false;
  }
  std::uint64_t hold = spec_.delay_ns;
  if (spec_.jitter_ns > 0) hold += static_cast<std::uint64_t>(uniform() * static_cast<double>(spec_.jitter_ns));
  if (spec_.reorder > 0 && uniform() < spec_.reorder) {
    hold += spec_.reorder_ns;
    ++stats_.reordered;
  }
  if (hold == 0) return true;
  ++stats_.held;
  held_.push(Held{now + hold, order, from, std::vector<std::uint8_t>(pkt, pkt + len)});
  return false;
}

}  // namespace nexar::quic
