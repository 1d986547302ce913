// libFuzzer target for the stream decoder (wire/frame.hpp) and the seed protocol codec
// (wire/seed_message.hpp).
//
// Input: byte 0 picks the lane (byte % lane_count) and the chunk size (1 + byte /
// lane_count); the rest is the stream body. It is fed three ways:
//   1. after a valid preamble for the lane, in chunks of that size;
//   2. the same, in one piece;
//   3. raw (no preamble added), in one piece, so the preamble decoder is fuzzed too.
// The handler checks the callback protocol, and runs 1 and 2 must agree exactly: how
// the input is split must never change what is decoded.
//
// The same body is then decoded as seed protocol messages. Byte 0 picks the size limit
// (bit 0: a joiner's limit for seed replies, else the seed's for join requests) and seeds
// the sizes of the pieces a SeedMessageReader is fed in. Checked: decode_seed_message
// either fails with a reason or returns a message that re-encodes to exactly the input
// (the encoding is canonical; an accept names its rank among its members and carries one
// relay key per member, zero for its own rank); the reader gives the same messages and the
// same verdict whether fed in random pieces or in one; what it returns re-encodes to a
// prefix of the input; and a failed reader stays failed.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "wire/frame.hpp"
#include "wire/seed_message.hpp"

namespace {

using nexar::wire::FrameHeader;
using nexar::wire::Lane;

constexpr std::uint64_t max_payload = std::uint64_t{1} << 20;

[[noreturn]] void violated() { __builtin_trap(); }

bool same(const FrameHeader& a, const FrameHeader& b) {
  return a.type == b.type && a.flags == b.flags && a.src == b.src && a.comm == b.comm &&
         a.tag == b.tag && a.seq == b.seq && a.length == b.length;
}

struct Checker {
  const std::byte* lo = nullptr;  // payload chunks must point into [lo, hi)
  const std::byte* hi = nullptr;
  bool dead = false;              // set once the reader reported an error
  bool have_lane = false;
  Lane lane = Lane::control;
  bool in_frame = false;
  FrameHeader cur{};
  std::uint64_t got = 0;          // payload bytes of the current frame
  std::uint64_t frames = 0;
  std::uint64_t payload_total = 0;
  std::uint64_t hash = 1469598103934665603ull;  // FNV-1a over headers and payload

  void mix(std::uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      hash ^= (v >> (8 * i)) & 0xffu;
      hash *= 1099511628211ull;
    }
  }

  bool on_preamble(Lane l) {
    if (dead || have_lane) violated();
    have_lane = true;
    lane = l;
    return true;
  }
  bool on_header(const FrameHeader& h) {
    if (dead || !have_lane || in_frame) violated();
    if (!nexar::wire::has_payload(h) && h.type != nexar::wire::FrameType::rts &&
        h.length != 0) {
      violated();
    }
    if (h.length > max_payload) violated();
    // A header the reader accepted must survive re-encoding unchanged.
    std::array<std::byte, nexar::wire::header_size> b{};
    nexar::wire::encode_header(h, b);
    FrameHeader back;
    if (nexar::wire::decode_header(b, lane, max_payload, back) || !same(back, h)) violated();
    in_frame = true;
    cur = h;
    got = 0;
    mix(static_cast<std::uint64_t>(h.type) | (std::uint64_t{h.flags} << 8) |
        (std::uint64_t{h.src} << 32));
    mix(h.comm);
    mix(h.tag);
    mix(h.seq);
    mix(h.length);
    return true;
  }
  void on_payload(std::span<const std::byte> chunk) {
    if (dead || !in_frame || !nexar::wire::has_payload(cur) || chunk.empty()) violated();
    if (chunk.data() < lo || chunk.data() + chunk.size() > hi) violated();
    got += chunk.size();
    if (got > cur.length) violated();
    payload_total += chunk.size();
    for (std::byte c : chunk) {
      hash ^= std::to_integer<std::uint64_t>(c);
      hash *= 1099511628211ull;
    }
  }
  bool on_frame_end(const FrameHeader& h) {
    if (dead || !in_frame || !same(h, cur)) violated();
    if (got != (nexar::wire::has_payload(h) ? h.length : 0)) violated();
    in_frame = false;
    ++frames;
    return true;
  }
};

struct Outcome {
  Checker c;
  std::string error;
};

Outcome run(std::span<const std::byte> stream, std::size_t chunk) {
  Outcome o;
  o.c.lo = stream.data();
  o.c.hi = stream.data() + stream.size();
  nexar::wire::FrameReader reader(max_payload);
  std::size_t pos = 0;
  while (pos < stream.size()) {
    const std::size_t n = std::min(chunk, stream.size() - pos);
    nexar::wire::DecodeError e = reader.feed(stream.subspan(pos, n), o.c);
    pos += n;
    if (e) {
      if (e.error.empty()) violated();
      o.error = e.error;
      o.c.dead = true;
      // A failed reader must stay failed without touching the handler (dead traps).
      if (!reader.feed(stream, o.c)) violated();
      break;
    }
  }
  // Between frames the handler must have seen the preamble and every frame end. (The
  // converse does not hold: a partially read header is not a boundary either.)
  if (reader.at_boundary() && (!o.c.have_lane || o.c.in_frame)) violated();
  return o;
}

