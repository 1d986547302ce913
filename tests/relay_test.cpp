// Tests of nexar-relay (tools/relay/), the real binary started as a process: the delay of
// both directions, datagrams of every size arriving intact and in order, clients kept apart,
// jitter that reorders only with --reorder, IPv6, the options it refuses, and a two-rank
// nexar-bench all_reduce whose connection passes through it. Expectations come from what the
// test itself sent, never from the relay's own account (its summary line is checked against
// them).
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <optional>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

extern char** environ;

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using Bytes = std::vector<std::uint8_t>;

const std::string kBin = NEXAR_TEST_BIN_DIR;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// The environment of this process without anything that would point a nexar program at
// another cluster, rank or address, plus `extra` ("NAME=value").
std::vector<std::string> clean_env(const std::vector<std::string>& extra) {
  static const char* const kLauncher[] = {"RANK=", "WORLD_SIZE=", "LOCAL_RANK=", "MASTER_ADDR=", "MASTER_PORT=",
                                          "OMPI_", "PMI_", "PMIX_", "SLURM_", "TORCHELASTIC_"};
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string v = *e;
    bool drop = v.rfind("NEXAR_", 0) == 0;
    for (const char* p : kLauncher) drop = drop || v.rfind(p, 0) == 0;
    if (!drop) env.push_back(v);
  }
  env.insert(env.end(), extra.begin(), extra.end());
  return env;
}

// A child process; stdout and stderr together go to `log` when given, else to a pipe the
// test reads. Killed (SIGKILL) and reaped on destruction if still running.
class Process {
 public:
  Process(const std::vector<std::string>& argv, const std::vector<std::string>& env_extra = {},
          const std::string& log = {}) {
    int fds[2] = {-1, -1};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    if (log.empty()) {
      if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
      posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
      posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
    } else {
      posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      posix_spawn_file_actions_adddup2(&fa, 1, 2);
    }
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    const std::vector<std::string> env = clean_env(env_extra);
    std::vector<char*> envp;
    for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
    const int rc = ::posix_spawn(&pid_, args[0], &fa, nullptr, args.data(), envp.data());
    posix_spawn_file_actions_destroy(&fa);
    if (fds[1] >= 0) ::close(fds[1]);
    out_ = fds[0];
    if (rc != 0) {
      pid_ = -1;
      throw std::runtime_error("cannot start " + argv[0] + ": " + std::strerror(rc));
    }
  }
  ~Process() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (out_ >= 0) ::close(out_);
  }
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  void signal(int sig) const { ::kill(pid_, sig); }

  // The next line of output (without the newline); nullopt at end of output or after
  // `limit`.
  std::optional<std::string> read_line(std::chrono::milliseconds limit) {
    const auto deadline = Clock::now() + limit;
    for (;;) {
      if (auto nl = buffered_.find('\n'); nl != std::string::npos) {
        std::string line = buffered_.substr(0, nl);
        buffered_.erase(0, nl + 1);
        return line;
      }
      if (!fill(deadline)) return std::nullopt;
    }
  }
  // Everything up to the end of output (or `limit`).
  std::string read_rest(std::chrono::milliseconds limit) {
    const auto deadline = Clock::now() + limit;
    while (fill(deadline)) {
    }
    return std::exchange(buffered_, {});
  }

  // Exit status (128 + signal when killed); -1 still running after `limit`.
  int wait(std::chrono::milliseconds limit) {
    const auto deadline = Clock::now() + limit;
    for (;;) {
      int st = 0;
      if (::waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      }
      if (Clock::now() > deadline) return -1;
      std::this_thread::sleep_for(10ms);
    }
  }

 private:
  bool fill(Clock::time_point deadline) {
    if (out_ < 0) return false;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{out_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left)) <= 0) return false;
    char buf[4096];
    const ssize_t n = ::read(out_, buf, sizeof buf);
    if (n <= 0) return false;
    buffered_.append(buf, static_cast<std::size_t>(n));
    return true;
  }

  pid_t pid_ = -1;
  int out_ = -1;
  std::string buffered_;
};

