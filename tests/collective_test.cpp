// Correctness tests of the collective operations of Communicator, over real QUIC between the
// ranks of bootstrap_local worlds (one thread per rank). Every result is checked against a
// reference computed here with plain loops (collective_support.hpp); integer results and
// floating min/max exactly, floating sum/prod/avg within a rounding bound of a double
// reference AND bitwise identical on every rank that receives them, and exactly where the
// data makes every partial sum exact.
//
// Matrix (chosen to stay under ~90 s on 2 cores in release, a few minutes under ASan):
//  * ReduceMatrix: all_reduce, reduce, reduce_scatter, scan, exclusive_scan, each with every
//    dtype (sum, world 3) and every op it takes on f64 and i32 (world 4); counts 0, 1, world-1,
//    2*world+1 and 50000 (segment_bytes 4096: 12 to 98 segments); floating types also with
//    exact data (count 2*world+1 in place, and 1000). all_reduce forces halving_doubling for
//    world-1 and 2*world+1 and the ring for 50000; reduce uses root count % world.
//  * WorldSweep: every collective (v-forms and barrier included) at worlds 1, 2, 3, 5, 8 with
//    f32 sum and i32 max (data movement: f32 and i32), counts 0, 1, world-1, 2*world+1, 50000.
//  * AllReduceAlgorithm: automatic / ring / halving_doubling / recursive_doubling x worlds 1,
//    2, 3, 5, 8 x in place or not, f32 sum, f64 avg (exact), i32 prod (wraps), f16 max;
//    counts up to 50000. algorithms_test.cpp runs every world 1..9 over its in-memory port;
//    here each algorithm meets the transport at a power of two, odd worlds and world 1.
//  * HierarchicalAllReduce: host layouts that differ at worlds 1..5 (layouts that put the
//    ranks of a world on hosts the same way run once).
//  * Rooted: broadcast (automatic, tree, ring), reduce (automatic, tree), gather and scatter
//    (automatic, linear) with every root at worlds 1..3 and roots 0, w/2, w-1 at 4 and 5; counts 0, 1, world-1, 2*world+1, 20011
//    (and a 1 MiB + 3 broadcast with the default segment).
//
// Timing (2 cores, alone): about 13 s in release, about 50 s with ASan+UBSan (Debug).
//  * VForms, AllToAll, Barrier, NonBlocking, Split, Validation, OddCases: see each test.
#include <nexar/nexar.hpp>

#include <gtest/gtest.h>

#include "comm/communicator_impl.hpp"
#include "comm/runner.hpp"
#include "core/access.hpp"
#include "collective_support.hpp"
#include "support.hpp"

#include <algorithm>
#include <array>
#include <set>
#include <tuple>

