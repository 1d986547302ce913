// Collective fingerprints (core/call_check.*): each field of a call decodes from its
// fingerprint; and between real ranks on QUIC and on shared memory (2 and 4 ranks), one rank
// that calls collective #k with another reduction operator, element type or collective than
// the others, with the same byte count, makes every rank fail with Errc::invalid_argument
// within a second, the error naming both calls, for each collective: in that call, or (a
// rank whose own part of it completed) in the next. Agreeing ranks never trip.
#include <nexar/nexar.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "core/call_check.hpp"
#include "support.hpp"

namespace {

using namespace std::chrono_literals;
using nexar::Communicator;
using nexar::DataType;
using nexar::Errc;
using nexar::ReduceOp;
using nexar::detail::call_check;
using nexar::detail::describe_call;

TEST(CallCheck, EveryFieldDecodes) {
  EXPECT_EQ(describe_call(call_check("all_reduce", DataType::f32, ReduceOp::max)), "all_reduce(f32, max)");
  EXPECT_EQ(describe_call(call_check("reduce_scatter", DataType::bf16, ReduceOp::avg)), "reduce_scatter(bf16, avg)");
  EXPECT_EQ(describe_call(call_check("exclusive_scan", DataType::i64, ReduceOp::prod)), "exclusive_scan(i64, prod)");
  // Collectives that reduce nothing say no operator, whichever they pass.
  EXPECT_EQ(describe_call(call_check("all_gather_v", DataType::u64, ReduceOp::sum)), "all_gather_v(u64)");
  EXPECT_EQ(describe_call(call_check("barrier", DataType::u8, ReduceOp::sum)), "barrier(u8)");
  EXPECT_EQ(describe_call(call_check("something_new", DataType::i8, ReduceOp::min)), "another collective(i8)");
  // A root, as the fingerprint holds it: modulo 8, which is the root itself up to 8 ranks.
  EXPECT_EQ(describe_call(call_check("broadcast", DataType::f32, ReduceOp::sum, 5)), "broadcast(f32, root 5)");
  EXPECT_EQ(describe_call(call_check("reduce", DataType::i64, ReduceOp::max, 0)), "reduce(i64, max, root 0)");
  EXPECT_EQ(describe_call(call_check("gather_v", DataType::u8, ReduceOp::sum, 13), 16), "gather_v(u8, root 5 mod 8)");
  EXPECT_EQ(describe_call(call_check("all_reduce", DataType::f32, ReduceOp::sum, -1)), "all_reduce(f32, sum)");
}

TEST(CallCheck, CallsThatDifferInOneFieldDiffer) {
  const std::uint16_t base = call_check("all_reduce", DataType::f32, ReduceOp::sum);
  EXPECT_NE(base, 0);  // 0 means "no fingerprint"
  EXPECT_NE(base, call_check("all_reduce", DataType::f32, ReduceOp::max));
  EXPECT_NE(base, call_check("all_reduce", DataType::i32, ReduceOp::sum));
  EXPECT_NE(base, call_check("reduce_scatter", DataType::f32, ReduceOp::sum));
  EXPECT_NE(base, call_check("all_reduce_bucketed", DataType::f32, ReduceOp::sum));
  EXPECT_EQ(base, call_check("all_reduce", DataType::f32, ReduceOp::sum));
  const std::uint16_t root1 = call_check("scatter", DataType::f32, ReduceOp::sum, 1);
  EXPECT_NE(root1, call_check("scatter", DataType::f32, ReduceOp::sum, 2));
  EXPECT_NE(root1, call_check("scatter", DataType::f32, ReduceOp::sum, 0));
  EXPECT_EQ(root1, call_check("scatter", DataType::f32, ReduceOp::sum, 9));  // only modulo 8
}

TEST(CallCheck, AnUnreadableFingerprintSaysSo) {
  EXPECT_EQ(describe_call(0x0123), "a call this build cannot read (check 0x0123)");
  EXPECT_EQ(describe_call(0xffff), "a call this build cannot read (check 0xffff)");
}

// ---- between ranks -----------------------------------------------------------------------

// One way to call collective #k: `odd` is the rank's own choice of the disagreeing call.
struct Case {
  const char* what;
  std::string usual;     // the call as most ranks make it
  std::string other;     // the call as the odd rank makes it
  std::function<void(Communicator&, bool odd)> call;
};

std::vector<float> floats(std::size_t n) { return std::vector<float>(n, 1.5f); }

std::vector<Case> cases() {
  std::vector<Case> v;
  v.push_back({"reduce-op", "called all_reduce(f32, sum)", "called all_reduce(f32, max)", [](Communicator& c, bool odd) {
                 auto x = floats(1000);
                 c.all_reduce(x.data(), x.data(), x.size(), DataType::f32, odd ? ReduceOp::max : ReduceOp::sum);
               }});
  v.push_back({"reduce-op, one element", "called all_reduce(f64, sum)", "called all_reduce(f64, min)", [](Communicator& c, bool odd) {
                 double x = 2;
                 c.all_reduce(&x, &x, 1, DataType::f64, odd ? ReduceOp::min : ReduceOp::sum);
               }});
  v.push_back({"dtype", "called all_reduce(f32, sum)", "called all_reduce(i32, sum)", [](Communicator& c, bool odd) {
                 std::vector<std::int32_t> x(70001, 3);
                 c.all_reduce(x.data(), x.data(), x.size(), odd ? DataType::i32 : DataType::f32, ReduceOp::sum);
               }});
  v.push_back({"reduce", "called reduce(f32, sum, root 0)", "called reduce(f32, prod, root 0)", [](Communicator& c, bool odd) {
                 auto x = floats(513), y = floats(513);
                 c.reduce(x.data(), y.data(), x.size(), DataType::f32, odd ? ReduceOp::prod : ReduceOp::sum, 0);
               }});
  v.push_back({"reduce_scatter", "called reduce_scatter(f32, sum)", "called reduce_scatter(u32, sum)", [](Communicator& c, bool odd) {
                 std::vector<std::uint32_t> x(97 * static_cast<std::size_t>(c.size()), 1), y(97);
                 c.reduce_scatter(x.data(), y.data(), y.size(), odd ? DataType::u32 : DataType::f32, ReduceOp::sum);
               }});
  v.push_back({"all_gather", "called all_gather(f32)", "called all_gather(i32)", [](Communicator& c, bool odd) {
                 std::vector<std::int32_t> x(33, 1), y(33 * static_cast<std::size_t>(c.size()));
                 c.all_gather(x.data(), y.data(), x.size(), odd ? DataType::i32 : DataType::f32);
               }});
  v.push_back({"broadcast", "called broadcast(f64, root 0)", "called broadcast(i64, root 0)", [](Communicator& c, bool odd) {
                 std::vector<std::int64_t> x(4099, 5);
                 c.broadcast(x.data(), x.size(), odd ? DataType::i64 : DataType::f64, 0);
               }});
  v.push_back({"all_to_all", "called all_to_all(f32)", "called all_to_all(u32)", [](Communicator& c, bool odd) {
                 std::vector<std::uint32_t> x(11 * static_cast<std::size_t>(c.size()), 1), y(x.size());
                 c.all_to_all(x.data(), y.data(), 11, odd ? DataType::u32 : DataType::f32);
               }});
  v.push_back({"gather", "called gather(f32, root 0)", "called gather(i32, root 0)", [](Communicator& c, bool odd) {
                 std::vector<std::int32_t> x(10, 1), y(10 * static_cast<std::size_t>(c.size()));
                 c.gather(x.data(), y.data(), x.size(), odd ? DataType::i32 : DataType::f32, 0);
               }});
  v.push_back({"scatter", "called scatter(f32, root 0)", "called scatter(i32, root 0)", [](Communicator& c, bool odd) {
                 std::vector<std::int32_t> x(10 * static_cast<std::size_t>(c.size()), 1), y(10);
                 c.scatter(x.data(), y.data(), y.size(), odd ? DataType::i32 : DataType::f32, 0);
               }});
  v.push_back({"scan", "called scan(f32, sum)", "called scan(f32, max)", [](Communicator& c, bool odd) {
                 auto x = floats(77), y = floats(77);
                 c.scan(x.data(), y.data(), x.size(), DataType::f32, odd ? ReduceOp::max : ReduceOp::sum);
               }});
  v.push_back({"collective", "called all_reduce(f32, sum)", "called all_gather(f32)", [](Communicator& c, bool odd) {
                 // The same bytes on the wire per message would not tell them apart.
                 const auto n = static_cast<std::size_t>(c.size());
                 auto x = floats(64 * n), y = floats(64 * n * n);
                 if (odd) c.all_gather(x.data(), y.data(), x.size(), DataType::f32);
                 else c.all_reduce(x.data(), x.data(), x.size(), DataType::f32, ReduceOp::sum);
               }});
  // A root: in a broadcast where two ranks each take themselves for the root, both send
  // and nobody receives; the message that nobody awaits tells (transport/call_registry.hpp,
  // and in the mailboxes CommunicatorImpl::mail_unwanted).
  v.push_back({"broadcast root", "called broadcast(f64, root 0)", "called broadcast(f64, root 1)",
               [](Communicator& c, bool odd) {
                 std::vector<double> x(4099, 5);
                 c.broadcast(x.data(), x.size(), DataType::f64, odd ? 1 : 0);
               }});
  v.push_back({"reduce root", "called reduce(f32, sum, root 0)", "called reduce(f32, sum, root 1)",
               [](Communicator& c, bool odd) {
                 auto x = floats(513), y = floats(513);
                 c.reduce(x.data(), y.data(), x.size(), DataType::f32, ReduceOp::sum, odd ? 1 : 0);
               }});
  v.push_back({"gather root", "called gather(i32, root 0)", "called gather(i32, root 1)", [](Communicator& c, bool odd) {
                 std::vector<std::int32_t> x(10, 1), y(10 * static_cast<std::size_t>(c.size()));
                 c.gather(x.data(), y.data(), x.size(), DataType::i32, odd ? 1 : 0);
               }});
  v.push_back({"scatter root", "called scatter(u8, root 0)", "called scatter(u8, root 1)", [](Communicator& c, bool odd) {
                 std::vector<std::uint8_t> x(10 * static_cast<std::size_t>(c.size()), 1), y(10);
                 c.scatter(x.data(), y.data(), y.size(), DataType::u8, odd ? 1 : 0);
               }});
  // A count, and a v-form's counts: the sizes of the messages tell, and both ranks are named.
  v.push_back({"count", "ranks called different collectives as", "(they disagree on its count or element type)",
               [](Communicator& c, bool odd) {
                 auto x = floats(odd ? 1001 : 1000);
                 c.all_reduce(x.data(), x.data(), x.size(), DataType::f32, ReduceOp::sum);
               }});
  v.push_back({"v-form counts", "ranks called different collectives as", "(they disagree on its count or element type)",
               [](Communicator& c, bool odd) {
                 const auto n = static_cast<std::size_t>(c.size());
                 // The odd rank believes rank 0 sends 3 elements more than it does.
                 std::vector<std::size_t> counts(n, 5);
                 if (odd) counts[0] = 8;
                 std::vector<float> x(counts[static_cast<std::size_t>(c.rank())], 1.0f), y(5 * n + 3);
                 std::vector<std::size_t> displs(n);
                 for (std::size_t i = 1; i < n; ++i) displs[i] = displs[i - 1] + counts[i - 1];
                 c.iall_gather_v(x.data(), x.size(), y.data(), counts, displs, DataType::f32).wait();
               }});
  return v;
}

// Over QUIC (shared memory off), and over shared memory, where the small collectives go
// through the mailboxes (after a few agreeing calls: the members first agree to use them).
TEST(CallCheck, RanksThatCallDifferentCollectivesAllFailNamingBothCalls) {
  for (bool shm : {false, true})
  for (int world : {2, 4}) {
    for (const Case& k : cases()) {
      SCOPED_TRACE(std::string(k.what) + ", " + std::to_string(world) + " ranks" + (shm ? ", shared memory" : ""));
      nexar::Config cfg = nexar::testing::test_config(nexar::LogLevel::off);
      cfg.shm = shm;
      cfg.op_timeout = 30s;  // far above the bound checked: a hang shows as a failed bound
      // Where nobody sends (two ranks of a reduce each take the other for the root), the
      // stall report finds the calls differ: soon enough here to keep within the bound.
      cfg.stall_warn = 100ms;
      auto comms = nexar::bootstrap_local(world, cfg);
      if (shm)
        nexar::testing::on_every_rank(comms, [&](int r) {
          for (int i = 0; i < 4; ++i) {
            float x = 1;
            comms[static_cast<std::size_t>(r)].all_reduce(&x, &x, 1, DataType::f32, ReduceOp::sum);
          }
        });
      const int odd = world - 1;
      std::vector<std::string> errors(static_cast<std::size_t>(world));
      std::vector<Errc> codes(static_cast<std::size_t>(world), Errc::ok);
      std::vector<std::chrono::milliseconds> took(static_cast<std::size_t>(world));
      nexar::testing::on_every_rank(comms, [&](int r) {
        Communicator& c = comms[static_cast<std::size_t>(r)];
        const auto t0 = std::chrono::steady_clock::now();
        try {
          k.call(c, r == odd);
          // A rank whose own part completed (a broadcast's root, a gather's senders) had
          // nothing to compare: it hears of the disagreement at a later call, within a
          // round trip of the message that tells (the one the others never took). Its calls
          // through the mailboxes do not wait for that message, so it may take a few.
          while (std::chrono::steady_clock::now() - t0 < 1500ms) {
            c.barrier();
            std::this_thread::sleep_for(5ms);
          }
        } catch (const nexar::Error& e) {
          codes[static_cast<std::size_t>(r)] = e.code();
          errors[static_cast<std::size_t>(r)] = e.what();
        }
        took[static_cast<std::size_t>(r)] =
            std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
      });
      for (int r = 0; r < world; ++r) {
        const auto i = static_cast<std::size_t>(r);
        EXPECT_EQ(codes[i], Errc::invalid_argument) << "rank " << r << ": " << errors[i];
        EXPECT_TRUE(nexar::testing::contains(errors[i], k.usual)) << "rank " << r << ": " << errors[i];
        EXPECT_TRUE(nexar::testing::contains(errors[i], k.other)) << "rank " << r << ": " << errors[i];
        EXPECT_LT(took[i], 1s) << "rank " << r;
      }
    }
  }
}

// Fingerprints raise no false alarm: ranks that agree, calls of every kind back to back,
// blocking and not, on a world and on communicators split from it, complete exactly.
TEST(CallCheck, AgreeingRanksNeverTrip) {
  nexar::Config cfg = nexar::testing::test_config();
  cfg.shm = false;
  auto comms = nexar::bootstrap_local(3, cfg);
  nexar::testing::on_every_rank(comms, [&](int r) {
    Communicator& c = comms[static_cast<std::size_t>(r)];
    Communicator sub = c.split(r % 2, r);
    for (int round = 0; round < 50; ++round) {
      std::vector<float> x(static_cast<std::size_t>(1 + round * 37), 1.0f);
      auto pending = c.iall_reduce(x.data(), x.data(), x.size(), DataType::f32, ReduceOp::sum);
      std::vector<std::int64_t> y(static_cast<std::size_t>(round + 1), r);
      sub.all_reduce(y.data(), y.data(), y.size(), DataType::i64, ReduceOp::max);
      pending.wait();
      EXPECT_EQ(x[0], 3.0f);
      EXPECT_EQ(y[0], sub.size() == 2 ? 2 : r);
      double d = r;
      c.broadcast(&d, 1, DataType::f64, round % 3);
      EXPECT_EQ(d, round % 3);
      c.barrier();
    }
  });
}

// No false alarm at scale: 8 ranks, 10,010 collectives of mixed kinds and sizes (through the
// mailboxes and not; then over QUIC), blocking and two non-blocking in flight at once, on
// the world and on communicators split from it and from those, with stall reports on. Every result is
// exact, and no rank fails or logs a stall. Under AddressSanitizer a fifth of the rounds.
TEST(CallCheck, TenThousandMixedCollectivesOnEightRanksRaiseNoAlarm) {
  for (bool shm : {true, false}) {
    SCOPED_TRACE(shm ? "shared memory" : "QUIC");
    nexar::Config cfg = nexar::testing::test_config(nexar::LogLevel::warn);
    cfg.stall_warn = 5s;
    cfg.shm = shm;
    auto comms = nexar::bootstrap_local(8, cfg);
    // Per round: the world's all_reduce, all_gather and barrier (3), each half's all_reduce
    // and broadcast (2 x 2), each pair's all_reduce (4): 11 collectives.
    constexpr int kRounds = nexar::testing::kSanitized ? 182 : 910;
    testing::internal::CaptureStderr();
    nexar::testing::on_every_rank(comms, [&](int r) {
      Communicator& world = comms[static_cast<std::size_t>(r)];
      Communicator half = world.split(r % 2, r);                     // {0,2,4,6}, {1,3,5,7}
      Communicator pair = half.split(half.rank() / 2, half.rank());  // {0,2}, {4,6}, {1,3}, {5,7}
      for (int round = 0; round < kRounds; ++round) {
        const std::size_t n = 1 + static_cast<std::size_t>(round % 7) * 300;  // 1 .. 1801 elements
        std::vector<double> a(n, r), b(n, r);
        auto pa = world.iall_reduce(a.data(), a.data(), n, DataType::f64, ReduceOp::sum);
        auto pb = half.iall_reduce(b.data(), b.data(), n, DataType::f64, ReduceOp::max);
        std::int32_t x = r;
        pair.all_reduce(&x, &x, 1, DataType::i32, ReduceOp::sum);
        std::vector<std::int64_t> g(8);
        const std::int64_t mine = r * 10000 + round;
        world.all_gather(&mine, g.data(), 1, DataType::i64);
        float f = static_cast<float>(r * round);
        half.broadcast(&f, 1, DataType::f32, round % 4);
        pa.wait();
        pb.wait();
        world.barrier();
        ASSERT_EQ(a[n - 1], 28.0);
        ASSERT_EQ(b[0], 6.0 + r % 2);
        ASSERT_EQ(x, r + (r ^ 2));
        for (int k = 0; k < 8; ++k) ASSERT_EQ(g[static_cast<std::size_t>(k)], k * 10000 + round);
        // The root is half rank round % 4, world rank 2 * (round % 4) + r % 2.
        ASSERT_EQ(f, static_cast<float>((2 * (round % 4) + r % 2) * round));
      }
    });
    const std::string log = testing::internal::GetCapturedStderr();
    EXPECT_EQ(log.find("stall: "), std::string::npos) << log;
    EXPECT_EQ(log.find("different collectives"), std::string::npos) << log;
  }
}

}  // namespace
