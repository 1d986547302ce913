// Engine module: OpState completion and waits, Request, BufferPool, the progress thread
// (and its EventLoop side), the readiness gate.
#include <gtest/gtest.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <future>
#include <thread>

#include "core/access.hpp"
#include "engine/buffer_pool.hpp"
#include "engine/engine.hpp"
#include "engine/op_state.hpp"
#include "engine/readiness_gate.hpp"

using namespace std::chrono_literals;
using nexar::Errc;
using nexar::Request;
using nexar::detail::BufferPool;
using nexar::detail::Engine;
using nexar::detail::OpState;
using nexar::detail::ReadinessGate;

namespace {
bool readable(int fd, int wait_ms = 0) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, wait_ms) == 1 && (p.revents & POLLIN);
}

// A datagram socket pair: what one end sends, the other can read.
struct Pair {
  int fd[2]{-1, -1};
  Pair() { EXPECT_EQ(::socketpair(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK, 0, fd), 0); }
  ~Pair() {
    ::close(fd[0]);
    ::close(fd[1]);
  }
  void send() const { EXPECT_EQ(::write(fd[1], "x", 1), 1); }
  void drain() const {
    char b[16];
    while (::read(fd[0], b, sizeof b) > 0) {
    }
  }
};

std::shared_ptr<OpState> make_op(std::chrono::milliseconds timeout = 5s) {
  auto op = std::make_shared<OpState>("test", OpState::Clock::now() + timeout);
  op->spin = 20us;
  return op;
}
}  // namespace

TEST(OpState, FirstCompletionWins) {
  auto op = make_op();
  EXPECT_FALSE(op->done());
  EXPECT_TRUE(op->succeed(nexar::Status{3, 4, 5}));
  EXPECT_FALSE(op->complete(Errc::timeout, "late"));
  EXPECT_TRUE(op->done());
  EXPECT_EQ(op->code(), Errc::ok);
  EXPECT_EQ(op->status().source, 3);
  EXPECT_EQ(op->status().bytes, 5u);
}

TEST(OpState, WaiterWakesFromAnotherThread) {
  auto op = make_op();
  std::thread t([op] {
    std::this_thread::sleep_for(20ms);
    op->complete(Errc::peer_failed, "gone");
  });
  EXPECT_TRUE(op->wait_until(OpState::Clock::now() + 5s, 10us));
  t.join();
  EXPECT_EQ(op->code(), Errc::peer_failed);
  EXPECT_EQ(op->message(), "gone");
}

TEST(OpState, WaitUntilReturnsFalseAtDeadline) {
  auto op = make_op();
  auto t0 = OpState::Clock::now();
  EXPECT_FALSE(op->wait_until(t0 + 30ms, 5us));
  EXPECT_GE(OpState::Clock::now() - t0, 30ms);
  EXPECT_FALSE(op->done());
}

TEST(OpState, ManyRacingCompletersOneWinner) {
  for (int round = 0; round < 50; ++round) {
    auto op = make_op();
    std::atomic<int> wins{0};
    std::vector<std::thread> ts;
    for (int i = 0; i < 4; ++i)
      ts.emplace_back([&, i] {
        if (op->complete(i == 0 ? Errc::ok : Errc::cancelled, "x")) ++wins;
      });
    for (auto& t : ts) t.join();
    EXPECT_EQ(wins.load(), 1);
  }
}

TEST(Request, DefaultIsCompleteAndSuccessful) {
  Request r;
  EXPECT_TRUE(r.test());
  EXPECT_NO_THROW(r.wait());
  EXPECT_FALSE(r.error());
}

TEST(Request, WaitThrowsTheStoredError) {
  auto op = make_op();
  op->complete(Errc::truncated, "recv: rank 0, peer 1: truncated: too big");
  Request r = nexar::detail::Access::make_request(op);
  EXPECT_TRUE(r.test());
  EXPECT_EQ(r.error(), nexar::make_error_code(Errc::truncated));
  try {
    r.wait();
    FAIL() << "wait() did not throw";
  } catch (const nexar::Error& e) {
    EXPECT_EQ(e.code(), Errc::truncated);
    EXPECT_NE(std::string(e.what()).find("too big"), std::string::npos);
  }
}

