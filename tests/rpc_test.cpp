// Integration tests of RPC over real QUIC (bootstrap_local): handlers on every rank, calls
// to every rank including self, concurrency, error reporting, per-call timeouts, and RPC
// latency isolation from a large bulk-lane transfer.
#include <algorithm>
#include <nexar/nexar.hpp>

#include <gtest/gtest.h>

#include "support.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

using nexar::testing::contains;
using nexar::testing::expect_error;
using nexar::testing::random_bytes;
using nexar::testing::test_config;

using namespace std::chrono_literals;
using nexar::Communicator;
using nexar::Errc;
using nexar::Error;
using nexar::Request;
using Clock = std::chrono::steady_clock;
using Bytes = std::vector<std::byte>;

constexpr nexar::RpcId kEcho = 1, kSum = 2, kBoom = 3, kSlow = 4, kSleep2s = 5, kMark = 6;

std::uint64_t byte_sum(std::span<const std::byte> s) {
  std::uint64_t t = 0;
  for (auto b : s) t += static_cast<std::uint8_t>(b);
  return t;
}

// Reply of kMark: args with every byte xor 0x5A, then the callee's and caller's ranks.
Bytes mark(std::span<const std::byte> args, int callee, int caller) {
  Bytes out(args.begin(), args.end());
  for (auto& b : out) b ^= std::byte{0x5A};
  out.push_back(static_cast<std::byte>(callee));
  out.push_back(static_cast<std::byte>(caller));
  return out;
}

void register_all(Communicator& c) {
  const int me = c.rank();
  c.register_rpc(kEcho, [](int, std::span<const std::byte> a) { return Bytes(a.begin(), a.end()); });
  c.register_rpc(kSum, [](int, std::span<const std::byte> a) {
    std::uint64_t s = byte_sum(a);
    Bytes out(8);
    std::memcpy(out.data(), &s, 8);
    return out;
  });
  c.register_rpc(kBoom, [](int, std::span<const std::byte>) -> Bytes { throw std::runtime_error("boom"); });
  c.register_rpc(kSlow, [me](int caller, std::span<const std::byte>) {
    std::this_thread::sleep_for(50ms);
    return Bytes{static_cast<std::byte>(me), static_cast<std::byte>(caller)};
  });
  c.register_rpc(kSleep2s, [](int, std::span<const std::byte>) {
    std::this_thread::sleep_for(2s);
    return Bytes{std::byte{1}};
  });
  c.register_rpc(kMark, [me](int caller, std::span<const std::byte> a) { return mark(a, me, caller); });
}

std::vector<Communicator> world(int n, nexar::Config cfg = test_config()) {
  auto comms = nexar::bootstrap_local(n, cfg);
  for (auto& c : comms) register_all(c);
  return comms;
}

TEST(Rpc, EveryRankToEveryRankIncludingSelf) {
  constexpr int n = 3;
  auto comms = world(n);
  std::mutex mu;
  std::vector<std::string> failures;
  std::vector<std::thread> ts;
  for (int c = 0; c < n; ++c) {
    ts.emplace_back([&, c] {
      try {
        Communicator& me = comms[static_cast<std::size_t>(c)];
        for (int d = 0; d < n; ++d) {
          Bytes args = random_bytes(100 + static_cast<std::size_t>(c * 10 + d), static_cast<std::uint64_t>(c * 10 + d));
          Bytes echo = me.rpc(d, kEcho, args);
          Bytes sum = me.rpc(d, kSum, args);
          Bytes slow = me.rpc(d, kSlow, {});
          Bytes m = me.rpc(d, kMark, args);
          std::uint64_t s = 0;
          if (sum.size() == 8) std::memcpy(&s, sum.data(), 8);
          std::lock_guard lk(mu);
          if (echo != args) failures.push_back("echo " + std::to_string(c) + "->" + std::to_string(d));
          if (sum.size() != 8 || s != byte_sum(args)) failures.push_back("sum " + std::to_string(c) + "->" + std::to_string(d));
          if (slow != Bytes{static_cast<std::byte>(d), static_cast<std::byte>(c)})
            failures.push_back("slow " + std::to_string(c) + "->" + std::to_string(d));
          if (m != mark(args, d, c)) failures.push_back("mark " + std::to_string(c) + "->" + std::to_string(d));
        }
      } catch (const std::exception& e) {
        std::lock_guard lk(mu);
        failures.push_back(std::string("caller ") + std::to_string(c) + ": " + e.what());
      }
    });
  }
  for (auto& t : ts) t.join();
  for (auto& f : failures) ADD_FAILURE() << f;
}