namespace {

using namespace nexar::coll_test;
using nexar::Algorithm;
using nexar::coll_test::name;
using nexar::to_string;  // names of DataType, ReduceOp, Algorithm
using nexar::block_of;
using nexar::CollectiveOptions;
using nexar::Communicator;
using nexar::DataType;
using nexar::Errc;
using nexar::ReduceOp;
using nexar::Request;
using nexar::testing::contains;
using nexar::testing::expect_error;
using Clock = std::chrono::steady_clock;

enum class CollKind {
  all_reduce,
  reduce,
  reduce_scatter,
  scan,
  exclusive_scan,
  broadcast,
  all_gather,
  all_to_all,
  gather,
  scatter,
  barrier,
  all_gather_v,
  gather_v,
  scatter_v,
  all_to_all_v,
};

const char* name(CollKind c) {
  switch (c) {
    case CollKind::all_reduce: return "all_reduce";
    case CollKind::reduce: return "reduce";
    case CollKind::reduce_scatter: return "reduce_scatter";
    case CollKind::scan: return "scan";
    case CollKind::exclusive_scan: return "exclusive_scan";
    case CollKind::broadcast: return "broadcast";
    case CollKind::all_gather: return "all_gather";
    case CollKind::all_to_all: return "all_to_all";
    case CollKind::gather: return "gather";
    case CollKind::scatter: return "scatter";
    case CollKind::barrier: return "barrier";
    case CollKind::all_gather_v: return "all_gather_v";
    case CollKind::gather_v: return "gather_v";
    case CollKind::scatter_v: return "scatter_v";
    case CollKind::all_to_all_v: return "all_to_all_v";
  }
  return "?";
}

constexpr CollKind reductions[] = {CollKind::all_reduce, CollKind::reduce, CollKind::reduce_scatter, CollKind::scan,
                               CollKind::exclusive_scan};

// One call of a collective.
struct Case {
  CollKind coll = CollKind::all_reduce;
  DataType dt = DataType::f32;
  ReduceOp op = ReduceOp::sum;
  Algorithm alg = Algorithm::automatic;
  int root = 0;
  bool in_place = false;
  std::size_t segment = 4096;  // CollectiveOptions::segment_bytes (0: the Config's)
};

std::string describe(const Case& c, int world, std::size_t count, const char* data = nullptr) {
  std::ostringstream os;
  os << name(c.coll) << " " << to_string(c.dt);
  const bool red = c.coll == CollKind::all_reduce || c.coll == CollKind::reduce ||
                   c.coll == CollKind::reduce_scatter || c.coll == CollKind::scan ||
                   c.coll == CollKind::exclusive_scan;
  if (red) os << " " << to_string(c.op);
  os << " world=" << world << " count=" << count << " alg=" << to_string(c.alg);
  if (c.coll == CollKind::reduce || c.coll == CollKind::broadcast || c.coll == CollKind::gather ||
      c.coll == CollKind::scatter || c.coll == CollKind::gather_v || c.coll == CollKind::scatter_v)
    os << " root=" << c.root;
  os << " segment_bytes=" << c.segment;
  if (c.in_place) os << " in_place";
  if (data) os << " data=" << data;
  return os.str();
}

CollectiveOptions options_of(const Case& c) {
  CollectiveOptions o;
  o.algorithm = c.alg;
  o.segment_bytes = c.segment;
  return o;
}

// ---- the reducing collectives ------------------------------------------------------------

// Runs one reducing collective (all_reduce, reduce, reduce_scatter, scan, exclusive_scan) on
// every rank of `comms` with data from gen() and checks every rank's result. Every receive
// buffer has one guard element past its end that must stay untouched; so must reduce's recv
// on non-roots (null on odd non-roots) and exclusive_scan's on rank 0.
template <class T>
bool run_reduction(std::vector<Communicator>& comms, const Case& c, std::size_t count, Data kind,
                   std::uint64_t seed) {
  const int n = static_cast<int>(comms.size());
  const auto un = static_cast<std::size_t>(n);
  const std::string ctx = describe(c, n, count, name(kind));
  const T sent = sentinel<T>();
  const DataType dt = nexar::dtype_of_v<T>;
  auto out_len = [&](int r) {
    return c.coll == CollKind::reduce_scatter ? block_of(count, n, r).second : count;
  };
  std::vector<std::vector<T>> in(un), out(un);
  for (int r = 0; r < n; ++r) {
    auto& o = out[static_cast<std::size_t>(r)];
    in[static_cast<std::size_t>(r)] =
        gen<T>(count, c.op, kind, mix(seed, static_cast<std::uint64_t>(r) * 1000003 + count));
    if (c.in_place) {
      o = in[static_cast<std::size_t>(r)];
      o.push_back(sent);
    } else {
      o.assign(out_len(r) + 1, sent);
    }
  }
  const CollectiveOptions opts = options_of(c);
  const bool ok = run_ranks(comms, ctx, [&](int r) {
    Communicator& cm = comms[static_cast<std::size_t>(r)];
    auto& o = out[static_cast<std::size_t>(r)];
    const void* s = c.in_place ? static_cast<const void*>(o.data())
                               : static_cast<const void*>(in[static_cast<std::size_t>(r)].data());
    void* d = o.data();
    switch (c.coll) {
      case CollKind::all_reduce: cm.all_reduce(s, d, count, dt, c.op, opts); break;
      case CollKind::reduce:
        if (r != c.root && !c.in_place && r % 2 == 1) d = nullptr;  // documented: may be null
        cm.reduce(s, d, count, dt, c.op, c.root, opts);
        break;
      case CollKind::reduce_scatter: cm.reduce_scatter(s, d, count, dt, c.op, opts); break;
      case CollKind::scan: cm.scan(s, d, count, dt, c.op, opts); break;
      case CollKind::exclusive_scan: cm.exclusive_scan(s, d, count, dt, c.op, opts); break;
      default: FAIL() << "not a reduction";
    }
  });
  if (!ok) return false;
  for (int r = 0; r < n; ++r) {
    const auto& got = out[static_cast<std::size_t>(r)];
    const std::size_t len = c.in_place ? count : out_len(r);
    if (!same_bits(got[len], sent))
      ADD_FAILURE() << ctx << ": rank " << r << " wrote past the end of its recv buffer (element "
                    << len << " = " << show(got[len]) << ")";
    const bool untouched = (c.coll == CollKind::reduce && r != c.root) ||
                           (c.coll == CollKind::exclusive_scan && r == 0);
    if (untouched) {
      const auto& before = in[static_cast<std::size_t>(r)];
      check_elements(ctx, r,
                     c.coll == CollKind::reduce ? "recv of a non-root (must be left untouched)"
                                            : "recv of rank 0 (must be left unchanged)",
                     got.data(), len, [&](std::size_t i) {
                       return exactly(c.in_place ? before[i] : sent);
                     });
      continue;
    }
    int lo = 0, hi = n;
    std::size_t off = 0;
    if (c.coll == CollKind::scan) hi = r + 1;
    if (c.coll == CollKind::exclusive_scan) hi = r;
    if (c.coll == CollKind::reduce_scatter) off = block_of(count, n, r).first;
    check_elements(ctx, r, "result", got.data(), len, [&](std::size_t i) {
      return reference(in, off + i, c.op, lo, hi, kind);
    });
  }
  if (c.coll == CollKind::all_reduce && count > 0) {
    for (int r = 1; r < n; ++r)
      check_elements(ctx, r, "result vs rank 0's (must be bitwise identical)",
                     out[static_cast<std::size_t>(r)].data(), count,
                     [&](std::size_t i) { return exactly(out[0][i]); });
  }
  return true;
}

bool run_reduction(std::vector<Communicator>& comms, const Case& c, std::size_t count, Data kind,
                   std::uint64_t seed) {
  bool ok = true;
  with_type(c.dt, [&]<class T>(std::type_identity<T>) {
    ok = run_reduction<T>(comms, c, count, kind, seed);
  });
  return ok;
}

std::vector<ReduceOp> ops_of(DataType t) {
  std::vector<ReduceOp> ops{ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max};
  if (nexar::is_floating(t)) ops.push_back(ReduceOp::avg);
  return ops;
}

std::vector<std::size_t> counts_of(int n, std::size_t large) {
  const auto un = static_cast<std::size_t>(n);
  return {0, 1, un - 1, 2 * un + 1, large};
}

// ---- ReduceMatrix: every reducing collective with every dtype and with every op, over QUIC --
// The arithmetic of every dtype x op x algorithm is checked at worlds 1-9 over the in-memory
// port (algorithms_test.cpp), in milliseconds. What is left to check here is the path
// through the communicator and the wire: each collective once per dtype (sum, at world 3)
// and once per op (on f64 and i32, at world 4). The full product over QUIC (about 450
// cases) took a third of this file's time and found nothing the in-memory tests miss.

using ReduceParam = std::tuple<CollKind, DataType, ReduceOp, int>;

std::vector<ReduceParam> reduce_matrix() {
  std::vector<ReduceParam> v;
  for (CollKind c : reductions) {
    for (DataType t : all_dtypes) v.emplace_back(c, t, ReduceOp::sum, 3);
    for (DataType t : {DataType::f64, DataType::i32})
      for (ReduceOp op : ops_of(t))
        if (op != ReduceOp::sum) v.emplace_back(c, t, op, 4);
  }
  return v;
}

class ReduceMatrix : public ::testing::TestWithParam<ReduceParam> {};

TEST_P(ReduceMatrix, MatchesReference) {
  const auto [coll, dt, op, n] = GetParam();
  auto& comms = pooled_world(n);
  const auto un = static_cast<std::size_t>(n);
  const std::uint64_t seed =
      mix(static_cast<std::uint64_t>(coll) * 131 + static_cast<std::uint64_t>(dt) * 17 +
              static_cast<std::uint64_t>(op),
          un);
  for (std::size_t count : counts_of(n, 50000)) {
    Case c{coll, dt, op};
    c.root = static_cast<int>(count % un);
    if (coll == CollKind::all_reduce) {
      if (count == un - 1 || count == 2 * un + 1) c.alg = Algorithm::halving_doubling;
      if (count == 50000) c.alg = Algorithm::ring;
    }
    if (!run_reduction(comms, c, count, Data::random, seed)) return;
  }
  if (nexar::is_floating(dt)) {
    Case c{coll, dt, op};
    c.root = n - 1;
    c.in_place = coll != CollKind::reduce_scatter;
    if (!run_reduction(comms, c, 2 * un + 1, Data::exact, seed + 1)) return;
    c.in_place = false;
    c.root = 1;
    if (!run_reduction(comms, c, 1000, Data::exact, seed + 2)) return;
  }
}

std::string reduce_param_name(const ::testing::TestParamInfo<ReduceParam>& p) {
  const auto [coll, dt, op, n] = p.param;
  return std::string(name(coll)) + "_" + to_string(dt) + "_" + to_string(op) + "_w" + std::to_string(n);
}

INSTANTIATE_TEST_SUITE_P(Collective, ReduceMatrix, ::testing::ValuesIn(reduce_matrix()),
                         reduce_param_name);

// ---- data movement: broadcast, all_gather, all_to_all, gather, scatter -------------------

// Runs one data-moving collective on random bytes and checks them bit for bit (floating
// data included: NaN payloads must survive a copy). Receive buffers carry one guard element.
bool run_movement(std::vector<Communicator>& comms, const Case& c, std::size_t count,
                  std::uint64_t seed) {
  const int n = static_cast<int>(comms.size());
  const auto un = static_cast<std::size_t>(n);
  const std::size_t es = nexar::size_of(c.dt);
  const std::string ctx = describe(c, n, count);
  const std::byte sb{0xA5};
  std::vector<std::vector<std::byte>> send(un), recv(un);
  const std::size_t root = static_cast<std::size_t>(c.root);
  std::size_t send_elems = count, recv_elems = count;
  switch (c.coll) {
    case CollKind::broadcast: send_elems = 0; break;
    case CollKind::all_gather: recv_elems = count * un; break;
    case CollKind::all_to_all: send_elems = recv_elems = count * un; break;
    case CollKind::gather: recv_elems = count * un; break;
    case CollKind::scatter: send_elems = count * un; break;
    default: ADD_FAILURE() << "not a data-moving collective"; return false;
  }
  for (std::size_t r = 0; r < un; ++r) {
    send[r] = random_bytes(send_elems * es, mix(seed, r * 7919 + count));
    if (c.in_place) {
      recv[r] = send[r];
      recv[r].resize((recv_elems + 1) * es, sb);
    } else {
      recv[r].assign((recv_elems + 1) * es, sb);
    }
  }
  std::vector<std::byte> bcast = random_bytes(count * es, mix(seed, 4242 + count));
  if (c.coll == CollKind::broadcast) std::copy(bcast.begin(), bcast.end(), recv[root].begin());
  const CollectiveOptions opts = options_of(c);
  const bool ok = run_ranks(comms, ctx, [&](int r) {
    Communicator& cm = comms[static_cast<std::size_t>(r)];
    auto* d = recv[static_cast<std::size_t>(r)].data();
    const void* s = c.in_place ? static_cast<const void*>(d)
                               : static_cast<const void*>(send[static_cast<std::size_t>(r)].data());
    switch (c.coll) {
      case CollKind::broadcast: cm.broadcast(d, count, c.dt, c.root, opts); break;
      case CollKind::all_gather: cm.all_gather(s, d, count, c.dt, opts); break;
      case CollKind::all_to_all: cm.all_to_all(s, d, count, c.dt, opts); break;
      case CollKind::gather: cm.gather(s, d, count, c.dt, c.root, opts); break;
      case CollKind::scatter: cm.scatter(s, d, count, c.dt, c.root, opts); break;
      default: break;
    }
  });
  if (!ok) return false;
  const std::size_t cb = count * es;
  for (std::size_t r = 0; r < un; ++r) {
    const int ir = static_cast<int>(r);
    std::vector<std::byte> want;
    switch (c.coll) {
      case CollKind::broadcast: want = bcast; break;
      case CollKind::all_gather:
        for (std::size_t i = 0; i < un; ++i) want.insert(want.end(), send[i].begin(), send[i].end());
        break;
      case CollKind::all_to_all:  // block i of rank r = block r of rank i
        for (std::size_t i = 0; i < un; ++i)
          want.insert(want.end(), send[i].begin() + static_cast<std::ptrdiff_t>(r * cb),
                      send[i].begin() + static_cast<std::ptrdiff_t>((r + 1) * cb));
        break;
      case CollKind::gather:
        if (r != root) continue;  // recv is only significant at the root
        for (std::size_t i = 0; i < un; ++i) want.insert(want.end(), send[i].begin(), send[i].end());
        break;
      case CollKind::scatter:
        want.assign(send[root].begin() + static_cast<std::ptrdiff_t>(r * cb),
                    send[root].begin() + static_cast<std::ptrdiff_t>((r + 1) * cb));
        break;
      default: break;
    }
    const auto& got = recv[r];
    check_bytes(ctx, ir, "result", got.data(), want.data(), want.size(), es);
    if (std::any_of(got.end() - static_cast<std::ptrdiff_t>(es), got.end(),
                    [&](std::byte b) { return b != sb; }))
      ADD_FAILURE() << ctx << ": rank " << r << " wrote past the end of its recv buffer";
  }
  return true;
}

// ---- v-forms ---------------------------------------------------------------------------

// Parts of a concatenated buffer: part i has counts[i] elements at displs[i]; `gaps` puts
// 1 or 2 unused elements before some parts (they must stay untouched), `reversed` lays the
// parts out in reverse rank order.
struct Layout {
  std::vector<std::size_t> counts, displs;
  std::size_t extent = 0;  // elements the buffer needs
};

Layout layout(std::vector<std::size_t> counts, bool gaps, bool reversed = false) {
  Layout l;
  const std::size_t n = counts.size();
  l.displs.assign(n, 0);
  std::size_t at = 0;
  for (std::size_t k = 0; k < n; ++k) {
    const std::size_t i = reversed ? n - 1 - k : k;
    if (gaps) at += i % 3;
    l.displs[i] = at;
    at += counts[i];
  }
  l.counts = std::move(counts);
  l.extent = at + (gaps ? 1 : 0);
  return l;
}

// Element counts of the v-form tests. pattern 0: uneven, zeros included; 1: with one part of
// 5000 elements (many segments); 2: all zero; 3: only rank n-1 (or the last pair) non-zero.
std::size_t vcount(int pattern, std::size_t i, std::size_t j, std::size_t n) {
  switch (pattern) {
    case 0: return (i * 5 + j * 3 + 1) % 4 == 0 ? 0 : (i * 7 + j * 11 + 2) % 9;
    case 1: return (i + 2 * j) % 5 == 4 ? 5000 : (i * 3 + j) % 3;
    case 2: return 0;
    default: return (i == n - 1 && j == n - 1) ? 17 : 0;
  }
}

struct VCase {
  CollKind coll = CollKind::all_gather_v;
  DataType dt = DataType::f32;
  int root = 0;
  int pattern = 0;
  bool gaps = true;
  bool reversed = false;
};

std::string describe(const VCase& v, int n) {
  std::ostringstream os;
  os << name(v.coll) << " " << to_string(v.dt) << " world=" << n << " pattern=" << v.pattern;
  if (v.coll == CollKind::gather_v || v.coll == CollKind::scatter_v) os << " root=" << v.root;
  if (v.gaps) os << " gaps";
  if (v.reversed) os << " reversed-displs";
  return os.str();
}

// memcpy that accepts the null pointers of empty vectors when n == 0.
void copy_bytes(std::byte* dst, const std::byte* src, std::size_t n) {
  if (n) std::memcpy(dst, src, n);
}

bool run_vform(std::vector<Communicator>& comms, const VCase& v, std::uint64_t seed) {
  const int n = static_cast<int>(comms.size());
  const auto un = static_cast<std::size_t>(n);
  const std::size_t es = nexar::size_of(v.dt);
  const std::byte sb{0xA5};
  std::string ctx = describe(v, n);
  CollectiveOptions opts;
  opts.segment_bytes = 4096;
  const auto root = static_cast<std::size_t>(v.root);

  if (v.coll == CollKind::all_to_all_v) {
    // Rank i sends vcount(i, j) elements to rank j.
    std::vector<Layout> sl(un), rl(un);
    for (std::size_t r = 0; r < un; ++r) {
      std::vector<std::size_t> sc(un), rc(un);
      for (std::size_t j = 0; j < un; ++j) {
        sc[j] = vcount(v.pattern, r, j, un);
        rc[j] = vcount(v.pattern, j, r, un);
      }
      sl[r] = layout(sc, v.gaps, v.reversed);
      rl[r] = layout(rc, v.gaps, v.reversed);
    }
    std::vector<std::vector<std::byte>> send(un), recv(un);
    for (std::size_t r = 0; r < un; ++r) {
      send[r] = random_bytes(sl[r].extent * es, mix(seed, r));
      recv[r].assign((rl[r].extent + 1) * es, sb);
    }
    const bool ok = run_ranks(comms, ctx, [&](int ir) {
      const auto r = static_cast<std::size_t>(ir);
      comms[r].iall_to_all_v(send[r].data(), sl[r].counts, sl[r].displs, recv[r].data(),
                             rl[r].counts, rl[r].displs, v.dt, opts)
          .wait();
    });
    if (!ok) return false;
    for (std::size_t r = 0; r < un; ++r) {
      std::vector<std::byte> want((rl[r].extent + 1) * es, sb);
      for (std::size_t i = 0; i < un; ++i)
        copy_bytes(want.data() + rl[r].displs[i] * es, send[i].data() + sl[i].displs[r] * es,
                   rl[r].counts[i] * es);
      check_bytes(ctx, static_cast<int>(r), "recv (parts, gaps and guard)", recv[r].data(),
                  want.data(), want.size(), es);
    }
    return true;
  }

  std::vector<std::size_t> counts(un);
  for (std::size_t i = 0; i < un; ++i) counts[i] = vcount(v.pattern, i, i, un);
  const Layout l = layout(counts, v.gaps, v.reversed);
  std::vector<std::vector<std::byte>> send(un), recv(un);
  for (std::size_t r = 0; r < un; ++r) {
    const std::size_t s_elems = v.coll == CollKind::scatter_v ? l.extent : counts[r];
    const std::size_t r_elems = v.coll == CollKind::scatter_v ? counts[r] : l.extent;
    send[r] = random_bytes(s_elems * es, mix(seed, r));
    recv[r].assign((r_elems + 1) * es, sb);
  }
  const bool ok = run_ranks(comms, ctx, [&](int ir) {
    const auto r = static_cast<std::size_t>(ir);
    Communicator& cm = comms[r];
    switch (v.coll) {
      case CollKind::all_gather_v:
        cm.iall_gather_v(send[r].data(), counts[r], recv[r].data(), l.counts, l.displs, v.dt, opts)
            .wait();
        break;
      case CollKind::gather_v:
        cm.igather_v(send[r].data(), counts[r], recv[r].data(), l.counts, l.displs, v.dt, v.root,
                     opts)
            .wait();
        break;
      case CollKind::scatter_v:
        cm.iscatter_v(send[r].data(), l.counts, l.displs, recv[r].data(), counts[r], v.dt, v.root,
                      opts)
            .wait();
        break;
      default: break;
    }
  });
  if (!ok) return false;
  for (std::size_t r = 0; r < un; ++r) {
    std::vector<std::byte> want;
    if (v.coll == CollKind::scatter_v) {
      want.assign((counts[r] + 1) * es, sb);
      copy_bytes(want.data(), send[root].data() + l.displs[r] * es, counts[r] * es);
    } else {
      if (v.coll == CollKind::gather_v && r != root) continue;
      want.assign((l.extent + 1) * es, sb);
      for (std::size_t i = 0; i < un; ++i)
        copy_bytes(want.data() + l.displs[i] * es, send[i].data(), counts[i] * es);
    }
    check_bytes(ctx, static_cast<int>(r), "recv (parts, gaps and guard)", recv[r].data(),
                want.data(), want.size(), es);
  }
  return true;
}

// ---- barrier ---------------------------------------------------------------------------

// Rank `late` enters 50 ms after the others; nobody may leave before it entered.
void run_late_barrier(std::vector<Communicator>& comms, int late, Algorithm alg) {
  const int n = static_cast<int>(comms.size());
  std::vector<Clock::time_point> left(static_cast<std::size_t>(n));
  Clock::time_point entered{};
  CollectiveOptions o;
  o.algorithm = alg;
  const std::string ctx = "barrier world=" + std::to_string(n) + " late=" + std::to_string(late) +
                          " alg=" + to_string(alg);
  if (!run_ranks(comms, ctx, [&](int r) {
        if (r == late) {
          std::this_thread::sleep_for(50ms);
          entered = Clock::now();
        }
        comms[static_cast<std::size_t>(r)].barrier(o);
        left[static_cast<std::size_t>(r)] = Clock::now();
      }))
    return;
  for (int r = 0; r < n; ++r)
    EXPECT_GE(left[static_cast<std::size_t>(r)], entered)
        << ctx << ": rank " << r << " left the barrier "
        << std::chrono::duration<double, std::milli>(entered - left[static_cast<std::size_t>(r)])
               .count()
        << " ms before rank " << late << " entered it";
}

// ---- WorldSweep: every collective at worlds 1, 2, 3, 5 and 8 ------------------------------

using SweepParam = std::tuple<CollKind, int>;

class WorldSweep : public ::testing::TestWithParam<SweepParam> {};

TEST_P(WorldSweep, MatchesReference) {
  const auto [coll, n] = GetParam();
  auto& comms = pooled_world(n);
  const auto un = static_cast<std::size_t>(n);
  const std::uint64_t seed = mix(static_cast<std::uint64_t>(coll), un + 99);
  switch (coll) {
    case CollKind::all_reduce:
    case CollKind::reduce:
    case CollKind::reduce_scatter:
    case CollKind::scan:
    case CollKind::exclusive_scan:
      for (std::size_t count : counts_of(n, 50000)) {
        Case f{coll, DataType::f32, ReduceOp::sum};
        f.root = n - 1;
        Case i{coll, DataType::i32, ReduceOp::max};
        i.root = static_cast<int>(count % un);
        if (!run_reduction(comms, f, count, Data::random, seed)) return;
        if (!run_reduction(comms, i, count, Data::random, seed + 1)) return;
      }
      break;
    case CollKind::broadcast:
    case CollKind::all_gather:
    case CollKind::all_to_all:
    case CollKind::gather:
    case CollKind::scatter:
      for (std::size_t count : counts_of(n, 50000))
        for (DataType t : {DataType::f32, DataType::i32}) {
          Case c{coll, t};
          c.root = static_cast<int>((count + (t == DataType::i32 ? 1 : 0)) % un);
          if (!run_movement(comms, c, count, seed + static_cast<std::uint64_t>(t))) return;
        }
      break;
    case CollKind::barrier:
      run_late_barrier(comms, n - 1, Algorithm::automatic);
      break;
    case CollKind::all_gather_v:
    case CollKind::gather_v:
    case CollKind::scatter_v:
    case CollKind::all_to_all_v:
      for (int pattern : {0, 1, 2})
        for (DataType t : {DataType::f32, DataType::i32}) {
          VCase v{coll, t, pattern % n, pattern};
          if (!run_vform(comms, v, seed + static_cast<std::uint64_t>(pattern))) return;
        }
      break;
  }
}

// Worlds 1, 2, 3, 5 and 8: one rank, powers of two and odd sizes. Every world from 1 to 9
// is the in-memory tests' (algorithms_test.cpp), for every algorithm; worlds 4, 6 and 7
// over QUIC found nothing those miss.
std::vector<SweepParam> sweep_params() {
  std::vector<SweepParam> v;
  for (int c = 0; c <= static_cast<int>(CollKind::all_to_all_v); ++c)
    for (int n : {1, 2, 3, 5, 8}) v.emplace_back(static_cast<CollKind>(c), n);
  return v;
}

INSTANTIATE_TEST_SUITE_P(Collective, WorldSweep, ::testing::ValuesIn(sweep_params()),
                         [](const ::testing::TestParamInfo<SweepParam>& p) {
                           return std::string(name(std::get<0>(p.param))) + "_w" +
                                  std::to_string(std::get<1>(p.param));
                         });

// ---- AllReduceAlgorithm: forced algorithms at worlds 1, 2, 3, 5, 8, in place or not -------

using AlgParam = std::tuple<Algorithm, int, bool>;

// A type, reduction and data pattern of an all_reduce case.
struct Kind {
  DataType dt;
  ReduceOp op;
  Data data;
};

class AllReduceAlgorithm : public ::testing::TestWithParam<AlgParam> {};

TEST_P(AllReduceAlgorithm, MatchesReference) {
  const auto [alg, n, in_place] = GetParam();
  auto& comms = pooled_world(n);
  const std::uint64_t seed = mix(static_cast<std::uint64_t>(alg) * 2 + (in_place ? 1 : 0),
                                 static_cast<std::uint64_t>(n));
  const Kind kinds[] = {{DataType::f32, ReduceOp::sum, Data::random},
                        {DataType::f64, ReduceOp::avg, Data::exact},
                        {DataType::i32, ReduceOp::prod, Data::random},
                        {DataType::f16, ReduceOp::max, Data::random}};
  for (std::size_t count : counts_of(n, 50000))
    for (const Kind& k : kinds) {
      Case c{CollKind::all_reduce, k.dt, k.op, alg};
      c.in_place = in_place;
      if (!run_reduction(comms, c, count, k.data, seed + count)) return;
    }
  // The default segment size (one segment per block) as well.
  Case c{CollKind::all_reduce, DataType::f32, ReduceOp::sum, alg};
  c.in_place = in_place;
  c.segment = 0;
  run_reduction(comms, c, 50000, Data::random, seed + 7);
}

INSTANTIATE_TEST_SUITE_P(
    Collective, AllReduceAlgorithm,
    ::testing::Combine(::testing::Values(Algorithm::automatic, Algorithm::ring,
                                         Algorithm::halving_doubling, Algorithm::recursive_doubling),
                       ::testing::Values(1, 2, 3, 5, 8), ::testing::Bool()),
    [](const ::testing::TestParamInfo<AlgParam>& p) {
      return std::string(to_string(std::get<0>(p.param))) + "_w" +
             std::to_string(std::get<1>(p.param)) +
             (std::get<2>(p.param) ? "_in_place" : "");
    });

// ---- HierarchicalAllReduce: hosts simulated by the host list the algorithm reads ----------

// HostLayouts of ranks over hosts: which host each rank of n is on.
enum class HostLayout { pairs, interleaved, uneven, one_host, each_alone };
std::uint64_t host_in(HostLayout l, int r, int n) {
  switch (l) {
    case HostLayout::pairs: return static_cast<std::uint64_t>(r / 2);
    case HostLayout::interleaved: return static_cast<std::uint64_t>(r % 2);
    case HostLayout::uneven: return r == n - 1 ? 1 : 0;
    case HostLayout::one_host: return 0;
    case HostLayout::each_alone: return static_cast<std::uint64_t>(r);
  }
  return 0;
}
const char* name(HostLayout l) {
  switch (l) {
    case HostLayout::pairs: return "pairs";
    case HostLayout::interleaved: return "interleaved";
    case HostLayout::uneven: return "uneven";
    case HostLayout::one_host: return "one_host";
    case HostLayout::each_alone: return "each_alone";
  }
  return "?";
}

// Which host each rank of a world of n is on.
std::vector<std::uint64_t> hosts_of(HostLayout l, int n) {
  std::vector<std::uint64_t> ids;
  for (int r = 0; r < n; ++r) ids.push_back(host_in(l, r, n));
  return ids;
}

using HierParam = std::tuple<HostLayout, int>;

// Every world 1..5 with each layout that groups its ranks differently from the layouts
// before it (host ids renumbered in order of first appearance, since only the grouping
// matters): 17 worlds instead of 25. At world 1 all five are one host (4 fewer); at world 2
// pairs is one_host, and interleaved and uneven are each_alone (3 fewer); at world 3
// uneven is pairs (1 fewer).
std::vector<HierParam> hier_params() {
  std::vector<HierParam> v;
  for (int n = 1; n <= 5; ++n) {
    std::set<std::vector<std::uint64_t>> seen;
    for (HostLayout l : {HostLayout::one_host, HostLayout::each_alone, HostLayout::pairs,
                         HostLayout::interleaved, HostLayout::uneven}) {
      std::vector<std::uint64_t> grouping, names;
      for (std::uint64_t h : hosts_of(l, n)) {
        auto at = std::find(names.begin(), names.end(), h);
        grouping.push_back(static_cast<std::uint64_t>(at - names.begin()));
        if (at == names.end()) names.push_back(h);
      }
      if (seen.insert(grouping).second) v.emplace_back(l, n);
    }
  }
  return v;
}

class HierarchicalAllReduce : public ::testing::TestWithParam<HierParam> {};

// The host list is what the algorithm learns on a communicator's first large all_reduce;
// set by hand, it makes one process look like several hosts (the messages still travel
// between ranks as usual). Forced and automatic choices, in place or not, against the
// references.
TEST_P(HierarchicalAllReduce, MatchesReference) {
  const auto [layout, n] = GetParam();
  auto comms = bootstrap_local(n, test_config());
  for (auto& comm : comms) nexar::detail::Access::impl(comm)->set_hosts(hosts_of(layout, n));
  const std::uint64_t seed = mix(static_cast<std::uint64_t>(layout), static_cast<std::uint64_t>(n));
  const Kind kinds[] = {{DataType::f32, ReduceOp::sum, Data::random},
                        {DataType::f64, ReduceOp::avg, Data::exact},
                        {DataType::i64, ReduceOp::sum, Data::random},
                        {DataType::bf16, ReduceOp::min, Data::random}};
  for (std::size_t count : counts_of(n, 70001))
    for (const Kind& k : kinds)
      for (bool in_place : {false, true}) {
        Case c{CollKind::all_reduce, k.dt, k.op, Algorithm::hierarchical};
        c.in_place = in_place;
        if (!run_reduction(comms, c, count, k.data, seed + count)) return;
      }
  // Automatic at a ring size picks the hierarchy where it helps; the result is the same.
  Case c{CollKind::all_reduce, DataType::f32, ReduceOp::sum, Algorithm::automatic};
  run_reduction(comms, c, 300001, Data::random, seed + 1);
}

INSTANTIATE_TEST_SUITE_P(Collective, HierarchicalAllReduce, ::testing::ValuesIn(hier_params()),
                         [](const ::testing::TestParamInfo<HierParam>& p) {
                           return std::string(name(std::get<0>(p.param))) + "_w" +
                                  std::to_string(std::get<1>(p.param));
                         });

// ---- Rooted: roots at worlds 1..5 ---------------------------------------------------------

using RootParam = std::tuple<CollKind, Algorithm, int, int>;  // collective, algorithm, world, root

class Rooted : public ::testing::TestWithParam<RootParam> {};

TEST_P(Rooted, MatchesReference) {
  const auto [coll, alg, n, root] = GetParam();
  auto& comms = pooled_world(n);
  const std::uint64_t seed =
      mix(static_cast<std::uint64_t>(coll) * 64 + static_cast<std::uint64_t>(alg),
          static_cast<std::uint64_t>(n * 16 + root));
  for (std::size_t count : counts_of(n, 20011)) {
    if (coll == CollKind::reduce) {
      Case f{coll, DataType::f64, ReduceOp::sum, alg, root};
      Case u{coll, DataType::u8, ReduceOp::prod, alg, root};
      if (!run_reduction(comms, f, count, Data::random, seed)) return;
      if (!run_reduction(comms, u, count, Data::random, seed + 1)) return;
    } else {
      for (DataType t : {DataType::f16, DataType::f64}) {
        Case c{coll, t, ReduceOp::sum, alg, root};
        if (!run_movement(comms, c, count, seed + static_cast<std::uint64_t>(t))) return;
      }
    }
  }
  if (coll == CollKind::broadcast) {  // above broadcast_chain_bytes, with the default segment
    Case c{coll, DataType::u8, ReduceOp::sum, alg, root};
    c.segment = 0;
    run_movement(comms, c, (1u << 20) + 3, seed + 5);
  }
}

std::vector<RootParam> rooted_params() {
  std::vector<RootParam> v;
  const std::pair<CollKind, std::vector<Algorithm>> colls[] = {
      {CollKind::broadcast, {Algorithm::automatic, Algorithm::tree, Algorithm::ring}},
      {CollKind::reduce, {Algorithm::automatic, Algorithm::tree}},
      {CollKind::gather, {Algorithm::automatic, Algorithm::linear}},
      {CollKind::scatter, {Algorithm::automatic, Algorithm::linear}}};
  // Every root of worlds 1 to 3; at worlds 4 and 5 the first, the middle and the last root,
  // the ones the in-memory tests take at every world 1 to 9 (algorithms_test.cpp).
  for (const auto& [c, algs] : colls)
    for (Algorithm a : algs)
      for (int n = 1; n <= 5; ++n)
        for (int root = 0; root < n; ++root)
          if (n <= 3 || root == 0 || root == n / 2 || root == n - 1) v.emplace_back(c, a, n, root);
  return v;
}

INSTANTIATE_TEST_SUITE_P(Collective, Rooted, ::testing::ValuesIn(rooted_params()),
                         [](const ::testing::TestParamInfo<RootParam>& p) {
                           return std::string(name(std::get<0>(p.param))) + "_" +
                                  to_string(std::get<1>(p.param)) + "_w" +
                                  std::to_string(std::get<2>(p.param)) + "_root" +
                                  std::to_string(std::get<3>(p.param));
                         });

// ---- other algorithms that can be forced -------------------------------------------------

TEST(Collective, ForcedAlgorithmsOfOtherCollectives) {
  for (int n : {1, 2, 3, 5, 8}) {
    auto& comms = pooled_world(n);
    const auto un = static_cast<std::size_t>(n);
    const std::uint64_t seed = mix(77, un);
    for (std::size_t count : counts_of(n, 20011)) {
      Case ag{CollKind::all_gather, DataType::i64};
      ag.alg = Algorithm::ring;
      if (!run_movement(comms, ag, count, seed)) return;
      Case rs{CollKind::reduce_scatter, DataType::f32, ReduceOp::sum, Algorithm::ring};
      if (!run_reduction(comms, rs, count, Data::random, seed + 1)) return;
      Case sc{CollKind::scan, DataType::i64, ReduceOp::sum, Algorithm::linear};
      if (!run_reduction(comms, sc, count, Data::random, seed + 2)) return;
      Case a2a{CollKind::all_to_all, DataType::u8};
      a2a.alg = Algorithm::pairwise;
      if (!run_movement(comms, a2a, count, seed + 3)) return;
    }
    run_late_barrier(comms, 0, Algorithm::dissemination);
  }
}

// ---- VForms: uneven counts with zeros, gaps, every root ---------------------------------

using VParam = std::tuple<CollKind, int>;

class VForms : public ::testing::TestWithParam<VParam> {};

TEST_P(VForms, MatchReference) {
  const auto [coll, n] = GetParam();
  auto& comms = pooled_world(n);
  const std::uint64_t seed = mix(static_cast<std::uint64_t>(coll) + 500, static_cast<std::uint64_t>(n));
  std::vector<int> roots{0};
  if (coll == CollKind::gather_v || coll == CollKind::scatter_v) {
    roots.clear();
    if (n <= 5)
      for (int r = 0; r < n; ++r) roots.push_back(r);
    else
      roots = {0, n / 2, n - 1};
  }
  for (int root : roots)
    for (int pattern : {0, 1, 2, 3})
      for (bool gaps : {false, true}) {
        VCase v{coll, pattern % 2 ? DataType::f64 : DataType::u8, root, pattern, gaps};
        if (!run_vform(comms, v, seed + static_cast<std::uint64_t>(pattern * 2 + gaps))) return;
      }
}

INSTANTIATE_TEST_SUITE_P(Collective, VForms,
                         ::testing::Combine(::testing::Values(CollKind::all_gather_v, CollKind::gather_v,
                                                              CollKind::scatter_v,
                                                              CollKind::all_to_all_v),
                                            ::testing::Range(1, 9)),
                         [](const ::testing::TestParamInfo<VParam>& p) {
                           return std::string(name(std::get<0>(p.param))) + "_w" +
                                  std::to_string(std::get<1>(p.param));
                         });

// Parts laid out in reverse rank order: counts/displs describe each rank's part wherever it is.
TEST(Collective, VFormsWithDisplacementsInReverseOrder) {
  for (int n : {3, 4}) {
    auto& comms = pooled_world(n);
    for (CollKind c : {CollKind::all_gather_v, CollKind::gather_v, CollKind::scatter_v, CollKind::all_to_all_v}) {
      VCase v{c, DataType::i32, n - 1, 0, true, true};
      if (!run_vform(comms, v, 31337)) return;
    }
  }
}

// ---- all_to_all ------------------------------------------------------------------------

using A2AParam = std::tuple<Algorithm, int>;

class AllToAll : public ::testing::TestWithParam<A2AParam> {};

TEST_P(AllToAll, MatchesReference) {
  const auto [alg, n] = GetParam();
  auto& comms = pooled_world(n);
  const auto un = static_cast<std::size_t>(n);
  for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{3}, 2 * un + 1,
                            std::size_t{5000}})
    for (DataType t : {DataType::bf16, DataType::u64}) {
      Case c{CollKind::all_to_all, t};
      c.alg = alg;
      if (!run_movement(comms, c, count, mix(count, un))) return;
    }
  Case c{CollKind::all_to_all, DataType::i32};  // in place: send == recv, same size
  c.alg = alg;
  c.in_place = true;
  run_movement(comms, c, 2 * un + 1, 5);
  run_movement(comms, c, 3000, 6);
}

