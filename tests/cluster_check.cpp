// nexar-cluster-check: a worker program that checks a cluster formed across processes or
// hosts (tests/multiprocess_test.sh, tests/netns_test.sh).
//
//   nexar-cluster-check [--quick] [--allreduce-only] [--bytes N] [--soak SECONDS] [--peer-stats]
//                       [--grow N] [--links]
//
// Each process joins the cluster described by its environment (nexar::join_from_env():
// NEXAR_SEED_ADDR, NEXAR_CLUSTER_TOKEN, NEXAR_SEED_FINGERPRINT, NEXAR_RANK, NEXAR_WORLD_SIZE,
// ...), runs a battery of operations and checks every result against a reference it computes
// itself, without communication: every input element is a pure function of (case, count,
// rank, salt, index) (a splitmix64 hash), so each rank can generate any other rank's input.
// Value ranges are chosen so that every reference is exact (integer-valued floats whose sums
// are representable; integer sums that do not overflow or wrap by definition), and results
// are compared with ==.
//
// Battery (world W; "big" sizes are skipped with --quick):
//  * p2p ring: send to rank+1, receive from rank-1, 0 B, 1 B, 1000 B, 100 KiB, 3 MiB (big)
//    on the data lane, 100 KiB and 3 MiB (big) on the bulk lane, and 8 messages on one tag
//    that must arrive in order;
//  * RPC: every rank calls a handler on every rank (itself included);
//  * every collective at counts 0, 1, 7 and 1000 (and 300007, big): all_reduce (f32 sum,
//    i64 max in place, f64 avg), broadcast (root W-1), reduce (u64 sum, root 1 % W),
//    all_gather, reduce_scatter (f32 sum, block_of), all_to_all, gather, scatter, scan (f32
//    sum, f64 avg), exclusive_scan (i64 sum; rank 0's buffer untouched), barrier, the
//    v-forms (all_gather_v, gather_v, scatter_v, all_to_all_v, with gaps between the blocks
//    that must stay untouched); all_reduce also at 1,000,003 elements (or --bytes N);
//  * split into even and odd ranks (reverse order by key) and an all_reduce on each half.
// --allreduce-only: only all_reduce (f32 sum, i64 max, f64 avg) at 1, 7, 1000, 65539 and
// the big count.
// --soak SECONDS: instead of the battery, for SECONDS: a bulk transfer around the ring (8 MiB
// messages, each checked) keeps the links busy on two threads, while the main thread runs
// and checks all_reduce (f32 sum 65539, i64 max 7, f64 avg 1000) over and over. Any error,
// a false failure declaration included, fails the run (tests/netns_test.sh runs it under
// random datagram loss).
// --peer-stats: instead of the battery, every rank sends 4 MiB (checked) to every other on
// the bulk lane, then prints its Communicator::stats() of each peer, by world rank, as
// "rank R: peer-stats: lost L0 L1 ... rtt_us T0 T1 ..." ("-" for itself) (tests/netns_test.sh
// drops datagrams arriving at one host only, and checks that only its peers count losses).
//
// --grow N (an elastic cluster, NEXAR_ELASTIC=1 or nexar-seed --elastic): the members wait
// until N joiners are ready on each of them and grow() them in; a process that joins the
// running job instead returns from join_from_env() inside that grow. Then everyone runs the
// battery on the grown communicator (tests/elastic_grow_test.sh, tests/netns_elastic_test.sh).
// --links: at the end (of the battery, or of what an option runs instead), "rank R: links:
// P=quic+tcp ..." names what carries each peer's lanes (PeerStats::links);
// tests/netns_elastic_test.sh checks it under NEXAR_LINK=tcp.
//
// Output: failures as "rank R: <what>: element I is X expected Y", then one line per rank,
// "rank R/W: N checks passed" (or "rank R/W: F of N checks FAILED"). Exit status 0 only when
// every check passed; a nexar::Error prints its what() and exits 1; bad usage exits 2.
#include <nexar/cluster.hpp>
#include <nexar/nexar.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

using nexar::Communicator;
using nexar::DataType;
using nexar::ReduceOp;

// ---- deterministic inputs ----------------------------------------------------------------

