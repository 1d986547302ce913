// QUIC module: addresses, the UDP socket (GSO/GRO), and real ngtcp2 connections between two
// endpoints: handshake with mutual certificate checks, ordered stream data, flow control,
// orderly close, and a peer that vanishes.
#include <gtest/gtest.h>

#include <future>
#include <map>
#include <random>

#include "engine/engine.hpp"
#include "quic/endpoint.hpp"
#include "quic/udp_socket.hpp"
#include "tls/ca.hpp"
#include "tls/node_key.hpp"
#include "tls/tls_context.hpp"

using namespace std::chrono_literals;
using namespace nexar;
using quic::Address;

TEST(Address, ParsesAndPrintsV4AndV6) {
  auto a = Address::parse("127.0.0.1:4000");
  EXPECT_EQ(a.family(), AF_INET);
  EXPECT_EQ(a.port(), 4000);
  EXPECT_TRUE(a.is_loopback());
  EXPECT_EQ(a.to_string(), "127.0.0.1:4000");
  auto b = Address::parse("[::1]:65535");
  EXPECT_EQ(b.family(), AF_INET6);
  EXPECT_TRUE(b.is_loopback());
  EXPECT_EQ(b.to_string(), "[::1]:65535");
  EXPECT_FALSE(Address::parse("10.1.2.3:1").is_loopback());
  EXPECT_EQ(Address::parse("127.0.0.1:4000"), a);
}

TEST(Address, RejectsMalformed) {
  for (const char* bad : {"", "127.0.0.1", "127.0.0.1:", "127.0.0.1:70000", "host:80",
                          "[::1:80", "[::1]80", "1.2.3.4:8x", "::1:80"}) {
    try {
      Address::parse(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::invalid_argument) << bad;
      EXPECT_NE(std::string(e.what()).find("address"), std::string::npos);
    }
  }
}

TEST(UdpSocket, BatchedSendArrivesAsPackets) {
  int fa = quic::UdpSocket::open_bound(Address::parse("127.0.0.1:0"));
  int fb = quic::UdpSocket::open_bound(Address::parse("127.0.0.1:0"));
  quic::UdpSocket a(fa, true), b(fb, true);
  std::vector<std::uint8_t> data(3 * 1000 + 123);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::uint8_t>(i * 7);
  ASSERT_EQ(a.send(b.local(), data.data(), data.size(), 1000), 0);
  std::vector<std::uint8_t> got;
  std::vector<std::uint8_t> buf(65536);
  auto until = std::chrono::steady_clock::now() + 2s;
  while (got.size() < data.size() && std::chrono::steady_clock::now() < until) {
    Address from;
    std::size_t seg = 0;
    ssize_t n = b.recv(buf.data(), buf.size(), from, seg);
    if (n == -EAGAIN) continue;
    ASSERT_GT(n, 0);
    EXPECT_EQ(from, a.local());
    // Coalesced or not, every packet but the last is one segment long.
    EXPECT_TRUE(seg == 1000 || static_cast<std::size_t>(n) == seg);
    got.insert(got.end(), buf.begin(), buf.begin() + n);
  }
  EXPECT_EQ(got, data);
}

namespace {

struct Events : quic::ConnectionHandler {
  std::string expect_node;  // empty: accept anyone in the cluster
  std::promise<void> established;
  std::promise<std::pair<Errc, std::string>> closed;
  std::vector<std::uint8_t> received;
  std::size_t want = 0;
  std::promise<void> got_all;
  bool established_set = false, closed_set = false, got_set = false;
  std::string seen_node;

