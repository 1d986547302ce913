// Sparse topologies end to end: bootstrap_local worlds whose ranks connect only to their
// topology neighbours (k_regular:4 and hypercube at 16 ranks, hypercube at 12 and a ring,
// k_regular:2, at 13), one thread per rank; the message lanes over shared memory as
// bootstrap_local sets them up, and (the worlds named *_quic) with Config::shm off, so that
// every hop is QUIC. Messages to other ranks are relayed hop by hop, and every operation
// must work as on a full mesh:
//   - p2p between every ordered pair (empty, one byte, eager and rendezvous sizes), wildcard
//     receives (posted before the messages arrive and after), the bulk lane;
//   - RPC to every rank, to the farthest one with a large argument, and a handler that itself
//     calls a far rank;
//   - every collective against references computed here with plain loops: all_reduce (sum,
//     max, forced algorithms), broadcast, reduce, scan, exclusive_scan, all_gather, gather,
//     scatter, reduce_scatter, all_to_all, the v-forms, barrier; split into halves and by
//     parity (members two hops apart on a ring) with collectives and p2p on the results;
//   - order through relays: 200 messages from rank 0 to a far rank, sizes on both sides of
//     the eager limit, one tag and two tags interleaved, while other pairs send through the
//     same relays and the far rank sends back;
//   - the hop limit: on a ring of 16 with relay_hop_limit 2 a send beyond two hops fails at
//     once with Errc::invalid_argument naming the destination and "hop limit", sends within
//     two hops go through, and closing the ranks does not wait for the ones out of reach;
//   - relays that close in order: the ranks they cut off are out of reach (peer_closed), not
//     failed, and the rest of the ring goes on.
//
// Which ranks are far apart comes from src/transport/topology.hpp (its own correctness is
// tests/topology_test.cpp's business); every expected result is computed here.
#include <nexar/nexar.hpp>

#include <gtest/gtest.h>

#include "collective_support.hpp"
#include "support.hpp"
#include "comm/communicator_impl.hpp"
#include "core/access.hpp"
#include "transport/node.hpp"
#include "transport/topology.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <ostream>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace nexar::coll_test;  // run_ranks, mix, random_bytes, gen, check_bytes, sentinel
using namespace std::chrono_literals;
using nexar::Algorithm;
using nexar::any_source;
using nexar::any_tag;
using nexar::block_of;
using nexar::CollectiveOptions;
using nexar::Communicator;
using nexar::Config;
using nexar::DataType;
using nexar::Errc;
using nexar::LogLevel;
using nexar::ReduceOp;
using nexar::Request;
using nexar::RpcCall;
using nexar::RpcId;
using nexar::Status;
using nexar::Topology;
using nexar::testing::contains;
using Bytes = std::vector<std::byte>;
using Clock = std::chrono::steady_clock;

constexpr std::size_t kEager = 64 * 1024;  // Config::eager_limit's default
static_assert(200001 > kEager);

// ---- worlds -----------------------------------------------------------------------------

struct WorldSpec {
  std::string topology;
  int n;
  bool shm = true;  // false: every lane over QUIC (Config::shm off), relays included
  bool lazy = false;  // Config::lazy_connect (full_mesh only): connections made on first use
};

std::string spec_name(const WorldSpec& s) {
  std::string t = s.topology;
  for (char& ch : t)
    if (ch == ':') ch = '_';
  return t + "_w" + std::to_string(s.n) + (s.shm ? "" : "_quic") + (s.lazy ? "_lazy" : "");
}

// How gtest (and so ctest's test names) shows a world.
void PrintTo(const WorldSpec& s, std::ostream* os) { *os << spec_name(s); }

// Deadlines long enough for 16 ranks on a loaded 2-core machine under ASan, short enough
// that a lost message fails the test instead of hanging it. Nothing here fails on purpose,
// so the failure detector is given room too.
Config sparse_config(const std::string& topology, std::uint32_t hop_limit = 0, bool shm = true, bool lazy = false) {
  Config c;
  c.op_timeout = 60s;
  c.connect_timeout = 30s;
  c.idle_timeout = 30s;
  c.failure_timeout = 10s;
  c.rpc_timeout = 60s;
  c.log_level = LogLevel::error;
  c.topology = Topology::parse(topology);
  c.relay_hop_limit = hop_limit;
  c.shm = shm;
  c.lazy_connect = lazy;
  return c;
}

// Worlds by topology and size, made on first use and reused by later tests of the binary
// (under ctest each test is a process of its own and makes its own). A world one of whose
// communicators was closed (run_ranks closes them all when a rank fails) is replaced.
class SparsePool {
 public:
  static SparsePool& instance() {
    static SparsePool p;
    return p;
  }
  std::vector<Communicator>& world(const WorldSpec& s) {
    std::lock_guard lk(mu_);
    auto& w = worlds_[spec_name(s)];
    bool usable = !w.empty();
    for (auto& c : w) usable = usable && c.is_open();
    if (!usable) {
      for (auto& c : w) c.close();
      w.clear();
      w = nexar::bootstrap_local(s.n, sparse_config(s.topology, 0, s.shm, s.lazy));
    }
    return w;
  }
  void clear() {
    std::lock_guard lk(mu_);
    for (auto& [name, w] : worlds_)
      for (auto& c : w) c.close();
    worlds_.clear();
  }

 private:
  std::mutex mu_;
  std::map<std::string, std::vector<Communicator>> worlds_;
};

class SparsePoolEnvironment : public ::testing::Environment {
 public:
  void TearDown() override { SparsePool::instance().clear(); }
};
[[maybe_unused]] const auto* const sparse_pool_env =
    ::testing::AddGlobalTestEnvironment(new SparsePoolEnvironment);

