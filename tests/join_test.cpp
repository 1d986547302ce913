// Tests of joining a cluster (src/cluster/join.cpp): refusals a joiner must report promptly
// and clearly (wrong token, wrong seed pins, no seed), invalid options, and join_from_env()
// with an embedded seed. Against the real QUIC stack on loopback.
#include <gtest/gtest.h>

#include <nexar/cluster.hpp>
#include <nexar/error.hpp>

#include "cluster_support.hpp"
#include "support.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <optional>
#include <string>
#include <vector>

namespace {

using namespace nexar::testing;
using nexar::Communicator;
using nexar::Errc;
using nexar::JoinOptions;
using nexar::Seed;

// A UDP port that nothing listens on right now (on every address).
std::uint16_t free_udp_port() {
  const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  EXPECT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// ---- refusals ----

TEST(Join, WrongTokenRejectedOthersUnaffected) {
  const nexar::Config cfg = fast_config();
  Seed seed(seed_opts(2), cfg);
  auto good1 = start_join(join_opts(seed), cfg);
  JoinOptions bad = join_opts(seed);
  bad.token = "not-the-token";
  auto wrong = start_join(bad, cfg);
  const std::string w = expect_join_error(wrong, Errc::rejected, 5s);
  EXPECT_TRUE(contains(w, "token")) << w;
  EXPECT_TRUE(contains(w, seed.address())) << w;
  auto good2 = start_join(join_opts(seed), cfg);
  std::vector<std::future<Joined>> fs;
  fs.push_back(std::move(good1));
  fs.push_back(std::move(good2));
  std::vector<Communicator> comms = joined_all(fs);
  ASSERT_EQ(comms.size(), 2u);
  EXPECT_EQ(seed.wait(10s), 2);
  expect_working_cluster(comms);
  close_all(comms);
}

TEST(Join, WrongFingerprintPinFailsFast) {
  const nexar::Config cfg = fast_config();
  Seed seed(seed_opts(1), cfg);
  Seed other(seed_opts(1), cfg);  // same token, different certificate
  const std::string zeros = "sha256:" + std::string(64, '0');
  for (const std::string& pin : {zeros, other.fingerprint()}) {
    JoinOptions o = join_opts(seed);
    o.seed_fingerprint = pin;
    auto f = start_join(o, cfg);
    const std::string w = expect_join_error(f, Errc::tls, 5s);
    EXPECT_TRUE(contains(w, pin)) << w;
    EXPECT_TRUE(contains(w, seed.fingerprint())) << "does not name what the seed presented: " << w;
  }
  // The seed is unharmed: a correctly pinned joiner forms the cluster.
  JoinOptions o = join_opts(seed);
  o.seed_fingerprint = seed.fingerprint();
  auto f = start_join(o, cfg);
  std::vector<std::future<Joined>> fs;
  fs.push_back(std::move(f));
  std::vector<Communicator> comms = joined_all(fs);
  ASSERT_EQ(comms.size(), 1u);
  EXPECT_EQ(seed.wait(10s), 1);
  expect_working_cluster(comms);
  close_all(comms);
}

TEST(Join, WrongCaPinFailsFast) {
  const nexar::Config cfg = fast_config();
  Seed seed(seed_opts(1), cfg);
  Seed other(seed_opts(1), cfg);
  JoinOptions o = join_opts(seed);
  o.seed_ca_pem = other.ca_pem();
  auto f = start_join(o, cfg);
  const std::string w = expect_join_error(f, Errc::tls, 5s);
  EXPECT_TRUE(contains(w, "certificate")) << w;
  // Pinning both, the right CA with a wrong fingerprint, still fails.
  o.seed_ca_pem = seed.ca_pem();
  o.seed_fingerprint = other.fingerprint();
  auto f2 = start_join(o, cfg);
  expect_join_error(f2, Errc::tls, 5s);
  // Both pins right: joins.
  o.seed_fingerprint = seed.fingerprint();
  std::vector<std::future<Joined>> fs;
  fs.push_back(start_join(o, cfg));
  std::vector<Communicator> comms = joined_all(fs);
  ASSERT_EQ(comms.size(), 1u);
  EXPECT_EQ(seed.wait(10s), 1);
  close_all(comms);
}

TEST(Join, SeedUnreachableTimesOut) {
  const std::uint16_t port = free_udp_port();
  JoinOptions o;
  o.seed = "127.0.0.1:" + std::to_string(port);
  o.token = kToken;
  o.join_timeout = 1500ms;
  auto f = start_join(o, fast_config());
  Joined j = finish(f);
  std::printf("unreachable seed: %s\n", j.what.c_str());
  EXPECT_EQ(j.code, Errc::timeout) << j.what;
  EXPECT_GE(j.took, 1400ms) << j.what;
  EXPECT_LT(j.took, 2500ms) << j.what;
  EXPECT_TRUE(contains(j.what, o.seed)) << j.what;
  EXPECT_TRUE(contains(j.what, "did not answer")) << j.what;
}

// ---- options ----

TEST(Join, InvalidOptions) {
  const nexar::Config cfg = fast_config();
  auto bad = [&](const JoinOptions& o, const std::string& part) {
    SCOPED_TRACE("seed '" + o.seed + "' rank " + std::to_string(o.rank) + " world " +
                 std::to_string(o.world));
    const auto t0 = Clock::now();
    const std::string w = expect_error(Errc::invalid_argument, [&] { (void)nexar::join(o, cfg); });
    EXPECT_TRUE(contains(w, part)) << w;
    EXPECT_LT(ms_since(t0), 1s);
  };
  JoinOptions ok;
  ok.seed = "127.0.0.1:" + std::to_string(free_udp_port());
  ok.token = kToken;
  ok.join_timeout = 1s;
  JoinOptions o = ok;
  o.token.clear();
  bad(o, "token");
  o = ok;
  o.seed.clear();
  bad(o, "seed");
  o = ok;
  o.world = -1;
  bad(o, "world size -1");
  o = ok;
  o.rank = -2;
  bad(o, "rank -2");
  o = ok;
  o.world = 3;
  o.rank = 3;
  bad(o, "rank 3");
  o = ok;
  o.seed = "127.0.0.1:99999";
  bad(o, "99999");
  o = ok;
  o.seed = "127.0.0.1";
  bad(o, "127.0.0.1");
  o = ok;
  o.bind = "not an ip";
  bad(o, "not an ip");
}

// ---- join_from_env ----

TEST(Join, FromEnvironmentSingleRankEmbedsSeed) {
  const std::uint16_t port = free_udp_port();
  std::optional<Communicator> c;
  {
    ScopedEnv rank("NEXAR_RANK", "0");
    ScopedEnv world("NEXAR_WORLD_SIZE", "1");
    ScopedEnv master("MASTER_ADDR", "127.0.0.1");
    ScopedEnv master_port("MASTER_PORT", std::to_string(port));
    ScopedEnv token("NEXAR_CLUSTER_TOKEN", "x");
    ScopedEnv join_timeout("NEXAR_JOIN_TIMEOUT_MS", "10000");
    ScopedEnv formation("NEXAR_FORMATION_TIMEOUT_MS", "10000");
    const auto t0 = Clock::now();
    c.emplace(nexar::join_from_env(fast_config()));
    EXPECT_LT(ms_since(t0), 5s);
  }
  EXPECT_EQ(std::getenv("NEXAR_RANK"), nullptr) << "environment not restored";
  ASSERT_TRUE(c->is_open());
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(c->size(), 1);
  expect_working_cluster({*c});
  c->close();
  // The embedded seed went with join_from_env: the port is free again.
  const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(port);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << "seed port still bound";
  ::close(fd);
}

}  // namespace
