// nexar-bench <collective>: nccl-tests-style sweeps of the nexar collectives.
//
//   nexar-bench all_reduce --ranks 4 -b 8 -e 64M -f 2 -n 20 -w 5 -c 1
//
// One subcommand per collective (all_reduce, broadcast, reduce, all_gather, reduce_scatter,
// all_to_all, gather, scatter, scan, barrier), all with the flags of nccl-tests. Ranks:
//   * started by a launcher (nexar-run, torchrun, mpirun, srun: see nexar::launched_from_env), this
//     process is one rank and joins through join_from_env(); rank 0 prints;
//   * otherwise --ranks N threads of this process, each holding one communicator of
//     bootstrap_local(N): real QUIC connections over 127.0.0.1 between every pair.
//
// Measurement and output are those of the peer benchmarks (bench/peers/common.hpp), so that
// bench/peers/compare.sh puts nexar next to Open MPI and Gloo:
//   * per size, -w untimed iterations, then -n timed ones; before every iteration all ranks
//     meet in a nexar barrier, then each rank times its own (blocking) call;
//   * an iteration's time is the slowest rank's; the printed time is the median over the
//     iterations (the mean of the two middle ones for an even -n);
//   * out-of-place buffers; algbw = size / time, busbw = algbw * the nccl-tests factor;
//   * "size" is the largest buffer of the operation;
//   * with -c 1, one more call on fresh inputs and poisoned outputs is compared element by
//     element with results computed here without the library; #wrong is summed over ranks
//     and a non-zero total makes the program exit 1.
// The per-rank times and #wrong counts are combined through shared memory (threads) or, after
// the timed region, with the communicator's own all_reduce (processes).
// The header names the topology and each rank's direct peers (Communicator::neighbours(),
// gathered with an all_gather before the sweep in a multi-process run); --form-stats adds how
// long the world took to form and the ranks' resident memory after it (bench/scale.sh).
#include <fmt/format.h>

#include <nexar/cluster.hpp>
#include <nexar/nexar.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <vector>

#include "subcommands.hpp"
#include "table.hpp"

