// The collective algorithms (src/collective) over an in-memory port (memory_port.hpp): every
// collective, every algorithm it can be forced to and the automatic choice, the mailbox
// forms among them, at worlds 1 to 9, against references computed here with plain loops
// (collective_support.hpp): random data, odd counts, 0 and 1 element, every element type
// and reduction (fewer pairs under a sanitizer: for_types_and_ops). No network and no shared memory: it runs in seconds, and under
// `unshare -n` too. The same collectives over QUIC are collective_test.cpp's.
#include <gtest/gtest.h>

#include <nexar/collective.hpp>

#include <condition_variable>
#include <functional>
#include <mutex>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "collective/collectives.hpp"
#include "collective_support.hpp"
#include "memory_port.hpp"
#include "support.hpp"

namespace {

using namespace nexar;
using namespace nexar::coll_test;
using nexar::testing::MemoryPort;
using nexar::testing::MemoryWorld;
namespace coll = nexar::detail::coll;

constexpr int kMaxWorld = 9;

Config port_config(bool mailboxes) {
  Config c = test_config();
  c.op_timeout = 10s;  // a hang fails the test instead
  c.shm = mailboxes;
  c.tuning.segment_bytes = 1024;  // pipelined rings already at a few thousand elements
  return c;
}

/// One thread per rank, kept for the whole test program: a new thread per rank and call
/// (tens of thousands of them) spent most of this file's time creating and unmapping
/// threads, under AddressSanitizer above all. Rank r always runs on thread r.
class RankThreads {
 public:
  explicit RankThreads(int n) {
    for (int r = 0; r < n; ++r) threads_.emplace_back([this, r] { serve(r); });
  }
  ~RankThreads() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    go_.notify_all();
    for (auto& t : threads_) t.join();
  }

  /// Runs job(r) on threads 0..n-1 and returns once every one of them has. One caller at a
  /// time (the test's main thread).
  void run(int n, const std::function<void(int)>& job) {
    if (n > static_cast<int>(threads_.size()))
      throw std::logic_error("RankThreads: a world of " + std::to_string(n) + " ranks, threads for " +
                             std::to_string(threads_.size()));
    std::unique_lock<std::mutex> lk(mu_);
    job_ = &job;
    ranks_ = n;
    left_ = n;
    ++round_;
    go_.notify_all();
    done_.wait(lk, [this] { return left_ == 0; });
    job_ = nullptr;
  }

 private:
  void serve(int r) {
    std::uint64_t seen = 0;
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      go_.wait(lk, [&] { return stop_ || round_ != seen; });
      if (stop_) return;
      seen = round_;
      if (r >= ranks_) continue;
      const std::function<void(int)>* job = job_;
      lk.unlock();
      (*job)(r);
      lk.lock();
      if (--left_ == 0) done_.notify_one();
    }
  }

  std::mutex mu_;
  std::condition_variable go_, done_;
  const std::function<void(int)>* job_ = nullptr;
  int ranks_ = 0, left_ = 0;
  std::uint64_t round_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

/// Runs fn(port) on one thread per rank; a rank's exception is a test failure naming `ctx`.
void run(MemoryWorld& w, const std::string& ctx, const std::function<void(MemoryPort&)>& fn) {
  static RankThreads threads(kMaxWorld);
  threads.run(w.size(), [&](int r) {
    try {
      fn(w.port(r));
    } catch (const std::exception& e) {
      ADD_FAILURE() << ctx << ": rank " << r << " threw: " << e.what();
    }
  });
}

std::uint64_t seed_of(int n, int r, std::size_t count, int salt) {
  return mix(mix(static_cast<std::uint64_t>(n), static_cast<std::uint64_t>(r)),
             mix(count, static_cast<std::uint64_t>(salt)));
}

/// How a world is laid out: one host with the mailboxes, one host without, or two hosts
/// (ranks alternate) for the hierarchical all_reduce.
enum class Layout { mailboxes, plain, two_hosts };

MemoryWorld world(int n, Layout l, std::uint64_t seed) {
  std::vector<std::uint64_t> hosts(static_cast<std::size_t>(n), 1);
  if (l == Layout::two_hosts)
    for (int r = 0; r < n; ++r) hosts[static_cast<std::size_t>(r)] = 1 + static_cast<std::uint64_t>(r % 2);
  return MemoryWorld(n, port_config(l == Layout::mailboxes), hosts, seed);
}

