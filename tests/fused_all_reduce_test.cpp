// Tests of the fused all_reduce variants of Communicator: iall_reduce_bucketed (many buffers
// reduced as one operation), iall_reduce_sharded (reduce-scatter + all-gather with the
// shard handed out) and iall_reduce_compressed (top-k / random-k with error feedback), over
// real QUIC between the ranks of bootstrap_local worlds of 1 to 5 ranks (one thread each).
//
// Every expected value is computed here from the inputs with plain loops (the references of
// collective_support.hpp, or sums in double of values that make every sum exact); nothing
// calls the library to compute what it should return, except the one check that a
// compressed all_reduce with ratio 1 equals a plain all_reduce.
#include <nexar/nexar.hpp>

#include <gtest/gtest.h>

#include "collective_support.hpp"
#include "support.hpp"

#include <numeric>
#include <set>

namespace {

using namespace nexar::coll_test;
using nexar::Algorithm;
using nexar::block_of;
using nexar::CollectiveOptions;
using nexar::Communicator;
using nexar::Compression;
using nexar::DataType;
using nexar::Errc;
using nexar::ErrorFeedback;
using nexar::MutableBuffer;
using nexar::ReduceOp;
using nexar::Request;
using nexar::testing::contains;
using nexar::testing::expect_error;

constexpr int worlds[] = {1, 2, 3, 4, 5};

// One reduction to run: element type, op, kind of data, forced algorithm, segment size.
struct Case {
  DataType dt = DataType::f32;
  ReduceOp op = ReduceOp::sum;
  Data kind = Data::random;
  Algorithm alg = Algorithm::automatic;
  std::size_t segment = 0;  // CollectiveOptions::segment_bytes (0: the Config's)
};

std::string describe(const char* what, const Case& c, int world) {
  std::ostringstream os;
  os << what << " " << nexar::to_string(c.dt) << " " << nexar::to_string(c.op) << " data=" << name(c.kind)
     << " alg=" << nexar::to_string(c.alg) << " segment_bytes=" << c.segment << " world=" << world;
  return os.str();
}

CollectiveOptions options_of(const Case& c) {
  CollectiveOptions o;
  o.algorithm = c.alg;
  o.segment_bytes = c.segment;
  return o;
}

// gen(), except that integer prod uses small factors (-2..3; 1..3 unsigned), so that the
// products are not merely wrapped bit patterns.
template <class T>
std::vector<T> input(std::size_t count, ReduceOp op, Data kind, std::uint64_t seed) {
  if constexpr (!is_float_v<T>) {
    if (op == ReduceOp::prod) {
      static constexpr int factors[] = {-2, -1, 1, 2, 3};
      std::mt19937_64 rng(seed);
      std::vector<T> v(count);
      for (auto& x : v) {
        int f = factors[rng() % 5];
        if constexpr (std::is_unsigned_v<T>) f = f < 0 ? -f : f;
        x = static_cast<T>(f);
      }
      return v;
    }
  }
  return gen<T>(count, op, kind, seed);
}

// ---- bucketed ----------------------------------------------------------------------------

// Buffer counts of one bucketed call: empty ones (one passed as a null pointer), single
// elements, odd sizes, and in `large` one buffer that takes the total past the ring
// threshold of the default Config.
std::vector<std::size_t> layout(bool large) {
  if (large) return {3, 0, 70001, 1, 0, 129};
  return {1, 0, 7, 0, 33, 1, 129, 5};
}

// Runs one iall_reduce_bucketed over `counts` on every rank and checks every buffer against
// the reference, its guard element, and that every rank holds the same bits.
template <class T>
void run_bucketed(std::vector<Communicator>& comms, const Case& c,
                  const std::vector<std::size_t>& counts, std::uint64_t seed) {
  const int n = static_cast<int>(comms.size());
  const auto un = static_cast<std::size_t>(n);
  const std::size_t nb = counts.size();
  std::string ctx = describe("all_reduce_bucketed", c, n) + " counts={";
  for (std::size_t b = 0; b < nb; ++b) ctx += (b ? "," : "") + std::to_string(counts[b]);
  ctx += "}";
  const T guard = sentinel<T>();
  // in[b][r]: rank r's input of buffer b; buf[r][b]: rank r's buffer b plus a guard element.
  std::vector<std::vector<std::vector<T>>> in(nb, std::vector<std::vector<T>>(un));
  std::vector<std::vector<std::vector<T>>> buf(un, std::vector<std::vector<T>>(nb));
  for (std::size_t b = 0; b < nb; ++b)
    for (std::size_t r = 0; r < un; ++r) {
      in[b][r] = input<T>(counts[b], c.op, c.kind, mix(seed, b * 1009 + r));
      buf[r][b] = in[b][r];
      buf[r][b].push_back(guard);
    }
  const CollectiveOptions o = options_of(c);
  bool null_zero = true;  // the first empty buffer is passed as a null pointer
  std::vector<bool> as_null(nb, false);
  for (std::size_t b = 0; b < nb; ++b)
    if (counts[b] == 0 && null_zero) {
      as_null[b] = true;
      null_zero = false;
    }
  const bool ok = run_ranks(comms, ctx, [&](int r) {
    const auto ur = static_cast<std::size_t>(r);
    std::vector<MutableBuffer> mb;
    for (std::size_t b = 0; b < nb; ++b)
      mb.push_back({as_null[b] ? nullptr : buf[ur][b].data(), counts[b]});
    Request q = comms[ur].iall_reduce_bucketed(mb, c.dt, c.op, o);
    mb.clear();  // the library keeps its own copy of the list
    q.wait();
  });
  if (!ok) return;
  for (std::size_t r = 0; r < un; ++r) {
    const int ir = static_cast<int>(r);
    for (std::size_t b = 0; b < nb; ++b) {
      const std::string bctx = ctx + " buffer " + std::to_string(b);
      const auto& got = buf[r][b];
      if (!same_bits(got[counts[b]], guard))
        ADD_FAILURE() << bctx << ": rank " << r << " wrote past the end of the buffer";
      check_elements(bctx, ir, "result", got.data(), counts[b], [&](std::size_t i) {
        return reference<T>(in[b], i, c.op, 0, n, c.kind);
      });
      if (r > 0)
        check_bytes(bctx, ir, "result (against rank 0's)",
                    reinterpret_cast<const std::byte*>(got.data()),
                    reinterpret_cast<const std::byte*>(buf[0][b].data()), counts[b] * sizeof(T),
                    sizeof(T));
    }
  }
}

void run_bucketed(std::vector<Communicator>& comms, const Case& c,
                  const std::vector<std::size_t>& counts, std::uint64_t seed) {
  with_type(c.dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    run_bucketed<T>(comms, c, counts, seed);
  });
}