  std::string on_peer_identity(quic::Connection&, const std::string& node) override {
    seen_node = node;
    if (!expect_node.empty() && node != expect_node) return "unexpected node " + node;
    return {};
  }
  void on_established(quic::Connection&) override {
    if (!established_set) established.set_value();
    established_set = true;
  }
  void on_stream_data(quic::Connection& c, std::int64_t s, const std::uint8_t* d, std::size_t n) override {
    received.insert(received.end(), d, d + n);
    c.consumed(s, n);
    if (!got_set && want && received.size() >= want) {
      got_set = true;
      got_all.set_value();
    }
  }
  void on_closed(quic::Connection&, Errc code, const std::string& why) override {
    if (!closed_set) closed.set_value({code, why});
    closed_set = true;
  }
};

// One side of a test connection: its own engine, credentials and endpoint.
struct Side {
  detail::Engine engine{50us};
  std::unique_ptr<tls::TlsContext> tls;
  std::unique_ptr<quic::Endpoint> ep;
  Events events;

  Side(const tls::NodeCredentials& creds, quic::ConnectionSettings s = {}) {
    tls = std::make_unique<tls::TlsContext>(creds);
    int fd = quic::UdpSocket::open_bound(Address::parse("127.0.0.1:0"));
    ep = std::make_unique<quic::Endpoint>(engine, fd, *tls, s, true);
    engine.start();
  }
  ~Side() {
    if (!killed) run([this] { ep->shutdown("test over"); });
    engine.stop();
  }
  /// Vanishes without a word: no CONNECTION_CLOSE, socket closed.
  void kill() {
    engine.stop();
    ep.reset();
    killed = true;
  }
  bool killed = false;
  template <class F>
  void run(F&& f) {
    std::promise<void> p;
    engine.post([&] {
      f();
      p.set_value();
    });
    p.get_future().wait();
  }
  void listen() {
    run([this] { ep->start([this](quic::Connection&) { return &events; }); });
  }
};

quic::ConnectionSettings short_idle() {
  quic::ConnectionSettings s;
  s.idle_timeout_ns = 1'000'000'000ull;
  s.handshake_timeout_ns = 2'000'000'000ull;
  return s;
}


// The client dials node "srv" with these credentials; the handshake must fail on both
// sides. Returns how the client's connection ended.
std::pair<Errc, std::string> dial_rejected(const tls::NodeCredentials& server_creds,
                                           const tls::NodeCredentials& client_creds) {
  Side server(server_creds, short_idle());
  Side client(client_creds, short_idle());
  server.listen();
  client.listen();
  client.run([&] { client.ep->connect(server.ep->local(), "srv", &client.events); });
  auto f = client.events.closed.get_future();
  if (f.wait_for(10s) != std::future_status::ready) {
    ADD_FAILURE() << "the client's connection did not end";
    return {Errc::ok, {}};
  }
  auto result = f.get();
  EXPECT_FALSE(client.events.established_set);
  EXPECT_FALSE(server.events.established_set);
  return result;
}

}  // namespace

TEST(Connection, HandshakeChecksBothCertificatesAndCarriesOrderedData) {
  auto ca = tls::ClusterCa::create("quic-test");
  Side server(tls::issue_local(ca, "srv")), client(tls::issue_local(ca, "cli"));
  server.listen();
  client.listen();
  quic::Connection* c = nullptr;
  client.run([&] { c = &client.ep->connect(server.ep->local(), "srv", &client.events); });
  ASSERT_EQ(client.events.established.get_future().wait_for(5s), std::future_status::ready);
  ASSERT_EQ(server.events.established.get_future().wait_for(5s), std::future_status::ready);
  EXPECT_EQ(server.events.seen_node, "cli");
  EXPECT_EQ(client.events.seen_node, "srv");

  // 20 MiB in uneven chunks: more than the stream window, so credit must flow back.
  std::mt19937 rng(7);
  std::vector<std::uint8_t> data(20u << 20);
  for (auto& b : data) b = static_cast<std::uint8_t>(rng());
  server.events.want = data.size();
  auto got = server.events.got_all.get_future();
  client.run([&] {
    auto s = c->open_stream(0);
    std::size_t off = 0, step = 1;
    while (off < data.size()) {
      std::size_t n = std::min(step, data.size() - off);
      c->push(s, quic::Chunk{data.data() + off, n, {}});
      off += n;
      step = step * 3 + 1;
      if (step > (1u << 20)) step = 17;
    }
  });
  ASSERT_EQ(got.wait_for(20s), std::future_status::ready);
  EXPECT_TRUE(server.events.received == data);
}

