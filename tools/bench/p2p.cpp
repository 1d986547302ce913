// nexar-bench p2p: one-way latency and unidirectional bandwidth between two processes on
// one host, over nexar (QUIC) and, in the same run and between the same two processes,
// over a plain TCP socket pair (the baseline).
//
// The parent opens a TCP listener and a pipe and forks: the parent is rank 0, the child
// rank 1. The parent then starts a seed on 127.0.0.1 (nexar::Seed: forking after it would
// copy its threads' state) and hands its address and token to the child through the pipe;
// both join through it, as any two processes of a cluster do. Every measurement is done
// twice in a row, nexar then TCP, so that noise on the host hits both. Rank 0 takes all
// times and prints the table; rank 1 checks sampled bytes of every message it receives.
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include <nexar/cluster.hpp>
#include <nexar/nexar.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "subcommands.hpp"
#include "table.hpp"
#include "tcp_baseline.hpp"

namespace nexar::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct P2pOptions {
  std::uint64_t min_bytes = 1ull << 20;
  std::uint64_t max_bytes = 1ull << 30;
  std::uint64_t factor = 2;
  int iters = 0;  // 0: enough to move kAutoBytes per size, at least kMinIters
  int warmup = 1;
  int lat_iters = 2000;
  int lat_warmup = 200;
  int timeout_s = 300;
};

constexpr std::uint64_t kAutoBytes = 256ull << 20;
constexpr int kMinIters = 3;
constexpr int kLatencyChunk = 500;  // latency runs alternate nexar/TCP in chunks this long

constexpr int kTagPing = 1;
constexpr int kTagBulk = 2;
constexpr int kTagAck = 3;
constexpr int kTagDone = 4;
constexpr std::uint8_t kAckOk = 'K';
constexpr std::uint8_t kAckCorrupt = 'X';

// ---- schedule, shared by both ranks (they parse the same options) -------------------------

std::vector<std::uint64_t> sizes_of(const P2pOptions& o) {
  std::vector<std::uint64_t> v;
  for (std::uint64_t s = o.min_bytes; s <= o.max_bytes; s *= o.factor) {
    v.push_back(s);
    if (s > o.max_bytes / o.factor) break;
  }
  return v;
}

int iters_for(const P2pOptions& o, std::uint64_t size) {
  if (o.iters > 0) return o.iters;
  auto n = static_cast<int>((kAutoBytes + size - 1) / size);
  return std::max(n, kMinIters);
}

/// (warm-up, measured) iterations of each latency round; each round runs nexar then TCP.
std::vector<std::pair<int, int>> latency_rounds(const P2pOptions& o) {
  std::vector<std::pair<int, int>> r;
  for (int done = 0; done < o.lat_iters; done += kLatencyChunk)
    r.emplace_back(done == 0 ? o.lat_warmup : 0, std::min(kLatencyChunk, o.lat_iters - done));
  return r;
}

// ---- data pattern and its sampled check --------------------------------------------------

inline std::uint8_t pattern(std::uint64_t i) {
  return static_cast<std::uint8_t>((static_cast<std::uint32_t>(i) * 2654435761u) >> 24 ^ (i >> 32));
}

/// A few positions of one message (first and last byte included). The receiver poisons
/// them before each receive and checks them after, so a message that did not land, landed
/// short or landed garbled is caught at every iteration.
class Samples {
 public:
  Samples(std::uint64_t size, std::uint64_t iteration) {
    std::uint64_t x = size * 0x9E3779B97F4A7C15ull ^ (iteration + 1) * 0xBF58476D1CE4E5B9ull;
    pos_[0] = 0;
    pos_[1] = size - 1;
    for (std::size_t k = 2; k < pos_.size(); ++k) {
      x ^= x >> 31, x *= 0x94D049BB133111EBull, x ^= x >> 29;
      pos_[k] = x % size;
    }
  }
  void poison(std::uint8_t* buf) const {
    for (auto p : pos_) buf[p] = static_cast<std::uint8_t>(~pattern(p));
  }
  /// The first sampled position holding a wrong byte, if any.
  std::optional<std::uint64_t> check(const std::uint8_t* buf) const {
    for (auto p : pos_)
      if (buf[p] != pattern(p)) return p;
    return std::nullopt;
  }

 private:
  std::array<std::uint64_t, 32> pos_{};
};

/// A page-faulted-in buffer of `bytes` bytes, allocated once at the largest size.
std::unique_ptr<std::uint8_t[]> make_buffer(std::uint64_t bytes, bool fill_pattern) {
  std::unique_ptr<std::uint8_t[]> b(new std::uint8_t[bytes]);
  if (fill_pattern)
    for (std::uint64_t i = 0; i < bytes; ++i) b[i] = pattern(i);
  else
    std::memset(b.get(), 0, bytes);
  return b;
}

