// Shared driver for the peer benchmarks (mpi_bench, gloo_bench).
//
// Each backend supplies a small "Comm" object (rank, size, barrier, max-reduce of a vector of
// doubles, sum of a counter) and a factory for collective operations.  Everything else —
// argument parsing, buffer set-up, timing, the correctness check and the nccl-tests-style
// report — lives here so that both peers are measured in exactly the same way.
//
// Measurement, per message size:
//   * -w warm-up iterations (untimed), then -n timed iterations;
//   * before every timed iteration all ranks meet in a barrier of the library under test,
//     then each rank times its own call of the collective (steady_clock);
//   * iteration i's time is the maximum of the per-rank times of iteration i;
//   * the reported time is the median of those per-iteration maxima.
//   * algbw = size / time, busbw = algbw * factor (nccl-tests factors).
//
// "size" is the size of the largest buffer of the operation, as nccl-tests prints it:
// all_reduce/broadcast/reduce: the whole vector; all_gather: the gathered output;
// reduce_scatter: the input that is scattered; all_to_all: the whole send buffer.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace peers {

enum class Coll { all_reduce, broadcast, reduce, all_gather, reduce_scatter, all_to_all, barrier };

inline const char* coll_name(Coll c) {
  switch (c) {
    case Coll::all_reduce: return "all_reduce";
    case Coll::broadcast: return "broadcast";
    case Coll::reduce: return "reduce";
    case Coll::all_gather: return "all_gather";
    case Coll::reduce_scatter: return "reduce_scatter";
    case Coll::all_to_all: return "all_to_all";
    case Coll::barrier: return "barrier";
  }
  return "?";
}

inline bool parse_coll(std::string_view s, Coll& out) {
  // Accept nccl-tests' binary-style names too (all_reduce_perf, alltoall, ...).
  std::string t(s);
  if (auto p = t.find("_perf"); p != std::string::npos) t.erase(p);
  t.erase(std::remove(t.begin(), t.end(), '_'), t.end());
  struct { const char* n; Coll c; } tbl[] = {
      {"allreduce", Coll::all_reduce},         {"broadcast", Coll::broadcast},
      {"bcast", Coll::broadcast},              {"reduce", Coll::reduce},
      {"allgather", Coll::all_gather},         {"reducescatter", Coll::reduce_scatter},
      {"alltoall", Coll::all_to_all},          {"barrier", Coll::barrier},
  };
  for (auto& e : tbl)
    if (t == e.n) { out = e.c; return true; }
  return false;
}

// Bus-bandwidth factor, as nccl-tests defines it.
inline double busbw_factor(Coll c, int n) {
  switch (c) {
    case Coll::all_reduce: return 2.0 * (n - 1) / n;
    case Coll::all_gather:
    case Coll::reduce_scatter:
    case Coll::all_to_all: return double(n - 1) / n;
    case Coll::broadcast:
    case Coll::reduce: return 1.0;
    case Coll::barrier: return 0.0;
  }
  return 0.0;
}

// Collectives whose buffers are split into one block per rank.
inline bool is_sharded(Coll c) {
  return c == Coll::all_gather || c == Coll::reduce_scatter || c == Coll::all_to_all;
}

enum class DType { f32, f64 };
inline const char* dtype_name(DType d) { return d == DType::f32 ? "float" : "double"; }
inline size_t dtype_size(DType d) { return d == DType::f32 ? 4 : 8; }

struct Options {
  Coll coll = Coll::all_reduce;
  size_t min_bytes = 32u << 20;
  size_t max_bytes = 32u << 20;
  double factor = 2.0;
  size_t step_bytes = 0;  // -i: additive step (used when factor <= 1)
  int iters = 20;
  int warmup = 5;
  int check = 1;
  DType dtype = DType::f32;
  int root = 0;
};

// "64", "4K", "1M", "2G" (binary multiples, like nccl-tests).
inline size_t parse_size(const std::string& s) {
  if (s.empty()) throw std::invalid_argument("empty size");
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || v < 0) throw std::invalid_argument("bad size: " + s);
  size_t mult = 1;
  if (*end) {
    switch (*end) {
      case 'k': case 'K': mult = size_t(1) << 10; break;
      case 'm': case 'M': mult = size_t(1) << 20; break;
      case 'g': case 'G': mult = size_t(1) << 30; break;
      default: throw std::invalid_argument("bad size suffix: " + s);
    }
    if (end[1] && !(end[1] == 'B' || end[1] == 'b' || end[1] == 'i'))
      throw std::invalid_argument("bad size: " + s);
  }
  return size_t(v * double(mult));
}

