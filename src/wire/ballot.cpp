#include "wire/ballot.hpp"

#include <algorithm>
#include <string>

#include "wire/bytes.hpp"

namespace nexar::wire {
namespace {

void put_list(std::vector<std::byte>& out, const std::vector<std::uint32_t>& v) {
  const std::size_t at = out.size();
  out.resize(at + 4 + 4 * v.size());
  put_u32(out.data() + at, static_cast<std::uint32_t>(v.size()));
  for (std::size_t i = 0; i < v.size(); ++i) put_u32(out.data() + at + 4 + 4 * i, v[i]);
}

// Reads one list at `in[at]` and advances `at`. `what` names the list in errors.
DecodeError get_list(std::span<const std::byte> in, std::size_t& at, std::uint32_t world, bool ascending,
                     const char* what, std::vector<std::uint32_t>& out) {
  if (in.size() - at < 4) return {std::string("ballot ends before its ") + what + " count"};
  const std::uint32_t count = get_u32(in.data() + at);
  at += 4;
  if ((in.size() - at) / 4 < count) {
    return {"ballot names " + std::to_string(count) + " " + what + " in " + std::to_string(in.size() - at) +
            " bytes"};
  }
  if (count > world) {
    return {"ballot names " + std::to_string(count) + " " + what + " in a world of " + std::to_string(world)};
  }
  out.clear();
  out.reserve(count);
  for (std::uint32_t i = 0; i < count; ++i, at += 4) {
    const std::uint32_t r = get_u32(in.data() + at);
    if (r >= world) return {std::string("ballot names ") + what + " rank " + std::to_string(r) + " in a world of " + std::to_string(world)};
    if (ascending && !out.empty() && r <= out.back()) return {std::string("ballot ") + what + " are not strictly ascending"};
    out.push_back(r);
  }
  return {};
}

}  // namespace

std::vector<std::byte> encode_ballot(const Ballot& b) {
  std::vector<std::byte> out(8);
  put_u64(out.data(), b.value);
  put_list(out, b.failed);
  put_list(out, b.joiners);
  put_list(out, b.leaving);
  return out;
}

DecodeError decode_ballot(std::span<const std::byte> in, std::uint32_t world, Ballot& out) {
  if (in.size() < 20) return {"ballot of " + std::to_string(in.size()) + " bytes is shorter than 20"};
  Ballot b;
  b.value = get_u64(in.data());
  std::size_t at = 8;
  if (auto e = get_list(in, at, world, true, "failed ranks", b.failed)) return e;
  if (auto e = get_list(in, at, world, true, "joiners", b.joiners)) return e;
  if (auto e = get_list(in, at, world, true, "leaving ranks", b.leaving)) return e;
  if (at != in.size()) return {"ballot has " + std::to_string(in.size() - at) + " bytes after its lists"};
  out = std::move(b);
  return {};
}

std::vector<std::byte> encode_members(const std::vector<std::uint32_t>& members) {
  std::vector<std::byte> out;
  put_list(out, members);
  return out;
}

DecodeError decode_members(std::span<const std::byte> in, std::uint32_t world, std::vector<std::uint32_t>& out) {
  std::size_t at = 0;
  std::vector<std::uint32_t> m;
  if (auto e = get_list(in, at, world, false, "members", m)) return e;
  if (at != in.size()) return {"member list has " + std::to_string(in.size() - at) + " bytes after it"};
  if (m.empty()) return {"member list is empty"};
  std::vector<std::uint32_t> sorted = m;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) return {"member list names a rank twice"};
  out = std::move(m);
  return {};
}

}  // namespace nexar::wire
