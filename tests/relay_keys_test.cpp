// Tests of the relay key derivation (src/cluster/relay_keys.*): one key per pair, the same
// from both ends, different for every other pair, name and master, a fixed known answer,
// whole rows as the seed hands them out, and the keys plan_local gives in-process clusters.
#include "cluster/relay_keys.hpp"

#include <gtest/gtest.h>
#include <gnutls/crypto.h>

#include <nexar/error.hpp>

#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "cluster/local.hpp"

namespace nexar::cluster {
namespace {

RelayMaster counting_master(std::uint8_t first) {
  RelayMaster m{};
  for (std::size_t i = 0; i < m.size(); ++i) m[i] = static_cast<std::uint8_t>(first + i);
  return m;
}

bool zero(const detail::RelayKey& k) {
  return std::all_of(k.begin(), k.end(), [](std::uint8_t b) { return b == 0; });
}

std::vector<std::string> names_of(int n) {
  std::vector<std::string> names;
  for (int r = 0; r < n; ++r) names.push_back("host-" + std::to_string(r) + "-4242-0badf00d");
  return names;
}

TEST(RelayKeys, SymmetricInThePair) {
  const RelayMaster m = counting_master(1);
  const auto names = names_of(9);
  for (int a = 0; a < 9; ++a) {
    for (int b = 0; b < 9; ++b) {
      if (a == b) continue;
      const auto& na = names[static_cast<std::size_t>(a)];
      const auto& nb = names[static_cast<std::size_t>(b)];
      EXPECT_EQ(relay_key(m, a, na, b, nb), relay_key(m, b, nb, a, na)) << a << "," << b;
    }
  }
}

TEST(RelayKeys, DiffersPerPairNameAndMaster) {
  const RelayMaster m = counting_master(1);
  const int n = 40;
  const auto names = names_of(n);
  std::set<detail::RelayKey> seen;
  for (int a = 0; a < n; ++a) {
    for (int b = a + 1; b < n; ++b) {
      const auto k = relay_key(m, a, names[static_cast<std::size_t>(a)], b, names[static_cast<std::size_t>(b)]);
      EXPECT_FALSE(zero(k));
      EXPECT_TRUE(seen.insert(k).second) << "pair " << a << "," << b << " repeats a key";
    }
  }
  EXPECT_EQ(seen.size(), static_cast<std::size_t>(n * (n - 1) / 2));

  const auto k01 = relay_key(m, 0, "a", 1, "b");
  // Another master, even one bit apart.
  RelayMaster m2 = m;
  m2[31] ^= 1;
  EXPECT_NE(relay_key(m2, 0, "a", 1, "b"), k01);
  EXPECT_NE(relay_key(counting_master(2), 0, "a", 1, "b"), k01);
  EXPECT_NE(relay_key(random_relay_master(), 0, "a", 1, "b"), k01);
  // The same ranks under other names (a rank is never reused, but a key is bound to both).
  EXPECT_NE(relay_key(m, 0, "a", 1, "c"), k01);
  EXPECT_NE(relay_key(m, 0, "c", 1, "b"), k01);
  EXPECT_NE(relay_key(m, 0, "b", 1, "a"), k01) << "names swapped between the ranks";
  // The same names under other ranks.
  EXPECT_NE(relay_key(m, 0, "a", 2, "b"), k01);
  EXPECT_NE(relay_key(m, 1, "a", 2, "b"), k01);
  // Where one name ends and the next begins matters.
  EXPECT_NE(relay_key(m, 0, "ab", 1, "c"), relay_key(m, 0, "a", 1, "bc"));
  // Ranks in the full 16-bit range of world ranks and beyond.
  EXPECT_NE(relay_key(m, 0, "a", 65535, "b"), relay_key(m, 0, "a", 65536, "b"));
  EXPECT_NE(relay_key(m, 256, "a", 1, "b"), relay_key(m, 1, "a", 256, "b"));
}

TEST(RelayKeys, KnownAnswer) {
  // HMAC-SHA256(master, "nexar relay key v1" || u32le 2 || u32le 5 || "lo" || 0x00 || "hi"),
  // computed here with GnuTLS from the documented layout: the derivation must not drift
  // (keys are derived only on the seed, but PROTOCOL.md documents them).
  const RelayMaster m = counting_master(0x40);
  const std::string msg = std::string("nexar relay key v1") + std::string("\x02\0\0\0\x05\0\0\0", 8) + "lo" +
                          std::string(1, '\0') + "hi";
  detail::RelayKey want{};
  ASSERT_EQ(gnutls_hmac_fast(GNUTLS_MAC_SHA256, m.data(), m.size(), msg.data(), msg.size(), want.data()), 0);
  EXPECT_EQ(relay_key(m, 2, "lo", 5, "hi"), want);
  EXPECT_EQ(relay_key(m, 5, "hi", 2, "lo"), want);
  // And the bytes themselves, from an independent HMAC-SHA256 (Python's hmac module).
  const detail::RelayKey golden = {0x3b, 0x09, 0x54, 0x8e, 0x5a, 0x85, 0x1a, 0xec, 0x95, 0x30, 0x22,
                                   0xe5, 0x69, 0x3d, 0x4d, 0x73, 0x57, 0x97, 0x66, 0x93, 0xaf, 0xbe,
                                   0xe3, 0xe6, 0x7f, 0x46, 0x31, 0xa7, 0xe5, 0xa0, 0x78, 0x0b};
  EXPECT_EQ(want, golden);
}

TEST(RelayKeys, RowsAsTheSeedHandsThemOut) {
  const RelayMaster m = random_relay_master();
  const int n = 7;
  const auto names = names_of(n);
  std::vector<std::vector<detail::RelayKey>> rows;
  for (int r = 0; r < n; ++r) rows.push_back(relay_keys_of(m, r, names));
  for (int a = 0; a < n; ++a) {
    const auto& row = rows[static_cast<std::size_t>(a)];
    ASSERT_EQ(row.size(), static_cast<std::size_t>(n));
    EXPECT_TRUE(zero(row[static_cast<std::size_t>(a)])) << "rank " << a << " holds a key for itself";
    for (int b = 0; b < n; ++b) {
      if (a == b) continue;
      EXPECT_FALSE(zero(row[static_cast<std::size_t>(b)]));
      // Both ends hold the same key, and it is the pair's.
      EXPECT_EQ(row[static_cast<std::size_t>(b)], rows[static_cast<std::size_t>(b)][static_cast<std::size_t>(a)]);
      EXPECT_EQ(row[static_cast<std::size_t>(b)],
                relay_key(m, a, names[static_cast<std::size_t>(a)], b, names[static_cast<std::size_t>(b)]));
    }
  }
  // A row names no other pair's key: rank 0's keys are none of rank 1's other keys.
  for (int b = 2; b < n; ++b) {
    EXPECT_EQ(std::count(rows[0].begin(), rows[0].end(), rows[1][static_cast<std::size_t>(b)]), 0) << b;
  }
  // A world of one has nobody to share a key with.
  const auto alone = relay_keys_of(m, 0, {"solo"});
  ASSERT_EQ(alone.size(), 1u);
  EXPECT_TRUE(zero(alone[0]));
}

TEST(RelayKeys, RefusesWhatIsNotAPair) {
  const RelayMaster m = counting_master(1);
  for (auto [a, b] : {std::pair{3, 3}, std::pair{0, 0}, std::pair{-1, 2}, std::pair{2, -1}}) {
    try {
      relay_key(m, a, "x", b, "y");
      ADD_FAILURE() << a << "," << b << " gave a key";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::invalid_argument) << e.what();
    }
  }
  for (int rank : {-1, 3, 100}) {
    try {
      relay_keys_of(m, rank, {"a", "b", "c"});
      ADD_FAILURE() << "rank " << rank << " of 3 got keys";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::invalid_argument) << e.what();
    }
  }
}