inline const char* common_usage() {
  return
      "  -b, --minbytes N     smallest message size in bytes (K/M/G suffixes), default 32M\n"
      "  -e, --maxbytes N     largest message size, default 32M\n"
      "  -f, --stepfactor F   multiply the size by F between steps, default 2\n"
      "  -i, --stepbytes N    add N bytes between steps (used when -f is 1)\n"
      "  -n, --iters N        timed iterations per size, default 20\n"
      "  -w, --warmup_iters N untimed warm-up iterations per size, default 5\n"
      "  -c, --check 0|1      check results against independently computed values, default 1\n"
      "  -d, --datatype T     float (default) or double\n"
      "  -o, --op OP          reduction: sum (the only one supported)\n"
      "  -r, --root R         root rank of broadcast/reduce, default 0\n";
}

// Parses one common flag at argv[i]; returns the number of argv entries consumed (0 if the
// flag is not a common one).  Throws on a malformed value.
inline int parse_common_flag(int argc, char** argv, int i, Options& o) {
  std::string a = argv[i];
  std::string val;
  bool has_inline = false;
  if (a.rfind("--", 0) == 0) {
    if (auto eq = a.find('='); eq != std::string::npos) {
      val = a.substr(eq + 1);
      a = a.substr(0, eq);
      has_inline = true;
    }
  }
  auto is = [&](const char* s, const char* l) { return a == s || a == l; };
  static const char* known[][2] = {
      {"-b", "--minbytes"}, {"-e", "--maxbytes"}, {"-f", "--stepfactor"},
      {"-i", "--stepbytes"}, {"-n", "--iters"},   {"-w", "--warmup_iters"},
      {"-c", "--check"},    {"-d", "--datatype"}, {"-o", "--op"},
      {"-r", "--root"}};
  bool ok = false;
  for (auto& k : known) ok = ok || is(k[0], k[1]);
  if (!ok) return 0;
  int used = 1;
  if (!has_inline) {
    if (i + 1 >= argc) throw std::invalid_argument("missing value for " + a);
    val = argv[i + 1];
    used = 2;
  }
  if (is("-b", "--minbytes")) o.min_bytes = parse_size(val);
  else if (is("-e", "--maxbytes")) o.max_bytes = parse_size(val);
  else if (is("-f", "--stepfactor")) o.factor = std::stod(val);
  else if (is("-i", "--stepbytes")) o.step_bytes = parse_size(val);
  else if (is("-n", "--iters")) o.iters = std::stoi(val);
  else if (is("-w", "--warmup_iters")) o.warmup = std::stoi(val);
  else if (is("-c", "--check")) o.check = std::stoi(val);
  else if (is("-r", "--root")) o.root = std::stoi(val);
  else if (is("-d", "--datatype")) {
    if (val == "float" || val == "f32" || val == "float32") o.dtype = DType::f32;
    else if (val == "double" || val == "f64" || val == "float64") o.dtype = DType::f64;
    else throw std::invalid_argument("unsupported datatype: " + val + " (float, double)");
  } else if (is("-o", "--op")) {
    if (val != "sum") throw std::invalid_argument("unsupported op: " + val + " (sum)");
  }
  return used;
}

inline void validate(const Options& o, int nranks) {
  if (o.iters < 1) throw std::invalid_argument("-n must be >= 1");
  if (o.warmup < 0) throw std::invalid_argument("-w must be >= 0");
  if (o.min_bytes > o.max_bytes) throw std::invalid_argument("-b must be <= -e");
  if (o.factor <= 1.0 && o.step_bytes == 0 && o.min_bytes != o.max_bytes)
    throw std::invalid_argument("-f must be > 1 (or give -i)");
  if (o.root < 0 || o.root >= nranks) throw std::invalid_argument("-r out of range");
}

