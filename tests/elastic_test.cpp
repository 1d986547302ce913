// Elastic membership with real processes: a seed process (SeedOptions::elastic), members
// that form the job through it, and joiners that arrive while the job runs and are admitted
// by grow() (src/comm/communicator_impl_membership.cpp, src/transport/joiners.cpp, the late admission in
// src/cluster/seed.cpp and join.cpp). Covers growing (once, twice, with nobody waiting, with
// a split in use), leaving, shrinking and growing back, refused and flooding joiners, and
// joiners, members and the seed dying at the awkward moments.
//
// The test process forks every process before it creates any thread or nexar object:
// first the seed (which writes its address into shared memory), then the members, then the
// joiners when the members are ready for them. Each process checks its own results against
// references it computes itself (RANK_CHECK, tests/process_support.hpp) and the test asserts
// on the exit statuses. Timeouts are short, so a hang shows as a failure within seconds.
#include <nexar/cluster.hpp>
#include <nexar/communicator.hpp>
#include <nexar/error.hpp>

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "process_support.hpp"
#include "support.hpp"

namespace {

using namespace std::chrono_literals;
using nexar::Communicator;
using nexar::Errc;
using nexar::Error;
using nexar::ReduceOp;
using nexar::testing::all_reduce_step;
using nexar::testing::fork_child;
using nexar::testing::ranks_text;
using nexar::testing::try_reap;
using Clock = std::chrono::steady_clock;

constexpr const char* kToken = "elastic-test-token";

// Written by the processes, read by the others and the test (MAP_SHARED survives fork).
struct Shared {
  char seed_addr[64] = {};
  std::atomic<int> seed_up{0};    // the seed wrote its address
  std::atomic<int> stop_seed{0};  // the test tells the seed to stop
  std::atomic<int> ready{0};      // processes at the test's rendezvous point
  std::atomic<int> go{0};         // the test's signal to go on
  std::atomic<int> done{0};       // processes past their part (a second rendezvous)
  std::atomic<int> ready2{0};     // a third rendezvous (counted twice), and its signal
  std::atomic<int> go2{0};
  std::atomic<int> joiner_rank[8]{};           // per joiner: its rank in the grown communicator + 1
  std::atomic<std::uint64_t> comm_id[16]{};    // per process: the id of the grown communicator
  std::atomic<std::uint64_t> old_id{0};        // the id of the communicator before the grow
  std::atomic<long> ops{0};                    // flood: all_reduces completed meanwhile
  std::atomic<long> slowest_us{0};             // flood: the slowest of them
  std::atomic<int> rejected{0}, timed_out{0}, other{0};  // flood: how bogus joins ended
  std::atomic<int> failure_timeout_ms{0};      // a test's own failure timeout (0: config()'s)
  std::atomic<int> ring{0};                    // a test's topology: k_regular:2 (0: full mesh)
};
Shared* S = nullptr;

nexar::Config config() {
  nexar::Config c;
  c.connect_timeout = 5s;
  // A killed process is found at once (its port answers with ICMP unreachable); a silent
  // one after this. Two seconds keep a loaded 2-core machine from declaring a live one dead.
  c.failure_timeout = 2s;
  if (S && S->failure_timeout_ms.load() > 0) c.failure_timeout = std::chrono::milliseconds(S->failure_timeout_ms.load());
  c.op_timeout = 20s;  // far above every bound checked: a hang shows as a failed bound
  c.on_failure = nexar::FailurePolicy::manual;
  c.log_level = std::getenv("NEXAR_DEBUG") ? nexar::Config::from_env().log_level : nexar::LogLevel::off;
  c.yield_when_idle = true;  // more processes than cores
  if (S && S->ring.load()) c.topology = nexar::Topology::parse("k_regular:2");
  return c;
}

nexar::JoinOptions join_options(std::chrono::milliseconds timeout = 30s) {
  nexar::JoinOptions o;
  o.seed = S->seed_addr;
  o.token = kToken;
  o.join_timeout = timeout;
  return o;
}

// ---- in the processes --------------------------------------------------------------------

// Waits until `a` reaches `want`; the process fails after `limit`.
void wait_for(const std::atomic<int>& a, int want, int who, std::chrono::seconds limit = 30s) {
  const auto until = Clock::now() + limit;
  while (a.load() < want) {
    RANK_CHECK(who, Clock::now() < until, "waited " + std::to_string(limit.count()) + " s for a rendezvous");
    std::this_thread::sleep_for(1ms);
  }
}

// Waits until `n` joiners are ready for a grow on this member.
void wait_pending(const Communicator& c, int n, int who) {
  const auto until = Clock::now() + 30s;
  while (c.pending_joiners() < n) {
    RANK_CHECK(who, Clock::now() < until, std::to_string(c.pending_joiners()) + " joiners ready after 30 s");
    std::this_thread::sleep_for(1ms);
  }
  RANK_CHECK(who, c.pending_joiners() == n, std::to_string(c.pending_joiners()) + " joiners ready");
}

// A collective end of a loop: true once every member passed mine = true.
bool all_done(Communicator& c, bool mine) {
  std::int32_t n = mine ? 1 : 0;
  c.all_reduce(std::span(&n, 1), ReduceOp::sum);
  return n == c.size();
}

// The value rank r holds at element i in a check of flavour `salt`.
std::int64_t val(int r, std::size_t i, int salt) {
  return (static_cast<std::int64_t>(r) + 1) * 1000003 + static_cast<std::int64_t>(i) * 7 + salt * 131;
}

std::string at(const char* what, std::size_t i, std::int64_t got, std::int64_t want) {
  std::string s = what;
  s.append("[").append(std::to_string(i)).append("] = ").append(std::to_string(got));
  s.append(", expected ").append(std::to_string(want));
  return s;
}

// Every collective on `c`, odd sizes, roots at both ends, each result checked against a
// reference computed here from the other ranks' values.
void check_collectives(Communicator& c, int who, int salt) {
  const int n = c.size(), me = c.rank();
  {  // all_reduce, latency-bound
    std::vector<std::int64_t> v(1001);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = val(me, i, salt);
    c.all_reduce(v, ReduceOp::sum);
    for (std::size_t i = 0; i < v.size(); ++i) {
      std::int64_t want = 0;
      for (int r = 0; r < n; ++r) want += val(r, i, salt);
      RANK_CHECK(who, v[i] == want, at("all_reduce", i, v[i], want));
    }
  }
  {  // all_reduce, large enough for the ring
    std::vector<double> v(70001);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(val(me, i, salt) % 8191);
    c.all_reduce(v, ReduceOp::max);
    for (std::size_t i = 0; i < v.size(); ++i) {
      std::int64_t want = 0;
      for (int r = 0; r < n; ++r) want = std::max(want, val(r, i, salt) % 8191);
      RANK_CHECK(who, v[i] == static_cast<double>(want), at("all_reduce max", i, static_cast<std::int64_t>(v[i]), want));
    }
  }
  {  // broadcast from the last rank (a joiner, after a grow)
    const int root = n - 1;
    std::vector<std::int64_t> b(777, -1);
    if (me == root)
      for (std::size_t i = 0; i < b.size(); ++i) b[i] = val(root, i, salt);
    c.broadcast(b, root);
    for (std::size_t i = 0; i < b.size(); ++i) RANK_CHECK(who, b[i] == val(root, i, salt), at("broadcast", i, b[i], val(root, i, salt)));
  }
  {  // all_gather
    const std::size_t k = 333;
    std::vector<std::int64_t> s(k), r(k * static_cast<std::size_t>(n), -1);
    for (std::size_t i = 0; i < k; ++i) s[i] = val(me, i, salt);
    c.all_gather(s, r);
    for (int q = 0; q < n; ++q)
      for (std::size_t i = 0; i < k; ++i) {
        const std::int64_t got = r[static_cast<std::size_t>(q) * k + i];
        RANK_CHECK(who, got == val(q, i, salt), at("all_gather", static_cast<std::size_t>(q) * k + i, got, val(q, i, salt)));
      }
  }
  {  // reduce_scatter of a count no world size here divides (1007 = 19 * 53)
    const std::size_t count = 1007;
    std::vector<std::int64_t> s(count);
    for (std::size_t i = 0; i < count; ++i) s[i] = val(me, i, salt);
    const auto block = nexar::block_of(count, n, me);
    std::vector<std::int64_t> r(block.second, -1);
    c.reduce_scatter(s, r, ReduceOp::sum);
    for (std::size_t i = 0; i < block.second; ++i) {
      std::int64_t want = 0;
      for (int q = 0; q < n; ++q) want += val(q, block.first + i, salt);
      RANK_CHECK(who, r[i] == want, at("reduce_scatter", block.first + i, r[i], want));
    }
  }
  {  // all_to_all: block j of rank q goes to rank j
    const std::size_t k = 17, un = static_cast<std::size_t>(n);
    std::vector<std::int64_t> s(k * un), r(k * un, -1);
    for (std::size_t i = 0; i < s.size(); ++i) s[i] = val(me, i, salt);
    c.all_to_all(s, r);
    for (std::size_t q = 0; q < un; ++q)
      for (std::size_t i = 0; i < k; ++i) {
        const std::int64_t want = val(static_cast<int>(q), static_cast<std::size_t>(me) * k + i, salt);
        RANK_CHECK(who, r[q * k + i] == want, at("all_to_all", q * k + i, r[q * k + i], want));
      }
  }
  {  // gather at the middle rank, scatter from rank 0
    const std::size_t k = 45;
    const int root = n / 2;
    std::vector<std::int64_t> s(k), r(me == root ? k * static_cast<std::size_t>(n) : 0, -1);
    for (std::size_t i = 0; i < k; ++i) s[i] = val(me, i, salt) * 3;
    c.gather(s, r, root);
    if (me == root)
      for (std::size_t i = 0; i < r.size(); ++i) {
        const std::int64_t want = val(static_cast<int>(i / k), i % k, salt) * 3;
        RANK_CHECK(who, r[i] == want, at("gather", i, r[i], want));
      }
    const std::size_t m = 29;
    std::vector<std::int64_t> whole(me == 0 ? m * static_cast<std::size_t>(n) : 0), part(m, -1);
    for (std::size_t i = 0; i < whole.size(); ++i) whole[i] = val(static_cast<int>(i / m), i % m, salt) * 5;
    c.scatter(whole, part, 0);
    for (std::size_t i = 0; i < m; ++i) RANK_CHECK(who, part[i] == val(me, i, salt) * 5, at("scatter", i, part[i], val(me, i, salt) * 5));
  }
  {  // inclusive scan
    std::vector<std::int64_t> s(129), r(129, -1);
    for (std::size_t i = 0; i < s.size(); ++i) s[i] = val(me, i, salt);
    c.scan(s, r, ReduceOp::sum);
    for (std::size_t i = 0; i < s.size(); ++i) {
      std::int64_t want = 0;
      for (int q = 0; q <= me; ++q) want += val(q, i, salt);
      RANK_CHECK(who, r[i] == want, at("scan", i, r[i], want));
    }
  }
  c.barrier();
}

// Point-to-point between ranks a and b of `c` (an old member and a joiner, after a grow):
// a sends a small and a large (rendezvous) message, b answers; the others do nothing.
void check_p2p(Communicator& c, int a, int b, int who, int salt) {
  const int me = c.rank();
  if (me != a && me != b) return;
  const int peer = me == a ? b : a;
  for (std::size_t count : {std::size_t{1031}, std::size_t{70003}}) {
    std::vector<std::int64_t> out(count), in(count + 5, -1);
    for (std::size_t i = 0; i < count; ++i) out[i] = val(me, i, salt);
    const int tag = static_cast<int>(count % 1000);
    if (me == a) {
      c.send(peer, tag, out);
      const nexar::Status st = c.recv(peer, tag + 1, in);
      RANK_CHECK(who, st.bytes == count * sizeof(std::int64_t) && st.source == peer, "reply of " + std::to_string(st.bytes) + " bytes");
    } else {
      const nexar::Status st = c.recv(peer, tag, in);
      RANK_CHECK(who, st.bytes == count * sizeof(std::int64_t) && st.source == peer, "message of " + std::to_string(st.bytes) + " bytes");
      c.send(peer, tag + 1, out);
    }
    for (std::size_t i = 0; i < count; ++i) RANK_CHECK(who, in[i] == val(peer, i, salt), at("p2p", i, in[i], val(peer, i, salt)));
  }
}

// The seed process: an elastic seed for a world of `world`, until told to stop.
void run_seed(int world) {
  nexar::SeedOptions o;
  o.listen = "127.0.0.1:0";
  o.world = world;
  o.elastic = true;
  o.token = kToken;
  o.formation_timeout = 30s;
  nexar::Seed seed(o, config());
  const std::string addr = seed.address();
  std::snprintf(S->seed_addr, sizeof S->seed_addr, "%s", addr.c_str());
  S->seed_up.store(1);
  while (S->stop_seed.load() == 0) std::this_thread::sleep_for(2ms);
  seed.stop();
}

void die() { ::kill(::getpid(), SIGKILL); }

// ---- in the test process -----------------------------------------------------------------

// The processes of one elastic job: the seed, `world` members (process i is world rank i),
// and the joiners and other processes a test adds. Whatever still runs when it goes is
// killed.
class Job {
 public:
  explicit Job(int world) : world_(world) { S = &nexar::testing::fresh_shared<Shared>(); }
  ~Job() {
    for (std::size_t i = 0; i < pids_.size(); ++i) end(i);
    if (seed_ > 0 && seed_status_ == -1) {
      ::kill(seed_, SIGKILL);
      int st = 0;
      ::waitpid(seed_, &st, 0);
    }
  }
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  // Forks the seed and waits for its address.
  bool start() {
    const int world = world_;
    seed_ = fork_child("seed", [world] { run_seed(world); });
    return wait_until([] { return S->seed_up.load() != 0; }, 20s);
  }