// ---- the two transports behind one shape ---------------------------------------------------

class NexarPeer {
 public:
  NexarPeer(Communicator& c, int peer) : c_(c), peer_(peer) {}
  void send_small(const void* p, std::size_t n) { c_.send(peer_, kTagPing, p, n); }
  void recv_small(void* p, std::size_t n) { expect(c_.recv(peer_, kTagPing, p, n).bytes, n, "ping"); }
  void send_bulk(const void* p, std::size_t n) { c_.bulk_send(peer_, kTagBulk, p, n); }
  void recv_bulk(void* p, std::size_t n, std::size_t cap) {
    expect(c_.bulk_recv(peer_, kTagBulk, p, cap).bytes, n, "bulk message");
  }
  void send_ack(std::uint8_t a) { c_.send(peer_, kTagAck, &a, 1); }
  std::uint8_t recv_ack() {
    std::uint8_t a = 0;
    expect(c_.recv(peer_, kTagAck, &a, 1).bytes, 1, "ack");
    return a;
  }
  static constexpr const char* name = "nexar";

 private:
  static void expect(std::size_t got, std::size_t want, const char* what) {
    if (got != want) throw std::runtime_error(fmt::format("nexar: {} of {} bytes arrived with {} bytes", what, want, got));
  }
  Communicator& c_;
  int peer_;
};

class TcpPeer {
 public:
  explicit TcpPeer(TcpLink& l) : l_(l) {}
  void send_small(const void* p, std::size_t n) { l_.write_all(p, n); }
  void recv_small(void* p, std::size_t n) { l_.read_all(p, n); }
  void send_bulk(const void* p, std::size_t n) { l_.write_all(p, n); }
  void recv_bulk(void* p, std::size_t n, std::size_t /*cap*/) { l_.read_all(p, n); }
  void send_ack(std::uint8_t a) { l_.write_all(&a, 1); }
  std::uint8_t recv_ack() {
    std::uint8_t a = 0;
    l_.read_all(&a, 1);
    return a;
  }
  static constexpr const char* name = "tcp";

 private:
  TcpLink& l_;
};

// ---- the measurements: rank 0 drives and times, rank 1 answers -----------------------------

/// Ping-pong of 8-byte messages; returns half of each measured round trip, in microseconds.
template <class Peer>
std::vector<double> ping(Peer& p, int warmup, int iters) {
  std::vector<double> us;
  us.reserve(static_cast<std::size_t>(iters));
  for (int i = 0; i < warmup + iters; ++i) {
    std::uint64_t out = static_cast<std::uint64_t>(i) * 0x9E3779B97F4A7C15ull, in = 0;
    auto t0 = Clock::now();
    p.send_small(&out, sizeof out);
    p.recv_small(&in, sizeof in);
    auto t1 = Clock::now();
    if (in != out) throw std::runtime_error(fmt::format("{}: ping {} came back altered", Peer::name, i));
    if (i >= warmup) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / 2);
  }
  return us;
}

template <class Peer>
void pong(Peer& p, int n) {
  for (int i = 0; i < n; ++i) {
    std::uint64_t v = 0;
    p.recv_small(&v, sizeof v);
    p.send_small(&v, sizeof v);
  }
}

/// Sends `size` bytes and waits for the 1-byte ack, `warmup + iters` times; returns the
/// seconds of each measured iteration.
template <class Peer>
std::vector<double> blast(Peer& p, const std::uint8_t* buf, std::uint64_t size, int warmup, int iters) {
  std::vector<double> secs;
  for (int i = 0; i < warmup + iters; ++i) {
    auto t0 = Clock::now();
    p.send_bulk(buf, size);
    std::uint8_t ack = p.recv_ack();
    auto t1 = Clock::now();
    if (ack == kAckCorrupt)
      throw std::runtime_error(fmt::format("{}: rank 1 received corrupted data at size {} (see its message)", Peer::name, size));
    if (ack != kAckOk) throw std::runtime_error(fmt::format("{}: unexpected ack byte {}", Peer::name, ack));
    if (i >= warmup) secs.push_back(std::chrono::duration<double>(t1 - t0).count());
  }
  return secs;
}

