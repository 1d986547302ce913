// The shared-memory path between ranks of one host (transport/shm_link.*, shm_hub.*): every
// pair of a local world moves its message lanes onto it; messages keep their order across
// the switch; credit holds a sender back without losing a byte; results match references;
// a process that guesses an attach socket gets nothing; Config::shm = false keeps QUIC.
#include <gtest/gtest.h>

#include <fstream>
#include <future>
#include <numeric>
#include <random>
#include <sstream>
#include <thread>

#include <nexar/nexar.hpp>

#include "cluster/local.hpp"
#include "comm/communicator_impl.hpp"
#include "core/access.hpp"
#include "shm/attach.hpp"
#include "shm/doorbell.hpp"
#include "support.hpp"
#include "traffic_support.hpp"
#include "transport/node.hpp"
#include "transport/shm_hub.hpp"
#include "transport/shm_link.hpp"

using namespace nexar;
using namespace std::chrono_literals;
using nexar::testing::test_config;

namespace {

detail::Node& node_of(Communicator& c) { return detail::Access::impl(c)->node(); }

std::size_t shm_peers(Communicator& c) {
  auto& n = node_of(c);
  return nexar::testing::on_engine(n.engine(), [&] { return n.shm_peers().size(); });
}

// Waits until every rank of `w` reaches every other through shared memory.
bool all_attached(std::vector<Communicator>& w, std::chrono::milliseconds limit = 10s) {
  const auto until = std::chrono::steady_clock::now() + limit;
  for (;;) {
    bool all = true;
    for (auto& c : w) all = all && shm_peers(c) == w.size() - 1;
    if (all) return true;
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(5ms);
  }
}

template <class F>
void on_ranks(std::vector<Communicator>& w, F f) {
  std::vector<std::thread> t;
  std::vector<std::string> errors(w.size());
  for (std::size_t r = 0; r < w.size(); ++r) {
    t.emplace_back([&, r] {
      try {
        f(w[r], static_cast<int>(r));
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& x : t) x.join();
  for (std::size_t r = 0; r < w.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

}  // namespace

TEST(ShmLink, EveryPairOfALocalWorldMovesToSharedMemory) {
  auto w = bootstrap_local(4, test_config());
  ASSERT_TRUE(all_attached(w)) << "not every pair attached within 10 s";
}

TEST(ShmLink, ConfigOffKeepsEveryPairOnQuic) {
  Config c = test_config();
  c.shm = false;
  auto w = bootstrap_local(3, c);
  std::vector<float> x{1, 2, 3};
  on_ranks(w, [&](Communicator& comm, int) {
    std::vector<float> y = x;
    comm.all_reduce(std::span<float>(y), ReduceOp::sum);
  });
  for (auto& comm : w) EXPECT_EQ(shm_peers(comm), 0u);
}

// A communicator is returned once its same-host peers are on shared memory, so its first
// operations are as fast as its later ones: no waiting here.
TEST(ShmLink, ACommunicatorStartsOnSharedMemory) {
  auto w = bootstrap_local(3, test_config());
  for (std::size_t r = 0; r < w.size(); ++r) EXPECT_EQ(shm_peers(w[r]), w.size() - 1) << "rank " << r;
}

// Ranks with shared memory off, below and above ranks with it on: the lower one says it
// offers none, the higher one declines the offer it gets. Every start returns with each
// pair's question answered (none gave up waiting), the pairs that can share memory do, and
// the world works.
TEST(ShmLink, PeersWithoutSharedMemoryAnswerSoNobodyWaits) {
  const Config on = test_config();
  Config off = on;
  off.shm = false;
  const std::vector<Config> cfg = {off, on, on, off};
  auto plans = cluster::plan_local(4, on);
  std::vector<std::future<Communicator>> started;
  for (int r = 0; r < 4; ++r)
    started.push_back(std::async(std::launch::async, [&, r] {
      return cluster::start_node(std::move(plans[static_cast<std::size_t>(r)]), cfg[static_cast<std::size_t>(r)]);
    }));
  std::vector<Communicator> w;
  for (auto& f : started) w.push_back(f.get());
  // A rank without shared memory does not wait in start() for its peers' answers (ranks 0
  // and 3 here): they may still be on the way when it returns, but arrive well within the
  // 3 s a rank with shared memory would wait (Node::kShmSettleLimit).
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  for (int r = 0; r < 4; ++r) {
    auto& n = node_of(w[static_cast<std::size_t>(r)]);
    int settled = 0;
    for (;;) {
      settled = nexar::testing::on_engine(n.engine(), [&] {
        int k = 0;
        for (int q = 0; q < 4; ++q)
          if (q != r && n.peer(q)->shm_settled()) ++k;
        return k;
      });
      if (settled == 3 || std::chrono::steady_clock::now() > until) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_EQ(settled, 3) << "rank " << r << " got no answer from every peer within 2 s";
  }
  EXPECT_EQ(shm_peers(w[1]), 1u);
  EXPECT_EQ(shm_peers(w[2]), 1u);
  EXPECT_EQ(shm_peers(w[0]), 0u);
  EXPECT_EQ(shm_peers(w[3]), 0u);
  on_ranks(w, [&](Communicator& comm, int r) {
    std::vector<double> y{r + 1.0};
    comm.all_reduce(std::span<double>(y), ReduceOp::sum);
    if (y[0] != 10.0) throw std::runtime_error("wrong sum");
  });
}

// Messages from the first moment on, so that the switch falls in the middle of the stream:
// eager and rendezvous sizes on the data lane, each numbered, must arrive in order.
TEST(ShmLink, OrderHoldsAcrossTheSwitch) {
  Config c = test_config();
  c.eager_limit = 4096;
  auto w = bootstrap_local(2, c);
  constexpr int kMessages = 600;
  auto size_of = [](int i) { return static_cast<std::size_t>((i * 7919) % 20000 + 1); };
  std::thread sender([&] {
    for (int i = 0; i < kMessages; ++i) {
      auto b = nexar::testing::random_bytes(size_of(i), static_cast<std::uint64_t>(i));
      std::memcpy(b.data(), &i, std::min(sizeof i, b.size()));
      w[1].send(0, 5, std::span<const std::byte>(b));
    }
  });
  for (int i = 0; i < kMessages; ++i) {
    std::vector<std::byte> got(size_of(i));
    w[0].recv(1, 5, std::span<std::byte>(got));
    auto want = nexar::testing::random_bytes(size_of(i), static_cast<std::uint64_t>(i));
    std::memcpy(want.data(), &i, std::min(sizeof i, want.size()));
    ASSERT_EQ(got, want) << "message " << i << " out of order or damaged";
  }
  sender.join();
  EXPECT_TRUE(all_attached(w));
}

// The receiver posts nothing while 32 MiB of eager messages arrive: once unexpected_limit
// is buffered its credit stops coming back, so no more than about one stream window
// (16 MiB) beyond it leaves the sender, and every byte still arrives, in order.
TEST(ShmLink, CreditHoldsTheSenderWithoutLosingBytes) {
  Config c = test_config();
  c.unexpected_limit = 1 << 20;
  c.eager_limit = 64 * 1024;
  auto w = bootstrap_local(2, c);
  ASSERT_TRUE(all_attached(w));
  constexpr int kMessages = 512;
  std::thread sender([&] {
    for (int i = 0; i < kMessages; ++i) {
      std::vector<std::uint32_t> v(16 * 1024, static_cast<std::uint32_t>(i));
      w[1].send(0, 9, std::span<const std::uint32_t>(v));
    }
  });
  sender.join();  // eager sends complete once queued
  std::this_thread::sleep_for(300ms);
  auto& n1 = node_of(w[1]);
  const std::uint64_t held_back =
      nexar::testing::on_engine(n1.engine(), [&] { return n1.peer(0)->unacked(); });
  EXPECT_GT(held_back, 12u << 20) << "the receiver's credit did not hold the sender back";
  for (int i = 0; i < kMessages; ++i) {
    std::vector<std::uint32_t> v(16 * 1024);
    w[0].recv(1, 9, std::span<std::uint32_t>(v));
    ASSERT_EQ(v.front(), static_cast<std::uint32_t>(i));
    ASSERT_EQ(v.back(), static_cast<std::uint32_t>(i));
  }
}

// Collectives of odd sizes on 3 ranks once every pair is on shared memory, against sums
// computed here; a bulk message larger than a ring; any-source receives.
TEST(ShmLink, ResultsMatchReferences) {
  auto w = bootstrap_local(3, test_config());
  ASSERT_TRUE(all_attached(w));
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{1001}, std::size_t{3'000'017}}) {
    std::vector<std::vector<std::int64_t>> in(3);
    for (int r = 0; r < 3; ++r) {
      in[r].resize(n);
      std::mt19937_64 g(static_cast<std::uint64_t>(n * 3 + static_cast<std::size_t>(r)));
      for (auto& x : in[r]) x = static_cast<std::int64_t>(g() % 1000000) - 500000;
    }
    std::vector<std::int64_t> sum(n);
    for (std::size_t i = 0; i < n; ++i) sum[i] = in[0][i] + in[1][i] + in[2][i];
    on_ranks(w, [&](Communicator& comm, int r) {
      std::vector<std::int64_t> y = in[static_cast<std::size_t>(r)];
      comm.all_reduce(std::span<std::int64_t>(y), ReduceOp::sum);
      if (y != sum) throw std::runtime_error("all_reduce of " + std::to_string(n) + " differs");
      std::vector<std::int64_t> all(3 * n);
      comm.all_gather(std::span<const std::int64_t>(in[static_cast<std::size_t>(r)]), std::span<std::int64_t>(all));
      for (int q = 0; q < 3; ++q)
        if (!std::equal(in[q].begin(), in[q].end(), all.begin() + static_cast<std::ptrdiff_t>(q * n)))
          throw std::runtime_error("all_gather of " + std::to_string(n) + " differs");
    });
  }
  const auto big = nexar::testing::random_bytes(5'000'003, 77);
  std::thread s([&] { w[2].bulk_send(0, 1, std::span<const std::byte>(big)); });
  std::vector<std::byte> got(big.size());
  w[0].bulk_recv(2, 1, std::span<std::byte>(got));
  s.join();
  EXPECT_EQ(got, big);
  std::thread a([&] { w[1].send(0, 3, std::span<const int>(std::vector<int>{11})); });
  std::thread b([&] { w[2].send(0, 3, std::span<const int>(std::vector<int>{22})); });
  int sum2 = 0;
  for (int i = 0; i < 2; ++i) {
    int v = 0;
    w[0].recv(any_source, 3, std::span<int>(&v, 1));
    sum2 += v;
  }
  a.join();
  b.join();
  EXPECT_EQ(sum2, 33);
}

// Any process of this user and network namespace can see the listeners' names in
// /proc/net/unix. One that connects claiming a rank, without that rank's TLS session to
// prove it, is refused, and the world goes on working.
TEST(ShmLink, AGuessedAttachIsRefused) {
  auto w = bootstrap_local(2, test_config(LogLevel::off));
  ASSERT_TRUE(all_attached(w));
  std::ifstream unix_sockets("/proc/net/unix");
  std::string line, name;
  while (std::getline(unix_sockets, line)) {
    const auto at = line.find("@nexar-shm-");
    if (at != std::string::npos) name = line.substr(at + 1);
  }
  ASSERT_FALSE(name.empty()) << "no attach socket listed in /proc/net/unix";
  shm::Doorbell bell;
  shm::Proof guess{};
  for (std::uint32_t rank : {0u, 1u, 2u}) {
    EXPECT_THROW(shm::attach(name, rank, guess, bell.fd(), 2s), Error) << "rank " << rank;
  }
  std::vector<double> x{1.5};
  on_ranks(w, [&](Communicator& comm, int) {
    std::vector<double> y = x;
    comm.all_reduce(std::span<double>(y), ReduceOp::sum);
    if (y[0] != 3.0) throw std::runtime_error("wrong sum");
  });
}

// With no spinning at all (NEXAR_SPIN_US=0) every wake-up is a doorbell: a bulk transfer,
// which moves 64 KiB per engine turn, must still go on to the end without waiting for an
// unrelated packet (a heartbeat) between turns.
TEST(ShmLink, BulkTransferGoesOnWithoutSpinning) {
  Config c = test_config();
  c.spin = std::chrono::microseconds(0);
  auto w = bootstrap_local(2, c);
  ASSERT_TRUE(all_attached(w));
  const auto big = nexar::testing::random_bytes(32u << 20, 5);
  const auto t0 = std::chrono::steady_clock::now();
  std::thread s([&] { w[0].bulk_send(1, 2, std::span<const std::byte>(big)); });
  std::vector<std::byte> got(big.size());
  w[1].bulk_recv(0, 2, std::span<std::byte>(got));
  s.join();
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(got, big);
  // 512 turns of 64 KiB: at one heartbeat period (300 ms) per turn it would take minutes.
  EXPECT_LT(took, 10s) << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms";
}

// The bulk lane's turn shrinks while another lane moves bytes on the link, so whoever copies
// it holds a barrier up for less; it grows back once they are quiet. Checked on the bytes
// one flush puts in the bulk ring, through a link whose creator side writes into a real
// segment and whose other side reads it.
TEST(ShmLink, BulkTakesSmallTurnsWhileOtherLanesMove) {
  // Declared before the links: the writer's destructor fails the chunk still waiting.
  std::vector<std::uint8_t> data(512 * 1024, 7);
  bool done = false;
  std::shared_ptr<shm::Segment> seg = shm::Segment::create(1u << 20, 1u << 20);
  shm::Doorbell mine, theirs;
  detail::ShmLink writer(seg, true, ::dup(theirs.fd()), mine.fd());
  detail::ShmLink reader(seg, false, ::dup(mine.fd()), theirs.fd());
  const int bulk = detail::ShmLink::index(wire::Lane::bulk);
  const int coll = detail::ShmLink::index(wire::Lane::collective);
  writer.push(bulk, quic::Chunk{data.data(), data.size(), [&](Errc, const std::string&) { done = true; }});
  auto in_ring = [&] {
    bool broken = false;
    std::size_t n = reader.in(bulk).readable(broken).size();
    EXPECT_FALSE(broken);
    return n;
  };
  // push() wrote one quiet turn.
  const std::size_t quiet = in_ring();
  EXPECT_EQ(quiet, writer.quantum(bulk));
  EXPECT_GE(quiet, 32u * 1024);
  // Times a day away on either side, so that no pause of this thread can change the answer.
  const auto now = detail::ShmLink::Clock::now();
  const auto busy_for_a_day = now + 24h;
  const auto quiet_for_a_day = now - 24h;
  writer.note_moved(coll, busy_for_a_day);
  const std::size_t busy = writer.quantum(bulk);
  EXPECT_LT(busy, quiet);
  EXPECT_GT(busy, 0u);
  bool moved = false, more = false;
  ASSERT_TRUE(writer.flush(moved, more));
  EXPECT_TRUE(moved);
  EXPECT_TRUE(more) << "bytes are left and the turn ended at its quantum";
  EXPECT_EQ(in_ring(), quiet + busy);
  // Data and collective lanes are never cut into turns.
  EXPECT_EQ(writer.quantum(coll), ~std::size_t{0});
  EXPECT_FALSE(done);
  // The reader's side sees its own traffic only: quiet until one of its lanes moves.
  EXPECT_EQ(reader.quantum(bulk), quiet);
  reader.note_moved(detail::ShmLink::index(wire::Lane::data), busy_for_a_day);
  EXPECT_EQ(reader.quantum(bulk), busy);
  // Moving bulk bytes does not count as another lane's traffic.
  reader.note_moved(bulk, busy_for_a_day + 1h);
  EXPECT_EQ(reader.quantum(bulk), busy);
  // Once the other lanes have been quiet longer than the window, the turn grows back.
  reader.note_moved(detail::ShmLink::index(wire::Lane::data), quiet_for_a_day);
  writer.note_moved(coll, quiet_for_a_day);
  EXPECT_EQ(reader.quantum(bulk), quiet);
  EXPECT_EQ(writer.quantum(bulk), quiet);
}

// Bulk data in small turns beside a stream of barriers, small all_reduces and sends in
// both directions: every byte of the bulk transfer arrives intact and every small result
// is right.
TEST(ShmLink, BulkBesideSmallTrafficArrivesIntact) {
  auto w = bootstrap_local(2, test_config());
  ASSERT_TRUE(all_attached(w));
  EXPECT_EQ(nexar::testing::bulk_beside_small_traffic(w, 24'000'011, 300), "");
}

// Ranks that keep starting and stopping to poll (a spin of a few microseconds, and pauses
// between operations) while small and ring-filling messages cross: every hand-over between
// a polling rank and a sleeping one must keep its wake-up (transport/shm_presence.hpp).
// Heartbeats, which would otherwise rescue a lost wake-up within a few hundred
// milliseconds, are made rare, and each operation's deadline is short: a lost wake-up fails
// the operation instead of slowing it down.
TEST(ShmLink, NoWakeUpIsLostWhileRanksStartAndStopPolling) {
  Config c = test_config();
  c.spin = std::chrono::microseconds(5);
  c.failure_timeout = std::chrono::seconds(60);
  c.op_timeout = std::chrono::seconds(5);
  c.shm_ring_bytes = 64 * 1024;
  // Two ranks: with more ranks than cores, bootstrap_local would make waits spin for 1 ms.
  auto w = bootstrap_local(2, c);
  ASSERT_TRUE(all_attached(w));
  const auto big = nexar::testing::random_bytes(200'003, 11);
  on_ranks(w, [&](Communicator& comm, int r) {
    const int n = comm.size();
    const int right = (r + 1) % n, left = (r + n - 1) % n;
    std::mt19937 rng(static_cast<unsigned>(r) + 1);
    std::uniform_int_distribution<int> pause_us(0, 30);
    std::vector<std::byte> got(big.size());
    for (std::uint64_t round = 0; round < 1500; ++round) {
      std::uint64_t out[8], in[8] = {};
      for (auto& v : out) v = round * 8 + static_cast<std::uint64_t>(r);
      auto s = comm.isend(right, 1, out, sizeof out);
      comm.recv(left, 1, in, sizeof in);
      s.wait();
      for (auto v : in)
        if (v != round * 8 + static_cast<std::uint64_t>(left)) throw std::runtime_error("wrong message in round " + std::to_string(round));
      if (round % 100 == 7) {
        // Larger than the ring: the writer waits for room the reader frees.
        auto sb = comm.isend(right, 2, big.data(), big.size());
        comm.recv(left, 2, got.data(), got.size());
        sb.wait();
        if (got != big) throw std::runtime_error("wrong large message in round " + std::to_string(round));
      }
      if (round % 50 == 3) {
        double x = r + 1.0;
        comm.all_reduce(std::span<double>(&x, 1), ReduceOp::sum);
        if (x != n * (n + 1) / 2.0) throw std::runtime_error("wrong sum in round " + std::to_string(round));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(pause_us(rng)));
    }
  });
}