/// The splitmix64 finaliser.
constexpr std::uint64_t mix64(std::uint64_t z) noexcept {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

constexpr std::uint64_t kGamma = 0x9e3779b97f4a7c15ULL;

/// Which operation an input belongs to (part of every input's seed).
enum class Case : std::uint64_t {
  ring = 1, ring_bulk, ring_order, rpc, ar_f32, ar_i64, ar_f64, bcast, reduce, all_gather,
  reduce_scatter, all_to_all, gather, scatter, scan_f32, scan_f64, exscan, all_gather_v,
  gather_v, scatter_v, all_to_all_v, split,
};

/// Element `i` of the splitmix64 stream of (case, count, rank, salt): random access, so
/// any rank can compute any element of any rank's input.
std::uint64_t rnd(Case c, std::uint64_t count, int rank, std::uint64_t salt, std::uint64_t i) {
  std::uint64_t seed = mix64(static_cast<std::uint64_t>(c) * 0x100000001b3ULL ^ count);
  seed = mix64(seed ^ (static_cast<std::uint64_t>(rank) + 1) * 0xd6e8feb86659fd93ULL);
  seed = mix64(seed ^ salt * 0xa0761d6478bd642fULL);
  return mix64(seed + (i + 1) * kGamma);
}

// Value maps from 64 random bits; each keeps every reference below exact.
float f32_of(std::uint64_t x) { return static_cast<float>(static_cast<int>(x % 2048) - 1024); }
double f64_of(std::uint64_t x) {
  return static_cast<double>(static_cast<std::int64_t>(x >> 43) - (std::int64_t{1} << 20));
}
std::int64_t i64_of(std::uint64_t x) { return static_cast<std::int64_t>(x); }
std::int64_t i64_small(std::uint64_t x) {  // |v| < 2^40: sums of any world fit
  return static_cast<std::int64_t>(x >> 24) - (std::int64_t{1} << 39);
}
std::int32_t i32_of(std::uint64_t x) { return static_cast<std::int32_t>(x >> 32); }
std::uint32_t u32_of(std::uint64_t x) { return static_cast<std::uint32_t>(x >> 32); }
std::uint64_t u64_of(std::uint64_t x) { return x; }

/// `n` elements of (case, count, rank, salt) mapped by `f`.
template <class F>
auto input(Case c, std::size_t count, int rank, std::uint64_t salt, std::size_t n, F f) {
  using T = decltype(f(std::uint64_t{}));
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = f(rnd(c, count, rank, salt, i));
  return v;
}

/// A value no correct result contains (outside every generator's range, or improbable).
template <class T>
T poison() {
  if constexpr (std::is_floating_point_v<T>)
    return static_cast<T>(-7.0e6);
  else
    return static_cast<T>(std::numeric_limits<T>::max() - 5);
}

template <class T>
std::string show(T v) {
  std::ostringstream os;
  if constexpr (std::is_floating_point_v<T>) {
    os.precision(17);
    os << v;
  } else if constexpr (sizeof(T) == 1) {
    os << static_cast<int>(v);
  } else {
    os << v;
  }
  return os.str();
}

// ---- checks --------------------------------------------------------------------------------

class Checker {
 public:
  Checker(int rank, int world) : rank_(rank), world_(world) {}

  /// Compares got[0..n) with want(i), counting one check; records the first mismatch.
  template <class T, class Want>
  void elements(const std::string& what, const T* got, std::size_t n, Want&& want) {
    ++checks_;
    std::size_t bad = 0;
    std::string first;
    for (std::size_t i = 0; i < n; ++i) {
      const T w = static_cast<T>(want(i));
      if (got[i] == w) continue;
      if (bad++ == 0)
        first = "element " + std::to_string(i) + " is " + show(got[i]) + " expected " + show(w);
    }
    if (bad == 0) return;
    if (bad > 1) first += " (" + std::to_string(bad) + " of " + std::to_string(n) + " wrong)";
    fail(what + ": " + first);
  }

  /// Counts one check that passes when `ok`.
  void expect(bool ok, const std::string& what) {
    ++checks_;
    if (!ok) fail(what);
  }

  /// Counts one check that needed no comparison (barrier).
  void passed() { ++checks_; }

  int failures() const { return static_cast<int>(failures_.size()); }

  void report() const {
    for (const auto& f : failures_) std::printf("rank %d: %s\n", rank_, f.c_str());
    if (failures_.empty())
      std::printf("rank %d/%d: %d checks passed\n", rank_, world_, checks_);
    else
      std::printf("rank %d/%d: %d of %d checks FAILED\n", rank_, world_, failures(), checks_);
    std::fflush(stdout);
  }

 private:
  void fail(std::string msg) {
    failures_.push_back(std::move(msg));
    // Also say it at once, so a hang later still leaves the failure visible.
    std::fprintf(stderr, "rank %d: %s\n", rank_, failures_.back().c_str());
  }

  int rank_, world_;
  int checks_ = 0;
  std::vector<std::string> failures_;
};

std::string ctx(const char* what, std::size_t count) {
  return std::string(what) + " count " + std::to_string(count);
}

// ---- options -------------------------------------------------------------------------------

struct Options {
  bool quick = false;
  bool allreduce_only = false;
  std::uint64_t big_bytes = 0;  // 0: the big all_reduce has kBigCount elements
  int soak_seconds = 0;         // > 0: run soak() instead of the battery
  bool peer_stats = false;      // run peer_stats() instead of the battery
  int grow = 0;                 // > 0: members grow by this many joiners first (elastic)
  bool links = false;           // after the battery, print what carries each peer's lanes
};

constexpr std::size_t kBigCount = 1000003;
constexpr std::size_t kMidCount = 300007;

/// "1048576", "4K", "16M", "1G" (powers of 1024). Returns 0 on anything else.
std::uint64_t parse_bytes(std::string_view s) {
  if (s.empty()) return 0;
  std::uint64_t mult = 1;
  switch (s.back()) {
    case 'k': case 'K': mult = 1ULL << 10; s.remove_suffix(1); break;
    case 'm': case 'M': mult = 1ULL << 20; s.remove_suffix(1); break;
    case 'g': case 'G': mult = 1ULL << 30; s.remove_suffix(1); break;
    default: break;
  }
  if (s.empty() || s.size() > 12) return 0;
  std::uint64_t v = 0;
  for (char ch : s) {
    if (ch < '0' || ch > '9') return 0;
    v = v * 10 + static_cast<std::uint64_t>(ch - '0');
  }
  return v * mult;
}

/// Elements of the big all_reduce for elements of `elem` bytes.
std::size_t big_count(const Options& o, std::size_t elem) {
  return o.big_bytes ? static_cast<std::size_t>(o.big_bytes / elem) : kBigCount;
}

// ---- the battery ---------------------------------------------------------------------------

class Battery {
 public:
  Battery(Communicator& c, const Options& o)
      : c_(c), o_(o), me_(c.rank()), n_(c.size()), check_(me_, n_) {}

  Checker& checker() { return check_; }

  void run() {
    run_mode();
    if (o_.links) print_links();
  }

 private:
  // The battery, or what an option runs instead of it.
  void run_mode() {
    if (o_.soak_seconds > 0) {
      soak();
      return;
    }
    if (o_.peer_stats) {
      peer_stats();
      return;
    }
    if (o_.allreduce_only) {
      for (std::size_t count : {std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{65539}})
        all_reduce(count, count, count);
      if (!o_.quick) all_reduce(big_count(o_, 4), big_count(o_, 8), big_count(o_, 8));
      c_.barrier();
      check_.passed();
      return;
    }
    p2p_ring();
    rpc();
    std::vector<std::size_t> counts{0, 1, 7, 1000};
    if (!o_.quick) counts.push_back(kMidCount);
    for (std::size_t count : counts) {
      all_reduce(count, count, count);
      broadcast(count);
      reduce(count);
      all_gather(count);
      reduce_scatter(count);
      all_to_all(count);
      gather(count);
      scatter(count);
      scan(count);
      exclusive_scan(count);
      c_.barrier();
      check_.passed();
      all_gather_v(count);
      gather_v(count);
      scatter_v(count);
      all_to_all_v(count);
    }
    if (!o_.quick) all_reduce(big_count(o_, 4), big_count(o_, 8), big_count(o_, 8));
    split();
    c_.barrier();  // nobody closes while a peer still waits for its last messages
    check_.passed();
  }

  // Bulk payload word i of round `round` from rank `from`.
  static std::uint32_t bulk_word(std::uint32_t round, int from, std::size_t i) {
    return round * 2654435761u ^ static_cast<std::uint32_t>(from) * 40503u ^ static_cast<std::uint32_t>(i);
  }

  void peer_stats() {
    constexpr std::size_t kWords = (4u << 20) / 4;
    // Each rank sends to rank me+k while it receives from rank me-k, k = 1 .. n-1.
    for (int k = 1; k < n_; ++k) {
      const int to = (me_ + k) % n_, from = (me_ + n_ - k) % n_;
      std::vector<std::uint32_t> out(kWords), in(kWords);
      for (std::size_t i = 0; i < kWords; ++i) out[i] = bulk_word(static_cast<std::uint32_t>(k), me_, i);
      nexar::Request r = c_.ibulk_send(to, 910, out.data(), out.size() * 4);
      c_.bulk_recv(from, 910, in);
      r.wait();
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < kWords; ++i) wrong += in[i] != bulk_word(static_cast<std::uint32_t>(k), from, i);
      check_.expect(wrong == 0, "peer-stats: " + std::to_string(wrong) + " words from rank " + std::to_string(from) +
                                    " are wrong");
    }
    const nexar::Stats s = c_.stats();
    std::string lost = " lost", rtt = " rtt_us";
    std::size_t next_peer = 0;
    for (int r = 0; r < n_; ++r) {
      if (r == me_) {
        lost += " -";
        rtt += " -";
        continue;
      }
      const nexar::PeerStats& p = s.peers.at(next_peer++);
      check_.expect(p.rank == r && p.connected, "peer-stats: rank " + std::to_string(r) + " is connected");
      // Appended piece by piece: GCC 12 warns (-Wrestrict) on " " + std::to_string(...).
      lost += ' ';
      lost += std::to_string(p.lost_packets);
      rtt += ' ';
      rtt += std::to_string(std::chrono::duration_cast<std::chrono::microseconds>(p.rtt).count());
    }
    std::fprintf(stderr, "rank %d: peer-stats:%s%s\n", me_, lost.c_str(), rtt.c_str());
    c_.barrier();
    check_.passed();
  }

  // "rank R: links: 0=quic+tcp 2=quic+shm ..." (Communicator::stats()), for scripts that
  // check which carrier a pair ended up on.
  void print_links() {
    std::string line;
    for (const nexar::PeerStats& p : c_.stats().peers) {
      line += ' ';
      line += std::to_string(p.rank);
      line += '=';
      for (std::size_t i = 0; i < p.links.size(); ++i) {
        if (i) line += '+';
        line += p.links[i];
      }
    }
    std::fprintf(stderr, "rank %d: links:%s\n", me_, line.c_str());
  }

  void soak() {
    constexpr std::size_t kWords = (8u << 20) / 4;
    std::atomic<bool> stop{false};
    std::string send_error, recv_error;
    std::uint32_t sent = 0, received = 0;
    // The sender says before each message whether one follows, so both ends stop together.
    std::thread sender([&] {
      try {
        std::vector<std::uint32_t> buf(kWords);
        for (;; ++sent) {
          const std::uint8_t more = stop.load() ? 0 : 1;
          c_.send(next(), 900, &more, 1);
          if (!more) break;
          for (std::size_t i = 0; i < kWords; ++i) buf[i] = bulk_word(sent, me_, i);
          c_.bulk_send(next(), 901, buf);
        }
      } catch (const std::exception& e) {
        send_error = e.what();
      }
    });
    std::thread receiver([&] {
      try {
        std::vector<std::uint32_t> buf(kWords);
        for (;; ++received) {
          std::uint8_t more = 0;
          c_.recv(prev(), 900, &more, 1);
          if (!more) break;
          c_.bulk_recv(prev(), 901, buf);
          for (std::size_t i = 0; i < kWords; ++i) {
            if (buf[i] != bulk_word(received, prev(), i)) {
              recv_error = "bulk message " + std::to_string(received) + " word " + std::to_string(i) + " is wrong";
              stop.store(true);
              return;
            }
          }
        }
      } catch (const std::exception& e) {
        recv_error = e.what();
      }
    });
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(o_.soak_seconds);
    int rounds = 0;
    try {
      for (;; ++rounds) {
        all_reduce(65539, 7, 1000);
        // Rank 0's clock decides when everyone stops, in the same round.
        std::int64_t done = me_ == 0 && std::chrono::steady_clock::now() >= end ? 1 : 0;
        c_.all_reduce(std::span(&done, 1), ReduceOp::max);
        if (done) break;
      }
    } catch (...) {
      stop.store(true);
      sender.join();
      receiver.join();
      throw;
    }
    stop.store(true);
    sender.join();
    receiver.join();
    check_.expect(send_error.empty(), "soak bulk send: " + send_error);
    check_.expect(recv_error.empty(), "soak bulk receive: " + recv_error);
    std::fprintf(stderr, "rank %d: soak: %d all_reduce rounds, %u bulk messages sent, %u received\n", me_, rounds,
                 sent, received);
    c_.barrier();
    check_.passed();
  }

  std::size_t un() const { return static_cast<std::size_t>(n_); }
  int next() const { return (me_ + 1) % n_; }
  int prev() const { return (me_ + n_ - 1) % n_; }

  // -- point to point --

  static std::byte byte_of(Case c, std::size_t size, int rank, std::size_t i) {
    return static_cast<std::byte>(rnd(c, size, rank, 0, i) & 0xff);
  }

  void p2p_ring() {
    if (n_ < 2) return;
    std::vector<std::size_t> sizes{0, 1, 1000, 100 * 1024};
    if (!o_.quick) sizes.push_back(3 * 1024 * 1024);
    int tag = 100;
    for (std::size_t size : sizes) ring_one(Case::ring, size, tag++, false);
    ring_one(Case::ring_bulk, 100 * 1024, tag++, true);
    if (!o_.quick) ring_one(Case::ring_bulk, 3 * 1024 * 1024, tag++, true);

    // Non-overtaking: 8 messages on one tag, eager and rendezvous mixed, arrive in order.
    constexpr int kMsgs = 8;
    const std::size_t lens[kMsgs] = {8, 70000, 16, 1000, 200000, 8, 64 * 1024, 65 * 1024};
    std::vector<std::vector<std::uint64_t>> out(kMsgs);
    std::vector<nexar::Request> sends;
    for (int k = 0; k < kMsgs; ++k) {
      out[static_cast<std::size_t>(k)] = input(Case::ring_order, lens[k], me_, static_cast<std::uint64_t>(k),
                                               lens[k] / 8, u64_of);
      sends.push_back(c_.isend(next(), tag, out[static_cast<std::size_t>(k)].data(), lens[k]));
    }
    std::vector<std::uint64_t> in(200000 / 8);
    for (int k = 0; k < kMsgs; ++k) {
      std::fill(in.begin(), in.end(), poison<std::uint64_t>());
      nexar::Status s = c_.recv(prev(), tag, in.data(), in.size() * 8);
      const std::string what = "p2p ring order message " + std::to_string(k);
      check_.expect(s.source == prev() && s.tag == tag && s.bytes == lens[k],
                    what + ": got " + std::to_string(s.bytes) + " B from rank " +
                        std::to_string(s.source) + " tag " + std::to_string(s.tag) + ", expected " +
                        std::to_string(lens[k]) + " B from rank " + std::to_string(prev()) +
                        " tag " + std::to_string(tag));
      if (s.bytes == lens[k])
        check_.elements(what, in.data(), lens[k] / 8, [&](std::size_t i) {
          return rnd(Case::ring_order, lens[k], prev(), static_cast<std::uint64_t>(k), i);
        });
    }
    for (auto& r : sends) r.wait();
  }

  void ring_one(Case c, std::size_t size, int tag, bool bulk) {
    std::vector<std::byte> out(size), in(size + 64, std::byte{0xee});
    for (std::size_t i = 0; i < size; ++i) out[i] = byte_of(c, size, me_, i);
    nexar::Request sent = bulk ? c_.ibulk_send(next(), tag, out.data(), size)
                               : c_.isend(next(), tag, out.data(), size);
    nexar::Status s = bulk ? c_.bulk_recv(prev(), tag, in.data(), in.size())
                           : c_.recv(prev(), tag, in.data(), in.size());
    sent.wait();
    const std::string what = std::string(bulk ? "p2p ring (bulk) " : "p2p ring ") +
                             std::to_string(size) + " B";
    check_.expect(s.source == prev() && s.tag == tag && s.bytes == size,
                  what + ": got " + std::to_string(s.bytes) + " B from rank " +
                      std::to_string(s.source) + " tag " + std::to_string(s.tag));
    check_.elements(what, in.data(), size + 64, [&](std::size_t i) {
      return i < size ? byte_of(c, size, prev(), i) : std::byte{0xee};
    });
  }

  // -- RPC --

  static constexpr nexar::RpcId kRpcId = 0x4e58;

  static std::vector<std::byte> rpc_args(int caller, int dest) {
    const std::size_t len = 1 + 97 * static_cast<std::size_t>(dest);
    std::vector<std::byte> a(len);
    for (std::size_t i = 0; i < len; ++i)
      a[i] = static_cast<std::byte>(rnd(Case::rpc, len, caller, static_cast<std::uint64_t>(dest), i) & 0xff);
    return a;
  }

  void rpc() {
    const int me = me_;
    // Reply: caller (4 bytes), callee (4 bytes), then the argument bytes xor 0xa5.
    c_.register_rpc(kRpcId, [me](int caller, std::span<const std::byte> args) {
      std::vector<std::byte> r(8 + args.size());
      const std::int32_t ids[2] = {caller, me};
      std::memcpy(r.data(), ids, 8);
      for (std::size_t i = 0; i < args.size(); ++i) r[8 + i] = args[i] ^ std::byte{0xa5};
      return r;
    });
    c_.barrier();  // every handler is in place before anyone calls
    for (int d = 0; d < n_; ++d) {
      const auto args = rpc_args(me_, d);
      const std::vector<std::byte> reply = c_.rpc(d, kRpcId, args);
      const std::string what = "rpc to rank " + std::to_string(d);
      std::int32_t ids[2] = {-1, -1};
      if (reply.size() >= 8) std::memcpy(ids, reply.data(), 8);
      check_.expect(reply.size() == 8 + args.size() && ids[0] == me_ && ids[1] == d,
                    what + ": reply of " + std::to_string(reply.size()) + " B says caller " +
                        std::to_string(ids[0]) + " callee " + std::to_string(ids[1]) +
                        ", expected " + std::to_string(8 + args.size()) + " B, caller " +
                        std::to_string(me_) + " callee " + std::to_string(d));
      if (reply.size() == 8 + args.size())
        check_.elements(what, reply.data() + 8, args.size(),
                        [&](std::size_t i) { return args[i] ^ std::byte{0xa5}; });
    }
    c_.barrier();  // every call is answered before the handler goes
    c_.unregister_rpc(kRpcId);
  }

  // -- collectives --

  void all_reduce(std::size_t nf32, std::size_t ni64, std::size_t nf64) {
    {  // f32 sum of integer values: exact in any order
      auto send = input(Case::ar_f32, nf32, me_, 0, nf32, f32_of);
      std::vector<float> recv(nf32, poison<float>());
      c_.all_reduce(send.data(), recv.data(), nf32, DataType::f32, ReduceOp::sum);
      check_.elements(ctx("all_reduce f32 sum", nf32), recv.data(), nf32, [&](std::size_t i) {
        std::int64_t s = 0;
        for (int r = 0; r < n_; ++r) s += static_cast<std::int64_t>(f32_of(rnd(Case::ar_f32, nf32, r, 0, i)));
        return static_cast<float>(s);
      });
    }
    {  // i64 max, in place
      auto buf = input(Case::ar_i64, ni64, me_, 0, ni64, i64_of);
      c_.all_reduce(buf.data(), buf.data(), ni64, DataType::i64, ReduceOp::max);
      check_.elements(ctx("all_reduce i64 max (in place)", ni64), buf.data(), ni64, [&](std::size_t i) {
        std::int64_t m = std::numeric_limits<std::int64_t>::min();
        for (int r = 0; r < n_; ++r) m = std::max(m, i64_of(rnd(Case::ar_i64, ni64, r, 0, i)));
        return m;
      });
    }
    {  // f64 avg: the integer sum is exact, so sum / n is the correctly rounded quotient
      auto send = input(Case::ar_f64, nf64, me_, 0, nf64, f64_of);
      std::vector<double> recv(nf64, poison<double>());
      c_.all_reduce(send.data(), recv.data(), nf64, DataType::f64, ReduceOp::avg);
      check_.elements(ctx("all_reduce f64 avg", nf64), recv.data(), nf64, [&](std::size_t i) {
        double s = 0;
        for (int r = 0; r < n_; ++r) s += f64_of(rnd(Case::ar_f64, nf64, r, 0, i));
        return s / static_cast<double>(n_);
      });
    }
  }

  void broadcast(std::size_t count) {
    const int root = n_ - 1;
    std::vector<std::uint32_t> buf = me_ == root ? input(Case::bcast, count, root, 0, count, u32_of)
                                                 : std::vector<std::uint32_t>(count, poison<std::uint32_t>());
    c_.broadcast(buf.data(), count, DataType::u32, root);
    check_.elements("broadcast u32 from " + std::to_string(root) + " count " + std::to_string(count),
                    buf.data(), count,
                    [&](std::size_t i) { return u32_of(rnd(Case::bcast, count, root, 0, i)); });
  }

  void reduce(std::size_t count) {
    const int root = 1 % n_;
    auto send = input(Case::reduce, count, me_, 0, count, u64_of);
    std::vector<std::uint64_t> recv(me_ == root ? count : 0, poison<std::uint64_t>());
    c_.reduce(send.data(), me_ == root ? recv.data() : nullptr, count, DataType::u64, ReduceOp::sum, root);
    if (me_ != root) return;
    check_.elements("reduce u64 sum to " + std::to_string(root) + " count " + std::to_string(count),
                    recv.data(), count, [&](std::size_t i) {
                      std::uint64_t s = 0;  // wraps modulo 2^64, as the library's does
                      for (int r = 0; r < n_; ++r) s += rnd(Case::reduce, count, r, 0, i);
                      return s;
                    });
  }

  void all_gather(std::size_t count) {
    auto send = input(Case::all_gather, count, me_, 0, count, i32_of);
    std::vector<std::int32_t> recv(count * un(), poison<std::int32_t>());
    c_.all_gather(send.data(), recv.data(), count, DataType::i32);
    check_.elements(ctx("all_gather i32", count), recv.data(), recv.size(), [&](std::size_t i) {
      return i32_of(rnd(Case::all_gather, count, static_cast<int>(i / count), 0, i % count));
    });
  }

  void reduce_scatter(std::size_t count) {
    auto send = input(Case::reduce_scatter, count, me_, 0, count, f32_of);
    const auto [off, len] = nexar::block_of(count, n_, me_);
    std::vector<float> recv(len, poison<float>());
    c_.reduce_scatter(send.data(), recv.data(), count, DataType::f32, ReduceOp::sum);
    check_.elements(ctx("reduce_scatter f32 sum", count), recv.data(), len, [&, off = off](std::size_t i) {
      std::int64_t s = 0;
      for (int r = 0; r < n_; ++r)
        s += static_cast<std::int64_t>(f32_of(rnd(Case::reduce_scatter, count, r, 0, off + i)));
      return static_cast<float>(s);
    });
  }

  void all_to_all(std::size_t count) {
    auto send = input(Case::all_to_all, count, me_, 0, count * un(), u32_of);
    std::vector<std::uint32_t> recv(count * un(), poison<std::uint32_t>());
    c_.all_to_all(send.data(), recv.data(), count, DataType::u32);
    // recv block i comes from rank i, whose send block me_ it is.
    check_.elements(ctx("all_to_all u32", count), recv.data(), recv.size(), [&](std::size_t i) {
      const int from = static_cast<int>(i / count);
      return u32_of(rnd(Case::all_to_all, count, from, 0, static_cast<std::size_t>(me_) * count + i % count));
    });
  }

  void gather(std::size_t count) {
    const int root = n_ / 2;
    auto send = input(Case::gather, count, me_, 0, count, f64_of);
    std::vector<double> recv(me_ == root ? count * un() : 0, poison<double>());
    c_.gather(send.data(), me_ == root ? recv.data() : nullptr, count, DataType::f64, root);
    if (me_ != root) return;
    check_.elements("gather f64 to " + std::to_string(root) + " count " + std::to_string(count),
                    recv.data(), recv.size(), [&](std::size_t i) {
                      return f64_of(rnd(Case::gather, count, static_cast<int>(i / count), 0, i % count));
                    });
  }

  void scatter(std::size_t count) {
    const int root = (n_ - 1) / 2;
    std::vector<std::int64_t> send;
    if (me_ == root) send = input(Case::scatter, count, root, 0, count * un(), i64_of);
    std::vector<std::int64_t> recv(count, poison<std::int64_t>());
    c_.scatter(me_ == root ? send.data() : nullptr, recv.data(), count, DataType::i64, root);
    check_.elements("scatter i64 from " + std::to_string(root) + " count " + std::to_string(count),
                    recv.data(), count, [&](std::size_t i) {
                      return i64_of(rnd(Case::scatter, count, root, 0, static_cast<std::size_t>(me_) * count + i));
                    });
  }

  void scan(std::size_t count) {
    {
      auto send = input(Case::scan_f32, count, me_, 0, count, f32_of);
      std::vector<float> recv(count, poison<float>());
      c_.scan(send.data(), recv.data(), count, DataType::f32, ReduceOp::sum);
      check_.elements(ctx("scan f32 sum", count), recv.data(), count, [&](std::size_t i) {
        std::int64_t s = 0;
        for (int r = 0; r <= me_; ++r) s += static_cast<std::int64_t>(f32_of(rnd(Case::scan_f32, count, r, 0, i)));
        return static_cast<float>(s);
      });
    }
    {  // avg over ranks 0..me: the exact integer sum divided by me + 1
      auto send = input(Case::scan_f64, count, me_, 0, count, f64_of);
      std::vector<double> recv(count, poison<double>());
      c_.scan(send.data(), recv.data(), count, DataType::f64, ReduceOp::avg);
      check_.elements(ctx("scan f64 avg", count), recv.data(), count, [&](std::size_t i) {
        double s = 0;
        for (int r = 0; r <= me_; ++r) s += f64_of(rnd(Case::scan_f64, count, r, 0, i));
        return s / static_cast<double>(me_ + 1);
      });
    }
  }

  void exclusive_scan(std::size_t count) {
    auto send = input(Case::exscan, count, me_, 0, count, i64_small);
    std::vector<std::int64_t> recv(count, poison<std::int64_t>());
    c_.exclusive_scan(send.data(), recv.data(), count, DataType::i64, ReduceOp::sum);
    check_.elements(ctx("exclusive_scan i64 sum", count), recv.data(), count, [&](std::size_t i) {
      if (me_ == 0) return poison<std::int64_t>();  // left unchanged
      std::int64_t s = 0;
      for (int r = 0; r < me_; ++r) s += i64_small(rnd(Case::exscan, count, r, 0, i));
      return s;
    });
  }

  // -- v-forms: rank-dependent counts (some zero), one element of gap between blocks --

  /// Elements rank `r` contributes (all_gather_v, gather_v, scatter_v) for base `count`.
  static std::size_t vcount(std::size_t count, int r) {
    return (count + static_cast<std::size_t>(r)) % (count + 1);
  }
  /// Elements rank `from` sends to rank `to` in all_to_all_v.
  static std::size_t a2a_count(std::size_t count, int from, int to) {
    return (count + static_cast<std::size_t>(from) + 2 * static_cast<std::size_t>(to)) % (count + 1);
  }
  /// Displacements with one element of gap after each block; returns the total span.
  static std::size_t gapped(const std::vector<std::size_t>& counts, std::vector<std::size_t>& displs) {
    displs.assign(counts.size(), 0);
    std::size_t at = 0;
    for (std::size_t i = 0; i < counts.size(); ++i) {
      displs[i] = at;
      at += counts[i] + 1;
    }
    return at;
  }
  /// For a gapped layout: the rank whose block holds element `i`, and the index in it
  /// (-1 for a gap element).
  static std::pair<int, std::size_t> locate(const std::vector<std::size_t>& counts,
                                            const std::vector<std::size_t>& displs, std::size_t i) {
    for (std::size_t r = 0; r < counts.size(); ++r)
      if (i >= displs[r] && i < displs[r] + counts[r]) return {static_cast<int>(r), i - displs[r]};
    return {-1, 0};
  }

  void all_gather_v(std::size_t count) {
    std::vector<std::size_t> counts(un()), displs;
    for (int r = 0; r < n_; ++r) counts[static_cast<std::size_t>(r)] = vcount(count, r);
    const std::size_t span = gapped(counts, displs);
    auto send = input(Case::all_gather_v, count, me_, 0, counts[static_cast<std::size_t>(me_)], u64_of);
    std::vector<std::uint64_t> recv(span, poison<std::uint64_t>());
    c_.iall_gather_v(send.data(), send.size(), recv.data(), counts, displs, DataType::u64).wait();
    check_.elements(ctx("all_gather_v u64", count), recv.data(), span, [&](std::size_t i) {
      const auto [r, k] = locate(counts, displs, i);
      return r < 0 ? poison<std::uint64_t>() : rnd(Case::all_gather_v, count, r, 0, k);
    });
  }

  void gather_v(std::size_t count) {
    const int root = n_ - 1;
    std::vector<std::size_t> counts(un()), displs;
    for (int r = 0; r < n_; ++r) counts[static_cast<std::size_t>(r)] = vcount(count, n_ - 1 - r);
    const std::size_t span = gapped(counts, displs);
    auto send = input(Case::gather_v, count, me_, 0, counts[static_cast<std::size_t>(me_)], i32_of);
    std::vector<std::int32_t> recv(me_ == root ? span : 0, poison<std::int32_t>());
    c_.igather_v(send.data(), send.size(), me_ == root ? recv.data() : nullptr, counts, displs,
                 DataType::i32, root)
        .wait();
    if (me_ != root) return;
    check_.elements("gather_v i32 to " + std::to_string(root) + " count " + std::to_string(count),
                    recv.data(), span, [&](std::size_t i) {
                      const auto [r, k] = locate(counts, displs, i);
                      return r < 0 ? poison<std::int32_t>() : i32_of(rnd(Case::gather_v, count, r, 0, k));
                    });
  }

  void scatter_v(std::size_t count) {
    const int root = 0;
    std::vector<std::size_t> counts(un()), displs;
    for (int r = 0; r < n_; ++r) counts[static_cast<std::size_t>(r)] = vcount(count, r + 1);
    const std::size_t span = gapped(counts, displs);
    std::vector<float> send;
    if (me_ == root) send = input(Case::scatter_v, count, root, 0, span, f32_of);
    const std::size_t mine = counts[static_cast<std::size_t>(me_)];
    std::vector<float> recv(mine + 1, poison<float>());  // one extra element must stay untouched
    c_.iscatter_v(me_ == root ? send.data() : nullptr, counts, displs, recv.data(), mine,
                  DataType::f32, root)
        .wait();
    const std::size_t base = displs[static_cast<std::size_t>(me_)];
    check_.elements("scatter_v f32 from " + std::to_string(root) + " count " + std::to_string(count),
                    recv.data(), mine + 1, [&](std::size_t i) {
                      return i < mine ? f32_of(rnd(Case::scatter_v, count, root, 0, base + i)) : poison<float>();
                    });
  }

  void all_to_all_v(std::size_t count) {
    std::vector<std::size_t> sc(un()), rc(un()), sd, rd;
    for (int j = 0; j < n_; ++j) {
      sc[static_cast<std::size_t>(j)] = a2a_count(count, me_, j);
      rc[static_cast<std::size_t>(j)] = a2a_count(count, j, me_);
    }
    const std::size_t sspan = gapped(sc, sd), rspan = gapped(rc, rd);
    // Block for rank j: elements of (case, count, me_, salt j); gaps hold poison.
    std::vector<std::int32_t> send(sspan, poison<std::int32_t>());
    for (int j = 0; j < n_; ++j)
      for (std::size_t k = 0; k < sc[static_cast<std::size_t>(j)]; ++k)
        send[sd[static_cast<std::size_t>(j)] + k] =
            i32_of(rnd(Case::all_to_all_v, count, me_, static_cast<std::uint64_t>(j), k));
    std::vector<std::int32_t> recv(rspan, poison<std::int32_t>());
    c_.iall_to_all_v(send.data(), sc, sd, recv.data(), rc, rd, DataType::i32).wait();
    check_.elements(ctx("all_to_all_v i32", count), recv.data(), rspan, [&](std::size_t i) {
      const auto [from, k] = locate(rc, rd, i);
      return from < 0 ? poison<std::int32_t>()
                      : i32_of(rnd(Case::all_to_all_v, count, from, static_cast<std::uint64_t>(me_), k));
    });
  }

  // -- split --

  void split() {
    // Even and odd ranks; key = -rank orders each half by descending world rank.
    const int color = me_ % 2;
    Communicator sub = c_.split(color, -me_);
    std::vector<int> members;  // world ranks of my half, in sub-rank order
    for (int r = n_ - 1; r >= 0; --r)
      if (r % 2 == color) members.push_back(r);
    const int want_rank = static_cast<int>(std::find(members.begin(), members.end(), me_) - members.begin());
    check_.expect(sub.is_open() && sub.size() == static_cast<int>(members.size()) && sub.rank() == want_rank,
                  "split(" + std::to_string(color) + ", " + std::to_string(-me_) + "): got rank " +
                      std::to_string(sub.is_open() ? sub.rank() : -1) + " of " +
                      std::to_string(sub.is_open() ? sub.size() : -1) + ", expected " +
                      std::to_string(want_rank) + " of " + std::to_string(members.size()));
    if (!sub.is_open() || sub.size() != static_cast<int>(members.size())) return;
    for (std::size_t count : {std::size_t{1}, std::size_t{7}, std::size_t{1000}}) {
      auto send = input(Case::split, count, me_, 0, count, f32_of);
      std::vector<float> recv(count, poison<float>());
      sub.all_reduce(send.data(), recv.data(), count, DataType::f32, ReduceOp::sum);
      check_.elements(ctx(color == 0 ? "split even all_reduce f32 sum" : "split odd all_reduce f32 sum", count),
                      recv.data(), count, [&](std::size_t i) {
                        std::int64_t s = 0;
                        for (int r : members) s += static_cast<std::int64_t>(f32_of(rnd(Case::split, count, r, 0, i)));
                        return static_cast<float>(s);
                      });
    }
    sub.barrier();
    check_.passed();
    sub.close();
  }

  Communicator& c_;
  const Options& o_;
  int me_, n_;
  Checker check_;
};