// Config::congestion reaches ngtcp2: under 3% loss each controller delivers 8 MiB intact,
// and the one running is the one asked for. CUBIC sets a slow-start threshold at its
// first loss; BBR never sets one.
TEST(Connection, EachCongestionControllerDeliversUnderLossAndIsTheOneRunning) {
  auto ca = tls::ClusterCa::create("quic-test");
  for (Congestion cc : {Congestion::bbr, Congestion::cubic}) {
    const bool bbr = cc == Congestion::bbr;
    quic::ConnectionSettings s;
    s.congestion = cc;
    s.udp_payload = 1452;
    s.impair = detail::ImpairSpec::parse("drop=0.03,seed=9");
    Side server(tls::issue_local(ca, "srv"), s), client(tls::issue_local(ca, "cli"), s);
    server.listen();
    client.listen();
    quic::Connection* c = nullptr;
    client.run([&] { c = &client.ep->connect(server.ep->local(), "srv", &client.events); });
    ASSERT_EQ(client.events.established.get_future().wait_for(10s), std::future_status::ready) << to_string(cc);

    std::mt19937 rng(bbr ? 11 : 12);
    std::vector<std::uint8_t> data(8u << 20);
    for (auto& b : data) b = static_cast<std::uint8_t>(rng());
    server.events.want = data.size();
    auto got = server.events.got_all.get_future();
    client.run([&] { c->push(c->open_stream(0), quic::Chunk{data.data(), data.size(), {}}); });
    ASSERT_EQ(got.wait_for(60s), std::future_status::ready) << to_string(cc);
    EXPECT_TRUE(server.events.received == data) << to_string(cc);

    quic::Connection::CongestionState st;
    client.run([&] { st = c->congestion_state(); });
    EXPECT_GT(st.cwnd, 0u);
    if (bbr) {
      EXPECT_EQ(st.ssthresh, UINT64_MAX) << "BBR has no slow-start threshold";
    } else {
      EXPECT_LT(st.ssthresh, UINT64_MAX) << "CUBIC cut its window at a loss";
    }
  }
}

TEST(Connection, OrderlyCloseReachesThePeer) {
  auto ca = tls::ClusterCa::create("quic-test");
  Side server(tls::issue_local(ca, "srv")), client(tls::issue_local(ca, "cli"));
  server.listen();
  client.listen();
  quic::Connection* c = nullptr;
  client.run([&] { c = &client.ep->connect(server.ep->local(), "srv", &client.events); });
  ASSERT_EQ(server.events.established.get_future().wait_for(5s), std::future_status::ready);
  client.run([&] { c->close(0, "bye"); });
  auto f = server.events.closed.get_future();
  ASSERT_EQ(f.wait_for(5s), std::future_status::ready);
  auto [code, why] = f.get();
  EXPECT_EQ(code, Errc::peer_closed);
  EXPECT_NE(why.find("bye"), std::string::npos);
}

TEST(Connection, CertificateFromAnotherClusterIsRejected) {
  auto ca = tls::ClusterCa::create("alpha");
  auto other = tls::ClusterCa::create("beta");
  auto [code, why] = dial_rejected(tls::issue_local(ca, "srv"), tls::issue_local(other, "cli"));
  EXPECT_TRUE(code == Errc::tls || code == Errc::timeout) << why;
}

TEST(Connection, WrongNodeNameIsRejected) {
  auto ca = tls::ClusterCa::create("quic-test");
  auto [code, why] = dial_rejected(tls::issue_local(ca, "impostor"), tls::issue_local(ca, "cli"));
  EXPECT_EQ(code, Errc::tls) << why;
  EXPECT_NE(why.find("impostor"), std::string::npos) << why;
}

