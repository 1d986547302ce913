// Tests of the agreement and welcome payloads (src/wire/ballot.*): golden bytes, round trips
// of ballots with failed, joining and leaving ranks, and every way a payload can be refused
// (short, truncated, counts beyond the bytes or the world, order, bounds, trailing bytes);
// the member list of a welcome frame likewise.
#include "wire/ballot.hpp"

#include <gtest/gtest.h>

#include "support.hpp"

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace nexar::wire {
namespace {

using nexar::testing::contains;
using Bytes = std::vector<std::byte>;
using Ranks = std::vector<std::uint32_t>;

Bytes bytes(std::initializer_list<int> v) {
  Bytes b;
  for (int x : v) b.push_back(static_cast<std::byte>(x));
  return b;
}

void append_u32(Bytes& b, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) b.push_back(static_cast<std::byte>(v >> (8 * i)));
}

// A ballot payload written by hand: value, then each list as count + ranks, as given (not
// checked), then `extra` bytes.
Bytes raw_ballot(std::uint64_t value, const Ranks& failed, const Ranks& joiners, const Ranks& leaving,
                 std::size_t extra = 0) {
  Bytes b;
  for (int i = 0; i < 8; ++i) b.push_back(static_cast<std::byte>(value >> (8 * i)));
  for (const Ranks* l : {&failed, &joiners, &leaving}) {
    append_u32(b, static_cast<std::uint32_t>(l->size()));
    for (std::uint32_t r : *l) append_u32(b, r);
  }
  b.insert(b.end(), extra, std::byte{0});
  return b;
}

// Expects decode_ballot to refuse `in`, leaving `out` untouched; returns the error.
std::string ballot_error(const Bytes& in, std::uint32_t world) {
  Ballot out;
  out.value = 42;
  out.failed = {9};
  const Ballot before = out;
  DecodeError e = decode_ballot(in, world, out);
  EXPECT_TRUE(e) << "accepted " << in.size() << " bytes";
  EXPECT_EQ(out, before) << "a refused ballot changed the output";
  return e.error;
}

std::string members_error(const Bytes& in, std::uint32_t world) {
  Ranks out = {77};
  DecodeError e = decode_members(in, world, out);
  EXPECT_TRUE(e) << "accepted " << in.size() << " bytes";
  EXPECT_EQ(out, Ranks{77}) << "a refused member list changed the output";
  return e.error;
}

Ballot sample() {
  Ballot b;
  b.value = 0x0123456789abcdefull;
  b.failed = {1, 5};
  b.joiners = {8, 9, 12};
  b.leaving = {3};
  return b;
}

TEST(Ballot, GoldenBytes) {
  Ballot b;
  b.value = 0x0102030405060708ull;
  b.failed = {2};
  b.joiners = {4, 0x01000005};
  b.leaving = {};
  const Bytes want = bytes({8, 7, 6, 5, 4, 3, 2, 1,  // value, little-endian
                            1, 0, 0, 0, 2, 0, 0, 0,  // failed: 1 rank, 2
                            2, 0, 0, 0, 4, 0, 0, 0,  // joiners: 2 ranks, 4 ...
                            5, 0, 0, 1,              // ... and 0x01000005
                            0, 0, 0, 0});            // leaving: none
  EXPECT_EQ(encode_ballot(b), want);
  Ballot out;
  ASSERT_FALSE(decode_ballot(want, 0x01000006, out));
  EXPECT_EQ(out, b);

  // The smallest ballot: a value and three empty lists.
  EXPECT_EQ(encode_ballot(Ballot{}).size(), 20u);
  EXPECT_EQ(encode_members({7, 3}), bytes({2, 0, 0, 0, 7, 0, 0, 0, 3, 0, 0, 0}));
}

TEST(Ballot, RoundTrips) {
  const Ballot s = sample();
  for (std::uint32_t world : {13u, 14u, 1000u, 0xffffffffu}) {
    Ballot out;
    DecodeError e = decode_ballot(encode_ballot(s), world, out);
    ASSERT_FALSE(e) << world << ": " << e.error;
    EXPECT_EQ(out, s);
  }
  // Each list alone, the others empty; the extreme value; a one-rank world.
  for (int which = 0; which < 3; ++which) {
    Ballot b;
    b.value = ~std::uint64_t{0};
    Ranks& l = which == 0 ? b.failed : which == 1 ? b.joiners : b.leaving;
    l = {0, 2, 4, 6};
    Ballot out;
    ASSERT_FALSE(decode_ballot(encode_ballot(b), 7, out)) << which;
    EXPECT_EQ(out, b);
  }
  Ballot one;
  one.leaving = {0};
  Ballot out;
  ASSERT_FALSE(decode_ballot(encode_ballot(one), 1, out));
  EXPECT_EQ(out, one);

  // Every rank of a world in one list, and a ballot the size of max_ballot_payload.
  Ballot all;
  for (std::uint32_t r = 0; r < 300; ++r) all.joiners.push_back(r);
  ASSERT_FALSE(decode_ballot(encode_ballot(all), 300, out));
  EXPECT_EQ(out, all);
  Ballot big;
  for (std::uint32_t r = 0; r < (1u << 18); ++r) big.failed.push_back(r);
  EXPECT_EQ(encode_ballot(big).size(), max_ballot_payload);
  ASSERT_FALSE(decode_ballot(encode_ballot(big), 1u << 18, out));
  EXPECT_EQ(out.failed.size(), 1u << 18);
}

TEST(Ballot, ShortAndTruncated) {
  for (std::size_t n : {0u, 1u, 8u, 19u}) {
    const std::string e = ballot_error(Bytes(n), 16);
    EXPECT_TRUE(contains(e, std::to_string(n) + " bytes is shorter than 20")) << e;
  }
  // Every prefix of a valid ballot is refused (a list's count or ranks are cut short).
  const Bytes full = encode_ballot(sample());
  for (std::size_t n = 20; n < full.size(); ++n) {
    const std::string e = ballot_error(Bytes(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(n)), 16);
    EXPECT_TRUE(contains(e, "ballot")) << n << ": " << e;
  }
  // A count needing more bytes than are left, in each list, up to counts near 2^32.
  for (std::uint32_t count : {3u, 1000u, 0x40000000u, 0xffffffffu}) {
    Bytes b = raw_ballot(0, {}, {}, {});
    for (std::size_t list = 0; list < 3; ++list) {
      Bytes c = b;
      for (int i = 0; i < 4; ++i) c[8 + 4 * list + static_cast<std::size_t>(i)] = static_cast<std::byte>(count >> (8 * i));
      const std::string e = ballot_error(c, 0xffffffffu);
      EXPECT_TRUE(contains(e, "names " + std::to_string(count))) << e;
    }
  }
  // One list cut off after the previous one: the error names the list whose count is missing.
  Bytes cut = raw_ballot(0, {1}, {}, {});
  cut.resize(cut.size() - 4);  // leaving's count gone
  EXPECT_TRUE(contains(ballot_error(cut, 16), "leaving ranks count"));
}

TEST(Ballot, OrderBoundsAndTrailingBytes) {
  const char* names[] = {"failed ranks", "joiners", "leaving ranks"};
  for (int which = 0; which < 3; ++which) {
    SCOPED_TRACE(names[which]);
    auto with = [&](const Ranks& l, std::size_t extra = 0) {
      return raw_ballot(5, which == 0 ? l : Ranks{}, which == 1 ? l : Ranks{}, which == 2 ? l : Ranks{}, extra);
    };
    // Strictly ascending: a repeat or a step down is refused, wherever it is.
    for (const Ranks& l : {Ranks{3, 3}, Ranks{4, 2}, Ranks{0, 1, 2, 2}, Ranks{1, 5, 4}}) {
      const std::string e = ballot_error(with(l), 16);
      EXPECT_TRUE(contains(e, std::string(names[which]) + " are not strictly ascending")) << e;
    }
    // Ranks below the world only.
    for (std::uint32_t r : {16u, 17u, 0xffffffffu}) {
      const std::string e = ballot_error(with({0, r}), 16);
      EXPECT_TRUE(contains(e, std::string(names[which]) + " rank " + std::to_string(r) + " in a world of 16")) << e;
    }
    // More ranks than the world has (with the bytes for them present).
    Ranks many;
    for (std::uint32_t r = 0; r < 5; ++r) many.push_back(r);
    const std::string e = ballot_error(with(many), 4);
    EXPECT_TRUE(contains(e, "names 5 " + std::string(names[which]) + " in a world of 4")) << e;
    // Bytes after the last list.
    for (std::size_t extra : {1u, 3u, 4u, 100u}) {
      const std::string t = ballot_error(with({1, 2}, extra), 16);
      EXPECT_TRUE(contains(t, std::to_string(extra) + " bytes after its lists")) << t;
    }
  }
  // The same rank may appear in different lists (the decoder checks each list alone); the
  // agreement's rules on them are not the codec's business.
  Ballot out;
  EXPECT_FALSE(decode_ballot(raw_ballot(0, {2}, {2}, {2}), 3, out));
  // A world of zero admits only empty lists.
  EXPECT_FALSE(decode_ballot(raw_ballot(0, {}, {}, {}), 0, out));
  EXPECT_TRUE(contains(ballot_error(raw_ballot(0, {}, {0}, {}), 0), "world of 0"));
}

TEST(Ballot, GarbageNeverCrashes) {
  // Random payloads, some with small counts so that the list decoding is reached: only clean
  // errors or ballots that re-encode to the same bytes (run under ASan/UBSan).
  std::mt19937_64 rng(15);
  for (int round = 0; round < 20000; ++round) {
    Bytes b(rng() % 64);
    for (auto& x : b) x = static_cast<std::byte>(rng() % (round % 2 ? 256 : 4));
    Ballot out;
    if (!decode_ballot(b, 1 + static_cast<std::uint32_t>(rng() % 8), out)) {
      EXPECT_EQ(encode_ballot(out), b);
    }
    Ranks m;
    if (!decode_members(b, 1 + static_cast<std::uint32_t>(rng() % 8), m)) {
      EXPECT_EQ(encode_members(m), b);
    }
  }
}

// ---- welcome member lists ---------------------------------------------------------------

TEST(Members, RoundTripKeepsOrder) {
  // Rank order of the new communicator: old members in their order, joiners after; not
  // sorted by world rank.
  for (const Ranks& m : {Ranks{0}, Ranks{0, 1, 2, 3, 4, 5}, Ranks{5, 0, 3, 9, 7}, Ranks{65535, 2}}) {
    Ranks out;
    DecodeError e = decode_members(encode_members(m), 65536, out);
    ASSERT_FALSE(e) << e.error;
    EXPECT_EQ(out, m);
  }
  Ranks all;
  for (std::uint32_t r = max_node_ids; r-- > 0;) all.push_back(r);
  const Bytes b = encode_members(all);
  EXPECT_LE(b.size(), max_ballot_payload);  // a welcome of every possible rank fits its frame
  Ranks out;
  ASSERT_FALSE(decode_members(b, max_node_ids, out));
  EXPECT_EQ(out, all);
}

TEST(Members, Refusals) {
  // Empty, repeated, out-of-world.
  EXPECT_TRUE(contains(members_error(encode_members({}), 4), "empty"));
  for (const Ranks& m : {Ranks{1, 1}, Ranks{0, 2, 3, 2}, Ranks{3, 0, 1, 2, 0}}) {
    EXPECT_TRUE(contains(members_error(encode_members(m), 8), "names a rank twice"));
  }
  for (std::uint32_t r : {4u, 5u, 0xffffffffu}) {
    const std::string e = members_error(encode_members({0, r}), 4);
    EXPECT_TRUE(contains(e, "members rank " + std::to_string(r) + " in a world of 4")) << e;
  }
  EXPECT_TRUE(contains(members_error(encode_members({0, 1, 2, 3, 0}), 4), "names 5 members in a world of 4"));
  // Short, truncated, counts beyond the bytes, trailing bytes.
  for (std::size_t n : {0u, 1u, 3u}) EXPECT_TRUE(contains(members_error(Bytes(n), 4), "count"));
  const Bytes full = encode_members({2, 0, 1});
  for (std::size_t n = 4; n < full.size(); ++n) {
    const std::string e = members_error(Bytes(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(n)), 4);
    EXPECT_TRUE(contains(e, "names 3 members in")) << n << ": " << e;
  }
  for (std::uint32_t count : {4u, 0x40000000u, 0xffffffffu}) {
    Bytes b = full;
    for (int i = 0; i < 4; ++i) b[static_cast<std::size_t>(i)] = static_cast<std::byte>(count >> (8 * i));
    EXPECT_TRUE(contains(members_error(b, 0xffffffffu), "names " + std::to_string(count)));
  }
  for (std::size_t extra : {1u, 4u, 9u}) {
    Bytes b = full;
    b.insert(b.end(), extra, std::byte{0});
    const std::string e = members_error(b, 4);
    EXPECT_TRUE(contains(e, std::to_string(extra) + " bytes after it")) << e;
  }
}

}  // namespace
}  // namespace nexar::wire
