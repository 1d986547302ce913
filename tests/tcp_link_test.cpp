// The TCP link (Config::link = tcp; transport/tcp_link.*, tcp_hub.*) between real ranks on
// loopback, shared memory off so every pair takes it: every collective and point-to-point
// lane gives exactly the reference once every pair moved its three message lanes over, with
// TLS and in plaintext; ranks that disagree about the link or the cipher stay on QUIC and
// still agree on every result; with TLS no payload byte crosses the wire in the clear (and
// in plaintext it does: the capture sees the link); and a rank killed mid all_reduce is
// named by the survivors within a second.
#include <nexar/nexar.hpp>

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "cluster/local.hpp"
#include "collective_battery.hpp"
#include "comm/group.hpp"
#include "core/access.hpp"
#include "local_processes.hpp"
#include "support.hpp"
#include "transport/node.hpp"
#include "transport/peer.hpp"

namespace {

using namespace std::chrono_literals;
using nexar::Communicator;
using nexar::Errc;
using nexar::LinkKind;
using nexar::ReduceOp;
using nexar::TcpCipher;
using nexar::testing::on_every_rank;
using nexar::testing::battery::sum_of_all;
using nexar::testing::battery::values;

nexar::Config config(TcpCipher cipher, LinkKind link = LinkKind::tcp) {
  nexar::Config c = nexar::testing::test_config();
  c.shm = false;  // the ranks share a host: keep their messages off shared memory
  c.link = link;
  c.tcp_cipher = cipher;
  c.connections_per_peer = 1;
  c.bulk_scavenger = false;  // bulk keeps to QUIC under its scavenger window: take TCP here
  return c;
}

// Lanes of rank `c`'s pair with `peer` that moved to TCP both ways.
int tcp_lanes(Communicator& c, int peer) {
  auto& node = nexar::detail::Access::group(c)->node();
  return nexar::testing::on_engine(node.engine(), [&] { return node.peer(peer)->tcp_lanes(); });
}

// Waits until every pair has `want` lanes on TCP (the links attach after the pairs are
// up); returns whether they did within 10 s.
bool every_pair_on_tcp(std::vector<Communicator>& comms, int want) {
  const int n = static_cast<int>(comms.size());
  for (int i = 0; i < 1000; ++i) {
    bool all = true;
    for (int r = 0; r < n && all; ++r)
      for (int q = 0; q < n && all; ++q)
        if (q != r && tcp_lanes(comms[static_cast<std::size_t>(r)], q) != want) all = false;
    if (all) return true;
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

// Point-to-point around the ring on the data and bulk lanes, 0 bytes to 3 MiB, and eight
// messages on one tag that must arrive in order.
void ring_exact(std::vector<Communicator>& comms) {
  const int n = static_cast<int>(comms.size());
  on_every_rank(comms, [&](int r) {
    Communicator& c = comms[static_cast<std::size_t>(r)];
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    int tag = 1;
    for (std::size_t bytes : {std::size_t{0}, std::size_t{1}, std::size_t{4099}, std::size_t{3 << 20}}) {
      for (bool bulk : {false, true}) {
        const auto out = nexar::testing::random_bytes(bytes, static_cast<std::uint64_t>(r * 1000 + tag));
        std::vector<std::byte> in(bytes);
        auto q = bulk ? c.ibulk_recv(prev, tag, in.data(), in.size()) : c.irecv(prev, tag, in.data(), in.size());
        if (bulk) c.bulk_send(next, tag, out.data(), out.size());
        else c.send(next, tag, out.data(), out.size());
        q.wait();
        EXPECT_EQ(in, nexar::testing::random_bytes(bytes, static_cast<std::uint64_t>(prev * 1000 + tag)))
            << (bulk ? "bulk " : "") << bytes << " bytes from rank " << prev;
        ++tag;
      }
    }
    std::vector<nexar::Request> sends;
    std::vector<std::int64_t> msgs(8);
    for (int k = 0; k < 8; ++k) {
      msgs[static_cast<std::size_t>(k)] = r * 100 + k;
      sends.push_back(c.isend(next, 99, &msgs[static_cast<std::size_t>(k)], sizeof(std::int64_t)));
    }
    for (int k = 0; k < 8; ++k) {
      std::int64_t got = -1;
      c.recv(prev, 99, &got, sizeof got);
      EXPECT_EQ(got, prev * 100 + k) << "message " << k << " on one tag";
    }
    for (auto& s : sends) s.wait();
  });
}

TEST(TcpLink, EveryCollectiveAndLaneExact) {
  for (TcpCipher cipher : {TcpCipher::tls, TcpCipher::none}) {
    SCOPED_TRACE(nexar::to_string(cipher));
    auto comms = nexar::bootstrap_local(3, config(cipher));
    ASSERT_TRUE(every_pair_on_tcp(comms, 3));
    nexar::testing::battery::every_collective_exact(comms);
    ring_exact(comms);
    for (auto& c : comms) EXPECT_TRUE(c.failed_ranks().empty());
  }
}

// Rank 0 keeps QUIC; ranks 1 and 2 want TCP, rank 3 with another cipher: only the pair
// (1, 2) moves, and every result is exact.
TEST(TcpLink, RanksThatDisagreeStayOnQuic) {
  constexpr int world = 4;
  const nexar::Config cfgs[world] = {config(TcpCipher::tls, LinkKind::quic), config(TcpCipher::tls),
                                     config(TcpCipher::tls), config(TcpCipher::none)};
  auto plans = nexar::cluster::plan_local(world, cfgs[1]);
  std::vector<Communicator> comms(world);
  {
    std::vector<std::thread> starts;
    for (int r = 0; r < world; ++r)
      starts.emplace_back([&, r] {
        comms[static_cast<std::size_t>(r)] =
            nexar::cluster::start_node(std::move(plans[static_cast<std::size_t>(r)]), cfgs[r]);
      });
    for (auto& t : starts) t.join();
  }
  for (int i = 0; i < 1000 && tcp_lanes(comms[1], 2) + tcp_lanes(comms[2], 1) < 6; ++i) std::this_thread::sleep_for(10ms);
  on_every_rank(comms, [&](int r) {
    for (std::uint64_t salt = 300; salt < 303; ++salt) {
      auto v = values(200003, r, salt);
      comms[static_cast<std::size_t>(r)].all_reduce(v, ReduceOp::sum);
      EXPECT_EQ(v, sum_of_all(200003, world, salt));
    }
  });
  for (int r = 0; r < world; ++r) {
    for (int q = 0; q < world; ++q) {
      if (q == r) continue;
      EXPECT_EQ(tcp_lanes(comms[static_cast<std::size_t>(r)], q), (r == 1 && q == 2) || (r == 2 && q == 1) ? 3 : 0)
          << "rank " << r << " with rank " << q;
    }
  }
}

// Every frame on loopback while rank 0 sends rank 1 a known 4 KiB pattern: with TLS no
// 64-byte block of it appears in any frame; in plaintext it does (so the capture sees the
// link: QUIC would hide it too).
TEST(TcpLink, NoPayloadInTheClearUnlessAskedFor) {
  const int cap = ::socket(AF_PACKET, SOCK_RAW | SOCK_NONBLOCK, htons(ETH_P_ALL));
  if (cap < 0) GTEST_SKIP() << "capturing needs CAP_NET_RAW (root); CI runs as root";
  ::close(cap);
  std::vector<std::uint8_t> pattern(4096);
  for (std::size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<std::uint8_t>((i * 167 + 13) ^ (i >> 7));
  for (TcpCipher cipher : {TcpCipher::tls, TcpCipher::none}) {
    SCOPED_TRACE(nexar::to_string(cipher));
    auto comms = nexar::bootstrap_local(2, config(cipher));
    ASSERT_TRUE(every_pair_on_tcp(comms, 3));
    const int fd = ::socket(AF_PACKET, SOCK_RAW | SOCK_NONBLOCK, htons(ETH_P_ALL));
    ASSERT_GE(fd, 0);
    std::atomic<bool> stop{false};
    std::atomic<int> seen{0};
    std::thread sniff([&] {
      std::vector<std::uint8_t> frame(70000);
      while (!stop.load()) {
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, 20) <= 0) continue;
        const ssize_t n = ::recv(fd, frame.data(), frame.size(), 0);
        if (n <= 0) continue;
        for (std::size_t b = 0; b + 64 <= pattern.size(); b += 64)
          if (std::search(frame.begin(), frame.begin() + n, pattern.begin() + static_cast<std::ptrdiff_t>(b),
                          pattern.begin() + static_cast<std::ptrdiff_t>(b + 64)) != frame.begin() + n) {
            seen.fetch_add(1);
            break;
          }
      }
    });
    on_every_rank(comms, [&](int r) {
      Communicator& c = comms[static_cast<std::size_t>(r)];
      std::vector<std::uint8_t> in(pattern.size());
      for (int k = 0; k < 20; ++k) {
        if (r == 0) c.send(1, k, pattern.data(), pattern.size());
        else {
          c.recv(0, k, in.data(), in.size());
          EXPECT_EQ(in, pattern);
        }
      }
      c.barrier();
    });
    stop.store(true);
    sniff.join();
    ::close(fd);
    if (cipher == TcpCipher::tls) EXPECT_EQ(seen.load(), 0) << "frames with the pattern in the clear";
    else EXPECT_GT(seen.load(), 0) << "the plaintext link's frames were not seen";
  }
}


// Ranks as processes on the TCP link: rank 1 dies by SIGKILL while 1 MiB all_reduces run,
// and each survivor's operation fails within a second with rank_failed naming rank 1.
TEST(TcpLink, KilledRankIsNamedWithinASecond) {
  for (TcpCipher cipher : {TcpCipher::tls, TcpCipher::none}) {
    SCOPED_TRACE(nexar::to_string(cipher));
    auto& shared = nexar::testing::fresh_shared<nexar::testing::Deaths>();
    nexar::Config cfg = config(cipher);
    cfg.on_failure = nexar::FailurePolicy::manual;
    cfg.op_timeout = 30s;  // far above the bound checked: a hang shows as a failed bound
    cfg.yield_when_idle = true;
    cfg.log_level = nexar::LogLevel::off;
    auto status = nexar::testing::run_forked(3, cfg, [&](int rank, Communicator& c) {
      // The links attach after the pairs are up: start once both of ours did.
      for (int i = 0; i < 1000 && tcp_lanes(c, (rank + 1) % 3) + tcp_lanes(c, (rank + 2) % 3) < 6; ++i)
        std::this_thread::sleep_for(10ms);
      RANK_CHECK(rank, tcp_lanes(c, (rank + 1) % 3) + tcp_lanes(c, (rank + 2) % 3) == 6, "the pairs are not on TCP");
      c.barrier();
      nexar::testing::all_reduce_until_killed(rank, c, shared, 1, 262147);
    }, 60s);
    ASSERT_EQ(status.size(), 3u);
    nexar::testing::expect_named_in_time(status, 1, shared, 1s);
  }
}

}  // namespace
