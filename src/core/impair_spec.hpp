// What Config::tuning.impair (NEXAR_IMPAIR) asks of the wire: faults injected where datagrams
// enter a process, so that loss, delay and reordering can be tested and measured on one
// machine, reproducibly (quic/impairment.hpp applies them).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace nexar::detail {

struct ImpairSpec {
  double drop = 0;               // probability that an arriving datagram is dropped
  double reorder = 0;            // probability that one is held back reorder_ns
  std::uint64_t reorder_ns = 1'000'000;
  std::uint64_t delay_ns = 0;    // every datagram arrives this much later...
  std::uint64_t jitter_ns = 0;   // ...plus a uniform random extra up to this
  std::uint64_t seed = 1;        // the random source's seed: equal seeds, equal choices

  bool active() const noexcept { return drop > 0 || reorder > 0 || delay_ns > 0 || jitter_ns > 0; }

  /// Parses "key=value,key=value": drop and reorder (probabilities in [0, 1)), delay_ms,
  /// jitter_ms and reorder_ms (milliseconds, decimals allowed, at most 10000) and seed.
  /// Empty means no impairment. Throws Error(invalid_argument) naming the bad entry.
  static ImpairSpec parse(std::string_view text);
  /// The canonical text of this spec ("" when inactive).
  std::string to_string() const;
};

}  // namespace nexar::detail