  // Forks the members; each joins (as rank = its index), runs body(rank, comm) and closes.
  void members(const std::function<void(int, Communicator&)>& body) {
    const int world = world_;
    for (int r = 0; r < world; ++r) {
      spawn("member " + std::to_string(r), [r, world, body] {
        nexar::JoinOptions o = join_options();
        o.rank = r;
        o.world = world;
        Communicator c = nexar::join(o, config());
        RANK_CHECK(r, c.rank() == r && c.size() == world && !c.joined_by_grow(), std::to_string(c.rank()));
        body(r, c);
        c.close();
      });
    }
  }

  // Forks a process that joins the running job and runs body(index, comm) in it; returns
  // its index.
  int joiner(const std::function<void(int, Communicator&)>& body) {
    const int who = static_cast<int>(pids_.size());
    return spawn("joiner " + std::to_string(who), [who, body] {
      Communicator c = nexar::join(join_options(), config());
      body(who, c);
      c.close();
    });
  }

  // Forks a process that runs `body`; returns its index.
  int spawn(const std::string& name, const std::function<void()>& body) {
    pids_.push_back(fork_child(name, body));
    status_.push_back(-1);
    return static_cast<int>(pids_.size()) - 1;
  }

  // Polls `pred` until it holds (true), `limit` passes, or a process failed a check or
  // threw (false).
  bool wait_until(const std::function<bool()>& pred, std::chrono::milliseconds limit) {
    const auto until = Clock::now() + limit;
    for (;;) {
      if (pred()) return true;
      for (std::size_t i = 0; i < pids_.size(); ++i) {
        if (status_[i] == -1) status_[i] = try_reap(pids_[i]);
        if (status_[i] == 1 || status_[i] == 2) {
          ADD_FAILURE() << "process " << i << " failed (status " << status_[i] << ") while the test waited";
          return false;
        }
      }
      if (seed_status_ == -1 && seed_ > 0) seed_status_ = try_reap(seed_);
      if (seed_status_ != -1 && !seed_killed_) {
        ADD_FAILURE() << "the seed ended (status " << seed_status_ << ") while the test waited";
        return false;
      }
      if (Clock::now() > until) {
        ADD_FAILURE() << "waited " << std::chrono::duration_cast<std::chrono::seconds>(limit).count()
                      << " s for the processes";
        return false;
      }
      std::this_thread::sleep_for(2ms);
    }
  }

