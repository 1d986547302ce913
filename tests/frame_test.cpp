// Tests of the wire format of peer streams (src/wire/frame.*): preamble and header byte
// layout, validation, and the incremental FrameReader.
#include "wire/frame.hpp"

#include <gtest/gtest.h>

#include "support.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace nexar::wire {
namespace {

using nexar::testing::contains;
using Bytes = std::vector<std::byte>;
constexpr std::uint64_t u64max = std::numeric_limits<std::uint64_t>::max();
constexpr std::uint32_t u32max = std::numeric_limits<std::uint32_t>::max();

constexpr FrameType all_types[] = {FrameType::hello, FrameType::goodbye,     FrameType::eager,
                                   FrameType::rts,   FrameType::cts,         FrameType::rdata,
                                   FrameType::rpc_request, FrameType::rpc_response};
constexpr Lane all_lanes[] = {Lane::control, Lane::data, Lane::rpc_request, Lane::rpc_response,
                              Lane::bulk,    Lane::collective};
static_assert(std::size(all_lanes) == lane_count);

// The lane each type is valid on (the first one, for data-lane types).
Lane home_lane(FrameType t) {
  switch (t) {
    case FrameType::hello:
    case FrameType::goodbye: return Lane::control;
    case FrameType::rpc_request: return Lane::rpc_request;
    case FrameType::rpc_response: return Lane::rpc_response;
    default: return Lane::data;
  }
}

bool same_header(const FrameHeader& a, const FrameHeader& b) {
  return a.type == b.type && a.flags == b.flags && a.src == b.src && a.comm == b.comm &&
         a.tag == b.tag && a.seq == b.seq && a.length == b.length;
}

std::string describe(const FrameHeader& h) {
  return std::string(to_string(h.type)) + " flags=" + std::to_string(h.flags) +
         " src=" + std::to_string(h.src) + " comm=" + std::to_string(h.comm) +
         " tag=" + std::to_string(h.tag) + " seq=" + std::to_string(h.seq) +
         " length=" + std::to_string(h.length);
}

std::array<std::byte, header_size> encode(const FrameHeader& h) {
  std::array<std::byte, header_size> b{};
  encode_header(h, b);
  return b;
}

DecodeError decode(const std::array<std::byte, header_size>& b, Lane lane,
                   std::uint64_t max_payload, FrameHeader& out) {
  return decode_header(std::span<const std::byte, header_size>(b), lane, max_payload, out);
}

DecodeError decode(const FrameHeader& h, Lane lane, std::uint64_t max_payload = 1 << 20) {
  FrameHeader out;
  return decode(encode(h), lane, max_payload, out);
}

// ---- preamble ------------------------------------------------------------------------

TEST(Preamble, GoldenBytes) {
  std::array<std::byte, preamble_size> b{};
  encode_preamble(Lane::rpc_response, b);
  const std::array<std::uint8_t, preamble_size> want = {'N', 'X', 'A', 'R', 2, 3, 0, 0};
  for (std::size_t i = 0; i < preamble_size; ++i) {
    EXPECT_EQ(std::to_integer<std::uint8_t>(b[i]), want[i]) << "byte " << i;
  }
}

TEST(Preamble, RoundTripEveryLane) {
  for (Lane l : all_lanes) {
    std::array<std::byte, preamble_size> b{};
    encode_preamble(l, b);
    Lane got = l == Lane::control ? Lane::bulk : Lane::control;
    DecodeError e = decode_preamble(b, got);
    EXPECT_FALSE(e) << e.error;
    EXPECT_EQ(got, l);
  }
}

// The collective lane is value 5 on the wire and carries exactly the message frames, like
// the data and bulk lanes.
TEST(Preamble, CollectiveLaneIsFive) {
  std::array<std::byte, preamble_size> b{};
  encode_preamble(Lane::collective, b);
  EXPECT_EQ(std::to_integer<unsigned>(b[5]), 5u);
  Lane got = Lane::control;
  DecodeError e = decode_preamble(b, got);
  EXPECT_FALSE(e) << e.error;
  EXPECT_EQ(got, Lane::collective);
  for (FrameType t : {FrameType::eager, FrameType::rts, FrameType::cts, FrameType::rdata}) {
    FrameHeader h;
    h.type = t;
    EXPECT_FALSE(decode(h, Lane::collective)) << nexar::wire::to_string(t);
  }
  for (FrameType t : {FrameType::hello, FrameType::goodbye, FrameType::rpc_request,
                      FrameType::rpc_response}) {
    FrameHeader h;
    h.type = t;
    EXPECT_EQ(decode(h, Lane::collective).error,
              std::string("frame type ") + nexar::wire::to_string(t) + " not allowed on lane collective");
  }
}

TEST(Preamble, Rejects) {
  auto bad = [](std::size_t at, std::uint8_t v) {
    std::array<std::byte, preamble_size> b{};
    encode_preamble(Lane::data, b);
    b[at] = std::byte{v};
    Lane l = Lane::control;
    DecodeError e = decode_preamble(b, l);
    EXPECT_EQ(l, Lane::control) << "lane must not be written on failure";
    return e.error;
  };
  EXPECT_TRUE(contains(bad(0, 'n'), "magic")) << bad(0, 'n');
  EXPECT_TRUE(contains(bad(3, 0), "magic"));
  EXPECT_TRUE(contains(bad(4, 1), "version 1")) << bad(4, 1);  // the version before 2026-11-29
  EXPECT_TRUE(contains(bad(4, 3), "version 3")) << bad(4, 3);
  EXPECT_TRUE(contains(bad(4, 0), "version 0"));
  EXPECT_TRUE(contains(bad(5, 6), "lane 6")) << bad(5, 6);
  EXPECT_TRUE(contains(bad(5, 0xff), "lane 255"));
  EXPECT_TRUE(contains(bad(6, 1), "reserved bytes 0x0001")) << bad(6, 1);
  EXPECT_TRUE(contains(bad(7, 1), "reserved bytes 0x0100")) << bad(7, 1);
}

// ---- header layout -------------------------------------------------------------------

TEST(Header, GoldenBytes) {
  FrameHeader h;
  h.type = FrameType::rpc_response;
  h.flags = 2;
  h.src = 0x04030201u;
  h.comm = 0x1817161514131211ull;
  h.tag = 0x2827262524232221ull;
  h.seq = 0x3837363534333231ull;
  h.length = 0x0000000000000a0bull;
  const std::array<std::uint8_t, header_size> want = {
      0x08, 0x02, 0x00, 0x00, 0x01, 0x02, 0x03, 0x04,  // type flags reserved src
      0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18,  // comm
      0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0x27, 0x28,  // tag
      0x31, 0x32, 0x33, 0x34, 0x35, 0x36, 0x37, 0x38,  // seq
      0x0b, 0x0a, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  // length
  };
  const auto b = encode(h);
  for (std::size_t i = 0; i < header_size; ++i) {
    EXPECT_EQ(std::to_integer<std::uint8_t>(b[i]), want[i]) << "byte " << i;
  }
  FrameHeader back;
  DecodeError e = decode(b, Lane::rpc_response, 1 << 20, back);
  ASSERT_FALSE(e) << e.error;
  EXPECT_TRUE(same_header(back, h)) << describe(back);
}

TEST(Header, RoundTripExtremeValues) {
  const std::uint64_t v64[] = {0, 1, 0x80, 0xff, 0x8000000000000000ull, u64max - 1, u64max};
  const std::uint32_t v32[] = {0, 1, 0x80000000u, u32max};
  for (FrameType t : all_types) {
    for (std::uint32_t src : v32) {
      for (std::uint64_t v : v64) {
        FrameHeader h;
        h.type = t;
        h.flags = t == FrameType::rpc_response ? 2 : 0;
        h.src = src;
        h.comm = v;
        h.tag = ~v;
        h.seq = v ^ 0x5555555555555555ull;
        const bool zero_len = t == FrameType::goodbye || t == FrameType::cts;
        const std::uint64_t limit = t == FrameType::hello ? 1024 : u64max;
        h.length = zero_len ? 0 : std::min(v, limit);
        FrameHeader back;
        DecodeError e = decode(encode(h), home_lane(t), u64max, back);
        ASSERT_FALSE(e) << e.error << " for " << describe(h);
        EXPECT_TRUE(same_header(back, h)) << describe(back) << " vs " << describe(h);
      }
    }
  }
}

TEST(Header, DecodeFailureLeavesOutputUntouched) {
  FrameHeader h;
  h.type = FrameType::eager;
  h.length = 100;
  FrameHeader out;
  out.tag = 77;
  EXPECT_TRUE(decode(encode(h), Lane::control, 1 << 20, out));
  EXPECT_EQ(out.tag, 77u);
}

// ---- validation ----------------------------------------------------------------------

TEST(Validate, UnknownType) {
  for (unsigned t : {0u, 15u, 0x63u, 0x80u, 0xffu}) {
    auto b = encode(FrameHeader{});
    b[0] = std::byte(t);
    FrameHeader out;
    DecodeError e = decode(b, Lane::data, 1 << 20, out);
    ASSERT_TRUE(e) << t;
    EXPECT_TRUE(contains(e.error, "frame type")) << e.error;
  }
  auto b = encode(FrameHeader{});
  b[0] = std::byte{0x63};
  FrameHeader out;
  EXPECT_EQ(decode(b, Lane::data, 1 << 20, out).error, "unknown frame type 0x63");
}

// Bytes 2-3 carry a collective call's fingerprint in eager and rts frames, and must be zero
// in every other frame type.
TEST(Validate, CheckOnlyOnMessages) {
  for (FrameType t : {FrameType::eager, FrameType::rts}) {
    FrameHeader h;
    h.type = t;
    h.check = 0x8a48;
    auto b = encode(h);
    FrameHeader out;
    EXPECT_EQ(decode(b, Lane::collective, 1 << 20, out).error, "") << to_string(t);
    EXPECT_EQ(out.check, 0x8a48) << to_string(t);
  }
  FrameHeader h;
  h.type = FrameType::cts;
  auto b = encode(h);
  b[2] = std::byte{0x02};
  b[3] = std::byte{0x01};
  FrameHeader out;
  EXPECT_EQ(decode(b, Lane::data, 1 << 20, out).error, "check 0x0102 must be zero for frame type cts");
  b = encode(FrameHeader{});
  b[0] = static_cast<std::byte>(FrameType::heartbeat);
  b[3] = std::byte{0x80};
  EXPECT_TRUE(contains(decode(b, Lane::control, 1 << 20, out).error, "check 0x8000 must be zero for frame type heartbeat"));
}

// A revocation may say why, up to 1024 bytes.
TEST(Validate, RevokeReasonLength) {
  FrameHeader h;
  h.type = FrameType::revoke;
  h.length = 1024;
  FrameHeader out;
  EXPECT_EQ(decode(encode(h), Lane::control, 1 << 20, out).error, "");
  h.length = 1025;
  EXPECT_EQ(decode(encode(h), Lane::control, 1 << 20, out).error, "frame length 1025 exceeds limit 1024 for frame type revoke");
}

TEST(Validate, LaneRules) {
  auto allowed = [](FrameType t, Lane l) {
    switch (t) {
      case FrameType::hello:
      case FrameType::goodbye: return l == Lane::control;
      case FrameType::rpc_request: return l == Lane::rpc_request;
      case FrameType::rpc_response: return l == Lane::rpc_response;
      default: return l == Lane::data || l == Lane::bulk || l == Lane::collective;
    }
  };
  for (FrameType t : all_types) {
    for (Lane l : all_lanes) {
      FrameHeader h;
      h.type = t;
      DecodeError e = decode(h, l);
      if (allowed(t, l)) {
        EXPECT_FALSE(e) << to_string(t) << " on " << to_string(l) << ": " << e.error;
      } else {
        EXPECT_EQ(e.error, std::string("frame type ") + to_string(t) + " not allowed on lane " +
                               to_string(l));
      }
    }
  }
}

TEST(Validate, FlagRules) {
  for (FrameType t : all_types) {
    for (unsigned f = 0; f < 256; ++f) {
      FrameHeader h;
      h.type = t;
      h.flags = static_cast<std::uint8_t>(f);
      bool ok = f == 0;
      if (t == FrameType::rdata) ok = f == 0 || f == flag_cancelled;
      if (t == FrameType::rpc_response) ok = f <= 2;
      DecodeError e = decode(h, home_lane(t));
      EXPECT_EQ(!e, ok) << to_string(t) << " flags " << f << ": " << e.error;
      if (e) {
        EXPECT_TRUE(contains(e.error, "flags 0x")) << e.error;
      }
    }
  }
  FrameHeader h;
  h.type = FrameType::eager;
  h.flags = 0x10;
  EXPECT_EQ(decode(h, Lane::data).error, "flags 0x10 not allowed on frame type eager");
  h.type = FrameType::rpc_response;
  h.flags = 3;
  EXPECT_TRUE(contains(decode(h, Lane::rpc_response).error, "RpcStatus"));
}

TEST(Validate, NoPayloadTypesNeedZeroLength) {
  for (FrameType t : {FrameType::goodbye, FrameType::cts, FrameType::rdata}) {
    FrameHeader h;
    h.type = t;
    h.flags = t == FrameType::rdata ? flag_cancelled : 0;
    h.length = 0;
    EXPECT_FALSE(decode(h, home_lane(t)));
    for (std::uint64_t len : {std::uint64_t{1}, std::uint64_t{1} << 40, u64max}) {
      h.length = len;
      DecodeError e = decode(h, home_lane(t), u64max);
      ASSERT_TRUE(e) << to_string(t);
      EXPECT_TRUE(contains(e.error, "frame length " + std::to_string(len) + " must be 0"))
          << e.error;
    }
  }
}

TEST(Validate, LengthLimits) {
  const std::uint64_t limit = 1000;
  for (FrameType t : {FrameType::hello, FrameType::eager, FrameType::rts, FrameType::rdata,
                      FrameType::rpc_request, FrameType::rpc_response}) {
    FrameHeader h;
    h.type = t;
    h.length = limit;
    EXPECT_FALSE(decode(h, home_lane(t), limit)) << to_string(t);
    h.length = limit + 1;
    EXPECT_EQ(decode(h, home_lane(t), limit).error, "frame length 1001 exceeds limit 1000")
        << to_string(t);
  }
}

TEST(Validate, HelloCappedAt1024) {
  FrameHeader h;
  h.type = FrameType::hello;
  h.length = 1024;
  EXPECT_FALSE(decode(h, Lane::control, u64max));
  h.length = 1025;
  DecodeError e = decode(h, Lane::control, u64max);
  EXPECT_TRUE(contains(e.error, "frame length 1025 exceeds limit 1024")) << e.error;
}

TEST(Validate, FourGiBClaimRejected) {
  FrameHeader h;
  h.type = FrameType::eager;
  h.length = std::uint64_t{1} << 32;
  EXPECT_EQ(decode(h, Lane::data, std::uint64_t{1} << 31).error,
            "frame length 4294967296 exceeds limit 2147483648");
  h.type = FrameType::rts;  // an announced size is held to the same limit
  EXPECT_TRUE(decode(h, Lane::bulk, std::uint64_t{1} << 31));
}

// `h` decodes on the control lane and on no other, which names the frame type and lane.
void expect_control_lane_only(const FrameHeader& h) {
  for (Lane l : all_lanes) {
    DecodeError e = decode(h, l);
    if (l == Lane::control) {
      EXPECT_FALSE(e) << e.error;
    } else {
      EXPECT_EQ(e.error, std::string("frame type ") + to_string(h.type) + " not allowed on lane " + to_string(l));
    }
  }
}

TEST(Validate, WelcomeOnControlLaneOnly) {
  // A welcome (member -> admitted joiner) is membership traffic: control lane only, no
  // flags, a payload (the member list) capped like a ballot's.
  FrameHeader h;
  h.type = FrameType::welcome;
  h.src = 3;
  h.comm = 0x1234567890abcdefull;
  h.seq = 7;
  h.length = 12;
  expect_control_lane_only(h);
  FrameHeader out;
  ASSERT_FALSE(decode(encode(h), Lane::control, 1 << 20, out));
  EXPECT_TRUE(same_header(out, h)) << describe(out);
  EXPECT_EQ(std::string(to_string(FrameType::welcome)), "welcome");
  EXPECT_EQ(static_cast<int>(FrameType::welcome), 14);
  EXPECT_TRUE(has_payload(h));
  for (unsigned f = 1; f < 256; ++f) {
    h.flags = static_cast<std::uint8_t>(f);
    DecodeError e = decode(h, Lane::control);
    EXPECT_TRUE(contains(e.error, "not allowed on frame type welcome")) << f << ": " << e.error;
  }
  h.flags = 0;
  h.length = max_ballot_payload;
  EXPECT_FALSE(decode(h, Lane::control, u64max));
  h.length = max_ballot_payload + 1;
  DecodeError e = decode(h, Lane::control, u64max);
  EXPECT_TRUE(contains(e.error, "exceeds limit " + std::to_string(max_ballot_payload)) &&
              contains(e.error, "welcome"))
      << e.error;
}

TEST(Validate, PortsOnControlLaneOnlyWithWholePorts) {
  // Where a rank's shards listen (several engine threads): control lane only, a payload of
  // 2 bytes per port, at most 15 ports.
  FrameHeader h;
  h.type = FrameType::ports;
  h.src = 2;
  h.length = 4;
  expect_control_lane_only(h);
  EXPECT_EQ(std::string(to_string(FrameType::ports)), "ports");
  EXPECT_EQ(static_cast<int>(FrameType::ports), 19);
  EXPECT_TRUE(has_payload(h));
  for (std::uint64_t len : {std::uint64_t{2}, std::uint64_t{16}, max_ports_payload}) {
    h.length = len;
    EXPECT_FALSE(decode(h, Lane::control, u64max)) << len;
  }
  for (std::uint64_t len : {std::uint64_t{1}, std::uint64_t{3}, max_ports_payload + 1, max_ports_payload + 2, u64max}) {
    h.length = len;
    DecodeError e = decode(h, Lane::control, u64max);
    EXPECT_EQ(e.error, "frame length " + std::to_string(len) +
                           " of frame type ports is not an even number of bytes up to 30")
        << len;
  }
  h.length = 2;
  h.flags = 1;
  EXPECT_TRUE(contains(decode(h, Lane::control).error, "not allowed on frame type ports"));
}

TEST(Validate, HasPayload) {
  FrameHeader h;
  const std::pair<FrameType, bool> want[] = {
      {FrameType::hello, true},  {FrameType::goodbye, false},    {FrameType::eager, true},
      {FrameType::rts, false},   {FrameType::cts, false},        {FrameType::rdata, true},
      {FrameType::rpc_request, true}, {FrameType::rpc_response, true}};
  for (auto [t, p] : want) {
    h.type = t;
    h.flags = 0;
    EXPECT_EQ(has_payload(h), p) << to_string(t);
  }
  h.type = FrameType::rdata;
  h.flags = flag_cancelled;
  EXPECT_FALSE(has_payload(h));
}

// ---- FrameReader ---------------------------------------------------------------------

struct Frame {
  FrameHeader h;
  Bytes payload;
};

// Records every callback and checks the callback protocol as it goes.
struct Recorder {
  std::optional<Lane> lane;
  std::vector<Frame> frames;
  bool in_frame = false;
  int calls = 0;
  std::vector<std::string> violations;

