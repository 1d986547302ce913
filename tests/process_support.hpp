// Helpers shared by the tests whose ranks are processes of their own (failure_test.cpp,
// elastic_test.cpp), so that a rank can die by SIGKILL exactly as a crashed job would.
//
// The test process forks before it creates any thread or nexar object (fork copies only the
// calling thread). Each child runs its checks and exits with a status the test asserts on:
// 0 passed, 1 a check failed (RANK_CHECK printed why), 2 an exception escaped, 128 + n killed
// by signal n. Memory mapped MAP_SHARED before the fork (shared_object) carries flags and
// numbers between the processes.
#pragma once

#include <nexar/communicator.hpp>

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <new>
#include <string>
#include <thread>
#include <vector>

// A check inside a child process: prints and exits with status 1 when false. `rank` names
// the process in the message.
#define RANK_CHECK(rank, cond, msg)                                                                   \
  do {                                                                                                \
    if (!(cond)) {                                                                                    \
      std::fprintf(stderr, "rank %d: check failed: %s: %s\n", (rank), #cond, std::string(msg).c_str()); \
      std::fflush(stderr);                                                                            \
      _exit(1);                                                                                       \
    }                                                                                                 \
  } while (0)

namespace nexar::testing {

/// Now on the steady clock, in nanoseconds: a time one forked process can store in shared
/// memory and another compare with its own.
inline std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

/// The one T of this test binary in memory shared with every process forked afterwards,
/// constructed afresh (a test calls it before it forks, to start from a clean state).
template <class T>
T& fresh_shared() {
  static T* p = [] {
    void* m = ::mmap(nullptr, sizeof(T), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) std::abort();
    return new (m) T();
  }();
  p->~T();
  return *new (p) T();
}

/// Forks a process that runs `body` and exits: 0 when it returns, 2 when it throws (after
/// printing `name` and the exception). Streams are flushed first; nothing else of the test
/// process (static destructors, gtest's reporting) runs in the child.
inline pid_t fork_child(const std::string& name, const std::function<void()>& body) {
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  int status = 0;
  try {
    body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: uncaught: %s\n", name.c_str(), e.what());
    status = 2;
  }
  std::fflush(stdout);
  std::fflush(stderr);
  _exit(status);
}

/// The exit status of child `pid` if it ended (0, 1, 2, or 128 + signal), reaping it; -1
/// while it runs.
inline int try_reap(pid_t pid) {
  int st = 0;
  if (::waitpid(pid, &st, WNOHANG) != pid) return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/// Waits for every child of `pids` and returns their statuses in order. One still running
/// after `limit` is SIGKILLed and fails the test.
inline std::vector<int> reap_all(const std::vector<pid_t>& pids, std::chrono::milliseconds limit) {
  using namespace std::chrono_literals;
  std::vector<int> status(pids.size(), -1);
  auto deadline = std::chrono::steady_clock::now() + limit;
  for (std::size_t left = pids.size(); left > 0;) {
    for (std::size_t i = 0; i < pids.size(); ++i) {
      if (status[i] != -1) continue;
      status[i] = try_reap(pids[i]);
      if (status[i] != -1) --left;
    }
    if (left > 0 && std::chrono::steady_clock::now() > deadline) {
      for (std::size_t i = 0; i < pids.size(); ++i)
        if (status[i] == -1) ::kill(pids[i], SIGKILL);
      ADD_FAILURE() << "processes still running after "
                    << std::chrono::duration_cast<std::chrono::seconds>(limit).count() << " s: killed";
      deadline = std::chrono::steady_clock::time_point::max();
    }
    if (left > 0) std::this_thread::sleep_for(5ms);
  }
  return status;
}

/// An all_reduce whose every element is derived from (step, world rank, i) on each member:
/// returns whether the sums match the members present. A different step gives different
/// values, so a result left over from another step never passes.
inline bool all_reduce_step(Communicator& c, int step, std::size_t count) {
  const std::vector<int> world = c.world_ranks();
  std::vector<double> v(count);
  const int me = world[static_cast<std::size_t>(c.rank())];
  for (std::size_t i = 0; i < count; ++i) v[i] = static_cast<double>((step + 1) * (me + 1) + static_cast<int>(i % 7));
  c.all_reduce(v, ReduceOp::sum);
  for (std::size_t i = 0; i < count; ++i) {
    double want = 0;
    for (int w : world) want += static_cast<double>((step + 1) * (w + 1) + static_cast<int>(i % 7));
    if (v[i] != want) return false;
  }
  return true;
}

/// "{0,2,5}", for messages.
inline std::string ranks_text(const std::vector<int>& v) {
  std::string s = "{";
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i) s.push_back(',');
    s.append(std::to_string(v[i]));
  }
  s.push_back('}');
  return s;
}

}  // namespace nexar::testing
