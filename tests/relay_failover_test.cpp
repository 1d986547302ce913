// Relays that die: each rank is a forked process (tests/process_support.hpp), so a relay
// dies by SIGKILL in the middle of a transfer exactly as a crashed host would. On a ring
// (k_regular:2) of 8 ranks, rank 0 reaches rank 4 through 1, 2 and 3 (the shortest route
// with the lower neighbour first), or through 7, 6 and 5.
//
// The transfer runs on a communicator that leaves the relays out, so the failure does not
// revoke it: the test sees the transport route around the dead relay (bytes it held are
// sent again on the new route, none lost or duplicated), or, when no route is left, fail
// the transfer promptly naming the rank that became unreachable.
#include <nexar/communicator.hpp>
#include <nexar/error.hpp>

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "local_processes.hpp"

namespace {

using nexar::testing::now_ns;

using namespace std::chrono_literals;
using nexar::Communicator;
using nexar::Errc;
using nexar::Error;

struct Shared {
  std::atomic<int> sent{0};        // messages rank 0 has handed to send
  std::atomic<int> done{0};        // ranks finished with the transfer
  std::atomic<std::int64_t> killed_at{0};
  std::atomic<std::int64_t> failed_at{0};
};
Shared* shared = nullptr;

nexar::Config ring_config() {
  nexar::Config c;
  c.topology = nexar::Topology::parse("k_regular:2");
  c.connect_timeout = 10s;
  c.op_timeout = 30s;  // far above every bound checked: a hang shows as a failed bound
  c.failure_timeout = 1s;
  c.log_level = nexar::LogLevel::off;
  c.yield_when_idle = true;  // 8 processes on 2 cores
  return c;
}

constexpr int kMessages = 40;
constexpr std::size_t kBytes = 256 * 1024 + 7;

// Message i's bytes: different for every message and position.
std::vector<unsigned char> payload(int i) {
  std::vector<unsigned char> v(kBytes);
  std::uint32_t x = 2654435761u * static_cast<std::uint32_t>(i + 1);
  for (auto& b : v) {
    x = x * 1103515245u + 12345u;
    b = static_cast<unsigned char>(x >> 24);
  }
  return v;
}

// Who sits out the transfer's communicator: the relays that will die.
bool victim(int r, const std::vector<int>& victims) {
  for (int v : victims)
    if (v == r) return true;
  return false;
}

// The communicator of the transfer: the world without the victims. A victim instead dies
// (SIGKILL) once rank 0 has sent a few messages through it.
Communicator transfer_comm(Communicator& world, int r, const std::vector<int>& victims) {
  Communicator c = world.split(victim(r, victims) ? 1 : 0, r);
  if (victim(r, victims)) {
    while (shared->sent.load() < 4) std::this_thread::sleep_for(1ms);
    shared->killed_at.store(now_ns());
    kill(getpid(), SIGKILL);
  }
  return c;
}

void wait_for_done(int n) {
  while (shared->done.load() < n) std::this_thread::sleep_for(2ms);
}

// (a) Relay 2 dies after rank 0 has sent a few messages to rank 4: every message arrives
// whole and in order, over 7, 6 and 5.
TEST(RelayFailover, ADeadRelayIsRoutedAround) {
  shared = &nexar::testing::fresh_shared<Shared>();
  const std::vector<int> victims = {2};
  auto status = nexar::testing::run_forked(8, ring_config(), [&](int r, Communicator& world) {
    Communicator c = transfer_comm(world, r, victims);
    if (r == 0) {
      for (int i = 0; i < kMessages; ++i) {
        auto data = payload(i);
        c.send(3, 11, data.data(), data.size());  // world rank 4 is rank 3 of c
        shared->sent.store(i + 1);
      }
    } else if (r == 4) {
      std::vector<unsigned char> got(kBytes);
      for (int i = 0; i < kMessages; ++i) {
        c.recv(0, 11, got.data(), got.size());
        RANK_CHECK(r, got == payload(i), "message " + std::to_string(i) + " differs");
      }
    }
    shared->done.fetch_add(1);
    wait_for_done(7);
    c.close();
  }, 60s);
  for (int r = 0; r < 8; ++r) EXPECT_EQ(status[static_cast<std::size_t>(r)], r == 2 ? 128 + SIGKILL : 0) << "rank " << r;
}

// (b) Relays 2 and 6 both die: nothing leads from rank 0 to ranks 3, 4 and 5 any more.
// Rank 0's transfer to rank 4 fails within 2 s, naming one of them as unreachable (its
// communicator is revoked by whichever it found first), instead of waiting for a deadline.
TEST(RelayFailover, AnUnreachableRankFailsPromptlyNamingIt) {
  shared = &nexar::testing::fresh_shared<Shared>();
  const std::vector<int> victims = {2, 6};
  auto status = nexar::testing::run_forked(8, ring_config(), [&](int r, Communicator& world) {
    Communicator c = transfer_comm(world, r, victims);
    if (r == 0) {
      try {
        for (int i = 0; i < 100000; ++i) {
          auto data = payload(i % 8);
          c.send(3, 11, data.data(), data.size());
          shared->sent.store(i + 1);
        }
        RANK_CHECK(r, false, "every send succeeded with rank 4 cut off");
      } catch (const Error& e) {
        shared->failed_at.store(now_ns());
        const std::string what = e.what();
        // Ranks 3, 4 and 5 are all cut off; the error names whichever this rank found first.
        const bool names_cut_off = what.find("rank 3") != std::string::npos ||
                                   what.find("rank 4") != std::string::npos ||
                                   what.find("rank 5") != std::string::npos;
        RANK_CHECK(r, names_cut_off, what);
        RANK_CHECK(r, what.find("unreachable") != std::string::npos, what);
      }
    } else if (r == 4) {
      std::vector<unsigned char> got(kBytes);
      try {
        for (;;) c.recv(0, 11, got.data(), got.size());
      } catch (const Error& e) {
        // Its communicator is revoked by whichever rank of the far side it declared first.
        RANK_CHECK(r, e.code() == Errc::rank_failed, e.what());
      }
    }
    shared->done.fetch_add(1);
    wait_for_done(6);
    c.close();
  }, 60s);
  for (int r = 0; r < 8; ++r)
    EXPECT_EQ(status[static_cast<std::size_t>(r)], r == 2 || r == 6 ? 128 + SIGKILL : 0) << "rank " << r;
  const auto killed = shared->killed_at.load(), failed = shared->failed_at.load();
  ASSERT_GT(failed, 0);
  EXPECT_LT(std::chrono::nanoseconds(failed - killed), 2s) << "the send failed long after the relays died";
}

// (c) Failure handling on a sparse topology: relay 2 dies during an all_reduce loop on the
// world. Every survivor's operation fails naming rank 2 (the news reaches the ranks that
// are no neighbour of 2 over neighbour links), the survivors agree on a shrink, and the
// shrunk communicator, whose ring has a gap where rank 2 was, computes right, its messages
// routed around the gap.
TEST(RelayFailover, SurvivorsShrinkAroundADeadRelay) {
  shared = &nexar::testing::fresh_shared<Shared>();
  nexar::Config cfg = ring_config();
  cfg.on_failure = nexar::FailurePolicy::manual;
  auto status = nexar::testing::run_forked(8, cfg, [&](int r, Communicator& c) {
    try {
      for (int step = 0;; ++step) {
        if (r == 2 && step == 5) {
          shared->killed_at.store(now_ns());
          kill(getpid(), SIGKILL);
        }
        RANK_CHECK(r, nexar::testing::all_reduce_step(c, step, 1000 + static_cast<std::size_t>(step)), "wrong sum");
        RANK_CHECK(r, step < 10000, "the loop outlived the relay's death");
      }
    } catch (const Error& e) {
      RANK_CHECK(r, e.code() == Errc::rank_failed, e.what());
      RANK_CHECK(r, c.failed_ranks() == std::vector<int>{2}, nexar::testing::ranks_text(c.failed_ranks()));
    }
    Communicator s = c.shrink();
    RANK_CHECK(r, s.size() == 7, std::to_string(s.size()));
    for (int step = 0; step < 3; ++step)
      RANK_CHECK(r, nexar::testing::all_reduce_step(s, 100 + step, 777777), "wrong sum after the shrink");
    s.barrier();
    shared->done.fetch_add(1);
    wait_for_done(7);
  }, 60s);
  for (int r = 0; r < 8; ++r) EXPECT_EQ(status[static_cast<std::size_t>(r)], r == 2 ? 128 + SIGKILL : 0) << "rank " << r;
}

}  // namespace
