// Tests of the seed (src/cluster/seed.cpp): forming clusters of pinned and unpinned joiners
// over the real QUIC stack on loopback, minimum world sizes, refusals, hostile, idle and
// vanishing clients, garbage datagrams, the relay keys it hands out, and invalid options.
#include <gtest/gtest.h>

#include <nexar/cluster.hpp>
#include <nexar/error.hpp>

#include "cluster/token.hpp"
#include "cluster_support.hpp"
#include "engine/engine.hpp"
#include "quic/address.hpp"
#include "quic/connection.hpp"
#include "quic/endpoint.hpp"
#include "quic/udp_socket.hpp"
#include "support.hpp"
#include "tls/node_key.hpp"
#include "tls/peer_check.hpp"
#include "tls/tls_context.hpp"
#include "wire/seed_message.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <variant>
#include <vector>

namespace {

using namespace nexar::testing;
using namespace nexar::cluster;
using Bytes8 = std::vector<std::uint8_t>;
using nexar::Communicator;
using nexar::Errc;
using nexar::Error;
using nexar::JoinOptions;
using nexar::Seed;
using nexar::SeedOptions;
using nexar::quic::Connection;

bool can_bind_ipv6_loopback() {
  const int fd = ::socket(AF_INET6, SOCK_DGRAM, 0);
  if (fd < 0) return false;
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_addr = in6addr_loopback;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

// A seed client under the test's full control. It speaks QUIC and TLS as a joiner does
// (joiner TlsContext, ALPN nexar-seed/1, no certificate), reads the seed's hello, and then
// sends whatever `reply` makes of it (nothing when it returns no bytes). It records the
// seed's answer, what the seed sends after it (an elastic seed's announcements), and the end
// of the connection.
class RawSeedClient final : public nexar::quic::ConnectionHandler {
 public:
  using Reply = std::function<Bytes8(Connection&, const nexar::wire::SeedHello&)>;

  RawSeedClient(const std::string& seed, Reply reply, std::chrono::milliseconds idle = 10s)
      : reply_(std::move(reply)), tls_(nexar::tls::SeedTrust{}) {
    nexar::quic::ConnectionSettings s;
    s.alpn = {nexar::wire::seed_alpn};
    s.idle_timeout_ns = static_cast<std::uint64_t>(std::chrono::nanoseconds(idle).count());
    s.handshake_timeout_ns = 5'000'000'000ull;
    const nexar::quic::Address to = nexar::quic::Address::parse(seed);
    const char* local = to.family() == AF_INET6 ? "::1" : "127.0.0.1";
    ep_ = std::make_unique<nexar::quic::Endpoint>(
        engine_, nexar::quic::UdpSocket::open_bound(nexar::quic::Address::with_host(local, 0)),
        tls_, s, false);
    engine_.start();
    on_engine(engine_, [&] {
      ep_->start([](Connection&) -> nexar::quic::ConnectionHandler* { return nullptr; });
      ep_->connect(to, std::string(nexar::tls::seed_node), this);
    });
  }
  ~RawSeedClient() override { close(); }
  RawSeedClient(const RawSeedClient&) = delete;
  RawSeedClient& operator=(const RawSeedClient&) = delete;

  // ConnectionHandler (engine thread).
  std::string on_peer_identity(Connection&, const std::string&) override { return {}; }
  void on_established(Connection&) override {}
  void on_stream_data(Connection& c, std::int64_t stream, const std::uint8_t* data,
                      std::size_t len) override {
    conn_ = &c;
    c.consumed(stream, len);
    std::vector<nexar::wire::SeedMessage> msgs;
    if (!reader_.feed(data, len, msgs)) {
      answer(nexar::wire::JoinReject{
          0, "client: malformed message from the seed: " + reader_.error()});
      return;
    }
    for (auto& m : msgs) {
      if (auto* h = std::get_if<nexar::wire::SeedHello>(&m); h && !replied_) {
        replied_ = true;
        sent_ = reply_(c, *h);
        if (!sent_.empty()) {
          out_ = c.open_stream(0);
          c.push(out_, nexar::quic::Chunk{sent_.data(), sent_.size(), {}});
        }
      } else {
        answer(std::move(m));
      }
    }
  }
  void on_closed(Connection&, Errc code, const std::string& why) override {
    conn_ = nullptr;
    if (!closed_set_) {
      closed_set_ = true;
      closed_.set_value(std::string(nexar::to_string(code)) + ": " + why);
    }
  }

  // Test thread.
  std::future<nexar::wire::SeedMessage> answer_future() { return answer_.get_future(); }
  std::future<std::string> closed_future() { return closed_.get_future(); }
  // The messages after the answer, in order.
  std::vector<nexar::wire::SeedMessage> later() { return on_engine(engine_, [&] { return later_; }); }
  // Waits until at least `n` messages came after the answer; returns them.
  std::vector<nexar::wire::SeedMessage> wait_later(std::size_t n, std::chrono::milliseconds limit = 5s) {
    const auto until = Clock::now() + limit;
    for (;;) {
      auto got = later();
      if (got.size() >= n || Clock::now() >= until) return got;
      std::this_thread::sleep_for(10ms);
    }
  }

  // Whether the seed acknowledged every byte we sent (it has processed them: a QUIC ACK
  // goes out only after the packet's stream data was handed to the seed).
  bool sent_and_acked() {
    return on_engine(engine_, [&] { return conn_ != nullptr && out_ >= 0 && conn_->unacked(out_) == 0; });
  }
  bool wait_acked(std::chrono::milliseconds limit) {
    const auto until = Clock::now() + limit;
    while (Clock::now() < until) {
      if (sent_and_acked()) return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  }

  // Closes the connection properly (the seed is told at once).
  void close() {
    if (engine_.stopped()) return;
    on_engine(engine_, [&] { ep_->shutdown("raw client done"); });
    engine_.stop();
  }
  // Disappears without a word, as a killed process would: the seed only notices when the
  // connection's idle timeout passes.
  void vanish() { engine_.stop(); }

 private:
  void answer(nexar::wire::SeedMessage m) {
    if (answered_) {
      later_.push_back(std::move(m));
      return;
    }
    answered_ = true;
    answer_.set_value(std::move(m));
  }

  Reply reply_;
  nexar::wire::SeedMessageReader reader_{nexar::wire::max_seed_reply};
  Connection* conn_ = nullptr;
  std::int64_t out_ = -1;
  bool replied_ = false;
  bool answered_ = false;
  bool closed_set_ = false;
  Bytes8 sent_;
  std::vector<nexar::wire::SeedMessage> later_;
  std::promise<nexar::wire::SeedMessage> answer_;
  std::promise<std::string> closed_;
  // Declared last: the endpoint goes first, then its TLS context and the engine.
  nexar::detail::Engine engine_{std::chrono::microseconds(0)};
  nexar::tls::TlsContext tls_;
  std::unique_ptr<nexar::quic::Endpoint> ep_;
};

// A join request as join() would send it, with the proof computed from `token` in `role`.
Bytes8 join_request(Connection& c, const nexar::wire::SeedHello& h, const std::string& token,
                    int rank, int world, const std::string& node,
                    ProofRole role = ProofRole::joiner) {
  nexar::wire::JoinRequest r;
  r.proof = prove(token, role, c.export_secret(exporter_label));
  r.rank = rank;
  r.world = world;
  r.port = 9;
  r.node = node;
  r.host = "raw-client";
  r.csr_pem = nexar::tls::NodeKey::generate().make_csr(h.cluster, node);
  return nexar::wire::encode(r);
}

// The seed's answer to a raw client, which must be a reject.
nexar::wire::JoinReject expect_reject(std::future<nexar::wire::SeedMessage>& f,
                                      std::chrono::seconds limit = 5s) {
  if (f.wait_for(limit) != std::future_status::ready) {
    ADD_FAILURE() << "no answer from the seed within " << limit.count() << " s";
    return {};
  }
  nexar::wire::SeedMessage m = f.get();
  auto* r = std::get_if<nexar::wire::JoinReject>(&m);
  if (r == nullptr) {
    ADD_FAILURE() << "the seed answered with message index " << m.index() << ", not a reject";
    return {};
  }
  return *r;
}

// The seed's answer to a raw client, which must be an accept.
nexar::wire::JoinAccept expect_accept(std::future<nexar::wire::SeedMessage>& f,
                                      std::chrono::seconds limit = 10s) {
  if (f.wait_for(limit) != std::future_status::ready) {
    ADD_FAILURE() << "no answer from the seed within " << limit.count() << " s";
    return {};
  }
  nexar::wire::SeedMessage m = f.get();
  auto* a = std::get_if<nexar::wire::JoinAccept>(&m);
  if (a == nullptr) {
    auto* r = std::get_if<nexar::wire::JoinReject>(&m);
    ADD_FAILURE() << "the seed answered with message index " << m.index() << ", not an accept"
                  << (r ? ": " + r->reason : std::string());
    return {};
  }
  return *a;
}

// `world` raw clients, named `prefix`-<rank>, asking for ranks 0..world-1 of a seed of that
// world; returns their accepts in rank order (the clients stay connected in `clients`).
std::vector<nexar::wire::JoinAccept> join_raw(const Seed& seed, int world, const std::string& prefix,
                                              std::vector<std::unique_ptr<RawSeedClient>>& clients) {
  std::vector<std::future<nexar::wire::SeedMessage>> answers;
  for (int r = 0; r < world; ++r) {
    const std::string node = prefix + "-" + std::to_string(r);
    clients.push_back(std::make_unique<RawSeedClient>(
        seed.address(), [r, world, node](Connection& c, const nexar::wire::SeedHello& h) {
          return join_request(c, h, kToken, r, world, node);
        }));
    answers.push_back(clients.back()->answer_future());
  }
  std::vector<nexar::wire::JoinAccept> out;
  for (auto& f : answers) out.push_back(expect_accept(f));
  return out;
}

// ---- formation ----

TEST(Seed, FormsClusterWithPinnedAndUnpinnedJoiners) {
  const nexar::Config cfg = fast_config();
  Seed seed(seed_opts(3), cfg);
  EXPECT_EQ(seed.address().rfind("127.0.0.1:", 0), 0u) << seed.address();
  EXPECT_NE(seed.address(), "127.0.0.1:0");
  EXPECT_EQ(seed.token(), kToken);
  EXPECT_EQ(seed.fingerprint().rfind("sha256:", 0), 0u) << seed.fingerprint();
  EXPECT_EQ(seed.fingerprint().size(), 7u + 64u) << seed.fingerprint();
  EXPECT_TRUE(contains(seed.ca_pem(), "BEGIN CERTIFICATE")) << seed.ca_pem();
  EXPECT_FALSE(seed.cluster().empty());
  EXPECT_THROW(seed.wait(100ms), Error) << "formed without joiners";

  JoinOptions by_fingerprint = join_opts(seed);
  by_fingerprint.seed_fingerprint = seed.fingerprint();
  JoinOptions by_ca = join_opts(seed);
  by_ca.seed_ca_pem = seed.ca_pem();
  JoinOptions unpinned = join_opts(seed);
  std::vector<std::future<Joined>> fs;
  fs.push_back(start_join(by_fingerprint, cfg));
  fs.push_back(start_join(by_ca, cfg));
  fs.push_back(start_join(unpinned, cfg));
  std::vector<Communicator> comms = joined_all(fs);
  ASSERT_EQ(comms.size(), 3u);
  EXPECT_EQ(seed.wait(10s), 3);
  EXPECT_EQ(seed.wait(), 3) << "wait() after formation returns the world again";
  expect_working_cluster(comms);
  close_all(comms);
}

TEST(Seed, RequestedRanksHonoured) {
  const nexar::Config cfg = fast_config();
  {
    // Every joiner names its rank (and the world): each gets exactly that.
    Seed seed(seed_opts(3), cfg);
    const int asked[] = {2, 0, 1};
    std::vector<std::future<Joined>> fs;
    for (int r : asked) fs.push_back(start_join(join_opts(seed, r, 3), cfg));
    std::vector<Communicator> comms = joined_all(fs);
    ASSERT_EQ(comms.size(), 3u);
    for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(comms[i].rank(), asked[i]);
    EXPECT_EQ(seed.wait(10s), 3);
    expect_working_cluster(comms);
    close_all(comms);
  }
  {
    // One names rank 0; the others take what is left (1 and 2).
    Seed seed(seed_opts(3), cfg);
    std::vector<std::future<Joined>> fs;
    fs.push_back(start_join(join_opts(seed, -1), cfg));
    fs.push_back(start_join(join_opts(seed, 0), cfg));
    fs.push_back(start_join(join_opts(seed, -1, 3), cfg));
    std::vector<Communicator> comms = joined_all(fs);
    ASSERT_EQ(comms.size(), 3u);
    EXPECT_EQ(comms[1].rank(), 0);
    EXPECT_EQ(std::set<int>({comms[0].rank(), comms[2].rank()}), std::set<int>({1, 2}));
    EXPECT_EQ(seed.wait(10s), 3);
    expect_working_cluster(comms);
    close_all(comms);
  }
}

TEST(Seed, Ipv6Loopback) {
  if (!can_bind_ipv6_loopback()) GTEST_SKIP() << "::1 cannot be bound here";
  const nexar::Config cfg = fast_config();
  Seed seed(seed_opts(2, "[::1]:0"), cfg);
  EXPECT_EQ(seed.address().rfind("[::1]:", 0), 0u) << seed.address();
  JoinOptions a = join_opts(seed);
  // The fingerprint pin is case-insensitive.
  a.seed_fingerprint = seed.fingerprint();
  std::transform(
      a.seed_fingerprint.begin(), a.seed_fingerprint.end(), a.seed_fingerprint.begin(),
      [](char ch) { return static_cast<char>(std::toupper(static_cast<unsigned char>(ch))); });
  JoinOptions b = join_opts(seed);
  b.seed_ca_pem = seed.ca_pem();
  std::vector<std::future<Joined>> fs;
  fs.push_back(start_join(a, cfg));
  fs.push_back(start_join(b, cfg));
  std::vector<Communicator> comms = joined_all(fs);
  ASSERT_EQ(comms.size(), 2u);
  EXPECT_EQ(seed.wait(10s), 2);
  expect_working_cluster(comms);
  close_all(comms);
}

TEST(Seed, MinWorldFormsSmallerClusterAfterTimeout) {
  const nexar::Config cfg = fast_config();
  SeedOptions so = seed_opts(4);
  so.min_world = 2;
  so.formation_timeout = 1s;
  Seed seed(so, cfg);
  const auto t0 = Clock::now();
  std::vector<std::future<Joined>> fs;
  fs.push_back(start_join(join_opts(seed), cfg));
  fs.push_back(start_join(join_opts(seed), cfg));
  std::vector<Communicator> comms = joined_all(fs);
  ASSERT_EQ(comms.size(), 2u);
  EXPECT_GE(ms_since(t0), 900ms) << "formed before the formation timeout";
  EXPECT_LT(ms_since(t0), 5s);
  EXPECT_EQ(seed.wait(10s), 2);
  expect_working_cluster(comms);
  close_all(comms);
}

TEST(Seed, MinWorldTurnsAwayRequestsItCannotHonour) {
  // World 4, minimum 2: three join, one of them insisting on world 4. At the formation
  // timeout the seed forms with the two others and tells the third why not.
  const nexar::Config cfg = fast_config();
  SeedOptions so = seed_opts(4);
  so.min_world = 2;
  so.formation_timeout = 1s;
  Seed seed(so, cfg);
  auto insists = start_join(join_opts(seed, -1, 4), cfg);
  std::vector<std::future<Joined>> fs;
  fs.push_back(start_join(join_opts(seed), cfg));
  fs.push_back(start_join(join_opts(seed), cfg));
  const std::string w = expect_join_error(insists, Errc::rejected, 5s);
  EXPECT_TRUE(contains(w, "formed with")) << w;
  std::vector<Communicator> comms = joined_all(fs);
  ASSERT_EQ(comms.size(), 2u);
  EXPECT_EQ(seed.wait(10s), 2);
  expect_working_cluster(comms);
  close_all(comms);
}

// (Regression: the refusal once named the world size before the refused joiner was taken
// out, telling it "formed with 3 ranks" while the cluster formed with 2.)
TEST(Seed, MinWorldRefusalNamesTheWorldFormed) {
  const nexar::Config cfg = fast_config();
  SeedOptions so = seed_opts(4);
  so.min_world = 2;
  so.formation_timeout = 1s;
  Seed seed(so, cfg);
  auto insists = start_join(join_opts(seed, -1, 4), cfg);
  std::vector<std::future<Joined>> fs;
  fs.push_back(start_join(join_opts(seed), cfg));
  fs.push_back(start_join(join_opts(seed), cfg));
  const std::string w = expect_join_error(insists, Errc::rejected, 5s);
  std::vector<Communicator> comms = joined_all(fs);
  ASSERT_EQ(comms.size(), 2u);
  EXPECT_TRUE(contains(w, "formed with 2 ranks")) << w;
  EXPECT_FALSE(contains(w, "formed with 3 ranks")) << w;
  close_all(comms);
}

TEST(Seed, JoinerGivingUpIsNotCounted) {
  // A joiner whose join_timeout passes while it waits for the world gives up with a clear
  // error and leaves; the cluster then forms without it.
  const nexar::Config cfg = fast_config();
  Seed seed(seed_opts(2), cfg);
  JoinOptions impatient = join_opts(seed, 0, 2);
  impatient.join_timeout = 1s;
  auto f = start_join(impatient, cfg);
  const std::string w = expect_join_error(f, Errc::timeout, 3s);
  EXPECT_TRUE(contains(w, "admitted, but the cluster did not form")) << w;
  EXPECT_TRUE(contains(w, "1000 ms")) << w;
  // Its rank 0 is free again; give the seed a moment to see the connection close.
  std::this_thread::sleep_for(200ms);
  std::vector<std::future<Joined>> fs;
  fs.push_back(start_join(join_opts(seed, 0, 2), cfg));
  fs.push_back(start_join(join_opts(seed, 1, 2), cfg));
  std::vector<Communicator> comms = joined_all(fs);
  ASSERT_EQ(comms.size(), 2u);
  EXPECT_EQ(comms[0].rank(), 0);
  EXPECT_EQ(seed.wait(10s), 2);
  expect_working_cluster(comms);
  close_all(comms);
}

// ---- refusals ----

TEST(Seed, RankConflictAndMismatchedRequests) {
  const nexar::Config cfg = fast_config();
  Seed seed(seed_opts(3), cfg);
  // Two ask for rank 1: whichever comes second is refused, naming the rank.
  auto a = start_join(join_opts(seed, 1, 3), cfg);
  auto b = start_join(join_opts(seed, 1, 3), cfg);
  // A rank beyond the seed's world (this joiner has no world of its own to check it against).
  auto high = start_join(join_opts(seed, 5, 0), cfg);
  // A joiner expecting another world size.
  auto other_world = start_join(join_opts(seed, -1, 5), cfg);

  std::string w = expect_join_error(high, Errc::rejected, 5s);
  EXPECT_TRUE(contains(w, "rank 5")) << w;
  EXPECT_TRUE(contains(w, "0..2")) << w;
  w = expect_join_error(other_world, Errc::rejected, 5s);
  EXPECT_TRUE(contains(w, "world size 5")) << w;
  EXPECT_TRUE(contains(w, "3")) << w;

  // Exactly one of a and b is refused; the other waits for the cluster.
  const auto until = Clock::now() + 5s;
  std::future<Joined>* loser = nullptr;
  std::future<Joined>* winner = nullptr;
  while (loser == nullptr && Clock::now() < until) {
    if (a.wait_for(10ms) == std::future_status::ready)
      loser = &a, winner = &b;
    else if (b.wait_for(10ms) == std::future_status::ready)
      loser = &b, winner = &a;
  }
  ASSERT_NE(loser, nullptr) << "neither joiner asking for rank 1 was refused";
  w = expect_join_error(*loser, Errc::rejected, 5s);
  EXPECT_TRUE(contains(w, "rank 1")) << w;
  EXPECT_TRUE(contains(w, "taken")) << w;
  EXPECT_EQ(winner->wait_for(0s), std::future_status::timeout)
      << "the first to ask for rank 1 did not wait";

  // Two more complete the world; the survivor has rank 1.
  std::vector<std::future<Joined>> fs;
  fs.push_back(std::move(*winner));
  fs.push_back(start_join(join_opts(seed), cfg));
  fs.push_back(start_join(join_opts(seed), cfg));
  std::vector<Communicator> comms = joined_all(fs);
  ASSERT_EQ(comms.size(), 3u);
  EXPECT_EQ(comms[0].rank(), 1);
  EXPECT_EQ(seed.wait(10s), 3);
  expect_working_cluster(comms);
  close_all(comms);
}

TEST(Seed, LateJoinerToFormedClusterRejected) {
  const nexar::Config cfg = fast_config();
  Seed seed(seed_opts(2), cfg);
  std::vector<std::future<Joined>> fs;
  fs.push_back(start_join(join_opts(seed), cfg));
  fs.push_back(start_join(join_opts(seed), cfg));
  std::vector<Communicator> comms = joined_all(fs);
  ASSERT_EQ(comms.size(), 2u);
  EXPECT_EQ(seed.wait(10s), 2);
  // The seed object is still alive, so it still answers: a clear refusal, at once.
  JoinOptions late_opts = join_opts(seed);
  late_opts.join_timeout = 10s;
  auto late = start_join(late_opts, cfg);
  const std::string w = expect_join_error(late, Errc::rejected, 3s);
  EXPECT_TRUE(contains(w, "already formed")) << w;
  EXPECT_TRUE(contains(w, "2 ranks")) << w;
  EXPECT_EQ(seed.wait(1s), 2);
  expect_working_cluster(comms);
  close_all(comms);
}

TEST(Seed, FormationTimeoutTellsWaitingJoiners) {
  const nexar::Config cfg = fast_config();
  SeedOptions so = seed_opts(3);
  so.formation_timeout = 1s;
  Seed seed(so, cfg);
  const auto t0 = Clock::now();
  auto a = start_join(join_opts(seed), cfg);
  auto b = start_join(join_opts(seed), cfg);
  for (auto* f : {&a, &b}) {
    const std::string w = expect_join_error(*f, Errc::timeout, 4s);
    EXPECT_TRUE(contains(w, "cluster did not form: 2 of 3 ranks joined")) << w;
  }
  EXPECT_GE(ms_since(t0), 900ms);
  const std::string w = expect_error(Errc::timeout, [&] { seed.wait(5s); });
  EXPECT_TRUE(contains(w, "cluster did not form: 2 of 3 ranks joined")) << w;
  EXPECT_TRUE(contains(w, seed.address())) << w;
  // A joiner coming after that is refused too, promptly.
  auto late = start_join(join_opts(seed), cfg);
  const std::string w2 = expect_join_error(late, Errc::rejected, 3s);
  EXPECT_TRUE(contains(w2, "no longer admitting")) << w2;
}

TEST(Seed, StopTellsWaitingJoiners) {
  const nexar::Config cfg = fast_config();
  Seed seed(seed_opts(3), cfg);
  auto a = start_join(join_opts(seed), cfg);
  auto b = start_join(join_opts(seed), cfg);
  // Let both be admitted (loopback: milliseconds; the margin is for slow sanitizer builds).
  std::this_thread::sleep_for(1500ms);
  ASSERT_EQ(a.wait_for(0s), std::future_status::timeout) << finish(a).what;
  const auto t0 = Clock::now();
  auto waiter = std::async(std::launch::async,
                           [&] { return expect_error(Errc::closed, [&] { seed.wait(); }); });
  seed.stop();
  std::printf("stop() took %lld ms\n", static_cast<long long>(ms_since(t0).count()));
  EXPECT_LT(ms_since(t0), 3s) << "stop() took long";
  for (auto* f : {&a, &b}) {
    Joined j = finish(*f);
    std::printf("waiting joiner: %s\n", j.what.c_str());
    EXPECT_EQ(j.code, Errc::closed) << nexar::to_string(j.code) << ": " << j.what;
    EXPECT_TRUE(contains(j.what, "stopped")) << j.what;
    EXPECT_LT(j.ended - t0, 3s) << j.what;
  }
  ASSERT_EQ(waiter.wait_for(5s), std::future_status::ready) << "wait() did not return after stop()";
  const std::string w = waiter.get();
  EXPECT_TRUE(contains(w, "stopped")) << w;
  seed.stop();  // idempotent
  expect_error(Errc::closed, [&] { seed.wait(1s); });
  // A stopped seed no longer answers: a joiner gives up at its deadline, not later.
  JoinOptions late_opts = join_opts(seed);
  late_opts.join_timeout = 1s;
  auto late = start_join(late_opts, cfg);
  expect_join_error(late, Errc::timeout, 3s);
}

// ---- hostile and vanishing clients ----

TEST(Seed, VanishedJoinersAreNotCounted) {
  const nexar::Config cfg = fast_config();
  Seed seed(seed_opts(3), cfg);
  // Each raw client is admitted (asking ranks 2 and 1) and then leaves: the first closes its
  // connection properly, the second disappears silently, as a killed process would.
  RawSeedClient closes(seed.address(), [](Connection& c, const nexar::wire::SeedHello& h) {
    return join_request(c, h, kToken, 2, 3, "closes-cleanly");
  });
  RawSeedClient vanishes(
      seed.address(),
      [](Connection& c, const nexar::wire::SeedHello& h) {
        return join_request(c, h, kToken, 1, 3, "vanishes");
      },
      1s /* idle timeout: how soon the seed notices */);
  ASSERT_TRUE(closes.wait_acked(5s));
  ASSERT_TRUE(vanishes.wait_acked(5s));
  // Both were admitted: their ranks are taken.
  for (int r : {2, 1}) {
    auto probe = start_join(join_opts(seed, r, 3), cfg);
    const std::string w = expect_join_error(probe, Errc::rejected, 5s);
    EXPECT_TRUE(contains(w, "rank " + std::to_string(r) + " is already taken by")) << w;
    EXPECT_TRUE(contains(w, r == 2 ? "closes-cleanly" : "vanishes")) << w;
  }
  closes.close();
  vanishes.vanish();
  // The seed drops the silent one when the idle timeout (1 s) passes.
  std::this_thread::sleep_for(2500ms);
  std::vector<std::future<Joined>> fs;
  fs.push_back(start_join(join_opts(seed, 2, 3), cfg));
  fs.push_back(start_join(join_opts(seed, 1, 3), cfg));
  fs.push_back(start_join(join_opts(seed, -1, 3), cfg));
  std::vector<Communicator> comms = joined_all(fs);
  ASSERT_EQ(comms.size(), 3u);
  EXPECT_EQ(comms[0].rank(), 2);
  EXPECT_EQ(comms[1].rank(), 1);
  EXPECT_EQ(comms[2].rank(), 0);
  EXPECT_EQ(seed.wait(10s), 3);
  expect_working_cluster(comms);
  close_all(comms);
}

// What the seed does with a joiner that dies silently after admission and before its idle
// timeout passes: it still counts it, and the cluster forms with a dead member. That much is
// inherent (the seed cannot tell silence from a slow network sooner); the live members then
// fail promptly and clearly when they cannot reach it, and Seed::wait() must not report
// success: it returns only once "every member received its assignment".
TEST(Seed, WaitDoesNotReportUndeliveredAssignmentsAsFormed) {
  nexar::Config cfg = fast_config();
  cfg.idle_timeout = 2s;
  cfg.connect_timeout = 2s;
  Seed seed(seed_opts(3), cfg);
  RawSeedClient dies(
      seed.address(),
      [](Connection& c, const nexar::wire::SeedHello& h) {
        return join_request(c, h, kToken, 2, 3, "dies");
      },
      1s);
  ASSERT_TRUE(dies.wait_acked(5s));
  dies.vanish();
  auto a = start_join(join_opts(seed), cfg);
  auto b = start_join(join_opts(seed), cfg);
  // The live members fail promptly; one names the dead rank 2 (the other may fail first
  // because that one closed).
  bool named = false;
  for (auto* f : {&a, &b}) {
    Joined j = finish(*f);
    EXPECT_TRUE(j.code == Errc::peer_failed || j.code == Errc::timeout ||
                j.code == Errc::peer_closed)
        << nexar::to_string(j.code) << ": " << j.what;
    named = named || contains(j.what, "peer 2");
    EXPECT_LT(j.took, 5s) << j.what;
  }
  EXPECT_TRUE(named) << "no member named the dead rank 2";
  try {
    const int n = seed.wait(10s);
    ADD_FAILURE() << "wait() reports a cluster of " << n
                  << " formed, but rank 2 never got its assignment";
  } catch (const Error& e) {
    std::printf("seed.wait(): %s\n", e.what());
  }
}

TEST(Seed, HostileJoinersRefusedAndClosed) {
  const nexar::Config cfg = fast_config();
  Seed seed(seed_opts(2), cfg);
  struct Case {
    const char* name;
    RawSeedClient::Reply reply;
    Errc code;
    std::string reason;
  };
  const std::vector<Case> cases = {
      {"bad magic", [](Connection&, const nexar::wire::SeedHello&) { return Bytes8(64, 'G'); },
       Errc::protocol, "bad magic"},
      {"4 GiB body",
       [](Connection&, const nexar::wire::SeedHello&) {
         const auto header =
             nexar::wire::encode_seed_header(nexar::wire::SeedMsgType::join, 0xffffffffu);
         Bytes8 b(header.size() + 4096, 0xab);  // sized once: growing it trips GCC 12 -O3
         std::copy(header.begin(), header.end(), b.begin());
         return b;
       },
       Errc::protocol, "exceeds limit"},
      {"a hello instead of a request",
       [](Connection&, const nexar::wire::SeedHello& h) { return nexar::wire::encode(h); },
       Errc::protocol, "unexpected"},
      {"proof from a wrong token",
       [](Connection& c, const nexar::wire::SeedHello& h) {
         return join_request(c, h, "wrong", -1, 0, "wrong-token");
       },
       Errc::rejected, "wrong cluster token"},
      {"the seed's own proof reflected",
       [](Connection& c, const nexar::wire::SeedHello& h) {
         return join_request(c, h, kToken, -1, 0, "reflector", ProofRole::seed);
       },
       Errc::rejected, "wrong cluster token"},
      {"invalid node name",
       [](Connection& c, const nexar::wire::SeedHello& h) {
         nexar::wire::JoinRequest r;
         r.proof = prove(kToken, ProofRole::joiner, c.export_secret(exporter_label));
         r.port = 9;
         r.node = "bad name/../x";
         r.csr_pem = "not a csr";  // not 1 char: GCC 12 -O3 -Wrestrict
         (void)h;
         return nexar::wire::encode(r);
       },
       Errc::protocol, "invalid node name"},
      {"the seed's own node name (its certificate would pass a CA pin as the seed)",
       [](Connection& c, const nexar::wire::SeedHello& h) {
         return join_request(c, h, kToken, -1, 0, "seed");
       },
       Errc::protocol, "invalid node name"},
      {"garbage CSR",
       [](Connection& c, const nexar::wire::SeedHello&) {
         nexar::wire::JoinRequest r;
         r.proof = prove(kToken, ProofRole::joiner, c.export_secret(exporter_label));
         r.port = 9;
         r.node = "garbage-csr";
         r.csr_pem =
             "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n";
         return nexar::wire::encode(r);
       },
       Errc::tls, ""},
      {"two requests",
       [](Connection& c, const nexar::wire::SeedHello& h) {
         Bytes8 b = join_request(c, h, kToken, -1, 0, "twice");
         Bytes8 again = b;
         b.insert(b.end(), again.begin(), again.end());
         return b;
       },
       Errc::protocol, "unexpected"},
  };
  std::vector<std::unique_ptr<RawSeedClient>> clients;
  std::vector<std::future<nexar::wire::SeedMessage>> answers;
  std::vector<std::future<std::string>> closed;
  for (const Case& k : cases) {
    clients.push_back(std::make_unique<RawSeedClient>(seed.address(), k.reply));
    answers.push_back(clients.back()->answer_future());
    closed.push_back(clients.back()->closed_future());
  }
  const auto t0 = Clock::now();
  for (std::size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].name);
    const nexar::wire::JoinReject r = expect_reject(answers[i]);
    EXPECT_EQ(r.code, static_cast<std::uint16_t>(cases[i].code)) << r.reason;
    EXPECT_TRUE(contains(r.reason, cases[i].reason)) << r.reason;
    std::printf("%s: refused (%s): %s\n", cases[i].name,
                nexar::to_string(static_cast<Errc>(r.code)), r.reason.c_str());
  }
  EXPECT_LT(ms_since(t0), 5s);

  // None of them counts: two good joiners form the cluster of 2.
  std::vector<std::future<Joined>> fs;
  fs.push_back(start_join(join_opts(seed), cfg));
  fs.push_back(start_join(join_opts(seed), cfg));
  std::vector<Communicator> comms = joined_all(fs);
  ASSERT_EQ(comms.size(), 2u);
  EXPECT_EQ(seed.wait(10s), 2);
  expect_working_cluster(comms);
  close_all(comms);

  // The refused clients never close their side; the seed closes for them (after its linger).
  for (std::size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].name);
    ASSERT_EQ(closed[i].wait_for(10s), std::future_status::ready)
        << "the seed kept the connection open";
    const std::string why = closed[i].get();
    EXPECT_TRUE(contains(why, "peer_closed")) << why;
  }
}