TEST(Connection, VanishedPeerFailsPromptly) {
  auto ca = tls::ClusterCa::create("quic-test");
  auto server = std::make_unique<Side>(tls::issue_local(ca, "srv"));
  Side client(tls::issue_local(ca, "cli"));  // default 15 s idle timeout
  server->listen();
  client.listen();
  quic::Connection* c = nullptr;
  client.run([&] { c = &client.ep->connect(server->ep->local(), "srv", &client.events); });
  ASSERT_EQ(client.events.established.get_future().wait_for(5s), std::future_status::ready);
  // Kill the server without a word: stop its engine and drop its socket.
  server->kill();
  auto t0 = std::chrono::steady_clock::now();
  static std::uint8_t payload[4096];
  client.run([&] {
    auto s = c->open_stream(0);
    c->push(s, quic::Chunk{payload, sizeof payload, {}});
  });
  auto f = client.events.closed.get_future();
  ASSERT_EQ(f.wait_for(10s), std::future_status::ready);
  auto [code, why] = f.get();
  EXPECT_EQ(code, Errc::peer_failed) << why;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s) << "should not wait for the idle timeout";
  server.reset();
}

namespace {

// Records, per stream, how many bytes had arrived on the other streams when its first byte
// came and when its last one did.
struct StreamOrder : Events {
  std::map<std::int64_t, std::uint64_t> got;
  std::uint64_t total = 0;
  std::map<std::int64_t, std::uint64_t> total_at_first, total_at_last;
  std::uint64_t per_stream = 0;
  void on_stream_data(quic::Connection& c, std::int64_t s, const std::uint8_t* d,
                      std::size_t n) override {
    if (got[s] == 0) total_at_first[s] = total;
    got[s] += n;
    total += n;
    if (got[s] == per_stream) total_at_last[s] = total;
    Events::on_stream_data(c, s, d, n);
  }
};

}  // namespace

// Two streams of one priority queued at once share the link: the second one starts long
// before the first one ends, instead of waiting behind all of it.
TEST(Connection, EqualPriorityStreamsTakeTurns) {
  StreamOrder order;  // outlives the server, whose shutdown still reports to it
  auto ca = tls::ClusterCa::create("quic-test");
  Side server(tls::issue_local(ca, "srv")), client(tls::issue_local(ca, "cli"));
  order.per_stream = 8u << 20;
  order.want = 2 * order.per_stream;
  auto got = order.got_all.get_future();
  server.run([&] { server.ep->start([&](quic::Connection&) { return &order; }); });
  client.listen();
  quic::Connection* c = nullptr;
  client.run([&] { c = &client.ep->connect(server.ep->local(), "srv", &client.events); });
  ASSERT_EQ(client.events.established.get_future().wait_for(5s), std::future_status::ready);
  std::vector<std::uint8_t> data(order.per_stream, 0x5a);
  std::int64_t first = -1, second = -1;
  client.run([&] {
    first = c->open_stream(1);
    second = c->open_stream(1);
    // Everything is queued before the next flush: the first stream alone could fill it.
    c->push(first, quic::Chunk{data.data(), data.size(), {}});
    c->push(second, quic::Chunk{data.data(), data.size(), {}});
  });
  ASSERT_EQ(got.wait_for(20s), std::future_status::ready);
  // Read on the server's engine thread, where they were written.
  std::uint64_t second_started_at = 0, first_done_at = 0;
  server.run([&] {
    second_started_at = order.total_at_first[second];
    first_done_at = order.total_at_last[first];
  });
  EXPECT_LT(second_started_at, order.per_stream / 2)
      << "the second stream waited behind " << second_started_at << " bytes of the first";
  EXPECT_LT(second_started_at, first_done_at);
}