TEST(Rpc, ConcurrentAsyncFromFourThreads) {
  constexpr int threads = 4, calls = 250;
  auto comms = world(3);
  std::mutex mu;
  std::vector<std::string> failures;
  std::atomic<int> ok{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      try {
        std::vector<Bytes> args(calls);
        std::vector<nexar::RpcCall> reqs;
        std::vector<int> dests;
        for (int i = 0; i < calls; ++i) {
          // Distinct payloads: the thread and call number, then random bytes.
          args[static_cast<std::size_t>(i)] = random_bytes(16 + static_cast<std::size_t>(i % 97), static_cast<std::uint64_t>(t * 100000 + i));
          std::int32_t id[2] = {t, i};
          std::memcpy(args[static_cast<std::size_t>(i)].data(), id, sizeof id);
          int dest = (t + i) % 3;  // rank 1, rank 2 and self
          dests.push_back(dest);
          reqs.push_back(comms[0].rpc_async(dest, kMark, args[static_cast<std::size_t>(i)]));
        }
        for (int i = 0; i < calls; ++i) {
          const Bytes& reply = reqs[static_cast<std::size_t>(i)].wait();
          if (reply != mark(args[static_cast<std::size_t>(i)], dests[static_cast<std::size_t>(i)], 0)) {
            std::lock_guard lk(mu);
            failures.push_back("thread " + std::to_string(t) + " call " + std::to_string(i) + ": wrong reply");
          } else {
            ++ok;
          }
        }
      } catch (const std::exception& e) {
        std::lock_guard lk(mu);
        failures.push_back(std::string("thread ") + std::to_string(t) + ": " + e.what());
      }
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(ok.load(), threads * calls);
  for (std::size_t i = 0; i < std::min<std::size_t>(failures.size(), 10); ++i) ADD_FAILURE() << failures[i];
}

TEST(Rpc, UnknownIdReportedAtOnce) {
  nexar::Config cfg = test_config();
  cfg.rpc_timeout = 20s;
  auto comms = world(2, cfg);
  for (int dest : {1, 0}) {
    auto t0 = Clock::now();
    std::string w = expect_error(Errc::unknown_rpc, [&] { comms[0].rpc(dest, 999, {}); });
    EXPECT_LT(Clock::now() - t0, 5s) << "unknown id waited for the RPC timeout";
    EXPECT_TRUE(contains(w, "999")) << w;
    EXPECT_TRUE(contains(w, "rank " + std::to_string(dest))) << w;
  }
  // Still usable.
  Bytes a = random_bytes(10, 1);
  EXPECT_EQ(comms[0].rpc(1, kEcho, a), a);
}

TEST(Rpc, ThrowingHandler) {
  auto comms = world(2);
  for (int dest : {1, 0}) {
    std::string w = expect_error(Errc::rpc_failed, [&] { comms[0].rpc(dest, kBoom, {}); });
    EXPECT_TRUE(contains(w, "boom")) << w;
    // Async flavour: the failure lands in the call.
    nexar::RpcCall r = comms[0].rpc_async(dest, kBoom, {});
    expect_error(Errc::rpc_failed, [&] { r.wait(); });
    EXPECT_EQ(r.request().error(), nexar::make_error_code(Errc::rpc_failed));
  }
  Bytes a = random_bytes(10, 2);
  EXPECT_EQ(comms[0].rpc(1, kEcho, a), a);
}

TEST(Rpc, PerCallTimeout) {
  auto comms = world(2);
  auto t0 = Clock::now();
  std::string w = expect_error(Errc::timeout, [&] { comms[0].rpc(1, kSleep2s, {}, 200ms); });
  EXPECT_LT(Clock::now() - t0, 1900ms) << "the per-call timeout was not applied";
  EXPECT_TRUE(contains(w, "rpc")) << w;
  // A later call still works (it waits behind the sleeping handler on rank 1).
  Bytes a = random_bytes(33, 3);
  EXPECT_EQ(comms[0].rpc(1, kEcho, a), a);
  // The late reply of the timed-out call must not be taken for a later call's.
  EXPECT_EQ(comms[0].rpc(1, kMark, a), mark(a, 1, 0));
}

TEST(Rpc, UnregisterThenCall) {
  auto comms = world(2);
  Bytes a = random_bytes(5, 4);
  EXPECT_EQ(comms[0].rpc(1, kEcho, a), a);
  comms[1].unregister_rpc(kEcho);
  expect_error(Errc::unknown_rpc, [&] { comms[0].rpc(1, kEcho, a); });
  comms[1].unregister_rpc(kEcho);  // removing twice is harmless
  comms[1].register_rpc(kEcho, [](int, std::span<const std::byte> x) { return Bytes(x.rbegin(), x.rend()); });
  EXPECT_EQ(comms[0].rpc(1, kEcho, a), Bytes(a.rbegin(), a.rend()));
}

TEST(Rpc, EmptyAndOneMiBArgs) {
  auto comms = world(2);
  for (int dest : {1, 0}) {
    EXPECT_TRUE(comms[0].rpc(dest, kEcho, {}).empty());
    Bytes s = comms[0].rpc(dest, kSum, {});
    ASSERT_EQ(s.size(), 8u);
    std::uint64_t v = 1;
    std::memcpy(&v, s.data(), 8);
    EXPECT_EQ(v, 0u);
    Bytes big = random_bytes(1u << 20, 5);
    EXPECT_EQ(comms[0].rpc(dest, kEcho, big), big);
    s = comms[0].rpc(dest, kSum, big);
    std::memcpy(&v, s.data(), 8);
    EXPECT_EQ(v, byte_sum(big));
  }
}

// The headline property: RPCs are not stuck behind a large bulk transfer on the same
// connection.
TEST(Rpc, ThousandRpcsDuringBulkTransfer) {
  auto comms = world(2);
  const std::size_t size = std::size_t{getenv("RPC_TEST_BULK_MB") ? std::strtoul(getenv("RPC_TEST_BULK_MB"), nullptr, 10) : 512} << 20;
  Bytes bulk(size);
  for (std::size_t i = 0; i + 8 <= size; i += 8) {
    std::uint64_t x = (i >> 3) * 0x9E3779B97F4A7C15ull;
    std::memcpy(bulk.data() + i, &x, 8);
  }
  Bytes got(size);
  Request br = comms[1].ibulk_recv(0, 7, got.data(), got.size());
  Request bs = comms[0].ibulk_send(1, 7, bulk.data(), bulk.size());
  // The calls are pipelined, 16 in flight, as an application overlapping them would; each
  // still crosses the connection that the bulk lane is saturating.
  constexpr int total = 1000, window = 16;
  std::vector<Bytes> args(total);
  std::vector<nexar::RpcCall> calls(total);
  int correct = 0;
  auto t0 = Clock::now();
  double bulk_ms = -1;
  int done_before_bulk = total;  // calls completed before the bulk transfer was seen done
  for (int i = 0; i < total; ++i) {
    if (i >= window) {
      if (calls[static_cast<std::size_t>(i - window)].wait() == mark(args[static_cast<std::size_t>(i - window)], 1, 0)) ++correct;
    }
    if (bulk_ms < 0 && br.test()) {
      bulk_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      done_before_bulk = std::max(0, i - window);
    }
    Bytes& a = args[static_cast<std::size_t>(i)];
    a.resize(12);
    std::int32_t v[3] = {i, i * 7, -i};
    std::memcpy(a.data(), v, sizeof v);
    calls[static_cast<std::size_t>(i)] = comms[0].rpc_async(1, kMark, a);
  }
  for (int i = total - window; i < total; ++i) {
    if (calls[static_cast<std::size_t>(i)].wait() == mark(args[static_cast<std::size_t>(i)], 1, 0)) ++correct;
  }
  double first_ms = 0;
  double rpcs_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  bs.wait();
  double total_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  std::printf("first rpc %.1f ms, bulk seen done at %.1f ms (%d rpcs done by then), 1000 rpcs %.1f ms, bulk wait %.1f ms\n",
              first_ms, bulk_ms, done_before_bulk, rpcs_ms, total_ms);
  EXPECT_EQ(correct, 1000);
  // RPCs stuck behind the bulk lane would all complete after it; on a loaded machine the
  // two may end close together, so ask only that most calls overtook the transfer.
  EXPECT_GE(done_before_bulk, total / 2)
      << "only " << done_before_bulk << " of " << total << " RPCs completed while the 512 MiB transfer was in flight";
  bs.wait();
  EXPECT_EQ(br.wait().bytes, size);
  EXPECT_TRUE(bulk == got);
}

}  // namespace