// Clients that connect (no token needed for that), take the hello and then say nothing
// must not keep a real joiner out. The seed caps the connections it holds at 4 * world + 64;
// at the cap the oldest unproven client makes room, and silent ones are closed after a
// deadline.
TEST(Seed, IdleClientsDoNotLockOutJoiners) {
  const nexar::Config cfg = fast_config();
  Seed seed(seed_opts(1), cfg);
  constexpr int kIdle = 4 * 1 + 64 + 2;
  std::atomic<int> greeted{0};
  std::vector<std::unique_ptr<RawSeedClient>> idle;
  for (int i = 0; i < kIdle; ++i)
    idle.push_back(std::make_unique<RawSeedClient>(seed.address(),
                                                   [&](Connection&, const nexar::wire::SeedHello&) {
                                                     ++greeted;
                                                     return Bytes8{};  // never sends a request
                                                   }));
  const auto until = Clock::now() + 10s;
  while (greeted.load() < 4 + 64 && Clock::now() < until) std::this_thread::sleep_for(10ms);
  EXPECT_GE(greeted.load(), 4 + 64);
  JoinOptions o = join_opts(seed);
  o.join_timeout = 4s;
  std::vector<std::future<Joined>> fs;
  fs.push_back(start_join(o, cfg));
  std::vector<Communicator> comms = joined_all(fs);
  ASSERT_EQ(comms.size(), 1u) << "a real joiner was locked out by " << kIdle << " idle clients";
  EXPECT_EQ(seed.wait(5s), 1);
  close_all(comms);
}

