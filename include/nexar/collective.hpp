// nexar — options and helpers shared by the collective operations of Communicator.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <utility>

#include <nexar/dtype.hpp>

namespace nexar {

/// How a collective moves its data. `automatic` picks by message size and world size with
/// the thresholds in Config; any other value forces that algorithm where the collective
/// has it (invalid_argument otherwise).
enum class Algorithm {
  automatic,
  ring,              ///< all_reduce (reduce-scatter + all-gather), all_gather, reduce_scatter,
                     ///< broadcast (pipelined chain)
  halving_doubling,  ///< all_reduce (recursive halving-doubling, any world size)
  tree,              ///< broadcast, reduce (binomial tree)
  linear,            ///< gather, scatter, scan: root or neighbour exchanges one by one
  pairwise,          ///< all_to_all
  dissemination,     ///< barrier
  recursive_doubling,  ///< all_reduce (whole vector exchanged log2 n times; smallest sizes)
  hierarchical,  ///< all_reduce: reduce to one leader per host, ring among the leaders,
                 ///< broadcast from each leader; automatic for large messages when the
                 ///< communicator spans several hosts and some host has several ranks
};

/// Name of an algorithm, e.g. "halving_doubling".
const char* to_string(Algorithm a) noexcept;

/// Per-call options of a collective; every field defaults to the communicator's Config.
struct CollectiveOptions {
  /// Algorithm to use (default: chosen by size and world).
  Algorithm algorithm = Algorithm::automatic;
  /// Deadline of the whole operation (default Config::op_timeout).
  std::optional<std::chrono::milliseconds> timeout;
  /// Pipelining segment in bytes (default Config::tuning.segment_bytes). Smaller segments overlap
  /// transfer and reduction sooner but cost more per-message overhead.
  std::size_t segment_bytes = 0;
};

/// The part of `count` elements that rank `r` of `n` owns in reduce_scatter (and in the
/// ring algorithms): blocks of count / n elements, the first count % n blocks one larger.
/// Returns {offset, length} in elements.
constexpr std::pair<std::size_t, std::size_t> block_of(std::size_t count, int n, int r) noexcept {
  const auto un = static_cast<std::size_t>(n), ur = static_cast<std::size_t>(r);
  const std::size_t base = count / un, extra = count % un;
  return {ur * base + (ur < extra ? ur : extra), base + (ur < extra ? 1 : 0)};
}

}  // namespace nexar