template <class Peer>
void sink(Peer& p, std::uint8_t* buf, std::uint64_t cap, std::uint64_t size, int n) {
  for (int i = 0; i < n; ++i) {
    Samples s(size, static_cast<std::uint64_t>(i));
    s.poison(buf);
    p.recv_bulk(buf, size, cap);
    if (auto bad = s.check(buf)) {
      p.send_ack(kAckCorrupt);
      throw std::runtime_error(fmt::format("{}: message {} of size {}: byte {} is {:#04x}, expected {:#04x}",
                                           Peer::name, i, size, *bad, buf[*bad], pattern(*bad)));
    }
    p.send_ack(kAckOk);
  }
}

// ---- deadline and child process --------------------------------------------------------------

volatile sig_atomic_t g_child = 0;
char g_deadline_msg[160];

extern "C" void on_deadline(int) {
  ssize_t rc = ::write(2, g_deadline_msg, std::strlen(g_deadline_msg));
  (void)rc;
  if (g_child > 0) ::kill(static_cast<pid_t>(g_child), SIGKILL);
  ::_exit(124);
}

void arm_deadline(int seconds, const char* who) {
  if (seconds <= 0) return;
  std::snprintf(g_deadline_msg, sizeof g_deadline_msg,
                "nexar-bench p2p: %s: still running after %d s (--timeout), giving up\n", who, seconds);
  struct sigaction sa {};
  sa.sa_handler = on_deadline;
  ::sigaction(SIGALRM, &sa, nullptr);
  ::alarm(static_cast<unsigned>(seconds));
}