TEST(Seed, GarbageDatagramsDuringFormation) {
  const nexar::Config cfg = fast_config();
  Seed seed(seed_opts(3), cfg);
  const nexar::quic::Address to = nexar::quic::Address::parse(seed.address());
  std::atomic<int> sent{0};
  std::thread spray([&] {
    const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
    if (fd < 0) return;
    std::mt19937 rng(5);
    Bytes8 d(1500);
    for (int i = 0; i < 1000; ++i) {
      std::size_t n = 1 + rng() % 1500;
      for (std::size_t k = 0; k < n; ++k) d[k] = static_cast<std::uint8_t>(rng());
      if (i % 10 == 0) {
        // A QUIC v1 long-header Initial of full size, to get past the first checks.
        n = 1200 + rng() % 250;
        d[0] = static_cast<std::uint8_t>(0xC0 | (d[0] & 0x0F));
        d[1] = 0, d[2] = 0, d[3] = 0, d[4] = 1;
        d[5] = static_cast<std::uint8_t>(8 + rng() % 13);  // DCID length 8..20
      }
      if (::sendto(fd, d.data(), n, 0, to.sa(), to.len) > 0) ++sent;
      if (i % 50 == 49) std::this_thread::sleep_for(2ms);
    }
    ::close(fd);
  });
  std::vector<std::future<Joined>> fs;
  for (int i = 0; i < 3; ++i) {
    fs.push_back(start_join(join_opts(seed), cfg));
    std::this_thread::sleep_for(20ms);
  }
  std::vector<Communicator> comms = joined_all(fs);
  spray.join();
  EXPECT_EQ(sent.load(), 1000);
  ASSERT_EQ(comms.size(), 3u);
  EXPECT_EQ(seed.wait(10s), 3);
  expect_working_cluster(comms);
  close_all(comms);
}