INSTANTIATE_TEST_SUITE_P(Collective, AllToAll,
                         ::testing::Combine(::testing::Values(Algorithm::automatic,
                                                              Algorithm::pairwise),
                                            ::testing::Range(1, 9)),
                         [](const ::testing::TestParamInfo<A2AParam>& p) {
                           return std::string(to_string(std::get<0>(p.param))) + "_w" +
                                  std::to_string(std::get<1>(p.param));
                         });

// ---- barrier ---------------------------------------------------------------------------

TEST(Collective, BarrierHoldsEveryoneUntilTheLastRankEnters) {
  for (int n : {2, 3, 5, 8})
    for (Algorithm a : {Algorithm::automatic, Algorithm::dissemination})
      for (int late : {0, n / 2, n - 1}) run_late_barrier(pooled_world(n), late, a);
  run_late_barrier(pooled_world(1), 0, Algorithm::automatic);
}

// ---- non-blocking --------------------------------------------------------------------------

// Several different collectives in flight on one communicator, waited for afterwards; they
// complete in the order they were started.
TEST(Collective, NonBlockingCollectivesInFlightTogether) {
  for (int n : {1, 4, 5}) {
    auto& comms = pooled_world(n);
    const auto un = static_cast<std::size_t>(n);
    const int root = n > 1 ? 1 : 0;
    const std::size_t big = 50000;
    const std::size_t rs_count = 2 * un + 1;
    struct Bufs {
      std::vector<float> ar_in, ar_out;
      std::vector<std::int32_t> bc;
      std::vector<std::uint8_t> ag_in, ag_out;
      std::vector<std::int64_t> rs_in, rs_out;
      std::vector<double> sc_in, sc_out;
    };
    std::vector<Bufs> b(un);
    const std::string ctx = "non-blocking world=" + std::to_string(n);
    const bool ok = run_ranks(comms, ctx, [&](int ir) {
      const auto r = static_cast<std::size_t>(ir);
      Communicator& cm = comms[r];
      Bufs& m = b[r];
      m.ar_in.resize(big);
      for (std::size_t i = 0; i < big; ++i) m.ar_in[i] = static_cast<float>((i % 64) * (r + 1));
      m.ar_out.assign(big, -1.0f);
      m.bc.assign(100000, -1);
      if (ir == root)
        for (std::size_t i = 0; i < m.bc.size(); ++i) m.bc[i] = static_cast<std::int32_t>(i * 3);
      m.ag_in.assign(5, static_cast<std::uint8_t>(10 + r));
      m.ag_out.assign(5 * un, 0);
      m.rs_in.resize(rs_count);
      for (std::size_t i = 0; i < rs_count; ++i)
        m.rs_in[i] = static_cast<std::int64_t>(i * 100 + r);
      m.rs_out.assign(block_of(rs_count, n, ir).second + 1, -7);
      m.sc_in.assign(3, static_cast<double>(r + 1));
      m.sc_out.assign(3, 0.0);
      CollectiveOptions ring;
      ring.algorithm = Algorithm::ring;
      ring.segment_bytes = 4096;
      CollectiveOptions seg;
      seg.segment_bytes = 4096;
      std::vector<Request> q;
      q.push_back(cm.iall_reduce(m.ar_in.data(), m.ar_out.data(), big, DataType::f32,
                                 ReduceOp::sum, ring));
      q.push_back(cm.ibroadcast(m.bc.data(), m.bc.size(), DataType::i32, root, ring));
      q.push_back(cm.iall_gather(m.ag_in.data(), m.ag_out.data(), 5, DataType::u8, seg));
      q.push_back(cm.ireduce_scatter(m.rs_in.data(), m.rs_out.data(), rs_count, DataType::i64,
                                     ReduceOp::sum, seg));
      q.push_back(cm.iscan(m.sc_in.data(), m.sc_out.data(), 3, DataType::f64, ReduceOp::sum));
      q.push_back(cm.ibarrier());
      q.back().wait();
      for (std::size_t k = 0; k + 1 < q.size(); ++k)
        EXPECT_TRUE(q[k].test()) << ctx << ": rank " << r << ": request " << k
                                 << " not complete after a later one completed";
      for (std::size_t k = q.size(); k-- > 0;) q[k].wait();
    });
    if (!ok) return;
    const double tri = static_cast<double>(n) * (n + 1) / 2;
    for (std::size_t r = 0; r < un; ++r) {
      const int ir = static_cast<int>(r);
      const Bufs& m = b[r];
      check_elements(ctx + " iall_reduce f32 sum", ir, "result", m.ar_out.data(), big,
                     [&](std::size_t i) { return exactly(static_cast<float>((i % 64) * tri)); });
      check_elements(ctx + " ibroadcast i32", ir, "result", m.bc.data(), m.bc.size(),
                     [&](std::size_t i) { return exactly(static_cast<std::int32_t>(i * 3)); });
      check_elements(ctx + " iall_gather u8", ir, "result", m.ag_out.data(), m.ag_out.size(),
                     [&](std::size_t i) { return exactly(static_cast<std::uint8_t>(10 + i / 5)); });
      const auto [off, len] = block_of(rs_count, n, ir);
      check_elements(ctx + " ireduce_scatter i64 sum", ir, "result", m.rs_out.data(), len + 1,
                     [&, off = off, len = len](std::size_t i) {
                       if (i == len) return exactly(std::int64_t{-7});
                       return exactly(static_cast<std::int64_t>((off + i) * 100 * un) +
                                      static_cast<std::int64_t>(tri) - n);
                     });
      check_elements(ctx + " iscan f64 sum", ir, "result", m.sc_out.data(), 3, [&](std::size_t) {
        return exactly(static_cast<double>(r + 1) * (r + 2) / 2);
      });
    }
  }
}