TEST(Request, DeadlineCallsTheCancellerWithTimeout) {
  auto op = make_op(30ms);
  std::atomic<int> calls{0};
  std::weak_ptr<OpState> weak = op;
  op->canceller = [&calls, weak](Errc code) {
    ++calls;
    if (auto s = weak.lock()) s->complete(code, "timed out");
  };
  Request r = nexar::detail::Access::make_request(op);
  try {
    r.wait();
    FAIL() << "wait() did not throw";
  } catch (const nexar::Error& e) {
    EXPECT_EQ(e.code(), Errc::timeout);
  }
  EXPECT_EQ(calls.load(), 1);
}

TEST(Request, WaitForReturnsFalseWhileRunningAndCancelWorks) {
  auto op = make_op();
  std::weak_ptr<OpState> weak = op;
  op->canceller = [weak](Errc code) {
    if (auto s = weak.lock()) s->complete(code, "cancelled by test");
  };
  Request r = nexar::detail::Access::make_request(op);
  EXPECT_FALSE(r.wait_for(5ms));
  EXPECT_FALSE(r.test());
  r.cancel();
  EXPECT_TRUE(r.test());
  EXPECT_EQ(r.error(), nexar::make_error_code(Errc::cancelled));
}

TEST(BufferPool, RecyclesBySizeClass) {
  BufferPool pool;
  std::byte* first = nullptr;
  {
    auto b = pool.acquire(1000);
    ASSERT_TRUE(b);
    EXPECT_GE(b.capacity(), 1000u);
    first = b.data();
    EXPECT_EQ(pool.outstanding(), 1u);
  }
  EXPECT_EQ(pool.outstanding(), 0u);
  auto again = pool.acquire(700);  // same class (1 KiB): the same memory comes back
  EXPECT_EQ(again.data(), first);
  auto small = pool.acquire(0);
  EXPECT_GE(small.capacity(), 1u);
  auto huge = pool.acquire((4u << 20) + 3);  // above the largest class: plain allocation
  EXPECT_GE(huge.capacity(), (4u << 20) + 3);
  EXPECT_EQ(pool.outstanding(), 3u);
}

TEST(BufferPool, MoveTransfersOwnership) {
  BufferPool pool;
  auto a = pool.acquire(64);
  auto* p = a.data();
  nexar::detail::PooledBuffer b = std::move(a);
  EXPECT_FALSE(a);
  EXPECT_EQ(b.data(), p);
  b.reset();
  EXPECT_EQ(pool.outstanding(), 0u);
}

TEST(BufferPool, ConcurrentAcquireRelease) {
  BufferPool pool;
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&pool, t] {
      for (int i = 0; i < 2000; ++i) {
        auto b = pool.acquire(static_cast<std::size_t>((i * 37 + t) % 70000));
        if (b.capacity()) b.data()[0] = std::byte{1};
      }
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(pool.outstanding(), 0u);
}

