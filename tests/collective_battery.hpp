// A battery of every collective, checked against references computed here without
// communication, for tests that move a pair's bytes over another carrier (stripes_test.cpp,
// shard_test.cpp, tcp_link_test.cpp): deterministic values any rank can compute for any
// other, from 0 elements to several MiB not divisible by the world, and several operations
// in flight at once.
#pragma once

#include <nexar/nexar.hpp>

#include <gtest/gtest.h>

#include "support.hpp"

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

namespace nexar::testing::battery {

using nexar::Communicator;
using nexar::ReduceOp;
using nexar::testing::on_every_rank;

// Values of rank r for a test case: deterministic, so any rank can compute anyone's.
inline std::vector<std::int64_t> values(std::size_t n, int r, std::uint64_t salt) {
  std::mt19937_64 g(salt * 131 + static_cast<std::uint64_t>(r));
  std::vector<std::int64_t> v(n);
  for (auto& x : v) x = static_cast<std::int64_t>(g() >> 24);
  return v;
}

inline std::vector<std::int64_t> sum_of_all(std::size_t n, int world, std::uint64_t salt) {
  std::vector<std::int64_t> want(n, 0);
  for (int q = 0; q < world; ++q) {
    const auto v = values(n, q, salt);
    for (std::size_t i = 0; i < n; ++i) want[i] += v[i];
  }
  return want;
}

// Every collective on 3 ranks (odd), sizes from 0 elements to several MiB not divisible
// by the world: results equal a reference computed here.
inline void every_collective_exact(std::vector<Communicator>& comms) {
  constexpr int world = 3;
  ASSERT_EQ(comms.size(), std::size_t{world});
  on_every_rank(comms, [&](int r) {
    Communicator& c = comms[static_cast<std::size_t>(r)];
    std::uint64_t salt = 0;
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{4099}, std::size_t{700001}}) {
      ++salt;
      auto v = values(n, r, salt);
      c.all_reduce(v, ReduceOp::sum);
      EXPECT_EQ(v, sum_of_all(n, world, salt)) << "all_reduce of " << n;

      ++salt;
      auto b = values(n, 1, salt);
      if (r != 1) std::fill(b.begin(), b.end(), 0);
      c.broadcast(b, 1);
      EXPECT_EQ(b, values(n, 1, salt)) << "broadcast of " << n;

      ++salt;
      std::vector<std::int64_t> all(n * world);
      c.all_gather(values(n, r, salt), all);
      for (int q = 0; q < world; ++q) {
        const auto want = values(n, q, salt);
        EXPECT_TRUE(std::equal(want.begin(), want.end(), all.begin() + static_cast<std::ptrdiff_t>(n * q)))
            << "all_gather of " << n << ", block of rank " << q;
      }

      ++salt;
      std::vector<std::int64_t> mine(n);
      c.reduce_scatter(values(n * world, r, salt), mine, ReduceOp::sum);
      const auto total = sum_of_all(n * world, world, salt);
      EXPECT_TRUE(std::equal(mine.begin(), mine.end(), total.begin() + static_cast<std::ptrdiff_t>(n * r)))
          << "reduce_scatter of " << n;

      ++salt;
      std::vector<std::int64_t> got(n * world);
      c.all_to_all(values(n * world, r, salt), got);
      for (int q = 0; q < world; ++q) {
        const auto theirs = values(n * world, q, salt);
        EXPECT_TRUE(std::equal(got.begin() + static_cast<std::ptrdiff_t>(n * q),
                               got.begin() + static_cast<std::ptrdiff_t>(n * (q + 1)),
                               theirs.begin() + static_cast<std::ptrdiff_t>(n * r)))
            << "all_to_all of " << n << ", block from rank " << q;
      }
    }
    // Several collectives in flight at once on one communicator, under different tags.
    std::vector<std::vector<std::int64_t>> bufs;
    for (int k = 0; k < 4; ++k) bufs.push_back(values(300007 + static_cast<std::size_t>(k), r, 100 + static_cast<std::uint64_t>(k)));
    std::vector<nexar::Request> reqs;
    for (auto& b : bufs) reqs.push_back(c.iall_reduce(b, ReduceOp::sum));
    for (auto& q : reqs) q.wait();
    for (int k = 0; k < 4; ++k)
      EXPECT_EQ(bufs[static_cast<std::size_t>(k)], sum_of_all(300007 + static_cast<std::size_t>(k), world, 100 + static_cast<std::uint64_t>(k)))
          << "concurrent all_reduce " << k;
    c.barrier();
  });
}

}  // namespace nexar::testing::battery
