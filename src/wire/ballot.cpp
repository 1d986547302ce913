#include "wire/ballot.hpp"

#include <string>

#include "wire/bytes.hpp"

namespace nexar::wire {

std::vector<std::byte> encode_ballot(const Ballot& b) {
  std::vector<std::byte> out(12 + 4 * b.failed.size());
  put_u64(out.data(), b.value);
  put_u32(out.data() + 8, static_cast<std::uint32_t>(b.failed.size()));
  for (std::size_t i = 0; i < b.failed.size(); ++i) put_u32(out.data() + 12 + 4 * i, b.failed[i]);
  return out;
}

DecodeError decode_ballot(std::span<const std::byte> in, std::uint32_t world, Ballot& out) {
  if (in.size() < 12) return {"ballot of " + std::to_string(in.size()) + " bytes is shorter than 12"};
  const std::uint32_t count = get_u32(in.data() + 8);
  if (in.size() - 12 != 4 * std::uint64_t{count}) {
    return {"ballot names " + std::to_string(count) + " ranks in " + std::to_string(in.size()) + " bytes"};
  }
  if (count > world) {
    return {"ballot names " + std::to_string(count) + " failed ranks in a world of " + std::to_string(world)};
  }
  Ballot b;
  b.value = get_u64(in.data());
  b.failed.reserve(count);
  for (std::uint32_t i = 0; i < count; ++i) {
    const std::uint32_t r = get_u32(in.data() + 12 + 4 * std::size_t{i});
    if (r >= world) return {"ballot names rank " + std::to_string(r) + " in a world of " + std::to_string(world)};
    if (!b.failed.empty() && r <= b.failed.back()) return {"ballot ranks are not strictly ascending"};
    b.failed.push_back(r);
  }
  out = std::move(b);
  return {};
}

}  // namespace nexar::wire
