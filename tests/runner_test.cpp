// CollectiveRunner (comm/runner): a communicator's collectives run one at a time, strictly
// in the order they were submitted, even when several threads submit and waiting callers
// run their own tasks; a caller-waits task is left to its caller (help() runs it on the
// caller's thread when it is next and nothing runs) until kick() hands it to the runner
// thread; stop() lets the running task finish, abandons the queued ones in order and every
// later submission at once, and is idempotent (also from a task on the runner's own thread);
// scratch areas are per slot, at least as large as asked, aligned for any scalar, kept for
// the next task up to kKeptScratch bytes and released after a task beyond that.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <future>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "comm/runner.hpp"

using namespace std::chrono_literals;
using nexar::detail::CollectiveRunner;
using Task = CollectiveRunner::Task;

namespace {

// Polls `cond` for up to 5 s.
template <class F>
bool eventually(F cond) {
  const auto until = std::chrono::steady_clock::now() + 5s;
  while (!cond()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(100us);
  }
  return true;
}

// A task that blocks the runner until release() (so later tasks queue up behind it).
struct Gate {
  std::promise<void> entered, go;
  std::shared_future<void> go_f = go.get_future().share();
  Task task() {
    return Task{[this] {
                  entered.set_value();
                  go_f.wait();
                },
                {}};
  }
  void release() { go.set_value(); }
};

}  // namespace

// In every test the runner is declared after what its tasks touch: it is destroyed first,
// and its destructor waits for the task still running (the last task may still be in its
// tail when the test's checks are done).

TEST(CollectiveRunner, RunsTasksInSubmissionOrderOnItsThread) {
  std::mutex mu;
  std::vector<int> order;
  std::vector<std::thread::id> threads;
  std::promise<void> last;
  CollectiveRunner r;
  constexpr int n = 50;
  for (int i = 0; i < n; ++i) {
    r.submit(false, Task{[&, i] {
                           std::lock_guard lk(mu);
                           order.push_back(i);
                           threads.push_back(std::this_thread::get_id());
                           if (i == n - 1) last.set_value();
                         },
                         {}});
  }
  ASSERT_EQ(last.get_future().wait_for(5s), std::future_status::ready);
  std::lock_guard lk(mu);
  ASSERT_EQ(order.size(), static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) EXPECT_EQ(order[static_cast<std::size_t>(i)], i);
  for (auto id : threads) {
    EXPECT_NE(id, std::this_thread::get_id());
    EXPECT_EQ(id, threads.front());
  }
}

TEST(CollectiveRunner, StrictOrderWithSeveralSubmittersAndHelpers) {
  std::mutex mu;
  std::vector<std::uint64_t> ran;  // ids, in the order they ran
  std::atomic<int> in_flight{0};
  std::atomic<bool> overlapped{false};
  Gate gate;
  CollectiveRunner r;
  auto make = [&](std::shared_ptr<std::uint64_t> id, std::shared_ptr<std::promise<void>> done) {
    return Task{[&, id, done] {
                  if (in_flight.fetch_add(1) != 0) overlapped = true;
                  {
                    std::lock_guard lk(mu);
                    ran.push_back(*id);
                  }
                  std::this_thread::yield();
                  in_flight.fetch_sub(1);
                  done->set_value();
                },
                {}};
  };
  // The first task holds the runner, so the others queue up behind it while threads submit.
  r.submit(false, gate.task());
  gate.entered.get_future().wait();

  constexpr int threads = 4, per_thread = 200;
  std::vector<std::vector<std::uint64_t>> submitted(threads);
  std::vector<std::thread> ts;
  std::atomic<int> started{0}, helped{0};
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(t) + 1);
      for (int i = 0; i < per_thread; ++i) {
        auto id = std::make_shared<std::uint64_t>(0);
        auto done = std::make_shared<std::promise<void>>();
        auto f = done->get_future();
        const bool waits = rng() % 3 == 0;
        // The id is known only once submit returns; the task reads it when it runs, which
        // is after submit returned for every task but those helped here (set before help).
        std::uint64_t got = 0;
        {
          std::lock_guard lk(mu);  // the task reads *id under mu too
          got = r.submit(waits, make(id, done));
          *id = got;
        }
        submitted[static_cast<std::size_t>(t)].push_back(got);
        if (i == 0) started.fetch_add(1);
        if (waits && started.load() == threads) {
          // The caller waits: it runs the task itself when it is next, else hands it over.
          while (f.wait_for(0s) != std::future_status::ready) {
            if (r.help(got)) {
              helped.fetch_add(1);
            } else {
              if (rng() % 4 == 0) r.kick(got);
              std::this_thread::yield();
            }
          }
        } else if (waits) {
          r.kick(got);
        }
      }
    });
  }
  while (started.load() < threads) std::this_thread::yield();
  gate.release();
  for (auto& t : ts) t.join();
  ASSERT_TRUE(eventually([&] {
    std::lock_guard lk(mu);
    return ran.size() == static_cast<std::size_t>(threads * per_thread);
  }));
  EXPECT_FALSE(overlapped.load());
  EXPECT_GT(helped.load(), 0);  // some ran on their callers' threads
  std::lock_guard lk(mu);
  // Ids are handed out in submission order (the gate took id 1), and tasks ran in id order.
  for (std::size_t i = 0; i < ran.size(); ++i) ASSERT_EQ(ran[i], i + 2) << "position " << i;
  for (auto& ids : submitted)
    for (std::size_t i = 1; i < ids.size(); ++i) EXPECT_LT(ids[i - 1], ids[i]);
}