// Concurrent collectives on two communicators (the world and a split of it), one thread per
// communicator on every rank.
TEST(Collective, NonBlockingOnTwoCommunicatorsFromTwoThreads) {
  const int n = 6;
  auto comms = nexar::bootstrap_local(n, test_config());
  std::vector<Communicator> sub(n);
  if (!run_ranks(comms, "split", [&](int r) {
        sub[static_cast<std::size_t>(r)] = comms[static_cast<std::size_t>(r)].split(r % 2, r);
      }))
    return;
  const int iters = 40;
  std::atomic<int> bad{0};
  std::mutex mu;
  std::string first;
  auto fail = [&](const std::string& s) {
    std::lock_guard lk(mu);
    if (bad++ == 0) first = s;
  };
  run_ranks(comms, "two communicators, two threads per rank", [&](int r) {
    std::exception_ptr err;
    std::thread t([&] {
      try {
        Communicator& s = sub[static_cast<std::size_t>(r)];
        for (int it = 0; it < iters; ++it) {
          std::vector<std::int64_t> v(33, -(r + 1) - it * 7), out(33);
          Request q = s.iall_reduce(v.data(), out.data(), v.size(), DataType::i64, ReduceOp::sum);
          std::vector<std::int32_t> g(2 * static_cast<std::size_t>(s.size()));
          const std::int32_t mine[2] = {r, it};
          Request q2 = s.iall_gather(mine, g.data(), 2, DataType::i32);
          q2.wait();
          q.wait();
          std::int64_t want = 0;
          for (int k = r % 2; k < n; k += 2) want += -(k + 1) - it * 7;
          if (out[32] != want || out[0] != want)
            fail("split all_reduce rank " + std::to_string(r) + " iter " + std::to_string(it) +
                 ": expected " + std::to_string(want) + ", got " + std::to_string(out[0]));
          for (int k = 0; k < s.size(); ++k)
            if (g[static_cast<std::size_t>(2 * k)] != r % 2 + 2 * k ||
                g[static_cast<std::size_t>(2 * k + 1)] != it)
              fail("split all_gather rank " + std::to_string(r) + " iter " + std::to_string(it) +
                   " part " + std::to_string(k) + ": got {" +
                   std::to_string(g[static_cast<std::size_t>(2 * k)]) + ", " +
                   std::to_string(g[static_cast<std::size_t>(2 * k + 1)]) + "}");
        }
      } catch (...) {
        err = std::current_exception();
      }
    });
    try {
      Communicator& w = comms[static_cast<std::size_t>(r)];
      for (int it = 0; it < iters; ++it) {
        std::vector<std::int64_t> v(33, (r + 1) * 1000 + it), out(33);
        Request q = w.iall_reduce(v.data(), out.data(), v.size(), DataType::i64, ReduceOp::sum);
        std::vector<std::int32_t> bc(10, r == it % n ? it : -1);
        Request q2 = w.ibroadcast(bc.data(), bc.size(), DataType::i32, it % n);
        q.wait();
        q2.wait();
        const std::int64_t want = 1000LL * n * (n + 1) / 2 + static_cast<std::int64_t>(n) * it;
        if (out[0] != want || out[32] != want)
          fail("world all_reduce rank " + std::to_string(r) + " iter " + std::to_string(it) +
               ": expected " + std::to_string(want) + ", got " + std::to_string(out[0]));
        if (bc[9] != it)
          fail("world broadcast rank " + std::to_string(r) + " iter " + std::to_string(it) +
               ": got " + std::to_string(bc[9]));
      }
    } catch (...) {
      t.join();
      throw;
    }
    t.join();
    if (err) std::rethrow_exception(err);
  });
  EXPECT_EQ(bad.load(), 0) << first;
}