// ---- handlers that call RPCs, concurrency, and the thread limit ----------------------------

constexpr nexar::RpcId kChain = 20, kRendezvous = 21, kOuter = 22, kInner = 23;

// A handler calls back into its caller, whose handler calls the callee again, and so on:
// each level holds one handler thread on its rank, so this needs more than one per rank.
TEST(Rpc, HandlersCallBackIntoTheirCaller) {
  auto comms = world(2);
  for (auto& c : comms) {
    Communicator* self = &c;
    c.register_rpc(kChain, [self](int caller, std::span<const std::byte> a) {
      // Argument: the remaining depth. Reply: the ranks visited, innermost first.
      const auto depth = static_cast<int>(a[0]);
      Bytes out;
      if (depth > 0) out = self->rpc(caller, kChain, Bytes{static_cast<std::byte>(depth - 1)});
      out.push_back(static_cast<std::byte>(self->rank()));
      return out;
    });
  }
  const Bytes got = comms[0].rpc(1, kChain, Bytes{std::byte{5}});
  // Depth 5 on rank 1, 4 on rank 0, ..., 0 on rank 0: visited 0,1,0,1,0,1 from the inside.
  EXPECT_EQ(got, (Bytes{std::byte{0}, std::byte{1}, std::byte{0}, std::byte{1}, std::byte{0}, std::byte{1}}));
  // And a handler calling its own rank.
  comms[1].register_rpc(kOuter, [self = &comms[1]](int, std::span<const std::byte> a) {
    return self->rpc(self->rank(), kEcho, a);
  });
  const Bytes args = random_bytes(33, 9);
  EXPECT_EQ(comms[0].rpc(1, kOuter, args), args);
}

