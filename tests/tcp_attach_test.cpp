// How a TCP connection of the TCP link attaches (transport/tcp_attach.*), over real TCP on
// loopback, with no QUIC: the keys are made up here, as both ends would export them. A
// dialer with the pair's keys attaches, with TLS or in plaintext, and bytes then flow both
// ways; a wrong key, a rank without an offer, a hello meant for another rank, a cipher the
// listener does not use and a replayed exchange are all refused, and the listener says so.
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <condition_variable>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <nexar/error.hpp>

#include "transport/tcp_attach.hpp"

using namespace nexar;
using namespace nexar::detail;
using namespace std::chrono_literals;

namespace {

constexpr std::uint32_t kListener = 1;
constexpr std::uint32_t kDialer = 0;
constexpr auto kStep = 2000ms;

TcpKeys keys(std::uint8_t seed) {
  TcpKeys k;
  for (std::size_t i = 0; i < k.attach.size(); ++i) {
    k.attach[i] = static_cast<std::uint8_t>(seed + i);
    k.tls[i] = static_cast<std::uint8_t>(seed * 3 + i);
  }
  return k;
}

// A listener of rank 1 with offers to ranks 0 (keys(1)) and 2 (keys(2)); what attaches
// is kept.
struct Listening {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<TcpAttached> attached;
  TcpListener listener;

  explicit Listening(TcpCipher cipher)
      : listener(quic::Address::parse("127.0.0.1:0"), kListener, cipher,
                 [](std::uint32_t rank, wire::Lane) -> std::optional<TcpKeys> {
                   if (rank == 0) return keys(1);
                   if (rank == 2) return keys(2);
                   return std::nullopt;
                 },
                 [this](TcpAttached a) {
                   std::lock_guard lk(mu);
                   attached.push_back(std::move(a));
                   cv.notify_all();
                 },
                 kStep) {}

  quic::Address at() const {
    quic::Address a = quic::Address::parse("127.0.0.1:0");
    a.set_port(listener.port());
    return a;
  }
  TcpAttached wait_attached() {
    std::unique_lock lk(mu);
    cv.wait_for(lk, 5s, [&] { return !attached.empty(); });
    if (attached.empty()) return {};
    TcpAttached a = std::move(attached.back());
    attached.pop_back();
    return a;
  }
  // Refusals are counted after the dialer hears of them: wait for the count.
  bool refused(std::uint64_t n) {
    for (int i = 0; i < 500 && listener.refused() < n; ++i) std::this_thread::sleep_for(10ms);
    return listener.refused() == n;
  }
};

Errc dial_error(const quic::Address& at, std::uint32_t self, std::uint32_t peer, TcpCipher c, const TcpKeys& k) {
  try {
    tcp_dial(at, self, peer, wire::Lane::data, c, k, kStep);
  } catch (const Error& e) {
    return e.code();
  }
  return Errc::ok;
}

// Sends `out` from `a` and reads as many bytes at `b`, both non-blocking.
std::vector<std::uint8_t> carry(TcpAttached& a, TcpAttached& b, const std::vector<std::uint8_t>& out) {
  std::vector<std::uint8_t> in(out.size());
  std::size_t sent = 0, got = 0;
  for (int spins = 0; (sent < out.size() || got < in.size()) && spins < 200000; ++spins) {
    if (sent < out.size()) {
      if (a.session) {
        sent += a.session->send(out.data() + sent, std::min<std::size_t>(out.size() - sent, 16384));
      } else {
        const ssize_t w = ::send(a.fd, out.data() + sent, out.size() - sent, MSG_DONTWAIT);
        if (w > 0) sent += static_cast<std::size_t>(w);
      }
    }
    if (b.session) {
      got += b.session->recv(in.data() + got, in.size() - got).bytes;
    } else {
      const ssize_t r = ::recv(b.fd, in.data() + got, in.size() - got, MSG_DONTWAIT);
      if (r > 0) got += static_cast<std::size_t>(r);
    }
  }
  in.resize(got);
  return in;
}

std::vector<std::uint8_t> pattern(std::size_t n, std::uint8_t salt) {
  std::vector<std::uint8_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::uint8_t>((i * 131 + salt) ^ (i >> 8));
  return v;
}

}  // namespace

TEST(TcpAttach, RightKeysAttachAndCarryBytesBothWays) {
  for (TcpCipher c : {TcpCipher::tls, TcpCipher::none}) {
    Listening l(c);
    TcpAttached mine = tcp_dial(l.at(), kDialer, kListener, wire::Lane::bulk, c, keys(1), kStep);
    TcpAttached theirs = l.wait_attached();
    ASSERT_GE(theirs.fd, 0) << to_string(c);
    EXPECT_EQ(theirs.rank, kDialer);
    EXPECT_EQ(theirs.lane, wire::Lane::bulk);
    EXPECT_EQ(mine.session != nullptr, c == TcpCipher::tls);
    EXPECT_EQ(theirs.session != nullptr, c == TcpCipher::tls);
    for (std::size_t n : {std::size_t{1}, std::size_t{4099}, std::size_t{1 << 20}}) {
      const auto out = pattern(n, 7);
      EXPECT_EQ(carry(mine, theirs, out), out) << to_string(c) << ", " << n << " bytes to the listener";
      const auto back = pattern(n, 9);
      EXPECT_EQ(carry(theirs, mine, back), back) << to_string(c) << ", " << n << " bytes to the dialer";
    }
    EXPECT_EQ(l.listener.refused(), 0u);
  }
}