// Requested sizes -> element counts actually used.  Sharded collectives need a multiple of
// the world size; the count is rounded down to one (at least one element per rank), and the
// size printed is the size actually moved.  Duplicates after rounding are dropped.
inline std::vector<size_t> element_counts(const Options& o, int nranks) {
  std::vector<size_t> out;
  const size_t es = dtype_size(o.dtype);
  for (size_t s = o.min_bytes; s <= o.max_bytes;) {
    size_t c = s / es;
    if (is_sharded(o.coll)) c = std::max<size_t>(c / nranks, 1) * nranks;
    if (c == 0) c = 1;
    if (out.empty() || out.back() != c) out.push_back(c);
    size_t next = o.factor > 1.0 ? size_t(double(s) * o.factor) : s + o.step_bytes;
    if (next <= s) break;
    s = next;
  }
  return out;
}

// ---- data pattern and reference results -----------------------------------------------

// Value of element i of rank r's input: an integer in [-32, 31].  Sums of a few thousand of
// them are exact in float and double, so the expected result is exact whatever the order
// in which a library adds the contributions.
inline int pattern(int r, size_t i) {
  uint64_t x = (uint64_t(i) + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t(r) + 1) * 0xC2B2AE3D27D4EB4Full;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  return int(x & 63) - 32;
}

inline long sum_over_ranks(int nranks, size_t i) {
  long s = 0;
  for (int r = 0; r < nranks; ++r) s += pattern(r, i);
  return s;
}

// Expected value of element j of rank `rank`'s output, or false when that rank has no
// defined output (non-root ranks of reduce).
inline bool expected(Coll c, int rank, int n, size_t count, int root, size_t j, double& v) {
  const size_t blk = is_sharded(c) ? count / size_t(n) : 0;
  switch (c) {
    case Coll::all_reduce: v = double(sum_over_ranks(n, j)); return true;
    case Coll::reduce:
      if (rank != root) return false;
      v = double(sum_over_ranks(n, j));
      return true;
    case Coll::broadcast: v = pattern(root, j); return true;
    case Coll::all_gather: v = pattern(int(j / blk), j % blk); return true;
    case Coll::reduce_scatter: v = double(sum_over_ranks(n, size_t(rank) * blk + j)); return true;
    case Coll::all_to_all: {
      // out[d][s*blk + k] = in[s][d*blk + k]
      const int src = int(j / blk);
      v = pattern(src, size_t(rank) * blk + j % blk);
      return true;
    }
    case Coll::barrier: return false;
  }
  return false;
}

// Element counts of a rank's input and output buffers for a collective of `count` elements.
inline size_t in_count(Coll c, size_t count, int n) {
  return c == Coll::all_gather ? count / size_t(n) : count;
}
inline size_t out_count(Coll c, size_t count, int n) {
  return c == Coll::reduce_scatter ? count / size_t(n) : count;
}

// ---- operations ----------------------------------------------------------------------------

// One collective on fixed buffers.  prepare() runs before every iteration, outside the timed
// region (used to emulate out-of-place semantics for algorithms that only work in place);
// run() is the timed call; output() is where this rank's result lies afterwards.
template <class T>
struct Op {
  virtual ~Op() = default;
  virtual void prepare() {}
  virtual void run() = 0;
  virtual const T* output() const = 0;
};

// ---- report --------------------------------------------------------------------------------

inline std::string fmt_time(double us) {
  char b[32];
  if (us >= 10000.0) std::snprintf(b, sizeof b, "%7.0f", us);
  else if (us >= 100.0) std::snprintf(b, sizeof b, "%7.1f", us);
  else std::snprintf(b, sizeof b, "%7.2f", us);
  return b;
}

inline void print_table_header() {
  std::printf("#\n");
  std::printf("#                                                        out-of-place\n");
  std::printf("#       size         count      type   redop    root     time   algbw   busbw  #wrong\n");
  std::printf("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)\n");
}