// Every dtype family and op, at every world size 1..5, over a layout of small odd buffers;
// float sum with random data over a layout past the ring threshold.
TEST(FusedAllReduce, BucketedMatchesReference) {
  const Case cases[] = {
      {DataType::f32, ReduceOp::sum, Data::random},  {DataType::f64, ReduceOp::sum, Data::random},
      {DataType::f32, ReduceOp::avg, Data::random},  {DataType::f64, ReduceOp::avg, Data::exact},
      {DataType::f32, ReduceOp::max, Data::random},  {DataType::f16, ReduceOp::sum, Data::exact},
      {DataType::bf16, ReduceOp::min, Data::random}, {DataType::i32, ReduceOp::prod, Data::random},
      {DataType::u8, ReduceOp::prod, Data::random},  {DataType::i64, ReduceOp::sum, Data::random},
      {DataType::u32, ReduceOp::max, Data::random},  {DataType::i8, ReduceOp::min, Data::random},
  };
  std::uint64_t seed = 1;
  for (int n : worlds) {
    auto& comms = pooled_world(n);
    for (const Case& c : cases) run_bucketed(comms, c, layout(false), ++seed);
    run_bucketed(comms, {DataType::f32, ReduceOp::sum, Data::random}, layout(true), ++seed);
  }
}

// Every algorithm all_reduce takes, forced, with a small pipelining segment.
TEST(FusedAllReduce, BucketedForcedAlgorithms) {
  std::uint64_t seed = 100;
  for (int n : {2, 3, 5}) {
    auto& comms = pooled_world(n);
    for (Algorithm a : {Algorithm::ring, Algorithm::halving_doubling, Algorithm::recursive_doubling}) {
      run_bucketed(comms, {DataType::f64, ReduceOp::sum, Data::random, a, 4096}, layout(false), ++seed);
      run_bucketed(comms, {DataType::i32, ReduceOp::max, Data::random, a, 4096}, layout(false), ++seed);
    }
  }
}

// No buffers at all, and only empty ones: complete without touching anything.
TEST(FusedAllReduce, BucketedWithNothingToReduce) {
  for (int n : {1, 3}) {
    auto& comms = pooled_world(n);
    std::vector<std::vector<float>> keep(static_cast<std::size_t>(n), std::vector<float>(1, 5.0f));
    run_ranks(comms, "all_reduce_bucketed nothing world=" + std::to_string(n), [&](int r) {
      auto& cm = comms[static_cast<std::size_t>(r)];
      cm.iall_reduce_bucketed({}, DataType::f32, ReduceOp::sum).wait();
      const MutableBuffer empty[] = {{nullptr, 0}, {keep[static_cast<std::size_t>(r)].data(), 0}};
      cm.iall_reduce_bucketed(empty, DataType::f32, ReduceOp::sum).wait();
    });
    for (const auto& k : keep) EXPECT_EQ(k[0], 5.0f) << "world=" << n << ": an empty buffer was written";
  }
}

// Two bucketed calls in flight at once on one communicator, each over its own buffers.
TEST(FusedAllReduce, BucketedNonBlockingTwoInFlight) {
  for (int n : {2, 4}) {
    auto& comms = pooled_world(n);
    const auto un = static_cast<std::size_t>(n);
    std::vector<std::vector<std::int64_t>> a(un), b(un), c(un);
    const std::string ctx = "two iall_reduce_bucketed in flight world=" + std::to_string(n);
    const bool ok = run_ranks(comms, ctx, [&](int r) {
      const auto ur = static_cast<std::size_t>(r);
      a[ur].assign(11, r + 1);
      b[ur].assign(3, 10 * (r + 1));
      c[ur].assign(1001, -(r + 1));
      const MutableBuffer first[] = {{a[ur].data(), 11}, {b[ur].data(), 3}};
      const MutableBuffer second[] = {{c[ur].data(), 1001}};
      Request q1 = comms[ur].iall_reduce_bucketed(first, DataType::i64, ReduceOp::sum);
      Request q2 = comms[ur].iall_reduce_bucketed(second, DataType::i64, ReduceOp::min);
      q2.wait();
      q1.wait();
    });
    if (!ok) return;
    const std::int64_t tri = static_cast<std::int64_t>(n) * (n + 1) / 2;
    for (std::size_t r = 0; r < un; ++r) {
      const int ir = static_cast<int>(r);
      check_elements(ctx, ir, "first call, buffer 0", a[r].data(), 11,
                     [&](std::size_t) { return exactly(tri); });
      check_elements(ctx, ir, "first call, buffer 1", b[r].data(), 3,
                     [&](std::size_t) { return exactly(10 * tri); });
      check_elements(ctx, ir, "second call (min)", c[r].data(), 1001,
                     [&](std::size_t) { return exactly(static_cast<std::int64_t>(-n)); });
    }
  }
}

// ---- sharded -----------------------------------------------------------------------------

enum class Out { recv_and_shard, shard_only, recv_only };

const char* name(Out m) {
  switch (m) {
    case Out::recv_and_shard: return "recv+shard";
    case Out::shard_only: return "shard only";
    case Out::recv_only: return "recv only";
  }
  return "?";
}