// ---- split -------------------------------------------------------------------------------

// Splits by parity with key -rank (reversed order) at every world 1..8 and checks the
// communicators, collectives on them, a split of the split, and the parent afterwards.
TEST(Collective, SplitByParityReversed) {
  for (int n = 1; n <= 8; ++n) {
    auto comms = nexar::bootstrap_local(n, test_config());
    const auto un = static_cast<std::size_t>(n);
    std::vector<Communicator> sub(un);
    const std::string ctx = "split world=" + std::to_string(n);
    if (!run_ranks(comms, ctx, [&](int r) {
          sub[static_cast<std::size_t>(r)] = comms[static_cast<std::size_t>(r)].split(r % 2, -r);
        }))
      return;
    // Communicator of parity p in sub-rank order: descending parent ranks.
    auto group = [&](int p) {
      std::vector<int> g;
      for (int k = n - 1; k >= 0; --k)
        if (k % 2 == p) g.push_back(k);
      return g;
    };
    for (int r = 0; r < n; ++r) {
      const Communicator& s = sub[static_cast<std::size_t>(r)];
      const auto g = group(r % 2);
      ASSERT_TRUE(s.is_open()) << ctx << " rank " << r;
      EXPECT_EQ(s.size(), static_cast<int>(g.size())) << ctx << " rank " << r;
      EXPECT_EQ(s.rank(), static_cast<int>(std::find(g.begin(), g.end(), r) - g.begin()))
          << ctx << " rank " << r;
      EXPECT_NE(s.id(), comms[static_cast<std::size_t>(r)].id()) << ctx << " rank " << r;
      EXPECT_EQ(comms[static_cast<std::size_t>(r)].id(), 0u) << "the world's id";
      const Communicator& first_member = sub[static_cast<std::size_t>(g.front())];
      EXPECT_EQ(s.id(), first_member.id()) << ctx << ": members of one split disagree on id()";
    }
    // Collectives on the split: all_gather of parent ranks, all_reduce, broadcast, scan.
    std::vector<std::vector<std::int32_t>> gathered(un);
    std::vector<double> sums(un), scans(un);
    std::vector<std::int32_t> bcast(un);
    std::vector<Communicator> subsub(un);
    if (!run_ranks(sub, ctx + " collectives on the split", [&](int r) {
          Communicator& s = sub[static_cast<std::size_t>(r)];
          const auto ur = static_cast<std::size_t>(r);
          const std::int32_t me = r;
          gathered[ur].assign(static_cast<std::size_t>(s.size()), -1);
          s.all_gather(&me, gathered[ur].data(), 1, DataType::i32);
          const double x = r;
          s.all_reduce(&x, &sums[ur], 1, DataType::f64, ReduceOp::sum);
          s.scan(&x, &scans[ur], 1, DataType::f64, ReduceOp::sum);
          bcast[ur] = r;
          s.broadcast(&bcast[ur], 1, DataType::i32, s.size() - 1);
          // Split of the split: by sub-rank parity, keeping order.
          subsub[ur] = s.split(s.rank() % 2, s.rank());
        }))
      return;
    for (int r = 0; r < n; ++r) {
      const auto ur = static_cast<std::size_t>(r);
      const auto g = group(r % 2);
      double total = 0, prefix = 0;
      for (int k : g) total += k;
      const auto pos = static_cast<std::size_t>(std::find(g.begin(), g.end(), r) - g.begin());
      for (std::size_t k = 0; k <= pos; ++k) prefix += g[k];
      EXPECT_EQ(gathered[ur], std::vector<std::int32_t>(g.begin(), g.end()))
          << ctx << ": all_gather on the split, rank " << r;
      EXPECT_EQ(sums[ur], total) << ctx << ": all_reduce on the split, rank " << r;
      EXPECT_EQ(scans[ur], prefix) << ctx << ": scan on the split, rank " << r;
      EXPECT_EQ(bcast[ur], g.back()) << ctx << ": broadcast on the split, rank " << r;
      // subsub: the members of g at even (or odd) positions, in order.
      std::vector<int> gg;
      for (std::size_t k = pos % 2; k < g.size(); k += 2) gg.push_back(g[k]);
      const Communicator& ss = subsub[ur];
      ASSERT_TRUE(ss.is_open()) << ctx << " split of split, rank " << r;
      EXPECT_EQ(ss.size(), static_cast<int>(gg.size())) << ctx << " split of split, rank " << r;
      EXPECT_EQ(ss.rank(), static_cast<int>(std::find(gg.begin(), gg.end(), r) - gg.begin()))
          << ctx << " split of split, rank " << r;
      EXPECT_NE(ss.id(), sub[ur].id()) << ctx << " split of split, rank " << r;
      EXPECT_NE(ss.id(), 0u) << ctx << " split of split, rank " << r;
    }
    std::vector<std::int64_t> ss_sum(un);
    if (!run_ranks(subsub, ctx + " all_reduce on the split of the split", [&](int r) {
          const std::int64_t x = 1LL << r;
          subsub[static_cast<std::size_t>(r)].all_reduce(&x, &ss_sum[static_cast<std::size_t>(r)],
                                                          1, DataType::i64, ReduceOp::sum);
        }))
      return;
    for (int r = 0; r < n; ++r) {
      std::int64_t want = 0;
      const auto g = group(r % 2);
      const auto pos = static_cast<std::size_t>(std::find(g.begin(), g.end(), r) - g.begin());
      for (std::size_t k = pos % 2; k < g.size(); k += 2) want += 1LL << g[k];
      EXPECT_EQ(ss_sum[static_cast<std::size_t>(r)], want)
          << ctx << ": all_reduce on the split of the split, rank " << r;
    }
    // Destroying the splits leaves the parent working.
    subsub.clear();
    sub.clear();
    Case c{CollKind::all_reduce, DataType::i32, ReduceOp::sum};
    run_reduction(comms, c, 2 * un + 1, Data::random, 3);
  }
}