  // Waits for process `i` to end; returns its status.
  int wait_exit(int i, std::chrono::milliseconds limit) {
    const auto k = static_cast<std::size_t>(i);
    if (status_[k] == -1) status_[k] = nexar::testing::reap_all({pids_[k]}, limit)[0];
    return status_[k];
  }

  void kill(int i) { signal(i, SIGKILL); }
  void signal(int i, int sig) { ::kill(pids_[static_cast<std::size_t>(i)], sig); }

  pid_t seed_pid() const { return seed_; }

  void kill_seed() {
    seed_killed_ = true;
    ::kill(seed_, SIGKILL);
    seed_status_ = nexar::testing::reap_all({seed_}, 10s)[0];
  }

  // Waits for every process, then stops the seed (which must not have failed); returns
  // the processes' statuses in the order they were started.
  std::vector<int> finish(std::chrono::milliseconds limit = 60s) {
    std::vector<pid_t> running;
    for (std::size_t i = 0; i < pids_.size(); ++i)
      if (status_[i] == -1) running.push_back(pids_[i]);
    const std::vector<int> st = nexar::testing::reap_all(running, limit);
    for (std::size_t i = 0, j = 0; i < pids_.size(); ++i)
      if (status_[i] == -1) status_[i] = st[j++];
    if (!seed_killed_) {
      S->stop_seed.store(1);
      if (seed_status_ == -1) seed_status_ = nexar::testing::reap_all({seed_}, 10s)[0];
      EXPECT_EQ(seed_status_, 0) << "the seed process";
    }
    return status_;
  }

 private:
  void end(std::size_t i) {
    if (status_[i] != -1) return;
    ::kill(pids_[i], SIGKILL);
    int st = 0;
    ::waitpid(pids_[i], &st, 0);
    status_[i] = 128 + SIGKILL;
  }