namespace nexar::bench {
namespace {

using Clock = std::chrono::steady_clock;

// ---- the collectives -----------------------------------------------------------------------

enum class CollKind { all_reduce, broadcast, reduce, all_gather, reduce_scatter, all_to_all, gather, scatter, scan, barrier };

struct CollInfo {
  CollKind coll;
  const char* name;
  const char* what;     ///< one line for --help
  const char* size;     ///< what "size" is, for --help
  const char* busbw;    ///< the busbw factor, for --help
  bool rooted;          ///< takes -r
  bool reduces;         ///< takes -o
  bool sharded;         ///< the size is split into one block per rank
};

// clang-format off
constexpr std::array<CollInfo, 10> kColls{{
  {CollKind::all_reduce, "all_reduce", "every rank gets the element-wise reduction of all ranks' vectors",
   "the vector", "2(n-1)/n", false, true, false},
  {CollKind::broadcast, "broadcast", "the root's vector is copied to every rank",
   "the vector", "1", true, false, false},
  {CollKind::reduce, "reduce", "the root gets the element-wise reduction of all ranks' vectors",
   "the vector", "1", true, true, false},
  {CollKind::all_gather, "all_gather", "every rank gets the concatenation of all ranks' blocks",
   "the gathered output (n blocks)", "(n-1)/n", false, false, true},
  {CollKind::reduce_scatter, "reduce_scatter", "rank r gets block r of the element-wise reduction",
   "the input that is scattered (n blocks)", "(n-1)/n", false, true, true},
  {CollKind::all_to_all, "all_to_all", "block j of rank i goes to block i of rank j",
   "the whole send buffer (n blocks)", "(n-1)/n", false, false, true},
  {CollKind::gather, "gather", "the root gets the concatenation of all ranks' blocks",
   "the gathered output at the root (n blocks)", "(n-1)/n", true, false, true},
  {CollKind::scatter, "scatter", "block r of the root's buffer goes to rank r",
   "the root's send buffer (n blocks)", "(n-1)/n", true, false, true},
  {CollKind::scan, "scan", "rank r gets the reduction over ranks 0..r (inclusive prefix)",
   "the vector", "1 (each rank receives one vector; nccl-tests has no scan)", false, true, false},
  {CollKind::barrier, "barrier", "every rank waits until all have entered",
   "0 (no data)", "0", false, false, false},
}};
// clang-format on

double busbw_factor(CollKind c, int n) {
  switch (c) {
    case CollKind::all_reduce: return 2.0 * (n - 1) / n;
    case CollKind::all_gather:
    case CollKind::reduce_scatter:
    case CollKind::all_to_all:
    case CollKind::gather:
    case CollKind::scatter: return static_cast<double>(n - 1) / n;
    case CollKind::broadcast:
    case CollKind::reduce:
    case CollKind::scan: return 1.0;
    case CollKind::barrier: return 0.0;
  }
  return 0.0;
}

// ---- options ---------------------------------------------------------------------------------

struct CollOptions {
  std::uint64_t min_bytes = 32ull << 20;
  std::uint64_t max_bytes = 32ull << 20;
  double factor = 2.0;
  std::uint64_t step_bytes = 0;  // -i: additive step, used when -f is 1
  int iters = 20;
  int warmup = 5;
  int check = 1;
  DataType dtype = DataType::f32;
  ReduceOp op = ReduceOp::sum;
  int root = 0;
  int ranks = 2;
  Algorithm algo = Algorithm::automatic;
  std::uint64_t segment = 0;  // 0: Config::tuning.segment_bytes
  int timeout_s = 1800;
  std::uint64_t bulk = 0;  // --bulk: background bulk-lane transfer 0 -> 1 of this size, repeated
  bool form_stats = false;  // --form-stats: print how the world formed (time, peers, memory)
};

struct NamedType {
  const char* name;  // as printed in the "type" column
  DataType t;
};
constexpr NamedType kTypes[] = {
    {"float", DataType::f32},  {"double", DataType::f64}, {"half", DataType::f16},   {"bfloat16", DataType::bf16},
    {"int8", DataType::i8},    {"uint8", DataType::u8},   {"int32", DataType::i32},  {"uint32", DataType::u32},
    {"int64", DataType::i64},  {"uint64", DataType::u64},
};
struct TypeAlias {
  const char* alias;
  DataType t;
};
constexpr TypeAlias kTypeAliases[] = {
    {"f32", DataType::f32},     {"float32", DataType::f32}, {"f64", DataType::f64},  {"float64", DataType::f64},
    {"f16", DataType::f16},     {"float16", DataType::f16}, {"bf16", DataType::bf16}, {"i8", DataType::i8},
    {"char", DataType::i8},     {"u8", DataType::u8},       {"i32", DataType::i32},  {"int", DataType::i32},
    {"u32", DataType::u32},     {"i64", DataType::i64},     {"u64", DataType::u64},
};

const char* type_name(DataType t) {
  for (auto& e : kTypes)
    if (e.t == t) return e.name;
  return "?";
}

DataType parse_type(const std::string& s) {
  for (auto& e : kTypes)
    if (s == e.name) return e.t;
  for (auto& e : kTypeAliases)
    if (s == e.alias) return e.t;
  throw CLI::ValidationError(fmt::format(
      "unknown datatype '{}' (float, double, half, bfloat16, int8, uint8, int32, uint32, int64, uint64)", s));
}

struct NamedOp {
  const char* name;
  ReduceOp op;
};
constexpr NamedOp kOps[] = {
    {"sum", ReduceOp::sum}, {"prod", ReduceOp::prod}, {"min", ReduceOp::min}, {"max", ReduceOp::max},
    {"avg", ReduceOp::avg},
};

const char* op_name(ReduceOp op) {
  for (auto& e : kOps)
    if (e.op == op) return e.name;
  return "?";
}

ReduceOp parse_op(const std::string& s) {
  for (auto& e : kOps)
    if (s == e.name) return e.op;
  throw CLI::ValidationError(fmt::format("unknown reduction '{}' (sum, prod, min, max, avg)", s));
}

constexpr Algorithm kAlgos[] = {Algorithm::automatic,          Algorithm::ring,   Algorithm::halving_doubling,
                                Algorithm::recursive_doubling, Algorithm::hierarchical, Algorithm::tree,
                                Algorithm::linear,             Algorithm::pairwise, Algorithm::dissemination};

const char* algo_name(Algorithm a) { return nexar::to_string(a); }

std::string algo_names() {
  std::string s;
  for (Algorithm a : kAlgos) s += std::string(s.empty() ? "" : ", ") + algo_name(a);
  return s;
}

Algorithm parse_algo(const std::string& s) {
  for (Algorithm a : kAlgos)
    if (s == algo_name(a)) return a;
  if (s == "auto") return Algorithm::automatic;
  throw CLI::ValidationError(fmt::format("unknown algorithm '{}' ({})", s, algo_names()));
}

// ---- sizes -----------------------------------------------------------------------------------

/// Requested sizes -> element counts, as the peer benchmarks compute them: sharded
/// collectives round the count down to a multiple of the world size (at least one element
/// per rank), every count is at least 1, and duplicates after rounding are dropped.
std::vector<std::size_t> element_counts(const CollOptions& o, const CollInfo& ci, int n) {
  std::vector<std::size_t> out;
  const std::size_t es = size_of(o.dtype);
  const auto un = static_cast<std::size_t>(n);
  for (std::uint64_t s = o.min_bytes; s <= o.max_bytes;) {
    std::size_t c = static_cast<std::size_t>(s) / es;
    if (ci.sharded) c = std::max<std::size_t>(c / un, 1) * un;
    if (c == 0) c = 1;
    if (out.empty() || out.back() != c) out.push_back(c);
    std::uint64_t next = o.factor > 1.0 ? static_cast<std::uint64_t>(static_cast<double>(s) * o.factor)
                                        : s + o.step_bytes;
    if (next <= s) break;
    s = next;
  }
  return out;
}

// ---- element types -----------------------------------------------------------------------------
//
// Inputs are small integers, chosen so that every partial result of the reduction is an
// integer the element type holds exactly; the expected results are computed in 64-bit
// integers, so they are exact whatever order the library combines the contributions in.
// half and bfloat16 are encoded and decoded here, not with the library's conversions.

/// Bit pattern of the binary16 holding the integer v (|v| <= 2048, or a power of two).
std::uint16_t half_bits_of(long long v) {
  if (v == 0) return 0;
  std::uint16_t sign = v < 0 ? 0x8000 : 0;
  auto m = static_cast<std::uint64_t>(v < 0 ? -v : v);
  int e = std::bit_width(m) - 1;  // m in [2^e, 2^(e+1))
  auto frac = static_cast<std::uint16_t>(e >= 10 ? (m >> (e - 10)) & 0x3FF : (m << (10 - e)) & 0x3FF);
  return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>((e + 15) << 10) | frac);
}

double half_value(std::uint16_t b) {
  const double sign = (b & 0x8000) ? -1.0 : 1.0;
  const int exp = (b >> 10) & 0x1F;
  const int frac = b & 0x3FF;
  if (exp == 0) return sign * std::ldexp(frac, -24);
  if (exp == 31) return frac ? std::numeric_limits<double>::quiet_NaN() : sign * std::numeric_limits<double>::infinity();
  return sign * std::ldexp(1024 + frac, exp - 25);
}

/// bfloat16 of the integer v (exact when v has at most 8 significant bits).
std::uint16_t bf16_bits_of(long long v) {
  auto f = static_cast<float>(v);
  return static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(f) >> 16);
}

double bf16_value(std::uint16_t b) { return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16); }