  // Rejections, counted in frames (0-based); -1: never.
  bool reject_preamble = false;
  int reject_header_at = -1;
  int reject_end_at = -1;

  // When set, every payload chunk must point into [lo, hi): proof it was not copied.
  const std::byte* lo = nullptr;
  const std::byte* hi = nullptr;

  bool on_preamble(Lane l) {
    ++calls;
    if (lane) violations.push_back("second preamble");
    lane = l;
    return !reject_preamble;
  }
  bool on_header(const FrameHeader& h) {
    ++calls;
    if (!lane) violations.push_back("header before preamble");
    if (in_frame) violations.push_back("header inside frame");
    in_frame = true;
    frames.push_back({h, {}});
    return static_cast<int>(frames.size()) - 1 != reject_header_at;
  }
  void on_payload(std::span<const std::byte> chunk) {
    ++calls;
    if (!in_frame) violations.push_back("payload outside frame");
    if (chunk.empty()) violations.push_back("empty payload chunk");
    if (lo != nullptr && (chunk.data() < lo || chunk.data() + chunk.size() > hi)) {
      violations.push_back("payload chunk not inside the input");
    }
    if (!frames.empty()) {
      frames.back().payload.insert(frames.back().payload.end(), chunk.begin(), chunk.end());
      if (frames.back().payload.size() > frames.back().h.length) {
        violations.push_back("payload longer than header length");
      }
    }
  }
  bool on_frame_end(const FrameHeader& h) {
    ++calls;
    if (!in_frame) violations.push_back("frame end outside frame");
    in_frame = false;
    if (!frames.empty()) {
      const Frame& f = frames.back();
      if (!same_header(f.h, h)) violations.push_back("frame end header differs");
      const std::uint64_t want = has_payload(h) ? h.length : 0;
      if (f.payload.size() != want) violations.push_back("payload size != length");
    }
    return static_cast<int>(frames.size()) - 1 != reject_end_at;
  }
};

void append_preamble(Bytes& s, Lane lane) {
  std::array<std::byte, preamble_size> b{};
  encode_preamble(lane, b);
  s.insert(s.end(), b.begin(), b.end());
}

void append_frame(Bytes& s, const Frame& f) {
  const auto b = encode(f.h);
  s.insert(s.end(), b.begin(), b.end());
  s.insert(s.end(), f.payload.begin(), f.payload.end());
}

// A random valid frame for `lane`, with payload sizes from 0 up to `max_size`.
Frame random_frame(std::mt19937_64& rng, Lane lane, std::size_t max_size) {
  Frame f;
  auto& h = f.h;
  h.src = static_cast<std::uint32_t>(rng());
  h.comm = rng();
  h.tag = rng();
  h.seq = rng();
  std::size_t size = 0;
  switch (rng() % 4) {
    case 0: size = 0; break;
    case 1: size = 1 + rng() % 16; break;
    case 2: size = rng() % std::min<std::size_t>(max_size, 3000) + 1; break;
    default: size = rng() % (max_size + 1); break;
  }
  switch (lane) {
    case Lane::control: {
      const bool hello = rng() % 2 == 0;
      h.type = hello ? FrameType::hello : FrameType::goodbye;
      if (hello) size = std::min<std::size_t>(size, 1024);
      else size = 0;
      break;
    }
    case Lane::rpc_request: h.type = FrameType::rpc_request; break;
    case Lane::rpc_response:
      h.type = FrameType::rpc_response;
      h.flags = static_cast<std::uint8_t>(rng() % 3);
      break;
    case Lane::data:
    case Lane::bulk:
    case Lane::collective:
      switch (rng() % 5) {
        case 0: h.type = FrameType::eager; break;
        case 1:
          h.type = FrameType::rts;
          h.length = rng() % (std::uint64_t{1} << 30);
          size = 0;
          break;
        case 2: h.type = FrameType::cts; size = 0; break;
        case 3: h.type = FrameType::rdata; break;
        default:
          h.type = FrameType::rdata;
          h.flags = flag_cancelled;
          size = 0;
          break;
      }
      break;
  }
  if (h.type != FrameType::rts) h.length = size;  // rts keeps its announced size
  f.payload.resize(size);
  for (auto& b : f.payload) b = static_cast<std::byte>(rng());
  return f;
}

struct Stream {
  Lane lane;
  std::vector<Frame> frames;
  Bytes bytes;
};

Stream random_stream(std::mt19937_64& rng, Lane lane, int nframes, std::size_t max_size) {
  Stream s{lane, {}, {}};
  append_preamble(s.bytes, lane);
  for (int i = 0; i < nframes; ++i) {
    s.frames.push_back(random_frame(rng, lane, max_size));
    append_frame(s.bytes, s.frames.back());
  }
  return s;
}

constexpr std::uint64_t reader_limit = std::uint64_t{1} << 31;

// Feeds `s` in pieces ending at `cuts` (sorted, may repeat: empty pieces are fed too) and
// checks that the reader delivered exactly the frames that were written.
void feed_and_check(const Stream& s, const std::vector<std::size_t>& cuts,
                    const std::string& what) {
  FrameReader r(reader_limit);
  Recorder rec;
  rec.lo = s.bytes.data();
  rec.hi = s.bytes.data() + s.bytes.size();
  std::size_t from = 0;
  auto piece = [&](std::size_t to) {
    DecodeError e = r.feed(std::span<const std::byte>(s.bytes).subspan(from, to - from), rec);
    from = to;
    return e;
  };
  for (std::size_t c : cuts) {
    DecodeError e = piece(c);
    ASSERT_FALSE(e) << what << ": " << e.error;
  }
  DecodeError e = piece(s.bytes.size());
  ASSERT_FALSE(e) << what << ": " << e.error;
  ASSERT_TRUE(rec.violations.empty()) << what << ": " << rec.violations.front();
  EXPECT_TRUE(r.at_boundary()) << what;
  ASSERT_TRUE(rec.lane.has_value()) << what;
  EXPECT_EQ(*rec.lane, s.lane);
  EXPECT_EQ(r.lane(), s.lane);
  ASSERT_EQ(rec.frames.size(), s.frames.size()) << what;
  for (std::size_t i = 0; i < s.frames.size(); ++i) {
    EXPECT_TRUE(same_header(rec.frames[i].h, s.frames[i].h))
        << what << " frame " << i << ": " << describe(rec.frames[i].h) << " vs "
        << describe(s.frames[i].h);
    EXPECT_TRUE(rec.frames[i].payload == s.frames[i].payload) << what << " frame " << i;
  }
}

TEST(FrameReader, WholeStreamEveryLane) {
  std::mt19937_64 rng(1);
  for (Lane l : all_lanes) {
    const Stream s = random_stream(rng, l, 40, 20000);
    feed_and_check(s, {}, std::string("whole, lane ") + to_string(l));
  }
}

TEST(FrameReader, SplitAtEveryBoundary) {
  std::mt19937_64 rng(2);
  for (Lane l : all_lanes) {
    const Stream s = random_stream(rng, l, 6, 300);
    for (std::size_t cut = 0; cut <= s.bytes.size(); ++cut) {
      feed_and_check(s, {cut}, "one cut at " + std::to_string(cut));
    }
    // Two cuts close together catch state carried across a very short piece.
    for (std::size_t cut = 0; cut + 3 <= s.bytes.size(); cut += 7) {
      for (std::size_t d = 0; d <= 3; ++d) {
        feed_and_check(s, {cut, cut + d}, "cuts at " + std::to_string(cut) + "+" +
                                              std::to_string(d));
      }
    }
  }
}

TEST(FrameReader, OneByteAtATime) {
  std::mt19937_64 rng(3);
  for (Lane l : all_lanes) {
    const Stream s = random_stream(rng, l, 12, 2000);
    std::vector<std::size_t> cuts(s.bytes.size());
    for (std::size_t i = 0; i < cuts.size(); ++i) cuts[i] = i;
    feed_and_check(s, cuts, std::string("bytewise, lane ") + to_string(l));
  }
}

TEST(FrameReader, RandomSplitsLargePayloads) {
  std::mt19937_64 rng(4);
  for (int round = 0; round < 20; ++round) {
    const Lane l = all_lanes[round % lane_count];
    const Stream s = random_stream(rng, l, 10, std::size_t{1} << 20);
    std::vector<std::size_t> cuts;
    const std::size_t ncuts = rng() % 200;
    for (std::size_t i = 0; i < ncuts; ++i) {
      // Mix tiny pieces with big ones so payloads are split inside and across frames.
      cuts.push_back(rng() % (s.bytes.size() + 1));
    }
    std::sort(cuts.begin(), cuts.end());
    feed_and_check(s, cuts, "random round " + std::to_string(round));
  }
}

TEST(FrameReader, EmptyPayloadFramesGetNoPayloadCallback) {
  Stream s{Lane::data, {}, {}};
  append_preamble(s.bytes, Lane::data);
  for (int i = 0; i < 3; ++i) {
    Frame f;
    f.h.type = FrameType::eager;
    f.h.seq = static_cast<std::uint64_t>(i);
    s.frames.push_back(f);
    append_frame(s.bytes, f);
  }
  FrameReader r(100);
  Recorder rec;
  EXPECT_FALSE(r.feed(s.bytes, rec));
  EXPECT_TRUE(rec.violations.empty());
  EXPECT_EQ(rec.frames.size(), 3u);
  EXPECT_EQ(rec.calls, 1 + 3 * 2);  // preamble, then header + end per frame
}

TEST(FrameReader, AtBoundary) {
  Bytes s;
  append_preamble(s, Lane::data);
  Frame f;
  f.h.type = FrameType::eager;
  f.h.length = 5;
  f.payload.assign(5, std::byte{7});
  append_frame(s, f);
  FrameReader r(100);
  Recorder rec;
  const std::span<const std::byte> all(s);
  EXPECT_FALSE(r.at_boundary());  // preamble not yet read
  ASSERT_FALSE(r.feed(all.first(preamble_size), rec));
  EXPECT_TRUE(r.at_boundary());
  ASSERT_FALSE(r.feed(all.subspan(preamble_size, 10), rec));
  EXPECT_FALSE(r.at_boundary());  // partial header
  ASSERT_FALSE(r.feed(all.subspan(preamble_size + 10, header_size - 10 + 2), rec));
  EXPECT_FALSE(r.at_boundary());  // partial payload
  ASSERT_FALSE(r.feed(all.subspan(preamble_size + header_size + 2), rec));
  EXPECT_TRUE(r.at_boundary());
  EXPECT_TRUE(rec.violations.empty());
}

TEST(FrameReader, EmptyFeedIsHarmless) {
  FrameReader r(100);
  Recorder rec;
  EXPECT_FALSE(r.feed({}, rec));
  EXPECT_EQ(rec.calls, 0);
}

// After a failure the reader must neither call the handler nor accept input again.
void expect_stays_failed(FrameReader& r, Recorder& rec, const Bytes& more) {
  const int calls = rec.calls;
  for (int i = 0; i < 3; ++i) {
    DecodeError e = r.feed(more, rec);
    EXPECT_TRUE(e);
    e = r.feed({}, rec);
    EXPECT_TRUE(e);
  }
  EXPECT_EQ(rec.calls, calls);
  EXPECT_FALSE(r.at_boundary());
}

TEST(FrameReader, HandlerRejectionStops) {
  std::mt19937_64 rng(5);
  const Stream s = random_stream(rng, Lane::data, 8, 500);
  for (int mode = 0; mode < 3; ++mode) {
    for (int at = 0; at < 8; ++at) {
      if (mode == 0 && at > 0) break;
      FrameReader r(reader_limit);
      Recorder rec;
      if (mode == 0) rec.reject_preamble = true;
      if (mode == 1) rec.reject_header_at = at;
      if (mode == 2) rec.reject_end_at = at;
      DecodeError e = r.feed(s.bytes, rec);
      ASSERT_TRUE(e) << "mode " << mode << " at " << at;
      EXPECT_TRUE(contains(e.error, "handler rejected")) << e.error;
      EXPECT_EQ(rec.frames.size(), mode == 0 ? 0u : static_cast<std::size_t>(at + 1));
      if (mode == 1) {
        EXPECT_TRUE(rec.frames.back().payload.empty()) << "payload after rejected header";
      }
      expect_stays_failed(r, rec, s.bytes);
    }
  }
}

TEST(FrameReader, DecodeErrorMidStream) {
  std::mt19937_64 rng(6);
  Stream s = random_stream(rng, Lane::rpc_request, 4, 100);
  Frame bad;
  bad.h.type = FrameType::eager;  // not allowed on the rpc_request lane
  append_frame(s.bytes, bad);
  append_frame(s.bytes, s.frames.front());
  FrameReader r(reader_limit);
  Recorder rec;
  DecodeError e = r.feed(s.bytes, rec);
  EXPECT_EQ(e.error, "frame type eager not allowed on lane rpc_request");
  EXPECT_EQ(rec.frames.size(), 4u);
  EXPECT_TRUE(rec.violations.empty());
  expect_stays_failed(r, rec, s.bytes);
}

TEST(FrameReader, BadPreamble) {
  Bytes s;
  append_preamble(s, Lane::data);
  s[4] = std::byte{9};
  FrameReader r(100);
  Recorder rec;
  for (std::size_t i = 0; i + 1 < s.size(); ++i) {
    EXPECT_FALSE(r.feed(std::span<const std::byte>(s).subspan(i, 1), rec));
  }
  DecodeError e = r.feed(std::span<const std::byte>(s).last(1), rec);
  EXPECT_TRUE(contains(e.error, "version 9")) << e.error;
  expect_stays_failed(r, rec, s);
}

TEST(FrameReader, FourGiBClaimRejectedBeforeHandler) {
  Bytes s;
  append_preamble(s, Lane::bulk);
  Frame f;
  f.h.type = FrameType::rdata;
  f.h.length = std::uint64_t{1} << 32;
  append_frame(s, f);
  s.resize(s.size() + 64, std::byte{0xab});  // some "payload"
  FrameReader r(reader_limit);
  Recorder rec;
  DecodeError e = r.feed(s, rec);
  EXPECT_EQ(e.error, "frame length 4294967296 exceeds limit 2147483648");
  EXPECT_TRUE(rec.frames.empty());
  EXPECT_EQ(rec.calls, 1);  // only the preamble
}

// Garbage must only ever produce errors: no crash, no out-of-bounds access (run under
// ASan/UBSan), and the callback protocol stays intact whatever was accepted.
TEST(FrameReader, GarbageNeverCrashes) {
  std::mt19937_64 rng(7);
  for (int round = 0; round < 3000; ++round) {
    Bytes s;
    const int kind = round % 3;
    if (kind == 0) {
      s.resize(rng() % 400);
      for (auto& b : s) b = static_cast<std::byte>(rng());
    } else {
      // A valid stream with a few bytes flipped, or random bytes after a valid preamble.
      const Lane l = all_lanes[rng() % lane_count];
      if (kind == 1) {
        s = random_stream(rng, l, 5, 200).bytes;
        for (int k = 0; k < 3; ++k) s[rng() % s.size()] ^= static_cast<std::byte>(1 + rng() % 255);
      } else {
        append_preamble(s, l);
        const std::size_t n = rng() % 300;
        for (std::size_t i = 0; i < n; ++i) s.push_back(static_cast<std::byte>(rng() % 12));
      }
    }
    FrameReader r(1 << 10);
    Recorder rec;
    rec.lo = s.data();
    rec.hi = s.data() + s.size();
    std::size_t pos = 0;
    bool failed = false;
    while (pos < s.size()) {
      const std::size_t n = std::min<std::size_t>(s.size() - pos, 1 + rng() % 64);
      DecodeError e = r.feed(std::span<const std::byte>(s).subspan(pos, n), rec);
      pos += n;
      if (e) {
        EXPECT_FALSE(e.error.empty());
        failed = true;
        break;
      }
    }
    ASSERT_TRUE(rec.violations.empty()) << "round " << round << ": " << rec.violations.front();
    if (failed) expect_stays_failed(r, rec, s);
  }
}

}  // namespace
}  // namespace nexar::wire