// Aborts the binary, naming the test, when a test runs far longer than it should: a relay
// that loses a message without an error would otherwise hang until ctest's timeout, with
// nothing said about where.
class Watchdog {
 public:
  explicit Watchdog(std::chrono::seconds limit) {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    name_ = info ? std::string(info->test_suite_name()) + "." + info->name() : "?";
    thread_ = std::thread([this, limit] {
      std::unique_lock lk(mu_);
      if (!cv_.wait_for(lk, limit, [this] { return done_; })) {
        std::fprintf(stderr, "sparse_test: %s still running after %lld s: aborting (hang)\n",
                     name_.c_str(), static_cast<long long>(limit.count()));
        std::fflush(stderr);
        std::abort();
      }
    });
  }
  ~Watchdog() {
    {
      std::lock_guard lk(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

 private:
  std::string name_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

// ---- helpers ----------------------------------------------------------------------------

// Hops from `from` to every rank (from's own entry -1) on the full topology.
std::vector<int> hops_from(const Topology& t, int n, int from) {
  const nexar::detail::Routes rt(t, n, from, {});
  std::vector<int> h(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) h[static_cast<std::size_t>(r)] = rt.hops(r);
  return h;
}

// A rank farthest from `from` (the smallest of them).
int farthest(const Topology& t, int n, int from) {
  const auto h = hops_from(t, n, from);
  return static_cast<int>(std::max_element(h.begin(), h.end()) - h.begin());
}

// The bytes rank `src` sends rank `dst` in message `salt` of `size` bytes.
Bytes payload(int src, int dst, std::size_t size, std::uint64_t salt) {
  return random_bytes(size, mix(mix(static_cast<std::uint64_t>(src), static_cast<std::uint64_t>(dst)),
                                mix(size, salt)));
}

// Checks a received message: status, bytes, and that nothing beyond it was written (the
// buffer was filled with 0xEE and is `bytes.size()` long).
void check_message(const std::string& ctx, int rank, const Status& st, int src, int tag,
                   const Bytes& buf, const Bytes& want) {
  EXPECT_EQ(st.source, src) << ctx << ": rank " << rank;
  EXPECT_EQ(st.tag, tag) << ctx << ": rank " << rank << " from " << src;
  EXPECT_EQ(st.bytes, want.size()) << ctx << ": rank " << rank << " from " << src << " tag " << tag;
  if (st.bytes != want.size() || buf.size() < want.size()) return;
  if (!want.empty() && std::memcmp(buf.data(), want.data(), want.size()) != 0) {
    std::size_t i = 0;
    while (buf[i] == want[i]) ++i;
    ADD_FAILURE() << ctx << ": rank " << rank << " from " << src << " tag " << tag << " ("
                  << want.size() << " bytes): first wrong byte at " << i;
  }
  for (std::size_t i = want.size(); i < buf.size(); ++i)
    if (buf[i] != std::byte{0xEE}) {
      ADD_FAILURE() << ctx << ": rank " << rank << " from " << src << ": byte " << i
                    << " written beyond the " << want.size() << "-byte message";
      break;
    }
}

template <class T>
std::vector<T> ints(std::size_t count, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<T> v(count);
  for (auto& x : v) x = static_cast<T>(rng());
  return v;
}

template <class T>
void expect_same(const std::string& ctx, int rank, const char* what, const std::vector<T>& got,
                 const std::vector<T>& want) {
  if (got.size() < want.size()) {
    ADD_FAILURE() << ctx << ": rank " << rank << " " << what << ": " << got.size()
                  << " elements, " << want.size() << " expected";
    return;
  }
  check_bytes(ctx, rank, what, reinterpret_cast<const std::byte*>(got.data()),
              reinterpret_cast<const std::byte*>(want.data()), want.size() * sizeof(T), sizeof(T));
}

// Element-wise sum with wraparound (in uint64) of in[lo..hi).
std::vector<std::int64_t> sum_of(const std::vector<std::vector<std::int64_t>>& in, int lo, int hi,
                                 std::size_t count) {
  std::vector<std::uint64_t> acc(count, 0);
  for (int r = lo; r < hi; ++r)
    for (std::size_t i = 0; i < count; ++i)
      acc[i] += static_cast<std::uint64_t>(in[static_cast<std::size_t>(r)][i]);
  std::vector<std::int64_t> out(count);
  for (std::size_t i = 0; i < count; ++i) out[i] = static_cast<std::int64_t>(acc[i]);
  return out;
}

std::vector<std::size_t> counts_for(int n) {
  return {0, 1, 7, static_cast<std::size_t>(n) + 3, 1001, 50001};
}

class Sparse : public ::testing::TestWithParam<WorldSpec> {
 protected:
  std::vector<Communicator>& world() {
    auto& w = SparsePool::instance().world(GetParam());
    const Topology t = Topology::parse(GetParam().topology);
    for (std::size_t r = 0; r < w.size(); ++r) {
      EXPECT_EQ(w[r].size(), GetParam().n);
      EXPECT_EQ(w[r].rank(), static_cast<int>(r));
      EXPECT_TRUE(w[r].config().topology == t) << "rank " << r << " runs "
                                               << w[r].config().topology.to_string();
      // Really sparse: connected exactly to the topology's neighbours.
      EXPECT_EQ(w[r].neighbours(), nexar::detail::neighbours_of(t, static_cast<int>(w.size()), static_cast<int>(r)))
          << "rank " << r;
    }
    return w;
  }
  int n() const { return GetParam().n; }
  Topology topology() const { return Topology::parse(GetParam().topology); }
  std::string ctx(const std::string& what) const { return spec_name(GetParam()) + " " + what; }

  Watchdog dog_{std::chrono::seconds(420)};
};

// ---- point to point ---------------------------------------------------------------------

// Every ordered pair, four sizes each (empty, one byte, eager, rendezvous), every message
// in flight at once, each size on a tag of its own.
TEST_P(Sparse, P2PEveryOrderedPair) {
  auto& w = world();
  const int nr = n();
  const std::size_t sizes[] = {0, 1, 1000, 200001};
  run_ranks(w, ctx("p2p every pair"), [&](int r) {
    Communicator& c = w[static_cast<std::size_t>(r)];
    struct In {
      int src;
      int tag;
      std::size_t size;
      Bytes buf;
      Request req;
    };
    std::vector<In> ins;
    ins.reserve(4 * static_cast<std::size_t>(nr));
    for (std::size_t si = 0; si < 4; ++si)
      for (int src = 0; src < nr; ++src) {
        if (src == r) continue;
        In in{src, 10 + static_cast<int>(si), sizes[si], Bytes(sizes[si] + 16, std::byte{0xEE}), {}};
        in.req = c.irecv(src, in.tag, in.buf.data(), in.buf.size());
        ins.push_back(std::move(in));
      }
    std::vector<Bytes> outs;
    outs.reserve(4 * static_cast<std::size_t>(nr));
    std::vector<Request> sends;
    for (std::size_t si = 0; si < 4; ++si)
      for (int off = 1; off < nr; ++off) {
        const int dst = (r + off) % nr;
        outs.push_back(payload(r, dst, sizes[si], si));
        sends.push_back(c.isend(dst, 10 + static_cast<int>(si), outs.back().data(), sizes[si]));
      }
    wait_each(sends);
    wait_each(ins, [](In& in) -> Request& { return in.req; });
    for (auto& in : ins) {
      const Status st = in.req.wait();
      check_message(ctx("p2p every pair"), r, st, in.src, in.tag, in.buf,
                    payload(in.src, r, in.size, static_cast<std::uint64_t>(in.tag - 10)));
    }
  });
}

// Blocking send/recv along shifts: rank r sends to r + d and receives from r - d, for
// every distance d, one eager and one rendezvous message each.
TEST_P(Sparse, P2PBlockingShifts) {
  auto& w = world();
  const int nr = n();
  run_ranks(w, ctx("p2p shifts"), [&](int r) {
    Communicator& c = w[static_cast<std::size_t>(r)];
    for (int d = 1; d < nr; ++d) {
      const int to = (r + d) % nr, from = (r - d + nr) % nr;
      for (std::size_t size : {std::size_t{333}, std::size_t{100003}}) {
        const Bytes out = payload(r, to, size, 100 + static_cast<std::uint64_t>(d));
        Request s = c.isend(to, 20, out.data(), out.size());
        Bytes in(size + 16, std::byte{0xEE});
        const Status st = c.recv(from, 20, in.data(), in.size());
        s.wait();
        check_message(ctx("p2p shift " + std::to_string(d)), r, st, from, 20, in,
                      payload(from, r, size, 100 + static_cast<std::uint64_t>(d)));
      }
    }
  });
}

// Wildcard receives: posted before the messages exist (mixed eager and rendezvous), taken
// from what already arrived, and any_source with any_tag.
TEST_P(Sparse, AnySource) {
  auto& w = world();
  const int nr = n();
  auto size_a = [](int src) { return src % 2 == 0 ? std::size_t(70001 + 17 * src) : std::size_t(1000 + src); };
  auto size_b = [](int src) { return src % 3 == 0 ? std::size_t(65537 + src) : std::size_t(3000 + 5 * src); };
  const std::size_t cap = 70001 + 17 * 64 + 16;
  run_ranks(w, ctx("any_source"), [&](int r) {
    Communicator& c = w[static_cast<std::size_t>(r)];
    const auto others = static_cast<std::size_t>(nr - 1);
    // A: receives posted first.
    std::vector<Bytes> bufs(others, Bytes(cap, std::byte{0xEE}));
    std::vector<Request> recvs;
    for (auto& b : bufs) recvs.push_back(c.irecv(any_source, 30, b.data(), b.size()));
    c.barrier();
    std::vector<Bytes> outs;
    outs.reserve(2 * others);
    std::vector<Request> sends;
    for (int off = 1; off < nr; ++off) {
      const int dst = (r + off) % nr;
      outs.push_back(payload(r, dst, size_a(r), 30));
      sends.push_back(c.isend(dst, 30, outs.back().data(), outs.back().size()));
    }
    std::set<int> seen;
    for (std::size_t i = 0; i < others; ++i) {
      const Status st = recvs[i].wait();
      EXPECT_TRUE(st.source >= 0 && st.source < nr && st.source != r && seen.insert(st.source).second)
          << ctx("any_source posted") << ": rank " << r << " got source " << st.source << " twice or out of range";
      if (st.source < 0 || st.source >= nr) continue;
      check_message(ctx("any_source posted"), r, st, st.source, 30, bufs[i], payload(st.source, r, size_a(st.source), 30));
    }
    EXPECT_EQ(seen.size(), others) << ctx("any_source posted") << ": rank " << r;
    wait_each(sends);
    sends.clear();

    // B: messages first, then blocking wildcard receives.
    for (int off = 1; off < nr; ++off) {
      const int dst = (r + off) % nr;
      outs.push_back(payload(r, dst, size_b(r), 31));
      sends.push_back(c.isend(dst, 31, outs.back().data(), outs.back().size()));
    }
    c.barrier();
    seen.clear();
    for (std::size_t i = 0; i < others; ++i) {
      Bytes b(cap, std::byte{0xEE});
      const Status st = c.recv(any_source, 31, b.data(), b.size());
      EXPECT_TRUE(st.source >= 0 && st.source < nr && seen.insert(st.source).second)
          << ctx("any_source unexpected") << ": rank " << r << " got source " << st.source;
      if (st.source < 0 || st.source >= nr) continue;
      check_message(ctx("any_source unexpected"), r, st, st.source, 31, b, payload(st.source, r, size_b(st.source), 31));
    }
    wait_each(sends);
    sends.clear();

    // C: any_source and any_tag; the tag tells the sender.
    for (int off = 1; off < nr; ++off) {
      const int dst = (r + off) % nr;
      outs.push_back(payload(r, dst, 40 + static_cast<std::size_t>(r), 32));
      sends.push_back(c.isend(dst, 200 + r, outs.back().data(), outs.back().size()));
    }
    seen.clear();
    for (std::size_t i = 0; i < others; ++i) {
      Bytes b(cap, std::byte{0xEE});
      const Status st = c.recv(any_source, any_tag, b.data(), b.size());
      EXPECT_EQ(st.tag, 200 + st.source) << ctx("any_tag") << ": rank " << r;
      EXPECT_TRUE(st.source >= 0 && st.source < nr && seen.insert(st.source).second)
          << ctx("any_tag") << ": rank " << r << " got source " << st.source;
      if (st.source < 0 || st.source >= nr) continue;
      check_message(ctx("any_tag"), r, st, st.source, 200 + st.source, b,
                    payload(st.source, r, 40 + static_cast<std::size_t>(st.source), 32));
    }
    wait_each(sends);
    c.barrier();  // nothing of this test is left for the next one on this world
  });
}

// The bulk lane to the rank half a world away (not a neighbour in any of these worlds
// but hypercube's power-of-two ones), with a data-lane message on the same tag beside it.
TEST_P(Sparse, BulkLane) {
  auto& w = world();
  const int nr = n();
  run_ranks(w, ctx("bulk"), [&](int r) {
    Communicator& c = w[static_cast<std::size_t>(r)];
    const int to = (r + nr / 2) % nr, from = (r - nr / 2 + nr) % nr;
    const Bytes big = payload(r, to, 150001, 50), small = payload(r, to, 10, 51);
    Request b1 = c.ibulk_send(to, 5, big.data(), big.size());
    Request b2 = c.isend(to, 5, small.data(), small.size());
    Bytes in(150001 + 16, std::byte{0xEE}), in2(10 + 16, std::byte{0xEE});
    const Status s2 = c.recv(from, 5, in2.data(), in2.size());
    const Status s1 = c.bulk_recv(from, 5, in.data(), in.size());
    b1.wait();
    b2.wait();
    check_message(ctx("bulk"), r, s1, from, 5, in, payload(from, r, 150001, 50));
    check_message(ctx("bulk data lane"), r, s2, from, 5, in2, payload(from, r, 10, 51));
  });
}

// ---- RPC --------------------------------------------------------------------------------

constexpr RpcId kXform = 0x5A01, kChain = 0x5A02;

// The reply of kXform on `callee` to `caller`: the arguments reversed and xor'ed with a
// byte of callee, then the two ranks.
Bytes xform(std::span<const std::byte> args, int callee, int caller) {
  Bytes out(args.rbegin(), args.rend());
  for (auto& b : out) b ^= static_cast<std::byte>(callee * 7 + 1);
  out.push_back(static_cast<std::byte>(callee));
  out.push_back(static_cast<std::byte>(caller));
  return out;
}

void expect_reply(const std::string& ctx, int rank, int dest, const Bytes& got, const Bytes& want) {
  if (got == want) return;
  std::size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  ADD_FAILURE() << ctx << ": rank " << rank << " -> " << dest << ": reply of " << got.size()
                << " bytes, " << want.size() << " expected, first difference at " << i;
}

TEST_P(Sparse, RpcToEveryRankAndThroughHandlers) {
  auto& w = world();
  const int nr = n();
  const Topology t = topology();
  run_ranks(w, ctx("rpc"), [&](int r) {
    Communicator& c = w[static_cast<std::size_t>(r)];
    c.register_rpc(kXform, [r](int caller, std::span<const std::byte> a) { return xform(a, r, caller); });
    // kChain calls kXform on the rank half a world further on and appends its caller.
    c.register_rpc(kChain, [&c, r, nr](int caller, std::span<const std::byte> a) {
      Bytes rep = c.rpc((r + nr / 2) % nr, kXform, a);
      rep.push_back(static_cast<std::byte>(caller));
      return rep;
    });
    c.barrier();  // every handler is in place

    // Blocking calls to every rank, this one included.
    for (int d = 0; d < nr; ++d) {
      const Bytes args = payload(r, d, static_cast<std::size_t>((r * 31 + d * 7) % 300), 60);
      expect_reply(ctx("rpc"), r, d, c.rpc(d, kXform, args), xform(args, d, r));
    }
    // All at once.
    std::vector<Bytes> args(static_cast<std::size_t>(nr));
    std::vector<RpcCall> calls;
    for (int d = 0; d < nr; ++d) {
      args[static_cast<std::size_t>(d)] = payload(r, d, static_cast<std::size_t>(d) * 13 + 1, 61);
      calls.push_back(c.rpc_async(d, kXform, args[static_cast<std::size_t>(d)]));
    }
    for (int d = 0; d < nr; ++d)
      expect_reply(ctx("rpc_async"), r, d, calls[static_cast<std::size_t>(d)].wait(),
                   xform(args[static_cast<std::size_t>(d)], d, r));
    // A large argument (and reply) to the farthest rank.
    const int far = farthest(t, nr, r);
    const Bytes big = payload(r, far, 200001, 62);
    expect_reply(ctx("rpc large"), r, far, c.rpc(far, kXform, big), xform(big, far, r));
    // Through a handler that calls another far rank.
    const Bytes small = payload(r, far, 77, 63);
    Bytes want = xform(small, (far + nr / 2) % nr, far);
    want.push_back(static_cast<std::byte>(r));
    expect_reply(ctx("rpc nested"), r, far, c.rpc(far, kChain, small), want);

    c.barrier();  // nobody calls any more
    c.unregister_rpc(kXform);
    c.unregister_rpc(kChain);
  });
}

// ---- collectives ------------------------------------------------------------------------

TEST_P(Sparse, AllReduce) {
  auto& w = world();
  const int nr = n();
  const auto un = static_cast<std::size_t>(nr);
  for (std::size_t count : counts_for(nr)) {
    const std::string cx = ctx("all_reduce count " + std::to_string(count));
    std::vector<std::vector<std::int64_t>> in64(un);
    std::vector<std::vector<std::int32_t>> in32(un);
    std::vector<std::vector<double>> inf(un);
    for (std::size_t r = 0; r < un; ++r) {
      in64[r] = ints<std::int64_t>(count, mix(count, r));
      in32[r] = ints<std::int32_t>(count, mix(count + 1, r));
      inf[r] = gen<double>(count, ReduceOp::sum, Data::exact, mix(count + 2, r));  // sums exact
    }
    const auto want64 = sum_of(in64, 0, nr, count);
    std::vector<std::int32_t> want32(count);
    std::vector<double> wantf(count, 0.0);
    for (std::size_t i = 0; i < count; ++i) {
      want32[i] = in32[0][i];
      for (std::size_t r = 0; r < un; ++r) {
        want32[i] = std::max(want32[i], in32[r][i]);
        wantf[i] += inf[r][i];
      }
    }
    if (!run_ranks(w, cx, [&](int r) {
          Communicator& c = w[static_cast<std::size_t>(r)];
          const auto ur = static_cast<std::size_t>(r);
          std::vector<std::int64_t> o64(count, sentinel<std::int64_t>());
          c.all_reduce(in64[ur], o64, ReduceOp::sum);
          expect_same(cx, r, "i64 sum", o64, want64);
          std::vector<std::int32_t> o32(count, sentinel<std::int32_t>());
          c.all_reduce(in32[ur], o32, ReduceOp::max);
          expect_same(cx, r, "i32 max", o32, want32);
          std::vector<double> d = inf[ur];
          c.all_reduce(d, ReduceOp::sum);  // in place
          expect_same(cx, r, "f64 sum in place", d, wantf);
        }))
      return;
  }

  // Forced algorithms, small segments, and two in flight at once.
  for (std::size_t count : {std::size_t{3}, std::size_t{1001}, std::size_t{40000}}) {
    std::vector<std::vector<std::int64_t>> in(un);
    for (std::size_t r = 0; r < un; ++r) in[r] = ints<std::int64_t>(count, mix(count + 7, r));
    const auto want = sum_of(in, 0, nr, count);
    for (Algorithm alg : {Algorithm::ring, Algorithm::halving_doubling, Algorithm::recursive_doubling}) {
      const std::string cx = ctx(std::string("all_reduce ") + nexar::to_string(alg) + " count " + std::to_string(count));
      if (!run_ranks(w, cx, [&](int r) {
            Communicator& c = w[static_cast<std::size_t>(r)];
            CollectiveOptions o;
            o.algorithm = alg;
            o.segment_bytes = 4096;
            std::vector<std::int64_t> a(count, 0), b(count, 0);
            Request ra = c.iall_reduce(in[static_cast<std::size_t>(r)], a, ReduceOp::sum, o);
            Request rb = c.iall_reduce(in[static_cast<std::size_t>(r)], b, ReduceOp::sum, o);
            rb.wait();
            ra.wait();
            expect_same(cx, r, "first", a, want);
            expect_same(cx, r, "second", b, want);
          }))
        return;
    }
  }
}

TEST_P(Sparse, Broadcast) {
  auto& w = world();
  const int nr = n();
  const Topology t = topology();
  const int roots[] = {0, farthest(t, nr, 0), nr - 1};
  for (int root : roots)
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{1001}, std::size_t{200001}}) {
      const std::string cx = ctx("broadcast root " + std::to_string(root) + " count " + std::to_string(count));
      const auto want = ints<std::int64_t>(count, mix(count, static_cast<std::uint64_t>(root) + 40));
      if (!run_ranks(w, cx, [&](int r) {
            std::vector<std::int64_t> buf = r == root ? want : std::vector<std::int64_t>(count, sentinel<std::int64_t>());
            w[static_cast<std::size_t>(r)].broadcast(buf, root);
            expect_same(cx, r, "buf", buf, want);
          }))
        return;
    }
  for (Algorithm alg : {Algorithm::tree, Algorithm::ring}) {
    const int root = farthest(t, nr, 0);
    const std::string cx = ctx(std::string("broadcast ") + nexar::to_string(alg));
    const auto want = ints<std::int32_t>(30001, 41);
    if (!run_ranks(w, cx, [&](int r) {
          CollectiveOptions o;
          o.algorithm = alg;
          o.segment_bytes = 8192;
          std::vector<std::int32_t> buf = r == root ? want : std::vector<std::int32_t>(want.size(), 0);
          w[static_cast<std::size_t>(r)].broadcast(buf, root, o);
          expect_same(cx, r, "buf", buf, want);
        }))
      return;
  }
}

TEST_P(Sparse, ReduceAndScans) {
  auto& w = world();
  const int nr = n();
  const auto un = static_cast<std::size_t>(nr);
  const int roots[] = {0, nr / 2 + 1};
  for (std::size_t count : counts_for(nr)) {
    std::vector<std::vector<std::int64_t>> in(un);
    for (std::size_t r = 0; r < un; ++r) in[r] = ints<std::int64_t>(count, mix(count + 20, r));
    std::vector<std::vector<std::int64_t>> prefix(un);  // inclusive prefix sums
    for (int r = 0; r < nr; ++r) prefix[static_cast<std::size_t>(r)] = sum_of(in, 0, r + 1, count);
    const auto& total = prefix[un - 1];
    for (int root : roots) {
      const std::string cx = ctx("reduce root " + std::to_string(root) + " count " + std::to_string(count));
      if (!run_ranks(w, cx, [&](int r) {
            std::vector<std::int64_t> out(count, sentinel<std::int64_t>());
            w[static_cast<std::size_t>(r)].reduce(in[static_cast<std::size_t>(r)], out, ReduceOp::sum, root);
            if (r == root)
              expect_same(cx, r, "recv", out, total);
            else
              expect_same(cx, r, "recv (not root: untouched)", out,
                          std::vector<std::int64_t>(count, sentinel<std::int64_t>()));
          }))
        return;
    }
    const std::string cx = ctx("scan count " + std::to_string(count));
    if (!run_ranks(w, cx, [&](int r) {
          Communicator& c = w[static_cast<std::size_t>(r)];
          const auto ur = static_cast<std::size_t>(r);
          std::vector<std::int64_t> out(count, sentinel<std::int64_t>());
          c.scan(in[ur], out, ReduceOp::sum);
          expect_same(cx, r, "scan", out, prefix[ur]);
          std::vector<std::int64_t> ex(count, sentinel<std::int64_t>());
          c.exclusive_scan(in[ur], ex, ReduceOp::sum);
          expect_same(cx, r, "exclusive_scan", ex,
                      r == 0 ? std::vector<std::int64_t>(count, sentinel<std::int64_t>()) : prefix[ur - 1]);
        }))
      return;
  }
}

TEST_P(Sparse, GatherScatterAllGather) {
  auto& w = world();
  const int nr = n();
  const auto un = static_cast<std::size_t>(nr);
  const Topology t = topology();
  const int groot = nr - 1, sroot = farthest(t, nr, 0);
  for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1001}, std::size_t{20001}}) {
    const std::string cx = ctx("gathers count " + std::to_string(count));
    std::vector<std::vector<std::int32_t>> in(un);
    std::vector<std::int32_t> cat;
    for (std::size_t r = 0; r < un; ++r) {
      in[r] = ints<std::int32_t>(count, mix(count + 30, r));
      cat.insert(cat.end(), in[r].begin(), in[r].end());
    }
    const auto root_data = ints<std::int32_t>(count * un, mix(count, 31));  // scatter's send
    if (!run_ranks(w, cx, [&](int r) {
          Communicator& c = w[static_cast<std::size_t>(r)];
          const auto ur = static_cast<std::size_t>(r);
          std::vector<std::int32_t> all(count * un, sentinel<std::int32_t>());
          c.all_gather(in[ur], all);
          expect_same(cx, r, "all_gather", all, cat);

          std::vector<std::int32_t> g(count * un, sentinel<std::int32_t>());
          c.gather(in[ur], g, groot);
          expect_same(cx, r, r == groot ? "gather" : "gather (not root: untouched)", g,
                      r == groot ? cat : std::vector<std::int32_t>(count * un, sentinel<std::int32_t>()));

          std::vector<std::int32_t> s(count, sentinel<std::int32_t>());
          const std::vector<std::int32_t> empty;
          c.scatter(r == sroot ? root_data : empty, s, sroot);
          expect_same(cx, r, "scatter", s,
                      std::vector<std::int32_t>(root_data.begin() + static_cast<std::ptrdiff_t>(ur * count),
                                                root_data.begin() + static_cast<std::ptrdiff_t>((ur + 1) * count)));
        }))
      return;
  }

  // v-forms: all_gather_v with uneven counts (some zero).
  std::vector<std::size_t> counts(un), displs(un);
  std::size_t total = 0;
  for (std::size_t r = 0; r < un; ++r) {
    counts[r] = (r * 37) % 50;
    displs[r] = total;
    total += counts[r];
  }
  std::vector<std::vector<std::int32_t>> vin(un);
  std::vector<std::int32_t> vcat;
  for (std::size_t r = 0; r < un; ++r) {
    vin[r] = ints<std::int32_t>(counts[r], mix(99, r));
    vcat.insert(vcat.end(), vin[r].begin(), vin[r].end());
  }
  const std::string cx = ctx("all_gather_v");
  run_ranks(w, cx, [&](int r) {
    const auto ur = static_cast<std::size_t>(r);
    std::vector<std::int32_t> out(total, sentinel<std::int32_t>());
    w[ur].iall_gather_v(vin[ur].data(), counts[ur], out.data(), counts, displs, DataType::i32).wait();
    expect_same(cx, r, "recv", out, vcat);
  });
}