// Two calls to a handler that returns only once both are inside it: passes only when the
// rank runs them at the same time.
TEST(Rpc, HandlersRunConcurrently) {
  auto comms = world(2);
  std::atomic<int> inside{0};
  comms[1].register_rpc(kRendezvous, [&inside](int, std::span<const std::byte>) {
    inside.fetch_add(1);
    const auto until = Clock::now() + 20s;
    while (inside.load() < 2 && Clock::now() < until) std::this_thread::sleep_for(1ms);
    return Bytes{static_cast<std::byte>(inside.load())};
  });
  nexar::RpcCall a = comms[0].rpc_async(1, kRendezvous, {});
  nexar::RpcCall b = comms[0].rpc_async(1, kRendezvous, {});
  EXPECT_EQ(a.wait(), Bytes{std::byte{2}});
  EXPECT_EQ(b.wait(), Bytes{std::byte{2}});
}

// With one handler thread, a handler that calls its own rank waits for a request no thread
// is left to run: that request fails at once with a message naming the setting, not after
// the caller's timeout.
TEST(Rpc, NestedCallBeyondTheThreadLimitFailsClearly) {
  nexar::Config cfg = test_config();
  cfg.rpc_threads = 1;
  cfg.rpc_timeout = 120s;
  auto comms = world(2, cfg);
  comms[1].register_rpc(kInner, [](int, std::span<const std::byte>) { return Bytes{std::byte{7}}; });
  comms[1].register_rpc(kOuter, [self = &comms[1]](int, std::span<const std::byte>) {
    try {
      self->rpc(self->rank(), kInner, {});
      return Bytes{std::byte{'o'}, std::byte{'k'}};
    } catch (const Error& e) {
      std::string w = std::string(nexar::to_string(e.code())) + " " + e.what();
      const auto* p = reinterpret_cast<const std::byte*>(w.data());
      return Bytes(p, p + w.size());
    }
  });
  const Bytes got = comms[0].rpc(1, kOuter, {});
  const std::string text(reinterpret_cast<const char*>(got.data()), got.size());
  EXPECT_TRUE(contains(text, "rpc_failed")) << text;
  EXPECT_TRUE(contains(text, "NEXAR_RPC_THREADS")) << text;
  // The rank is usable afterwards: its one thread serves the next call.
  EXPECT_EQ(comms[0].rpc(1, kInner, {}), Bytes{std::byte{7}});
}