template <class T>
struct Elem {
  static T make(long long v) {
    if constexpr (std::is_same_v<T, half>) return half{half_bits_of(v)};
    else if constexpr (std::is_same_v<T, bfloat16>) return bfloat16{bf16_bits_of(v)};
    else return static_cast<T>(v);
  }
  static double value(T x) {
    if constexpr (std::is_same_v<T, half>) return half_value(x.bits);
    else if constexpr (std::is_same_v<T, bfloat16>) return bf16_value(x.bits);
    else return static_cast<double>(x);
  }
  /// What the outputs hold before the checked call: a NaN, or the type's largest value,
  /// which no correct result reaches (see exact_limit).
  static T poison() {
    if constexpr (std::is_same_v<T, half>) return half{0x7E00};
    else if constexpr (std::is_same_v<T, bfloat16>) return bfloat16{0x7FC0};
    else if constexpr (std::is_floating_point_v<T>) return std::numeric_limits<T>::quiet_NaN();
    else return std::numeric_limits<T>::max();
  }
};

/// The largest magnitude every partial result may reach: exactly representable for the
/// floating types, below the poison value for the integer ones.
long long exact_limit(DataType t) {
  switch (t) {
    case DataType::f32: return 1ll << 24;
    case DataType::f64: return 1ll << 52;
    case DataType::f16: return 2048;
    case DataType::bf16: return 256;
    case DataType::i8: return 126;
    case DataType::u8: return 254;
    case DataType::i32: return (1ll << 31) - 2;
    case DataType::u32: return (1ll << 32) - 2;
    case DataType::i64:
    case DataType::u64: return 1ll << 52;
  }
  return 0;
}

bool is_unsigned(DataType t) {
  return t == DataType::u8 || t == DataType::u32 || t == DataType::u64;
}

/// The inputs of a sweep: element i of rank r, and the reductions over ranks computed here.
class Pattern {
 public:
  Pattern(DataType t, ReduceOp op, int n) : op_(op), n_(n), unsigned_(is_unsigned(t)) {
    const long long limit = exact_limit(t);
    // sum: n values of magnitude <= m, plus up to n more on the last rank for avg (which
    // makes every sum a multiple of n, so that the average is an integer too).
    const long long room = (limit - (op == ReduceOp::avg ? n : 0)) / n;
    if (unsigned_) {
      span_ = std::clamp<long long>(room + 1, 1, 64);  // values 0 .. span-1
      exact_ = room >= 1;
    } else {
      span_ = 2 * std::clamp<long long>(room, 1, 32);  // values -span/2 .. span/2-1
      exact_ = room >= 1;
    }
    // prod: +-1 everywhere, and a 2 now and then on the first `twos_` ranks only.
    twos_ = std::bit_width(static_cast<std::uint64_t>(limit)) - 1;
  }

  /// False when the world is too large for this type to hold every result exactly.
  bool exact() const { return exact_; }

  long long input(int r, std::size_t i) const {
    long long v = base(r, i);
    if (op_ == ReduceOp::avg && r == n_ - 1) {
      long long s = 0;
      for (int q = 0; q < n_; ++q) s += base(q, i);
      v += (n_ - s % n_) % n_;  // s may be negative: % keeps its sign, the outer % folds n
    }
    return v;
  }

  /// The reduction over ranks `first` .. `last` of element i.
  long long reduce(int first, int last, std::size_t i) const {
    long long acc = input(first, i);
    for (int r = first + 1; r <= last; ++r) {
      long long v = input(r, i);
      switch (op_) {
        case ReduceOp::sum:
        case ReduceOp::avg: acc += v; break;
        case ReduceOp::prod: acc *= v; break;
        case ReduceOp::min: acc = std::min(acc, v); break;
        case ReduceOp::max: acc = std::max(acc, v); break;
      }
    }
    if (op_ == ReduceOp::avg) acc /= (last - first + 1);  // exact by construction (all ranks)
    return acc;
  }

 private:
  static std::uint64_t mix(int r, std::size_t i) {
    std::uint64_t x = (static_cast<std::uint64_t>(i) + 1) * 0xD1B54A32D192ED03ull ^
                      (static_cast<std::uint64_t>(r) + 1) * 0x8CB92BA72F3D8DD7ull;
    x ^= x >> 31;
    x *= 0x9E3779B97F4A7C15ull;
    x ^= x >> 29;
    return x;
  }
  long long base(int r, std::size_t i) const {
    const std::uint64_t h = mix(r, i);
    if (op_ == ReduceOp::prod) {
      if (r < twos_ && (h & 3) == 0) return (!unsigned_ && (h & 8)) ? -2 : 2;
      return (!unsigned_ && (h & 4)) ? -1 : 1;
    }
    const auto v = static_cast<long long>((h >> 8) % static_cast<std::uint64_t>(span_));
    return unsigned_ ? v : v - span_ / 2;
  }

  ReduceOp op_;
  int n_;
  bool unsigned_;
  long long span_ = 2;
  int twos_ = 0;
  bool exact_ = true;
};

// ---- the ranks, as threads ----------------------------------------------------------------------

/// Thrown out of Team::sync once some rank has failed.
struct TeamAborted : std::exception {
  const char* what() const noexcept override { return "another rank failed"; }
};

/// How the ranks combine their per-iteration times and #wrong counts (combined here, not by
/// the collective under test's result). Ranks as threads share slots and a barrier that
/// gives up when one of them fails; ranks as processes (started by a launcher) use the
/// communicator itself, after the timed region.
class Team {
 public:
  /// `n` threads of this process, or one rank of a multi-process run (`distributed`).
  Team(int n, bool distributed)
      : times_(distributed ? 0 : static_cast<std::size_t>(n)),
        wrong_(distributed ? 0 : static_cast<std::size_t>(n), 0),
        n_(n),
        distributed_(distributed) {}