TEST_P(Sparse, ReduceScatter) {
  auto& w = world();
  const int nr = n();
  const auto un = static_cast<std::size_t>(nr);
  for (std::size_t count : counts_for(nr)) {
    const std::string cx = ctx("reduce_scatter count " + std::to_string(count));
    std::vector<std::vector<std::int64_t>> in(un);
    for (std::size_t r = 0; r < un; ++r) in[r] = ints<std::int64_t>(count, mix(count + 50, r));
    const auto total = sum_of(in, 0, nr, count);
    if (!run_ranks(w, cx, [&](int r) {
          const auto [off, len] = block_of(count, nr, r);
          std::vector<std::int64_t> out(len, sentinel<std::int64_t>());
          w[static_cast<std::size_t>(r)].reduce_scatter(in[static_cast<std::size_t>(r)], out, ReduceOp::sum);
          expect_same(cx, r, "block", out,
                      std::vector<std::int64_t>(total.begin() + static_cast<std::ptrdiff_t>(off),
                                                total.begin() + static_cast<std::ptrdiff_t>(off + len)));
        }))
      return;
  }
}

TEST_P(Sparse, AllToAll) {
  auto& w = world();
  const int nr = n();
  const auto un = static_cast<std::size_t>(nr);
  for (std::size_t block : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{333}, std::size_t{4099}}) {
    const std::string cx = ctx("all_to_all block " + std::to_string(block));
    std::vector<std::vector<std::int32_t>> in(un);
    for (std::size_t r = 0; r < un; ++r) in[r] = ints<std::int32_t>(block * un, mix(block + 60, r));
    if (!run_ranks(w, cx, [&](int r) {
          const auto ur = static_cast<std::size_t>(r);
          std::vector<std::int32_t> out(block * un, sentinel<std::int32_t>()), want;
          for (std::size_t i = 0; i < un; ++i)  // block i comes from rank i's block r
            want.insert(want.end(), in[i].begin() + static_cast<std::ptrdiff_t>(ur * block),
                        in[i].begin() + static_cast<std::ptrdiff_t>((ur + 1) * block));
          w[ur].all_to_all(in[ur], out);
          expect_same(cx, r, "recv", out, want);
        }))
      return;
  }

  // all_to_all_v: rank i sends rank j (i + 2j) % 5 elements.
  auto cnt = [](std::size_t from, std::size_t to) { return (from + 2 * to) % 5; };
  std::vector<std::vector<std::int32_t>> in(un);
  for (std::size_t r = 0; r < un; ++r) {
    std::size_t total = 0;
    for (std::size_t j = 0; j < un; ++j) total += cnt(r, j);
    in[r] = ints<std::int32_t>(total, mix(77, r));
  }
  const std::string cx = ctx("all_to_all_v");
  run_ranks(w, cx, [&](int r) {
    const auto ur = static_cast<std::size_t>(r);
    std::vector<std::size_t> sc(un), sd(un), rc(un), rd(un);
    std::size_t so = 0, ro = 0;
    for (std::size_t j = 0; j < un; ++j) {
      sc[j] = cnt(ur, j);
      sd[j] = so;
      so += sc[j];
      rc[j] = cnt(j, ur);
      rd[j] = ro;
      ro += rc[j];
    }
    std::vector<std::int32_t> want;
    for (std::size_t i = 0; i < un; ++i) {  // from rank i: its block for r
      std::size_t off = 0;
      for (std::size_t j = 0; j < ur; ++j) off += cnt(i, j);
      want.insert(want.end(), in[i].begin() + static_cast<std::ptrdiff_t>(off),
                  in[i].begin() + static_cast<std::ptrdiff_t>(off + cnt(i, ur)));
    }
    std::vector<std::int32_t> out(ro, sentinel<std::int32_t>());
    w[ur].iall_to_all_v(in[ur].data(), sc, sd, out.data(), rc, rd, DataType::i32).wait();
    expect_same(cx, r, "recv", out, want);
  });
}