// Handlers belong to the communicator they were registered on and see the caller's rank in
// it; the world's handler of the same id is another one.
TEST(Rpc, SplitCommunicatorsHaveTheirOwnHandlersAndRanks) {
  constexpr int n = 4;
  auto comms = world(n);
  std::vector<Communicator> subs(n);
  {
    std::vector<std::thread> ts;
    // Reversed keys: sub-rank = 1 - (world rank / 2) within each parity.
    for (int r = 0; r < n; ++r)
      ts.emplace_back([&, r] { subs[static_cast<std::size_t>(r)] = comms[static_cast<std::size_t>(r)].split(r % 2, -r); });
    for (auto& t : ts) t.join();
  }
  for (int r = 0; r < n; ++r) {
    auto& s = subs[static_cast<std::size_t>(r)];
    ASSERT_EQ(s.size(), 2);
    ASSERT_EQ(s.rank(), 1 - r / 2);
    // Reply: 's', the callee's world rank, the caller's rank as the handler saw it.
    s.register_rpc(kMark, [r](int caller, std::span<const std::byte>) {
      return Bytes{std::byte{'s'}, static_cast<std::byte>(r), static_cast<std::byte>(caller)};
    });
    s.register_rpc(kInner, [](int, std::span<const std::byte>) { return Bytes{std::byte{'i'}}; });
  }
  for (int r = 0; r < n; ++r) {
    auto& s = subs[static_cast<std::size_t>(r)];
    for (int d = 0; d < 2; ++d) {
      // Sub-rank d of r's group is world rank 2 * (1 - d) + r % 2.
      const int callee = 2 * (1 - d) + r % 2;
      EXPECT_EQ(s.rpc(d, kMark, {}), (Bytes{std::byte{'s'}, static_cast<std::byte>(callee),
                                           static_cast<std::byte>(s.rank())}))
          << "world rank " << r << " -> sub-rank " << d;
    }
    // Through the world, the world's handler answers, with the caller's world rank.
    const int other = (r + 1) % n;
    EXPECT_EQ(comms[static_cast<std::size_t>(r)].rpc(other, kMark, {}), mark({}, other, r));
    // kInner exists only on the split communicators; kEcho only on the world.
    expect_error(Errc::unknown_rpc, [&] { comms[static_cast<std::size_t>(r)].rpc(other, kInner, {}); });
    expect_error(Errc::unknown_rpc, [&] { s.rpc(0, kEcho, {}); });
  }
  // Rank validation uses the split communicator's size.
  expect_error(Errc::invalid_argument, [&] { subs[0].rpc(2, kMark, {}); });
}