// ---- relay keys ----

using nexar::wire::RelayKey;

// Each member's accept carries the keys of the pairs it is part of: one per member, zero for
// itself, the same at both ends of a pair, a different one for every pair; and another job
// (another seed, another master secret) has other keys for the same names and ranks.
TEST(Seed, RelayKeysGoToTheTwoEndsOfEachPair) {
  const nexar::Config cfg = fast_config();
  constexpr int kWorld = 4;
  std::vector<std::vector<nexar::wire::JoinAccept>> jobs;
  for (int job = 0; job < 2; ++job) {
    Seed seed(seed_opts(kWorld), cfg);
    std::vector<std::unique_ptr<RawSeedClient>> clients;
    jobs.push_back(join_raw(seed, kWorld, "keys", clients));
  }
  for (const auto& accs : jobs) {
    ASSERT_EQ(accs.size(), static_cast<std::size_t>(kWorld));
    std::set<RelayKey> distinct;
    for (std::size_t a = 0; a < accs.size(); ++a) {
      SCOPED_TRACE("rank " + std::to_string(a));
      EXPECT_EQ(accs[a].rank, static_cast<int>(a));
      ASSERT_EQ(accs[a].keys.size(), static_cast<std::size_t>(kWorld));
      EXPECT_EQ(accs[a].keys[a], RelayKey{}) << "a key for itself";
      for (std::size_t b = 0; b < accs.size(); ++b) {
        if (a == b) continue;
        EXPECT_NE(accs[a].keys[b], RelayKey{});
        EXPECT_EQ(accs[a].keys[b], accs[b].keys[a]) << "ranks " << a << " and " << b << " hold different keys";
        distinct.insert(accs[a].keys[b]);
      }
    }
    EXPECT_EQ(distinct.size(), static_cast<std::size_t>(kWorld * (kWorld - 1) / 2));
  }
  for (std::size_t a = 0; a < kWorld; ++a) {
    for (std::size_t b = 0; b < kWorld; ++b) {
      if (a != b) {
        EXPECT_NE(jobs[0][a].keys[b], jobs[1][a].keys[b]) << "two jobs share a key";
      }
    }
  }
}