TEST(CollectiveRunner, CallerWaitsTaskRunsOnCallersThread) {
  std::thread::id where;
  bool ran = false;
  CollectiveRunner r;
  const auto id = r.submit(true, Task{[&] {
                                        ran = true;
                                        where = std::this_thread::get_id();
                                      },
                                      {}});
  ASSERT_NE(id, 0u);
  // The runner thread leaves it alone.
  std::this_thread::sleep_for(50ms);
  EXPECT_TRUE(r.ready(id));
  EXPECT_FALSE(r.ready(id + 1));
  EXPECT_FALSE(r.help(id + 1));
  EXPECT_TRUE(r.help(id));
  EXPECT_TRUE(ran);
  EXPECT_EQ(where, std::this_thread::get_id());
  EXPECT_FALSE(r.help(id));  // ran already
  EXPECT_FALSE(r.ready(id));
}

TEST(CollectiveRunner, CallerWaitsTaskIsNotTakenUntilKicked) {
  std::atomic<bool> first{false}, second{false};
  std::promise<std::thread::id> where;
  std::promise<void> b_done;
  CollectiveRunner r;
  const auto a = r.submit(true, Task{[&] {
                                       first = true;
                                       where.set_value(std::this_thread::get_id());
                                     },
                                     {}});
  // A later task waits behind it: order holds even for tasks the runner could take.
  r.submit(false, Task{[&] {
                         second = true;
                         b_done.set_value();
                       },
                       {}});
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(first.load());
  EXPECT_FALSE(second.load());
  r.kick(a);
  auto f = where.get_future();
  ASSERT_EQ(f.wait_for(5s), std::future_status::ready);
  EXPECT_NE(f.get(), std::this_thread::get_id());
  ASSERT_EQ(b_done.get_future().wait_for(5s), std::future_status::ready);
  EXPECT_FALSE(r.help(a));
}

TEST(CollectiveRunner, HelpWaitsItsTurnAndWakesTheRunnerForLaterTasks) {
  Gate gate;
  std::thread::id where;
  std::promise<std::thread::id> later;
  CollectiveRunner r;
  r.submit(false, gate.task());
  gate.entered.get_future().wait();
  const auto mine = r.submit(true, Task{[&] { where = std::this_thread::get_id(); }, {}});
  // Something runs: neither ready nor helped.
  EXPECT_FALSE(r.ready(mine));
  EXPECT_FALSE(r.help(mine));
  r.submit(false, Task{[&] { later.set_value(std::this_thread::get_id()); }, {}});
  gate.release();
  ASSERT_TRUE(eventually([&] { return r.ready(mine); }));
  ASSERT_TRUE(r.help(mine));
  EXPECT_EQ(where, std::this_thread::get_id());
  // The task queued behind it runs on the runner thread without anyone kicking it.
  auto f = later.get_future();
  ASSERT_EQ(f.wait_for(5s), std::future_status::ready);
  EXPECT_NE(f.get(), std::this_thread::get_id());
}

TEST(CollectiveRunner, StopFinishesRunningTaskAndAbandonsQueuedOnes) {
  Gate gate;
  std::atomic<bool> gate_finished{false};
  std::mutex mu;
  std::vector<int> abandoned;
  std::atomic<int> ran{0};
  CollectiveRunner r;
  r.submit(false, Task{[&] {
                         gate.entered.set_value();
                         gate.go_f.wait();
                         gate_finished = true;
                       },
                       [] { ADD_FAILURE() << "the running task was abandoned"; }});
  gate.entered.get_future().wait();
  auto task = [&](int i) {
    return Task{[&] { ran.fetch_add(1); },
                [&, i] {
                  std::lock_guard lk(mu);
                  abandoned.push_back(i);
                }};
  };
  r.submit(false, task(1));
  r.submit(true, task(2));
  r.submit(false, task(3));
  std::thread stopper([&] { r.stop(); });
  // The queued tasks are abandoned at once, in order, while the running one still runs.
  ASSERT_TRUE(eventually([&] {
    std::lock_guard lk(mu);
    return abandoned.size() == 3;
  }));
  EXPECT_FALSE(gate_finished.load());
  gate.release();
  stopper.join();  // stop() returns once the running task finished
  EXPECT_TRUE(gate_finished.load());
  EXPECT_EQ(ran.load(), 0);
  {
    std::lock_guard lk(mu);
    EXPECT_EQ(abandoned, (std::vector<int>{1, 2, 3}));
  }
  // After stop: a submission is abandoned on the spot and gets no id.
  EXPECT_EQ(r.submit(false, task(4)), 0u);
  EXPECT_EQ(r.submit(true, task(5)), 0u);
  {
    std::lock_guard lk(mu);
    EXPECT_EQ(abandoned, (std::vector<int>{1, 2, 3, 4, 5}));
  }
  EXPECT_EQ(r.submit(false, Task{[&] { ran.fetch_add(1); }, {}}), 0u);  // no abandon: fine
  r.stop();  // idempotent
  EXPECT_FALSE(r.help(1));
  EXPECT_EQ(ran.load(), 0);
}