/// Waits for the child; with `grace`, kills it if it has not exited by then.
int wait_child(pid_t pid, std::optional<std::chrono::milliseconds> grace) {
  int status = 0;
  if (!grace) {
    while (::waitpid(pid, &status, 0) < 0)
      if (errno != EINTR) return -1;
    return status;
  }
  auto until = Clock::now() + *grace;
  while (true) {
    pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    if (r < 0 && errno != EINTR) return -1;
    if (Clock::now() >= until) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return status;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::string describe_status(int status) {
  if (status < 0) return "could not be waited for";
  if (WIFEXITED(status)) return fmt::format("exited with status {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return fmt::format("was killed by signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  return "ended abnormally";
}

// Whether the kernel takes UDP segmentation offload on a loopback socket (the table's title
// says so, since it decides much of nexar's bandwidth).
bool probe_gso() {
  int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  int seg = 1200;
  bool ok = ::setsockopt(fd, SOL_UDP, UDP_SEGMENT, &seg, sizeof seg) == 0;
  ::close(fd);
  return ok;
}

// The seed's address and token, from rank 0 to rank 1 through a pipe.
void write_all(int fd, const std::string& s) {
  std::size_t off = 0;
  while (off < s.size()) {
    ssize_t n = ::write(fd, s.data() + off, s.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw std::runtime_error(std::string("pipe to rank 1: ") + std::strerror(errno));
    off += static_cast<std::size_t>(n);
  }
}

std::string read_all(int fd) {
  std::string s;
  char buf[512];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw std::runtime_error(std::string("pipe from rank 0: ") + std::strerror(errno));
    if (n == 0) return s;
    s.append(buf, static_cast<std::size_t>(n));
  }
}

Communicator join_rank(int rank, const std::string& seed, const std::string& token, const Config& cfg) {
  JoinOptions j;
  j.seed = seed;
  j.token = token;
  j.rank = rank;
  j.world = 2;
  j.bind = "127.0.0.1";
  return join(j, cfg);
}

// ---- rank 1 (child) -------------------------------------------------------------------------

int rank1(const P2pOptions& o, int seed_pipe, const Config& cfg, std::uint16_t tcp_port) {
  try {
    TcpLink tcp = TcpLink::connect_loopback(tcp_port);
    const std::string seed = read_all(seed_pipe);
    ::close(seed_pipe);
    const auto nl = seed.find('\n');
    if (nl == std::string::npos) throw std::runtime_error("rank 0 sent no seed address");
    Communicator comm = join_rank(1, seed.substr(0, nl), seed.substr(nl + 1), cfg);
    NexarPeer nx(comm, 0);
    TcpPeer tc(tcp);
    auto buf = make_buffer(o.max_bytes, false);

    for (auto [warm, n] : latency_rounds(o)) {
      pong(nx, warm + n);
      pong(tc, warm + n);
    }
    for (auto size : sizes_of(o)) {
      int n = o.warmup + iters_for(o, size);
      sink(nx, buf.get(), o.max_bytes, size, n);
      sink(tc, buf.get(), o.max_bytes, size, n);
    }
    // Goodbye: tell rank 0 we are done and wait for its answer, so neither side closes
    // while the other still has something in flight.
    std::uint8_t b = 1;
    comm.send(0, kTagDone, &b, 1);
    comm.recv(0, kTagDone, &b, 1);
    comm.close();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nexar-bench p2p: rank 1: error: %s\n", e.what());
    return 1;
  }
}

// ---- rank 0 (parent) ------------------------------------------------------------------------

struct Row {
  std::uint64_t size;
  double nexar_gbs, tcp_gbs;
};

int rank0(const P2pOptions& o, int seed_pipe, const Config& cfg, TcpListener& listener, pid_t child,
          const std::string& title) {
  int rc = 0;
  std::optional<int> child_status;
  auto start = Clock::now();
  try {
    TcpLink tcp(listener.accept(cfg.connect_timeout));
    listener.close();
    SeedOptions so;
    so.listen = "127.0.0.1:0";
    so.world = 2;
    Seed seed(so, cfg);
    write_all(seed_pipe, seed.address() + "\n" + seed.token());
    ::close(std::exchange(seed_pipe, -1));
    Communicator comm = join_rank(0, seed.address(), seed.token(), cfg);
    seed.wait();
    NexarPeer nx(comm, 1);
    TcpPeer tc(tcp);
    auto buf = make_buffer(o.max_bytes, true);

    // Latency first (printed last, under the table).
    std::vector<double> lat_nx, lat_tcp;
    for (auto [warm, n] : latency_rounds(o)) {
      auto a = ping(nx, warm, n);
      auto b = ping(tc, warm, n);
      lat_nx.insert(lat_nx.end(), a.begin(), a.end());
      lat_tcp.insert(lat_tcp.end(), b.begin(), b.end());
    }

    std::puts(title.c_str());
    std::puts(fmt::format("#   iterations per size: {}, warm-up {}; GB/s = 1e9 bytes/s from the median time of "
                          "send + 1-byte ack",
                          o.iters > 0 ? std::to_string(o.iters) : "auto (>= 256 MiB and >= 3)", o.warmup)
                  .c_str());
    Table table;
    table.column("size", 11).column("iters", 6).column("nexar GB/s", 10).column("tcp GB/s", 10).column("nexar/tcp", 9);
    table.header();

    std::vector<Row> rows;
    for (auto size : sizes_of(o)) {
      int n = iters_for(o, size);
      double t_nx = median(blast(nx, buf.get(), size, o.warmup, n));
      double t_tcp = median(blast(tc, buf.get(), size, o.warmup, n));
      Row r{size, static_cast<double>(size) / t_nx / 1e9, static_cast<double>(size) / t_tcp / 1e9};
      rows.push_back(r);
      table.row({std::to_string(size), std::to_string(n), fmt::format("{:.2f}", r.nexar_gbs),
                 fmt::format("{:.2f}", r.tcp_gbs), fmt::format("{:.2f}", r.nexar_gbs / r.tcp_gbs)});
    }

    std::uint8_t b = 0;
    comm.recv(1, kTagDone, &b, 1);
    comm.send(1, kTagDone, &b, 1);
    child_status = wait_child(child, std::nullopt);  // before closing: rank 1 closes first
    comm.close();

    double nx50 = median(lat_nx), nx99 = quantile(lat_nx, 0.99);
    double tc50 = median(lat_tcp), tc99 = quantile(lat_tcp, 0.99);
    std::puts(fmt::format("# latency 8 B one-way: nexar p50 {:.1f} us p99 {:.1f} us | tcp p50 {:.1f} us p99 {:.1f} us"
                          " | ratio p50 {:.2f}",
                          nx50, nx99, tc50, tc99, nx50 / tc50)
                  .c_str());
    std::vector<double> ratios;
    for (auto& r : rows) ratios.push_back(r.nexar_gbs / r.tcp_gbs);
    auto worst = std::min_element(rows.begin(), rows.end(), [](const Row& x, const Row& y) {
      return x.nexar_gbs / x.tcp_gbs < y.nexar_gbs / y.tcp_gbs;
    });
    std::puts(fmt::format("# summary: bandwidth nexar/tcp min {:.2f} (at {}) median {:.2f} over {} sizes; "
                          "latency nexar/tcp p50 {:.2f}; {:.1f} s",
                          worst->nexar_gbs / worst->tcp_gbs, human_size(worst->size), median(ratios), rows.size(),
                          nx50 / tc50, std::chrono::duration<double>(Clock::now() - start).count())
                  .c_str());
    std::fflush(stdout);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "nexar-bench p2p: rank 0: error: %s\n", e.what());
    rc = 1;
  }
  if (seed_pipe >= 0) ::close(seed_pipe);  // rank 1 then reads no seed and gives up
  // On failure our communicator and socket are closed by now, so rank 1 fails fast too.
  if (!child_status) child_status = wait_child(child, std::chrono::seconds(10));
  g_child = 0;
  if (!(WIFEXITED(*child_status) && WEXITSTATUS(*child_status) == 0) || *child_status < 0) {
    std::fprintf(stderr, "nexar-bench p2p: rank 1 (pid %d) %s\n", static_cast<int>(child),
                 describe_status(*child_status).c_str());
    if (rc == 0) rc = 1;
  }
  return rc;
}

int run_p2p(const P2pOptions& o) {
  Config cfg;
  std::string title;
  try {
    cfg = Config::from_env();
    if (o.min_bytes > o.max_bytes) throw std::invalid_argument("-b must not exceed -e");
    if (o.factor < 2) throw std::invalid_argument("-f must be >= 2");
    if (o.max_bytes > cfg.max_frame_bytes)
      throw std::invalid_argument(fmt::format("-e {} exceeds the largest nexar message, max_frame_bytes = {} "
                                              "(NEXAR_MAX_FRAME_BYTES)", o.max_bytes, cfg.max_frame_bytes));
    bool gso = cfg.udp_gso && probe_gso();
    title = fmt::format("# nexar-bench p2p: 2 processes on 127.0.0.1, QUIC (udp payload {}, GSO {}) vs TCP",
                        cfg.udp_payload ? std::to_string(cfg.udp_payload) : std::string("auto: 64 KiB loopback"),
                        gso ? "on" : (cfg.udp_gso ? "off: not supported by the kernel" : "off"));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nexar-bench p2p: error: %s\n", e.what());
    return 1;
  }

  std::optional<TcpListener> listener;
  try {
    listener.emplace();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nexar-bench p2p: error: %s\n", e.what());
    return 1;
  }

  int seed_pipe[2];
  if (::pipe2(seed_pipe, O_CLOEXEC) != 0) {
    std::perror("nexar-bench p2p: pipe");
    return 1;
  }
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    std::perror("nexar-bench p2p: fork");
    return 1;
  }
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive rank 0
    if (::getppid() != parent) ::_exit(1);
    ::close(seed_pipe[1]);
    listener->close();
    arm_deadline(o.timeout_s, "rank 1");
    int rc = rank1(o, seed_pipe[0], cfg, listener->port());
    std::fflush(stdout);
    std::fflush(stderr);
    ::_exit(rc);
  }
  g_child = pid;
  ::close(seed_pipe[0]);
  arm_deadline(o.timeout_s, "rank 0");
  int rc = rank0(o, seed_pipe[1], cfg, *listener, pid, title);
  ::alarm(0);
  return rc;
}

}  // namespace