struct Case {
  Algorithm algorithm;
  Layout layout;
};

std::string describe(const char* op, int n, const Case& k, std::size_t count, DataType t, ReduceOp o) {
  static const char* layouts[] = {"mailboxes", "plain", "two hosts"};
  return std::string(op) + " n=" + std::to_string(n) + " " + to_string(k.algorithm) + " (" +
         layouts[static_cast<int>(k.layout)] + ") count=" + std::to_string(count) + " " + to_string(t) + " " +
         to_string(o);
}

/// Every (type, op) pair at the small counts; a few at the large ones and at 0.
///
/// Under a sanitizer (several times the cost per pass) the small counts take every type with
/// sum, and every op with f32 and i32. What this file checks there, the algorithms' index
/// arithmetic and buffer handling, depends on the world, algorithm, layout and count, not on
/// the pair; reduce_test runs every pair's kernel under the sanitizer, and the release stage
/// runs the whole product here.
template <class F>
void for_types_and_ops(std::size_t count, F&& f) {
  for (DataType t : all_dtypes) {
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max, ReduceOp::avg}) {
      if (op == ReduceOp::avg && !is_floating(t)) continue;
      const bool few = t == DataType::f32 || t == DataType::i32 || t == DataType::bf16;
      if ((count > 64 || count == 0) && !(few && (op == ReduceOp::sum || op == ReduceOp::max))) continue;
      if (nexar::testing::kSanitized && op != ReduceOp::sum && t != DataType::f32 && t != DataType::i32) continue;
      f(t, op);
    }
  }
}

constexpr std::size_t kCounts[] = {0, 1, 7, 61, 4099};

// ---- reductions ---------------------------------------------------------------------------

/// all_reduce, reduce_scatter, reduce and the scans of `n` ranks under `k`.
template <class T>
void reductions(int n, const Case& k, std::size_t count, DataType t, ReduceOp op) {
  const auto un = static_cast<std::size_t>(n);
  std::vector<std::vector<T>> in(un);
  for (int r = 0; r < n; ++r) in[static_cast<std::size_t>(r)] = gen<T>(count, op, Data::random, seed_of(n, r, count, 1));
  const auto ref = [&](int lo, int hi) {
    return [&, lo, hi](std::size_t i) { return reference(in, i, op, lo, hi, Data::random); };
  };
  CollectiveOptions o;
  o.algorithm = k.algorithm;
  std::vector<std::vector<T>> all(un);
  MemoryWorld w = world(n, k.layout, seed_of(n, 0, count, 2));
  const std::string ctx = describe("all_reduce", n, k, count, t, op);
  run(w, ctx, [&](MemoryPort& p) {
    const auto r = static_cast<std::size_t>(p.rank());
    all[r].assign(count, sentinel<T>());
    coll::iall_reduce(p, in[r].data(), all[r].data(), count, t, op, o).wait();
    check_elements(ctx, p.rank(), "recv", all[r].data(), count, ref(0, n));
  });
  for (int r = 1; r < n; ++r)  // bitwise the same on every rank
    check_bytes(ctx, r, "recv vs rank 0", reinterpret_cast<const std::byte*>(all[static_cast<std::size_t>(r)].data()),
                reinterpret_cast<const std::byte*>(all[0].data()), count * sizeof(T), sizeof(T));
  if (k.algorithm != Algorithm::automatic && k.algorithm != Algorithm::ring) return;  // all_reduce's own

  // reduce_scatter: rank r gets block r of the reduction (block_of), here of n * count.
  const std::size_t total = count * un;
  std::vector<std::vector<T>> big(un);
  for (int r = 0; r < n; ++r) big[static_cast<std::size_t>(r)] = gen<T>(total, op, Data::random, seed_of(n, r, total, 3));
  CollectiveOptions rs;
  rs.algorithm = k.algorithm == Algorithm::ring ? Algorithm::ring : Algorithm::automatic;
  const std::string rs_ctx = describe("reduce_scatter", n, k, total, t, op);
  run(w, rs_ctx, [&](MemoryPort& p) {
    const auto [off, len] = block_of(total, n, p.rank());
    std::vector<T> out(len, sentinel<T>());
    coll::ireduce_scatter(p, big[static_cast<std::size_t>(p.rank())].data(), out.data(), total, t, op, rs).wait();
    check_elements(rs_ctx, p.rank(), "recv", out.data(), len,
                   [&, off = off](std::size_t i) { return reference(big, off + i, op, 0, n, Data::random); });
  });

  // reduce to a root, and the scans: one algorithm each (tree, linear), and no mailboxes.
  if (k.algorithm != Algorithm::automatic || k.layout != Layout::plain) return;
  for (int root : {0, n - 1, n / 2}) {
    const std::string r_ctx = describe("reduce", n, k, count, t, op) + " root=" + std::to_string(root);
    run(w, r_ctx, [&](MemoryPort& p) {
      std::vector<T> out(p.rank() == root ? count : 0, sentinel<T>());
      coll::ireduce(p, in[static_cast<std::size_t>(p.rank())].data(), p.rank() == root ? out.data() : nullptr, count,
                    t, op, root, {})
          .wait();
      if (p.rank() == root) check_elements(r_ctx, p.rank(), "recv", out.data(), count, ref(0, n));
    });
  }
  for (bool exclusive : {false, true}) {
    const std::string s_ctx = describe(exclusive ? "exclusive_scan" : "scan", n, k, count, t, op);
    run(w, s_ctx, [&](MemoryPort& p) {
      const int r = p.rank();
      std::vector<T> out(count, sentinel<T>());
      coll::iscan(p, in[static_cast<std::size_t>(r)].data(), out.data(), count, t, op, exclusive, {}).wait();
      if (!exclusive) {
        check_elements(s_ctx, r, "recv", out.data(), count, ref(0, r + 1));
      } else if (r > 0) {
        check_elements(s_ctx, r, "recv", out.data(), count, ref(0, r));
      } else {
        check_elements(s_ctx, r, "recv (rank 0 untouched)", out.data(), count,
                       [](std::size_t) { return exactly(sentinel<T>()); });
      }
    });
  }
}