TEST(CollectiveRunner, DestructorAbandonsQueuedTasks) {
  std::atomic<int> abandoned{0}, ran{0};
  {
    CollectiveRunner r;
    for (int i = 0; i < 3; ++i) r.submit(true, Task{[&] { ran.fetch_add(1); }, [&] { abandoned.fetch_add(1); }});
  }
  EXPECT_EQ(abandoned.load(), 3);
  EXPECT_EQ(ran.load(), 0);
}

TEST(CollectiveRunner, StopFromATaskOnTheRunnerThread) {
  std::atomic<int> abandoned{0};
  std::promise<void> stopped;
  {
    CollectiveRunner r;
    r.submit(false, Task{[&] {
                           r.stop();  // must not join its own thread
                           stopped.set_value();
                         },
                         {}});
    ASSERT_EQ(stopped.get_future().wait_for(5s), std::future_status::ready);
    EXPECT_EQ(r.submit(false, Task{[] {}, [&] { abandoned.fetch_add(1); }}), 0u);
  }  // joins here
  EXPECT_EQ(abandoned.load(), 1);
}

TEST(CollectiveRunner, ScratchSizesAlignmentAndReuse) {
  CollectiveRunner r;
  std::byte* first[3] = {};
  const auto id = r.submit(true, Task{[&] {
                                        for (int s = 0; s < 3; ++s) {
                                          std::byte* p = r.scratch(s, 1000 + static_cast<std::size_t>(s));
                                          ASSERT_NE(p, nullptr);
                                          EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % alignof(std::max_align_t), 0u);
                                          std::memset(p, s + 1, 1000 + static_cast<std::size_t>(s));
                                          first[s] = p;
                                        }
                                        // Slots are separate areas, used together.
                                        EXPECT_NE(first[0], first[1]);
                                        EXPECT_NE(first[1], first[2]);
                                        EXPECT_NE(first[0], first[2]);
                                        // A smaller or equal request in the same slot reuses it.
                                        EXPECT_EQ(r.scratch(0, 10), first[0]);
                                        EXPECT_EQ(r.scratch(1, 1001), first[1]);
                                        for (int s = 0; s < 3; ++s)
                                          EXPECT_EQ(first[s][999], static_cast<std::byte>(s + 1));
                                      },
                                      {}});
  ASSERT_TRUE(r.help(id));
  // Kept for the next task (whichever thread runs it); a larger request grows the area.
  std::promise<void> done;
  r.submit(false, Task{[&] {
                         for (int s = 0; s < 3; ++s) EXPECT_EQ(r.scratch(s, 1000), first[s]);
                         std::byte* big = r.scratch(2, 1u << 20);
                         EXPECT_EQ(reinterpret_cast<std::uintptr_t>(big) % alignof(std::max_align_t), 0u);
                         big[(1u << 20) - 1] = std::byte{7};  // all of it is usable
                         EXPECT_EQ(r.scratch(2, 1u << 20), big);
                         done.set_value();
                       },
                       {}});
  ASSERT_EQ(done.get_future().wait_for(5s), std::future_status::ready);
}

TEST(CollectiveRunner, ScratchBeyondTheKeptLimitIsReleasedAfterTheTask) {
  CollectiveRunner r;
  constexpr std::size_t keep = CollectiveRunner::kKeptScratch;
  std::byte* kept = nullptr;
  std::byte* huge = nullptr;
  auto run_here = [&r](auto f) {
    const auto id = r.submit(true, Task{f, {}});
    ASSERT_TRUE(r.help(id));
  };
  // Exactly kKeptScratch bytes stay for the next task.
  run_here([&] { kept = r.scratch(0, keep); });
  run_here([&] { EXPECT_EQ(r.scratch(0, 1), kept); });
  // One byte more is released once its task ended: the next task gets fresh memory (a
  // small block, not the released mapping of 64 MiB).
  run_here([&] {
    huge = r.scratch(1, keep + 1);
    huge[keep] = std::byte{1};
    EXPECT_EQ(r.scratch(1, 16), huge);  // within the task it stays
  });
  run_here([&] {
    std::byte* p = r.scratch(1, 16);
    EXPECT_NE(p, huge);
    EXPECT_EQ(r.scratch(0, 1), kept);  // the other slot was not touched
  });
}