TEST(Collective, SplitWithNegativeColorReturnsAClosedCommunicator) {
  const int n = 4;
  auto comms = nexar::bootstrap_local(n, test_config());
  std::vector<Communicator> sub(n);
  if (!run_ranks(comms, "split with color -1 on rank 0", [&](int r) {
        sub[static_cast<std::size_t>(r)] =
            comms[static_cast<std::size_t>(r)].split(r == 0 ? -1 : 0, r);
      }))
    return;
  EXPECT_FALSE(sub[0].is_open());
  std::vector<Communicator> rest(sub.begin() + 1, sub.end());
  for (int r = 1; r < n; ++r) {
    ASSERT_TRUE(sub[static_cast<std::size_t>(r)].is_open());
    EXPECT_EQ(sub[static_cast<std::size_t>(r)].size(), n - 1);
    EXPECT_EQ(sub[static_cast<std::size_t>(r)].rank(), r - 1);
  }
  Case c{CollKind::all_reduce, DataType::f64, ReduceOp::sum};
  run_reduction(rest, c, 101, Data::random, 9);
  // All ranks with a negative color: nobody gets a communicator, nothing hangs.
  std::vector<Communicator> none(n);
  if (!run_ranks(comms, "split with color -1 everywhere", [&](int r) {
        none[static_cast<std::size_t>(r)] = comms[static_cast<std::size_t>(r)].split(-5, 0);
      }))
    return;
  for (auto& s : none) EXPECT_FALSE(s.is_open());
}

// The same collectives at the same time on the parent and on a split with the same members
// (reversed): traffic of one never lands in the other.
TEST(Collective, SplitTrafficNeverMixesWithTheParent) {
  const int n = 8;
  auto comms = nexar::bootstrap_local(n, test_config());
  std::vector<Communicator> rev(n), par(n);
  if (!run_ranks(comms, "split", [&](int r) {
        rev[static_cast<std::size_t>(r)] = comms[static_cast<std::size_t>(r)].split(0, -r);
        par[static_cast<std::size_t>(r)] = comms[static_cast<std::size_t>(r)].split(r % 2, r);
      }))
    return;
  std::atomic<int> bad{0};
  std::mutex mu;
  std::string first;
  auto fail = [&](const std::string& s) {
    std::lock_guard lk(mu);
    if (bad++ == 0) first = s;
  };
  const std::size_t cnt = 3000;  // a few segments
  auto body = [&](Communicator& cm, int base, int it, const std::string& what) {
    std::vector<std::int32_t> mine(cnt), all(cnt * static_cast<std::size_t>(cm.size()));
    for (std::size_t i = 0; i < cnt; ++i)
      mine[i] = base + cm.rank() * 100000 + it * 10 + static_cast<std::int32_t>(i % 7);
    CollectiveOptions o;
    o.segment_bytes = 4096;
    cm.all_gather(mine.data(), all.data(), cnt, DataType::i32, o);
    bool reported = false;  // check everything, report once, and go on (the others do)
    for (int k = 0; k < cm.size() && !reported; ++k)
      for (std::size_t i = 0; i < cnt && !reported; ++i) {
        const std::int32_t want = base + k * 100000 + it * 10 + static_cast<std::int32_t>(i % 7);
        const std::int32_t got = all[static_cast<std::size_t>(k) * cnt + i];
        if (got != want) {
          fail(what + " all_gather iter " + std::to_string(it) + " rank " +
               std::to_string(cm.rank()) + " part " + std::to_string(k) + " [" +
               std::to_string(i) + "]: expected " + std::to_string(want) + ", got " +
               std::to_string(got));
          reported = true;
        }
      }
    std::int64_t x = base + cm.rank(), s = 0;
    cm.all_reduce(&x, &s, 1, DataType::i64, ReduceOp::sum, o);
    const std::int64_t want = static_cast<std::int64_t>(base) * cm.size() +
                              static_cast<std::int64_t>(cm.size()) * (cm.size() - 1) / 2;
    if (s != want)
      fail(what + " all_reduce iter " + std::to_string(it) + ": expected " +
           std::to_string(want) + ", got " + std::to_string(s));
  };
  run_ranks(comms, "parent and splits concurrently", [&](int r) {
    const auto ur = static_cast<std::size_t>(r);
    std::exception_ptr e1, e2;
    std::thread t1([&] {
      try {
        for (int it = 0; it < 20; ++it) body(rev[ur], 2000000, it, "reversed split");
      } catch (...) {
        e1 = std::current_exception();
      }
    });
    std::thread t2([&] {
      try {
        for (int it = 0; it < 20; ++it) body(par[ur], 4000000, it, "parity split");
      } catch (...) {
        e2 = std::current_exception();
      }
    });
    std::exception_ptr e0;
    try {
      for (int it = 0; it < 20; ++it) body(comms[ur], 1000000, it, "world");
    } catch (...) {
      e0 = std::current_exception();
    }
    t1.join();
    t2.join();
    for (auto& e : {e0, e1, e2})
      if (e) std::rethrow_exception(e);
  });
  EXPECT_EQ(bad.load(), 0) << first;
}

// ---- validation --------------------------------------------------------------------------

// Each call gets the same bad arguments on every rank; every rank must get invalid_argument
// naming the operation, and the communicator stays usable.
TEST(Collective, ValidationRejectsBadArguments) {
  for (int n : {1, 4}) {
    auto& comms = pooled_world(n);
    run_ranks(comms, "validation world=" + std::to_string(n), [&](int r) {
      Communicator& cm = comms[static_cast<std::size_t>(r)];
      CollectiveOptions o;
      o.timeout = 10s;  // a collective that does not validate fails with timeout, not a hang
      std::vector<std::int32_t> a(64, 1), b(64 * 8, 0);
      std::vector<float> f(64, 1.0f), g(64 * 8, 0.0f);
      auto expect_invalid = [&](const char* op, const char* what, auto&& call) {
        const std::string msg = expect_error(Errc::invalid_argument, call);
        EXPECT_TRUE(contains(msg, op)) << what << ": what() does not name " << op << ": " << msg;
      };
      // root out of range
      expect_invalid("broadcast", "broadcast root=n", [&] { cm.broadcast(a.data(), 4, DataType::i32, n, o); });
      expect_invalid("broadcast", "broadcast root=-1", [&] { cm.broadcast(a.data(), 4, DataType::i32, -1, o); });
      expect_invalid("reduce", "reduce root=n", [&] {
        cm.reduce(a.data(), b.data(), 4, DataType::i32, ReduceOp::sum, n, o);
      });
      expect_invalid("gather", "gather root=n+3", [&] { cm.gather(a.data(), b.data(), 4, DataType::i32, n + 3, o); });
      expect_invalid("scatter", "scatter root=-1", [&] { cm.scatter(b.data(), a.data(), 4, DataType::i32, -1, o); });
      expect_invalid("gather_v", "gather_v root=n", [&] {
        std::vector<std::size_t> cnt(static_cast<std::size_t>(n), 1), dis(static_cast<std::size_t>(n), 0);
        for (std::size_t i = 0; i < dis.size(); ++i) dis[i] = i;
        cm.igather_v(a.data(), 1, b.data(), cnt, dis, DataType::i32, n, o).wait();
      });
      // avg on integer types
      expect_invalid("all_reduce", "all_reduce avg i32", [&] {
        cm.all_reduce(a.data(), b.data(), 4, DataType::i32, ReduceOp::avg, o);
      });
      expect_invalid("reduce", "reduce avg u8", [&] {
        cm.reduce(a.data(), b.data(), 4, DataType::u8, ReduceOp::avg, 0, o);
      });
      expect_invalid("reduce_scatter", "reduce_scatter avg i64", [&] {
        cm.reduce_scatter(a.data(), b.data(), 4, DataType::i64, ReduceOp::avg, o);
      });
      expect_invalid("scan", "scan avg i32", [&] {
        cm.scan(a.data(), b.data(), 4, DataType::i32, ReduceOp::avg, o);
      });
      expect_invalid("exclusive_scan", "exclusive_scan avg u64", [&] {
        cm.exclusive_scan(a.data(), b.data(), 4, DataType::u64, ReduceOp::avg, o);
      });
      expect_invalid("all_reduce", "iall_reduce avg i32 (non-blocking)", [&] {
        cm.iall_reduce(a.data(), b.data(), 4, DataType::i32, ReduceOp::avg, o).wait();
      });
      // null buffers with count > 0
      expect_invalid("all_reduce", "all_reduce send=null", [&] {
        cm.all_reduce(nullptr, g.data(), 3, DataType::f32, ReduceOp::sum, o);
      });
      expect_invalid("all_reduce", "all_reduce recv=null", [&] {
        cm.all_reduce(f.data(), nullptr, 3, DataType::f32, ReduceOp::sum, o);
      });
      expect_invalid("broadcast", "broadcast buf=null", [&] { cm.broadcast(nullptr, 1, DataType::f32, 0, o); });
      expect_invalid("all_gather", "all_gather recv=null", [&] {
        cm.all_gather(f.data(), nullptr, 2, DataType::f32, o);
      });
      expect_invalid("all_to_all", "all_to_all send=null", [&] {
        cm.all_to_all(nullptr, g.data(), 2, DataType::f32, o);
      });
      expect_invalid("scan", "scan send=null", [&] {
        cm.scan(nullptr, g.data(), 2, DataType::f32, ReduceOp::sum, o);
      });
      if (n == 1)  // recv at the root must not be null (only the root can check it alone)
        expect_invalid("reduce", "reduce recv=null at the root", [&] {
          cm.reduce(f.data(), nullptr, 3, DataType::f32, ReduceOp::sum, 0, o);
        });
      // forced algorithms the collective lacks
      auto with = [&](Algorithm alg) {
        CollectiveOptions x = o;
        x.algorithm = alg;
        return x;
      };
      expect_invalid("all_reduce", "all_reduce dissemination", [&] {
        cm.all_reduce(f.data(), g.data(), 4, DataType::f32, ReduceOp::sum, with(Algorithm::dissemination));
      });
      expect_invalid("all_reduce", "all_reduce pairwise", [&] {
        cm.all_reduce(f.data(), g.data(), 4, DataType::f32, ReduceOp::sum, with(Algorithm::pairwise));
      });
      expect_invalid("broadcast", "broadcast halving_doubling", [&] {
        cm.broadcast(f.data(), 4, DataType::f32, 0, with(Algorithm::halving_doubling));
      });
      expect_invalid("barrier", "barrier ring", [&] { cm.barrier(with(Algorithm::ring)); });
      expect_invalid("all_to_all", "all_to_all ring", [&] {
        cm.all_to_all(f.data(), g.data(), 1, DataType::f32, with(Algorithm::ring));
      });
      expect_invalid("all_gather", "all_gather tree", [&] {
        cm.all_gather(f.data(), g.data(), 1, DataType::f32, with(Algorithm::tree));
      });
      expect_invalid("reduce_scatter", "reduce_scatter dissemination", [&] {
        cm.reduce_scatter(f.data(), g.data(), 4, DataType::f32, ReduceOp::sum, with(Algorithm::dissemination));
      });
      expect_invalid("gather", "gather pairwise", [&] {
        cm.gather(f.data(), g.data(), 1, DataType::f32, 0, with(Algorithm::pairwise));
      });
      expect_invalid("scan", "scan halving_doubling", [&] {
        cm.scan(f.data(), g.data(), 1, DataType::f32, ReduceOp::sum, with(Algorithm::halving_doubling));
      });
      // typed forms: recv too small
      expect_invalid("all_reduce", "typed all_reduce recv too small", [&] {
        cm.all_reduce(std::span<const float>(f.data(), 4), std::span<float>(g.data(), 3), ReduceOp::sum, o);
      });
      expect_invalid("all_gather", "typed all_gather recv too small", [&] {
        cm.all_gather(std::span<const float>(f.data(), 4),
                      std::span<float>(g.data(), 4 * static_cast<std::size_t>(n) - 1), o);
      });
      if (n > 1)
        expect_invalid("reduce_scatter", "typed reduce_scatter recv too small", [&] {
          cm.reduce_scatter(std::span<const float>(f.data(), 2 * static_cast<std::size_t>(n) + 1),
                            std::span<float>(g.data(), 1), ReduceOp::sum, o);
        });
      // Still usable.
      std::vector<std::int32_t> x(5, r + 1), y(5, 0);
      cm.all_reduce(x.data(), y.data(), 5, DataType::i32, ReduceOp::sum);
      EXPECT_EQ(y[4], n * (n + 1) / 2) << "all_reduce after the rejected calls, rank " << r;
    });
  }
  EXPECT_STREQ(nexar::to_string(Algorithm::halving_doubling), "halving_doubling");
  EXPECT_STREQ(nexar::to_string(Algorithm::recursive_doubling), "recursive_doubling");
  EXPECT_STREQ(nexar::to_string(Algorithm::dissemination), "dissemination");
}

