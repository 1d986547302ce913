// The payload of agree and decided frames: a value and a set of failed world ranks.
// Layout (docs/PROTOCOL.md, "Failures"): u64 value, u32 count, then `count` u32 world ranks
// in strictly ascending order, little-endian.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "wire/frame.hpp"

namespace nexar::wire {

struct Ballot {
  std::uint64_t value = 0;
  std::vector<std::uint32_t> failed;  // world ranks, ascending, no duplicates
  bool operator==(const Ballot&) const = default;
};

/// The payload bytes of `b`; `b.failed` must be ascending without duplicates.
std::vector<std::byte> encode_ballot(const Ballot& b);

/// Decodes a payload: the length must match the count exactly, ranks must be ascending,
/// distinct and below `world`.
DecodeError decode_ballot(std::span<const std::byte> in, std::uint32_t world, Ballot& out);

}  // namespace nexar::wire