// Nobody leaves a barrier before the last rank entered it, the last being the rank farthest
// from rank 0; then barriers back to back.
TEST_P(Sparse, Barrier) {
  auto& w = world();
  const int nr = n();
  const int late = farthest(topology(), nr, 0);
  std::vector<Clock::time_point> left(static_cast<std::size_t>(nr));
  Clock::time_point entered{};
  if (!run_ranks(w, ctx("barrier"), [&](int r) {
        if (r == late) {
          std::this_thread::sleep_for(300ms);
          entered = Clock::now();
        }
        w[static_cast<std::size_t>(r)].barrier();
        left[static_cast<std::size_t>(r)] = Clock::now();
      }))
    return;
  for (int r = 0; r < nr; ++r)
    EXPECT_GE(left[static_cast<std::size_t>(r)], entered)
        << ctx("barrier") << ": rank " << r << " left before rank " << late << " entered";
  run_ranks(w, ctx("barriers back to back"), [&](int r) {
    for (int i = 0; i < 20; ++i) w[static_cast<std::size_t>(r)].barrier();
  });
}

// ---- split ------------------------------------------------------------------------------

// Splits into halves (keys reversed) and by parity: on a ring the members of a parity
// communicator are two hops apart, so all of its traffic goes through ranks of the other
// one. On each: an all_reduce, a broadcast from the last member, a barrier, a shift of p2p
// messages (eager and rendezvous) and wildcard receives at member 0.
TEST_P(Sparse, SplitHalvesAndParity) {
  auto& w = world();
  const int nr = n();
  const auto un = static_cast<std::size_t>(nr);
  struct How {
    const char* name;
    std::function<int(int)> color, key;
  };
  const How hows[] = {
      {"halves", [nr](int r) { return r < nr / 2 ? 0 : 1; }, [](int r) { return -r; }},
      {"parity", [](int r) { return r % 2; }, [](int r) { return r; }},
  };
  for (const How& how : hows) {
    const std::string cx = ctx(std::string("split ") + how.name);
    // The members of each rank's communicator, in sub-rank order.
    std::vector<std::vector<int>> members(un);
    for (int r = 0; r < nr; ++r) {
      auto& m = members[static_cast<std::size_t>(r)];
      for (int v = 0; v < nr; ++v)
        if (how.color(v) == how.color(r)) m.push_back(v);
      std::sort(m.begin(), m.end(), [&](int a, int b) { return how.key(a) < how.key(b); });
    }
    std::vector<Communicator> sub(un);
    if (!run_ranks(w, cx, [&](int r) {
          sub[static_cast<std::size_t>(r)] = w[static_cast<std::size_t>(r)].split(how.color(r), how.key(r));
        }))
      return;
    for (int r = 0; r < nr; ++r) {
      const auto& m = members[static_cast<std::size_t>(r)];
      const Communicator& s = sub[static_cast<std::size_t>(r)];
      ASSERT_TRUE(s.is_open()) << cx << ": rank " << r;
      EXPECT_EQ(s.size(), static_cast<int>(m.size())) << cx << ": rank " << r;
      EXPECT_EQ(s.rank(), static_cast<int>(std::find(m.begin(), m.end(), r) - m.begin())) << cx << ": rank " << r;
      EXPECT_EQ(s.world_ranks(), m) << cx << ": rank " << r;
    }
    // Inputs by world rank.
    std::vector<std::vector<std::int64_t>> in(un);
    for (std::size_t r = 0; r < un; ++r) in[r] = ints<std::int64_t>(1001, mix(300, r));
    run_ranks(w, cx, [&](int r) {
      Communicator& s = sub[static_cast<std::size_t>(r)];
      const auto& m = members[static_cast<std::size_t>(r)];
      const int sn = s.size(), sr = s.rank();
      // all_reduce against the sum over the members.
      std::vector<std::vector<std::int64_t>> mine;
      for (int v : m) mine.push_back(in[static_cast<std::size_t>(v)]);
      std::vector<std::int64_t> out(1001, 0);
      s.all_reduce(in[static_cast<std::size_t>(r)], out, ReduceOp::sum);
      expect_same(cx, r, "all_reduce", out, sum_of(mine, 0, sn, 1001));
      // broadcast from the last member.
      std::vector<std::int32_t> b = sr == sn - 1 ? ints<std::int32_t>(5001, 301) : std::vector<std::int32_t>(5001, 0);
      s.broadcast(b, sn - 1);
      expect_same(cx, r, "broadcast", b, ints<std::int32_t>(5001, 301));
      s.barrier();
      // p2p shift by one member, eager and rendezvous; payloads keyed by world ranks.
      const int to = (sr + 1) % sn, from = (sr - 1 + sn) % sn;
      const int wto = m[static_cast<std::size_t>(to)], wfrom = m[static_cast<std::size_t>(from)];
      for (std::size_t size : {std::size_t{100}, std::size_t{100001}}) {
        const Bytes o = payload(r, wto, size, 302);
        Request q = s.isend(to, 7, o.data(), o.size());
        Bytes i(size + 16, std::byte{0xEE});
        const Status st = s.recv(from, 7, i.data(), i.size());
        q.wait();
        check_message(cx + " p2p (sub ranks)", sr, st, from, 7, i, payload(wfrom, r, size, 302));
      }
      // Every member sends member 0, which takes them with any_source.
      if (sr != 0) {
        const Bytes o = payload(r, m[0], 1000 + static_cast<std::size_t>(sr), 303);
        s.send(0, 8, o.data(), o.size());
      } else {
        std::set<int> seen;
        for (int k = 1; k < sn; ++k) {
          Bytes i(2000, std::byte{0xEE});
          const Status st = s.recv(any_source, 8, i.data(), i.size());
          ASSERT_TRUE(st.source > 0 && st.source < sn && seen.insert(st.source).second)
              << cx << ": member 0 got source " << st.source;
          check_message(cx + " any_source (sub ranks)", sr, st, st.source, 8, i,
                        payload(m[static_cast<std::size_t>(st.source)], r, 1000 + static_cast<std::size_t>(st.source), 303));
        }
      }
      s.barrier();
    });
    for (auto& s : sub) s.close();
  }
}