// ---- odd cases ---------------------------------------------------------------------------

// reduce_scatter gives rank r block r (the library this replaces gave it block r+1).
TEST(Collective, ReduceScatterGivesRankRBlockR) {
  for (int n : {2, 3, 4, 7}) {
    auto& comms = pooled_world(n);
    const auto un = static_cast<std::size_t>(n);
    for (std::size_t count : {un, 2 * un + 1, std::size_t{1001}}) {
      std::vector<std::vector<std::int32_t>> out(un);
      const std::string ctx = "reduce_scatter i32 sum world=" + std::to_string(n) +
                              " count=" + std::to_string(count) + " (send[i] = i on every rank)";
      std::vector<std::int32_t> in(count);
      for (std::size_t i = 0; i < count; ++i) in[i] = static_cast<std::int32_t>(i);
      if (!run_ranks(comms, ctx, [&](int r) {
            auto& o = out[static_cast<std::size_t>(r)];
            o.assign(block_of(count, n, r).second, -1);
            comms[static_cast<std::size_t>(r)].reduce_scatter(std::span<const std::int32_t>(in),
                                                               std::span<std::int32_t>(o),
                                                               ReduceOp::sum);
          }))
        return;
      for (int r = 0; r < n; ++r) {
        const auto [off, len] = block_of(count, n, r);
        const auto& o = out[static_cast<std::size_t>(r)];
        if (len == 0) continue;
        const auto got_block = static_cast<std::size_t>(o[0]) / un;  // element index it holds
        int owner = -1;
        for (int k = 0; k < n; ++k) {
          const auto [ko, kl] = block_of(count, n, k);
          if (got_block >= ko && got_block < ko + kl) owner = k;
        }
        EXPECT_EQ(owner, r) << ctx << ": rank " << r << " got the block of rank " << owner
                            << " (first element " << o[0] << ", expected "
                            << static_cast<std::int64_t>(off) * n << ")";
        check_elements(ctx, r, "block", o.data(), len, [&, off = off](std::size_t i) {
          return exactly(static_cast<std::int32_t>((off + i) * un));
        });
      }
    }
  }
}

// NaN propagates through sum and min/max to every rank, bitwise identically; a single NaN
// operand of min/max comes out as that NaN made quiet.
TEST(Collective, NaNPropagatesAndIsIdenticalOnEveryRank) {
  const int n = 5;
  auto& comms = pooled_world(n);
  const float qnan_payload = [] {
    std::uint32_t b = 0x7FC01234u;
    float x;
    std::memcpy(&x, &b, 4);
    return x;
  }();
  const float snan = [] {
    std::uint32_t b = 0xFF801234u;  // signalling, negative
    float x;
    std::memcpy(&x, &b, 4);
    return x;
  }();
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::min, ReduceOp::max, ReduceOp::prod})
    for (Algorithm a : {Algorithm::ring, Algorithm::halving_doubling, Algorithm::recursive_doubling}) {
      const std::size_t count = 2 * n + 1;
      std::vector<std::vector<float>> in(n, std::vector<float>(count, 1.5f)), out(n);
      for (std::size_t i = 0; i < count; ++i) {
        in[i % n][i] = (i % 2) ? qnan_payload : snan;  // one NaN per element, on rank i % n
        in[(i + 1) % n][i] = static_cast<float>(i) - 3;
      }
      CollectiveOptions o;
      o.algorithm = a;
      const std::string ctx = std::string("all_reduce f32 ") + to_string(op) + " with one NaN per element, world=5 alg=" + to_string(a);
      if (!run_ranks(comms, ctx, [&](int r) {
            auto& ou = out[static_cast<std::size_t>(r)];
            ou.assign(count, 0.0f);
            comms[static_cast<std::size_t>(r)].all_reduce(in[static_cast<std::size_t>(r)].data(),
                                                          ou.data(), count, DataType::f32, op, o);
          }))
        return;
      for (int r = 0; r < n; ++r)
        for (std::size_t i = 0; i < count; ++i) {
          const float got = out[static_cast<std::size_t>(r)][i];
          EXPECT_TRUE(std::isnan(got)) << ctx << ": rank " << r << " [" << i << "] = " << show(got);
          EXPECT_EQ(bits_of(got), bits_of(out[0][i]))
              << ctx << ": rank " << r << " [" << i << "] differs from rank 0";
          if (op == ReduceOp::min || op == ReduceOp::max) {
            const std::uint32_t want = (i % 2) ? 0x7FC01234u : 0xFFC01234u;  // made quiet
            EXPECT_EQ(bits_of(got), want) << ctx << ": rank " << r << " [" << i << "]";
          }
        }
    }
}

// min(-0, +0) = -0 and max(-0, +0) = +0 whatever the order; ties of other values exact.
TEST(Collective, SignedZerosInMinMax) {
  const int n = 6;
  auto& comms = pooled_world(n);
  for (DataType t : {DataType::f32, DataType::f64, DataType::f16, DataType::bf16})
    with_type(t, [&]<class T>(std::type_identity<T>) {
      const std::size_t count = 64;
      std::vector<std::vector<T>> in(n, std::vector<T>(count)), out(n, std::vector<T>(count));
      for (int r = 0; r < n; ++r)
        for (std::size_t i = 0; i < count; ++i)  // a pattern of -0/+0 per element
          in[static_cast<std::size_t>(r)][i] =
              from_d<T>(((i >> (r % 6)) & 1) ? -0.0 : 0.0);
      for (ReduceOp op : {ReduceOp::min, ReduceOp::max})
        for (CollKind c : {CollKind::all_reduce, CollKind::reduce_scatter}) {
          const std::string ctx = std::string(name(c)) + " " + to_string(t) + " " + to_string(op) +
                                  " of signed zeros world=6";
          if (!run_ranks(comms, ctx, [&](int r) {
                auto& o = out[static_cast<std::size_t>(r)];
                const T* s = in[static_cast<std::size_t>(r)].data();
                if (c == CollKind::all_reduce)
                  comms[static_cast<std::size_t>(r)].all_reduce(s, o.data(), count, t, op);
                else
                  comms[static_cast<std::size_t>(r)].reduce_scatter(s, o.data(), count, t, op);
              }))
            return;
          for (int r = 0; r < n; ++r) {
            const std::size_t off = c == CollKind::all_reduce ? 0 : block_of(count, n, r).first;
            const std::size_t len = c == CollKind::all_reduce ? count : block_of(count, n, r).second;
            check_elements(ctx, r, "result", out[static_cast<std::size_t>(r)].data(), len,
                           [&](std::size_t i) {
                             bool any_neg = false, any_pos = false;
                             for (int k = 0; k < n; ++k)
                               (((off + i) >> (k % 6)) & 1 ? any_neg : any_pos) = true;
                             const bool neg = op == ReduceOp::min ? any_neg : !any_pos;
                             return exactly(from_d<T>(neg ? -0.0 : 0.0));
                           });
          }
        }
    });
}

// Known wraparound values, extremes of every integer type, f16 overflow to infinity.
TEST(Collective, IntegerWrapExtremesAndHalfOverflow) {
  const int n = 8;
  auto& comms = pooled_world(n);
  auto check_all = [&]<class T>(const char* what, ReduceOp op, std::vector<T> per_rank, T want) {
    std::vector<T> out(static_cast<std::size_t>(n) * 3, T{});
    const std::string ctx = std::string("all_reduce ") + to_string(nexar::dtype_of_v<T>) + " " +
                            to_string(op) + " world=8: " + what;
    if (!run_ranks(comms, ctx, [&](int r) {
          const T x[3] = {per_rank[static_cast<std::size_t>(r)], per_rank[static_cast<std::size_t>(r)],
                          per_rank[static_cast<std::size_t>(r)]};
          comms[static_cast<std::size_t>(r)].all_reduce(x, out.data() + 3 * r, 3,
                                                        nexar::dtype_of_v<T>, op);
        }))
      return;
    check_elements(ctx, -1, "results of all ranks", out.data(), out.size(),
                   [&](std::size_t) { return exactly(want); });
  };
  using L8 = std::numeric_limits<std::int8_t>;
  check_all.template operator()<std::int8_t>("8 x 100 = 800 = 32 mod 256", ReduceOp::sum,
                                             std::vector<std::int8_t>(8, 100), 32);
  check_all.template operator()<std::uint8_t>("3^8 = 6561 = 161 mod 256", ReduceOp::prod,
                                              std::vector<std::uint8_t>(8, 3), 161);
  check_all.template operator()<std::int8_t>("-128 min", ReduceOp::min,
                                             {5, L8::min(), 0, 1, 2, 3, 4, L8::max()}, L8::min());
  check_all.template operator()<std::int32_t>("2^31-1 + 7 x 1 wraps negative", ReduceOp::sum,
                                              {INT32_MAX, 1, 1, 1, 1, 1, 1, 1}, INT32_MIN + 6);
  check_all.template operator()<std::uint32_t>("2^4 ^ 8 = 2^32 = 0", ReduceOp::prod,
                                               std::vector<std::uint32_t>(8, 16), 0u);
  check_all.template operator()<std::int64_t>("int64 extremes max", ReduceOp::max,
                                              {INT64_MIN, -1, 0, INT64_MAX, 5, 6, 7, 8}, INT64_MAX);
  check_all.template operator()<std::int64_t>("(-1)^8 x min", ReduceOp::prod,
                                              {INT64_MIN, -1, -1, -1, -1, -1, -1, -1}, INT64_MIN);
  check_all.template operator()<std::uint64_t>("2^64-1 x 8 = -8 mod 2^64", ReduceOp::sum,
                                               std::vector<std::uint64_t>(8, UINT64_MAX),
                                               static_cast<std::uint64_t>(-8));
  check_all.template operator()<std::uint64_t>("u64 min with 0", ReduceOp::min,
                                               {UINT64_MAX, 3, 0, 9, 9, 9, 9, 9}, 0u);
  check_all.template operator()<nexar::half>("f16 prod 8 x 2^-3 = 2^-24, the smallest subnormal",
                                             ReduceOp::prod,
                                             std::vector<nexar::half>(8, nexar::to_half(0.125f)),
                                             nexar::half{0x0001});
  check_all.template operator()<nexar::half>("8 x 40000 overflows f16 to +inf", ReduceOp::sum,
                                             std::vector<nexar::half>(8, nexar::to_half(40000.0f)),
                                             nexar::half{0x7C00});
  check_all.template operator()<nexar::half>("f16 prod 8 x 2^-4 = 2^-32 underflows to +0",
                                             ReduceOp::prod,
                                             std::vector<nexar::half>(8, nexar::to_half(0.0625f)),
                                             nexar::half{0x0000});
  check_all.template operator()<nexar::bfloat16>(
      "bf16 sum 8 x 1.5 = 12 exactly", ReduceOp::sum,
      std::vector<nexar::bfloat16>(8, nexar::to_bfloat16(1.5f)), nexar::to_bfloat16(12.0f));
  check_all.template operator()<float>("f32 max of equal values",
                                       ReduceOp::max, std::vector<float>(8, 0.1f), 0.1f);
}