inline void print_row(size_t bytes, size_t count, const char* type, const char* redop, int root,
                      double time_us, double algbw, double busbw, long wrong, bool checked) {
  char w[32];
  if (checked) std::snprintf(w, sizeof w, "%ld", wrong);
  else std::snprintf(w, sizeof w, "N/A");
  std::printf("%12zu  %12zu  %8s  %6s  %6d  %7s  %6.2f  %6.2f  %6s\n", bytes, count, type, redop,
              root, fmt_time(time_us).c_str(), algbw, busbw, w);
  std::fflush(stdout);
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

using clk = std::chrono::steady_clock;

// Times `iters` iterations of fn after `warmup` untimed ones; returns the median over
// iterations of the slowest rank's time, in microseconds.
template <class Comm, class Prep, class Fn>
double time_iterations(Comm& comm, int warmup, int iters, Prep&& prep, Fn&& fn) {
  for (int i = 0; i < warmup; ++i) {
    prep();
    comm.barrier();
    fn();
  }
  std::vector<double> t(size_t(iters), 0.0);
  for (int i = 0; i < iters; ++i) {
    prep();
    comm.barrier();
    auto t0 = clk::now();
    fn();
    auto t1 = clk::now();
    t[size_t(i)] = std::chrono::duration<double, std::micro>(t1 - t0).count();
  }
  comm.max_inplace(t.data(), t.size());
  if (comm.rank() == 0 && std::getenv("PEERS_VERBOSE")) {
    // Per-iteration times (max over ranks), for diagnosing jitter; stderr keeps stdout clean.
    std::fprintf(stderr, "# iter times (us):");
    for (double x : t) std::fprintf(stderr, " %.1f", x);
    std::fprintf(stderr, "\n");
  }
  return median(t);
}

// Runs the whole sweep for element type T.  `make_op(coll, count, in, out)` builds an Op.
// Returns the total number of wrong elements over all sizes and ranks.
template <class T, class Comm, class MakeOp>
long run_sweep(Comm& comm, const Options& o, MakeOp&& make_op, double& avg_busbw) {
  const int n = comm.size();
  const int me = comm.rank();
  const bool print = me == 0;
  const char* tname = dtype_name(o.dtype);
  long total_wrong = 0;
  double bw_sum = 0;
  int bw_cnt = 0;

  if (print) print_table_header();

  if (o.coll == Coll::barrier) {
    double us = time_iterations(comm, o.warmup, o.iters, [] {}, [&] { comm.barrier(); });
    if (print) print_row(0, 0, tname, "none", -1, us, 0.0, 0.0, 0, false);
    avg_busbw = 0;
    return 0;
  }

  const bool rooted = o.coll == Coll::broadcast || o.coll == Coll::reduce;
  const char* redop =
      (o.coll == Coll::all_reduce || o.coll == Coll::reduce || o.coll == Coll::reduce_scatter)
          ? "sum"
          : "none";

  for (size_t count : element_counts(o, n)) {
    const size_t nin = in_count(o.coll, count, n);
    const size_t nout = out_count(o.coll, count, n);
    std::vector<T> in(nin), out(nout);
    for (size_t i = 0; i < nin; ++i) {
      // all_gather sends this rank's block; every other collective sends a full vector.
      in[i] = T(pattern(me, i));
    }
    std::fill(out.begin(), out.end(), T(0));
    std::unique_ptr<Op<T>> op = make_op(o.coll, count, in.data(), out.data());

    double us = time_iterations(comm, o.warmup, o.iters, [&] { op->prepare(); },
                                [&] { op->run(); });

    long wrong = 0;
    if (o.check) {
      // Fresh inputs, poisoned outputs, one more call, then compare every output element.
      for (size_t i = 0; i < nin; ++i) in[i] = T(pattern(me, i));
      std::fill(out.begin(), out.end(), std::numeric_limits<T>::quiet_NaN());
      op->prepare();
      comm.barrier();
      op->run();
      const T* res = op->output();
      long mine = 0;
      double v;
      for (size_t j = 0; j < nout; ++j) {
        if (!expected(o.coll, me, n, count, o.root, j, v)) break;
        if (!(double(res[j]) == v)) ++mine;
      }
      wrong = comm.sum_long(mine);
      total_wrong += wrong;
    }

    const size_t bytes = count * sizeof(T);
    const double algbw = double(bytes) / (us * 1e-6) / 1e9;
    const double busbw = algbw * busbw_factor(o.coll, n);
    bw_sum += busbw;
    ++bw_cnt;
    if (print)
      print_row(bytes, count, tname, redop, rooted ? o.root : -1, us, algbw, busbw, wrong,
                o.check != 0);
  }
  avg_busbw = bw_cnt ? bw_sum / bw_cnt : 0.0;
  return total_wrong;
}

inline void print_footer(long wrong, double avg_busbw, bool checked) {
  if (checked) std::printf("# Out of bounds values : %ld %s\n", wrong, wrong ? "FAILED" : "OK");
  std::printf("# Avg bus bandwidth    : %g\n", avg_busbw);
  std::printf("#\n");
  std::fflush(stdout);
}

}  // namespace peers