TEST(Engine, RunsPostedWorkInOrderOnItsThread) {
  Engine e(50us);
  e.start();
  std::vector<int> seen;
  std::promise<void> done;
  for (int i = 0; i < 100; ++i) e.post([&seen, i] { seen.push_back(i); });
  e.post([&] {
    EXPECT_TRUE(e.on_engine_thread());
    done.set_value();
  });
  done.get_future().wait();
  EXPECT_FALSE(e.on_engine_thread());
  e.stop();
  ASSERT_EQ(seen.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(seen[static_cast<std::size_t>(i)], i);
}

TEST(Engine, StopIsIdempotentAndRunsQueuedWork) {
  Engine e(0us);
  e.start();
  std::atomic<int> n{0};
  for (int i = 0; i < 10; ++i) e.post([&] { ++n; });
  e.stop();
  e.stop();
  EXPECT_EQ(n.load(), 10);
}

TEST(ReadinessGate, ReportsInputOnlyWhileNobodyPolls) {
  Pair p;
  ReadinessGate gate;
  const int g = gate.watch({p.fd[0]});
  EXPECT_FALSE(readable(g));
  p.send();
  EXPECT_TRUE(readable(g, 1000));
  gate.consume();
  p.drain();
  EXPECT_FALSE(readable(g));

  // Pollers alone leave it open (a short wait costs no system call)...
  gate.add_pollers(1);
  gate.add_pollers(1);
  p.send();
  EXPECT_TRUE(readable(g, 1000)) << "closed before a poller settled";
  gate.consume();
  p.drain();
  // ...and one that settles closes it: input arriving meanwhile is not reported...
  gate.settle();
  p.send();
  EXPECT_FALSE(readable(g, 20));
  gate.add_pollers(-1);
  EXPECT_FALSE(readable(g, 20)) << "reopened while a poller remained";
  // ...until the last poller leaves: then at once, since it is still unread.
  gate.add_pollers(-1);
  EXPECT_TRUE(readable(g, 1000));
  gate.consume();
  p.drain();

  // Input a poller read itself leaves nothing to report after reopening.
  gate.add_pollers(1);
  gate.settle();
  p.send();
  p.drain();
  gate.add_pollers(-1);
  EXPECT_FALSE(readable(g, 20));

  // Settling with nobody polling leaves it open.
  gate.settle();
  p.send();
  EXPECT_TRUE(readable(g, 1000));
  gate.consume();
  p.drain();
}

// The watch hooks run when the count of polling threads leaves zero and when it comes back:
// user threads (add_progressing, nested included) and the engine thread while it spins
// after activity. Each +1 is matched, so every watched is followed by one unwatched.
TEST(Engine, WatchHooksFollowThePollingThreads) {
  Engine e(2000us);
  std::atomic<int> watched{0}, unwatched{0}, now{0};
  std::atomic<bool> paired{true};
  e.set_watch_hooks(
      [&] {
        if (now.fetch_add(1) != 0) paired = false;
        ++watched;
      },
      [&] {
        if (now.fetch_sub(1) != 1) paired = false;
        ++unwatched;
      });
  e.add_progressing(1);
  EXPECT_EQ(watched.load(), 1);
  e.add_progressing(1);
  e.add_progressing(-1);
  EXPECT_EQ(unwatched.load(), 0) << "one thread still polls";
  e.add_progressing(-1);
  EXPECT_EQ(unwatched.load(), 1);
  // The engine thread spins for a while after activity, and counts as watching meanwhile.
  e.start();
  e.post([&] { e.note_activity(); });
  const auto until = std::chrono::steady_clock::now() + 5s;
  while ((watched.load() < 2 || unwatched.load() < 2) && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(1ms);
  EXPECT_GE(watched.load(), 2) << "the spinning engine thread was not counted";
  EXPECT_EQ(watched.load(), unwatched.load()) << "it still counts itself after the spin ended";
  e.stop();
  EXPECT_TRUE(paired.load());
  EXPECT_EQ(now.load(), 0);
}

TEST(ReadinessGate, EveryNewEventReportsAgainAfterConsume) {
  Pair p;
  ReadinessGate gate;
  const int g = gate.watch({p.fd[0]});
  for (int i = 0; i < 3; ++i) {
    p.send();
    ASSERT_TRUE(readable(g, 1000)) << "event " << i;
    gate.consume();
    p.drain();
    EXPECT_FALSE(readable(g)) << "event " << i;
  }
  // Watching stops before the descriptor goes.
  gate.unwatch();
  p.send();
  EXPECT_FALSE(readable(g, 20));
}

// Engine as an EventLoop: `ready` runs on the engine thread each time a watched descriptor
// turns readable, until it returns false or unwatch().
TEST(Engine, WatchCallsReadyUntilItDeclines) {
  Pair p;
  Engine e(0us);
  e.start();
  std::atomic<int> calls{0};
  std::atomic<bool> on_thread{true};
  std::promise<void> second;
  e.post([&] {
    e.watch({p.fd[0]}, [&] {
      if (!e.on_engine_thread()) on_thread = false;
      p.drain();
      if (calls.fetch_add(1) + 1 == 2) {
        second.set_value();
        return false;  // stop watching
      }
      return true;
    });
  });
  p.send();
  for (int i = 0; i < 200 && calls.load() < 1; ++i) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(calls.load(), 1);
  p.send();
  ASSERT_EQ(second.get_future().wait_for(5s), std::future_status::ready);
  // Declined: a third datagram calls nobody.
  p.send();
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(calls.load(), 2);
  EXPECT_TRUE(on_thread.load());
  std::promise<void> done;
  e.post([&] {
    e.unwatch();
    done.set_value();
  });
  done.get_future().wait();
  e.stop();
}

// With more ranks than cores the progress thread must not preempt running ranks when it
// wakes; otherwise it keeps the default policy.
TEST(Engine, PoliteEngineRunsUnderSchedBatch) {
  for (bool polite : {false, true}) {
    Engine e(0us, polite);
    e.start();
    std::promise<int> policy;
    e.post([&] { policy.set_value(sched_getscheduler(0)); });
    EXPECT_EQ(policy.get_future().get(), polite ? SCHED_BATCH : SCHED_OTHER) << "polite=" << polite;
    e.stop();
  }
}
