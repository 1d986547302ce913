// libFuzzer target for the stream decoder (wire/frame.hpp).
//
// Input: byte 0 picks the lane (byte % 5) and the chunk size (1 + byte / 5); the rest is
// the stream body. It is fed three ways:
//   1. after a valid preamble for the lane, in chunks of that size;
//   2. the same, in one piece;
//   3. raw (no preamble added), in one piece, so the preamble decoder is fuzzed too.
// The handler checks the callback protocol, and runs 1 and 2 must agree exactly: how
// the input is split must never change what is decoded.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "wire/frame.hpp"

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

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const auto lane = static_cast<Lane>(data[0] % nexar::wire::lane_count);
  const std::size_t chunk = 1 + data[0] / 5;
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
  return 0;
}
