// Helpers of tests/collective_test.cpp: a pool of local worlds, running one thread per rank,
// element types, random data and the plain-loop references the results are checked against.
// Nothing here calls the library's reduction code: every reference is computed with loops
// over the inputs (integers with explicit wraparound, floating types in double).
#pragma once

#include <nexar/nexar.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <iomanip>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace nexar::coll_test {

using namespace std::chrono_literals;

// ---- configuration and worlds -----------------------------------------------------------

/// Defaults, independent of the environment, with a deadline long enough for a loaded
/// 2-core machine under ASan and short enough that a hang fails the test.
inline Config test_config() {
  Config c;
  c.op_timeout = 60s;
  c.log_level = LogLevel::error;
  return c;
}

/// bootstrap_local worlds of each size, created on first use and reused by later tests.
/// A world one of whose communicators was closed (run_ranks closes a world when a rank
/// fails, so that the others stop waiting) is replaced by a fresh one.
class WorldPool {
 public:
  static WorldPool& instance() {
    static WorldPool p;
    return p;
  }
  std::vector<Communicator>& world(int n) {
    std::lock_guard lk(mu_);
    auto& w = worlds_[n];
    bool usable = !w.empty();
    for (auto& c : w) usable = usable && c.is_open();
    if (!usable) {
      for (auto& c : w) c.close();
      w = bootstrap_local(n, test_config());
    }
    return w;
  }
  void clear() {
    std::lock_guard lk(mu_);
    for (auto& [n, w] : worlds_)
      for (auto& c : w) c.close();
    worlds_.clear();
  }

 private:
  std::mutex mu_;
  std::map<int, std::vector<Communicator>> worlds_;
};

inline std::vector<Communicator>& pooled_world(int n) { return WorldPool::instance().world(n); }

// Closes the pooled worlds after the last test of the binary, while the library is still
// fully alive (static destruction would be too late).
class PoolEnvironment : public ::testing::Environment {
 public:
  void TearDown() override { WorldPool::instance().clear(); }
};
[[maybe_unused]] inline const auto* const pool_env = ::testing::AddGlobalTestEnvironment(new PoolEnvironment);

