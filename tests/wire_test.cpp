// Tests of the wire format: byte layout, validation, and the incremental FrameReader; and
// the seed protocol codec (SeedMessage suite, at the end).
#include "wire/frame.hpp"
#include "wire/seed_message.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace nexar::wire {
namespace {

using Bytes = std::vector<std::byte>;
constexpr std::uint64_t u64max = std::numeric_limits<std::uint64_t>::max();
constexpr std::uint32_t u32max = std::numeric_limits<std::uint32_t>::max();

constexpr FrameType all_types[] = {FrameType::hello, FrameType::goodbye,     FrameType::eager,
                                   FrameType::rts,   FrameType::cts,         FrameType::rdata,
                                   FrameType::rpc_request, FrameType::rpc_response};
constexpr Lane all_lanes[] = {Lane::control, Lane::data, Lane::rpc_request, Lane::rpc_response,
                              Lane::bulk};

const char* name_of(FrameType t) {
  switch (t) {
    case FrameType::hello: return "hello";
    case FrameType::goodbye: return "goodbye";
    case FrameType::eager: return "eager";
    case FrameType::rts: return "rts";
    case FrameType::cts: return "cts";
    case FrameType::rdata: return "rdata";
    case FrameType::rpc_request: return "rpc_request";
    case FrameType::rpc_response: return "rpc_response";
  }
  return "?";
}

const char* name_of(Lane l) {
  switch (l) {
    case Lane::control: return "control";
    case Lane::data: return "data";
    case Lane::rpc_request: return "rpc_request";
    case Lane::rpc_response: return "rpc_response";
    case Lane::bulk: return "bulk";
  }
  return "?";
}

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
  return std::string(name_of(h.type)) + " flags=" + std::to_string(h.flags) +
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

bool contains(const std::string& s, const std::string& what) {
  return s.find(what) != std::string::npos;
}

// ---- preamble ------------------------------------------------------------------------

TEST(Preamble, GoldenBytes) {
  std::array<std::byte, preamble_size> b{};
  encode_preamble(Lane::rpc_response, b);
  const std::array<std::uint8_t, preamble_size> want = {'N', 'X', 'A', 'R', 1, 3, 0, 0};
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
  EXPECT_TRUE(contains(bad(4, 2), "version 2")) << bad(4, 2);
  EXPECT_TRUE(contains(bad(4, 0), "version 0"));
  EXPECT_TRUE(contains(bad(5, 5), "lane 5")) << bad(5, 5);
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
  for (unsigned t : {0u, 9u, 0x63u, 0x80u, 0xffu}) {
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

TEST(Validate, ReservedMustBeZero) {
  auto b = encode(FrameHeader{});
  b[2] = std::byte{0x02};
  b[3] = std::byte{0x01};
  FrameHeader out;
  EXPECT_EQ(decode(b, Lane::data, 1 << 20, out).error, "reserved bytes 0x0102 must be zero");
  b[2] = std::byte{0};
  b[3] = std::byte{0x80};
  EXPECT_TRUE(contains(decode(b, Lane::data, 1 << 20, out).error, "reserved bytes 0x8000"));
}

TEST(Validate, LaneRules) {
  auto allowed = [](FrameType t, Lane l) {
    switch (t) {
      case FrameType::hello:
      case FrameType::goodbye: return l == Lane::control;
      case FrameType::rpc_request: return l == Lane::rpc_request;
      case FrameType::rpc_response: return l == Lane::rpc_response;
      default: return l == Lane::data || l == Lane::bulk;
    }
  };
  for (FrameType t : all_types) {
    for (Lane l : all_lanes) {
      FrameHeader h;
      h.type = t;
      DecodeError e = decode(h, l);
      if (allowed(t, l)) {
        EXPECT_FALSE(e) << name_of(t) << " on " << name_of(l) << ": " << e.error;
      } else {
        EXPECT_EQ(e.error, std::string("frame type ") + name_of(t) + " not allowed on lane " +
                               name_of(l));
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
      EXPECT_EQ(!e, ok) << name_of(t) << " flags " << f << ": " << e.error;
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
      ASSERT_TRUE(e) << name_of(t);
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
    EXPECT_FALSE(decode(h, home_lane(t), limit)) << name_of(t);
    h.length = limit + 1;
    EXPECT_EQ(decode(h, home_lane(t), limit).error, "frame length 1001 exceeds limit 1000")
        << name_of(t);
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

TEST(Validate, HasPayload) {
  FrameHeader h;
  const std::pair<FrameType, bool> want[] = {
      {FrameType::hello, true},  {FrameType::goodbye, false},    {FrameType::eager, true},
      {FrameType::rts, false},   {FrameType::cts, false},        {FrameType::rdata, true},
      {FrameType::rpc_request, true}, {FrameType::rpc_response, true}};
  for (auto [t, p] : want) {
    h.type = t;
    h.flags = 0;
    EXPECT_EQ(has_payload(h), p) << name_of(t);
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
    feed_and_check(s, {}, std::string("whole, lane ") + name_of(l));
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
    feed_and_check(s, cuts, std::string("bytewise, lane ") + name_of(l));
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

// ---- seed protocol messages (wire/seed_message.hpp) -----------------------------------------

using SeedBytes = std::vector<std::uint8_t>;

Proof counting_proof(std::uint8_t first) {
  Proof p{};
  for (std::size_t i = 0; i < p.size(); ++i) p[i] = static_cast<std::uint8_t>(first + i);
  return p;
}

// One message of every type, with contents that catch swapped, truncated or mis-sized
// fields: distinct proofs, embedded NUL and non-ASCII bytes, negative and extreme integers.
SeedHello sample_hello() {
  SeedHello m;
  m.proof = counting_proof(0x10);
  m.cluster = std::string("cluster-\0-\xc3\xa9t\xc3\xa9", 16);
  return m;
}

JoinRequest sample_request() {
  JoinRequest m;
  m.proof = counting_proof(0xe0);  // wraps around through 0xff
  m.rank = -1;
  m.world = 0x7fffffff;
  m.advertise = "fd00::1";
  m.port = 65535;
  m.node = "host-1234-abcdef01";
  m.host = "host.example";
  m.csr_pem = "-----BEGIN CERTIFICATE REQUEST-----\n" + std::string(1500, 'Q') +
              "\n-----END CERTIFICATE REQUEST-----\n";
  return m;
}

JoinAccept sample_accept(std::size_t members = 5) {
  JoinAccept m;
  m.rank = static_cast<std::int32_t>(members - 1);
  m.ca_pem = "-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----\n";
  m.cert_pem = std::string("cert\0with\0nuls", 14);
  for (std::size_t i = 0; i < members; ++i)
    m.members.push_back({"node-" + std::to_string(i),
                         i % 2 ? "[fd00::" + std::to_string(i) + "]:29400"
                               : "10.0.0." + std::to_string(i) + ":" + std::to_string(1000 + i)});
  return m;
}

JoinReject sample_reject() {
  JoinReject m;
  m.code = 0xbeef;
  m.reason = "rank 3 is already taken by node-7 (10.0.0.7:1007)";
  return m;
}

void expect_same(const SeedHello& a, const SeedHello& b) {
  EXPECT_EQ(a.proof, b.proof);
  EXPECT_EQ(a.cluster, b.cluster);
}
void expect_same(const JoinRequest& a, const JoinRequest& b) {
  EXPECT_EQ(a.proof, b.proof);
  EXPECT_EQ(a.rank, b.rank);
  EXPECT_EQ(a.world, b.world);
  EXPECT_EQ(a.advertise, b.advertise);
  EXPECT_EQ(a.port, b.port);
  EXPECT_EQ(a.node, b.node);
  EXPECT_EQ(a.host, b.host);
  EXPECT_EQ(a.csr_pem, b.csr_pem);
}
void expect_same(const JoinAccept& a, const JoinAccept& b) {
  EXPECT_EQ(a.rank, b.rank);
  EXPECT_EQ(a.ca_pem, b.ca_pem);
  EXPECT_EQ(a.cert_pem, b.cert_pem);
  ASSERT_EQ(a.members.size(), b.members.size());
  for (std::size_t i = 0; i < a.members.size(); ++i) {
    EXPECT_EQ(a.members[i].node, b.members[i].node) << "member " << i;
    EXPECT_EQ(a.members[i].addr, b.members[i].addr) << "member " << i;
  }
}
void expect_same(const JoinReject& a, const JoinReject& b) {
  EXPECT_EQ(a.code, b.code);
  EXPECT_EQ(a.reason, b.reason);
}

// Decodes `bytes` (which must be valid) as a T and compares it with `want`.
template <class T>
void expect_decodes_to(const SeedBytes& bytes, const T& want,
                       std::uint32_t limit = max_seed_reply) {
  std::string err;
  std::optional<SeedMessage> m = decode_seed_message(bytes.data(), bytes.size(), limit, err);
  ASSERT_TRUE(m.has_value()) << err;
  EXPECT_TRUE(err.empty()) << err;
  const T* got = std::get_if<T>(&*m);
  ASSERT_NE(got, nullptr) << "decoded as variant index " << m->index();
  expect_same(*got, want);
}

// Expects decode_seed_message to refuse `bytes`; returns its error text.
std::string seed_decode_error(const SeedBytes& bytes, std::uint32_t limit = max_seed_reply) {
  std::string err;
  std::optional<SeedMessage> m = decode_seed_message(bytes.data(), bytes.size(), limit, err);
  EXPECT_FALSE(m.has_value()) << "accepted " << bytes.size() << " bytes";
  EXPECT_FALSE(err.empty());
  return err;
}

void put_u32(SeedBytes& b, std::size_t at, std::uint32_t v) {
  for (int i = 0; i < 4; ++i)
    b[at + static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(v >> (8 * i));
}
void append_u32(SeedBytes& b, std::uint32_t v) {
  b.resize(b.size() + 4);
  put_u32(b, b.size() - 4, v);
}
void append_str(SeedBytes& b, const std::string& s) {
  append_u32(b, static_cast<std::uint32_t>(s.size()));
  b.insert(b.end(), s.begin(), s.end());
}
// A header for `type` and the given body, followed by it.
SeedBytes seed_frame(std::uint8_t type, const SeedBytes& body) {
  SeedBytes b = {'N', 'X', 'S', 'D', 1, type, 0, 0};
  append_u32(b, static_cast<std::uint32_t>(body.size()));
  b.insert(b.end(), body.begin(), body.end());
  return b;
}

// Feeds `stream` to a reader in pieces of the sizes `next_piece` returns; returns whether
// every feed succeeded and collects the messages.
template <class Next>
bool feed_in_pieces(SeedMessageReader& r, const SeedBytes& stream, Next next_piece,
                    std::vector<SeedMessage>& out) {
  std::size_t pos = 0;
  while (pos < stream.size()) {
    const std::size_t n = std::min(stream.size() - pos, std::max<std::size_t>(1, next_piece()));
    if (!r.feed(stream.data() + pos, n, out)) return false;
    pos += n;
  }
  return true;
}

std::vector<SeedBytes> all_samples() {
  return {encode(sample_hello()), encode(sample_request()), encode(sample_accept()),
          encode(sample_reject())};
}

TEST(SeedMessage, RoundTripEveryType) {
  expect_decodes_to(encode(sample_hello()), sample_hello());
  expect_decodes_to(encode(sample_request()), sample_request(), max_join_request);
  expect_decodes_to(encode(sample_accept()), sample_accept());
  expect_decodes_to(encode(sample_reject()), sample_reject());

  // Empty strings, a requested rank, and extreme integers.
  SeedHello h;
  expect_decodes_to(encode(h), h);
  JoinRequest q;
  q.rank = 2147483647;
  q.world = -2147483647 - 1;
  expect_decodes_to(encode(q), q);
  JoinAccept one = sample_accept(1);
  one.ca_pem.clear();
  one.cert_pem.clear();
  one.members[0] = {"", ""};
  expect_decodes_to(encode(one), one);
  JoinReject z;
  expect_decodes_to(encode(z), z);

  // A large member list and long strings survive too.
  JoinAccept big = sample_accept(3000);
  big.rank = 1234;
  big.cert_pem = std::string(100000, 'c');
  expect_decodes_to(encode(big), big);

  // The header names the type and the exact body length.
  for (const SeedBytes& b : all_samples()) {
    ASSERT_GE(b.size(), seed_header_size);
    const std::uint32_t len =
        static_cast<std::uint32_t>(b[8]) | static_cast<std::uint32_t>(b[9]) << 8 |
        static_cast<std::uint32_t>(b[10]) << 16 | static_cast<std::uint32_t>(b[11]) << 24;
    EXPECT_EQ(len, b.size() - seed_header_size);
  }
  EXPECT_EQ(encode(sample_hello())[5], static_cast<std::uint8_t>(SeedMsgType::hello));
  EXPECT_EQ(encode(sample_request())[5], static_cast<std::uint8_t>(SeedMsgType::join));
  EXPECT_EQ(encode(sample_accept())[5], static_cast<std::uint8_t>(SeedMsgType::accept));
  EXPECT_EQ(encode(sample_reject())[5], static_cast<std::uint8_t>(SeedMsgType::reject));
}

TEST(SeedMessage, GoldenBytes) {
  // Hand-written from the layout: "NXSD", version 1, type, two zero bytes, body length (u32
  // LE), then the fields little-endian, strings as u32 LE length + bytes.
  JoinReject rej;
  rej.code = 13;  // Errc::rejected
  rej.reason = "no";
  const SeedBytes want_reject = {'N', 'X', 'S', 'D', 1,   4,  0, 0, 8, 0, 0, 0,  // header
                                 13,  0,                                         // code
                                 2,   0,   0,   0,   'n', 'o'};                  // reason
  EXPECT_EQ(encode(rej), want_reject);

  JoinAccept acc;
  acc.rank = 1;
  acc.ca_pem = "C";
  acc.cert_pem = "";
  acc.members = {{"a", "1.2.3.4:5"}, {"b", "[::1]:6"}};
  const SeedBytes want_accept = {
      'N', 'X', 'S', 'D', 1,   3,   0,   0,   51,  0,   0,   0,         // header, body 51 bytes
      1,   0,   0,   0,                                                 // rank 1
      1,   0,   0,   0,   'C',                                          // ca
      0,   0,   0,   0,                                                 // cert (empty)
      2,   0,   0,   0,                                                 // 2 members
      1,   0,   0,   0,   'a',                                          // member 0 node
      9,   0,   0,   0,   '1', '.', '2', '.', '3', '.', '4', ':', '5',  // member 0 address
      1,   0,   0,   0,   'b',                                          // member 1 node
      7,   0,   0,   0,   '[', ':', ':', '1', ']', ':', '6'};           // member 1 address
  EXPECT_EQ(encode(acc), want_accept);

  JoinRequest req;
  req.proof = counting_proof(0);
  req.rank = -1;
  req.world = 258;
  req.port = 0x1234;
  req.node = "n";
  SeedBytes want_req = {'N', 'X', 'S', 'D', 1, 2, 0, 0, 59, 0, 0, 0};  // body 59 bytes
  for (std::uint8_t i = 0; i < 32; ++i) want_req.push_back(i);         // proof
  const SeedBytes rest = {0xff, 0xff, 0xff, 0xff,                      // rank -1
                          0x02, 0x01, 0x00, 0x00,                      // world 258
                          0,    0,    0,    0,                         // advertise ""
                          0x34, 0x12,                                  // port
                          1,    0,    0,    0,    'n',                 // node
                          0,    0,    0,    0,                         // host ""
                          0,    0,    0,    0};                        // csr ""
  want_req.insert(want_req.end(), rest.begin(), rest.end());
  EXPECT_EQ(encode(req), want_req);

  // And the hand-written bytes decode back.
  expect_decodes_to(want_reject, rej);
  expect_decodes_to(want_accept, acc);
  expect_decodes_to(want_req, req);
}

TEST(SeedMessage, EveryTruncationFailsCleanly) {
  for (const SeedBytes& full : all_samples()) {
    SCOPED_TRACE("type " + std::to_string(full[5]));
    for (std::size_t len = 0; len < full.size(); ++len) {
      // As is: shorter than the header, or a body shorter than the header says.
      SeedBytes cut(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(len));
      const std::string e1 = seed_decode_error(cut);
      if (len < seed_header_size)
        EXPECT_TRUE(contains(e1, "header")) << e1;
      else
        EXPECT_TRUE(contains(e1, "header says")) << e1;

      // With the header patched to the shorter body, the field decoder itself must notice.
      if (len >= seed_header_size) {
        put_u32(cut, 8, static_cast<std::uint32_t>(len - seed_header_size));
        const std::string e2 = seed_decode_error(cut);
        EXPECT_TRUE(contains(e2, "truncated") || contains(e2, "members") || contains(e2, "rank"))
            << "at " << len << ": " << e2;
      }

      // A reader given the prefix just waits for the rest (no message, no error).
      SeedMessageReader r(max_seed_reply);
      std::vector<SeedMessage> out;
      SeedBytes prefix(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(len));
      EXPECT_TRUE(r.feed(prefix.data(), prefix.size(), out)) << r.error();
      EXPECT_TRUE(out.empty());
      // ... and completes it when the rest comes.
      EXPECT_TRUE(r.feed(full.data() + len, full.size() - len, out)) << r.error();
      EXPECT_EQ(out.size(), 1u);
    }
  }
}

TEST(SeedMessage, BadHeaders) {
  const SeedBytes good = encode(sample_reject());
  auto with = [&](std::size_t at, std::uint8_t v) {
    SeedBytes b = good;
    b[at] = v;
    return b;
  };
  // Magic.
  for (std::size_t i = 0; i < 4; ++i) {
    const std::string e = seed_decode_error(with(i, static_cast<std::uint8_t>(good[i] ^ 0x20)));
    EXPECT_TRUE(contains(e, "magic")) << e;
  }
  // Version.
  for (std::uint8_t v : {0, 2, 255}) {
    const std::string e = seed_decode_error(with(4, v));
    EXPECT_TRUE(contains(e, "version " + std::to_string(v))) << e;
  }
  // Type.
  for (std::uint8_t t : {0, 5, 6, 255}) {
    const std::string e = seed_decode_error(with(5, t));
    EXPECT_TRUE(contains(e, "type " + std::to_string(t))) << e;
  }
  // Reserved bytes.
  for (std::size_t at : {std::size_t{6}, std::size_t{7}}) {
    const std::string e = seed_decode_error(with(at, 1));
    EXPECT_TRUE(contains(e, "reserved")) << e;
  }
  // The reader refuses the same headers as soon as it has them, and stays failed.
  for (const SeedBytes& b : {with(0, 'X'), with(4, 9), with(5, 0), with(7, 0x80)}) {
    SeedMessageReader r(max_seed_reply);
    std::vector<SeedMessage> out;
    EXPECT_FALSE(r.feed(b.data(), seed_header_size, out));
    EXPECT_FALSE(r.error().empty());
    EXPECT_TRUE(out.empty());
    EXPECT_FALSE(r.feed(good.data(), good.size(), out)) << "a failed reader accepted more";
    EXPECT_TRUE(out.empty());
  }
}

TEST(SeedMessage, BodyOverLimitRefusedFromHeader) {
  // A header claiming 4 GiB - 1 of body: refused at once, by both decoders, with only the
  // header in hand.
  SeedBytes huge = {'N', 'X', 'S', 'D', 1, 2, 0, 0, 0xff, 0xff, 0xff, 0xff};
  const std::string e = seed_decode_error(huge, max_join_request);
  EXPECT_TRUE(contains(e, "4294967295")) << e;
  EXPECT_TRUE(contains(e, std::to_string(max_join_request))) << e;
  for (std::uint32_t limit : {max_join_request, max_seed_reply}) {
    SeedMessageReader r(limit);
    std::vector<SeedMessage> out;
    EXPECT_FALSE(r.feed(huge.data(), huge.size(), out)) << "reader waits for a 4 GiB body";
    EXPECT_TRUE(contains(r.error(), "exceeds limit")) << r.error();
  }
  // Byte by byte: the refusal comes with the 12th byte, not later.
  {
    SeedMessageReader r(max_join_request);
    std::vector<SeedMessage> out;
    for (std::size_t i = 0; i + 1 < huge.size(); ++i) ASSERT_TRUE(r.feed(&huge[i], 1, out));
    EXPECT_FALSE(r.feed(&huge.back(), 1, out));
  }
  // The limit is inclusive: a body of exactly `limit` bytes is fine, one more is not.
  JoinReject rej;
  rej.reason = std::string(1000, 'r');
  const SeedBytes b = encode(rej);
  const auto body = static_cast<std::uint32_t>(b.size() - seed_header_size);
  expect_decodes_to(b, rej, body);
  const std::string e2 = seed_decode_error(b, body - 1);
  EXPECT_TRUE(contains(e2, "exceeds limit")) << e2;
  SeedMessageReader tight(body - 1);
  std::vector<SeedMessage> out;
  EXPECT_FALSE(tight.feed(b.data(), seed_header_size, out));
  // Joiners accept a large member list that a seed would refuse as a join request.
  const SeedBytes big = encode(sample_accept(20000));
  ASSERT_GT(big.size(), max_join_request + seed_header_size);
  seed_decode_error(big, max_join_request);
  expect_decodes_to(big, sample_accept(20000), max_seed_reply);
}

TEST(SeedMessage, TrailingBytes) {
  for (const SeedBytes& full : all_samples()) {
    SCOPED_TRACE("type " + std::to_string(full[5]));
    // Inside the body (the header counts them): the field decoder refuses them.
    for (std::size_t extra : {1u, 3u, 100u}) {
      SeedBytes b = full;
      b.insert(b.end(), extra, 0);
      put_u32(b, 8, static_cast<std::uint32_t>(b.size() - seed_header_size));
      const std::string e = seed_decode_error(b);
      EXPECT_TRUE(contains(e, std::to_string(extra) + " trailing bytes")) << e;
    }
    // After the body (the header does not count them): not one message.
    SeedBytes b = full;
    b.push_back(0);
    const std::string e = seed_decode_error(b);
    EXPECT_TRUE(contains(e, "header says")) << e;
  }
}

TEST(SeedMessage, AcceptValidation) {
  auto accept_body = [](std::int32_t rank, std::uint32_t count, std::size_t members_present) {
    SeedBytes body;
    append_u32(body, static_cast<std::uint32_t>(rank));
    append_str(body, "ca");
    append_str(body, "cert");
    append_u32(body, count);
    for (std::size_t i = 0; i < members_present; ++i) {
      const std::string index = std::to_string(i);  // "n" + temporary: GCC 12 -O3 -Wrestrict
      append_str(body, "n" + index);
      append_str(body, "10.0.0.1:" + std::to_string(i + 1));
    }
    return seed_frame(3, body);
  };
  // Sanity: the builder makes valid messages.
  {
    std::string err;
    ASSERT_TRUE(decode_seed_message(accept_body(2, 3, 3).data(), accept_body(2, 3, 3).size(),
                                    max_seed_reply, err))
        << err;
  }
  // rank >= members, negative rank.
  for (std::int32_t rank : {3, 4, 1000, 2147483647, -1, -2147483647 - 1}) {
    const std::string e = seed_decode_error(accept_body(rank, 3, 3));
    EXPECT_TRUE(contains(e, "rank " + std::to_string(rank))) << e;
  }
  // No members.
  {
    const std::string e = seed_decode_error(accept_body(0, 0, 0));
    EXPECT_TRUE(contains(e, "0 members")) << e;
  }
  // Counts larger than the body can hold: refused before anything is reserved for them.
  for (std::uint32_t count : {4u, 1000u, 1u << 20, (1u << 20) + 1, 0xffffffffu}) {
    const std::string e = seed_decode_error(accept_body(0, count, 3));
    EXPECT_TRUE(contains(e, "member")) << count << ": " << e;
  }
  // The encoder checks nothing, but the decoder does: encode(rank out of range) fails to decode.
  JoinAccept bad = sample_accept(2);
  bad.rank = 2;
  seed_decode_error(encode(bad));
  bad.members.clear();
  bad.rank = 0;
  seed_decode_error(encode(bad));
}

TEST(SeedMessage, StringLengthsBeyondBody) {
  // A string length field pointing past the body, in each string field of a reject and a
  // hello, including lengths near 2^32 that would wrap a careless bounds check.
  for (std::uint32_t len : {5u, 1000u, 0x7fffffffu, 0xfffffff0u, 0xffffffffu}) {
    SeedBytes body = {13, 0};
    append_u32(body, len);
    body.push_back('x');
    const std::string e = seed_decode_error(seed_frame(4, body));
    EXPECT_TRUE(contains(e, "truncated") && contains(e, "reason")) << e;

    SeedBytes hb(32, 0xaa);
    append_u32(hb, len);
    const std::string e2 = seed_decode_error(seed_frame(1, hb));
    EXPECT_TRUE(contains(e2, "truncated") && contains(e2, "cluster")) << e2;
  }
}

TEST(SeedMessage, ReaderPiecewiseYieldsSameMessages) {
  // Every message type, twice, back to back in one stream.
  SeedBytes stream;
  for (int round = 0; round < 2; ++round)
    for (const SeedBytes& b : all_samples()) stream.insert(stream.end(), b.begin(), b.end());

  auto check = [](const std::vector<SeedMessage>& out) {
    ASSERT_EQ(out.size(), 8u);
    for (int round = 0; round < 2; ++round) {
      const std::size_t o = static_cast<std::size_t>(round) * 4;
      ASSERT_NE(std::get_if<SeedHello>(&out[o]), nullptr);
      expect_same(std::get<SeedHello>(out[o]), sample_hello());
      ASSERT_NE(std::get_if<JoinRequest>(&out[o + 1]), nullptr);
      expect_same(std::get<JoinRequest>(out[o + 1]), sample_request());
      ASSERT_NE(std::get_if<JoinAccept>(&out[o + 2]), nullptr);
      expect_same(std::get<JoinAccept>(out[o + 2]), sample_accept());
      ASSERT_NE(std::get_if<JoinReject>(&out[o + 3]), nullptr);
      expect_same(std::get<JoinReject>(out[o + 3]), sample_reject());
    }
  };
  {  // one byte at a time
    SeedMessageReader r(max_seed_reply);
    std::vector<SeedMessage> out;
    ASSERT_TRUE(feed_in_pieces(
        r, stream, [] { return std::size_t{1}; }, out))
        << r.error();
    check(out);
  }
  {  // all at once
    SeedMessageReader r(max_seed_reply);
    std::vector<SeedMessage> out;
    ASSERT_TRUE(r.feed(stream.data(), stream.size(), out)) << r.error();
    check(out);
  }
  std::mt19937 rng(11);
  for (int trial = 0; trial < 50; ++trial) {  // random pieces, some crossing message bounds
    SeedMessageReader r(max_seed_reply);
    std::vector<SeedMessage> out;
    ASSERT_TRUE(feed_in_pieces(
        r, stream, [&] { return std::size_t{1} + rng() % 700; }, out))
        << r.error();
    check(out);
  }
  {  // an empty feed is harmless
    SeedMessageReader r(max_seed_reply);
    std::vector<SeedMessage> out;
    EXPECT_TRUE(r.feed(stream.data(), 0, out));
    EXPECT_TRUE(out.empty());
  }
}

TEST(SeedMessage, ReaderStopsAtFirstBadMessage) {
  // A good message, then a malformed one (valid header, garbage body), then a good one:
  // the reader hands out the first, fails on the second, and never yields the third.
  const SeedBytes good = encode(sample_reject());
  SeedBytes bad = seed_frame(4, SeedBytes{1, 2, 3});
  SeedBytes stream = good;
  stream.insert(stream.end(), bad.begin(), bad.end());
  stream.insert(stream.end(), good.begin(), good.end());
  for (std::size_t piece : {std::size_t{1}, std::size_t{7}, stream.size()}) {
    SeedMessageReader r(max_seed_reply);
    std::vector<SeedMessage> out;
    EXPECT_FALSE(feed_in_pieces(
        r, stream, [&] { return piece; }, out));
    EXPECT_TRUE(contains(r.error(), "truncated")) << r.error();
    ASSERT_EQ(out.size(), 1u);
    expect_same(std::get<JoinReject>(out[0]), sample_reject());
    EXPECT_FALSE(r.feed(good.data(), good.size(), out));
    EXPECT_EQ(out.size(), 1u);
  }
}

TEST(SeedMessage, GarbageNeverCrashes) {
  // Random bytes behind a valid header of every type and random body length: only clean
  // errors or well-formed messages (run under ASan/UBSan).
  std::mt19937_64 rng(99);
  for (int round = 0; round < 4000; ++round) {
    SeedBytes body(rng() % 200);
    for (auto& x : body) x = static_cast<std::uint8_t>(rng());
    if (round % 4 == 0 && body.size() >= 4) body[body.size() - 4] = 0;  // small lengths
    const auto type = static_cast<std::uint8_t>(1 + round % 4);
    SeedBytes b = seed_frame(type, body);
    std::string err;
    std::optional<SeedMessage> m = decode_seed_message(b.data(), b.size(), max_seed_reply, err);
    if (m) {
      EXPECT_EQ(m->index() + 1, type);
    } else {
      EXPECT_FALSE(err.empty());
    }
    SeedMessageReader r(max_seed_reply);
    std::vector<SeedMessage> out;
    const bool ok = feed_in_pieces(
        r, b, [&] { return std::size_t{1} + rng() % 16; }, out);
    EXPECT_EQ(ok, m.has_value());
    EXPECT_EQ(out.size(), m ? 1u : 0u);
  }
}

}  // namespace
}  // namespace nexar::wire