  void sync(Communicator& comm) {
    if (distributed_) return comm.barrier();
    std::unique_lock lk(mu_);
    if (aborted_) throw TeamAborted{};
    const std::uint64_t gen = gen_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++gen_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lk, [&] { return gen_ != gen || aborted_; });
    if (gen_ == gen) throw TeamAborted{};
  }
  void abort() {
    std::lock_guard lk(mu_);
    aborted_ = true;
    cv_.notify_all();
  }

  /// Per iteration, the slowest rank's time.
  std::vector<double> slowest(Communicator& comm, std::vector<double> mine) {
    if (distributed_) {
      comm.all_reduce(std::span<double>(mine), ReduceOp::max);
      return mine;
    }
    times_[static_cast<std::size_t>(comm.rank())] = mine;
    sync(comm);
    std::vector<double> out(mine.size(), 0.0);
    for (auto& rt : times_)
      for (std::size_t i = 0; i < out.size(); ++i) out[i] = std::max(out[i], rt[i]);
    sync(comm);  // every rank has read the times before any writes the next ones
    return out;
  }

  /// The sum over ranks.
  long total(Communicator& comm, long mine) {
    if (distributed_) {
      std::int64_t v = mine;
      comm.all_reduce(std::span<std::int64_t>(&v, 1), ReduceOp::sum);
      return static_cast<long>(v);
    }
    wrong_[static_cast<std::size_t>(comm.rank())] = mine;
    sync(comm);
    long sum = 0;
    for (long w : wrong_) sum += w;
    sync(comm);
    return sum;
  }

 private:
  std::vector<std::vector<double>> times_;  ///< [rank][iteration], microseconds
  std::vector<long> wrong_;                 ///< [rank]
  int n_;
  bool distributed_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  std::uint64_t gen_ = 0;
  bool aborted_ = false;
};

struct SweepResult {
  long wrong = 0;
  double avg_busbw = 0;
};