/// Waits for every request of `reqs`, also after one of them failed, then rethrows the
/// first failure. A rank that gives up at its first failed wait would free the buffers its
/// other requests still read or write while they run.
template <typename Range, typename Get>
void wait_each(Range& reqs, Get&& get) {
  std::exception_ptr first;
  for (auto& r : reqs) {
    try {
      get(r).wait();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}
inline void wait_each(std::vector<Request>& reqs) {
  wait_each(reqs, [](Request& r) -> Request& { return r; });
}

/// Runs fn(rank) on one thread per rank of `comms`. When a rank throws, every communicator
/// of `comms` is closed (their pending operations fail at once instead of waiting for the
/// deadline) and the first failure is reported with `ctx`. Returns true when no rank threw.
inline bool run_ranks(std::vector<Communicator>& comms, const std::string& ctx,
                      const std::function<void(int)>& fn) {
  const int n = static_cast<int>(comms.size());
  std::mutex mu;
  std::vector<std::string> errors;
  std::atomic<bool> failed{false};
  std::vector<std::thread> ts;
  ts.reserve(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    ts.emplace_back([&, r] {
      std::string msg;
      try {
        fn(r);
        return;
      } catch (const Error& e) {
        msg = "rank " + std::to_string(r) + " threw nexar::Error(" + to_string(e.code()) +
              "): " + e.what();
      } catch (const std::exception& e) {
        msg = "rank " + std::to_string(r) + " threw: " + e.what();
      }
      {
        std::lock_guard lk(mu);
        errors.push_back(std::move(msg));
      }
      if (!failed.exchange(true))
        for (auto& c : comms) c.close();
    });
  }
  for (auto& t : ts) t.join();
  if (!errors.empty()) {
    ADD_FAILURE() << ctx << ": " << errors.front()
                  << (errors.size() > 1
                          ? " (then " + std::to_string(errors.size() - 1) +
                                " follow-on failure(s) after the world was closed; next: " +
                                errors[1] + ")"
                          : std::string());
    return false;
  }
  return true;
}

// ---- element types ----------------------------------------------------------------------

template <class T>
inline constexpr bool is_float_v =
    std::is_floating_point_v<T> || std::is_same_v<T, half> || std::is_same_v<T, bfloat16>;

/// Calls f(std::type_identity<T>{}) with the C++ type of `t`.
template <class F>
void with_type(DataType t, F&& f) {
  switch (t) {
    case DataType::f32: f(std::type_identity<float>{}); return;
    case DataType::f64: f(std::type_identity<double>{}); return;
    case DataType::f16: f(std::type_identity<half>{}); return;
    case DataType::bf16: f(std::type_identity<bfloat16>{}); return;
    case DataType::i8: f(std::type_identity<std::int8_t>{}); return;
    case DataType::u8: f(std::type_identity<std::uint8_t>{}); return;
    case DataType::i32: f(std::type_identity<std::int32_t>{}); return;
    case DataType::u32: f(std::type_identity<std::uint32_t>{}); return;
    case DataType::i64: f(std::type_identity<std::int64_t>{}); return;
    case DataType::u64: f(std::type_identity<std::uint64_t>{}); return;
  }
}

inline constexpr DataType all_dtypes[] = {DataType::f32, DataType::f64, DataType::f16,
                                          DataType::bf16, DataType::i8,  DataType::u8,
                                          DataType::i32, DataType::u32, DataType::i64,
                                          DataType::u64};

template <class T>
double to_d(T x) {
  if constexpr (std::is_same_v<T, half>)
    return static_cast<double>(from_half(x));
  else if constexpr (std::is_same_v<T, bfloat16>)
    return static_cast<double>(from_bfloat16(x));
  else
    return static_cast<double>(x);
}

/// double -> T (floating types round, through f32 for the 16-bit ones; integers truncate).
template <class T>
T from_d(double x) {
  if constexpr (std::is_same_v<T, half>)
    return to_half(static_cast<float>(x));
  else if constexpr (std::is_same_v<T, bfloat16>)
    return to_bfloat16(static_cast<float>(x));
  else
    return static_cast<T>(x);
}

template <class T>
std::uint64_t bits_of(T x) {
  std::uint64_t b = 0;
  std::memcpy(&b, &x, sizeof(T));
  return b;
}

template <class T>
bool same_bits(T a, T b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

template <class T>
std::string show(T x) {
  std::ostringstream os;
  if constexpr (is_float_v<T>)
    os << std::setprecision(17) << to_d(x) << " [0x" << std::hex << bits_of(x) << "]";
  else if constexpr (std::is_signed_v<T>)
    os << static_cast<long long>(x);
  else
    os << static_cast<unsigned long long>(x);
  return os.str();
}

/// A value that no collective writes where nothing is to be written (bytes 0xA5).
template <class T>
T sentinel() {
  unsigned char b[sizeof(T)];
  std::memset(b, 0xA5, sizeof(T));
  T x{};
  std::memcpy(&x, b, sizeof(T));
  return x;
}

/// Twice the unit roundoff of a floating type.
template <class T>
double ulp_margin() {
  if constexpr (std::is_same_v<T, double>) return std::ldexp(1.0, -52);
  else if constexpr (std::is_same_v<T, float>) return std::ldexp(1.0, -23);
  else if constexpr (std::is_same_v<T, half>) return std::ldexp(1.0, -10);
  else return std::ldexp(1.0, -7);  // bfloat16
}

// ---- random data ------------------------------------------------------------------------

inline std::uint64_t mix(std::uint64_t a, std::uint64_t b) {
  std::uint64_t z = a * 0x9E3779B97F4A7C15ull + b + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// random: floating sum/avg in [-8, 8], prod in +-[0.9, 1.1] (a quarter negative), min/max
///   in [-1000, 1000]; integers: any bit pattern (sum and prod wrap), for prod mostly odd so
///   that the wrapped product is not 0.
/// exact (floating types): sum/avg multiples of 1/8 in [-2, 2] and prod +-{1/2, 1, 2}, so
///   every partial result of up to 8 ranks is exact in f16 and bf16 as well and the result
///   does not depend on the reduction order.
enum class Data { random, exact };

inline const char* name(Data d) { return d == Data::random ? "random" : "exact"; }

template <class T>
std::vector<T> gen(std::size_t count, ReduceOp op, Data kind, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<T> v(count);
  for (std::size_t i = 0; i < count; ++i) {
    if constexpr (is_float_v<T>) {
      double x = 0;
      const std::uint64_t bits = rng();
      const double u = static_cast<double>(bits >> 11) * std::ldexp(1.0, -53);  // [0, 1)
      if (op == ReduceOp::min || op == ReduceOp::max) {
        x = kind == Data::exact ? std::floor(u * 129) - 64 : u * 2000 - 1000;
      } else if (op == ReduceOp::prod) {
        const double sign = (bits & 3) == 0 ? -1.0 : 1.0;
        x = kind == Data::exact ? sign * std::ldexp(1.0, static_cast<int>(bits % 3) - 1)
                                : sign * (0.9 + 0.2 * u);
      } else {
        x = kind == Data::exact ? (std::floor(u * 33) - 16) / 8 : u * 16 - 8;
      }
      if (x == 0) x = 0;  // never -0 in generated data
      v[i] = from_d<T>(x);
      if (to_d(v[i]) == 0) v[i] = from_d<T>(0.0);
    } else {
      std::uint64_t bits = rng();
      if (op == ReduceOp::prod && (bits >> 62) != 0) bits |= 1;
      v[i] = static_cast<T>(bits);
    }
  }
  return v;
}

inline std::vector<std::byte> random_bytes(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::byte> v(n);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const std::uint64_t x = rng();
    std::memcpy(v.data() + i, &x, 8);
  }
  for (; i < n; ++i) v[i] = static_cast<std::byte>(rng());
  return v;
}

// ---- references -------------------------------------------------------------------------

/// The expected value of one element: exact bits, or a double value with a tolerance.
template <class T>
struct Ref {
  bool exact = true;
  T bits{};
  double val = 0;
  double tol = 0;
};

template <class T>
T int_op(T a, T b, ReduceOp op) {
  using U = std::make_unsigned_t<T>;
  const auto ua = static_cast<std::uint64_t>(static_cast<U>(a));
  const auto ub = static_cast<std::uint64_t>(static_cast<U>(b));
  switch (op) {
    case ReduceOp::sum: return static_cast<T>(static_cast<U>(ua + ub));  // modulo 2^bits
    case ReduceOp::prod: return static_cast<T>(static_cast<U>(ua * ub));
    case ReduceOp::min: return a < b ? a : b;
    case ReduceOp::max: return a < b ? b : a;
    case ReduceOp::avg: break;
  }
  return T{};
}

/// The element `i` of op over in[lo..hi) (hi > lo). avg divides by hi - lo, the number of
/// ranks reduced (for the scans: the ranks of the prefix).
template <class T>
Ref<T> reference(const std::vector<std::vector<T>>& in, std::size_t i, ReduceOp op, int lo,
                 int hi, Data kind) {
  Ref<T> e;
  const auto at = [&](int r) { return in[static_cast<std::size_t>(r)][i]; };
  if constexpr (!is_float_v<T>) {
    T acc = at(lo);
    for (int r = lo + 1; r < hi; ++r) acc = int_op(acc, at(r), op);
    e.bits = acc;
    return e;
  } else {
    const int m = hi - lo;
    if (op == ReduceOp::min || op == ReduceOp::max) {
      T best = at(lo);
      for (int r = lo + 1; r < hi; ++r) {
        const double x = to_d(at(r)), b = to_d(best);
        if (op == ReduceOp::min ? x < b : x > b) best = at(r);
      }
      e.bits = best;
      return e;
    }
    double s = op == ReduceOp::prod ? 1.0 : 0.0, mag = op == ReduceOp::prod ? 1.0 : 0.0;
    for (int r = lo; r < hi; ++r) {
      const double x = to_d(at(r));
      if (op == ReduceOp::prod) {
        s *= x;
        mag *= std::max(1.0, std::abs(x));  // bounds |any partial product|
      } else {
        s += x;
        mag += std::abs(x);  // bounds |any partial sum|
      }
    }
    if (kind == Data::exact) {  // s is exact and representable in T
      if (op != ReduceOp::avg) {
        e.bits = from_d<T>(s);
      } else if constexpr (std::is_same_v<T, double>) {
        e.bits = s / static_cast<double>(m);
      } else {
        e.bits = from_d<T>(static_cast<double>(static_cast<float>(s) / static_cast<float>(m)));
      }
      return e;
    }
    e.exact = false;
    const double u = ulp_margin<T>();
    if (op == ReduceOp::avg) {
      e.val = s / m;
      e.tol = (m + 1) * u * mag / m + u * std::abs(e.val);
    } else {
      e.val = s;
      e.tol = (m + 1) * u * mag + u * std::abs(s);
    }
    return e;
  }
}

template <class T>
bool matches(T got, const Ref<T>& e) {
  if (e.exact) return same_bits(got, e.bits);
  const double g = to_d(got);
  return std::isfinite(g) && std::abs(g - e.val) <= e.tol;
}

template <class T>
std::string show(const Ref<T>& e) {
  if (e.exact) return show(e.bits);
  std::ostringstream os;
  os << std::setprecision(17) << e.val << " +- " << std::setprecision(3) << e.tol;
  return os.str();
}

/// Checks got[0..len) against want(i); reports the number of wrong elements and the first.
template <class T, class Want>
void check_elements(const std::string& ctx, int rank, const char* what, const T* got,
                    std::size_t len, Want&& want) {
  std::size_t bad = 0;
  std::string first;
  for (std::size_t i = 0; i < len; ++i) {
    const auto e = want(i);
    if (!matches(got[i], e)) {
      if (bad++ == 0)
        first = "first at [" + std::to_string(i) + "]: expected " + show(e) + ", got " +
                show(got[i]);
    }
  }
  if (bad)
    ADD_FAILURE() << ctx << ": rank " << rank << " " << what << ": " << bad << " of " << len
                  << " elements wrong; " << first;
}

template <class T>
Ref<T> exactly(T x) {
  Ref<T> e;
  e.bits = x;
  return e;
}

/// Byte-exact comparison of element-sized units; reports the first differing element.
inline void check_bytes(const std::string& ctx, int rank, const char* what,
                        const std::byte* got, const std::byte* want, std::size_t bytes,
                        std::size_t es) {
  if (bytes == 0 || std::memcmp(got, want, bytes) == 0) return;
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < bytes / es; ++i)
    if (std::memcmp(got + i * es, want + i * es, es) != 0 && bad++ == 0) first = i;
  auto hex = [&](const std::byte* p) {
    std::ostringstream os;
    os << "0x";
    for (std::size_t k = es; k-- > 0;)
      os << std::hex << std::setw(2) << std::setfill('0') << std::to_integer<int>(p[k]);
    return os.str();
  };
  ADD_FAILURE() << ctx << ": rank " << rank << " " << what << ": " << bad << " of "
                << bytes / es << " elements wrong; first at [" << first << "]: expected "
                << hex(want + first * es) << ", got " << hex(got + first * es);
}

}  // namespace nexar::coll_test