TEST(Algorithms, ReductionsMatchReferencesAtEveryWorld) {
  const Case cases[] = {{Algorithm::automatic, Layout::mailboxes},     {Algorithm::automatic, Layout::plain},
                        {Algorithm::automatic, Layout::two_hosts},     {Algorithm::ring, Layout::plain},
                        {Algorithm::halving_doubling, Layout::plain},  {Algorithm::recursive_doubling, Layout::plain},
                        {Algorithm::hierarchical, Layout::two_hosts}};
  for (int n = 1; n <= kMaxWorld; ++n)
    for (const Case& k : cases)
      for (std::size_t count : kCounts)
        for_types_and_ops(count, [&](DataType t, ReduceOp op) {
          with_type(t, [&](auto id) { reductions<typename decltype(id)::type>(n, k, count, t, op); });
        });
}

// ---- data movement --------------------------------------------------------------------------

/// broadcast, all_gather (and _v), gather/scatter (and _v), all_to_all (and _v) and barrier
/// of `n` ranks: bytes, checked exactly.
void movement(int n, Layout layout, std::size_t count, std::size_t es) {
  const auto un = static_cast<std::size_t>(n);
  const DataType t = es == 1 ? DataType::u8 : es == 2 ? DataType::f16 : es == 4 ? DataType::i32 : DataType::u64;
  const std::size_t bytes = count * es;
  std::vector<std::vector<std::byte>> in(un);
  // Each rank's input holds n blocks of `count` elements, and at least n * 4 elements for
  // the v-forms below.
  for (int r = 0; r < n; ++r)
    in[static_cast<std::size_t>(r)] = random_bytes(std::max(bytes, 4 * es) * un, seed_of(n, r, count, 4));
  // Uneven counts for the v-forms: rank r's part is (r * 3 + count) % 5 elements (0 among them).
  std::vector<std::size_t> vc(un), vd(un);
  for (int r = 0; r < n; ++r) vc[static_cast<std::size_t>(r)] = (static_cast<std::size_t>(r) * 3 + count) % 5 % 4;
  std::exclusive_scan(vc.begin(), vc.end(), vd.begin(), std::size_t{0});
  const std::size_t vtotal = vd.back() + vc.back();
  MemoryWorld w = world(n, layout, seed_of(n, 1, count, 5));
  const std::string ctx = "movement n=" + std::to_string(n) + (layout == Layout::mailboxes ? " (mailboxes)" : "") +
                          " count=" + std::to_string(count) + " " + to_string(t);
  const auto check = [&](int r, const char* what, const std::byte* got, const std::byte* want, std::size_t b) {
    check_bytes(ctx, r, what, got, want, b, es);
  };
  for (Algorithm a : {Algorithm::automatic, Algorithm::tree, Algorithm::ring}) {
    for (int root : {0, n - 1, n / 2}) {
      run(w, ctx, [&](MemoryPort& p) {
        std::vector<std::byte> buf = p.rank() == root ? in[static_cast<std::size_t>(root)] : std::vector<std::byte>(bytes * un);
        CollectiveOptions o;
        o.algorithm = a;
        coll::ibroadcast(p, buf.data(), count * un, t, root, o).wait();
        check(p.rank(), "broadcast", buf.data(), in[static_cast<std::size_t>(root)].data(), bytes * un);
      });
    }
  }
  for (Algorithm a : {Algorithm::automatic, Algorithm::ring}) {
    run(w, ctx, [&](MemoryPort& p) {
      std::vector<std::byte> out(bytes * un);
      CollectiveOptions o;
      o.algorithm = a;
      coll::iall_gather(p, in[static_cast<std::size_t>(p.rank())].data(), out.data(), count, t, o).wait();
      for (int r = 0; r < n; ++r)
        check(p.rank(), "all_gather", out.data() + static_cast<std::size_t>(r) * bytes, in[static_cast<std::size_t>(r)].data(), bytes);
      std::vector<std::byte> vout(vtotal * es);
      const auto me = static_cast<std::size_t>(p.rank());
      coll::iall_gather_v(p, in[me].data(), vc[me], vout.data(), vc, vd, t, o).wait();
      for (std::size_t r = 0; r < un; ++r) check(p.rank(), "all_gather_v", vout.data() + vd[r] * es, in[r].data(), vc[r] * es);
    });
  }
  for (int root : {0, n - 1}) {
    run(w, ctx, [&](MemoryPort& p) {
      const auto me = static_cast<std::size_t>(p.rank());
      const bool at_root = p.rank() == root;
      std::vector<std::byte> out(at_root ? bytes * un : 0);
      coll::igather(p, in[me].data(), at_root ? out.data() : nullptr, count, t, root, {}).wait();
      for (std::size_t r = 0; at_root && r < un; ++r) check(p.rank(), "gather", out.data() + r * bytes, in[r].data(), bytes);
      std::vector<std::byte> got(bytes);
      coll::iscatter(p, at_root ? in[me].data() : nullptr, got.data(), count, t, root, {}).wait();
      check(p.rank(), "scatter", got.data(), in[static_cast<std::size_t>(root)].data() + me * bytes, bytes);
      std::vector<std::byte> vout(at_root ? vtotal * es : 0);
      coll::igather_v(p, in[me].data(), vc[me], at_root ? vout.data() : nullptr, vc, vd, t, root, {}).wait();
      for (std::size_t r = 0; at_root && r < un; ++r) check(p.rank(), "gather_v", vout.data() + vd[r] * es, in[r].data(), vc[r] * es);
      std::vector<std::byte> vgot(vc[me] * es);
      coll::iscatter_v(p, at_root ? in[me].data() : nullptr, vc, vd, vgot.data(), vc[me], t, root, {}).wait();
      check(p.rank(), "scatter_v", vgot.data(), in[static_cast<std::size_t>(root)].data() + vd[me] * es, vc[me] * es);
    });
  }
  run(w, ctx, [&](MemoryPort& p) {
    const auto me = static_cast<std::size_t>(p.rank());
    std::vector<std::byte> out(bytes * un);
    coll::iall_to_all(p, in[me].data(), out.data(), count, t, {}).wait();
    for (std::size_t r = 0; r < un; ++r) check(p.rank(), "all_to_all", out.data() + r * bytes, in[r].data() + me * bytes, bytes);
    // v-form: rank r sends (r + j) % 3 elements to rank j, from offset j * count.
    std::vector<std::size_t> sc(un), sd(un), rc(un), rd(un);
    for (std::size_t j = 0; j < un; ++j) {
      sc[j] = std::min(count, (me + j) % 3);
      sd[j] = j * count;
      rc[j] = std::min(count, (j + me) % 3);
    }
    std::exclusive_scan(rc.begin(), rc.end(), rd.begin(), std::size_t{0});
    std::vector<std::byte> vout((rd.back() + rc.back()) * es);
    coll::iall_to_all_v(p, in[me].data(), sc, sd, vout.data(), rc, rd, t, {}).wait();
    for (std::size_t r = 0; r < un; ++r)
      check(p.rank(), "all_to_all_v", vout.data() + rd[r] * es, in[r].data() + me * count * es, rc[r] * es);
    coll::ibarrier(p, {}).wait();
  });
}