  int world_;
  pid_t seed_ = -1;
  int seed_status_ = -1;
  bool seed_killed_ = false;
  std::vector<pid_t> pids_;
  std::vector<int> status_;
};

void expect_all(const std::vector<int>& status, const std::vector<int>& want) {
  ASSERT_EQ(status.size(), want.size());
  for (std::size_t i = 0; i < status.size(); ++i) EXPECT_EQ(status[i], want[i]) << "process " << i;
}

// How much the seed's resident memory may grow in the flood. AddressSanitizer keeps freed
// memory in quarantine (256 MiB at most by default), so it gets that much more.
constexpr long kSeedGrowthKiB = (32 + (nexar::testing::kSanitized ? 256 : 0)) * 1024;

// VmRSS of process `pid` in KiB (0 if unreadable).
long rss_kib(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::strtol(line.c_str() + 6, nullptr, 10);
  return 0;
}

// ---- tests -------------------------------------------------------------------------------

// 4 -> 6: members keep their ranks, the joiners get 4 and 5 and a communicator with
// joined_by_grow(), everyone the same fresh id; then every collective (a joiner as a root
// too) and point-to-point between old members and joiners give the right results.
TEST(Elastic, GrowFourToSixRunsEveryCollective) {
  Job job(4);
  ASSERT_TRUE(job.start());
  job.members([](int who, Communicator& c) {
    check_collectives(c, who, 1);
    S->old_id.store(c.id());
    S->ready.fetch_add(1);
    wait_pending(c, 2, who);
    Communicator g = c.grow();
    RANK_CHECK(who, g.size() == 6 && g.rank() == who, std::to_string(g.rank()) + " of " + std::to_string(g.size()));
    RANK_CHECK(who, g.id() != c.id() && !g.joined_by_grow() && !c.joined_by_grow(), "id or joined_by_grow");
    RANK_CHECK(who, g.world_ranks() == (std::vector<int>{0, 1, 2, 3, 4, 5}), ranks_text(g.world_ranks()));
    RANK_CHECK(who, c.pending_joiners() == 0, std::to_string(c.pending_joiners()) + " still pending");
    S->comm_id[who].store(g.id());
    check_collectives(g, who, 2);
    check_p2p(g, 1, 5, who, 3);
    check_p2p(g, 4, 0, who, 4);
    // The old world is still usable beside the grown one.
    RANK_CHECK(who, all_reduce_step(c, 7, 555), "the old communicator after the grow");
    g.barrier();
  });
  ASSERT_TRUE(job.wait_until([] { return S->ready.load() == 4; }, 30s));
  auto joined = [](int who, Communicator& g) {
    RANK_CHECK(who, g.joined_by_grow(), "joined_by_grow() is false");
    RANK_CHECK(who, g.size() == 6 && (g.rank() == 4 || g.rank() == 5), std::to_string(g.rank()));
    RANK_CHECK(who, g.world_ranks() == (std::vector<int>{0, 1, 2, 3, 4, 5}), ranks_text(g.world_ranks()));
    S->joiner_rank[who - 4].store(g.rank() + 1);
    S->comm_id[who].store(g.id());
    check_collectives(g, who, 2);
    check_p2p(g, 1, 5, who, 3);
    check_p2p(g, 4, 0, who, 4);
    g.barrier();
  };
  job.joiner(joined);
  job.joiner(joined);
  expect_all(job.finish(), {0, 0, 0, 0, 0, 0});
  EXPECT_EQ((std::set<int>{S->joiner_rank[0].load(), S->joiner_rank[1].load()}), (std::set<int>{5, 6}));
  for (int p = 0; p < 6; ++p) {
    EXPECT_EQ(S->comm_id[p].load(), S->comm_id[0].load()) << "process " << p;
    EXPECT_NE(S->comm_id[p].load(), S->old_id.load()) << "process " << p;
  }
}

// On a ring (k_regular:2), a joiner connects only to its two neighbours in the grown
// world, world ranks 3 and 0; ranks 1 and 2 reach it, and it reaches them, through relays
// (with keys the seed handed out when it was announced). Every collective and p2p between
// non-neighbours work on the grown communicator.
TEST(Elastic, GrowANonNeighbourOnARing) {
  Job job(4);
  S->ring.store(1);
  ASSERT_TRUE(job.start());
  job.members([](int who, Communicator& c) {
    RANK_CHECK(who, c.neighbours() == (std::vector<int>{(who + 3) % 4, (who + 1) % 4}) ||
                        c.neighbours() == (std::vector<int>{(who + 1) % 4, (who + 3) % 4}),
               ranks_text(c.neighbours()));
    S->ready.fetch_add(1);
    wait_pending(c, 1, who);
    Communicator g = c.grow();
    RANK_CHECK(who, g.size() == 5 && g.rank() == who, std::to_string(g.rank()) + " of " + std::to_string(g.size()));
    const std::vector<int> nb = g.neighbours();
    const bool next_to_joiner = who == 0 || who == 3;
    RANK_CHECK(who, (std::find(nb.begin(), nb.end(), 4) != nb.end()) == next_to_joiner, ranks_text(nb));
    check_collectives(g, who, 2);
    check_p2p(g, 2, 4, who, 3);
    check_p2p(g, 4, 1, who, 4);
    g.barrier();
  });
  ASSERT_TRUE(job.wait_until([] { return S->ready.load() == 4; }, 30s));
  job.joiner([](int who, Communicator& g) {
    RANK_CHECK(who, g.joined_by_grow() && g.size() == 5 && g.rank() == 4, std::to_string(g.rank()));
    RANK_CHECK(who, g.neighbours() == (std::vector<int>{0, 3}), ranks_text(g.neighbours()));
    check_collectives(g, who, 2);
    check_p2p(g, 2, 4, who, 3);
    check_p2p(g, 4, 1, who, 4);
    g.barrier();
  });
  expect_all(job.finish(), {0, 0, 0, 0, 0});
}

// A split of the old world is used on a thread of each member throughout the grow (a
// collective loop that ends once every member of the split has grown), and still gives the
// right results afterwards; a split of the grown communicator works too, joiner included.
TEST(Elastic, GrowWhileASplitOfTheOldWorldIsInUse) {
  Job job(4);
  ASSERT_TRUE(job.start());
  job.members([](int who, Communicator& c) {
    Communicator half = c.split(who % 2, -who);  // {2, 0} and {3, 1}
    RANK_CHECK(who, half.size() == 2 && half.rank() == (who < 2 ? 1 : 0), std::to_string(half.rank()));
    S->ready.fetch_add(1);
    wait_pending(c, 1, who);
    std::atomic<bool> grown{false};
    std::atomic<int> rounds{0};
    std::thread user([&] {
      try {
        for (int step = 0;; ++step) {
          RANK_CHECK(who, all_reduce_step(half, step, 513), "split all_reduce at step " + std::to_string(step));
          rounds.fetch_add(1);
          if (all_done(half, grown.load())) break;
        }
      } catch (const std::exception& e) {
        RANK_CHECK(who, false, std::string("split during the grow: ") + e.what());
      }
    });
    while (rounds.load() < 3) std::this_thread::sleep_for(100us);  // the split is busy
    const int before = rounds.load();
    Communicator g = c.grow();
    const int during = rounds.load() - before;
    grown.store(true);
    user.join();
    RANK_CHECK(who, g.size() == 5 && g.rank() == who, std::to_string(g.size()));
    std::printf("member %d: %d all_reduces on the split during the grow, %d in all\n", who, during, rounds.load());
    RANK_CHECK(who, all_reduce_step(half, 1000, 4097), "the split after the grow");
    check_collectives(half, who, 6);
    check_collectives(g, who, 7);
    Communicator third = g.split(g.rank() % 3, g.rank());  // {0, 3}, {1, 4}, {2}
    check_collectives(third, who, 8);
    g.barrier();
  });
  ASSERT_TRUE(job.wait_until([] { return S->ready.load() == 4; }, 30s));
  job.joiner([](int who, Communicator& g) {
    RANK_CHECK(who, g.size() == 5 && g.rank() == 4, std::to_string(g.rank()));
    check_collectives(g, who, 7);
    Communicator third = g.split(g.rank() % 3, g.rank());
    RANK_CHECK(who, third.size() == 2 && third.rank() == 1, std::to_string(third.size()));
    check_collectives(third, who, 8);
    g.barrier();
  });
  expect_all(job.finish(), {0, 0, 0, 0, 0});
}

// A grow with nobody waiting gives the same members under a fresh id; then 4 -> 5 -> 6, the
// first joiner taking part in the second grow as a member.
TEST(Elastic, GrowWithNobodyWaitingThenTwice) {
  Job job(4);
  ASSERT_TRUE(job.start());
  job.members([](int who, Communicator& c) {
    Communicator same = c.grow();
    RANK_CHECK(who, same.size() == 4 && same.rank() == who && same.id() != c.id(), std::to_string(same.size()));
    RANK_CHECK(who, same.world_ranks() == (std::vector<int>{0, 1, 2, 3}), ranks_text(same.world_ranks()));
    RANK_CHECK(who, all_reduce_step(same, 1, 301), "after a grow with nobody waiting");
    S->ready.fetch_add(1);
    wait_pending(same, 1, who);
    Communicator five = same.grow();
    RANK_CHECK(who, five.size() == 5 && five.rank() == who && five.id() != same.id(), std::to_string(five.size()));
    RANK_CHECK(who, all_reduce_step(five, 2, 302), "on five ranks");
    S->done.fetch_add(1);
    wait_pending(five, 1, who);
    Communicator six = five.grow();
    RANK_CHECK(who, six.size() == 6 && six.rank() == who && six.id() != five.id(), std::to_string(six.size()));
    RANK_CHECK(who, six.world_ranks() == (std::vector<int>{0, 1, 2, 3, 4, 5}), ranks_text(six.world_ranks()));
    check_collectives(six, who, 3);
    check_p2p(six, 5, 4, who, 4);
  });
  ASSERT_TRUE(job.wait_until([] { return S->ready.load() == 4; }, 30s));
  job.joiner([](int who, Communicator& five) {
    RANK_CHECK(who, five.size() == 5 && five.rank() == 4 && five.joined_by_grow(), std::to_string(five.rank()));
    RANK_CHECK(who, all_reduce_step(five, 2, 302), "on five ranks");
    S->done.fetch_add(1);
    wait_pending(five, 1, who);
    Communicator six = five.grow();
    RANK_CHECK(who, six.size() == 6 && six.rank() == 4 && !six.joined_by_grow(), std::to_string(six.rank()));
    check_collectives(six, who, 3);
    check_p2p(six, 5, 4, who, 4);
  });
  ASSERT_TRUE(job.wait_until([] { return S->done.load() == 5; }, 30s));
  job.joiner([](int who, Communicator& six) {
    RANK_CHECK(who, six.size() == 6 && six.rank() == 5 && six.joined_by_grow(), std::to_string(six.rank()));
    RANK_CHECK(who, six.world_ranks() == (std::vector<int>{0, 1, 2, 3, 4, 5}), ranks_text(six.world_ranks()));
    check_collectives(six, who, 3);
    check_p2p(six, 5, 4, who, 4);
  });
  expect_all(job.finish(), {0, 0, 0, 0, 0, 0});
}

// A member dies; the survivors shrink (manual policy), then a replacement joins and is grown
// in: the final four are world ranks 0, 1, 3 and 4, and everything works on them.
TEST(Elastic, ShrinkThenGrowBack) {
  Job job(4);
  ASSERT_TRUE(job.start());
  job.members([](int who, Communicator& c) {
    Communicator cur = c;
    bool lost = false;
    for (int step = 0; step < 10000 && !lost; ++step) {
      if (who == 2 && step == 15) die();
      try {
        RANK_CHECK(who, all_reduce_step(cur, step, 999), "wrong sum at step " + std::to_string(step));
      } catch (const Error& e) {
        RANK_CHECK(who, e.code() == Errc::rank_failed && e.failed_ranks() == std::vector<int>{2}, e.what());
        cur = cur.shrink();
        lost = true;
      }
    }
    RANK_CHECK(who, lost, "no failure seen");
    RANK_CHECK(who, cur.world_ranks() == (std::vector<int>{0, 1, 3}), ranks_text(cur.world_ranks()));
    RANK_CHECK(who, all_reduce_step(cur, 5000, 777), "after the shrink");
    S->ready.fetch_add(1);
    wait_pending(cur, 1, who);
    Communicator g = cur.grow();
    RANK_CHECK(who, g.size() == 4 && g.rank() == cur.rank(), std::to_string(g.rank()));
    RANK_CHECK(who, g.world_ranks() == (std::vector<int>{0, 1, 3, 4}), ranks_text(g.world_ranks()));
    check_collectives(g, who, 5);
    check_p2p(g, 3, 2, who, 6);
  });
  ASSERT_TRUE(job.wait_until([] { return S->ready.load() == 3; }, 30s));
  job.joiner([](int who, Communicator& g) {
    RANK_CHECK(who, g.size() == 4 && g.rank() == 3, std::to_string(g.rank()));
    RANK_CHECK(who, g.world_ranks() == (std::vector<int>{0, 1, 3, 4}), ranks_text(g.world_ranks()));
    check_collectives(g, who, 5);
    check_p2p(g, 3, 2, who, 6);
  });
  expect_all(job.finish(), {0, 0, 128 + SIGKILL, 0, 0});
}

// leave() on one member matches the others' grow(): they go on as one rank fewer, the
// leaver's call returns and it exits cleanly. Rank 0 (the agreement's coordinator) leaves
// first, then the last rank of the three that remain.
TEST(Elastic, LeaveWhileTheOthersGrow) {
  Job job(4);
  ASSERT_TRUE(job.start());
  job.members([](int who, Communicator& c) {
    check_collectives(c, who, 1);
    if (who == 0) {
      c.leave();
      RANK_CHECK(who, c.is_open(), "leave() closed the communicator");
      return;
    }
    Communicator three = c.grow();
    RANK_CHECK(who, three.size() == 3 && three.rank() == who - 1, std::to_string(three.rank()));
    RANK_CHECK(who, three.world_ranks() == (std::vector<int>{1, 2, 3}), ranks_text(three.world_ranks()));
    check_collectives(three, who, 2);
    if (who == 3) {
      three.leave();
      return;
    }
    Communicator two = three.grow();
    RANK_CHECK(who, two.size() == 2 && two.rank() == who - 1, std::to_string(two.rank()));
    RANK_CHECK(who, two.world_ranks() == (std::vector<int>{1, 2}), ranks_text(two.world_ranks()));
    check_collectives(two, who, 3);
  });
  expect_all(job.finish(), {0, 0, 0, 0});
}

// A joiner with the wrong token is refused at once (rejected, naming the token) and the job
// runs on undisturbed: nobody waits for it, and a grow admits nobody.
TEST(Elastic, WrongTokenIsRejectedAndTheJobRunsOn) {
  Job job(4);
  ASSERT_TRUE(job.start());
  job.members([](int who, Communicator& c) {
    S->ready.fetch_add(1);
    for (int step = 0;; ++step) {
      RANK_CHECK(who, all_reduce_step(c, step, 257), "wrong sum at step " + std::to_string(step));
      if (all_done(c, S->go.load() != 0)) break;
    }
    RANK_CHECK(who, c.pending_joiners() == 0, std::to_string(c.pending_joiners()));
    Communicator g = c.grow();
    RANK_CHECK(who, g.size() == 4 && g.rank() == who, std::to_string(g.size()));
    check_collectives(g, who, 2);
  });
  ASSERT_TRUE(job.wait_until([] { return S->ready.load() == 4; }, 30s));
  const int bad = job.spawn("impostor", [] {
    nexar::JoinOptions o = join_options(10s);
    o.token = "not-the-token";
    const auto t0 = Clock::now();
    try {
      Communicator c = nexar::join(o, config());
      RANK_CHECK(9, false, "joined with a wrong token as rank " + std::to_string(c.rank()));
    } catch (const Error& e) {
      RANK_CHECK(9, e.code() == Errc::rejected, e.what());
      RANK_CHECK(9, std::string(e.what()).find("token") != std::string::npos, e.what());
      RANK_CHECK(9, Clock::now() - t0 < 5s, e.what());
    }
  });
  EXPECT_EQ(job.wait_exit(bad, 20s), 0);
  S->go.store(1);
  expect_all(job.finish(), {0, 0, 0, 0, 0});
}

// A joiner that no grow takes in gives up at its join timeout (timeout, saying why); the
// members see it go, and their next grow neither admits it nor waits for it.
TEST(Elastic, JoinerThatNoGrowTakesInGivesUp) {
  Job job(4);
  ASSERT_TRUE(job.start());
  job.members([](int who, Communicator& c) {
    S->ready.fetch_add(1);
    wait_pending(c, 1, who);
    S->done.fetch_add(1);
    wait_for(S->go, 1, who);
    const auto until = Clock::now() + 10s;
    while (c.pending_joiners() > 0) {
      RANK_CHECK(who, Clock::now() < until, "a joiner that gave up still counts as pending after 10 s");
      std::this_thread::sleep_for(1ms);
    }
    const auto t0 = Clock::now();
    Communicator g = c.grow();
    const auto took = Clock::now() - t0;
    RANK_CHECK(who, g.size() == 4 && g.rank() == who, std::to_string(g.size()));
    RANK_CHECK(who, took < 1500ms, "grow took " + std::to_string(std::chrono::duration<double>(took).count()) +
                                   " s: it waited for a joiner that is gone");
    check_collectives(g, who, 2);
  });
  ASSERT_TRUE(job.wait_until([] { return S->ready.load() == 4; }, 30s));
  const int patient = job.spawn("patient joiner", [] {
    const auto t0 = Clock::now();
    try {
      // Long enough for every member to see it waiting, even on a loaded machine.
      Communicator c = nexar::join(join_options(4s), config());
      RANK_CHECK(9, false, "joined as rank " + std::to_string(c.rank()) + " although nobody grew");
    } catch (const Error& e) {
      const auto took = Clock::now() - t0;
      RANK_CHECK(9, e.code() == Errc::timeout, e.what());
      RANK_CHECK(9, std::string(e.what()).find("no grow") != std::string::npos, e.what());
      RANK_CHECK(9, took >= 3900ms && took < 8s, std::to_string(std::chrono::duration<double>(took).count()) + " s: " + e.what());
    }
  });
  ASSERT_TRUE(job.wait_until([] { return S->done.load() == 4; }, 30s));
  EXPECT_EQ(job.wait_exit(patient, 20s), 0);
  S->go.store(1);
  expect_all(job.finish(), {0, 0, 0, 0, 0});
}

// 200 joins with a wrong token from 40 threads in 4 processes, and 20000 junk datagrams at
// the seed's port: the running job keeps completing all_reduces with bounded latency, the
// seed's memory stays bounded, and an honest joiner is still admitted afterwards.
TEST(Elastic, FloodOfBogusJoinersDoesNotStallTheJob) {
  Job job(4);
  ASSERT_TRUE(job.start());
  job.members([](int who, Communicator& c) {
    S->ready.fetch_add(1);
    long ops = 0;
    std::int64_t slowest = 0;
    for (int step = 0;; ++step) {
      const auto t0 = Clock::now();
      RANK_CHECK(who, all_reduce_step(c, step, 1023), "wrong sum at step " + std::to_string(step));
      slowest = std::max<std::int64_t>(slowest, std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count());
      ++ops;
      if (all_done(c, S->go.load() != 0)) break;
      std::this_thread::sleep_for(2ms);
    }
    S->ops.fetch_add(ops);
    long seen = S->slowest_us.load();
    while (slowest > seen && !S->slowest_us.compare_exchange_weak(seen, static_cast<long>(slowest))) {
    }
    wait_pending(c, 1, who);
    Communicator g = c.grow();
    RANK_CHECK(who, g.size() == 5 && g.rank() == who, std::to_string(g.size()));
    check_collectives(g, who, 2);
  });
  ASSERT_TRUE(job.wait_until([] { return S->ready.load() == 4; }, 30s));
  std::this_thread::sleep_for(200ms);  // the members' links to the seed settle
  const long rss_before = rss_kib(job.seed_pid());
  constexpr int kFlooders = 4, kThreads = 10, kAttempts = 5;
  std::vector<int> flooders;
  for (int f = 0; f < kFlooders; ++f) {
    flooders.push_back(job.spawn("flooder " + std::to_string(f), [f] {
      std::vector<std::thread> ts;
      for (int t = 0; t < kThreads; ++t) {
        ts.emplace_back([] {
          for (int a = 0; a < kAttempts; ++a) {
            nexar::JoinOptions o = join_options(1500ms);
            o.token = "guessed-token";
            try {
              nexar::join(o, config());
              S->other.fetch_add(1);
            } catch (const Error& e) {
              if (e.code() == Errc::rejected) {
                S->rejected.fetch_add(1);
              } else if (e.code() == Errc::timeout) {
                S->timed_out.fetch_add(1);
              } else {
                S->other.fetch_add(1);
                std::fprintf(stderr, "bogus join ended with %s\n", e.what());
              }
            }
          }
        });
      }
      if (f == 0) {  // and junk at the seed's port: random bytes, some shaped like QUIC Initials
        const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
        RANK_CHECK(100, fd >= 0, "socket");
        sockaddr_in to{};
        to.sin_family = AF_INET;
        const std::string addr = S->seed_addr;
        const auto colon = addr.rfind(':');
        to.sin_port = htons(static_cast<std::uint16_t>(std::stoi(addr.substr(colon + 1))));
        ::inet_pton(AF_INET, addr.substr(0, colon).c_str(), &to.sin_addr);
        std::mt19937 rng(7);
        std::vector<std::uint8_t> junk(1400);
        for (int i = 0; i < 20000; ++i) {
          const std::size_t len = 1 + rng() % junk.size();
          for (std::size_t k = 0; k < len; ++k) junk[k] = static_cast<std::uint8_t>(rng());
          if (i % 2 == 0 && len > 8) {  // long header, version 1, as an Initial would start
            junk[0] = static_cast<std::uint8_t>(0xc0 | (junk[0] & 0x0f));
            junk[1] = 0;
            junk[2] = 0;
            junk[3] = 0;
            junk[4] = 1;
          }
          ::sendto(fd, junk.data(), len, 0, reinterpret_cast<const sockaddr*>(&to), sizeof to);
          if (i % 500 == 0) std::this_thread::sleep_for(1ms);
        }
        ::close(fd);
      }
      for (auto& t : ts) t.join();
    }));
  }
  for (int f : flooders) EXPECT_EQ(job.wait_exit(f, 60s), 0) << "flooder " << f;
  const long rss_after = rss_kib(job.seed_pid());
  S->go.store(1);
  job.joiner([](int who, Communicator& g) {
    RANK_CHECK(who, g.size() == 5 && g.rank() == 4, std::to_string(g.rank()));
    check_collectives(g, who, 2);
  });
  expect_all(job.finish(), {0, 0, 0, 0, 0, 0, 0, 0, 0});
  const int total = kFlooders * kThreads * kAttempts;
  std::printf("bogus joins: %d rejected, %d timed out, %d other; the job did %ld all_reduces meanwhile, the "
              "slowest %.1f ms; seed RSS %ld -> %ld KiB\n",
              S->rejected.load(), S->timed_out.load(), S->other.load(), S->ops.load(), S->slowest_us.load() / 1000.0,
              rss_before, rss_after);
  EXPECT_EQ(S->rejected.load() + S->timed_out.load(), total);
  EXPECT_EQ(S->other.load(), 0);
  EXPECT_GT(S->rejected.load(), 0) << "the seed answered none of them";
  EXPECT_GT(S->ops.load(), 4 * 20) << "the job made (almost) no progress during the flood";
  EXPECT_LT(S->slowest_us.load(), 3000000) << "an all_reduce took over 3 s during the flood";
  ASSERT_GT(rss_before, 0);
  EXPECT_LT(rss_after, rss_before + kSeedGrowthKiB) << "the seed grew by " << (rss_after - rss_before) << " KiB";
}

// A joiner is SIGKILLed once every member sees it ready, just before they call grow(). The
// grow either leaves it out or admits it and the new communicator fails promptly with
// rank_failed, so that a shrink removes it: never a hang, and the final four work. Then a
// second joiner dies before the grow and the members see it go: the grow leaves it out.
TEST(Elastic, JoinerDiesDuringGrow) {
  Job job(4);
  ASSERT_TRUE(job.start());
  job.members([](int who, Communicator& c) {
    S->ready.fetch_add(1);
    wait_pending(c, 1, who);
    S->done.fetch_add(1);
    wait_for(S->go, 1, who);
    const auto t0 = Clock::now();
    Communicator g = c.grow();
    Communicator last = g;
    if (g.size() == 5) {  // admitted: the first operation finds it dead
      try {
        all_reduce_step(g, 1, 333);
        RANK_CHECK(who, false, "an all_reduce with a dead member succeeded");
      } catch (const Error& e) {
        RANK_CHECK(who, e.code() == Errc::rank_failed && e.failed_ranks() == std::vector<int>{4}, e.what());
      }
      last = g.shrink();
    }
    const auto took = Clock::now() - t0;
    std::printf("member %d: the grow %s the dead joiner; %.0f ms to a working communicator\n", who,
                g.size() == 5 ? "admitted" : "left out", std::chrono::duration<double, std::milli>(took).count());
    RANK_CHECK(who, took < 8s, "recovery took too long");
    RANK_CHECK(who, last.size() == 4 && last.rank() == who, std::to_string(last.size()));
    RANK_CHECK(who, last.world_ranks() == (std::vector<int>{0, 1, 2, 3}), ranks_text(last.world_ranks()));
    check_collectives(last, who, 4);

    S->ready2.fetch_add(1);
    wait_pending(last, 1, who);
    S->ready2.fetch_add(1);
    wait_for(S->go2, 1, who);
    const auto until = Clock::now() + 10s;
    while (last.pending_joiners() > 0) {
      RANK_CHECK(who, Clock::now() < until, "a dead joiner still counts as pending after 10 s");
      std::this_thread::sleep_for(1ms);
    }
    Communicator same = last.grow();
    RANK_CHECK(who, same.size() == 4 && same.rank() == who && same.id() != last.id(), std::to_string(same.size()));
    check_collectives(same, who, 5);
  });
  auto doomed = [](int who, Communicator&) { RANK_CHECK(who, false, "a doomed joiner was welcomed"); };
  ASSERT_TRUE(job.wait_until([] { return S->ready.load() == 4; }, 30s));
  const int first = job.joiner(doomed);
  ASSERT_TRUE(job.wait_until([] { return S->done.load() == 4; }, 30s));
  job.kill(first);
  S->go.store(1);
  ASSERT_TRUE(job.wait_until([] { return S->ready2.load() == 4; }, 30s));
  const int second = job.joiner(doomed);
  ASSERT_TRUE(job.wait_until([] { return S->ready2.load() == 8; }, 30s));
  job.kill(second);
  S->go2.store(1);
  expect_all(job.finish(), {0, 0, 0, 0, 128 + SIGKILL, 128 + SIGKILL});
}

// A member dies just after the others entered grow() with a joiner waiting: their grow
// completes without it (and with the joiner), and everything works on the new four.
TEST(Elastic, MemberDiesDuringGrow) {
  Job job(4);
  ASSERT_TRUE(job.start());
  job.members([](int who, Communicator& c) {
    S->ready.fetch_add(1);
    wait_pending(c, 1, who);
    S->done.fetch_add(1);
    wait_for(S->done, 4, who);
    if (who == 3) {
      std::this_thread::sleep_for(50ms);  // the others are inside grow() by now
      die();
    }
    const auto t0 = Clock::now();
    Communicator g = c.grow();
    const auto took = Clock::now() - t0;
    RANK_CHECK(who, took < 8s, "grow took too long");
    RANK_CHECK(who, g.size() == 4 && g.rank() == who, std::to_string(g.size()));
    RANK_CHECK(who, g.world_ranks() == (std::vector<int>{0, 1, 2, 4}), ranks_text(g.world_ranks()));
    check_collectives(g, who, 5);
    check_p2p(g, 3, 0, who, 6);
  });
  ASSERT_TRUE(job.wait_until([] { return S->ready.load() == 4; }, 30s));
  job.joiner([](int who, Communicator& g) {
    RANK_CHECK(who, g.size() == 4 && g.rank() == 3, std::to_string(g.rank()));
    RANK_CHECK(who, g.world_ranks() == (std::vector<int>{0, 1, 2, 4}), ranks_text(g.world_ranks()));
    check_collectives(g, who, 5);
    check_p2p(g, 3, 0, who, 6);
  });
  expect_all(job.finish(), {0, 0, 0, 128 + SIGKILL, 0});
}

// A member dies just after the grow decided (with it and a joiner in), before the joiner,
// held up meanwhile (SIGSTOP, as a descheduled process would be), took its welcome: the new
// communicator is revoked like any with a failed member, on the joiner too, and one shrink
// of everyone, the joiner included, gives the four that work.
TEST(Elastic, MemberDiesJustAfterGrowBeforeTheJoinerIsWelcomed) {
  Job job(4);
  // The joiner is stopped for the whole grow: far more than its length on a loaded machine,
  // so nobody declares it failed (the killed member is found through ICMP, not silence).
  S->failure_timeout_ms.store(8000);
  ASSERT_TRUE(job.start());
  job.members([](int who, Communicator& c) {
    S->ready.fetch_add(1);
    wait_pending(c, 1, who);
    S->done.fetch_add(1);
    wait_for(S->go, 1, who);
    Communicator g = c.grow();
    RANK_CHECK(who, g.size() == 5 && g.rank() == who, std::to_string(g.size()));
    if (who == 3) die();
    S->ready2.fetch_add(1);
    const auto t0 = Clock::now();
    try {
      all_reduce_step(g, 1, 333);
      RANK_CHECK(who, false, "an all_reduce with a dead member succeeded");
    } catch (const Error& e) {
      RANK_CHECK(who, e.code() == Errc::rank_failed && e.failed_ranks() == std::vector<int>{3}, e.what());
    }
    Communicator last = g.shrink();
    const auto took = Clock::now() - t0;
    RANK_CHECK(who, took < 8s, "recovery took " + std::to_string(std::chrono::duration<double>(took).count()) + " s");
    RANK_CHECK(who, last.size() == 4 && last.rank() == who, std::to_string(last.size()));
    RANK_CHECK(who, last.world_ranks() == (std::vector<int>{0, 1, 2, 4}), ranks_text(last.world_ranks()));
    check_collectives(last, who, 3);
  });
  ASSERT_TRUE(job.wait_until([] { return S->ready.load() == 4; }, 30s));
  const int j = job.joiner([](int who, Communicator& g) {
    RANK_CHECK(who, g.size() == 5 && g.rank() == 4, std::to_string(g.size()));
    try {
      all_reduce_step(g, 1, 333);
      RANK_CHECK(who, false, "an all_reduce with a dead member succeeded");
    } catch (const Error& e) {
      RANK_CHECK(who, e.code() == Errc::rank_failed && e.failed_ranks() == std::vector<int>{3}, e.what());
    }
    Communicator last = g.shrink();
    RANK_CHECK(who, last.size() == 4 && last.rank() == 3, std::to_string(last.size()));
    RANK_CHECK(who, last.world_ranks() == (std::vector<int>{0, 1, 2, 4}), ranks_text(last.world_ranks()));
    check_collectives(last, who, 3);
  });
  ASSERT_TRUE(job.wait_until([] { return S->done.load() == 4; }, 30s));
  job.signal(j, SIGSTOP);
  S->go.store(1);
  // The survivors grew and then hear of the death (ICMP from the dead port, within a few
  // heartbeats); well within the failure timeout, so nobody gives up on the stopped joiner.
  ASSERT_TRUE(job.wait_until([] { return S->ready2.load() == 3; }, 30s));
  std::this_thread::sleep_for(400ms);
  job.signal(j, SIGCONT);
  expect_all(job.finish(), {0, 0, 0, 128 + SIGKILL, 0});
}

// The seed is SIGKILLed after formation: the job works on (collectives, a grow with nobody
// to admit), and a later joiner fails within its join timeout with an error naming the seed.
TEST(Elastic, SeedKilledAfterFormation) {
  Job job(4);
  ASSERT_TRUE(job.start());
  job.members([](int who, Communicator& c) {
    S->ready.fetch_add(1);
    wait_for(S->go, 1, who);
    check_collectives(c, who, 1);
    Communicator g = c.grow();
    RANK_CHECK(who, g.size() == 4 && g.rank() == who && g.id() != c.id(), std::to_string(g.size()));
    for (int step = 0;; ++step) {
      RANK_CHECK(who, all_reduce_step(g, step, 129), "wrong sum at step " + std::to_string(step));
      if (all_done(g, S->done.load() != 0)) break;
      std::this_thread::sleep_for(1ms);
    }
    RANK_CHECK(who, g.pending_joiners() == 0, std::to_string(g.pending_joiners()));
    check_collectives(g, who, 2);
  });
  ASSERT_TRUE(job.wait_until([] { return S->ready.load() == 4; }, 30s));
  job.kill_seed();
  S->go.store(1);
  const int late = job.spawn("late joiner", [] {
    const auto t0 = Clock::now();
    try {
      Communicator c = nexar::join(join_options(3s), config());
      RANK_CHECK(9, false, "joined without a seed as rank " + std::to_string(c.rank()));
    } catch (const Error& e) {
      const auto took = Clock::now() - t0;
      RANK_CHECK(9, e.code() == Errc::timeout, e.what());
      RANK_CHECK(9, std::string(e.what()).find(std::string("seed ") + S->seed_addr) != std::string::npos, e.what());
      RANK_CHECK(9, took >= 2500ms && took < 6s, std::to_string(std::chrono::duration<double>(took).count()) + " s: " + e.what());
      std::printf("late joiner: %s\n", e.what());
    }
  });
  EXPECT_EQ(job.wait_exit(late, 20s), 0);
  S->done.store(1);
  expect_all(job.finish(), {0, 0, 0, 0, 0});
}

}  // namespace
