// The TCP link (Config::link = tcp; transport/tcp_link.*, tcp_hub.*) between real ranks on
// loopback, shared memory off so every pair takes it: every collective and point-to-point
// lane gives exactly the reference once every pair moved its three message lanes over, with
// TLS and in plaintext; ranks that disagree about the link or the cipher stay on QUIC and
// still agree on every result; with TLS no payload byte crosses the wire in the clear (and
// in plaintext it does: the capture sees the link); and a rank killed mid all_reduce is
// named by the survivors within a second. Big messages answered one by one are read whole
// with nobody polling. And a TcpLink alone over a socket pair reads what came before its
// lane switched, and what its full window left behind, in the socket or inside GnuTLS.
#include <nexar/nexar.hpp>

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <poll.h>
#include <string.h>  // memmem (a GNU extension)
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cluster/local.hpp"
#include "collective_battery.hpp"
#include "comm/communicator_impl.hpp"
#include "core/access.hpp"
#include "local_processes.hpp"
#include "support.hpp"
#include "transport/node.hpp"
#include "transport/peer.hpp"
#include "tls/psk_session.hpp"
#include "transport/tcp_link.hpp"

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
  auto& node = nexar::detail::Access::impl(c)->node();
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
    // The capture sees every test's loopback traffic, not only ours: a large buffer keeps
    // our frames from being dropped behind a neighbour's bulk transfer.
    const int rcvbuf = 64 << 20;
    ::setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf, sizeof rcvbuf);
    std::atomic<bool> stop{false};
    std::atomic<int> seen{0};
    // Reads what the socket holds; a frame counts once if any 64-byte block of the pattern
    // is in it. memmem (glibc's, uninstrumented) keeps the reader ahead of a neighbour's
    // bulk traffic under the sanitizers, where a byte-by-byte search fell behind.
    auto drain = [&, frame = std::vector<std::uint8_t>(70000)]() mutable {
      for (ssize_t n; (n = ::recv(fd, frame.data(), frame.size(), 0)) > 0;)
        for (std::size_t b = 0; b + 64 <= pattern.size(); b += 64)
          if (::memmem(frame.data(), static_cast<std::size_t>(n), pattern.data() + b, 64) != nullptr) {
            seen.fetch_add(1);
            break;
          }
    };
    std::thread sniff([&] {
      while (!stop.load()) {
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, 20) > 0) drain();
      }
      // What was captured but not read yet when the ranks finished.
      drain();
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


// ---- TcpLink alone, over a socket pair, its engine never spinning (nobody polls) --------

// What reaches the owner, read from the test thread.
struct Collecting final : nexar::detail::LinkOwner {
  std::mutex mu;
  std::string got;
  std::uint64_t credit_back = ~std::uint64_t{0};  // all, or none (0): held against the window
  std::optional<std::uint64_t> on_link_data(nexar::detail::Link&, std::uint64_t, const std::uint8_t* data,
                                            std::size_t len) override {
    std::lock_guard lk(mu);
    got.append(reinterpret_cast<const char*>(data), len);
    return credit_back;
  }
  void on_link_closed(nexar::detail::Link&, Errc, const std::string&) override {}
  // Waits up to 2 s for `n` bytes; returns how many came.
  std::size_t wait_for(std::size_t n) {
    for (int i = 0; i < 200; ++i) {
      {
        std::lock_guard lk(mu);
        if (got.size() >= n) return got.size();
      }
      std::this_thread::sleep_for(10ms);
    }
    std::lock_guard lk(mu);
    return got.size();
  }
};