// Runs one iall_reduce_sharded on every rank and checks: the shard is block rank() (by
// block_of) of the reference, recv the whole reference, bitwise the same on every rank and
// equal to the shard where both are asked for; guards untouched; send untouched.
template <class T>
void run_sharded(std::vector<Communicator>& comms, const Case& c, std::size_t count, Out mode,
                 bool in_place, std::uint64_t seed) {
  const int n = static_cast<int>(comms.size());
  const auto un = static_cast<std::size_t>(n);
  const std::string ctx = describe("all_reduce_sharded", c, n) + " count=" +
                          std::to_string(count) + " " + name(mode) + (in_place ? " in_place" : "");
  const T guard = sentinel<T>();
  const bool want_recv = mode != Out::shard_only, want_shard = mode != Out::recv_only;
  std::vector<std::vector<T>> in(un), send(un), recv(un), shard(un);
  for (std::size_t r = 0; r < un; ++r) {
    in[r] = input<T>(count, c.op, c.kind, mix(seed, r * 7919 + count));
    send[r] = in[r];
    if (want_recv) {
      recv[r] = in_place ? in[r] : std::vector<T>(count, guard);
      recv[r].push_back(guard);
    }
    // An empty shard still gets a (one-guard) buffer: nothing may be written there.
    shard[r].assign(block_of(count, n, static_cast<int>(r)).second + 1, guard);
  }
  const CollectiveOptions o = options_of(c);
  const bool ok = run_ranks(comms, ctx, [&](int r) {
    const auto ur = static_cast<std::size_t>(r);
    const void* s = in_place ? recv[ur].data() : send[ur].data();
    comms[ur]
        .iall_reduce_sharded(s, want_recv ? recv[ur].data() : nullptr,
                             want_shard ? shard[ur].data() : nullptr, count, c.dt, c.op, o)
        .wait();
  });
  if (!ok) return;
  for (std::size_t r = 0; r < un; ++r) {
    const int ir = static_cast<int>(r);
    const auto [off, len] = block_of(count, n, ir);
    auto want = [&, off = off](std::size_t i) {
      return reference<T>(in, off + i, c.op, 0, n, c.kind);
    };
    if (!in_place)
      check_elements(ctx, ir, "send (must be left untouched)", send[r].data(), count,
                     [&](std::size_t i) { return exactly(in[r][i]); });
    if (!same_bits(shard[r][len], guard))
      ADD_FAILURE() << ctx << ": rank " << r << " wrote past the end of its shard (block of "
                    << len << " elements)";
    if (want_shard) check_elements(ctx, ir, "shard", shard[r].data(), len, want);
    if (!want_recv) continue;
    if (!same_bits(recv[r][count], guard))
      ADD_FAILURE() << ctx << ": rank " << r << " wrote past the end of recv";
    check_elements(ctx, ir, "recv", recv[r].data(), count,
                   [&](std::size_t i) { return reference<T>(in, i, c.op, 0, n, c.kind); });
    const auto* got = reinterpret_cast<const std::byte*>(recv[r].data());
    if (r > 0)
      check_bytes(ctx, ir, "recv (against rank 0's)", got,
                  reinterpret_cast<const std::byte*>(recv[0].data()), count * sizeof(T), sizeof(T));
    if (want_shard)
      check_bytes(ctx, ir, "shard (against its block of recv)",
                  reinterpret_cast<const std::byte*>(shard[r].data()), got + off * sizeof(T),
                  len * sizeof(T), sizeof(T));
  }
}

void run_sharded(std::vector<Communicator>& comms, const Case& c, std::size_t count, Out mode,
                 bool in_place, std::uint64_t seed) {
  with_type(c.dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    run_sharded<T>(comms, c, count, mode, in_place, seed);
  });
}

// Counts 0, 1, smaller than the world (some shards empty), around and not divisible by the
// world, and large ones pipelined in 4 KiB segments; each in the three output modes.
TEST(FusedAllReduce, ShardedMatchesReference) {
  const Case cases[] = {
      {DataType::f32, ReduceOp::sum, Data::random, Algorithm::automatic, 4096},
      {DataType::f64, ReduceOp::avg, Data::exact, Algorithm::ring, 4096},
      {DataType::f32, ReduceOp::avg, Data::random},
      {DataType::i32, ReduceOp::max, Data::random},
      {DataType::u8, ReduceOp::prod, Data::random},
      {DataType::i64, ReduceOp::sum, Data::random},
  };
  std::uint64_t seed = 1000;
  for (int n : worlds) {
    auto& comms = pooled_world(n);
    const auto un = static_cast<std::size_t>(n);
    const std::set<std::size_t> counts = {0, 1, 3, n > 1 ? un - 1 : 2, un + 1, 2 * un + 1, 1001};
    for (std::size_t ci = 0; ci < std::size(cases); ++ci) {
      const Case& c = cases[ci];
      for (std::size_t count : counts)
        for (Out m : {Out::recv_and_shard, Out::shard_only, Out::recv_only})
          run_sharded(comms, c, count, m, m != Out::shard_only && (count + ci) % 2 == 0, ++seed);
    }
    // Many segments per block.
    for (Out m : {Out::recv_and_shard, Out::shard_only, Out::recv_only})
      run_sharded(comms, cases[0], 20011, m, m == Out::recv_only, ++seed);
  }
}

// ---- compressed --------------------------------------------------------------------------

// The k of the documented rule: ceil(ratio * count), at least 1 (and at most count).
std::size_t k_of(double ratio, std::size_t count) {
  const auto k = static_cast<std::size_t>(std::ceil(ratio * static_cast<double>(count)));
  return std::min(count, std::max<std::size_t>(1, k));
}

template <class T>
std::vector<T> residual_of(const ErrorFeedback& s) {
  std::vector<T> v(s.residual().size() / sizeof(T));
  if (!v.empty()) std::memcpy(v.data(), s.residual().data(), v.size() * sizeof(T));
  return v;
}

// The positions of the k largest magnitudes of g (ascending); among equal magnitudes the
// lower index first (the rule compressed.cpp documents). With distinct magnitudes the
// tie rule plays no part.
template <class T>
std::vector<std::size_t> top_k(const std::vector<T>& g, std::size_t k) {
  std::vector<std::size_t> idx(g.size());
  std::iota(idx.begin(), idx.end(), std::size_t{0});
  std::stable_sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) {
    return std::abs(static_cast<double>(g[a])) > std::abs(static_cast<double>(g[b]));
  });
  idx.resize(k);
  std::sort(idx.begin(), idx.end());
  return idx;
}

// The expected result of one element from the exact (double) sum of what the ranks sent:
// sum, or for avg the sum divided by the world in T (one rounding: the sum is exact).
template <class T>
T expected_result(double sum, ReduceOp op, int n) {
  if (op == ReduceOp::avg) return static_cast<T>(static_cast<T>(sum) / static_cast<T>(n));
  return static_cast<T>(sum);
}

// One compressed step on every rank: data[r] (count elements, plus a guard) in place.
template <class T>
bool compressed_step(std::vector<Communicator>& comms, const std::string& ctx,
                     std::vector<std::vector<T>>& data, std::vector<ErrorFeedback>& st,
                     std::size_t count, ReduceOp op, const CollectiveOptions& o = {}) {
  return run_ranks(comms, ctx, [&](int r) {
    const auto ur = static_cast<std::size_t>(r);
    comms[ur].iall_reduce_compressed(data[ur].data(), count, nexar::dtype_of_v<T>, op, st[ur], o).wait();
  });
}