// exclusive_scan leaves rank 0's recv as it was (in place too); scan of rank r includes r.
TEST(Collective, ExclusiveScanLeavesRankZeroUnchanged) {
  for (int n : {1, 2, 5}) {
    auto& comms = pooled_world(n);
    std::vector<std::array<std::int64_t, 4>> ex(static_cast<std::size_t>(n)),
        inc(static_cast<std::size_t>(n)), inpl(static_cast<std::size_t>(n));
    if (!run_ranks(comms, "scans world=" + std::to_string(n), [&](int r) {
          Communicator& cm = comms[static_cast<std::size_t>(r)];
          const auto ur = static_cast<std::size_t>(r);
          const std::array<std::int64_t, 4> x{r + 1, 10 * (r + 1), -(r + 1), 7};
          ex[ur].fill(-99);
          cm.exclusive_scan(x.data(), ex[ur].data(), 4, DataType::i64, ReduceOp::sum);
          cm.scan(x.data(), inc[ur].data(), 4, DataType::i64, ReduceOp::sum);
          inpl[ur] = x;
          cm.exclusive_scan(inpl[ur].data(), inpl[ur].data(), 4, DataType::i64, ReduceOp::max);
        }))
      return;
    for (int r = 0; r < n; ++r) {
      const auto ur = static_cast<std::size_t>(r);
      const std::int64_t before = static_cast<std::int64_t>(r) * (r + 1) / 2;
      const std::int64_t upto = static_cast<std::int64_t>(r + 1) * (r + 2) / 2;
      const std::array<std::int64_t, 4> want_ex =
          r == 0 ? std::array<std::int64_t, 4>{-99, -99, -99, -99}
                 : std::array<std::int64_t, 4>{before, 10 * before, -before, 7 * r};
      EXPECT_EQ(ex[ur], want_ex) << "exclusive_scan i64 sum world=" << n << " rank " << r;
      const std::array<std::int64_t, 4> want_inc{upto, 10 * upto, -upto, 7 * (r + 1)};
      EXPECT_EQ(inc[ur], want_inc) << "scan i64 sum world=" << n << " rank " << r;
      const std::array<std::int64_t, 4> want_in =
          r == 0 ? std::array<std::int64_t, 4>{1, 10, -1, 7}
                 : std::array<std::int64_t, 4>{r, 10 * r, -1, 7};
      EXPECT_EQ(inpl[ur], want_in) << "exclusive_scan i64 max in place world=" << n << " rank " << r;
    }
  }
}

// The typed span forms, with the 16-bit float types.
TEST(Collective, TypedSpanForms) {
  const int n = 4;
  auto& comms = pooled_world(n);
  std::vector<std::vector<nexar::half>> ar(n), ag(n);
  std::vector<std::vector<nexar::bfloat16>> bc(n), rs(n);
  std::vector<std::vector<double>> ar2(n);
  if (!run_ranks(comms, "typed forms world=4", [&](int r) {
        Communicator& cm = comms[static_cast<std::size_t>(r)];
        const auto ur = static_cast<std::size_t>(r);
        ar[ur].assign(9, nexar::to_half(static_cast<float>(r) + 0.5f));
        cm.all_reduce(std::span<nexar::half>(ar[ur]), ReduceOp::sum);
        const std::vector<double> in(7, r * 0.25);
        ar2[ur].assign(7, -1);
        cm.all_reduce(std::span<const double>(in), std::span<double>(ar2[ur]), ReduceOp::max);
        bc[ur].assign(5, r == 2 ? nexar::to_bfloat16(3.0f) : nexar::bfloat16{});
        cm.broadcast(std::span<nexar::bfloat16>(bc[ur]), 2);
        const std::vector<nexar::half> mine(3, nexar::to_half(static_cast<float>(r)));
        ag[ur].assign(12, nexar::half{});
        cm.all_gather(std::span<const nexar::half>(mine), std::span<nexar::half>(ag[ur]));
        std::vector<nexar::bfloat16> send(10);
        for (std::size_t i = 0; i < 10; ++i) send[i] = nexar::to_bfloat16(static_cast<float>(i));
        rs[ur].assign(block_of(10, n, r).second, nexar::bfloat16{});
        cm.reduce_scatter(std::span<const nexar::bfloat16>(send), std::span<nexar::bfloat16>(rs[ur]),
                          ReduceOp::sum);
      }))
    return;
  for (int r = 0; r < n; ++r) {
    const auto ur = static_cast<std::size_t>(r);
    const std::string ctx = "typed forms world=4";
    check_elements(ctx + " all_reduce(span<half>) sum", r, "result", ar[ur].data(), 9,
                   [&](std::size_t) { return exactly(nexar::to_half(8.0f)); });
    check_elements(ctx + " all_reduce(span<const double>, span<double>) max", r, "result",
                   ar2[ur].data(), 7, [&](std::size_t) { return exactly(0.75); });
    check_elements(ctx + " broadcast(span<bfloat16>) root 2", r, "result", bc[ur].data(), 5,
                   [&](std::size_t) { return exactly(nexar::to_bfloat16(3.0f)); });
    check_elements(ctx + " all_gather(span<const half>, span<half>)", r, "result", ag[ur].data(), 12,
                   [&](std::size_t i) { return exactly(nexar::to_half(static_cast<float>(i / 3))); });
    const auto off = block_of(10, n, r).first;
    check_elements(ctx + " reduce_scatter(span<const bfloat16>, span<bfloat16>) sum", r, "result",
                   rs[ur].data(), rs[ur].size(), [&](std::size_t i) {
                     return exactly(nexar::to_bfloat16(static_cast<float>((off + i) * 4)));
                   });
  }
}

}  // namespace

// Regression: wait_for(d) on a collective ran the whole collective inline, returning only
// when every rank had joined, long after d.
TEST(Collective, WaitForRespectsItsBoundWhileOthersAreLate) {
  auto comms = nexar::bootstrap_local(2, test_config());
  float a = 1, b = 2;
  nexar::Request r = comms[1].iall_reduce(&b, &b, 1, DataType::f32, ReduceOp::sum);
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(r.wait_for(std::chrono::milliseconds(1)));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(400));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  comms[0].all_reduce(&a, &a, 1, DataType::f32, ReduceOp::sum);
  r.wait();
  EXPECT_EQ(a, 3.0f);
  EXPECT_EQ(b, 3.0f);
}

// Typed forms of the rooted and personalized collectives, against hand-computed values.
TEST(Collective, MoreTypedSpanForms) {
  constexpr int n = 3;
  auto comms = nexar::bootstrap_local(n, test_config());
  std::vector<std::thread> ts;
  std::vector<std::string> errors(n);
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      try {
        auto& c = comms[static_cast<std::size_t>(r)];
        std::vector<int> s(6), g(18), a2a(6), sc(6), red(6), scn(6);
        for (int i = 0; i < 6; ++i) s[static_cast<std::size_t>(i)] = r * 10 + i;
        c.gather(std::span<const int>(s), std::span<int>(g), 1);
        if (r == 1)
          for (int i = 0; i < 18; ++i)
            if (g[static_cast<std::size_t>(i)] != (i / 6) * 10 + i % 6) errors[1] += "gather ";
        c.all_to_all(std::span<const int>(s), std::span<int>(a2a));
        for (int j = 0; j < n; ++j)  // block j came from rank j: its block r
          for (int k = 0; k < 2; ++k)
            if (a2a[static_cast<std::size_t>(2 * j + k)] != j * 10 + 2 * r + k) errors[static_cast<std::size_t>(r)] += "all_to_all ";
        c.scatter(std::span<const int>(g), std::span<int>(sc), 1);
        for (int i = 0; i < 6; ++i)
          if (sc[static_cast<std::size_t>(i)] != r * 10 + i) errors[static_cast<std::size_t>(r)] += "scatter ";
        c.reduce(std::span<const int>(s), std::span<int>(red), ReduceOp::sum, 0);
        if (r == 0 && red[2] != 0 + 10 + 20 + 3 * 2) errors[0] += "reduce ";
        c.scan(std::span<const int>(s), std::span<int>(scn), ReduceOp::sum);
        const int want = r == 0 ? 0 : r == 1 ? 10 : 30;
        if (scn[0] != want) errors[static_cast<std::size_t>(r)] += "scan ";
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] += e.what();
      }
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[static_cast<std::size_t>(r)], "") << "rank " << r;
  std::vector<int> s(6), small(2);
  try {
    comms[0].gather(std::span<const int>(s), std::span<int>(small), 0);
    ADD_FAILURE() << "a too small gather span was accepted";
  } catch (const nexar::Error& e) {
    EXPECT_EQ(e.code(), nexar::Errc::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("gather"), std::string::npos) << e.what();
  }
}


// A blocking collective's task stays with its caller (help) until handed over (kick); the
// runner thread runs the others.
TEST(CollectiveRunner, CallerWaitsTasksAreLeftToTheCallerUntilHandedOver) {
  using nexar::detail::CollectiveRunner;
  CollectiveRunner runner;
  std::atomic<int> ran{0};
  std::thread::id where;
  auto task = [&] {
    return CollectiveRunner::Task{[&] {
                                    where = std::this_thread::get_id();
                                    ran.fetch_add(1);
                                  },
                                  {}};
  };
  auto wait_ran = [&](int n) {
    for (int i = 0; i < 2000 && ran.load() < n; ++i) std::this_thread::sleep_for(1ms);
    return ran.load() >= n;
  };

  const auto a = runner.submit(true, task());
  std::this_thread::sleep_for(30ms);
  EXPECT_EQ(ran.load(), 0) << "the runner thread took a task its caller was about to run";
  EXPECT_TRUE(runner.ready(a));
  EXPECT_TRUE(runner.help(a));
  EXPECT_EQ(ran.load(), 1);
  EXPECT_EQ(where, std::this_thread::get_id());

  const auto b = runner.submit(true, task());
  std::this_thread::sleep_for(30ms);
  EXPECT_EQ(ran.load(), 1);
  runner.kick(b);
  ASSERT_TRUE(wait_ran(2)) << "a handed-over task never ran";
  EXPECT_NE(where, std::this_thread::get_id());
  EXPECT_FALSE(runner.help(b));

  // Tasks nobody waits for inline run on the runner thread at once.
  runner.submit(false, task());
  ASSERT_TRUE(wait_ran(3));
  EXPECT_NE(where, std::this_thread::get_id());
  runner.stop();
}