TEST(Algorithms, DataMovementMatchesReferencesAtEveryWorld) {
  for (int n = 1; n <= kMaxWorld; ++n)
    for (Layout l : {Layout::mailboxes, Layout::plain})
      for (std::size_t count : kCounts)
        for (std::size_t es : {std::size_t{1}, std::size_t{2}, std::size_t{4}, std::size_t{8}})
          if (count <= 64 || es == 4) movement(n, l, count, es);
}

// ---- fused forms and failures -----------------------------------------------------------------

TEST(Algorithms, BucketedAllReduceMatchesPerBufferReferences) {
  for (int n : {1, 2, 3, 5, 8}) {
    const auto un = static_cast<std::size_t>(n);
    const std::size_t sizes[] = {0, 1, 7, 300, 5};
    std::vector<std::vector<std::vector<float>>> in(un);
    for (int r = 0; r < n; ++r)
      for (std::size_t b = 0; b < std::size(sizes); ++b)
        in[static_cast<std::size_t>(r)].push_back(gen<float>(sizes[b], ReduceOp::sum, Data::random, seed_of(n, r, b, 6)));
    MemoryWorld w = world(n, Layout::plain, 7);
    const std::string ctx = "all_reduce_bucketed n=" + std::to_string(n);
    run(w, ctx, [&](MemoryPort& p) {
      auto mine = in[static_cast<std::size_t>(p.rank())];
      std::vector<MutableBuffer> bufs;
      for (auto& v : mine) bufs.push_back({v.data(), v.size()});
      coll::iall_reduce_bucketed(p, bufs, DataType::f32, ReduceOp::sum, {}).wait();
      for (std::size_t b = 0; b < mine.size(); ++b) {
        std::vector<std::vector<float>> column;
        for (auto& rank_in : in) column.push_back(rank_in[b]);
        check_elements(ctx, p.rank(), "buffer", mine[b].data(), mine[b].size(),
                       [&](std::size_t i) { return reference(column, i, ReduceOp::sum, 0, n, Data::random); });
      }
    });
  }
}