struct Endpoint {
  sockaddr_storage ss{};
  socklen_t len = 0;
  const sockaddr* sa() const { return reinterpret_cast<const sockaddr*>(&ss); }
  int family() const { return ss.ss_family; }
  int port() const {
    return family() == AF_INET ? ntohs(reinterpret_cast<const sockaddr_in*>(&ss)->sin_port)
                               : ntohs(reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_port);
  }
  std::string text() const {
    char ip[INET6_ADDRSTRLEN] = {};
    if (family() == AF_INET) {
      ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&ss)->sin_addr, ip, sizeof ip);
      return std::string(ip) + ":" + std::to_string(port());
    }
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_addr, ip, sizeof ip);
    std::string s = "[";
    s += ip;
    s += "]:";
    return s + std::to_string(port());
  }
  bool operator==(const Endpoint& o) const { return len == o.len && std::memcmp(&ss, &o.ss, len) == 0; }
};

Endpoint loopback(int family, int port = 0) {
  Endpoint e;
  if (family == AF_INET) {
    auto* a = reinterpret_cast<sockaddr_in*>(&e.ss);
    a->sin_family = AF_INET;
    a->sin_port = htons(static_cast<std::uint16_t>(port));
    a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    e.len = sizeof(sockaddr_in);
  } else {
    auto* a = reinterpret_cast<sockaddr_in6*>(&e.ss);
    a->sin6_family = AF_INET6;
    a->sin6_port = htons(static_cast<std::uint16_t>(port));
    a->sin6_addr = in6addr_loopback;
    e.len = sizeof(sockaddr_in6);
  }
  return e;
}

// A UDP socket bound to loopback (any port), with receive and send buffers large enough
// for the bursts of these tests.
class Socket {
 public:
  explicit Socket(int family = AF_INET) : fd_(::socket(family, SOCK_DGRAM | SOCK_CLOEXEC, 0)) {
    if (fd_ < 0) throw std::runtime_error("socket failed");
    const int size = 4 << 20;
    for (int opt : {SO_RCVBUFFORCE, SO_SNDBUFFORCE})
      if (::setsockopt(fd_, SOL_SOCKET, opt, &size, sizeof size) != 0)
        ::setsockopt(fd_, SOL_SOCKET, opt == SO_RCVBUFFORCE ? SO_RCVBUF : SO_SNDBUF, &size, sizeof size);
    const Endpoint any = loopback(family);
    if (::bind(fd_, any.sa(), any.len) != 0) {
      ::close(fd_);
      throw std::runtime_error("bind to loopback failed");
    }
  }
  ~Socket() { ::close(fd_); }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  int fd() const { return fd_; }
  Endpoint local() const {
    Endpoint e;
    e.len = sizeof e.ss;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&e.ss), &e.len);
    return e;
  }
  void send_to(const Endpoint& to, const Bytes& b) const {
    ASSERT_EQ(::sendto(fd_, b.data(), b.size(), 0, to.sa(), to.len), static_cast<ssize_t>(b.size()))
        << std::strerror(errno);
  }
  // The next datagram and where it came from; nullopt after `limit`.
  std::optional<std::pair<Bytes, Endpoint>> receive(std::chrono::milliseconds limit) const {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(limit.count())) <= 0) return std::nullopt;
    Bytes b(65536);
    Endpoint from;
    from.len = sizeof from.ss;
    const ssize_t n = ::recvfrom(fd_, b.data(), b.size(), 0, reinterpret_cast<sockaddr*>(&from.ss), &from.len);
    if (n < 0) return std::nullopt;
    b.resize(static_cast<std::size_t>(n));
    return std::make_pair(std::move(b), from);
  }

 private:
  int fd_;
};

// Sends every datagram back to where it came from, on its own thread; counts the distinct
// sources (each relay client must reach it from a socket of its own).
class EchoServer {
 public:
  explicit EchoServer(int family = AF_INET) : socket_(family), thread_([this] { run(); }) {}
  ~EchoServer() {
    stop_ = true;
    thread_.join();
  }
  Endpoint address() const { return socket_.local(); }
  std::size_t sources() const {
    std::lock_guard lock(mu_);
    return sources_.size();
  }