void usage(std::FILE* f) {
  std::fprintf(f,
               "usage: nexar-cluster-check [--quick] [--allreduce-only] [--bytes N] [--soak SECONDS] [--peer-stats]\n"
               "                           [--grow N] [--links]\n"
               "  Joins the cluster described by the NEXAR_* environment (nexar::join_from_env)\n"
               "  and checks p2p, RPC and every collective against locally computed references.\n"
               "  --quick           skip the big sizes (3 MiB p2p, 300007 and 1000003 elements)\n"
               "  --allreduce-only  only all_reduce (f32 sum, i64 max, f64 avg) at a few sizes\n"
               "  --bytes N         bytes of the big all_reduce (K, M, G suffixes; default\n"
               "                    1000003 elements)\n"
               "  --soak SECONDS    instead: bulk transfers around the ring and checked\n"
               "                    all_reduces for SECONDS; any error fails\n"
               "  --peer-stats      instead: 4 MiB to every rank, then each peer's lost\n"
               "                    packets and RTT from Communicator::stats()\n"
               "  --grow N          (elastic cluster) members wait for N joiners and grow them\n"
               "                    in first; joiners of the running job arrive through it\n"
               "  --links           at the end, print 'rank R: links: P=quic+tcp ...':\n"
               "                    what carries each peer's lanes (Communicator::stats())\n"
               "Exit status: 0 all checks passed, 1 a check failed or a nexar::Error, 2 usage.\n");
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--quick") {
      o.quick = true;
    } else if (a == "--allreduce-only") {
      o.allreduce_only = true;
    } else if (a == "--bytes" && i + 1 < argc) {
      o.big_bytes = parse_bytes(argv[++i]);
      if (o.big_bytes == 0) {
        std::fprintf(stderr, "nexar-cluster-check: --bytes wants a positive size, not '%s'\n", argv[i]);
        return 2;
      }
    } else if (a == "--soak" && i + 1 < argc) {
      o.soak_seconds = std::atoi(argv[++i]);
      if (o.soak_seconds <= 0) {
        std::fprintf(stderr, "nexar-cluster-check: --soak wants a positive number of seconds, not '%s'\n", argv[i]);
        return 2;
      }
    } else if (a == "--peer-stats") {
      o.peer_stats = true;
    } else if (a == "--links") {
      o.links = true;
    } else if (a == "--grow" && i + 1 < argc) {
      o.grow = std::atoi(argv[++i]);
      if (o.grow <= 0) {
        std::fprintf(stderr, "nexar-cluster-check: --grow wants a positive number of joiners, not '%s'\n", argv[i]);
        return 2;
      }
    } else if (a == "-h" || a == "--help") {
      usage(stdout);
      return 0;
    } else {
      std::fprintf(stderr, "nexar-cluster-check: unknown argument '%s'\n", argv[i]);
      usage(stderr);
      return 2;
    }
  }

  Communicator comm;
  int rank = -1;
  try {
    const auto t0 = std::chrono::steady_clock::now();
    comm = nexar::join_from_env();
    rank = comm.rank();
    if (o.grow > 0 && !comm.joined_by_grow()) {
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while (comm.pending_joiners() < o.grow) {
        if (std::chrono::steady_clock::now() > give_up)
          throw std::runtime_error("--grow: " + std::to_string(comm.pending_joiners()) + " of " +
                                   std::to_string(o.grow) + " joiners ready after 60 s");
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      const int before = comm.size();
      comm = comm.grow();
      std::fprintf(stderr, "rank %d: grew from %d to %d ranks\n", comm.rank(), before, comm.size());
    }
    rank = comm.rank();
    const auto joined = std::chrono::steady_clock::now();
    Battery b(comm, o);
    b.run();
    const auto done = std::chrono::steady_clock::now();
    comm.close();
    const auto ms = [](auto d) { return std::chrono::duration_cast<std::chrono::milliseconds>(d).count(); };
    std::fprintf(stderr, "rank %d: joined in %lld ms, battery took %lld ms\n", rank,
                 static_cast<long long>(ms(joined - t0)), static_cast<long long>(ms(done - joined)));
    b.checker().report();
    return b.checker().failures() == 0 ? 0 : 1;
  } catch (const nexar::Error& e) {
    if (rank >= 0)
      std::printf("rank %d: error (%s): %s\n", rank, nexar::to_string(e.code()), e.what());
    else
      std::printf("nexar-cluster-check: join failed (%s): %s\n", nexar::to_string(e.code()), e.what());
  } catch (const std::exception& e) {
    std::printf("%s%d: error: %s\n", rank >= 0 ? "rank " : "nexar-cluster-check: rank ", rank, e.what());
  }
  std::fflush(stdout);
  try {
    comm.close();
  } catch (const std::exception&) {
  }
  return 1;
}
