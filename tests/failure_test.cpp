// Failures with real processes: each rank is a forked process with its own node, so a rank
// can die by SIGKILL exactly as a crashed job would (its port then answers with ICMP
// unreachable). Covers detection, the spread of the news to every member, the errors of a
// revoked communicator, agree (with ranks dying during it), shrink (repeatedly, and on split
// communicators), a grow meeting a shrink, revoke by the application, and the abort, manual
// and automatic policies.
//
// Each rank's checks run in its own process: a failed check prints why and exits non-zero,
// and the parent test asserts on the exit statuses (tests/process_support.hpp). Shared
// memory carries timestamps.
#include <nexar/communicator.hpp>
#include <nexar/error.hpp>

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "local_processes.hpp"

namespace {

using nexar::testing::now_ns;

using namespace std::chrono_literals;
using nexar::testing::all_reduce_step;
using nexar::testing::ranks_text;
using nexar::Communicator;
using nexar::Errc;
using nexar::Error;
using nexar::FailurePolicy;
using nexar::ReduceOp;

// Written by the ranks, read by the test (MAP_SHARED survives fork).
struct Shared {
  std::atomic<std::int64_t> killed_at{0};         // when the victim killed itself
  std::atomic<std::int64_t> error_at[16]{};       // when each survivor's operation failed
  std::atomic<int> step[16]{};                    // progress of each rank
  std::atomic<std::uint64_t> id[16]{};            // a communicator id each rank got
  std::atomic<int> past_barrier{0};               // ranks whose first barrier completed
};

Shared* shared_state = nullptr;
Shared* shared() { return shared_state; }

nexar::Config config(FailurePolicy policy) {
  nexar::Config c;
  c.connect_timeout = 10s;
  c.op_timeout = 30s;  // far above every bound checked: a hang shows as a failed bound
  c.on_failure = policy;
  c.log_level = nexar::LogLevel::off;
  // More processes than cores: waiters yield, as the launcher would set.
  c.yield_when_idle = true;
  return c;
}

// Runs `body(rank, comm)` in one forked process per rank, from a fresh Shared.
std::vector<int> run_ranks(int n, const nexar::Config& cfg, const std::function<void(int, Communicator&)>& body,
                           std::chrono::seconds limit = 90s,
                           const std::function<void(const std::vector<pid_t>&)>& meanwhile = {}) {
  shared_state = &nexar::testing::fresh_shared<Shared>();
  return nexar::testing::run_forked(n, cfg, body, limit, meanwhile);
}

// A barrier that has completed on every rank when it returns. A rank's barrier can
// complete before its last message to another rank has left the process, so a rank that
// died right after its own barrier could still fail another rank's.
void everyone_past_barrier(Communicator& c) {
  c.barrier();
  shared()->past_barrier.fetch_add(1);
  while (shared()->past_barrier.load() < c.size()) std::this_thread::sleep_for(1ms);
}

void die() {
  shared()->killed_at.store(now_ns());
  kill(getpid(), SIGKILL);
}

void expect_all(const std::vector<int>& status, const std::vector<int>& want) {
  ASSERT_EQ(status.size(), want.size());
  for (std::size_t r = 0; r < status.size(); ++r) EXPECT_EQ(status[r], want[r]) << "rank " << r;
}

// (a) SIGKILL of one rank of four in an all_reduce loop: every survivor's operation fails
// with rank_failed naming the dead rank, within 1 s of the kill, and none blames another.
TEST(Failure, KilledRankIsNamedBySurvivorsWithinASecond) {
  auto status = run_ranks(4, config(FailurePolicy::manual), [](int rank, Communicator& c) {
    for (int step = 0;; ++step) {
      if (rank == 2 && step == 30) die();
      try {
        RANK_CHECK(rank, all_reduce_step(c, step, 4099), "wrong sum at step " + std::to_string(step));
      } catch (const Error& e) {
        shared()->error_at[rank].store(now_ns());
        RANK_CHECK(rank, e.code() == Errc::rank_failed, e.what());
        RANK_CHECK(rank, e.failed_ranks() == std::vector<int>{2}, ranks_text(e.failed_ranks()) + ": " + e.what());
        RANK_CHECK(rank, std::string(e.what()).find("rank 2 failed") != std::string::npos, e.what());
        RANK_CHECK(rank, c.failed_ranks() == std::vector<int>{2}, ranks_text(c.failed_ranks()));
        RANK_CHECK(rank, c.is_revoked(), "not revoked");
        break;
      }
    }
    // Later operations fail at once, the same way.
    try {
      c.barrier();
      RANK_CHECK(rank, false, "barrier on a revoked communicator succeeded");
    } catch (const Error& e) {
      RANK_CHECK(rank, e.code() == Errc::rank_failed, e.what());
    }
  });
  expect_all(status, {0, 0, 128 + SIGKILL, 0});
  const auto killed = shared()->killed_at.load();
  for (int r : {0, 1, 3}) {
    const auto took = std::chrono::nanoseconds(shared()->error_at[r].load() - killed);
    EXPECT_LT(took, 1s) << "rank " << r << " learned of the failure after "
                        << std::chrono::duration<double>(took).count() << " s";
  }
}

// (b), in one host: a rank whose process is stopped (SIGSTOP) sends nothing and draws no
// ICMP, like a host that went silent. Survivors declare it failed after failure_timeout (1 s
// here), not before and not much after. When it runs again it finds itself expelled: its
// operations fail with rank_failed naming itself.
TEST(Failure, SilentRankIsDeclaredAfterTheFailureTimeout) {
  nexar::Config cfg = config(FailurePolicy::manual);
  cfg.failure_timeout = 1s;
  auto status = run_ranks(3, cfg, [](int rank, Communicator& c) {
    everyone_past_barrier(c);
    if (rank == 2) {
      shared()->killed_at.store(now_ns());
      kill(getpid(), SIGSTOP);  // the test resumes it once both survivors reported
      try {
        for (int i = 0; i < 100; ++i) {
          c.barrier();
          std::this_thread::sleep_for(10ms);
        }
        RANK_CHECK(rank, false, "an expelled rank kept working");
      } catch (const Error& e) {
        RANK_CHECK(rank, e.code() == Errc::rank_failed, e.what());
        RANK_CHECK(rank, c.failed_ranks() == std::vector<int>{2}, ranks_text(c.failed_ranks()) + ": " + e.what());
      }
      return;
    }
    int x = 0;
    try {
      c.recv(2, 1, &x, sizeof x);
      RANK_CHECK(rank, false, "received from a stopped rank");
    } catch (const Error& e) {
      shared()->error_at[rank].store(now_ns());
      RANK_CHECK(rank, e.code() == Errc::rank_failed, e.what());
      RANK_CHECK(rank, std::string(e.what()).find("nothing arrived") != std::string::npos ||
                           std::string(e.what()).find("reported by rank") != std::string::npos,
                 e.what());
    }
    shared()->step[rank].store(1);
    // The survivors still work together.
    Communicator s = c.shrink();
    RANK_CHECK(rank, s.size() == 2, std::to_string(s.size()));
    RANK_CHECK(rank, all_reduce_step(s, 3, 4321), "wrong sum");
  }, 90s, [](const std::vector<pid_t>& pids) {
    // Resume the stopped rank once both survivors declared it failed.
    while (shared()->step[0].load() == 0 || shared()->step[1].load() == 0) std::this_thread::sleep_for(5ms);
    kill(pids[2], SIGCONT);
  });
  expect_all(status, {0, 0, 0});
  const auto stopped = shared()->killed_at.load();
  for (int r : {0, 1}) {
    const auto took = std::chrono::nanoseconds(shared()->error_at[r].load() - stopped);
    EXPECT_GT(took, 900ms) << "rank " << r << " declared a live (stopped) rank failed early";
    EXPECT_LT(took, 1500ms) << "rank " << r << " took " << std::chrono::duration<double>(took).count() << " s";
  }
}

// A rank that exchanges nothing with the dead one still learns at once (it used to wait for
// op_timeout): rank 3 waits for a message from rank 1, which stays alive; rank 0 dies.
TEST(Failure, BystanderWaitingOnASurvivorFailsPromptly) {
  auto status = run_ranks(4, config(FailurePolicy::manual), [](int rank, Communicator& c) {
    everyone_past_barrier(c);
    if (rank == 0) {
      std::this_thread::sleep_for(100ms);
      die();
    }
    if (rank == 3) {
      int x = 0;
      const auto t0 = std::chrono::steady_clock::now();
      try {
        c.recv(1, 7, &x, sizeof x);
        RANK_CHECK(rank, false, "received a message nobody sent");
      } catch (const Error& e) {
        RANK_CHECK(rank, e.code() == Errc::rank_failed, e.what());
        RANK_CHECK(rank, e.failed_ranks() == std::vector<int>{0}, e.what());
        RANK_CHECK(rank, std::chrono::steady_clock::now() - t0 < 5s, "took too long");
      }
    }
    if (rank == 1 || rank == 2) {
      while (!c.is_revoked()) std::this_thread::sleep_for(1ms);
      RANK_CHECK(rank, c.failed_ranks() == std::vector<int>{0}, ranks_text(c.failed_ranks()));
    }
  });
  expect_all(status, {128 + SIGKILL, 0, 0, 0});
}

// (d) Repeated failures 8 -> 7 -> 6 -> 5 under the manual policy: after each, the survivors
// agree on the failed set, shrink, and the next all_reduce is correct on the new world.
TEST(Failure, RepeatedShrinksKeepResultsCorrect) {
  auto status = run_ranks(8, config(FailurePolicy::manual), [](int rank, Communicator& world) {
    Communicator c = world;
    int lost = 0;
    for (int step = 0; step < 200 && lost < 3; ++step) {
      // World ranks 6, 3 and 5 die in turn, each at its own step.
      if ((rank == 6 && step == 10) || (rank == 3 && step == 40) || (rank == 5 && step == 70)) die();
      try {
        RANK_CHECK(rank, all_reduce_step(c, step, 1000), "wrong sum at step " + std::to_string(step));
      } catch (const Error& e) {
        RANK_CHECK(rank, e.code() == Errc::rank_failed, e.what());
        const int before = c.size();
        auto a = c.agree();
        RANK_CHECK(rank, a.failed.size() == 1, ranks_text(a.failed));
        Communicator next = c.shrink();
        RANK_CHECK(rank, next.size() == before - 1, std::to_string(next.size()));
        RANK_CHECK(rank, next.id() != c.id(), "shrink kept the id");
        c = next;
        ++lost;
        // A collective that meets a failure may still complete on some members (their part
        // was done): the survivors go back to the earliest step any of them is at.
        std::int64_t resume = step;
        c.all_reduce(std::span(&resume, 1), ReduceOp::min);
        step = static_cast<int>(resume) - 1;
      }
    }
    RANK_CHECK(rank, lost == 3, "saw " + std::to_string(lost) + " failures");
    RANK_CHECK(rank, c.size() == 5, std::to_string(c.size()));
    const std::vector<int> want = {0, 1, 2, 4, 7};
    RANK_CHECK(rank, c.world_ranks() == want, ranks_text(c.world_ranks()));
    RANK_CHECK(rank, all_reduce_step(c, 999, 12345), "wrong sum after the last shrink");
  });
  expect_all(status, {0, 0, 0, 128 + SIGKILL, 0, 128 + SIGKILL, 128 + SIGKILL, 0});
}

// (c) 8 ranks: one dies before the agreement, and the coordinator (the lowest live rank)
// dies during it. Every survivor decides the same value and the same failed set.
TEST(Failure, AgreementSurvivesTheCoordinatorDying) {
  auto status = run_ranks(8, config(FailurePolicy::manual), [](int rank, Communicator& c) {
    everyone_past_barrier(c);
    if (rank == 5) die();
    // Everyone learns of rank 5 before agreeing (not required, but makes the second death
    // fall inside the agreement).
    while (!c.is_revoked()) std::this_thread::sleep_for(1ms);
    if (rank == 0) {
      // The coordinator takes part, then dies before it can decide for everyone.
      std::this_thread::sleep_for(20ms);
      die();
    }
    std::uint64_t mine = ~std::uint64_t{0} ^ (std::uint64_t{1} << (rank + 8));
    auto a = c.agree(mine);
    std::uint64_t want = ~std::uint64_t{0};
    for (int r : {1, 2, 3, 4, 6, 7}) want ^= std::uint64_t{1} << (r + 8);
    RANK_CHECK(rank, a.failed == (std::vector<int>{0, 5}), ranks_text(a.failed));
    RANK_CHECK(rank, a.value == want, std::to_string(a.value));
    // And a shrink after it agrees again and works.
    Communicator s = c.shrink();
    RANK_CHECK(rank, s.size() == 6, std::to_string(s.size()));
    RANK_CHECK(rank, all_reduce_step(s, 1, 333), "wrong sum after shrink");
  });
  expect_all(status, {128 + SIGKILL, 0, 0, 0, 0, 128 + SIGKILL, 0, 0});
}

// (f) abort: the error is clear, and agree/shrink refuse with invalid_argument naming the
// policy.
TEST(Failure, AbortPolicyFailsAndRefusesRecovery) {
  auto status = run_ranks(3, config(FailurePolicy::abort), [](int rank, Communicator& c) {
    everyone_past_barrier(c);
    if (rank == 1) die();
    try {
      for (int step = 0;; ++step) all_reduce_step(c, step, 64);
    } catch (const Error& e) {
      RANK_CHECK(rank, e.code() == Errc::rank_failed, e.what());
    }
    try {
      c.shrink();
      RANK_CHECK(rank, false, "shrink under abort succeeded");
    } catch (const Error& e) {
      RANK_CHECK(rank, e.code() == Errc::invalid_argument, e.what());
      RANK_CHECK(rank, std::string(e.what()).find("abort") != std::string::npos, e.what());
    }
  });
  expect_all(status, {0, 128 + SIGKILL, 0});
}

// automatic: the failing operation throws with the failed set, then the same Communicator
// object has the survivors' rank and size, and the next call works. The failure callback
// runs, and communicators without the failed rank keep working untouched.
TEST(Failure, AutomaticPolicyRebuildsInPlace) {
  auto status = run_ranks(4, config(FailurePolicy::automatic), [](int rank, Communicator& c) {
    std::atomic<int> told{0};
    c.on_failure([&](const std::vector<int>& failed) {
      if (failed == std::vector<int>{3}) told.fetch_add(1);
    });
    // {0, 1} never contains the dead rank 3.
    Communicator pair = c.split(rank < 2 ? 0 : 1, rank);
    everyone_past_barrier(c);
    if (rank == 3) die();
    int step = 0;
    bool failed = false;
    for (; step < 100; ++step) {
      try {
        RANK_CHECK(rank, all_reduce_step(c, step, 777), "wrong sum");
        if (failed) break;  // one correct step after the rebuild
      } catch (const Error& e) {
        RANK_CHECK(rank, e.code() == Errc::rank_failed, e.what());
        RANK_CHECK(rank, e.failed_ranks() == std::vector<int>{3}, e.what());
        failed = true;
      }
    }
    RANK_CHECK(rank, failed, "no failure seen");
    RANK_CHECK(rank, c.size() == 3 && c.rank() == rank, std::to_string(c.size()));
    RANK_CHECK(rank, c.world_ranks() == (std::vector<int>{0, 1, 2}), ranks_text(c.world_ranks()));
    for (int i = 0; i < 200 && told.load() == 0; ++i) std::this_thread::sleep_for(5ms);
    RANK_CHECK(rank, told.load() >= 1, "failure callback did not run");
    if (rank < 2) {
      RANK_CHECK(rank, !pair.is_revoked(), "a communicator without the failed rank was revoked");
      RANK_CHECK(rank, all_reduce_step(pair, 5, 100), "pair all_reduce wrong");
    }
    c.on_failure({});
  });
  expect_all(status, {0, 0, 0, 128 + SIGKILL});
}

// Removing the failure callback waits for a call of it that is running: afterwards the
// callback may refer to nothing that has gone (here a flag on this frame).
TEST(Failure, RemovingTheCallbackWaitsForARunningCall) {
  auto status = run_ranks(3, config(FailurePolicy::manual), [](int rank, Communicator& c) {
    std::atomic<int> started{0};
    std::atomic<bool> finished{false};
    c.on_failure([&](const std::vector<int>&) {
      started.fetch_add(1);
      std::this_thread::sleep_for(300ms);
      finished.store(true);
    });
    everyone_past_barrier(c);
    if (rank == 2) die();
    for (int i = 0; i < 2000 && started.load() == 0; ++i) std::this_thread::sleep_for(5ms);
    RANK_CHECK(rank, started.load() == 1, "the failure callback did not run");
    c.on_failure({});
    RANK_CHECK(rank, finished.load(), "on_failure({}) returned while the callback was still running");
  });
  expect_all(status, {0, 0, 128 + SIGKILL});
}

// A member that closes its communicator (an orderly goodbye, not a failure) while the others
// shrink, or before they start: the agreement leaves it out instead of waiting for it until
// op_timeout (30 s here). Rank 0 starts its shrink before rank 3 closes, ranks 1 and 2 after.
TEST(Failure, MemberThatClosesIsLeftOutOfTheAgreement) {
  auto status = run_ranks(4, config(FailurePolicy::manual), [](int rank, Communicator& c) {
    everyone_past_barrier(c);
    if (rank == 3) {
      std::this_thread::sleep_for(100ms);
      c.close();
      return;
    }
    if (rank != 0) std::this_thread::sleep_for(300ms);
    const auto t0 = std::chrono::steady_clock::now();
    Communicator s = c.shrink();
    const auto took = std::chrono::steady_clock::now() - t0;
    RANK_CHECK(rank, took < 5s, "shrink took " + std::to_string(std::chrono::duration<double>(took).count()) + " s");
    RANK_CHECK(rank, s.size() == 3 && s.rank() == rank, std::to_string(s.size()));
    RANK_CHECK(rank, s.world_ranks() == (std::vector<int>{0, 1, 2}), ranks_text(s.world_ranks()));
    RANK_CHECK(rank, all_reduce_step(s, 2, 900), "wrong sum after the shrink");
  });
  expect_all(status, {0, 0, 0, 0});
}

// A grow that admits nobody meets a shrink at the same agreement number: under the
// automatic policy one member's in-place rebuild shrinks while another, which finished the
// last collective before it saw the failure, grows. Both must get the same communicator.
TEST(Failure, GrowMeetingShrinkBuildsTheSameCommunicator) {
  auto status = run_ranks(4, config(FailurePolicy::manual), [](int rank, Communicator& c) {
    everyone_past_barrier(c);
    if (rank == 3) die();
    Communicator next = rank < 2 ? c.grow() : c.shrink();
    RANK_CHECK(rank, next.size() == 3 && next.rank() == rank, std::to_string(next.size()));
    RANK_CHECK(rank, next.world_ranks() == (std::vector<int>{0, 1, 2}), ranks_text(next.world_ranks()));
    shared()->id[rank].store(next.id());
    for (int r = 0; r < 3; ++r) {
      for (int i = 0; i < 2000 && shared()->id[r].load() == 0; ++i) std::this_thread::sleep_for(5ms);
      RANK_CHECK(rank, shared()->id[r].load() == next.id(),
                 "rank " + std::to_string(r) + " got another communicator id");
    }
    RANK_CHECK(rank, all_reduce_step(next, 3, 500), "wrong sum");
  });
  expect_all(status, {0, 0, 0, 128 + SIGKILL});
}

// Application revoke: every member's pending receive fails with Errc::revoked, then a
// shrink (nobody failed) gives the same members under a fresh id. Also on a split.
TEST(Failure, RevokeByTheApplicationReachesEveryMember) {
  auto status = run_ranks(4, config(FailurePolicy::manual), [](int rank, Communicator& world) {
    Communicator c = world.split(0, -rank);  // reversed order
    c.barrier();
    if (c.rank() == 0) {
      std::this_thread::sleep_for(50ms);
      c.revoke();
    }
    int x = 0;
    try {
      c.recv(nexar::any_source, 3, &x, sizeof x);
      RANK_CHECK(rank, false, "receive on a revoked communicator succeeded");
    } catch (const Error& e) {
      RANK_CHECK(rank, e.code() == Errc::revoked, e.what());
    }
    Communicator s = c.shrink();
    RANK_CHECK(rank, s.size() == 4 && s.rank() == c.rank(), std::to_string(s.rank()));
    RANK_CHECK(rank, all_reduce_step(s, 2, 99), "wrong sum");
    RANK_CHECK(rank, !world.is_revoked(), "the parent was revoked too");
    world.barrier();
  });
  expect_all(status, {0, 0, 0, 0});
}

}  // namespace