// Distinct magnitudes (a permutation of 1..count, eighths, random signs): the top k are
// unambiguous.
template <class T>
std::vector<T> distinct_magnitudes(std::size_t count, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<T> g(count);
  for (std::size_t i = 0; i < count; ++i) g[i] = static_cast<T>(static_cast<double>(i + 1) / 8);
  for (std::size_t i = count; i > 1; --i) std::swap(g[i - 1], g[rng() % i]);
  for (auto& x : g)
    if (rng() & 1) x = -x;
  return g;
}

// top_k over several steps with one ErrorFeedback per rank. Each step the test chooses
// g = input + residual with distinct magnitudes (input = g - the residual it expects), so
// what each rank sends is fixed by the definition alone: its k largest |g|. Checks, every
// step: the residual is g with the sent elements zeroed, the result is the sum (avg: the
// mean) over ranks of what they sent and zero elsewhere, the same bits on every rank, and
// steps(); at the end, per rank, sent + final residual = sum of inputs (conservation), and
// for sum, results + residuals of all ranks = inputs of all ranks. All values are eighths
// of small integers, so every sum is exact and the expected bits are unique.
// Conservation over the steps of a compressed all_reduce with error feedback: on every rank
// what it sent plus its final residual equals the sum of its inputs, and (for sum) the
// results plus every rank's residual equal the inputs of all ranks: nothing was lost or
// made up.
template <class T>
void check_conservation(const std::string& base, const std::vector<ErrorFeedback>& st,
                        const std::vector<std::vector<double>>& inputs_sum,
                        const std::vector<std::vector<double>>& sent_sum,
                        const std::vector<double>& result_sum, ReduceOp op) {
  const std::size_t count = result_sum.size();
  std::vector<double> all_inputs(count, 0.0), all_res(count, 0.0);
  for (std::size_t r = 0; r < st.size(); ++r) {
    const auto res = residual_of<T>(st[r]);
    for (std::size_t i = 0; i < count; ++i) {
      EXPECT_EQ(sent_sum[r][i] + static_cast<double>(res[i]), inputs_sum[r][i])
          << base << ": rank " << r << " [" << i << "]: sent + final residual != sum of inputs";
      all_inputs[i] += inputs_sum[r][i];
      all_res[i] += static_cast<double>(res[i]);
    }
  }
  if (op == ReduceOp::sum) {
    for (std::size_t i = 0; i < count; ++i)
      EXPECT_EQ(result_sum[i] + all_res[i], all_inputs[i])
          << base << " [" << i << "]: results + residuals of all ranks != inputs of all ranks";
  }
}

template <class T>
void run_top_k(std::vector<Communicator>& comms, ReduceOp op, std::size_t count, double ratio,
               std::uint64_t seed) {
  const int n = static_cast<int>(comms.size());
  const auto un = static_cast<std::size_t>(n);
  const std::size_t k = k_of(ratio, count);
  const std::string base = std::string("all_reduce_compressed top_k ") + nexar::to_string(nexar::dtype_of_v<T>) +
                           " " + nexar::to_string(op) + " world=" + std::to_string(n) + " count=" +
                           std::to_string(count) + " ratio=" + std::to_string(ratio) +
                           " (k=" + std::to_string(k) + ")";
  const T guard = sentinel<T>();
  Compression comp;
  comp.kind = Compression::Kind::top_k;
  comp.ratio = ratio;
  std::vector<ErrorFeedback> st(un, ErrorFeedback(comp));
  std::vector<std::vector<T>> model_res(un, std::vector<T>(count, T(0)));
  std::vector<std::vector<double>> inputs_sum(un, std::vector<double>(count, 0.0)),
      sent_sum(un, std::vector<double>(count, 0.0));
  std::vector<double> result_sum(count, 0.0);
  constexpr int steps = 4;
  for (int s = 0; s < steps; ++s) {
    const std::string ctx = base + " step " + std::to_string(s);
    std::vector<std::vector<T>> g(un), data(un);
    std::vector<double> sum(count, 0.0);
    std::vector<std::vector<T>> sent(un, std::vector<T>(count, T(0)));
    for (std::size_t r = 0; r < un; ++r) {
      g[r] = distinct_magnitudes<T>(count, mix(seed, r * 31 + static_cast<std::size_t>(s)));
      data[r].resize(count + 1);
      for (std::size_t i = 0; i < count; ++i) {
        data[r][i] = g[r][i] - model_res[r][i];
        inputs_sum[r][i] += static_cast<double>(data[r][i]);
      }
      data[r][count] = guard;
      for (std::size_t i : top_k(g[r], k)) sent[r][i] = g[r][i];
      for (std::size_t i = 0; i < count; ++i) {
        model_res[r][i] = sent[r][i] != T(0) ? T(0) : g[r][i];
        sum[i] += static_cast<double>(sent[r][i]);
        sent_sum[r][i] += static_cast<double>(sent[r][i]);
      }
    }
    if (!compressed_step(comms, ctx, data, st, count, op)) return;
    for (std::size_t r = 0; r < un; ++r) {
      const int ir = static_cast<int>(r);
      EXPECT_EQ(st[r].steps(), static_cast<std::uint64_t>(s + 1)) << ctx << ": rank " << r;
      if (!same_bits(data[r][count], guard)) ADD_FAILURE() << ctx << ": rank " << r << " wrote past data";
      const auto res = residual_of<T>(st[r]);
      ASSERT_EQ(res.size(), count) << ctx << ": rank " << r << ": residual size";
      check_elements(ctx, ir, "residual (g with the k largest |g| zeroed)", res.data(), count,
                     [&](std::size_t i) { return exactly(model_res[r][i]); });
      check_elements(ctx, ir, "result", data[r].data(), count,
                     [&](std::size_t i) { return exactly(expected_result<T>(sum[i], op, n)); });
      if (r > 0)
        check_bytes(ctx, ir, "result (against rank 0's)",
                    reinterpret_cast<const std::byte*>(data[r].data()),
                    reinterpret_cast<const std::byte*>(data[0].data()), count * sizeof(T), sizeof(T));
    }
    if (::testing::Test::HasFailure()) return;
    for (std::size_t i = 0; i < count; ++i) result_sum[i] += static_cast<double>(data[0][i]);
  }
  check_conservation<T>(base, st, inputs_sum, sent_sum, result_sum, op);
}

// k < world and k >= world, k = 1, k = count (ratio 1), f32 and f64, sum and avg.
TEST(FusedAllReduce, CompressedTopKWithErrorFeedback) {
  std::uint64_t seed = 5000;
  for (int n : worlds) {
    auto& comms = pooled_world(n);
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
      for (auto [count, ratio] : {std::pair<std::size_t, double>{13, 0.25},  // k = 4
                                  {20, 0.5},                                  // k = 10
                                  {9, 0.0625},                                // k = 1
                                  {6, 1.0}}) {                                // k = count
        run_top_k<float>(comms, op, count, ratio, ++seed);
        run_top_k<double>(comms, op, count, ratio, ++seed);
      }
    }
  }
}

