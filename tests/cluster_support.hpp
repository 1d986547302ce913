// Helpers shared by the tests of forming clusters through a seed (seed_test.cpp,
// join_test.cpp): quick configurations and options, joiners on their own threads, and a
// check that a set of communicators works as one cluster.
//
// Against the real QUIC stack on loopback: seeds listen on 127.0.0.1:0 (or [::1]:0), joiners
// run on their own threads. Timeouts are short so that every failure is prompt.
#pragma once

#include <nexar/cluster.hpp>
#include <nexar/communicator.hpp>
#include <nexar/error.hpp>

#include <gtest/gtest.h>

#include "support.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <future>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

namespace nexar::testing {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

inline nexar::Config fast_config() {
  nexar::Config c;
  c.connect_timeout = 5s;
  c.idle_timeout = 5s;
  c.op_timeout = 10s;
  c.rpc_timeout = 10s;
  c.log_level = nexar::LogLevel::off;  // refusals below are expected; keep quiet
  return c;
}

inline constexpr const char* kToken = "seed-test-token";

inline SeedOptions seed_opts(int world, std::string listen = "127.0.0.1:0") {
  SeedOptions o;
  o.listen = std::move(listen);
  o.world = world;
  o.formation_timeout = 15s;
  o.token = kToken;
  return o;
}

inline JoinOptions join_opts(const Seed& s, int rank = -1, int world = 0) {
  JoinOptions o;
  o.seed = s.address();
  o.token = s.token();
  o.rank = rank;
  o.world = world;
  o.join_timeout = 15s;
  return o;
}

inline std::chrono::milliseconds ms_since(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
}

// What one join() call ended with.
struct Joined {
  std::optional<Communicator> comm;
  Errc code = Errc::ok;
  std::string what;
  std::chrono::milliseconds took{0};
  Clock::time_point ended{};
};

inline std::future<Joined> start_join(JoinOptions o, nexar::Config cfg = fast_config()) {
  return std::async(std::launch::async, [o = std::move(o), cfg] {
    Joined j;
    const auto t0 = Clock::now();
    try {
      j.comm.emplace(nexar::join(o, cfg));
    } catch (const Error& e) {
      j.code = e.code();
      j.what = e.what();
    } catch (const std::exception& e) {
      j.code = Errc::cancelled;  // not a nexar::Error: no test expects this code
      j.what = std::string("not a nexar::Error: ") + e.what();
    }
    j.ended = Clock::now();
    j.took = std::chrono::duration_cast<std::chrono::milliseconds>(j.ended - t0);
    return j;
  });
}

// The joiner's result; a joiner still running after `limit` fails the test (join() has its
// own deadline, so get() still returns).
inline Joined finish(std::future<Joined>& f, std::chrono::seconds limit = 25s) {
  EXPECT_EQ(f.wait_for(limit), std::future_status::ready)
      << "joiner still running after " << limit.count() << " s";
  return f.get();
}

// Expects the joiner to have failed with `code` within `within`; returns its message.
inline std::string expect_join_error(std::future<Joined>& f, Errc code, std::chrono::milliseconds within) {
  Joined j = finish(f);
  EXPECT_FALSE(j.comm.has_value()) << "joined as rank " << j.comm->rank();
  EXPECT_EQ(j.code, code) << "got " << nexar::to_string(j.code) << ": " << j.what;
  EXPECT_LT(j.took, within) << j.what;
  EXPECT_TRUE(contains(j.what, "join")) << j.what;
  std::printf("refused as expected after %lld ms: %s\n", static_cast<long long>(j.took.count()),
              j.what.c_str());
  return j.what;
}

// Checks that `comms` (one per rank, in any order) form one working cluster: distinct ranks
// 0..n-1, and an all_reduce and a ring of point-to-point messages give the right results on
// every rank.
inline void expect_working_cluster(const std::vector<Communicator>& comms) {
  const int n = static_cast<int>(comms.size());
  std::set<int> ranks;
  for (const Communicator& c : comms) {
    ASSERT_TRUE(c.is_open());
    EXPECT_EQ(c.size(), n);
    ranks.insert(c.rank());
  }
  ASSERT_EQ(ranks.size(), comms.size()) << "ranks are not distinct";
  ASSERT_EQ(*ranks.begin(), 0);
  ASSERT_EQ(*ranks.rbegin(), n - 1);

  std::vector<std::future<std::string>> work;
  for (const Communicator& comm : comms) {
    work.push_back(
        std::async(std::launch::async, [comm = Communicator(comm), n]() mutable -> std::string {
          try {
            const int r = comm.rank();
            // Element i on rank r is (r + 1) * (i + 1): the sum is (i + 1) * n (n + 1) / 2.
            std::vector<std::int64_t> v(4096);
            for (std::size_t i = 0; i < v.size(); ++i)
              v[i] = (r + 1) * static_cast<std::int64_t>(i + 1);
            comm.all_reduce(std::span<std::int64_t>(v), nexar::ReduceOp::sum);
            for (std::size_t i = 0; i < v.size(); ++i) {
              const std::int64_t want = static_cast<std::int64_t>(i + 1) * n * (n + 1) / 2;
              if (v[i] != want)
                return "rank " + std::to_string(r) + ": all_reduce[" + std::to_string(i) +
                       "] = " + std::to_string(v[i]) + ", expected " + std::to_string(want);
            }
            if (n == 1) return {};
            // A ring: each rank sends its own pattern to the next and checks the previous one's.
            const int next = (r + 1) % n, prev = (r + n - 1) % n;
            auto pattern = [](int from) {
              std::vector<std::uint8_t> p(10000 + static_cast<std::size_t>(from));
              for (std::size_t i = 0; i < p.size(); ++i)
                p[i] = static_cast<std::uint8_t>(i * 7 + static_cast<std::size_t>(from));
              return p;
            };
            const std::vector<std::uint8_t> mine = pattern(r), want = pattern(prev);
            std::vector<std::uint8_t> got(want.size() + 100);
            nexar::Request rr = comm.irecv(prev, 7, got.data(), got.size());
            comm.send(next, 7, mine.data(), mine.size());
            const nexar::Status st = rr.wait();
            if (st.bytes != want.size() || !std::equal(want.begin(), want.end(), got.begin()))
              return "rank " + std::to_string(r) + ": wrong message from rank " +
                     std::to_string(prev);
            comm.barrier();
            return {};
          } catch (const std::exception& e) {
            return std::string("exception: ") + e.what();
          }
        }));
  }
  for (auto& w : work) {
    ASSERT_EQ(w.wait_for(30s), std::future_status::ready) << "a rank hangs in the exchange";
    const std::string e = w.get();
    EXPECT_TRUE(e.empty()) << e;
  }
}

// The communicators of joiners that must all have succeeded.
inline std::vector<Communicator> joined_all(std::vector<std::future<Joined>>& fs) {
  std::vector<Communicator> out;
  for (auto& f : fs) {
    Joined j = finish(f);
    EXPECT_EQ(j.code, Errc::ok) << j.what;
    if (j.comm) out.push_back(*j.comm);
  }
  return out;
}

inline void close_all(std::vector<Communicator>& comms) {
  for (auto& c : comms) c.close();
}

}  // namespace nexar::testing
