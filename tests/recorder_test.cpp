// The flight recorder (comm/recorder.*): what an entry keeps of a call and its times, the
// ring that keeps the last N, the progress counts kept even when it keeps nothing, and
// readers that copy entries while a writer rewrites them and never see half of one. The
// recorder of real communicators (blocking and not, through the mailboxes and not) is
// checked end to end in watchdog_test.cpp and tests/python/test_diagnosis.py.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "comm/recorder.hpp"
#include "core/call_check.hpp"

namespace {

using namespace std::chrono_literals;
using nexar::DataType;
using nexar::OpRecord;
using nexar::ReduceOp;
using nexar::detail::call_check;
using nexar::detail::Recorder;
using Clock = Recorder::Clock;

Recorder::Call all_reduce_call(std::uint64_t count) {
  return Recorder::Call{"all_reduce", "ring", call_check("all_reduce", DataType::f64, ReduceOp::max), count,
                        count * 8, -1};
}

TEST(Recorder, AnEntryKeepsTheCallAndItsTimes) {
  Recorder rec(8);
  const auto t0 = Clock::now();
  rec.posted(all_reduce_call(5), t0, false);
  auto open = rec.oldest_open();
  ASSERT_TRUE(open);
  EXPECT_EQ(open->state, OpRecord::State::queued);
  EXPECT_EQ(open->started, Clock::time_point{});
  rec.started(0, t0 + 1ms);
  rec.ended(0, t0 + 3ms, true);
  const auto all = rec.snapshot();
  ASSERT_EQ(all.size(), 1u);
  const OpRecord& r = all[0];
  EXPECT_EQ(r.number, 0u);
  EXPECT_EQ(r.op, "all_reduce");
  EXPECT_EQ(r.algorithm, "ring");
  EXPECT_EQ(r.dtype, DataType::f64);
  EXPECT_EQ(r.reduce_op, ReduceOp::max);
  EXPECT_EQ(r.count, 5u);
  EXPECT_EQ(r.bytes, 40u);
  EXPECT_EQ(r.root, -1);
  EXPECT_EQ(r.posted, t0);
  EXPECT_EQ(r.started, t0 + 1ms);
  EXPECT_EQ(r.ended, t0 + 3ms);
  EXPECT_EQ(r.state, OpRecord::State::done);
  EXPECT_FALSE(rec.oldest_open());
  EXPECT_EQ(rec.called(), 1u);
  EXPECT_EQ(rec.completed(), 1u);
}

TEST(Recorder, AFailureAndACallGivenUpWhileQueuedAreKept) {
  Recorder rec(8);
  const auto t0 = Clock::now();
  rec.posted(all_reduce_call(1), t0, true);  // runs at once (a mailbox call)
  rec.posted(Recorder::Call{"broadcast", "tree", call_check("broadcast", DataType::u8, ReduceOp::sum), 9, 9, 2},
             t0, false);
  rec.ended(1, t0 + 5ms, false);  // given up before it started
  rec.ended(0, Clock::time_point{}, false);  // no clock read: it ends when it started
  const auto all = rec.snapshot();
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].state, OpRecord::State::failed);
  EXPECT_EQ(all[0].started, t0);
  EXPECT_EQ(all[0].ended, t0);
  EXPECT_EQ(all[1].state, OpRecord::State::failed);
  EXPECT_EQ(all[1].started, Clock::time_point{});
  EXPECT_EQ(all[1].root, 2);
  EXPECT_EQ(all[1].op, "broadcast");
}

TEST(Recorder, TheRingKeepsTheLastEntriesOldestFirst) {
  Recorder rec(4);  // raised to 16
  const auto t0 = Clock::now();
  for (std::uint64_t n = 0; n < 40; ++n) {
    rec.posted(all_reduce_call(n), t0, true);
    if (n != 28) rec.ended(n, t0, true);
  }
  const auto all = rec.snapshot();
  ASSERT_EQ(all.size(), 16u);
  for (std::size_t i = 0; i < 16; ++i) {
    EXPECT_EQ(all[i].number, 24 + i);
    EXPECT_EQ(all[i].count, 24 + i);
  }
  // #28 never ended: it is the oldest open one, though the later ones ended after it.
  auto open = rec.oldest_open();
  ASSERT_TRUE(open);
  EXPECT_EQ(open->number, 28u);
  // A late write for a number the ring no longer holds changes nothing.
  rec.ended(2, t0 + 1s, false);
  EXPECT_EQ(rec.snapshot()[0].number, 24u);
  EXPECT_EQ(rec.snapshot()[0].state, OpRecord::State::done);
}