// A link of one lane (data) over one end of a socket pair, in plaintext or with TLS; the
// test writes the other end.
struct OneLane {
  nexar::detail::Engine engine{0us};
  Collecting owner;
  std::unique_ptr<nexar::detail::TcpLink> link;
  std::unique_ptr<nexar::tls::PskSession> theirs_tls;
  int theirs = -1;
  OneLane(std::uint64_t window, bool tls) {
    int sv[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    theirs = sv[1];
    nexar::detail::TcpAttached a;
    a.fd = sv[0];
    a.lane = nexar::wire::Lane::data;
    if (tls) {
      const std::array<std::uint8_t, 32> key{7, 1, 2, 3};
      std::thread other([&] {
        theirs_tls = std::make_unique<nexar::tls::PskSession>(theirs, nexar::tls::PskSession::Role::server, key, 5s);
      });
      a.session = std::make_unique<nexar::tls::PskSession>(a.fd, nexar::tls::PskSession::Role::client, key, 5s);
      other.join();
    }
    engine.start();
    nexar::testing::on_engine(engine, [&] {
      link = std::make_unique<nexar::detail::TcpLink>(engine, owner, window);
      EXPECT_TRUE(link->add(std::move(a)));
    });
  }
  ~OneLane() {
    nexar::testing::on_engine(engine, [&] { link.reset(); });
    engine.stop();
    theirs_tls.reset();
    ::close(theirs);
  }
  void write(const std::string& bytes) const {
    const auto* p = reinterpret_cast<const std::uint8_t*>(bytes.data());
    if (theirs_tls) {
      for (std::size_t at = 0; at < bytes.size();) at += theirs_tls->send(p + at, bytes.size() - at);
      return;
    }
    EXPECT_EQ(::write(theirs, p, bytes.size()), static_cast<ssize_t>(bytes.size()));
  }
  void start_reading() {
    nexar::testing::on_engine(engine, [&] { link->start_reading(nexar::wire::Lane::data); });
  }
  void consumed(std::uint64_t n) {
    nexar::testing::on_engine(engine, [&] { link->consumed(static_cast<std::uint64_t>(nexar::wire::Lane::data), n); });
  }
};

// Bytes that came before the lane switched are read once it does, though the peer sends
// nothing more until it hears back.
TEST(TcpLinkAlone, BytesThatCameBeforeReadingStartedAreRead) {
  for (bool tls : {false, true}) {
    SCOPED_TRACE(tls ? "tls" : "plaintext");
    OneLane t(1 << 20, tls);
    t.write(std::string(100, 'a'));
    std::this_thread::sleep_for(50ms);  // the engine's reactor sees the bytes come, and nobody reads
    t.start_reading();
    EXPECT_EQ(t.owner.wait_for(100), 100u);
  }
}

// A full window stops reading with bytes left behind: in the socket (plaintext), or
// decrypted inside GnuTLS, where no readiness of the socket will ever announce them (one
// TLS record of 1000 bytes, read 64 at a time). Room made by the consumer reads them.
TEST(TcpLinkAlone, RoomInTheWindowReadsWhatWasLeftBehind) {
  for (bool tls : {false, true}) {
    SCOPED_TRACE(tls ? "tls" : "plaintext");
    OneLane t(64, tls);
    t.owner.credit_back = 0;
    t.start_reading();
    std::string sent(1000, 'b');
    for (std::size_t i = 0; i < sent.size(); ++i) sent[i] = static_cast<char>('a' + i % 26);
    t.write(sent);
    EXPECT_EQ(t.owner.wait_for(64), 64u);
    std::this_thread::sleep_for(50ms);
    EXPECT_EQ(t.owner.wait_for(0), 64u) << "read past its window";
    for (std::size_t want = 128; want < 1000 + 64; want += 64) {
      t.consumed(64);
      EXPECT_EQ(t.owner.wait_for(std::min<std::size_t>(want, 1000)), std::min<std::size_t>(want, 1000));
    }
    std::lock_guard lk(t.owner.mu);
    EXPECT_EQ(t.owner.got, sent);
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

// A reader that stops before the socket is empty (its turn ended, its window filled) must
// come back on its own: nobody polls here (spin 0), and the sender has nothing more to send
// until it hears back, so no later byte would wake a reader that waits for one. Big messages
// back and forth, each answered before the next leaves, on every lane TCP carries.
TEST(TcpLink, ABigMessageIsReadWholeWithNobodyPolling) {
  for (TcpCipher cipher : {TcpCipher::tls, TcpCipher::none}) {
    SCOPED_TRACE(nexar::to_string(cipher));
    nexar::Config cfg = config(cipher);
    cfg.spin = 0us;
    auto comms = nexar::bootstrap_local(2, cfg);
    ASSERT_TRUE(every_pair_on_tcp(comms, 3));
    on_every_rank(comms, [&](int r) {
      Communicator& c = comms[static_cast<std::size_t>(r)];
      const int other = 1 - r;
      for (int round = 0; round < 6; ++round) {
        const std::size_t bytes = (std::size_t{5} << 20) + static_cast<std::size_t>(round) * 4099;
        const bool bulk = round % 2 == 1;
        const int tag = 10 + round;
        const auto seed = static_cast<std::uint64_t>(round * 10);
        if ((round + r) % 2 == 0) {
          const auto out = nexar::testing::random_bytes(bytes, seed + static_cast<std::uint64_t>(r));
          if (bulk) c.bulk_send(other, tag, out.data(), out.size());
          else c.send(other, tag, out.data(), out.size());
          std::int32_t ack = 0;
          c.recv(other, tag + 100, &ack, sizeof ack);
          EXPECT_EQ(ack, round);
        } else {
          std::vector<std::byte> in(bytes);
          auto q = bulk ? c.ibulk_recv(other, tag, in.data(), in.size()) : c.irecv(other, tag, in.data(), in.size());
          ASSERT_TRUE(q.wait_for(20s)) << "rank " << r << " round " << round << ": " << bytes
                                       << " bytes never came whole";
          EXPECT_EQ(in, nexar::testing::random_bytes(bytes, seed + static_cast<std::uint64_t>(other)));
          const std::int32_t ack = round;
          c.send(other, tag + 100, &ack, sizeof ack);
        }
      }
    });
  }
}

}  // namespace