// Ties in magnitude (the same |g| at several positions, of either sign): the lower index
// goes first, as compressed.cpp documents. One step, fresh state, so g = the input.
TEST(FusedAllReduce, CompressedTopKTiesGoToTheLowerIndex) {
  for (int n : {1, 3}) {
    auto& comms = pooled_world(n);
    const auto un = static_cast<std::size_t>(n);
    // |g| = 2 at 1, 4, 6; 1 at 0, 2, 5, 7; 0.5 at 3. k = 4: positions 1, 4, 6 and then 0.
    const std::vector<float> g = {1, -2, -1, 0.5f, 2, 1, -2, -1};
    const std::vector<std::size_t> want = {0, 1, 4, 6};
    Compression comp;
    comp.ratio = 0.5;
    std::vector<ErrorFeedback> st(un, ErrorFeedback(comp));
    std::vector<std::vector<float>> data(un, g);
    const std::string ctx = "top_k ties world=" + std::to_string(n);
    if (!compressed_step(comms, ctx, data, st, g.size(), ReduceOp::sum)) return;
    for (std::size_t r = 0; r < un; ++r) {
      const auto res = residual_of<float>(st[r]);
      ASSERT_EQ(res.size(), g.size());
      for (std::size_t i = 0; i < g.size(); ++i) {
        const bool sent = std::find(want.begin(), want.end(), i) != want.end();
        EXPECT_EQ(res[i], sent ? 0.0f : g[i]) << ctx << ": rank " << r << " residual [" << i << "]";
        EXPECT_EQ(data[r][i], sent ? g[i] * static_cast<float>(n) : 0.0f)
            << ctx << ": rank " << r << " result [" << i << "]";
      }
    }
  }
}

// random_k over several steps. The test chooses g with no zero (input = g - the residual it
// expects), so the positions a rank sent are exactly the zeros of its new residual. Checks,
// every step: k positions, the same on every rank; the residual keeps g elsewhere; the result
// is the sum (avg: mean) over ranks of g at those positions and zero elsewhere, the same bits
// on every rank; a second tensor with the same seed picks the same positions at each step
// (they come from seed and step only). At the end: conservation as for top_k.
template <class T>
void run_random_k(std::vector<Communicator>& comms, ReduceOp op, std::size_t count, double ratio,
                  std::uint64_t seed) {
  const int n = static_cast<int>(comms.size());
  const auto un = static_cast<std::size_t>(n);
  const std::size_t k = k_of(ratio, count);
  const std::string base = std::string("all_reduce_compressed random_k ") +
                           nexar::to_string(nexar::dtype_of_v<T>) + " " + nexar::to_string(op) + " world=" +
                           std::to_string(n) + " count=" + std::to_string(count) +
                           " ratio=" + std::to_string(ratio) + " (k=" + std::to_string(k) + ")";
  Compression comp;
  comp.kind = Compression::Kind::random_k;
  comp.ratio = ratio;
  comp.seed = seed;
  // Per rank: state of tensor A, and of tensor B (same compression, other data).
  std::vector<ErrorFeedback> st(un, ErrorFeedback(comp)), st_b(un, ErrorFeedback(comp));
  std::vector<std::vector<T>> model_res(un, std::vector<T>(count, T(0))), model_res_b = model_res;
  std::vector<std::vector<double>> inputs_sum(un, std::vector<double>(count, 0.0)),
      sent_sum = inputs_sum;
  std::vector<double> result_sum(count, 0.0);
  std::mt19937_64 rng(seed);
  auto nonzero_eighths = [&] {
    const double m = static_cast<double>(1 + rng() % 24) / 8;
    return static_cast<T>(rng() & 1 ? m : -m);
  };
  constexpr int steps = 4;
  for (int s = 0; s < steps; ++s) {
    const std::string ctx = base + " step " + std::to_string(s);
    std::vector<std::vector<T>> g(un, std::vector<T>(count)), gb = g, data(un), data_b(un);
    for (std::size_t r = 0; r < un; ++r) {
      data[r].resize(count);
      data_b[r].resize(count);
      for (std::size_t i = 0; i < count; ++i) {
        g[r][i] = nonzero_eighths();
        gb[r][i] = nonzero_eighths();
        data[r][i] = g[r][i] - model_res[r][i];
        data_b[r][i] = gb[r][i] - model_res_b[r][i];
        inputs_sum[r][i] += static_cast<double>(data[r][i]);
      }
    }
    const bool ok = run_ranks(comms, ctx, [&](int r) {
      const auto ur = static_cast<std::size_t>(r);
      Request a = comms[ur].iall_reduce_compressed(data[ur].data(), count, nexar::dtype_of_v<T>, op, st[ur]);
      Request b = comms[ur].iall_reduce_compressed(data_b[ur].data(), count, nexar::dtype_of_v<T>, op, st_b[ur]);
      a.wait();
      b.wait();
    });
    if (!ok) return;
    // The positions: the zeros of rank 0's new residual of tensor A.
    const auto res0 = residual_of<T>(st[0]);
    ASSERT_EQ(res0.size(), count) << ctx;
    std::vector<bool> picked(count);
    std::size_t npicked = 0;
    for (std::size_t i = 0; i < count; ++i) {
      picked[i] = res0[i] == T(0);
      if (picked[i]) ++npicked;
    }
    ASSERT_EQ(npicked, k) << ctx << ": rank 0 sent " << npicked << " elements";
    for (std::size_t r = 0; r < un; ++r) {
      const int ir = static_cast<int>(r);
      EXPECT_EQ(st[r].steps(), static_cast<std::uint64_t>(s + 1)) << ctx << ": rank " << r;
      const auto res = residual_of<T>(st[r]), res_b = residual_of<T>(st_b[r]);
      ASSERT_EQ(res.size(), count) << ctx;
      ASSERT_EQ(res_b.size(), count) << ctx;
      for (std::size_t i = 0; i < count; ++i) {
        model_res[r][i] = picked[i] ? T(0) : g[r][i];
        model_res_b[r][i] = picked[i] ? T(0) : gb[r][i];
        if (picked[i]) sent_sum[r][i] += static_cast<double>(g[r][i]);
      }
      check_elements(ctx, ir, "residual (zero exactly at rank 0's positions, g elsewhere)",
                     res.data(), count, [&](std::size_t i) { return exactly(model_res[r][i]); });
      check_elements(ctx, ir, "residual of a second tensor with the same seed", res_b.data(),
                     count, [&](std::size_t i) { return exactly(model_res_b[r][i]); });
      check_elements(ctx, ir, "result", data[r].data(), count, [&](std::size_t i) {
        double sum = 0;
        if (picked[i])
          for (std::size_t q = 0; q < un; ++q) sum += static_cast<double>(g[q][i]);
        return exactly(expected_result<T>(sum, op, n));
      });
      check_elements(ctx, ir, "result of the second tensor", data_b[r].data(), count, [&](std::size_t i) {
        double sum = 0;
        if (picked[i])
          for (std::size_t q = 0; q < un; ++q) sum += static_cast<double>(gb[q][i]);
        return exactly(expected_result<T>(sum, op, n));
      });
      if (r > 0)
        check_bytes(ctx, ir, "result (against rank 0's)",
                    reinterpret_cast<const std::byte*>(data[r].data()),
                    reinterpret_cast<const std::byte*>(data[0].data()), count * sizeof(T), sizeof(T));
    }
    if (::testing::Test::HasFailure()) return;
    for (std::size_t i = 0; i < count; ++i) result_sum[i] += static_cast<double>(data[0][i]);
  }
  check_conservation<T>(base, st, inputs_sum, sent_sum, result_sum, op);
}