// ---- order through relays ---------------------------------------------------------------

// Message i of a stream: 8 bytes index, 8 bytes sequence within its tag, then bytes from
// the index. Sizes on both sides of the eager limit.
std::size_t stream_size(int i) {
  return i % 10 == 3 ? kEager + 1 + static_cast<std::size_t>(i) * 37 : 16 + static_cast<std::size_t>(i * 7919) % 4000;
}
constexpr std::size_t kStreamCap = kEager + 1 + 200 * 37 + 64;

Bytes stream_message(int src, int dst, int i, std::uint64_t seq, std::uint64_t salt) {
  Bytes b = payload(src, dst, stream_size(i), salt + static_cast<std::uint64_t>(i));
  const auto idx = static_cast<std::uint64_t>(i);
  std::memcpy(b.data(), &idx, 8);
  std::memcpy(b.data() + 8, &seq, 8);
  return b;
}

// Checks that `buf` (of st.bytes) is message `i` with per-tag sequence `seq`.
void check_stream(const std::string& ctx, int rank, const Status& st, const Bytes& buf, int src,
                  int tag, int i, std::uint64_t seq, std::uint64_t salt) {
  std::uint64_t got_i = ~0ull, got_seq = ~0ull;
  if (st.bytes >= 16) {
    std::memcpy(&got_i, buf.data(), 8);
    std::memcpy(&got_seq, buf.data() + 8, 8);
  }
  if (got_i != static_cast<std::uint64_t>(i) || got_seq != seq) {
    ADD_FAILURE() << ctx << ": rank " << rank << " expected message " << i << " (seq " << seq
                  << " of tag " << tag << "), got message " << static_cast<long long>(got_i)
                  << " (seq " << static_cast<long long>(got_seq) << ", tag " << st.tag << ", "
                  << st.bytes << " bytes)";
    return;
  }
  check_message(ctx + " message " + std::to_string(i), rank, st, src, tag, buf,
                stream_message(src, rank, i, seq, salt));
}

