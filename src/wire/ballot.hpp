// The payload of agree and decided frames, and the member list of a welcome frame.
// Ballot layout (docs/PROTOCOL.md, "Failures" and "Membership"): u64 value, then three rank
// lists, each a u32 count followed by that many u32 world ranks in strictly ascending
// order: the failed members, the joiners, the leaving members. Little-endian.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "wire/frame.hpp"

namespace nexar::wire {

struct Ballot {
  std::uint64_t value = 0;
  std::vector<std::uint32_t> failed;   // world ranks, ascending, no duplicates
  std::vector<std::uint32_t> joiners;  // waiting joiners to admit (grow), ascending
  std::vector<std::uint32_t> leaving;  // members that leave (grow/leave), ascending
  bool operator==(const Ballot&) const = default;
};

/// The payload bytes of `b`; its lists must be ascending without duplicates.
std::vector<std::byte> encode_ballot(const Ballot& b);

/// Decodes a payload: the length must match the counts exactly, every list must be
/// strictly ascending and name only ranks below `world`.
DecodeError decode_ballot(std::span<const std::byte> in, std::uint32_t world, Ballot& out);

/// A welcome frame's payload: the new communicator's members as world ranks, in rank order
/// (u32 count, then the ranks).
std::vector<std::byte> encode_members(const std::vector<std::uint32_t>& members);

/// Decodes a member list: the length must match the count, ranks must be distinct and below
/// `world`, and there must be at least one.
DecodeError decode_members(std::span<const std::byte> in, std::uint32_t world, std::vector<std::uint32_t>& out);

}  // namespace nexar::wire