// Elastic: a node admitted into the running job gets its keys with every rank handed out;
// each linked node (members, and joiners before it) hears of it with the one key it shares
// with it, which is the joiner's key for that node.
TEST(Seed, ElasticAnnouncementsCarryTheKeyWithTheNewNode) {
  const nexar::Config cfg = fast_config();
  SeedOptions so = seed_opts(2);
  so.elastic = true;
  Seed seed(so, cfg);
  std::vector<std::unique_ptr<RawSeedClient>> members;
  const auto formed = join_raw(seed, 2, "member", members);
  ASSERT_EQ(formed.size(), 2u);
  for (const auto& a : formed) EXPECT_TRUE(a.flags & nexar::wire::accept_elastic);

  std::vector<std::unique_ptr<RawSeedClient>> late;
  std::vector<nexar::wire::JoinAccept> late_acc;
  for (int i = 0; i < 2; ++i) {
    const std::string node = "late-" + std::to_string(i);
    late.push_back(std::make_unique<RawSeedClient>(
        seed.address(), [node](Connection& c, const nexar::wire::SeedHello& h) {
          return join_request(c, h, kToken, -1, 0, node);
        }));
    auto f = late.back()->answer_future();
    late_acc.push_back(expect_accept(f));
    const auto& acc = late_acc.back();
    const int id = 2 + i;
    ASSERT_EQ(acc.rank, id);
    ASSERT_EQ(acc.keys.size(), static_cast<std::size_t>(id + 1));
    EXPECT_EQ(acc.keys[static_cast<std::size_t>(id)], RelayKey{});
    std::set<RelayKey> distinct(acc.keys.begin(), acc.keys.end());
    EXPECT_EQ(distinct.size(), static_cast<std::size_t>(id + 1)) << "keys repeat (or a zero one)";
    // Each linked node before it (world ranks 0..id-1): one announcement more, carrying
    // their pair's key. Rank r has heard of the joiners from max(2, r + 1) up to this one.
    std::vector<RawSeedClient*> linked;
    for (auto& m : members) linked.push_back(m.get());
    for (int k = 0; k < i; ++k) linked.push_back(late[static_cast<std::size_t>(k)].get());
    for (std::size_t r = 0; r < linked.size(); ++r) {
      SCOPED_TRACE("world rank " + std::to_string(r) + " hearing of " + node);
      const std::size_t before = static_cast<std::size_t>(id) - std::max<std::size_t>(2, r + 1);
      const auto heard = linked[r]->wait_later(before + 1);
      ASSERT_EQ(heard.size(), before + 1);
      const auto* an = std::get_if<nexar::wire::Announce>(&heard.back());
      ASSERT_NE(an, nullptr);
      EXPECT_EQ(an->rank, id);
      EXPECT_EQ(an->member.node, node);
      EXPECT_EQ(an->key, acc.keys[r]);
      // Not a key of any pair it was already part of.
      const auto& own = r < 2 ? formed[r].keys : late_acc[r - 2].keys;
      EXPECT_EQ(std::count(own.begin(), own.end(), an->key), 0);
    }
  }
  // The first joiner's key with the second equals the second's key with the first.
  const auto heard = late[0]->wait_later(1);
  ASSERT_EQ(heard.size(), 1u);
  EXPECT_EQ(std::get<nexar::wire::Announce>(heard[0]).key, late_acc[1].keys[2]);
}