TEST(TcpAttach, WrongKeyIsRefused) {
  Listening l(TcpCipher::tls);
  EXPECT_EQ(dial_error(l.at(), kDialer, kListener, TcpCipher::tls, keys(9)), Errc::tls);
  EXPECT_TRUE(l.refused(1));
}

TEST(TcpAttach, RankWithoutOfferIsRefused) {
  Listening l(TcpCipher::tls);
  EXPECT_NE(dial_error(l.at(), 3, kListener, TcpCipher::tls, keys(1)), Errc::ok);
  EXPECT_TRUE(l.refused(1));
}

// Rank 2 of the same cluster holds its own pair's keys with rank 1: claiming to be rank 0
// with them fails, and so does a hello meant for another rank's port.
TEST(TcpAttach, AnotherRanksKeysOrPortAreRefused) {
  Listening l(TcpCipher::tls);
  EXPECT_EQ(dial_error(l.at(), kDialer, kListener, TcpCipher::tls, keys(2)), Errc::tls);
  EXPECT_NE(dial_error(l.at(), 2, 5, TcpCipher::tls, keys(2)), Errc::ok);
  EXPECT_TRUE(l.refused(2));
}

TEST(TcpAttach, OtherCipherIsRefused) {
  Listening l(TcpCipher::tls);
  EXPECT_NE(dial_error(l.at(), kDialer, kListener, TcpCipher::none, keys(1)), Errc::ok);
  EXPECT_TRUE(l.refused(1));
}

// What a dialer with the right keys sent, recorded by a proxy in the middle and sent again
// on a new connection: the listener's fresh nonce makes the recorded proof wrong.
TEST(TcpAttach, ReplayedExchangeIsRefused) {
  for (TcpCipher c : {TcpCipher::tls, TcpCipher::none}) {
    Listening l(c);
    const int front = ::socket(AF_INET, SOCK_STREAM, 0);
    quic::Address fa = quic::Address::parse("127.0.0.1:0");
    ASSERT_EQ(::bind(front, fa.sa(), fa.len), 0);
    ASSERT_EQ(::listen(front, 1), 0);
    fa.len = sizeof fa.storage;
    ::getsockname(front, fa.sa(), &fa.len);
    std::vector<std::uint8_t> recorded;
    std::thread proxy([&] {
      const int in = ::accept(front, nullptr, nullptr);
      const int out = ::socket(AF_INET, SOCK_STREAM, 0);
      const quic::Address to = l.at();
      if (in < 0 || ::connect(out, to.sa(), to.len) != 0) return;
      std::uint8_t buf[65536];
      for (;;) {
        pollfd p[2] = {{in, POLLIN, 0}, {out, POLLIN, 0}};
        if (::poll(p, 2, 3000) <= 0) break;
        if (p[0].revents) {
          const ssize_t n = ::recv(in, buf, sizeof buf, 0);
          if (n <= 0) break;
          recorded.insert(recorded.end(), buf, buf + n);
          ::send(out, buf, static_cast<std::size_t>(n), MSG_NOSIGNAL);
        }
        if (p[1].revents) {
          const ssize_t n = ::recv(out, buf, sizeof buf, 0);
          if (n <= 0) break;
          ::send(in, buf, static_cast<std::size_t>(n), MSG_NOSIGNAL);
        }
      }
      ::close(in);
      ::close(out);
    });
    {
      TcpAttached mine = tcp_dial(fa, kDialer, kListener, wire::Lane::data, c, keys(1), kStep);
      EXPECT_GE(l.wait_attached().fd, 0);
    }  // closing ends the proxy
    proxy.join();
    ::close(front);
    ASSERT_GT(recorded.size(), 48u);

    const int again = ::socket(AF_INET, SOCK_STREAM, 0);
    const quic::Address to = l.at();
    ASSERT_EQ(::connect(again, to.sa(), to.len), 0);
    ::send(again, recorded.data(), recorded.size(), MSG_NOSIGNAL);
    // The listener answers the hello (48 bytes: nonce and MAC), then closes without the
    // byte that confirms an attach.
    std::vector<std::uint8_t> answer;
    std::uint8_t buf[4096];
    for (;;) {
      pollfd p{again, POLLIN, 0};
      if (::poll(&p, 1, 5000) <= 0) break;
      const ssize_t n = ::recv(again, buf, sizeof buf, 0);
      if (n <= 0) break;
      answer.insert(answer.end(), buf, buf + n);
    }
    ::close(again);
    EXPECT_EQ(answer.size(), 48u) << to_string(c);
    EXPECT_TRUE(l.refused(1)) << to_string(c);
  }
}