 private:
  void run() {
    while (!stop_) {
      auto d = socket_.receive(20ms);
      if (!d) continue;
      {
        std::lock_guard lock(mu_);
        sources_.insert(d->second.text());
      }
      socket_.send_to(d->second, d->first);
    }
  }
  Socket socket_;
  std::atomic<bool> stop_{false};
  mutable std::mutex mu_;
  std::set<std::string> sources_;
  std::thread thread_;
};

// What the relay's summary line says of one direction.
struct Counts {
  std::uint64_t datagrams = 0, bytes = 0, queue = 0, loss = 0, error = 0;
};

// nexar-relay in front of `target`; its listening address is read from its first line.
class Relay {
 public:
  Relay(const Endpoint& target, const std::vector<std::string>& options) {
    const std::string host = target.family() == AF_INET ? "127.0.0.1:0" : "[::1]:0";
    std::vector<std::string> argv = {kBin + "/nexar-relay", "--listen", host, "--target", target.text()};
    argv.insert(argv.end(), options.begin(), options.end());
    process_.emplace(argv);
    first_line_ = process_->read_line(10s).value_or("");
    const std::regex start(R"(^nexar-relay: (\S+) -> (\S+), delay .*)");
    std::smatch m;
    if (!std::regex_match(first_line_, m, start)) {
      ADD_FAILURE() << "nexar-relay did not start: '" << first_line_ << process_->read_rest(1s) << "'";
      return;
    }
    EXPECT_EQ(m[2].str(), target.text());
    const std::string listen = m[1].str();
    const auto colon = listen.rfind(':');
    address_ = loopback(target.family(), std::stoi(listen.substr(colon + 1)));
    EXPECT_EQ(listen, address_.text());
  }

  bool started() const { return address_.len != 0; }
  const Endpoint& address() const { return address_; }
  const std::string& first_line() const { return first_line_; }

  // SIGTERM; checks it exits 0 after a summary line, and returns that line.
  std::string stop() {
    process_->signal(SIGTERM);
    std::string rest = process_->read_rest(10s);
    EXPECT_EQ(process_->wait(10s), 0) << rest;
    const auto at = rest.find("nexar-relay: stopped by SIGTERM: ");
    EXPECT_NE(at, std::string::npos) << rest;
    if (at == std::string::npos) return {};
    const auto end = rest.find('\n', at);
    return rest.substr(at, end == std::string::npos ? std::string::npos : end - at);
  }

  static Counts counts(const std::string& summary, const std::string& direction) {
    const std::regex re(direction +
                        R"( (\d+) datagrams (\d+) B \(dropped: queue full (\d+), loss (\d+), send error (\d+)\))");
    std::smatch m;
    Counts c;
    if (!std::regex_search(summary, m, re)) {
      ADD_FAILURE() << "no '" << direction << "' in '" << summary << "'";
      return c;
    }
    c.datagrams = std::stoull(m[1]);
    c.bytes = std::stoull(m[2]);
    c.queue = std::stoull(m[3]);
    c.loss = std::stoull(m[4]);
    c.error = std::stoull(m[5]);
    return c;
  }
  static std::uint64_t clients(const std::string& summary) {
    std::smatch m;
    if (!std::regex_search(summary, m, std::regex(R"(; clients (\d+)$)"))) return ~0ull;
    return std::stoull(m[1]);
  }

 private:
  std::optional<Process> process_;
  std::string first_line_;
  Endpoint address_;
};

Bytes random_bytes(std::mt19937& rng, std::size_t n) {
  Bytes b(n);
  for (auto& x : b) x = static_cast<std::uint8_t>(rng());
  return b;
}