TEST(FusedAllReduce, CompressedRandomKWithErrorFeedback) {
  std::uint64_t seed = 7000;
  for (int n : worlds) {
    auto& comms = pooled_world(n);
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
      for (auto [count, ratio] : {std::pair<std::size_t, double>{13, 0.25},  // k = 4
                                  {40, 0.375},                                // k = 15
                                  {9, 0.0625},                                // k = 1
                                  {6, 1.0}}) {                                // k = count
        run_random_k<float>(comms, op, count, ratio, ++seed);
        run_random_k<double>(comms, op, count, ratio, ++seed);
      }
    }
  }
}

// Errors are not hidden by the selection: random (not steered) inputs over several steps,
// with ties and zeros; only what holds whatever the tie rule is checked. Every step, per
// rank, each element either left the residual whole (residual 0) or stayed whole (residual
// = input + old residual); top_k: the sent nonzero elements number min(k, nonzero ones) and
// none is smaller in magnitude than one kept; and elementwise the result is the sum over
// ranks of what left their residuals. At the end: results + residuals = inputs.
template <class T>
void run_conservation(std::vector<Communicator>& comms, Compression::Kind kind, std::size_t count,
                      double ratio, std::uint64_t seed) {
  const int n = static_cast<int>(comms.size());
  const auto un = static_cast<std::size_t>(n);
  const std::size_t k = k_of(ratio, count);
  const std::string base = std::string("all_reduce_compressed conservation ") +
                           (kind == Compression::Kind::top_k ? "top_k " : "random_k ") +
                           nexar::to_string(nexar::dtype_of_v<T>) + " world=" + std::to_string(n) +
                           " count=" + std::to_string(count) + " k=" + std::to_string(k);
  Compression comp;
  comp.kind = kind;
  comp.ratio = ratio;
  comp.seed = seed;
  std::vector<ErrorFeedback> st(un, ErrorFeedback(comp));
  std::vector<double> inputs(count, 0.0), results(count, 0.0);
  for (int s = 0; s < 6; ++s) {
    const std::string ctx = base + " step " + std::to_string(s);
    std::vector<std::vector<T>> data(un), before(un);
    for (std::size_t r = 0; r < un; ++r) {
      data[r] = gen<T>(count, ReduceOp::sum, Data::exact, mix(seed, r * 17 + static_cast<std::size_t>(s)));
      before[r] = residual_of<T>(st[r]);
      before[r].resize(count, T(0));
      for (std::size_t i = 0; i < count; ++i) inputs[i] += static_cast<double>(data[r][i]);
    }
    std::vector<std::vector<T>> g = data;
    for (std::size_t r = 0; r < un; ++r)
      for (std::size_t i = 0; i < count; ++i) g[r][i] += before[r][i];
    if (!compressed_step(comms, ctx, data, st, count, ReduceOp::sum)) return;
    std::vector<double> left(count, 0.0);
    for (std::size_t r = 0; r < un; ++r) {
      const auto res = residual_of<T>(st[r]);
      ASSERT_EQ(res.size(), count) << ctx;
      std::size_t nonzero = 0, sent_nonzero = 0;
      double min_sent = INFINITY, max_kept = 0;
      for (std::size_t i = 0; i < count; ++i) {
        const double gi = static_cast<double>(g[r][i]);
        const bool sent = res[i] == T(0);
        if (!sent) {
          EXPECT_TRUE(same_bits(res[i], g[r][i]))
              << ctx << ": rank " << r << " [" << i << "]: residual " << show(res[i])
              << " is neither 0 nor input + old residual " << show(g[r][i]);
        }
        if (gi != 0) ++nonzero;
        if (sent && gi != 0) {
          ++sent_nonzero;
          min_sent = std::min(min_sent, std::abs(gi));
          left[i] += gi;
        }
        if (!sent) max_kept = std::max(max_kept, std::abs(gi));
      }
      EXPECT_LE(sent_nonzero, k) << ctx << ": rank " << r;
      if (kind == Compression::Kind::top_k) {
        EXPECT_EQ(sent_nonzero, std::min(k, nonzero)) << ctx << ": rank " << r;
        EXPECT_TRUE(sent_nonzero == 0 || min_sent >= max_kept)
            << ctx << ": rank " << r << ": sent |g| down to " << min_sent << " but kept " << max_kept;
      }
      if (r > 0)
        check_bytes(ctx, static_cast<int>(r), "result (against rank 0's)",
                    reinterpret_cast<const std::byte*>(data[r].data()),
                    reinterpret_cast<const std::byte*>(data[0].data()), count * sizeof(T), sizeof(T));
    }
    check_elements(ctx, 0, "result (sum of what left the residuals)", data[0].data(), count,
                   [&](std::size_t i) { return exactly(static_cast<T>(left[i])); });
    if (::testing::Test::HasFailure()) return;
    for (std::size_t i = 0; i < count; ++i) results[i] += static_cast<double>(data[0][i]);
  }
  for (std::size_t i = 0; i < count; ++i) {
    double res_all = 0;
    for (std::size_t r = 0; r < un; ++r) res_all += static_cast<double>(residual_of<T>(st[r])[i]);
    EXPECT_EQ(results[i] + res_all, inputs[i]) << base << " [" << i << "]";
  }
}