// More calls in flight than the recorder holds: the open entry stays, and the call that
// would have replaced it is counted but not recorded (no two threads write one entry).
TEST(Recorder, AnOpenEntryIsNeverReplaced) {
  Recorder rec(16);
  const auto t0 = Clock::now();
  for (std::uint64_t n = 0; n < 17; ++n) {
    rec.posted(all_reduce_call(n), t0, false);
    if (n != 0 && n != 16) rec.ended(n, t0, true);
  }
  EXPECT_EQ(rec.called(), 17u);
  auto open = rec.oldest_open();
  ASSERT_TRUE(open);
  EXPECT_EQ(open->number, 0u);
  const auto all = rec.snapshot();
  ASSERT_EQ(all.size(), 16u);
  EXPECT_EQ(all.front().number, 0u);
  EXPECT_EQ(all.back().number, 15u);
  rec.ended(16, t0, true);  // its entry is #0's: nothing changes
  EXPECT_EQ(rec.oldest_open()->number, 0u);
}

TEST(Recorder, OffItKeepsNoEntryButCountsProgress) {
  Recorder rec(0);
  rec.posted(all_reduce_call(1), Clock::now(), true);
  rec.posted(all_reduce_call(1), Clock::now(), true);
  rec.ended(0, Clock::now(), true);
  EXPECT_TRUE(rec.snapshot().empty());
  EXPECT_FALSE(rec.oldest_open());
  EXPECT_EQ(rec.called(), 2u);
  EXPECT_EQ(rec.completed(), 1u);
  EXPECT_EQ(rec.json(0x1f, 1, 2), R"({"comm":"0x1f","rank":1,"size":2,"called":2,"completed":1,"ops":[]})");
}

TEST(Recorder, EachNumberIsReportedOnceAndItsReportKept) {
  Recorder rec(4);
  EXPECT_TRUE(rec.first_report(3));
  EXPECT_FALSE(rec.first_report(3));
  EXPECT_FALSE(rec.first_report(2));
  EXPECT_TRUE(rec.first_report(4));
  rec.set_report(4, "stall: it");
  EXPECT_EQ(rec.report(4), "stall: it");
  EXPECT_EQ(rec.report(3), "");
}

TEST(Recorder, JsonHasEveryFieldAndNullForTimesNotReached) {
  Recorder rec(4);
  rec.posted(all_reduce_call(3), Clock::now(), false);
  const std::string j = rec.json(0, 0, 1);
  for (const char* part : {R"("number":0)", R"("op":"all_reduce")", R"("dtype":"f64")", R"("reduce_op":"max")",
                           R"("count":3)", R"("bytes":24)", R"("root":-1)", R"("algorithm":"ring")",
                           R"("state":"queued")", R"("started_us":null)", R"("ended_us":null)"})
    EXPECT_NE(j.find(part), std::string::npos) << part << " in " << j;
}

// One writer rewrites the entries as fast as it can, each entry's fields derived from its
// number; readers copy them meanwhile. A copy is whole or not taken: never the fields of two
// calls.
TEST(Recorder, ReadersNeverSeeHalfAnEntry) {
  Recorder rec(64);
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    const auto t0 = Clock::now();
    for (std::uint64_t n = 0; !stop.load(std::memory_order_relaxed); ++n) {
      rec.posted(Recorder::Call{"all_gather", "ring", call_check("all_gather", DataType::u8, ReduceOp::sum), n * 3,
                                   n * 7, static_cast<int>(n % 5)},
                 t0 + std::chrono::nanoseconds(n), false);
      rec.started(n, t0 + std::chrono::nanoseconds(n + 1));
      rec.ended(n, t0 + std::chrono::nanoseconds(n + 2), n % 2 == 0);
      // Now and then the readers get a turn on a machine with cores to spare too.
      if (n % 32 == 0) std::this_thread::yield();
    }
  });
  std::uint64_t seen = 0;
  const auto until = Clock::now() + 300ms;
  while (Clock::now() < until) {
    for (const OpRecord& r : rec.snapshot()) {
      ++seen;
      ASSERT_EQ(r.count, r.number * 3);
      ASSERT_EQ(r.bytes, r.number * 7);
      ASSERT_EQ(r.root, static_cast<int>(r.number % 5));
      if (r.state == OpRecord::State::done || r.state == OpRecord::State::failed) {
        ASSERT_EQ(r.state == OpRecord::State::done, r.number % 2 == 0);
        ASSERT_EQ(r.ended - r.posted, std::chrono::nanoseconds(2));
      }
    }
  }
  stop = true;
  writer.join();
  EXPECT_GT(seen, 0u);
}

}  // namespace