TEST(Relay, DelaysBothDirectionsAndDeliversEveryDatagramIntactInOrder) {
  EchoServer echo;
  Relay relay(echo.address(), {"--delay-ms", "20"});
  ASSERT_TRUE(relay.started());
  Socket client;
  std::mt19937 rng(7);

  // One at a time: each round trip passes the delay twice.
  std::uint64_t sent = 0, sent_bytes = 0;
  for (std::size_t size : {std::size_t{1}, std::size_t{60000}, std::size_t{1200}}) {
    const Bytes b = random_bytes(rng, size);
    const auto t0 = Clock::now();
    client.send_to(relay.address(), b);
    const auto reply = client.receive(5s);
    const double rtt = ms_since(t0);
    ASSERT_TRUE(reply) << "no reply to " << size << " B";
    EXPECT_TRUE(reply->first == b) << size << " B came back changed";
    EXPECT_TRUE(reply->second == relay.address()) << "reply from " << reply->second.text();
    EXPECT_GE(rtt, 40.0) << size << " B";
    EXPECT_LE(rtt, 240.0) << size << " B";
    ++sent;
    sent_bytes += size;
  }

  // Many in flight: random sizes (1 B and 60000 B among them), each compared with what was
  // sent, in order. The bytes outstanding are bounded so that no socket buffer on the way
  // (the test's, the echo server's: 4 MiB asked, what the host allows given) overflows,
  // which would read as a loss.
  constexpr int kCount = 300;
  constexpr std::size_t kWindowBytes = 150000;
  std::vector<Bytes> out;
  for (int i = 0; i < kCount; ++i) {
    std::size_t size = rng() % 1400 + 1;
    if (i == 5) size = 1;
    if (i == 6 || rng() % 20 == 0) size = 60000 - rng() % 100;
    out.push_back(random_bytes(rng, size));
  }
  std::size_t next_send = 0, next_receive = 0, outstanding = 0;
  while (next_receive < out.size()) {
    while (next_send < out.size() && outstanding + out[next_send].size() <= kWindowBytes &&
           next_send - next_receive < 64) {
      client.send_to(relay.address(), out[next_send]);
      outstanding += out[next_send].size();
      sent_bytes += out[next_send].size();
      ++sent;
      ++next_send;
    }
    const auto reply = client.receive(5s);
    ASSERT_TRUE(reply) << "datagram " << next_receive << " (" << out[next_receive].size() << " B) never came back";
    ASSERT_EQ(reply->first.size(), out[next_receive].size()) << "datagram " << next_receive << " out of order or lost";
    ASSERT_TRUE(reply->first == out[next_receive]) << "datagram " << next_receive << " changed";
    outstanding -= out[next_receive].size();
    ++next_receive;
  }

  const std::string summary = relay.stop();
  for (const char* dir : {"to target", "to clients"}) {
    const Counts c = Relay::counts(summary, dir);
    EXPECT_EQ(c.datagrams, sent) << dir;
    EXPECT_EQ(c.bytes, sent_bytes) << dir;
    EXPECT_EQ(c.queue + c.loss + c.error, 0u) << dir;
  }
  EXPECT_EQ(Relay::clients(summary), 1u) << summary;
}

// "a12": built by appending ("a" + std::to_string(12) sets off a false -Wrestrict in GCC 12).
std::string tagged(char tag, int i) {
  std::string s(1, tag);
  s += std::to_string(i);
  return s;
}

TEST(Relay, EachClientGetsItsOwnRepliesFromTheAddressItSentTo) {
  EchoServer echo;
  Relay relay(echo.address(), {"--delay-ms", "5"});
  ASSERT_TRUE(relay.started());
  Socket a, b;
  constexpr int kEach = 50;
  for (int i = 0; i < kEach; ++i) {
    const std::string ta = tagged('a', i), tb = tagged('b', i);
    a.send_to(relay.address(), Bytes(ta.begin(), ta.end()));
    b.send_to(relay.address(), Bytes(tb.begin(), tb.end()));
  }
  for (auto [sock, tag] : {std::pair{&a, 'a'}, std::pair{&b, 'b'}}) {
    for (int i = 0; i < kEach; ++i) {
      const auto reply = sock->receive(5s);
      ASSERT_TRUE(reply) << tag << ": reply " << i << " missing";
      EXPECT_EQ(std::string(reply->first.begin(), reply->first.end()), tagged(tag, i));
      EXPECT_TRUE(reply->second == relay.address()) << "reply from " << reply->second.text();
    }
    EXPECT_FALSE(sock->receive(50ms)) << tag << " got more than its own replies";
  }
  EXPECT_EQ(echo.sources(), 2u) << "the relay must reach the target from one socket per client";
  const std::string summary = relay.stop();
  EXPECT_EQ(Relay::clients(summary), 2u) << summary;
  EXPECT_EQ(Relay::counts(summary, "to target").datagrams, 2u * kEach);
  EXPECT_EQ(Relay::counts(summary, "to clients").datagrams, 2u * kEach);
}