TEST(FusedAllReduce, CompressedConservesEveryInputWhateverTheTies) {
  std::uint64_t seed = 9000;
  for (int n : {1, 2, 3, 5}) {
    auto& comms = pooled_world(n);
    for (auto kind : {Compression::Kind::top_k, Compression::Kind::random_k}) {
      run_conservation<float>(comms, kind, 50, 0.125, ++seed);
      run_conservation<double>(comms, kind, 17, 0.25, ++seed);
    }
  }
}

// Ratio 1: every element is sent, the residual stays zero, and the result is bitwise that of
// a plain all_reduce of the same data (and the reference). Exact data, so the order of the
// additions cannot matter.
template <class T>
void run_ratio_one(std::vector<Communicator>& comms, Compression::Kind kind, ReduceOp op,
                   std::size_t count, std::uint64_t seed) {
  const int n = static_cast<int>(comms.size());
  const auto un = static_cast<std::size_t>(n);
  const std::string ctx = std::string("all_reduce_compressed ratio 1 ") +
                          (kind == Compression::Kind::top_k ? "top_k " : "random_k ") +
                          nexar::to_string(nexar::dtype_of_v<T>) + " " + nexar::to_string(op) + " world=" +
                          std::to_string(n) + " count=" + std::to_string(count);
  Compression comp;
  comp.kind = kind;
  comp.ratio = 1.0;
  std::vector<ErrorFeedback> st(un, ErrorFeedback(comp));
  std::vector<std::vector<T>> in(un), data(un), plain(un, std::vector<T>(count));
  for (std::size_t r = 0; r < un; ++r) data[r] = in[r] = gen<T>(count, op, Data::exact, mix(seed, r));
  const bool ok = run_ranks(comms, ctx, [&](int r) {
    const auto ur = static_cast<std::size_t>(r);
    comms[ur].all_reduce(in[ur].data(), plain[ur].data(), count, nexar::dtype_of_v<T>, op);
    comms[ur].iall_reduce_compressed(data[ur].data(), count, nexar::dtype_of_v<T>, op, st[ur]).wait();
  });
  if (!ok) return;
  for (std::size_t r = 0; r < un; ++r) {
    const int ir = static_cast<int>(r);
    check_bytes(ctx, ir, "result (against a plain all_reduce)",
                reinterpret_cast<const std::byte*>(data[r].data()),
                reinterpret_cast<const std::byte*>(plain[r].data()), count * sizeof(T), sizeof(T));
    check_elements(ctx, ir, "result", data[r].data(), count,
                   [&](std::size_t i) { return reference<T>(in, i, op, 0, n, Data::exact); });
    const auto res = residual_of<T>(st[r]);
    check_elements(ctx, ir, "residual", res.data(), res.size(), [](std::size_t) { return exactly(T(0)); });
    EXPECT_EQ(res.size(), count) << ctx;
  }
}

TEST(FusedAllReduce, CompressedRatioOneEqualsPlainAllReduce) {
  std::uint64_t seed = 11000;
  for (int n : worlds) {
    auto& comms = pooled_world(n);
    for (auto kind : {Compression::Kind::top_k, Compression::Kind::random_k})
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
        run_ratio_one<float>(comms, kind, op, 1, ++seed);
        run_ratio_one<float>(comms, kind, op, 301, ++seed);
        run_ratio_one<double>(comms, kind, op, 77, ++seed);
      }
  }
}

// ---- validation --------------------------------------------------------------------------