constexpr int kMsgs = 200, kBack = 50, kBg = 60;
constexpr int kTagOne = 50, kTagA = 51, kTagB = 52, kTagBack = 53, kTagBg = 54, kTagX = 55, kTagY = 56;

TEST_P(Sparse, OrderThroughRelaysUnderLoad) {
  auto& w = world();
  const int nr = n();
  const Topology t = topology();
  const int src = 0;
  const int dst = hops_from(t, nr, 0)[static_cast<std::size_t>(nr / 2)] > 1 ? nr / 2 : farthest(t, nr, 0);
  // On a lazy full mesh the stream is direct, and its pair connects under the load instead.
  if (!GetParam().lazy) {
    ASSERT_GT(hops_from(t, nr, src)[static_cast<std::size_t>(dst)], 1) << "the stream must be relayed";
  }
  // Background pairs: the other ranks in a cycle, each sending the one about half way on.
  std::vector<int> rest;
  for (int r = 0; r < nr; ++r)
    if (r != src && r != dst) rest.push_back(r);
  const int rn = static_cast<int>(rest.size());
  std::vector<int> bg_to(static_cast<std::size_t>(nr), -1), bg_from(static_cast<std::size_t>(nr), -1);
  for (int i = 0; i < rn; ++i) {
    const int a = rest[static_cast<std::size_t>(i)], b = rest[static_cast<std::size_t>((i + rn / 2) % rn)];
    bg_to[static_cast<std::size_t>(a)] = b;
    bg_from[static_cast<std::size_t>(b)] = a;
  }
  // Two tags interleaved: every third message on B.
  auto tag_of = [](int i) { return i % 3 == 0 ? kTagB : kTagA; };
  std::vector<std::uint64_t> seq_of(kMsgs);
  {
    std::uint64_t a = 0, b = 0;
    for (int i = 0; i < kMsgs; ++i) seq_of[static_cast<std::size_t>(i)] = tag_of(i) == kTagB ? b++ : a++;
  }
  const std::string cx = ctx("order " + std::to_string(src) + " -> " + std::to_string(dst));

  run_ranks(w, cx, [&](int r) {
    Communicator& c = w[static_cast<std::size_t>(r)];
    const auto ur = static_cast<std::size_t>(r);
    std::vector<Bytes> outs;
    outs.reserve(4 * kMsgs);
    std::vector<Request> sends;
    if (r == src) {
      // The reply stream from dst, posted before anything is sent.
      std::vector<Bytes> back(kBack, Bytes(kStreamCap, std::byte{0xEE}));
      std::vector<Request> back_req;
      for (auto& b : back) back_req.push_back(c.irecv(dst, kTagBack, b.data(), b.size()));
      // 1: one tag; 2: two tags interleaved.
      for (int i = 0; i < kMsgs; ++i) {
        outs.push_back(stream_message(src, dst, i, static_cast<std::uint64_t>(i), 1000));
        sends.push_back(c.isend(dst, kTagOne, outs.back().data(), outs.back().size()));
      }
      for (int i = 0; i < kMsgs; ++i) {
        outs.push_back(stream_message(src, dst, i, seq_of[static_cast<std::size_t>(i)], 2000));
        sends.push_back(c.isend(dst, tag_of(i), outs.back().data(), outs.back().size()));
      }
      for (int i = 0; i < kBack; ++i) {
        const Status st = back_req[static_cast<std::size_t>(i)].wait();
        check_stream(cx + " back", r, st, back[static_cast<std::size_t>(i)], dst, kTagBack, i,
                     static_cast<std::uint64_t>(i), 3000);
      }
    } else if (r == dst) {
      for (int i = 0; i < kBack; ++i) {
        outs.push_back(stream_message(dst, src, i, static_cast<std::uint64_t>(i), 3000));
        sends.push_back(c.isend(src, kTagBack, outs.back().data(), outs.back().size()));
      }
      // 1: blocking receives in order.
      for (int i = 0; i < kMsgs; ++i) {
        Bytes b(kStreamCap, std::byte{0xEE});
        const Status st = c.recv(src, kTagOne, b.data(), b.size());
        check_stream(cx + " one tag", r, st, b, src, kTagOne, i, static_cast<std::uint64_t>(i), 1000);
      }
      // 2: every receive of tag B posted before those of tag A.
      std::vector<Bytes> bufs(kMsgs, Bytes(kStreamCap, std::byte{0xEE}));
      std::vector<Request> reqs(kMsgs);
      for (int tag : {kTagB, kTagA})
        for (int i = 0; i < kMsgs; ++i)
          if (tag_of(i) == tag)
            reqs[static_cast<std::size_t>(i)] = c.irecv(src, tag, bufs[static_cast<std::size_t>(i)].data(), kStreamCap);
      for (int i = 0; i < kMsgs; ++i) {
        const Status st = reqs[static_cast<std::size_t>(i)].wait();
        check_stream(cx + " two tags", r, st, bufs[static_cast<std::size_t>(i)], src, tag_of(i), i,
                     seq_of[static_cast<std::size_t>(i)], 2000);
      }
    } else {
      // Background traffic through the same relays.
      const int to = bg_to[ur], from = bg_from[ur];
      for (int i = 0; i < kBg; ++i) {
        outs.push_back(stream_message(r, to, i * 3 + 1, static_cast<std::uint64_t>(i), 4000));
        sends.push_back(c.isend(to, kTagBg, outs.back().data(), outs.back().size()));
      }
      for (int i = 0; i < kBg; ++i) {
        Bytes b(kStreamCap, std::byte{0xEE});
        const Status st = c.recv(from, kTagBg, b.data(), b.size());
        check_stream(cx + " background", r, st, b, from, kTagBg, i * 3 + 1, static_cast<std::uint64_t>(i), 4000);
      }
    }
    wait_each(sends);
    c.barrier();

    // 3: any_tag receives of two interleaved tags: each tag in its own order.
    sends.clear();
    outs.clear();
    auto tag3 = [](int i) { return (i / 2) % 2 == 0 ? kTagX : kTagY; };
    if (r == src) {
      std::uint64_t sx = 0, sy = 0;
      for (int i = 0; i < 100; ++i) {
        const std::uint64_t seq = tag3(i) == kTagX ? sx++ : sy++;
        outs.push_back(stream_message(src, dst, i, seq, 5000));
        sends.push_back(c.isend(dst, tag3(i), outs.back().data(), outs.back().size()));
      }
    } else if (r == dst) {
      std::uint64_t next_x = 0, next_y = 0;
      std::set<std::uint64_t> seen;
      for (int k = 0; k < 100; ++k) {
        Bytes b(kStreamCap, std::byte{0xEE});
        const Status st = c.recv(src, any_tag, b.data(), b.size());
        std::uint64_t idx = ~0ull, seq = ~0ull;
        if (st.bytes >= 16) {
          std::memcpy(&idx, b.data(), 8);
          std::memcpy(&seq, b.data() + 8, 8);
        }
        if (idx >= 100 || !seen.insert(idx).second || st.tag != tag3(static_cast<int>(idx))) {
          ADD_FAILURE() << cx << " any_tag: message index " << static_cast<long long>(idx) << " with tag "
                        << st.tag << " unexpected or repeated";
          continue;
        }
        std::uint64_t& want = st.tag == kTagX ? next_x : next_y;
        check_stream(cx + " any_tag", r, st, b, src, st.tag, static_cast<int>(idx), want, 5000);
        ++want;
      }
    }
    wait_each(sends);
    c.barrier();
  });
}