// A burst of `kBurst` numbered datagrams through a relay with jitter well above the gap
// between them; the numbers in the order they came back.
std::vector<int> jittered_burst(const std::vector<std::string>& options, double* slowest_ms) {
  constexpr int kBurst = 100;
  EchoServer echo;
  Relay relay(echo.address(), options);
  if (!relay.started()) return {};
  Socket client;
  std::vector<Clock::time_point> sent_at;
  for (int i = 0; i < kBurst; ++i) {
    Bytes b(64, 0);
    std::memcpy(b.data(), &i, sizeof i);
    sent_at.push_back(Clock::now());
    client.send_to(relay.address(), b);
  }
  std::vector<int> order;
  *slowest_ms = 0;
  while (order.size() < kBurst) {
    const auto reply = client.receive(5s);
    if (!reply) break;
    int i = -1;
    std::memcpy(&i, reply->first.data(), sizeof i);
    order.push_back(i);
    if (i >= 0 && i < kBurst) *slowest_ms = std::max(*slowest_ms, ms_since(sent_at[static_cast<std::size_t>(i)]));
  }
  const std::string summary = relay.stop();
  EXPECT_EQ(Relay::counts(summary, "to clients").datagrams, static_cast<std::uint64_t>(kBurst)) << summary;
  return order;
}

int inversions(const std::vector<int>& order) {
  int n = 0, highest = -1;
  for (int i : order) {
    if (i < highest) ++n;
    highest = std::max(highest, i);
  }
  return n;
}

std::vector<int> sorted(std::vector<int> v) {
  std::sort(v.begin(), v.end());
  return v;
}

TEST(Relay, JitterReordersOnlyWithReorder) {
  std::vector<int> all(100);
  for (int i = 0; i < 100; ++i) all[static_cast<std::size_t>(i)] = i;
  double slowest = 0;

  const auto in_order = jittered_burst({"--delay-ms", "2", "--jitter-ms", "10", "--seed", "3"}, &slowest);
  EXPECT_EQ(sorted(in_order), all) << "lost or duplicated datagrams";
  EXPECT_EQ(inversions(in_order), 0) << "reordered without --reorder";
  EXPECT_GE(slowest, 4.0);
  EXPECT_LE(slowest, 24.0 + 200.0);

  const auto reordered =
      jittered_burst({"--delay-ms", "2", "--jitter-ms", "10", "--seed", "3", "--reorder"}, &slowest);
  EXPECT_EQ(sorted(reordered), all) << "lost or duplicated datagrams";
  // 100 datagrams sent within about a millisecond, each held 0..10 ms more in each direction:
  // with their own times they come back shuffled.
  EXPECT_GT(inversions(reordered), 10);
  EXPECT_LE(slowest, 24.0 + 200.0);
}

TEST(Relay, RelaysIPv6) {
  const int probe = ::socket(AF_INET6, SOCK_DGRAM, 0);
  const Endpoint v6 = loopback(AF_INET6);
  const bool ok = probe >= 0 && ::bind(probe, v6.sa(), v6.len) == 0;
  if (probe >= 0) ::close(probe);
  if (!ok) GTEST_SKIP() << "::1 cannot be bound here";

  EchoServer echo(AF_INET6);
  Relay relay(echo.address(), {"--delay-ms", "3"});
  ASSERT_TRUE(relay.started());
  EXPECT_NE(relay.first_line().find("[::1]:"), std::string::npos) << relay.first_line();
  Socket client(AF_INET6);
  std::mt19937 rng(11);
  for (std::size_t size : {std::size_t{1}, std::size_t{1400}, std::size_t{60000}}) {
    const Bytes b = random_bytes(rng, size);
    const auto t0 = Clock::now();
    client.send_to(relay.address(), b);
    const auto reply = client.receive(5s);
    ASSERT_TRUE(reply) << size << " B";
    EXPECT_TRUE(reply->first == b);
    EXPECT_TRUE(reply->second == relay.address());
    EXPECT_GE(ms_since(t0), 6.0);
  }
  // The largest UDP payload over IPv6 (65527 B) with its headers exceeds lo's 64 KiB MTU: the
  // client's kernel fragments it, the relay gets it whole and, fragmenting nothing (as a
  // router drops a don't-fragment packet), cannot send it on.
  client.send_to(relay.address(), Bytes(65527, 1));
  EXPECT_FALSE(client.receive(200ms)) << "a datagram over the MTU went through the relay";
  const std::string summary = relay.stop();
  EXPECT_EQ(Relay::counts(summary, "to target").error, 1u) << summary;
  EXPECT_EQ(Relay::counts(summary, "to target").datagrams, 3u) << summary;
}