// ---- seed protocol -------------------------------------------------------------------------

using Bytes = std::vector<std::uint8_t>;

Bytes encode_any(const nexar::wire::SeedMessage& m) {
  return std::visit([](const auto& v) { return nexar::wire::encode(v); }, m);
}

struct SeedRun {
  bool ok = true;
  std::string error;
  Bytes reencoded;  // the messages decoded, encoded again back to back
  std::size_t messages = 0;
};

// Feeds `data` to a reader in pieces whose sizes come from `rng_seed` (0: one piece).
SeedRun run_seed_reader(const std::uint8_t* data, std::size_t size, std::uint32_t limit,
                        std::uint32_t rng_seed) {
  SeedRun out;
  nexar::wire::SeedMessageReader reader(limit);
  std::vector<nexar::wire::SeedMessage> msgs;
  std::uint32_t x = rng_seed | 1u;
  std::size_t pos = 0;
  while (pos < size || size == 0) {
    std::size_t n = size - pos;
    if (rng_seed != 0) {
      x ^= x << 13;
      x ^= x >> 17;
      x ^= x << 5;
      // Mostly small pieces (header and field boundaries), sometimes large ones.
      n = std::min<std::size_t>(n, (x & 7u) == 0 ? 1 + x % 4096 : 1 + x % 16);
    }
    const std::size_t before = msgs.size();
    if (!reader.feed(data + pos, n, msgs)) {
      if (reader.error().empty()) violated();
      out.ok = false;
      out.error = reader.error();
      // A failed reader stays failed and yields nothing more.
      const std::size_t had = msgs.size();
      if (reader.feed(data, size, msgs) || msgs.size() != had) violated();
      break;
    }
    if (msgs.size() < before) violated();
    pos += n;
    if (size == 0) break;
  }
  for (const auto& m : msgs) {
    const Bytes b = encode_any(m);
    out.reencoded.insert(out.reencoded.end(), b.begin(), b.end());
  }
  out.messages = msgs.size();
  return out;
}

void fuzz_seed(std::uint8_t selector, const std::uint8_t* data, std::size_t size) {
  const std::uint32_t limit =
      (selector & 1u) ? nexar::wire::max_seed_reply : nexar::wire::max_join_request;

  // One complete message.
  std::string err;
  const std::optional<nexar::wire::SeedMessage> one =
      nexar::wire::decode_seed_message(data, size, limit, err);
  if (one) {
    const Bytes b = encode_any(*one);
    if (b.size() != size || !std::equal(b.begin(), b.end(), data)) violated();
    if (const auto* a = std::get_if<nexar::wire::JoinAccept>(&*one)) {
      if (a->members.empty() || a->rank < 0 ||
          static_cast<std::size_t>(a->rank) >= a->members.size() ||
          a->keys.size() != a->members.size()) {
        violated();
      }
      // No key for the node's own rank.
      const auto& own = a->keys[static_cast<std::size_t>(a->rank)];
      if (std::any_of(own.begin(), own.end(), [](std::uint8_t x) { return x != 0; })) violated();
    }
  } else if (err.empty()) {
    violated();
  }

  // A stream of messages: in random pieces and in one piece, with the same outcome.
  const SeedRun split = run_seed_reader(data, size, limit, 0x9e3779b9u * (selector + 1u));
  const SeedRun whole = run_seed_reader(data, size, limit, 0);
  if (split.ok != whole.ok || split.error != whole.error || split.messages != whole.messages ||
      split.reencoded != whole.reencoded) {
    violated();
  }
  // What the reader decoded is exactly the start of the input.
  if (split.reencoded.size() > size ||
      !std::equal(split.reencoded.begin(), split.reencoded.end(), data)) {
    violated();
  }
  // A single valid message is one message to the reader too.
  if (one && (!whole.ok || whole.messages != 1)) violated();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const auto lane = static_cast<Lane>(data[0] % nexar::wire::lane_count);
  const std::size_t chunk = 1 + data[0] / nexar::wire::lane_count;
  const auto body = std::as_bytes(std::span<const std::uint8_t>(data + 1, size - 1));

  // The stream with a preamble prepended; one copy, so the payload chunks of both runs
  // can be checked against the same bounds.
  std::vector<std::byte> stream(nexar::wire::preamble_size);
  nexar::wire::encode_preamble(
      lane, std::span<std::byte, nexar::wire::preamble_size>(stream.data(),
                                                             nexar::wire::preamble_size));
  stream.insert(stream.end(), body.begin(), body.end());
  const std::span<const std::byte> s(stream.data(), stream.size());

  const Outcome split = run(s, chunk);
  const Outcome whole = run(s, s.size());
  if (split.error != whole.error || split.c.frames != whole.c.frames ||
      split.c.payload_total != whole.c.payload_total || split.c.hash != whole.c.hash ||
      split.c.in_frame != whole.c.in_frame) {
    violated();
  }
  if (split.c.have_lane && split.c.lane != lane) violated();

  run(body, body.size() == 0 ? 1 : body.size());

  fuzz_seed(data[0], data + 1, size - 1);
  return 0;
}