/// --bulk: while the sweep runs, rank 0 streams `bytes` to rank 1 on the bulk lane over and
/// over (bulk_send / bulk_recv on a thread of each), so the table shows what a
/// collective costs beside a large transfer between the same two ranks. A zero-byte
/// message ends the receiver's loop.
class BulkLoad {
 public:
  BulkLoad(Communicator& comm, std::uint64_t bytes) {
    if (bytes == 0 || comm.size() < 2 || comm.rank() > 1) return;
    // Allocated and touched here, before anything is timed: the page faults of a fresh
    // gigabyte would otherwise compete with the sweep instead of the transfer.
    buf_.assign(static_cast<std::size_t>(bytes), std::byte{1});
    thread_ = std::thread([this, &comm] {
      try {
        if (comm.rank() == 0) {
          while (!stop_.load()) comm.bulk_send(1, kTag, buf_.data(), buf_.size());
          comm.bulk_send(1, kTag, buf_.data(), 0);
        } else {
          // Rank 1 reports what the bulk lane moved meanwhile (whole transfers only).
          const auto t0 = std::chrono::steady_clock::now();
          std::uint64_t moved = 0;
          for (std::size_t got; (got = comm.bulk_recv(0, kTag, buf_.data(), buf_.size()).bytes) != 0;) moved += got;
          const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          std::fprintf(stderr, "# --bulk: the bulk lane moved %.2f GB in %.2f s meanwhile (%.2f GB/s)\n",
                       static_cast<double>(moved) / 1e9, s, static_cast<double>(moved) / 1e9 / s);
        }
      } catch (const std::exception& e) {
        std::fprintf(stderr, "nexar-bench: rank %d: --bulk transfer: %s\n", comm.rank(), e.what());
      }
    });
    // Let the first transfer get under way (announcement, clear-to-send) before timing.
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  ~BulkLoad() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  BulkLoad(const BulkLoad&) = delete;
  BulkLoad& operator=(const BulkLoad&) = delete;

 private:
  static constexpr int kTag = 0x5eed;
  std::vector<std::byte> buf_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

/// One rank's whole sweep. Rank 0 prints.
template <class T>
void run_rank(Communicator& comm, const CollOptions& o, const CollInfo& ci, Team& team, SweepResult& result) {
  const int n = comm.size();
  const int me = comm.rank();
  const auto un = static_cast<std::size_t>(n);
  const bool print = me == 0;
  const char* tname = type_name(o.dtype);
  const char* redop = ci.reduces ? op_name(o.op) : "none";
  const int root = ci.rooted ? o.root : -1;
  CollectiveOptions co;
  co.algorithm = o.algo;
  co.segment_bytes = static_cast<std::size_t>(o.segment);
  CollectiveReport report;
  long total_wrong = 0;
  double bw_sum = 0;
  int bw_cnt = 0;

  // Iterations of one size: returns the median over iterations of the slowest rank's time.
  auto time_iterations = [&](auto&& call) {
    for (int i = 0; i < o.warmup; ++i) {
      comm.barrier();
      call();
    }
    std::vector<double> t(static_cast<std::size_t>(o.iters));
    for (auto& ti : t) {
      comm.barrier();
      auto t0 = Clock::now();
      call();
      auto t1 = Clock::now();
      ti = std::chrono::duration<double, std::micro>(t1 - t0).count();
    }
    std::vector<double> slowest = team.slowest(comm, std::move(t));
    if (print && std::getenv("PEERS_VERBOSE")) {
      std::string line = "# iter times (us):";
      for (double x : slowest) line += fmt::format(" {:.1f}", x);
      std::fprintf(stderr, "%s\n", line.c_str());
    }
    return median_midpoint(std::move(slowest));
  };

  if (print) report.header();
  BulkLoad bulk(comm, o.bulk);

  if (ci.coll == CollKind::barrier) {
    double us = time_iterations([&] { comm.barrier(co); });
    if (print) report.row(0, 0, tname, "none", -1, us, 0.0, 0.0, std::nullopt);
    result = {0, 0.0};
    return;
  }

  const Pattern pat(o.dtype, o.op, n);
  if (o.check && !pat.exact())
    throw std::invalid_argument(fmt::format("-c 1: {} ranks are too many for exact {} results of {} in {}; "
                                            "use a wider -d or -c 0",
                                            n, op_name(o.op), ci.name, tname));

  for (std::size_t count : element_counts(o, ci, n)) {
    const std::size_t blk = ci.sharded ? count / un : 0;
    std::size_t nin = count, nout = count;
    if (ci.coll == CollKind::all_gather || ci.coll == CollKind::gather) nin = blk;
    if (ci.coll == CollKind::reduce_scatter || ci.coll == CollKind::scatter) nout = blk;
    std::vector<T> in(nin), out(nout);
    auto fill_inputs = [&] {
      // all_gather and gather send this rank's block; the others send a full vector.
      for (std::size_t i = 0; i < nin; ++i) in[i] = Elem<T>::make(pat.input(me, i));
    };
    fill_inputs();

    const DataType dt = o.dtype;
    auto call = [&] {
      switch (ci.coll) {
        case CollKind::all_reduce: comm.all_reduce(in.data(), out.data(), count, dt, o.op, co); break;
        // The root broadcasts straight from its input; the others receive into their output.
        case CollKind::broadcast: comm.broadcast(me == o.root ? in.data() : out.data(), count, dt, o.root, co); break;
        case CollKind::reduce: comm.reduce(in.data(), out.data(), count, dt, o.op, o.root, co); break;
        case CollKind::all_gather: comm.all_gather(in.data(), out.data(), blk, dt, co); break;
        case CollKind::reduce_scatter: comm.reduce_scatter(in.data(), out.data(), count, dt, o.op, co); break;
        case CollKind::all_to_all: comm.all_to_all(in.data(), out.data(), blk, dt, co); break;
        case CollKind::gather: comm.gather(in.data(), out.data(), blk, dt, o.root, co); break;
        case CollKind::scatter: comm.scatter(in.data(), out.data(), blk, dt, o.root, co); break;
        case CollKind::scan: comm.scan(in.data(), out.data(), count, dt, o.op, co); break;
        case CollKind::barrier: comm.barrier(co); break;
      }
    };

    const double us = time_iterations(call);

    std::optional<long> wrong;
    if (o.check) {
      // Fresh inputs, poisoned outputs, one more call, then every output element.
      fill_inputs();
      std::fill(out.begin(), out.end(), Elem<T>::poison());
      comm.barrier();
      call();
      const T* res = (ci.coll == CollKind::broadcast && me == o.root) ? in.data() : out.data();
      const std::size_t nres = (ci.coll == CollKind::broadcast && me == o.root) ? nin : nout;
      // The value element j of this rank's output must have.
      auto expect = [&](std::size_t j) -> long long {
        switch (ci.coll) {
          case CollKind::all_reduce:
          case CollKind::reduce: return pat.reduce(0, n - 1, j);
          case CollKind::broadcast: return pat.input(o.root, j);
          case CollKind::all_gather:
          case CollKind::gather: return pat.input(static_cast<int>(j / blk), j % blk);
          case CollKind::reduce_scatter: return pat.reduce(0, n - 1, static_cast<std::size_t>(me) * blk + j);
          // out[s*blk + k] = in_s[me*blk + k]
          case CollKind::all_to_all: return pat.input(static_cast<int>(j / blk), static_cast<std::size_t>(me) * blk + j % blk);
          case CollKind::scatter: return pat.input(o.root, static_cast<std::size_t>(me) * blk + j);
          case CollKind::scan: return pat.reduce(0, me, j);
          case CollKind::barrier: break;
        }
        return 0;
      };
      const bool has_output = !((ci.coll == CollKind::reduce || ci.coll == CollKind::gather) && me != o.root);
      long mine = 0;
      if (has_output)
        for (std::size_t j = 0; j < nres; ++j)
          if (!(Elem<T>::value(res[j]) == static_cast<double>(expect(j)))) ++mine;
      const long sum = team.total(comm, mine);
      wrong = sum;
      total_wrong += sum;
    }

    const std::uint64_t bytes = count * sizeof(T);
    const double algbw = static_cast<double>(bytes) / (us * 1e-6) / 1e9;
    const double busbw = algbw * busbw_factor(ci.coll, n);
    bw_sum += busbw;
    ++bw_cnt;
    if (print) report.row(bytes, count, tname, redop, root, us, algbw, busbw, wrong);
  }
  result = {total_wrong, bw_cnt ? bw_sum / bw_cnt : 0.0};
}

/// run_rank for the element type of `t`.
void run_rank_typed(Communicator& comm, const CollOptions& o, const CollInfo& ci, Team& team, SweepResult& r) {
  switch (o.dtype) {
    case DataType::f32: return run_rank<float>(comm, o, ci, team, r);
    case DataType::f64: return run_rank<double>(comm, o, ci, team, r);
    case DataType::f16: return run_rank<half>(comm, o, ci, team, r);
    case DataType::bf16: return run_rank<bfloat16>(comm, o, ci, team, r);
    case DataType::i8: return run_rank<std::int8_t>(comm, o, ci, team, r);
    case DataType::u8: return run_rank<std::uint8_t>(comm, o, ci, team, r);
    case DataType::i32: return run_rank<std::int32_t>(comm, o, ci, team, r);
    case DataType::u32: return run_rank<std::uint32_t>(comm, o, ci, team, r);
    case DataType::i64: return run_rank<std::int64_t>(comm, o, ci, team, r);
    case DataType::u64: return run_rank<std::uint64_t>(comm, o, ci, team, r);
  }
}

// ---- the subcommand ----------------------------------------------------------------------------

/// Kills the process when the run takes longer than --timeout.
class Deadline {
 public:
  Deadline(int seconds, std::string who) {
    if (seconds <= 0) return;
    thread_ = std::thread([this, seconds, who = std::move(who)] {
      std::unique_lock lk(mu_);
      if (!cv_.wait_for(lk, std::chrono::seconds(seconds), [&] { return done_; })) {
        std::fflush(stdout);
        std::fprintf(stderr, "%s: still running after %d s (--timeout), giving up\n", who.c_str(), seconds);
        std::fflush(stderr);
        std::_Exit(124);
      }
    });
  }
  ~Deadline() {
    {
      std::lock_guard lk(mu_);
      done_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

/// Checks the options that do not depend on the world size; throws std::invalid_argument.
void check_options(const CollOptions& o, const CollInfo& ci) {
  if (o.iters < 1) throw std::invalid_argument("-n must be >= 1");
  if (o.warmup < 0) throw std::invalid_argument("-w must be >= 0");
  if (o.min_bytes > o.max_bytes) throw std::invalid_argument("-b must be <= -e");
  if (o.factor <= 1.0 && o.step_bytes == 0 && o.min_bytes != o.max_bytes)
    throw std::invalid_argument("-f must be > 1 (or give -i)");
  if (ci.reduces && o.op == ReduceOp::avg && !is_floating(o.dtype))
    throw std::invalid_argument(fmt::format("-o avg needs a floating -d (float, double, half, bfloat16), not {}",
                                            type_name(o.dtype)));
  if (ci.coll == CollKind::scan && o.op == ReduceOp::avg)
    throw std::invalid_argument("scan: -o avg is not measured (a prefix average has no agreed divisor)");
}

// ---- how the world formed ----------------------------------------------------------------------

/// This process's resident memory (VmRSS in /proc/self/status) in KiB; -1 where unknown.
std::int64_t resident_kib() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return -1;
  std::int64_t kib = -1;
  char line[256];
  while (std::fgets(line, sizeof line, f) != nullptr)
    if (std::strncmp(line, "VmRSS:", 6) == 0) {
      kib = std::strtoll(line + 6, nullptr, 10);
      break;
    }
  std::fclose(f);
  return kib;
}

/// What the header says about the world's formation: each rank's direct peers
/// (Communicator::neighbours()) and, for --form-stats, how long forming took and the memory
/// the ranks hold right after it.
struct Formation {
  bool threads = false;               ///< ranks as threads of this process (bootstrap_local)
  std::vector<int> first;             ///< rank 0's direct peers
  std::vector<std::int64_t> peers;    ///< [rank] how many direct peers
  std::vector<std::int64_t> form_us;  ///< [rank] join call -> communicator ready (threads: bootstrap_local)
  std::vector<std::int64_t> rss_kib;  ///< [rank] VmRSS of its process (threads: the process's / n)
  std::int64_t rss_before_kib = -1;   ///< threads: the process's VmRSS before bootstrap_local
};

/// The least, mean and largest of per-rank counts (not empty).
struct Spread {
  std::int64_t min = 0;
  double mean = 0;
  std::int64_t max = 0;
};
Spread spread_of(const std::vector<std::int64_t>& v) {
  const auto [mn, mx] = std::minmax_element(v.begin(), v.end());
  double sum = 0;
  for (std::int64_t x : v) sum += static_cast<double>(x);
  return {*mn, sum / static_cast<double>(v.size()), *mx};
}

/// Under Config::lazy_connect, how many connections the ranks opened by the end of the run
/// (counts[r]: rank r's Communicator::connected_peers()), as a header line and a
/// `# lazy-connections key=value ...` line for bench/scale.sh. Nothing otherwise.
void print_connections(const Config& cfg, const std::vector<std::int64_t>& counts) {
  if (!cfg.lazy_connect || counts.empty()) return;
  const Spread c = spread_of(counts);
  std::printf("# lazy_connect: %.2f connections per rank opened by the end of the run (min %lld, max %lld)\n", c.mean,
              static_cast<long long>(c.min), static_cast<long long>(c.max));
  std::printf("# lazy-connections conn_min=%lld conn_mean=%.2f conn_max=%lld\n", static_cast<long long>(c.min), c.mean,
              static_cast<long long>(c.max));
}

/// A multi-process run's Formation: every rank gives its own figures, {peers, form_us,
/// rss_kib}, to an all_gather.
Formation gather_formation(Communicator& comm, std::int64_t form_us) {
  const int n = comm.size();
  const std::vector<int> mine = comm.neighbours();
  const std::int64_t local[3] = {static_cast<std::int64_t>(mine.size()), form_us, resident_kib()};
  std::vector<std::int64_t> all(3 * static_cast<std::size_t>(n));
  comm.all_gather(std::span<const std::int64_t>(local, 3), std::span<std::int64_t>(all));
  Formation f;
  if (comm.rank() == 0) f.first = mine;
  for (int r = 0; r < n; ++r) {
    const auto at = 3 * static_cast<std::size_t>(r);
    f.peers.push_back(all[at]);
    f.form_us.push_back(all[at + 1]);
    f.rss_kib.push_back(all[at + 2]);
  }
  return f;
}

/// `# topology k_regular:4: 4 direct peers per rank (min 4, max 4); rank 0: 1 2 14 15`, and
/// with --form-stats a `# form-stats key=value ...` line for scripts (bench/scale.sh).
void print_formation(const CollOptions& o, const Config& cfg, const Formation& f) {
  const auto n = static_cast<int>(f.peers.size());
  if (n == 0) return;
  const Spread peers = spread_of(f.peers);
  const std::int64_t mn = peers.min, mx = peers.max;
  const double mean = peers.mean;
  std::string list;
  constexpr std::size_t shown = 32;
  for (std::size_t i = 0; i < f.first.size() && i < shown; ++i) list += fmt::format(" {}", f.first[i]);
  if (f.first.size() > shown) list += fmt::format(" ... ({} more)", f.first.size() - shown);
  if (f.first.empty()) list = " none";
  const std::string per = mn == mx ? fmt::format("{}", mn) : fmt::format("{:.2f}", mean);
  std::printf("# topology %s: %s direct peers per rank%s (min %lld, max %lld); rank 0:%s\n",
              cfg.topology.to_string().c_str(), per.c_str(), mn == mx ? "" : " on average",
              static_cast<long long>(mn), static_cast<long long>(mx), list.c_str());
  if (o.form_stats) {
    auto med = [](const std::vector<std::int64_t>& v) {
      std::vector<double> d(v.begin(), v.end());
      return median_midpoint(std::move(d));
    };
    const double form_max = static_cast<double>(*std::max_element(f.form_us.begin(), f.form_us.end()));
    std::string line = fmt::format(
        "# form-stats ranks={} mode={} topology={} form_ms={:.1f} form_ms_rank0={:.1f} peers_min={} "
        "peers_mean={:.2f} peers_max={} rss_kib_median={:.0f} rss_kib_max={}",
        n, f.threads ? "threads" : "processes", cfg.topology.to_string(), form_max / 1e3,
        static_cast<double>(f.form_us[0]) / 1e3, mn, mean, mx, med(f.rss_kib),
        *std::max_element(f.rss_kib.begin(), f.rss_kib.end()));
    if (f.threads) line += fmt::format(" rss_kib_before={}", f.rss_before_kib);
    std::printf("%s\n", line.c_str());
    std::printf("# form-stats: form_ms = %s; rss_kib = %s\n",
                f.threads ? "bootstrap_local(n) call -> return" : "join_from_env call -> return, slowest rank",
                f.threads ? "the process's VmRSS after formation / ranks (rss_kib_before: VmRSS before it)"
                          : "each rank process's VmRSS after formation");
  }
}

void print_header(const CollOptions& o, const CollInfo& ci, const Config& cfg, int n, const std::string& ranks_how,
                  const Formation& formation) {
  std::string algo = algo_name(o.algo);
  if (o.algo == Algorithm::automatic && ci.coll == CollKind::all_reduce)
    algo += fmt::format(" (recursive_doubling below {}, halving_doubling below {}, ring from there, hierarchical "
                        "instead when ranks share hosts)",
                        human_size(cfg.tuning.allreduce_doubling_bytes), human_size(cfg.tuning.allreduce_ring_bytes));
  else if (o.algo == Algorithm::automatic && ci.coll == CollKind::broadcast)
    algo += fmt::format(" (tree below {}, chain from there)", human_size(cfg.tuning.broadcast_chain_bytes));
  std::printf("# nexar-bench %s: nexar over QUIC%s, %s; algorithm %s; segment %s\n", ci.name,
              cfg.shm ? " (shared memory between ranks of a host)" : "", ranks_how.c_str(), algo.c_str(),
              human_size(o.segment ? o.segment : cfg.tuning.segment_bytes).c_str());
  std::printf("# ranks %d  minBytes %llu  maxBytes %llu  step: %g(factor)  warmup iters: %d  iters: %d  "
              "validation: %d  timing: median over iters of max over ranks\n",
              n, static_cast<unsigned long long>(o.min_bytes), static_cast<unsigned long long>(o.max_bytes),
              o.factor, o.warmup, o.iters, o.check);
  print_formation(o, cfg, formation);
  if (o.bulk)
    std::printf("# meanwhile: rank 0 streams %s to rank 1 on the bulk lane, over and over (--bulk)\n",
                human_size(o.bulk).c_str());
  std::fflush(stdout);
}

/// One rank per process: this process is one rank of a cluster a launcher started
/// (nexar-run, torchrun, mpirun, srun); it joins through join_from_env and rank 0 prints.
int run_launched(const CollOptions& o, const CollInfo& ci, const Config& cfg, const std::string& who) {
  Communicator comm;
  const auto t0 = Clock::now();
  try {
    comm = join_from_env(cfg);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: join_from_env: %s\n", who.c_str(), e.what());
    return 2;
  }
  const auto form_us = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count();
  const int n = comm.size();
  if (o.root < 0 || o.root >= n) {
    std::fprintf(stderr, "%s: error: -r %d is not a rank of %d\n", who.c_str(), o.root, n);
    comm.close();
    return 2;
  }
  Formation formation;
  try {
    formation = gather_formation(comm, form_us);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: rank %d: error: gathering the formation figures: %s\n", who.c_str(), comm.rank(),
                 e.what());
    comm.close();
    return 2;
  }
  if (comm.rank() == 0)
    print_header(o, ci, cfg, n, fmt::format("one rank per process ({} processes)", n), formation);
  Team team(n, true);
  SweepResult result;
  try {
    run_rank_typed(comm, o, ci, team, result);
    team.sync(comm);  // nobody closes while another still runs a collective
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "%s: rank %d: error: %s\n", who.c_str(), comm.rank(), e.what());
    comm.close();
    return 2;
  }
  if (comm.rank() == 0)
    CollectiveReport::footer(result.wrong, result.avg_busbw, o.check && ci.coll != CollKind::barrier);
  if (cfg.lazy_connect) {
    // Counted before the gather, which may connect more.
    const std::int64_t mine = static_cast<std::int64_t>(comm.connected_peers().size());
    std::vector<std::int64_t> all(static_cast<std::size_t>(n));
    comm.all_gather(std::span<const std::int64_t>(&mine, 1), std::span<std::int64_t>(all));
    if (comm.rank() == 0) print_connections(cfg, all);
  }
  comm.close();
  return result.wrong ? 1 : 0;
}

int run_collective(const CollOptions& o, const CollInfo& ci) {
  const std::string who = fmt::format("nexar-bench {}", ci.name);
  const int n = o.ranks;
  const bool launched = launched_from_env();
  Config cfg;
  try {
    cfg = Config::from_env();
    check_options(o, ci);
    if (!launched && (o.root < 0 || o.root >= n))
      throw std::invalid_argument(fmt::format("-r {} is not a rank of {}", o.root, n));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", who.c_str(), e.what());
    return 2;
  }

  Deadline deadline(o.timeout_s, who);
  if (launched) return run_launched(o, ci, cfg, who);
  std::vector<Communicator> comms;
  Formation formation;
  formation.threads = true;
  formation.rss_before_kib = resident_kib();
  try {
    const auto t0 = Clock::now();
    comms = bootstrap_local(n, cfg);
    const auto us = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count();
    const std::int64_t rss = resident_kib();
    for (auto& c : comms) {
      std::vector<int> nb = c.neighbours();
      formation.peers.push_back(static_cast<std::int64_t>(nb.size()));
      if (formation.peers.size() == 1) formation.first = std::move(nb);
      formation.form_us.push_back(us);
      formation.rss_kib.push_back(rss < 0 ? -1 : rss / n);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: bootstrap_local(%d): %s\n", who.c_str(), n, e.what());
    for (auto& c : comms) c.close();
    return 2;
  }
  print_header(o, ci, cfg, n,
               fmt::format("loopback (127.0.0.1), bootstrap_local: {} ranks as threads of one process", n),
               formation);

  Team team(n, false);
  std::vector<SweepResult> results(static_cast<std::size_t>(n));
  std::atomic<int> failed{0};
  std::mutex err_mu;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto& comm = comms[static_cast<std::size_t>(r)];
      try {
        run_rank_typed(comm, o, ci, team, results[static_cast<std::size_t>(r)]);
        team.sync(comm);  // nobody closes while another still runs a collective
      } catch (const TeamAborted&) {
        failed.fetch_add(1);
        comm.close();
      } catch (const std::exception& e) {
        failed.fetch_add(1);
        {
          std::lock_guard lk(err_mu);
          std::fflush(stdout);
          std::fprintf(stderr, "%s: rank %d: error: %s\n", who.c_str(), r, e.what());
        }
        // Stop the others: those waiting here at once, those inside a collective when
        // their operations on this rank fail with peer_closed.
        team.abort();
        comm.close();
      }
    });
  }
  for (auto& t : threads) t.join();
  std::vector<std::int64_t> connections;
  if (failed.load() == 0)
    for (auto& c : comms) connections.push_back(static_cast<std::int64_t>(c.connected_peers().size()));
  for (auto& c : comms) c.close();
  if (failed.load() > 0) return 2;