TEST(Relay, RefusesBadOptionsNamingThem) {
  const std::string ok_target = "127.0.0.1:9";
  struct Case {
    std::vector<std::string> args;
    std::string names;
  };
  const std::vector<Case> cases = {
      {{"--target", ok_target}, "--listen"},
      {{"--listen", "127.0.0.1:0"}, "--target"},
      {{"--listen", "127.0.0.1", "--target", ok_target}, "--listen"},
      {{"--listen", "localhost:5", "--target", ok_target}, "--listen"},
      {{"--listen", "127.0.0.1:70000", "--target", ok_target}, "--listen"},
      {{"--listen", "127.0.0.1:0", "--target", "127.0.0.1:0"}, "--target"},
      {{"--listen", "127.0.0.1:0", "--target", "::1:5"}, "--target"},
      {{"--listen", "127.0.0.1:0", "--target", ok_target, "--delay-ms", "-1"}, "--delay-ms"},
      {{"--listen", "127.0.0.1:0", "--target", ok_target, "--delay-ms", "ten"}, "--delay-ms"},
      {{"--listen", "127.0.0.1:0", "--target", ok_target, "--jitter-ms", "nan"}, "--jitter-ms"},
      {{"--listen", "127.0.0.1:0", "--target", ok_target, "--loss", "1.5"}, "--loss"},
      {{"--listen", "127.0.0.1:0", "--target", ok_target, "--queue-bytes", "100"}, "--queue-bytes"},
      {{"--listen", "127.0.0.1:0", "--target", ok_target, "--seed", "-3"}, "--seed"},
      {{"--listen", "127.0.0.1:0", "--target", ok_target, "--idle-timeout-s", "x"}, "--idle-timeout-s"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> argv = {kBin + "/nexar-relay"};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    Process p(argv);
    const std::string out = p.read_rest(10s);
    std::string cmd;
    for (const auto& a : c.args) cmd += " " + a;
    EXPECT_EQ(p.wait(10s), 2) << cmd << ": " << out;
    EXPECT_NE(out.find(c.names), std::string::npos) << cmd << ": " << out;
  }
  // Well-formed, but an address this host does not have: it cannot start.
  Process p({kBin + "/nexar-relay", "--listen", "192.0.2.1:5", "--target", ok_target});
  const std::string out = p.read_rest(10s);
  EXPECT_EQ(p.wait(10s), 1) << out;
  EXPECT_NE(out.find("--listen 192.0.2.1:5"), std::string::npos) << out;
}

// A free UDP port on 127.0.0.1 (free when asked: nothing else here takes ports meanwhile).
int free_port() {
  Socket s;
  return s.local().port();
}

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The NEXAR_* lines of nexar-seed's env file as NAME=value (unquoted), once it holds the
// address and the token.
std::vector<std::string> seed_env(const std::string& path, std::chrono::milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    const std::string text = read_file(path);
    if (text.find("NEXAR_SEED_ADDR=") != std::string::npos && text.find("NEXAR_CLUSTER_TOKEN=") != std::string::npos) {
      std::vector<std::string> vars;
      std::istringstream lines(text);
      for (std::string line; std::getline(lines, line);) {
        const auto eq = line.find('=');
        if (line.rfind("NEXAR_", 0) != 0 || eq == std::string::npos) continue;
        std::string value = line.substr(eq + 1);
        if (value.size() >= 2 && value.front() == '\'' && value.back() == '\'') {
          value = value.substr(1, value.size() - 2);
          for (std::size_t at; (at = value.find("'\\''")) != std::string::npos;) value.replace(at, 4, "'");
        }
        vars.push_back(line.substr(0, eq + 1) + value);
      }
      return vars;
    }
    std::this_thread::sleep_for(50ms);
  }
  return {};
}