// ---- options ----

TEST(Seed, InvalidOptions) {
  const nexar::Config cfg = fast_config();
  auto bad = [&](SeedOptions o, Errc code, const std::string& part) {
    SCOPED_TRACE(o.listen + " world " + std::to_string(o.world) + " min " +
                 std::to_string(o.min_world));
    const std::string w = expect_error(code, [&] { Seed s(o, cfg); });
    EXPECT_TRUE(contains(w, part)) << w;
  };
  SeedOptions o = seed_opts(0);
  bad(o, Errc::invalid_argument, "world size 0");
  o.world = -3;
  bad(o, Errc::invalid_argument, "world size -3");
  o = seed_opts(3);
  o.min_world = 4;
  bad(o, Errc::invalid_argument, "minimum world size 4");
  o.min_world = -1;
  bad(o, Errc::invalid_argument, "minimum world size -1");
  o = seed_opts(3);
  o.formation_timeout = 0ms;
  bad(o, Errc::invalid_argument, "formation timeout");
  for (const char* listen : {"127.0.0.1", "127.0.0.1:99999", "[::1", "127.0.0.1:port", ""}) {
    o = seed_opts(2, listen);
    bad(o, Errc::invalid_argument, "");
  }
  // A well-formed address this host does not have: cannot bind.
  o = seed_opts(2, "192.0.2.1:0");
  bad(o, Errc::io, "192.0.2.1");
  // An invalid config is refused too.
  nexar::Config broken = cfg;
  broken.udp_payload = 10;
  expect_error(Errc::invalid_argument, [&] { Seed s(seed_opts(1), broken); });

  // Defaults that are generated: a random 256-bit token and a random cluster name, and
  // every seed has its own certificate.
  o = seed_opts(1);
  o.token.clear();
  Seed s1(o, cfg);
  Seed s2(o, cfg);
  EXPECT_EQ(s1.token().size(), 64u) << s1.token();
  EXPECT_EQ(s1.token().find_first_not_of("0123456789abcdef"), std::string::npos) << s1.token();
  EXPECT_NE(s1.token(), s2.token());
  EXPECT_NE(s1.cluster(), s2.cluster());
  EXPECT_NE(s1.fingerprint(), s2.fingerprint());
  o.cluster = "named-cluster";
  Seed s3(o, cfg);
  EXPECT_EQ(s3.cluster(), "named-cluster");
}

}  // namespace