  const SweepResult& r0 = results[0];
  CollectiveReport::footer(r0.wrong, r0.avg_busbw, o.check && ci.coll != CollKind::barrier);
  print_connections(cfg, connections);
  return r0.wrong ? 1 : 0;
}

Subcommand add_one(CLI::App& parent, const CollInfo& ci) {
  auto o = std::make_shared<CollOptions>();
  CLI::App* app =
      parent.add_subcommand(ci.name, fmt::format("nccl-tests-style sweep of {}: {}", ci.name, ci.what));
  auto size_opt = [&](const char* flags, std::uint64_t* dst, const char* help) {
    add_size_option(app, flags, dst, help);
  };
  size_opt("-b,--minbytes", &o->min_bytes, "Smallest size, K/M/G suffixes (default 32M)");
  size_opt("-e,--maxbytes", &o->max_bytes, "Largest size (default 32M)");
  app->add_option("-f,--stepfactor", o->factor, "Multiply the size by this between steps")->capture_default_str();
  size_opt("-i,--stepbytes", &o->step_bytes, "Add this many bytes between steps (used when -f is 1)");
  app->add_option("-n,--iters", o->iters, "Timed iterations per size")->capture_default_str();
  app->add_option("-w,--warmup_iters", o->warmup, "Untimed warm-up iterations per size")->capture_default_str();
  app->add_option("-c,--check", o->check, "Check results element by element (0/1); #wrong > 0 exits with 1")
      ->capture_default_str()
      ->check(CLI::Range(0, 1));
  app->add_option_function<std::string>(
         "-d,--datatype", [o](const std::string& s) { o->dtype = parse_type(s); },
         "float (default), double, half, bfloat16, int8, uint8, int32, uint32, int64, uint64")
      ->type_name("TYPE");
  app->add_option_function<std::string>(
         "-o,--op", [o](const std::string& s) { o->op = parse_op(s); },
         ci.reduces ? "Reduction: sum (default), prod, min, max, avg (floating types only)"
                    : "Reduction: sum (default), prod, min, max, avg (ignored: this collective does not reduce)")
      ->type_name("OP");
  app->add_option("-r,--root", o->root, ci.rooted ? "Root rank" : "Root rank (ignored: this collective has none)")
      ->capture_default_str();
  app->add_option("--ranks", o->ranks, "Number of ranks, run as threads of this process")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  app->add_option_function<std::string>(
         "-a,--algo", [o](const std::string& s) { o->algo = parse_algo(s); },
         "Algorithm: " + algo_names() + " (automatic is the default); one the collective lacks is an error")
      ->type_name("ALGO");
  size_opt("--segment", &o->segment, "Pipelining segment in bytes (default: NEXAR_SEGMENT_BYTES, 512K)");
  size_opt("--bulk", &o->bulk,
           "Meanwhile rank 0 streams this many bytes to rank 1 on the bulk lane, over and over (default 0: off)");
  app->add_option("--timeout", o->timeout_s, "Overall deadline in seconds (exit 124); 0 disables it")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app->add_flag("--form-stats", o->form_stats,
                "Print a '# form-stats key=value ...' header line: how long forming the world took "
                "(slowest rank), direct peers per rank, resident memory per rank after formation");
  app->footer(fmt::format(
      "{name}: size = {size}; busbw = algbw * {bus}.\n"
      "Ranks: --ranks N threads of this process, one communicator each from nexar::bootstrap_local(N),\n"
      "connected by QUIC over 127.0.0.1. Under a launcher (nexar-run -n N, torchrun, mpirun, srun:\n"
      "NEXAR_RANK/NEXAR_SEED_ADDR, RANK, OMPI_COMM_WORLD_*, PMI_*, SLURM_*) each process is one rank\n"
      "and joins with nexar::join_from_env(); --ranks is ignored and rank 0 prints.\n"
      "Measurement (as bench/peers/common.hpp): a nexar barrier before every iteration, each rank\n"
      "times its own call, iteration time = slowest rank, printed time = median over -n iterations;\n"
      "out-of-place buffers. -c 1: one more call on fresh inputs and poisoned outputs, every element\n"
      "compared with results computed without the library; #wrong is summed over ranks.\n"
      "Header: '# topology T: K direct peers per rank (min, max); rank 0: ...' gives Config::topology\n"
      "(NEXAR_TOPOLOGY) and each rank's direct connections (Communicator::neighbours()); the other\n"
      "peers are relayed. --form-stats adds '# form-stats ranks= mode= topology= form_ms= form_ms_rank0=\n"
      "peers_min= peers_mean= peers_max= rss_kib_median= rss_kib_max= [rss_kib_before=]': form_ms is\n"
      "join_from_env() per process (the slowest rank) or bootstrap_local(N) for threads; rss_kib is each\n"
      "rank process's VmRSS after formation, or for threads the process's VmRSS / N (bench/scale.sh).\n"
      "Exit status: 0 ok, 1 #wrong > 0, 2 error, 124 --timeout.\n"
      "nexar settings come from the NEXAR_* environment variables (docs/CONFIG.md).",
      fmt::arg("name", ci.name), fmt::arg("size", ci.size), fmt::arg("bus", ci.busbw)));
  return {app, [o, &ci] { return run_collective(*o, ci); }};
}

}  // namespace

std::vector<Subcommand> add_collectives(CLI::App& parent) {
  std::vector<Subcommand> v;
  for (const CollInfo& ci : kColls) v.push_back(add_one(parent, ci));
  return v;
}

}  // namespace nexar::bench