// Each call gets the same bad arguments on every rank; every rank must get invalid_argument
// naming the operation, its buffers and state must be left as they were, and the
// communicator stays usable.
TEST(FusedAllReduce, ValidationRejectsBadArguments) {
  for (int n : {1, 3}) {
    auto& comms = pooled_world(n);
    const auto un = static_cast<std::size_t>(n);
    std::vector<std::vector<float>> after(un);
    std::vector<float> shard_after(un, 0.0f);
    const std::string wctx = "validation world=" + std::to_string(n);
    const bool ok = run_ranks(comms, wctx, [&](int r) {
      const auto ur = static_cast<std::size_t>(r);
      Communicator& cm = comms[ur];
      CollectiveOptions o;
      o.timeout = std::chrono::seconds(10);  // a call that does not validate fails, not hangs
      auto with = [&](Algorithm a) {
        CollectiveOptions x = o;
        x.algorithm = a;
        return x;
      };
      auto expect_invalid = [&](const char* op, const std::string& what, auto&& call) {
        const std::string msg = expect_error(Errc::invalid_argument, call);
        EXPECT_TRUE(contains(msg, op)) << wctx << " " << what << ": what() does not name " << op
                                       << ": " << msg;
      };
      std::vector<float> a(8, 1.0f), b(8, 2.0f);
      std::vector<std::int32_t> ia(8, 3);

      // bucketed
      const MutableBuffer with_null[] = {{a.data(), 8}, {nullptr, 3}, {b.data(), 8}};
      expect_invalid("all_reduce_bucketed", "null bucket with count 3", [&] {
        cm.iall_reduce_bucketed(with_null, DataType::f32, ReduceOp::sum, o).wait();
      });
      const MutableBuffer ints[] = {{ia.data(), 8}};
      expect_invalid("all_reduce_bucketed", "avg of i32", [&] {
        cm.iall_reduce_bucketed(ints, DataType::i32, ReduceOp::avg, o).wait();
      });
      const MutableBuffer floats[] = {{a.data(), 8}, {b.data(), 8}};
      for (Algorithm alg : {Algorithm::tree, Algorithm::linear, Algorithm::pairwise, Algorithm::dissemination})
        expect_invalid("all_reduce_bucketed", std::string("forced ") + nexar::to_string(alg), [&] {
          cm.iall_reduce_bucketed(floats, DataType::f32, ReduceOp::sum, with(alg)).wait();
        });
      EXPECT_EQ(a, std::vector<float>(8, 1.0f)) << wctx << ": a rejected bucketed call wrote";
      EXPECT_EQ(b, std::vector<float>(8, 2.0f)) << wctx << ": a rejected bucketed call wrote";
      EXPECT_EQ(ia, std::vector<std::int32_t>(8, 3)) << wctx << ": a rejected bucketed call wrote";

      // sharded
      std::vector<float> out(8, -1.0f), shard(8, -1.0f);
      expect_invalid("all_reduce_sharded", "recv and shard both null", [&] {
        cm.iall_reduce_sharded(a.data(), nullptr, nullptr, 8, DataType::f32, ReduceOp::sum, o).wait();
      });
      expect_invalid("all_reduce_sharded", "null send with count 8", [&] {
        cm.iall_reduce_sharded(nullptr, out.data(), shard.data(), 8, DataType::f32, ReduceOp::sum, o).wait();
      });
      expect_invalid("all_reduce_sharded", "avg of i32", [&] {
        cm.iall_reduce_sharded(ia.data(), out.data(), nullptr, 8, DataType::i32, ReduceOp::avg, o).wait();
      });
      for (Algorithm alg : {Algorithm::halving_doubling, Algorithm::recursive_doubling, Algorithm::tree})
        expect_invalid("all_reduce_sharded", std::string("forced ") + nexar::to_string(alg), [&] {
          cm.iall_reduce_sharded(a.data(), out.data(), shard.data(), 8, DataType::f32, ReduceOp::sum, with(alg)).wait();
        });
      EXPECT_EQ(out, std::vector<float>(8, -1.0f)) << wctx << ": a rejected sharded call wrote";
      EXPECT_EQ(shard, std::vector<float>(8, -1.0f)) << wctx << ": a rejected sharded call wrote";

      // compressed
      ErrorFeedback st(Compression{Compression::Kind::top_k, 0.25, 0});
      expect_invalid("all_reduce_compressed", "i32", [&] {
        cm.iall_reduce_compressed(ia.data(), 8, DataType::i32, ReduceOp::sum, st, o).wait();
      });
      expect_invalid("all_reduce_compressed", "f16", [&] {
        cm.iall_reduce_compressed(a.data(), 4, DataType::f16, ReduceOp::sum, st, o).wait();
      });
      for (ReduceOp op : {ReduceOp::max, ReduceOp::min, ReduceOp::prod})
        expect_invalid("all_reduce_compressed", std::string("op ") + nexar::to_string(op), [&] {
          cm.iall_reduce_compressed(a.data(), 8, DataType::f32, op, st, o).wait();
        });
      expect_invalid("all_reduce_compressed", "null data with count 8", [&] {
        cm.iall_reduce_compressed(nullptr, 8, DataType::f32, ReduceOp::sum, st, o).wait();
      });
      expect_invalid("all_reduce_compressed", "forced tree", [&] {
        cm.iall_reduce_compressed(a.data(), 8, DataType::f32, ReduceOp::sum, st, with(Algorithm::tree)).wait();
      });
      for (double ratio : {0.0, -0.5, 1.5, std::nan("")}) {
        ErrorFeedback bad_ratio(Compression{Compression::Kind::random_k, ratio, 1});
        expect_invalid("all_reduce_compressed", "ratio " + std::to_string(ratio), [&] {
          cm.iall_reduce_compressed(a.data(), 8, DataType::f32, ReduceOp::sum, bad_ratio, o).wait();
        });
        EXPECT_EQ(bad_ratio.steps(), 0u) << wctx;
      }
      EXPECT_EQ(st.steps(), 0u) << wctx << ": a rejected call counted as a step";
      EXPECT_TRUE(st.residual().empty()) << wctx << ": a rejected call left a residual";
      EXPECT_EQ(a, std::vector<float>(8, 1.0f)) << wctx << ": a rejected compressed call wrote";

      // A count different from the previous step's, without reset(): rejected, state kept.
      std::vector<float> c(8, static_cast<float>(r + 1)), c9(9, 1.0f);
      cm.iall_reduce_compressed(c.data(), 8, DataType::f32, ReduceOp::sum, st, o).wait();
      ASSERT_EQ(st.steps(), 1u) << wctx;
      const std::vector<std::byte> res1(st.residual().begin(), st.residual().end());
      expect_invalid("all_reduce_compressed", "count 9 after 8 without reset()", [&] {
        cm.iall_reduce_compressed(c9.data(), 9, DataType::f32, ReduceOp::sum, st, o).wait();
      });
      EXPECT_EQ(st.steps(), 1u) << wctx;
      EXPECT_TRUE(std::equal(res1.begin(), res1.end(), st.residual().begin(), st.residual().end()))
          << wctx << ": a rejected call changed the residual";
      EXPECT_EQ(c9, std::vector<float>(9, 1.0f)) << wctx;
      // The same bytes as another type (f64 count 4 after f32 count 8): rejected too, or
      // the float residual would be read as doubles.
      std::vector<double> d4(4, 1.0);
      expect_invalid("all_reduce_compressed", "f64 after f32 without reset()", [&] {
        cm.iall_reduce_compressed(d4.data(), 4, DataType::f64, ReduceOp::sum, st, o).wait();
      });
      EXPECT_EQ(st.steps(), 1u) << wctx;
      EXPECT_EQ(d4, std::vector<double>(4, 1.0)) << wctx;
      // After reset() the new count is accepted and the steps start over.
      st.reset();
      EXPECT_EQ(st.steps(), 0u) << wctx;
      EXPECT_TRUE(st.residual().empty()) << wctx;
      cm.iall_reduce_compressed(c9.data(), 9, DataType::f32, ReduceOp::sum, st, o).wait();
      EXPECT_EQ(st.steps(), 1u) << wctx;
      EXPECT_EQ(st.residual().size(), 9 * sizeof(float)) << wctx;
      // count 0: nothing to send, a step all the same; data may be null.
      ErrorFeedback empty;
      cm.iall_reduce_compressed(nullptr, 0, DataType::f64, ReduceOp::avg, empty, o).wait();
      EXPECT_EQ(empty.steps(), 1u) << wctx;

      // Still usable: one good call of each.
      after[ur].assign(5, static_cast<float>(r + 1));
      const MutableBuffer good[] = {{after[ur].data(), 5}};
      cm.iall_reduce_bucketed(good, DataType::f32, ReduceOp::max, o).wait();
      std::vector<float> one(1, static_cast<float>(r + 1));
      cm.iall_reduce_sharded(one.data(), nullptr, &shard_after[ur], 1, DataType::f32, ReduceOp::sum, o).wait();
    });
    if (!ok) return;
    for (std::size_t r = 0; r < un; ++r) {
      EXPECT_EQ(after[r], std::vector<float>(5, static_cast<float>(n))) << wctx << ": rank " << r;
      // One element: all of it is rank 0's block.
      const float tri = static_cast<float>(n * (n + 1) / 2);
      EXPECT_EQ(shard_after[r], r == 0 ? tri : 0.0f) << wctx << ": rank " << r;
    }
  }
}

}  // namespace