std::vector<WorldSpec> specs() {
  return {{"k_regular:4", 16, true},  {"hypercube", 16, true},   {"hypercube", 12, false},
          {"k_regular:2", 13, false}, {"k_regular:4", 16, false},
          // A full mesh whose connections are made on first use: every operation must work
          // while the pairs it touches connect, both ranks of a pair often dialling at once.
          {"full_mesh", 11, false, true}, {"full_mesh", 16, true, true}};
}

INSTANTIATE_TEST_SUITE_P(Topologies, Sparse, ::testing::ValuesIn(specs()),
                         [](const ::testing::TestParamInfo<WorldSpec>& p) { return spec_name(p.param); });

// ---- hop limit --------------------------------------------------------------------------

// Whether `what` names rank `r`: the number with no digit next to it.
bool names_rank(const std::string& what, int r) {
  return std::regex_search(what, std::regex("(^|[^0-9.])" + std::to_string(r) + "([^0-9]|$)"));
}

// Expects an operation beyond the hop limit to fail at once with invalid_argument naming
// the destination and "hop limit", whether the call throws or the Request it returns fails.
// One that is not refused is cancelled after 5 s, so the test does not wait for deadlines.
template <class F>
void expect_hop_limit(const std::string& ctx, int dest, F&& start_op) {
  const auto start = Clock::now();
  try {
    Request q = start_op();
    if (!q.wait_for(5s)) {
      q.cancel();
      ADD_FAILURE() << ctx << ": not refused (still running after 5 s)";
    } else {
      ADD_FAILURE() << ctx << ": not refused (completed)";
    }
    return;
  } catch (const nexar::Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.code(), Errc::invalid_argument) << ctx << ": " << nexar::to_string(e.code()) << ": " << what;
    EXPECT_TRUE(contains(what, "hop limit")) << ctx << ": " << what;
    EXPECT_TRUE(names_rank(what, dest)) << ctx << ": should name rank " << dest << ": " << what;
    EXPECT_LT(Clock::now() - start, 10s) << ctx << ": should fail at once, not after a deadline";
  }
}

// A ring of 16 (k_regular:2) with relay_hop_limit 2: ranks 8 (8 hops from 0) and 12 (4
// hops) are out of reach of rank 0, ranks 1, 2, 14 and 15 within it; a refused send leaves
// the rest working.
TEST(SparseHopLimit, SendsBeyondTheLimitFailNamingTheRank) {
  Watchdog dog(std::chrono::seconds(300));
  auto w = nexar::bootstrap_local(16, sparse_config("k_regular:2", 2));
  ASSERT_EQ(w.size(), 16u);
  EXPECT_EQ(w[0].config().relay_hop_limit, 2u);
  const std::string cx = "k_regular:2 w16 hop limit 2";
  const std::size_t sizes[] = {1000, 100001};
  const int near[] = {1, 2, 14, 15};
  run_ranks(w, cx, [&](int r) {
    Communicator& c = w[static_cast<std::size_t>(r)];
    if (r == 0) {
      const Bytes data = payload(0, 8, 1000, 70), big = payload(0, 8, 200001, 70);
      for (int dest : {8, 12, 3}) {
        const std::string at = cx + ": 0 -> " + std::to_string(dest);
        expect_hop_limit(at + " send", dest, [&] {
          c.send(dest, 1, data.data(), data.size());
          return Request{};
        });
        expect_hop_limit(at + " isend", dest, [&] { return c.isend(dest, 1, data.data(), data.size()); });
        expect_hop_limit(at + " isend (rendezvous size)", dest, [&] { return c.isend(dest, 1, big.data(), big.size()); });
        expect_hop_limit(at + " bulk_send", dest, [&] {
          c.bulk_send(dest, 1, data.data(), data.size());
          return Request{};
        });
        expect_hop_limit(at + " rpc", dest, [&] { return c.rpc_async(dest, 1, data).request(); });
      }
      // Within the limit, after the refusals: both sizes to each near rank.
      for (int dest : near)
        for (std::size_t si = 0; si < 2; ++si) {
          const Bytes o = payload(0, dest, sizes[si], 71 + si);
          c.send(dest, 2, o.data(), o.size());
        }
    } else if (std::find(std::begin(near), std::end(near), r) != std::end(near)) {
      for (std::size_t si = 0; si < 2; ++si) {
        Bytes in(sizes[si] + 16, std::byte{0xEE});
        const Status st = c.recv(0, 2, in.data(), in.size());
        check_message(cx + ": near rank", r, st, 0, 2, in, payload(0, r, sizes[si], 71 + si));
      }
    } else if (r == 5) {  // two hops elsewhere on the ring
      const Bytes o = payload(5, 7, 100001, 72);
      c.send(7, 3, o.data(), o.size());
    } else if (r == 7) {
      Bytes in(100001 + 16, std::byte{0xEE});
      const Status st = c.recv(5, 3, in.data(), in.size());
      check_message(cx + ": 5 -> 7", r, st, 5, 3, in, payload(5, 7, 100001, 72));
    }
  });
  for (auto& c : w) c.close();
}