TEST(Algorithms, RanksThatDisagreeOnTheCountFailNamingBoth) {
  for (Layout l : {Layout::mailboxes, Layout::plain}) {
    MemoryWorld w = world(3, l, 8);
    std::vector<std::string> errors(3);
    std::vector<std::thread> ts;
    for (int r = 0; r < 3; ++r) {
      ts.emplace_back([&, r] {
        std::vector<float> x(r == 2 ? 6 : 5, 1.0f);
        CollectiveOptions o;
        o.timeout = 2s;
        try {
          coll::iall_reduce(w.port(r), x.data(), x.data(), x.size(), DataType::f32, ReduceOp::sum, o).wait();
        } catch (const Error& e) {
          errors[static_cast<std::size_t>(r)] = e.what();
        }
      });
    }
    for (auto& t : ts) t.join();
    // Whoever meets rank 2's message first names both sizes; no rank gets a result.
    bool named = false;
    for (const auto& e : errors) {
      EXPECT_FALSE(e.empty()) << "a rank finished an all_reduce whose ranks disagree";
      named = named || (e.find("24") != std::string::npos && e.find("20") != std::string::npos);
    }
    EXPECT_TRUE(named) << errors[0] << " | " << errors[1] << " | " << errors[2];
  }
}

TEST(Algorithms, AMissingRankEndsEveryWaitAtTheDeadline) {
  MemoryWorld w = world(4, Layout::plain, 9);
  std::vector<std::thread> ts;
  for (int r = 0; r < 3; ++r) {  // rank 3 never calls
    ts.emplace_back([&, r] {
      std::vector<float> x(100, 1.0f);
      CollectiveOptions o;
      o.timeout = 300ms;
      const auto start = std::chrono::steady_clock::now();
      try {
        coll::iall_reduce(w.port(r), x.data(), x.data(), x.size(), DataType::f32, ReduceOp::sum, o).wait();
        ADD_FAILURE() << "rank " << r << ": all_reduce finished without rank 3";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), Errc::timeout) << e.what();
      }
      EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
    });
  }
  for (auto& t : ts) t.join();
}

}  // namespace