TEST(Relay, NexarAllReduceThroughTheRelay) {
  char dir_template[] = "/tmp/nexar-relay-test.XXXXXX";
  ASSERT_NE(::mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  struct Cleanup {
    std::string dir;
    ~Cleanup() { std::system(("rm -rf '" + dir + "'").c_str()); }
  } cleanup{dir};

  Process seed({kBin + "/nexar-seed", "--listen", "127.0.0.1:0", "-n", "2", "--env-file", dir + "/seed.env",
                "--formation-timeout-ms", "60000"},
               {}, dir + "/seed.log");
  const std::vector<std::string> env = seed_env(dir + "/seed.env", 20s);
  ASSERT_FALSE(env.empty()) << "nexar-seed wrote no env file: " << read_file(dir + "/seed.log");

  // Rank 1 binds `bound` and advertises the relay in front of it. Lower ranks dial higher
  // ones, so rank 0's connection to rank 1 is the one that passes through the relay.
  const int bound = free_port();
  Relay relay(loopback(AF_INET, bound), {"--delay-ms", "5"});
  ASSERT_TRUE(relay.started());
  const std::vector<std::string> bench = {kBin + "/nexar-bench", "all_reduce", "-b", "1M", "-e", "4M",
                                          "-n", "2", "-w", "1", "-c", "1"};
  std::vector<std::string> env0 = env, env1 = env;
  // NEXAR_SHM=0: both ranks run on this host and would otherwise pass their messages
  // through shared memory, around the relay.
  env0.insert(env0.end(), {"NEXAR_RANK=0", "NEXAR_WORLD_SIZE=2", "NEXAR_BIND_ADDR=127.0.0.1", "NEXAR_SHM=0"});
  env1.insert(env1.end(), {"NEXAR_RANK=1", "NEXAR_WORLD_SIZE=2", "NEXAR_SHM=0",
                           "NEXAR_BIND_ADDR=127.0.0.1:" + std::to_string(bound),
                           "NEXAR_ADVERTISE_ADDR=" + relay.address().text()});
  const auto t0 = Clock::now();
  Process rank0(bench, env0, dir + "/rank0.log");
  Process rank1(bench, env1, dir + "/rank1.log");
  const int rc0 = rank0.wait(120s);
  const int rc1 = rank1.wait(std::chrono::seconds(10));
  const std::string log0 = read_file(dir + "/rank0.log");
  EXPECT_EQ(rc0, 0) << log0;
  EXPECT_EQ(rc1, 0) << read_file(dir + "/rank1.log");
  EXPECT_EQ(seed.wait(10s), 0) << read_file(dir + "/seed.log");
  std::printf("[ info     ] all_reduce through a 5 ms relay: %.1f s\n", ms_since(t0) / 1e3);

  // Every size reported, each with 0 in the #wrong column (the last).
  for (const std::string size : {"1048576", "2097152", "4194304"}) {
    std::istringstream lines(log0);
    bool found = false;
    for (std::string line; std::getline(lines, line);) {
      std::istringstream words(line);
      std::vector<std::string> w;
      for (std::string x; words >> x;) w.push_back(x);
      if (w.empty() || w.front() != size) continue;
      found = true;
      EXPECT_EQ(w.back(), "0") << line;
    }
    EXPECT_TRUE(found) << "no row for " << size << " in\n" << log0;
  }
  EXPECT_NE(log0.find("# Out of bounds values : 0 OK"), std::string::npos) << log0;

  // The connection went through the relay, both ways, with nothing dropped.
  const std::string summary = relay.stop();
  for (const char* d : {"to target", "to clients"}) {
    const Counts c = Relay::counts(summary, d);
    EXPECT_GT(c.datagrams, 100u) << summary;
    EXPECT_EQ(c.queue + c.loss, 0u) << summary;
  }
}

}  // namespace