// Closing a rank tells every other rank, and some of them are beyond the hop limit: close()
// must not wait for messages that can never arrive. Closing the 16 ranks of the ring one
// after another takes milliseconds each; a close that waits for a lost goodbye takes a
// second or more, so 16 of them cannot stay under 5 s.
TEST(SparseHopLimit, ClosingDoesNotWaitForRanksBeyondTheLimit) {
  Watchdog dog(std::chrono::seconds(120));
  auto w = nexar::bootstrap_local(16, sparse_config("k_regular:2", 2));
  ASSERT_EQ(w.size(), 16u);
  std::vector<double> took;
  for (auto& c : w) {
    const auto start = Clock::now();
    c.close();
    took.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  double total = 0;
  for (double t : took) total += t;
  const auto slowest = std::max_element(took.begin(), took.end());
  EXPECT_LT(total, 5.0) << "closing the 16 ranks one after another took " << total
                        << " s; the slowest, rank " << (slowest - took.begin()) << ", " << *slowest << " s";
}

// Ranks that close in order are no failure, even when their leaving cuts others apart. On
// a ring of 6 (k_regular:2), ranks 1 and 5 close: rank 0 and ranks 2, 3, 4 can no longer
// reach each other. Nobody is declared failed and no communicator is revoked: 2, 3 and 4
// still exchange messages (2 -> 4 through 3), and a send across the gap fails with
// Errc::peer_closed naming the unreachable rank.
TEST(SparseClose, RanksCutOffByDepartedRelaysAreNotFailed) {
  Watchdog dog(std::chrono::seconds(120));
  auto w = nexar::bootstrap_local(6, sparse_config("k_regular:2", 0, false));
  w[1].close();
  w[5].close();
  auto across = [&](int from, int to) {
    const auto deadline = Clock::now() + 20s;
    for (;;) {
      try {
        std::vector<int> x{1, 2, 3};
        w[static_cast<std::size_t>(from)].send(to, 3, x);
      } catch (const nexar::Error& e) {
        return std::make_pair(e.code(), std::string(e.what()));
      }
      if (Clock::now() > deadline) return std::make_pair(Errc::ok, std::string("every send succeeded"));
      std::this_thread::sleep_for(5ms);
    }
  };
  for (auto [from, to] : {std::pair{0, 3}, std::pair{2, 0}}) {
    const auto [code, what] = across(from, to);
    EXPECT_EQ(code, Errc::peer_closed) << from << " -> " << to << ": " << what;
    EXPECT_TRUE(contains(what, "peer " + std::to_string(to))) << what;
    EXPECT_TRUE(contains(what, "unreachable")) << what;
  }
  for (int r : {0, 2, 3, 4}) {
    EXPECT_TRUE(w[static_cast<std::size_t>(r)].failed_ranks().empty()) << "rank " << r;
    EXPECT_FALSE(w[static_cast<std::size_t>(r)].is_revoked()) << "rank " << r;
  }
  std::vector<int> in(3), out{7, 8, 9};
  std::thread t([&] { w[4].recv(2, 5, in); });
  w[2].send(4, 5, out);
  t.join();
  EXPECT_EQ(in, out);
  for (int r : {0, 2, 3, 4}) w[static_cast<std::size_t>(r)].close();
}

// A destination that does not receive fills its unexpected budget and stops granting
// credit; its senders stall. Traffic between other ranks through the very same relays must
// go on meanwhile: relays never stop reading, and hold at most relay_window per pair. On
// a ring of 8, rank 0 floods rank 4 (through 1, 2 and 3) while 1 and 3 ping-pong through
// 2, and 7 sends to 2 through 0 and 1; rank 4 receives only once those are done.
TEST(SparseFlow, ASlowDestinationStallsOnlyItsOwnSenders) {
  Watchdog dog(std::chrono::seconds(300));
  Config cfg = sparse_config("k_regular:2", 0, false);
  cfg.unexpected_limit = 256 * 1024;
  cfg.relay_window = 128 * 1024;
  cfg.op_timeout = 30s;  // a stalled relay shows as a timeout, not a hang
  auto w = nexar::bootstrap_local(8, cfg);
  ASSERT_EQ(w.size(), 8u);
  constexpr int kFlood = 64;
  constexpr std::size_t kFloodBytes = 60 * 1024;  // eager: sent before rank 4 asks
  std::atomic<int> others_done{0};
  run_ranks(w, "slow destination", [&](int r) {
    Communicator& c = w[static_cast<std::size_t>(r)];
    if (r == 0) {
      std::vector<Bytes> out;
      std::vector<Request> reqs;
      for (int i = 0; i < kFlood; ++i) out.push_back(payload(0, 4, kFloodBytes, 100 + static_cast<std::uint64_t>(i)));
      for (int i = 0; i < kFlood; ++i) reqs.push_back(c.isend(4, 5, out[static_cast<std::size_t>(i)].data(), kFloodBytes));
      for (auto& q : reqs) q.wait();
    } else if (r == 4) {
      while (others_done.load() < 3) std::this_thread::sleep_for(1ms);
      Bytes in(kFloodBytes + 16, std::byte{0xEE});
      for (int i = 0; i < kFlood; ++i) {
        const Status st = c.recv(0, 5, in.data(), in.size());
        check_message("flood " + std::to_string(i), r, st, 0, 5, in,
                      payload(0, 4, kFloodBytes, 100 + static_cast<std::uint64_t>(i)));
      }
    } else if (r == 1 || r == 3) {
      const int other = r == 1 ? 3 : 1;
      Bytes buf(1024 + 16, std::byte{0xEE});
      for (int i = 0; i < 200; ++i) {
        const Bytes o = payload(r, other, 1024, static_cast<std::uint64_t>(i));
        if (r == 1) {
          c.send(other, 6, o.data(), o.size());
          const Status st = c.recv(other, 6, buf.data(), buf.size());
          check_message("ping-pong", r, st, other, 6, buf, payload(other, r, 1024, static_cast<std::uint64_t>(i)));
        } else {
          const Status st = c.recv(other, 6, buf.data(), buf.size());
          check_message("ping-pong", r, st, other, 6, buf, payload(other, r, 1024, static_cast<std::uint64_t>(i)));
          c.send(other, 6, o.data(), o.size());
        }
      }
      others_done.fetch_add(1);
    } else if (r == 7 || r == 2) {
      for (int i = 0; i < 100; ++i) {
        if (r == 7) {
          const Bytes o = payload(7, 2, 10000, static_cast<std::uint64_t>(i));
          c.send(2, 7, o.data(), o.size());
        } else {
          Bytes in(10000 + 16, std::byte{0xEE});
          const Status st = c.recv(7, 7, in.data(), in.size());
          check_message("7 -> 2", r, st, 7, 7, in, payload(7, 2, 10000, static_cast<std::uint64_t>(i)));
        }
      }
      if (r == 2) others_done.fetch_add(1);
    }
  });
  for (auto& c : w) c.close();
}

// A relay cannot speak for another rank. On a ring of 4, rank 1 relays between 0 and 2;
// here it forges a relay frame claiming rank 0 as its origin, carrying an eager message for
// rank 2 at the very stream position 0's next bytes would take, with two guesses at the
// MAC (it does not hold the key of the pair 0, 2). Rank 2 must take neither: a receive for that tag stays empty, and 0's real message
// that follows arrives intact.
TEST(SparseAuth, ARelayCannotForgeAnotherRanksMessage) {
  Watchdog dog(std::chrono::seconds(120));
  Config cfg = sparse_config("k_regular:2", 0, false);
  cfg.log_level = LogLevel::off;  // the forgeries are logged as errors
  auto w = nexar::bootstrap_local(4, cfg);
  ASSERT_EQ(w.size(), 4u);
  ASSERT_EQ(w[0].neighbours(), (std::vector<int>{1, 3}));
  nexar::detail::Node& relay = nexar::detail::Access::impl(w[1])->node();
  const std::string forged_text = "forged by rank 1";
  auto forge = [&](std::byte guess) {
    // The inner bytes: an eager frame from rank 0 on the data lane, as 0 would send it.
    nexar::wire::FrameHeader m;
    m.type = nexar::wire::FrameType::eager;
    m.src = 0;
    m.tag = 9;
    m.length = forged_text.size();
    std::vector<std::byte> inner(nexar::wire::header_size + forged_text.size());
    nexar::wire::encode_header(m, std::span<std::byte, nexar::wire::header_size>(inner.data(), nexar::wire::header_size));
    std::memcpy(inner.data() + nexar::wire::header_size, forged_text.data(), forged_text.size());
    nexar::wire::FrameHeader h;
    h.type = nexar::wire::FrameType::relay;
    h.src = 0;
    h.comm = nexar::wire::relay_route(2, 2);
    h.seq = 0;
    h.length = inner.size() + nexar::wire::relay_mac_size;
    std::vector<std::byte> frame(nexar::wire::header_size + h.length, guess);
    nexar::wire::encode_header(h, std::span<std::byte, nexar::wire::header_size>(frame.data(), nexar::wire::header_size));
    std::memcpy(frame.data() + nexar::wire::header_size, inner.data(), inner.size());
    std::promise<void> sent;
    relay.engine().post([&] {
      nexar::detail::PooledBuffer b = relay.pool().acquire(frame.size());
      std::memcpy(b.data(), frame.data(), frame.size());
      relay.peer(2)->send_frame(nexar::wire::Lane::data, std::move(b), frame.size());
      sent.set_value();
    });
    sent.get_future().wait();
  };
  forge(std::byte{0x00});
  forge(std::byte{0x5A});
  Bytes in(64, std::byte{0xEE});
  Request r = w[2].irecv(0, 9, in.data(), in.size());
  std::this_thread::sleep_for(300ms);
  EXPECT_FALSE(r.test()) << "rank 2 took a message rank 1 forged in rank 0's name";
  const Bytes real = payload(0, 2, 20, 77);
  w[0].send(2, 9, real.data(), real.size());
  const Status st = r.wait();
  check_message("after the forgeries", 2, st, 0, 9, in, real);
  for (auto& c : w) c.close();
}

}  // namespace
