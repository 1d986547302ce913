// hello_cluster — a first tour of nexar.
//
// Started by a launcher (`nexar-run -n 4 build/bin/hello_cluster`, torchrun, mpirun, srun),
// every process is one rank and joins the cluster with join_from_env(). Started alone, four
// ranks live in this one process, one thread each, connected to each other over real QUIC
// on 127.0.0.1 by bootstrap_local(). Either way, each rank then
//   1. greets the next rank of the ring (send/recv on the data lane),
//   2. answers a "whoami" RPC, which rank 0 calls on every other rank,
//   3. sends 64 MiB to the next rank of the ring (bulk_send/bulk_recv on the bulk lane),
//   4. reports what it saw to rank 0, which prints a summary.
// Every result is checked; the program exits non-zero on any mismatch or error.
#include <nexar/cluster.hpp>
#include <nexar/nexar.hpp>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <functional>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr int kRanks = 4;
constexpr nexar::RpcId kWhoami = 1;
constexpr int kGreetingTag = 1;
constexpr int kRingTag = 2;
constexpr int kReportTag = 3;
constexpr std::size_t kRingBytes = 64u << 20;

// What each rank tells rank 0 at the end. Trivially copyable, so it can be sent as is.
struct Report {
  char greeting[48] = {};  // the greeting this rank received
  bool greeting_ok = false;
  bool ring_ok = false;
  double ring_seconds = 0;
};

std::string greeting_from(int rank) { return "hello from rank " + std::to_string(rank); }

// The 64 MiB a rank sends: 32-bit words (sender << 24 | index), different for every sender.
std::uint32_t word(int sender, std::size_t i) { return static_cast<std::uint32_t>(sender) << 24 | (i & 0xffffff); }

std::vector<std::byte> to_bytes(const std::string& s) {
  auto* p = reinterpret_cast<const std::byte*>(s.data());
  return {p, p + s.size()};
}

// `start_line` returns once every rank got there.
void run_rank(nexar::Communicator comm, const std::function<void()>& start_line) {
  const int me = comm.rank(), n = comm.size();
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  Report report;

  // 1. Ring greeting. isend first, then recv: no rank waits on another to start.
  std::string hello = greeting_from(me);
  nexar::Request sent = comm.isend(next, kGreetingTag, hello.data(), hello.size());
  nexar::Status got = comm.recv(prev, kGreetingTag, report.greeting, sizeof report.greeting - 1);
  sent.wait();
  report.greeting_ok = got.source == prev && report.greeting == greeting_from(prev);

  // 2. Rank 0 asks everybody else who they are.
  std::vector<std::string> answers;
  if (me == 0)
    for (int r = 1; r < n; ++r) {
      std::vector<std::byte> reply = comm.rpc(r, kWhoami, {});
      answers.emplace_back(reinterpret_cast<const char*>(reply.data()), reply.size());
    }

  // 3. Ring exchange of 64 MiB. Post the receive, send, then wait for the receive.
  std::vector<std::uint32_t> out(kRingBytes / 4), in(kRingBytes / 4);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = word(me, i);
  start_line();  // start the clock on every rank at the same moment
  auto t0 = std::chrono::steady_clock::now();
  nexar::Request rx = comm.ibulk_recv(prev, kRingTag, in.data(), kRingBytes);
  comm.bulk_send(next, kRingTag, out.data(), kRingBytes);
  nexar::Status st = rx.wait();
  report.ring_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  report.ring_ok = st.source == prev && st.bytes == kRingBytes;
  for (std::size_t i = 0; report.ring_ok && i < in.size(); ++i) report.ring_ok = in[i] == word(prev, i);

  // 4. Everybody reports to rank 0, which prints the summary.
  if (me != 0) {
    comm.send(0, kReportTag, &report, sizeof report);
    return;
  }
  std::vector<Report> all(static_cast<std::size_t>(n));
  all[0] = report;
  for (int r = 1; r < n; ++r) comm.recv(r, kReportTag, &all[static_cast<std::size_t>(r)], sizeof(Report));

  bool ok = true;
  std::printf("hello_cluster: %d ranks, %s\n", n,
              nexar::launched_from_env() ? "one process each, joined through a seed"
                                         : "in one process, one thread each, QUIC on 127.0.0.1");
  std::printf("ring greetings:\n");
  for (int r = 0; r < n; ++r) {
    const Report& x = all[static_cast<std::size_t>(r)];
    std::printf("  rank %d got \"%s\"%s\n", r, x.greeting, x.greeting_ok ? "" : "  <-- WRONG");
    ok = ok && x.greeting_ok;
  }
  std::printf("whoami, called by rank 0:\n");
  for (int r = 1; r < n; ++r) {
    const std::string& a = answers[static_cast<std::size_t>(r - 1)];
    bool right = a.starts_with("rank " + std::to_string(r) + " of " + std::to_string(n));
    std::printf("  rank %d: %s%s\n", r, a.c_str(), right ? "" : "  <-- WRONG");
    ok = ok && right;
  }
  double slowest = 0;
  for (const Report& x : all) {
    slowest = std::max(slowest, x.ring_seconds);
    ok = ok && x.ring_ok;
  }
  double mib = static_cast<double>(kRingBytes) * n / (1 << 20);
  std::printf("ring exchange: %d x %zu MiB in %.3f s = %.0f MiB/s aggregate, %.0f MiB/s per link, data %s\n", n,
              kRingBytes >> 20, slowest, mib / slowest, mib / slowest / n, ok ? "verified" : "CORRUPTED");
  if (!ok) throw std::runtime_error("some check failed, see above");
  std::printf("all checks passed\n");
}

void answer_whoami(nexar::Communicator& c) {
  // Handlers run on the communicator's own RPC thread.
  char host[256] = "?";
  ::gethostname(host, sizeof host - 1);
  std::string me = "rank " + std::to_string(c.rank()) + " of " + std::to_string(c.size()) + " on " + host +
                   ", pid " + std::to_string(::getpid());
  c.register_rpc(kWhoami, [me](int /*caller*/, std::span<const std::byte>) { return to_bytes(me); });
}

// One rank per process, as a launcher started us.
int run_launched() {
  nexar::Communicator c = nexar::join_from_env();
  try {
    answer_whoami(c);
    c.barrier();  // every handler is registered before rank 0 calls them
    run_rank(c, [&] { c.barrier(); });
    c.barrier();  // nobody closes while rank 0 still reads its reports
    c.close();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", c.rank(), e.what());
    c.close();  // make the others' operations with us fail fast
    return 1;
  }
}

// kRanks threads of this process.
int run_threads() {
  std::vector<nexar::Communicator> comms = nexar::bootstrap_local(kRanks);
  for (auto& c : comms) answer_whoami(c);
  std::barrier<> start_line(kRanks);
  std::atomic<int> failed{0};
  std::vector<std::thread> threads;
  for (auto& c : comms)
    threads.emplace_back([&, c]() mutable {
      try {
        run_rank(c, [&] { start_line.arrive_and_wait(); });
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", c.rank(), e.what());
        failed = 1;
        start_line.arrive_and_drop();  // do not leave the others waiting at the start line
        c.close();                       // and make their operations with us fail fast
      }
    });
  for (auto& t : threads) t.join();
  return failed ? 1 : 0;
}

}  // namespace

int main() {
  try {
    return nexar::launched_from_env() ? run_launched() : run_threads();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hello_cluster: %s\n", e.what());
    return 1;
  }
}
