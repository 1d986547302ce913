// The stall watchdog (comm/watchdog.*): the report line it composes from the members'
// answers; and between real ranks (4, over QUIC and over shared memory), one rank that skips
// collective #k and sleeps makes every waiting rank log, within 1.5 s of the call with
// Config::stall_warn at 500 ms, one line naming that rank, its last completed collective and
// that it is in no operation; the waiting collectives keep waiting until their own deadline,
// whose error carries the same report. The same for a receive from a rank that never sends
// and a rendezvous send nobody receives. With stall_warn 0 nothing is reported.
#include <nexar/nexar.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "comm/watchdog.hpp"
#include "engine/op_state.hpp"
#include "core/call_check.hpp"
#include "support.hpp"

namespace {

using namespace std::chrono_literals;
using nexar::Communicator;
using nexar::DataType;
using nexar::Errc;
using nexar::OpRecord;
using nexar::ReduceOp;
using nexar::detail::Watchdog;
using nexar::testing::contains;

OpRecord stalled_all_reduce(Watchdog::Clock::time_point posted) {
  OpRecord op;
  op.number = 7;
  op.op = "all_reduce";
  op.dtype = DataType::f32;
  op.reduce_op = ReduceOp::sum;
  op.count = 1000;
  op.posted = posted;
  op.state = OpRecord::State::running;
  return op;
}

TEST(Watchdog, TheReportNamesWhoHasNotCalledWhoDidNotAnswerAndWhoIsInIt) {
  const Watchdog::Comm comm{0x5, 0, {0, 1, 2, 3, 4}, nullptr, nullptr, {}};
  const auto now = Watchdog::Clock::now();
  std::vector<std::optional<Watchdog::Answer>> answers(5);
  answers[1] = Watchdog::Answer{true, 8, 7, "in all_reduce #7 (f32, 1000 elements, sum) of communicator 0x5 for 2.0 s"};
  answers[2] = Watchdog::Answer{true, 7, 7, "in no operation"};
  answers[3] = Watchdog::Answer{false, 0, 0, "rpc on rank 0: timed out"};
  answers[4] = Watchdog::Answer{true, 9, 9, "in no operation"};  // already past it
  const std::string s = Watchdog::report(comm, stalled_all_reduce(now - 2500ms), now, answers);
  EXPECT_TRUE(contains(s, "stall: all_reduce #7 (f32, 1000 elements, sum) of communicator 0x5 has waited 2.5 s on "
                          "rank 0 of 5")) << s;
  EXPECT_TRUE(contains(s, "not called by rank 2 (last completed #6; in no operation)")) << s;
  EXPECT_TRUE(contains(s, "no answer from rank 3 (rpc on rank 0: timed out)")) << s;
  EXPECT_TRUE(contains(s, "still in it: ranks 0, 1")) << s;
  EXPECT_TRUE(contains(s, "; past it: rank 4")) << s;
}

TEST(Watchdog, WhenEveryMemberHasCalledItTheReportSaysSo) {
  const Watchdog::Comm comm{0x0, 1, {0, 1}, nullptr, nullptr, {}};
  const auto now = Watchdog::Clock::now();
  std::vector<std::optional<Watchdog::Answer>> answers(2);
  answers[0] = Watchdog::Answer{true, 8, 7, "in all_reduce #7"};
  const std::string s = Watchdog::report(comm, stalled_all_reduce(now), now, answers);
  EXPECT_TRUE(contains(s, "every member has called it; still in it: ranks 0, 1")) << s;
}

TEST(Watchdog, AStalledReceiveNamesWhatItsPeerIsDoing) {
  const Watchdog::Comm comm{0x0, 0, {0, 1, 2}, nullptr, nullptr, {}};
  const auto now = Watchdog::Clock::now();
  auto st = std::make_shared<nexar::detail::OpState>("recv", now + 10s, now - 1200ms);
  const nexar::detail::PendingP2p::Op op{st, false, 2, 5, 64};
  std::vector<std::optional<Watchdog::Answer>> answers(3);
  answers[2] = Watchdog::Answer{true, 4, 4, "in no operation"};
  EXPECT_EQ(Watchdog::report(comm, op, now, answers),
            "stall: recv from rank 2 (tag 5, up to 64 bytes) on communicator 0x0 has waited 1.2 s on rank 0 of 3; "
            "rank 2 (last completed #3; in no operation)");
  const nexar::detail::PendingP2p::Op any{st, false, -1, -1, 8};
  answers[1] = Watchdog::Answer{false, 0, 0, "closed"};
  EXPECT_EQ(Watchdog::report(comm, any, now, answers),
            "stall: recv from any rank (any tag, up to 8 bytes) on communicator 0x0 has waited 1.2 s on rank 0 of 3; "
            "no answer from rank 1 (closed); rank 2 (last completed #3; in no operation)");
}

// A query about collective #n gets the fingerprint of this rank's call of it (root
// included), which the asker compares with its own; 0 for one the recorder does not hold.
TEST(Watchdog, AnAnswerCarriesTheCallOfTheCollectiveAskedAbout) {
  nexar::detail::Recorder rec(16);
  const auto check = nexar::detail::call_check("reduce", DataType::f32, ReduceOp::sum, 1);
  rec.posted(nexar::detail::Recorder::Call{"reduce", "automatic", check, 513, 2052, 1}, Watchdog::Clock::now(), true);
  Watchdog w(std::chrono::milliseconds(0), {});
  std::byte number[8] = {};  // collective #0
  const Watchdog::Answer a = Watchdog::decode(w.answer(rec, number));
  ASSERT_TRUE(a.ok);
  EXPECT_EQ(a.called, 1u);
  EXPECT_EQ(a.completed, 0u);
  EXPECT_EQ(a.check, check);
  EXPECT_EQ(a.doing, "in no operation") << "the recorder is not registered with the watchdog";
  number[0] = std::byte{5};  // collective #5: not recorded
  EXPECT_EQ(Watchdog::decode(w.answer(rec, number)).check, 0);
  EXPECT_EQ(Watchdog::decode(w.answer(rec, {})).check, 0) << "a query about a send names none";
}

TEST(Watchdog, AnAnswerTooShortIsNoAnswer) {
  std::vector<std::byte> reply(17);
  EXPECT_FALSE(Watchdog::decode(reply).ok);
  EXPECT_EQ(Watchdog::decode(reply).doing, "an answer of 17 bytes, fewer than 18");
}

TEST(Watchdog, ACallDescribesItsShape) {
  OpRecord r = stalled_all_reduce({});
  EXPECT_EQ(nexar::detail::describe(r), "all_reduce #7 (f32, 1000 elements, sum)");
  r.op = "broadcast";
  r.count = 1;
  r.root = 2;
  r.dtype = DataType::u8;
  EXPECT_EQ(nexar::detail::describe(r), "broadcast #7 (u8, 1 element, root 2)");
  r.op = "barrier";
  EXPECT_EQ(nexar::detail::describe(r), "barrier #7");
}

// ---- between ranks -----------------------------------------------------------------------

struct Skipped {
  std::string log;                  // what the ranks logged until 1.5 s after the call
  std::vector<std::string> errors;  // each waiting rank's error
};

// 4 ranks run `before` agreeing all_reduces; then ranks 0-2 call one more, with a deadline
// of 4 s, while rank 3 sleeps through it.
Skipped skip_one(bool shm, std::chrono::milliseconds stall_warn, int before) {
  nexar::Config cfg = nexar::testing::test_config(nexar::LogLevel::warn);
  cfg.shm = shm;
  cfg.stall_warn = stall_warn;
  auto comms = nexar::bootstrap_local(4, cfg);
  Skipped out;
  out.errors.resize(3);
  nexar::testing::on_every_rank(comms, [&](int r) {
    Communicator& c = comms[static_cast<std::size_t>(r)];
    for (int i = 0; i < before; ++i) {
      float x = 1;
      c.all_reduce(&x, &x, 1, DataType::f32, ReduceOp::sum);
    }
    c.barrier();
  });
  testing::internal::CaptureStderr();
  std::thread watcher([&] {
    std::this_thread::sleep_for(1500ms);
    out.log = testing::internal::GetCapturedStderr();
  });
  nexar::testing::on_every_rank(comms, [&](int r) {
    Communicator& c = comms[static_cast<std::size_t>(r)];
    if (r == 3) {
      std::this_thread::sleep_for(4500ms);
      return;
    }
    std::vector<float> x(1000, 1.0f);
    nexar::CollectiveOptions o;
    o.timeout = 4s;
    out.errors[static_cast<std::size_t>(r)] =
        nexar::testing::expect_error(Errc::timeout, [&] { c.all_reduce(x.data(), x.data(), x.size(), DataType::f32, ReduceOp::sum, o); });
  });
  watcher.join();
  return out;
}

std::vector<std::string> stall_lines(const std::string& log) {
  std::vector<std::string> lines;
  std::istringstream in(log);
  for (std::string line; std::getline(in, line);)
    if (contains(line, "stall: ")) lines.push_back(line);
  return lines;
}

TEST(Watchdog, ARankThatSkipsACollectiveIsNamedByEveryWaitingRank) {
  for (bool shm : {false, true}) {
    SCOPED_TRACE(shm ? "shared memory" : "QUIC");
    // Agreeing calls before: over shared memory the members agree on the mailboxes by then,
    // so the stalled call goes through them.
    const int before = 5;
    const Skipped s = skip_one(shm, 500ms, before);
    const auto lines = stall_lines(s.log);
    EXPECT_EQ(lines.size(), 3u) << s.log;
    // Collective #k: the agreeing ones, the barrier, and the members' own mailbox votes
    // count as collectives of the communicator; the number is the same on every rank.
    for (int r = 0; r < 3; ++r) {
      bool found = false;
      for (const auto& l : lines) {
        if (!contains(l, "on rank " + std::to_string(r) + " of 4")) continue;
        found = true;
        EXPECT_TRUE(contains(l, "stall: all_reduce #")) << l;
        EXPECT_TRUE(contains(l, "(f32, 1000 elements, sum) of communicator 0x0 has waited")) << l;
        EXPECT_TRUE(contains(l, "not called by rank 3 (last completed #")) << l;
        EXPECT_TRUE(contains(l, "; in no operation)")) << l;
      }
      EXPECT_TRUE(found) << "rank " << r << " logged no stall line: " << s.log;
      const std::string& e = s.errors[static_cast<std::size_t>(r)];
      EXPECT_TRUE(contains(e, "stall: all_reduce #")) << e;
      EXPECT_TRUE(contains(e, "not called by rank 3")) << e;
    }
  }
}

TEST(Watchdog, WithStallWarnZeroNothingIsReported) {
  const Skipped s = skip_one(false, 0ms, 1);
  EXPECT_TRUE(stall_lines(s.log).empty()) << s.log;
  for (const auto& e : s.errors) EXPECT_FALSE(contains(e, "stall:")) << e;
}

// Rank 0 receives from rank 2, which sleeps; over QUIC, rank 0 also sends rank 1 a message
// above the eager limit that rank 1 never receives. Each logs its line within 1.5 s, naming
// the peer and what it is doing, and the operation's timeout error carries it.
TEST(Watchdog, AStalledSendOrReceiveIsReportedNamingThePeer) {
  for (bool shm : {false, true}) {
    SCOPED_TRACE(shm ? "shared memory" : "QUIC");
    nexar::Config cfg = nexar::testing::test_config(nexar::LogLevel::warn);
    cfg.shm = shm;
    cfg.stall_warn = 500ms;
    cfg.op_timeout = 3s;
    auto comms = nexar::bootstrap_local(3, cfg);
    nexar::testing::on_every_rank(comms, [&](int r) { comms[static_cast<std::size_t>(r)].barrier(); });
    std::string log, recv_error, send_error;
    testing::internal::CaptureStderr();
    std::thread watcher([&] {
      std::this_thread::sleep_for(1500ms);
      log = testing::internal::GetCapturedStderr();
    });
    nexar::testing::on_every_rank(comms, [&](int r) {
      Communicator& c = comms[static_cast<std::size_t>(r)];
      if (r != 0) {
        std::this_thread::sleep_for(3500ms);
        return;
      }
      std::vector<std::byte> big(shm ? 0 : 1 << 20);
      nexar::Request send;
      if (!shm) send = c.isend(1, 7, big.data(), big.size());
      char buf[64];
      recv_error = nexar::testing::expect_error(Errc::timeout, [&] { c.recv(2, 5, buf, sizeof buf); });
      if (!shm) send_error = nexar::testing::expect_error(Errc::timeout, [&] { send.wait(); });
    });
    watcher.join();
    const auto lines = stall_lines(log);
    EXPECT_EQ(lines.size(), shm ? 1u : 2u) << log;
    const std::string recv_line =
        "stall: recv from rank 2 (tag 5, up to 64 bytes) on communicator 0x0 has waited ";
    EXPECT_TRUE(contains(log, recv_line)) << log;
    // Its last collective is the barrier (after the members' own vote on the mailboxes).
    EXPECT_TRUE(contains(log, "on rank 0 of 3; rank 2 (last completed #1; in no operation)")) << log;
    EXPECT_TRUE(contains(recv_error, recv_line)) << recv_error;
    if (!shm) {
      EXPECT_TRUE(contains(log, "stall: send to rank 1 (tag 7, 1048576 bytes) on communicator 0x0")) << log;
      EXPECT_TRUE(contains(log, "rank 1 (last completed #1; in no operation)")) << log;
      EXPECT_TRUE(contains(send_error, "stall: send to rank 1")) << send_error;
    }
  }
}

// The recorder of a real communicator: blocking and non-blocking calls, in order, with their
// calls and states.
TEST(Watchdog, TheRecorderOfACommunicatorListsItsCalls) {
  for (bool shm : {false, true}) {
    SCOPED_TRACE(shm ? "shared memory" : "QUIC");
    nexar::Config cfg = nexar::testing::test_config();
    cfg.shm = shm;
    auto comms = nexar::bootstrap_local(3, cfg);
    nexar::testing::on_every_rank(comms, [&](int r) {
      Communicator& c = comms[static_cast<std::size_t>(r)];
      for (int i = 0; i < 6; ++i) {
        double x = r;
        c.all_reduce(&x, &x, 1, DataType::f64, ReduceOp::max);
      }
      std::int32_t b[5] = {r, r, r, r, r};
      c.ibroadcast(b, 5, DataType::i32, 1).wait();
      c.barrier();
      const auto rec = c.recorder();
      ASSERT_GE(rec.size(), 8u);
      for (std::size_t i = 1; i < rec.size(); ++i) EXPECT_EQ(rec[i].number, rec[i - 1].number + 1);
      for (const auto& e : rec) {
        EXPECT_EQ(e.state, OpRecord::State::done) << e.op << " #" << e.number;
        EXPECT_GE(e.ended, e.posted);
      }
      // The library's own collectives (the members' vote on the mailboxes) are numbered and
      // recorded among the application's.
      auto last = [&](const char* op) {
        for (auto it = rec.rbegin(); it != rec.rend(); ++it)
          if (it->op == op) return *it;
        ADD_FAILURE() << "no " << op << " recorded";
        return OpRecord{};
      };
      const OpRecord bc = last("broadcast");
      // Non-blocking, through the mailboxes it went to the collective thread all the same.
      EXPECT_EQ(bc.algorithm, shm ? "mailbox" : "automatic");
      EXPECT_EQ(bc.dtype, DataType::i32);
      EXPECT_EQ(bc.count, 5u);
      EXPECT_EQ(bc.bytes, 20u);
      EXPECT_EQ(bc.root, 1);
      EXPECT_EQ(last("barrier").number, rec.back().number);
      const OpRecord ar = last("all_reduce");
      EXPECT_EQ(ar.reduce_op, ReduceOp::max);
      EXPECT_EQ(ar.count, 1u);
      EXPECT_LT(ar.number, bc.number);
      // Over shared memory the last blocking all_reduces went through the mailboxes.
      if (shm) EXPECT_EQ(ar.algorithm, "mailbox");
      else EXPECT_EQ(ar.algorithm, "automatic");
      EXPECT_TRUE(contains(c.dump(), R"("op":"broadcast")"));
    });
  }
}

}  // namespace