Subcommand add_p2p(CLI::App& parent) {
  auto o = std::make_shared<P2pOptions>();
  CLI::App* app = parent.add_subcommand(
      "p2p", "Latency and bandwidth between two processes on 127.0.0.1: nexar (QUIC) vs a plain TCP socket pair");
  auto size_opt = [&](const char* flags, std::uint64_t* dst, const char* help) {
    add_size_option(app, flags, dst, help);
  };
  size_opt("-b,--minbytes", &o->min_bytes, "Smallest message of the bandwidth sweep, K/M/G suffixes (default 1M)");
  size_opt("-e,--maxbytes", &o->max_bytes, "Largest message of the bandwidth sweep, K/M/G suffixes (default 1G)");
  app->add_option("-f,--stepfactor", o->factor, "Multiplication factor between sizes")->capture_default_str()
      ->check(CLI::Range(std::uint64_t{2}, std::uint64_t{1} << 20));
  app->add_option("-n,--iters", o->iters,
                  "Iterations per size (default: enough to move 256 MiB per size, at least 3)")
      ->check(CLI::NonNegativeNumber);
  app->add_option("-w,--warmup_iters", o->warmup, "Warm-up iterations per size")->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app->add_option("--lat-iters", o->lat_iters, "Ping-pong iterations of the latency test")->capture_default_str()
      ->check(CLI::Range(1, 100000000));
  app->add_option("--lat-warmup", o->lat_warmup, "Warm-up ping-pongs of the latency test")->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app->add_option("--timeout", o->timeout_s, "Overall deadline in seconds; 0 disables it")->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app->footer(
      "Both measurements run over nexar and over TCP between the same two processes, interleaved.\n"
      "nexar settings come from the NEXAR_* environment variables (docs/CONFIG.md).");
  return {app, [o] { return run_p2p(*o); }};
}

}  // namespace nexar::bench
