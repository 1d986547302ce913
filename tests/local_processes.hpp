// A local cluster whose ranks are processes of their own (tests/process_support.hpp), for
// the tests that may use the library's internals to plan it (failure_test.cpp,
// relay_failover_test.cpp).
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "cluster/local.hpp"
#include "process_support.hpp"

namespace nexar::testing {

/// Runs `body(rank, comm)` in one forked process per rank of a local cluster of `n` and
/// returns each one's exit status (see fork_child). `meanwhile(pids)`, if given, runs in
/// the test process on a thread of its own while they run.
inline std::vector<int> run_forked(int n, const nexar::Config& cfg,
                                   const std::function<void(int, Communicator&)>& body,
                                   std::chrono::milliseconds limit,
                                   const std::function<void(const std::vector<pid_t>&)>& meanwhile = {}) {
  auto plans = nexar::cluster::plan_local(n, cfg);
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    pids.push_back(fork_child("rank " + std::to_string(r), [&, r] {
      nexar::cluster::discard(plans, r);
      Communicator c = nexar::cluster::start_node(std::move(plans[static_cast<std::size_t>(r)]), cfg);
      body(r, c);
      c.close();
    }));
  }
  nexar::cluster::discard(plans, -1);
  std::thread helper;
  if (meanwhile) helper = std::thread([&] { meanwhile(pids); });
  std::vector<int> status = reap_all(pids, limit);
  if (helper.joinable()) helper.join();
  return status;
}

/// What a test that kills one rank of a forked cluster records (in fresh_shared memory):
/// when the victim died, and when each survivor's operation failed.
struct Deaths {
  std::atomic<std::int64_t> killed_at{0};
  std::atomic<std::int64_t> error_at[16]{};
};

/// The body of a rank in such a test: all_reduce of `count` elements step after step (each
/// checked), `victim` killing itself by SIGKILL at step 10; a survivor's step must then fail
/// with rank_failed naming the victim alone, and records when. `each(step)`, if given, runs
/// after every step that completed.
inline void all_reduce_until_killed(int rank, Communicator& c, Deaths& d, int victim, std::size_t count,
                                    const std::function<void(int step)>& each = {}) {
  for (int step = 0;; ++step) {
    if (rank == victim && step == 10) {
      d.killed_at.store(now_ns());
      kill(getpid(), SIGKILL);
    }
    try {
      RANK_CHECK(rank, all_reduce_step(c, step, count), "wrong sum at step " + std::to_string(step));
    } catch (const nexar::Error& e) {
      d.error_at[rank].store(now_ns());
      RANK_CHECK(rank, e.code() == nexar::Errc::rank_failed, e.what());
      RANK_CHECK(rank, e.failed_ranks() == std::vector<int>{victim}, ranks_text(e.failed_ranks()) + ": " + e.what());
      return;
    }
    if (each) each(step);
  }
}

/// Checks run_forked's `status`: `victim` died by SIGKILL, every other rank exited 0, and
/// each survivor's operation failed within `bound` of the kill.
inline void expect_named_in_time(const std::vector<int>& status, int victim, const Deaths& d,
                                 std::chrono::nanoseconds bound) {
  for (std::size_t r = 0; r < status.size(); ++r) {
    EXPECT_EQ(status[r], static_cast<int>(r) == victim ? 128 + SIGKILL : 0) << "rank " << r;
    if (static_cast<int>(r) == victim) continue;
    const auto took = std::chrono::nanoseconds(d.error_at[r].load() - d.killed_at.load());
    EXPECT_LT(took, bound) << "rank " << r << " learned of the failure after "
                           << std::chrono::duration<double>(took).count() << " s";
  }
}

}  // namespace nexar::testing