TEST(RelayKeys, MastersAreRandom) {
  std::set<RelayMaster> seen;
  for (int i = 0; i < 16; ++i) EXPECT_TRUE(seen.insert(random_relay_master()).second);
}

TEST(RelayKeys, PlanLocalGivesEveryRankItsRow) {
  // In-process clusters: the plans carry each pair's key in both rows, nothing for a rank
  // itself, and a new plan (a new job) has new keys.
  const Config cfg;
  auto plans = plan_local(5, cfg);
  auto again = plan_local(5, cfg);
  for (int a = 0; a < 5; ++a) {
    const auto& row = plans[static_cast<std::size_t>(a)].relay_keys;
    ASSERT_EQ(row.size(), 5u);
    EXPECT_TRUE(zero(row[static_cast<std::size_t>(a)]));
    for (int b = 0; b < 5; ++b) {
      if (a == b) continue;
      EXPECT_FALSE(zero(row[static_cast<std::size_t>(b)]));
      EXPECT_EQ(row[static_cast<std::size_t>(b)], plans[static_cast<std::size_t>(b)].relay_keys[static_cast<std::size_t>(a)]);
      EXPECT_NE(row[static_cast<std::size_t>(b)], again[static_cast<std::size_t>(a)].relay_keys[static_cast<std::size_t>(b)]);
    }
  }
  std::set<detail::RelayKey> distinct;
  for (std::size_t a = 0; a < 5; ++a) {
    for (std::size_t b = a + 1; b < 5; ++b) distinct.insert(plans[a].relay_keys[b]);
  }
  EXPECT_EQ(distinct.size(), 10u);
  discard(plans, -1);
  discard(again, -1);
}

}  // namespace
}  // namespace nexar::cluster
