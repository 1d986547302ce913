// Tests of the reduce module: scalar 16-bit conversions (exhaustive where feasible) and the
// SIMD reduction kernels against an independent scalar reference, on every Highway target
// this CPU supports, for every dtype x op, odd sizes and unaligned pointers.
#include <gtest/gtest.h>

#include <hwy/targets.h>

#include <nexar/dtype.hpp>
#include <nexar/error.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "reduce/reduce.hpp"

namespace {

using nexar::DataType;
using nexar::ReduceOp;

constexpr std::array<ReduceOp, 5> kOps = {ReduceOp::sum, ReduceOp::prod, ReduceOp::min,
                                          ReduceOp::max, ReduceOp::avg};
constexpr std::array<DataType, 10> kTypes = {DataType::f32, DataType::f64, DataType::f16,
                                             DataType::bf16, DataType::i8,  DataType::u8,
                                             DataType::i32, DataType::u32, DataType::i64,
                                             DataType::u64};
constexpr std::array<std::size_t, 12> kSizes = {0, 1, 2, 3, 7, 15, 16, 17, 31, 33, 1000, 4099};

std::uint32_t fbits(float f) { return std::bit_cast<std::uint32_t>(f); }
float bitsf(std::uint32_t u) { return std::bit_cast<float>(u); }

// ---- independent reference for the 16-bit formats (double arithmetic) -------------------

// Value of a finite binary16 pattern, from the definition of the format.
double half_value(std::uint16_t h) {
  const int e = (h >> 10) & 0x1F;
  const int m = h & 0x3FF;
  const double v = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
  return (h & 0x8000) ? -v : v;
}

// Value of a finite bfloat16 pattern, from the definition of the format.
double bf16_value(std::uint16_t b) {
  const int e = (b >> 7) & 0xFF;
  const int m = b & 0x7F;
  const double v = e == 0 ? std::ldexp(m, -133) : std::ldexp(128 + m, e - 134);
  return (b & 0x8000) ? -v : v;
}

const std::vector<double>& half_table() {  // the 0x7C00 finite non-negative halves, ascending
  static const std::vector<double> table = [] {
    std::vector<double> t(0x7C00);
    for (std::uint32_t k = 0; k < 0x7C00; ++k) t[k] = half_value(static_cast<std::uint16_t>(k));
    return t;
  }();
  return table;
}

// Nearest of two candidates lo < x < hi (indices klo, klo+1), ties to the even index.
std::uint32_t nearest(double x, double lo, double hi, std::uint32_t klo) {
  const double dlo = x - lo;  // exact: all values have few significant bits
  const double dhi = hi - x;
  if (dlo < dhi) return klo;
  if (dhi < dlo) return klo + 1;
  return (klo & 1) ? klo + 1 : klo;
}

std::uint16_t ref_to_half(float x) {
  const std::uint32_t u = fbits(x);
  const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000);
  if (std::isnan(x)) return static_cast<std::uint16_t>(sign | 0x7E00 | ((u >> 13) & 0x3FF));
  const double ax = std::fabs(static_cast<double>(x));
  if (ax >= 65520.0) return static_cast<std::uint16_t>(sign | 0x7C00);
  const auto& t = half_table();
  const auto it = std::upper_bound(t.begin(), t.end(), ax);  // ax < 65520 < end
  const std::uint32_t klo = static_cast<std::uint32_t>(it - t.begin()) - 1;
  const double hi = klo + 1 == 0x7C00 ? 65536.0 : t[klo + 1];
  const std::uint32_t k = t[klo] == ax ? klo : nearest(ax, t[klo], hi, klo);
  return static_cast<std::uint16_t>(sign | k);
}

std::uint16_t ref_to_bf16(float x) {
  const std::uint32_t u = fbits(x);
  const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000);
  if (std::isnan(x)) return static_cast<std::uint16_t>((u >> 16) | 0x0040);
  if (std::isinf(x)) return static_cast<std::uint16_t>(sign | 0x7F80);
  const double ax = std::fabs(static_cast<double>(x));
  // The largest bfloat16 <= |x| is |x| with the low 16 bits cleared.
  const std::uint32_t klo = (u & 0x7FFFFFFF) >> 16;
  const double lo = bf16_value(static_cast<std::uint16_t>(klo));
  if (lo == ax) return static_cast<std::uint16_t>(sign | klo);
  const double hi = klo + 1 == 0x7F80 ? std::ldexp(1.0, 128) : bf16_value(static_cast<std::uint16_t>(klo + 1));
  return static_cast<std::uint16_t>(sign | nearest(ax, lo, hi, klo));
}

bool half_is_nan(std::uint16_t h) { return (h & 0x7FFF) > 0x7C00; }
bool bf16_is_nan(std::uint16_t b) { return (b & 0x7FFF) > 0x7F80; }

// ---- conversions ----------------------------------------------------------------------

TEST(Conversions, HalfToFloatExhaustive) {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const auto hb = static_cast<std::uint16_t>(h);
    const std::uint32_t got = fbits(nexar::from_half(nexar::half{hb}));
    std::uint32_t want;
    if ((h & 0x7C00) == 0x7C00) {  // inf / NaN: widened bit for bit
      want = ((h & 0x8000u) << 16) | 0x7F800000u | ((h & 0x3FFu) << 13);
    } else {
      want = fbits(static_cast<float>(half_value(hb)));
    }
    ASSERT_EQ(got, want) << "half 0x" << std::hex << h;
    // Round trip: exact, except that a signalling NaN comes back quiet.
    const std::uint16_t back = nexar::to_half(nexar::from_half(nexar::half{hb})).bits;
    const std::uint16_t expect = half_is_nan(hb) ? static_cast<std::uint16_t>(hb | 0x0200) : hb;
    ASSERT_EQ(back, expect) << "half 0x" << std::hex << h;
  }
}

TEST(Conversions, Bf16ToFloatExhaustive) {
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const auto bb = static_cast<std::uint16_t>(b);
    const std::uint32_t got = fbits(nexar::from_bfloat16(nexar::bfloat16{bb}));
    ASSERT_EQ(got, b << 16) << "bf16 0x" << std::hex << b;
    if (!bf16_is_nan(bb)) {
      ASSERT_EQ(fbits(static_cast<float>(bf16_value(bb))) & 0x7FFFFFFF, got & 0x7FFFFFFF)
          << "bf16 0x" << std::hex << b;
    }
    const std::uint16_t back = nexar::to_bfloat16(nexar::from_bfloat16(nexar::bfloat16{bb})).bits;
    const std::uint16_t expect = bf16_is_nan(bb) ? static_cast<std::uint16_t>(bb | 0x0040) : bb;
    ASSERT_EQ(back, expect) << "bf16 0x" << std::hex << b;
  }
}

void check_half(float x) {
  ASSERT_EQ(nexar::to_half(x).bits, ref_to_half(x)) << "float 0x" << std::hex << fbits(x);
}
void check_bf16(float x) {
  ASSERT_EQ(nexar::to_bfloat16(x).bits, ref_to_bf16(x)) << "float 0x" << std::hex << fbits(x);
}

// Every finite half, every midpoint between neighbours (exact ties) and the floats right
// next to them, both signs; plus the documented landmarks.
TEST(Conversions, FloatToHalfBoundaries) {
  EXPECT_EQ(nexar::to_half(65504.0f).bits, 0x7BFF);
  EXPECT_EQ(nexar::to_half(65519.996f).bits, 0x7BFF);
  EXPECT_EQ(nexar::to_half(65520.0f).bits, 0x7C00);
  EXPECT_EQ(nexar::to_half(-65520.0f).bits, 0xFC00);
  EXPECT_EQ(nexar::to_half(std::ldexp(1.0f, -24)).bits, 0x0001);
  EXPECT_EQ(nexar::to_half(std::ldexp(1.0f, -25)).bits, 0x0000);  // tie -> even (0)
  EXPECT_EQ(nexar::to_half(std::nextafter(std::ldexp(1.0f, -25), 1.0f)).bits, 0x0001);
  EXPECT_EQ(nexar::to_half(std::ldexp(3.0f, -25)).bits, 0x0002);  // 1.5 ulp -> 2
  EXPECT_EQ(nexar::to_half(-0.0f).bits, 0x8000);
  EXPECT_EQ(nexar::to_half(std::numeric_limits<float>::denorm_min()).bits, 0x0000);
  EXPECT_EQ(nexar::to_half(std::numeric_limits<float>::infinity()).bits, 0x7C00);
  EXPECT_EQ(nexar::to_half(bitsf(0x7F800001u)).bits, 0x7E00);  // sNaN, low payload -> quiet
  EXPECT_EQ(nexar::to_half(bitsf(0xFFC00000u)).bits, 0xFE00);
  const auto& t = half_table();
  for (std::uint32_t k = 0; k < 0x7C00; ++k) {
    const double v = t[k];
    const double next = k + 1 == 0x7C00 ? 65536.0 : t[k + 1];
    const float mid = static_cast<float>((v + next) / 2);
    ASSERT_EQ(static_cast<double>(mid), (v + next) / 2);  // the tie is a float
    for (float x : {static_cast<float>(v), mid, std::nextafter(mid, 0.0f),
                    std::nextafter(mid, 1e30f), std::nextafter(static_cast<float>(v), 0.0f),
                    std::nextafter(static_cast<float>(v), 1e30f)}) {
      check_half(x);
      check_half(-x);
    }
  }
}

TEST(Conversions, FloatToBf16Boundaries) {
  EXPECT_EQ(nexar::to_bfloat16(1.0f).bits, 0x3F80);
  EXPECT_EQ(nexar::to_bfloat16(bitsf(0x3F808000u)).bits, 0x3F80);  // tie -> even
  EXPECT_EQ(nexar::to_bfloat16(bitsf(0x3F818000u)).bits, 0x3F82);  // tie -> even (up)
  EXPECT_EQ(nexar::to_bfloat16(bitsf(0x7F7F8000u)).bits, 0x7F80);  // overflow -> inf
  EXPECT_EQ(nexar::to_bfloat16(bitsf(0x7F7F7FFFu)).bits, 0x7F7F);
  EXPECT_EQ(nexar::to_bfloat16(bitsf(0x7F800001u)).bits, 0x7FC0);  // sNaN -> quiet NaN
  EXPECT_EQ(nexar::to_bfloat16(bitsf(0x00008000u)).bits, 0x0000);  // subnormal tie -> even
  EXPECT_EQ(nexar::to_bfloat16(bitsf(0x00018000u)).bits, 0x0002);
  for (std::uint32_t k = 0; k < 0x7F80; ++k) {
    for (std::uint32_t low : {0x0000u, 0x0001u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu}) {
      const float x = bitsf((k << 16) | low);
      check_bf16(x);
      check_bf16(-x);
    }
  }
}

float random_float(std::mt19937_64& rng, int i) {
  const std::uint64_t r = rng();
  if (i % 2 == 0) return bitsf(static_cast<std::uint32_t>(r));  // any pattern
  // Concentrated on the binary16 range and just around it (exponents 2^-31 .. 2^17).
  const std::uint32_t exp = 96 + static_cast<std::uint32_t>((r >> 32) % 48);
  return bitsf((static_cast<std::uint32_t>(r >> 63) << 31) | (exp << 23) |
               (static_cast<std::uint32_t>(r) & 0x7FFFFF));
}

TEST(Conversions, FloatToHalfRandom) {
  std::mt19937_64 rng(12345);
  for (int i = 0; i < 10'000'000; ++i) {
    const float x = random_float(rng, i);
    if (nexar::to_half(x).bits != ref_to_half(x)) {
      FAIL() << "float 0x" << std::hex << fbits(x) << " -> 0x" << nexar::to_half(x).bits
             << ", want 0x" << ref_to_half(x);
    }
  }
}

TEST(Conversions, FloatToBf16Random) {
  std::mt19937_64 rng(54321);
  for (int i = 0; i < 10'000'000; ++i) {
    const float x = bitsf(static_cast<std::uint32_t>(rng()));
    if (nexar::to_bfloat16(x).bits != ref_to_bf16(x)) {
      FAIL() << "float 0x" << std::hex << fbits(x) << " -> 0x" << nexar::to_bfloat16(x).bits
             << ", want 0x" << ref_to_bf16(x);
    }
  }
}

// ---- scalar reference of the reductions ------------------------------------------------

template <class F>
F quiet(F x) {
  using U = std::conditional_t<sizeof(F) == 4, std::uint32_t, std::uint64_t>;
  const U q = U{1} << (sizeof(F) == 4 ? 22 : 51);
  return std::bit_cast<F>(static_cast<U>(std::bit_cast<U>(x) | q));
}

template <class F>
F ref_float_op(ReduceOp op, F a, F b) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      return a + b;
    case ReduceOp::prod:
      return a * b;
    case ReduceOp::min:
    case ReduceOp::max: {
      if (std::isnan(a)) return quiet(a);
      if (std::isnan(b)) return quiet(b);
      if (a == b) {
        if (a != 0) return a;
        const bool neg = op == ReduceOp::min ? (std::signbit(a) || std::signbit(b))
                                             : (std::signbit(a) && std::signbit(b));
        return neg ? F(-0.0) : F(0.0);
      }
      if (op == ReduceOp::min) return a < b ? a : b;
      return a > b ? a : b;
    }
  }
  return 0;
}

// Per element type: storage, random generator, reference op, reference avg division.
template <class T>
struct IntTraits {
  using S = T;
  static S gen(std::mt19937_64& rng) {
    const std::uint64_t r = rng();
    switch (r % 8) {
      case 0: return 0;
      case 1: return std::numeric_limits<T>::min();
      case 2: return std::numeric_limits<T>::max();
      case 3: return static_cast<T>(static_cast<T>(r >> 8) % 5);  // small, also negative
      case 4: return static_cast<T>(-static_cast<std::int64_t>((r >> 8) % 4));
      default: return static_cast<T>(r >> 8);
    }
  }
  static S op(ReduceOp o, S a, S b) {
    using U = std::make_unsigned_t<T>;
    using W = std::conditional_t<(sizeof(U) < sizeof(unsigned)), unsigned, U>;
    switch (o) {
      case ReduceOp::sum: return static_cast<T>(static_cast<U>(static_cast<W>(static_cast<U>(a)) + static_cast<W>(static_cast<U>(b))));
      case ReduceOp::prod: return static_cast<T>(static_cast<U>(static_cast<W>(static_cast<U>(a)) * static_cast<W>(static_cast<U>(b))));
      case ReduceOp::min: return std::min(a, b);
      case ReduceOp::max: return std::max(a, b);
      case ReduceOp::avg: break;
    }
    return 0;
  }
  static S div(S x, int) { return x; }
  static bool is_nan(S) { return false; }
  static std::uint64_t bits(S x) { return static_cast<std::uint64_t>(x); }
};

template <class F>
F gen_float(std::mt19937_64& rng) {
  using U = std::conditional_t<sizeof(F) == 4, std::uint32_t, std::uint64_t>;
  constexpr int kMant = sizeof(F) == 4 ? 23 : 52;
  const U exp_mask = static_cast<U>(sizeof(F) == 4 ? 0x7F800000ull : 0x7FF0000000000000ull);
  const U mant_mask = (U{1} << kMant) - 1;
  const U sign = static_cast<U>(rng() & 1) << (sizeof(F) * 8 - 1);
  const U r = static_cast<U>(rng());
  const std::uint64_t c = rng() % 16;
  switch (c) {
    case 0: return std::bit_cast<F>(sign);                                 // +-0
    case 1: return std::bit_cast<F>(sign | exp_mask | (U{1} << (kMant - 1)) | (r & mant_mask));  // qNaN
    case 2: return std::bit_cast<F>(sign | exp_mask | ((r & (mant_mask >> 1)) | 1));  // sNaN
    case 3: return std::bit_cast<F>(sign | exp_mask);                      // +-inf
    case 4: return std::bit_cast<F>(sign | ((r & mant_mask) | 1));         // subnormal
    case 5: return std::bit_cast<F>(sign | (exp_mask - (U{1} << kMant)) | (r & mant_mask));  // huge
    case 6: return std::bit_cast<F>(r);                                    // any bits
    case 7: return std::bit_cast<F>(sign | (U{1} << kMant) | (r & mant_mask));  // tiny normal
    default: {
      std::uniform_real_distribution<double> dist(-1000.0, 1000.0);
      return static_cast<F>(dist(rng));
    }
  }
}

template <class F>
struct FloatTraits {
  using S = F;
  static S gen(std::mt19937_64& rng) { return gen_float<F>(rng); }
  static S op(ReduceOp o, S a, S b) { return ref_float_op(o, a, b); }
  static S div(S x, int ranks) { return x / static_cast<F>(ranks); }
  static bool is_nan(S x) { return std::isnan(x); }
  static std::uint64_t bits(S x) {
    if constexpr (sizeof(F) == 4) return fbits(x);
    else return std::bit_cast<std::uint64_t>(x);
  }
};

std::uint16_t gen16(std::mt19937_64& rng, std::uint16_t exp_mask, int mant_bits) {
  const auto r = static_cast<std::uint16_t>(rng());
  const std::uint16_t sign = static_cast<std::uint16_t>(rng() & 1) << 15;
  const std::uint16_t mant = static_cast<std::uint16_t>((1u << mant_bits) - 1);
  switch (rng() % 12) {
    case 0: return sign;
    case 1: return static_cast<std::uint16_t>(sign | exp_mask | (r & mant) | (1u << (mant_bits - 1)));
    case 2: return static_cast<std::uint16_t>(sign | exp_mask | ((r & (mant >> 1)) | 1));
    case 3: return static_cast<std::uint16_t>(sign | exp_mask);
    case 4: return static_cast<std::uint16_t>(sign | (r & mant));  // subnormal
    case 5: return static_cast<std::uint16_t>(sign | (exp_mask - (1u << mant_bits)) | (r & mant));
    default: return r;
  }
}

struct HalfTraits {
  using S = std::uint16_t;
  static float f(S x) { return nexar::from_half(nexar::half{x}); }
  static S h(float x) { return nexar::to_half(x).bits; }
  static S gen(std::mt19937_64& rng) {
    if (rng() % 4 == 0) return h(static_cast<float>(std::uniform_real_distribution<double>(-100, 100)(rng)));
    return gen16(rng, 0x7C00, 10);
  }
  static S op(ReduceOp o, S a, S b) { return h(ref_float_op(o, f(a), f(b))); }
  static S div(S x, int ranks) { return h(f(x) / static_cast<float>(ranks)); }
  static bool is_nan(S x) { return half_is_nan(x); }
  static std::uint64_t bits(S x) { return x; }
};

struct Bf16Traits {
  using S = std::uint16_t;
  static float f(S x) { return nexar::from_bfloat16(nexar::bfloat16{x}); }
  static S h(float x) { return nexar::to_bfloat16(x).bits; }
  static S gen(std::mt19937_64& rng) {
    if (rng() % 4 == 0) return h(static_cast<float>(std::uniform_real_distribution<double>(-100, 100)(rng)));
    return gen16(rng, 0x7F80, 7);
  }
  static S op(ReduceOp o, S a, S b) { return h(ref_float_op(o, f(a), f(b))); }
  static S div(S x, int ranks) { return h(f(x) / static_cast<float>(ranks)); }
  static bool is_nan(S x) { return bf16_is_nan(x); }
  static std::uint64_t bits(S x) { return x; }
};

// ---- kernel checks -----------------------------------------------------------------------

template <class Tr>
class Checker {
 public:
  using S = typename Tr::S;

  Checker(DataType t, std::mt19937_64& rng) : t_(t), rng_(rng) {}

  void run(ReduceOp op) {
    for (std::size_t n : kSizes) {
      // Offsets (in elements) of dst, a, b: aligned, all unaligned, mixed.
      for (const auto& off : {std::array<std::size_t, 3>{0, 0, 0}, {1, 1, 1}, {0, 1, 0}}) {
        run_case(op, n, off[0], off[1], off[2]);
        if (failures_ > 10) return;
      }
    }
  }

 private:
  std::vector<S> random(std::size_t n) {
    std::vector<S> v(n);
    for (auto& x : v) x = Tr::gen(rng_);
    return v;
  }

  bool same(ReduceOp op, S a, S b, S got, S want) const {
    if (Tr::bits(got) == Tr::bits(want)) return true;
    // IEEE leaves open which NaN payload a sum/product of two NaNs carries.
    const bool arith = op == ReduceOp::sum || op == ReduceOp::prod || op == ReduceOp::avg;
    return arith && Tr::is_nan(a) && Tr::is_nan(b) && Tr::is_nan(got);
  }

  void expect(const char* what, ReduceOp op, std::size_t n, std::size_t i, S a, S b, S got,
              S want) {
    if (same(op, a, b, got, want)) return;
    ++failures_;
    ADD_FAILURE() << what << " " << nexar::to_string(t_) << " " << nexar::to_string(op)
                  << " target " << nexar::reduce::simd_target() << " n=" << n << " i=" << i
                  << std::hex << ": a=0x" << Tr::bits(a) << " b=0x" << Tr::bits(b)
                  << " got 0x" << Tr::bits(got) << " want 0x" << Tr::bits(want);
  }

  void run_case(ReduceOp op, std::size_t n, std::size_t od, std::size_t oa, std::size_t ob) {
    std::vector<S> a = random(n + 1);
    std::vector<S> b = random(n + 1);
    for (std::size_t i = 0; i < b.size(); ++i) {  // ties exercise min/max's equal branch
      if (rng_() % 8 == 0) b[i] = a[i];
    }
    S* pa = a.data() + oa;
    S* pb = b.data() + ob;
    std::vector<S> want(n);
    for (std::size_t i = 0; i < n; ++i) want[i] = Tr::op(op, pa[i], pb[i]);

    // combine into a separate buffer; elements outside [od, od + n) must stay untouched.
    const std::vector<S> d_before = random(n + 2);
    std::vector<S> d = d_before;
    nexar::reduce::combine(t_, op, d.data() + od, pa, pb, 0);  // n = 0 touches nothing
    EXPECT_EQ(std::memcmp(d.data(), d_before.data(), d.size() * sizeof(S)), 0);
    nexar::reduce::combine(t_, op, d.data() + od, pa, pb, n);
    for (std::size_t i = 0; i < n; ++i) expect("combine", op, n, i, pa[i], pb[i], d[od + i], want[i]);
    for (std::size_t i = 0; i < d.size(); ++i) {
      if (i >= od && i < od + n) continue;
      EXPECT_EQ(Tr::bits(d[i]), Tr::bits(d_before[i])) << "combine wrote outside dst, i=" << i;
    }

    // combine with dst aliasing a, then aliasing b.
    std::vector<S> a2 = a;
    nexar::reduce::combine(t_, op, a2.data() + oa, a2.data() + oa, pb, n);
    for (std::size_t i = 0; i < n; ++i) expect("combine(dst=a)", op, n, i, pa[i], pb[i], a2[oa + i], want[i]);
    std::vector<S> b2 = b;
    nexar::reduce::combine(t_, op, b2.data() + ob, pa, b2.data() + ob, n);
    for (std::size_t i = 0; i < n; ++i) expect("combine(dst=b)", op, n, i, pa[i], pb[i], b2[ob + i], want[i]);

    // accumulate: dst = op(dst, src) with dst = a.
    std::vector<S> acc = a;
    nexar::reduce::accumulate(t_, op, acc.data() + oa, pb, n);
    for (std::size_t i = 0; i < n; ++i) expect("accumulate", op, n, i, pa[i], pb[i], acc[oa + i], want[i]);
    EXPECT_EQ(Tr::bits(acc[oa == 0 ? n : 0]), Tr::bits(a[oa == 0 ? n : 0]));

    // finish: divides for avg, leaves the data alone otherwise.
    static constexpr int kRanks[] = {1, 2, 3, 7, 1000};
    const int ranks = kRanks[n % 5];
    std::vector<S> fin = a;
    nexar::reduce::finish(t_, op, fin.data() + oa, n, ranks);
    // Two loops, not `avg ? div(x) : x`: clang -O2 may fold that select into x / (avg ? r : 1),
    // and the division by 1 quiets a signalling NaN the kernel rightly left untouched.
    if (op == ReduceOp::avg) {
      for (std::size_t i = 0; i < n; ++i)
        expect("finish", op, n, i, pa[i], pa[i], fin[oa + i], Tr::div(pa[i], ranks));
    } else {
      for (std::size_t i = 0; i < n; ++i) expect("finish", op, n, i, pa[i], pa[i], fin[oa + i], pa[i]);
    }
  }

  DataType t_;
  std::mt19937_64& rng_;
  int failures_ = 0;
};

template <class Tr>
void check_type(DataType t, std::mt19937_64& rng) {
  Checker<Tr> c(t, rng);
  for (ReduceOp op : kOps) {
    if (nexar::reduce::supports(t, op)) c.run(op);
  }
}

void check_all_types(std::mt19937_64& rng) {
  check_type<FloatTraits<float>>(DataType::f32, rng);
  check_type<FloatTraits<double>>(DataType::f64, rng);
  check_type<HalfTraits>(DataType::f16, rng);
  check_type<Bf16Traits>(DataType::bf16, rng);
  check_type<IntTraits<std::int8_t>>(DataType::i8, rng);
  check_type<IntTraits<std::uint8_t>>(DataType::u8, rng);
  check_type<IntTraits<std::int32_t>>(DataType::i32, rng);
  check_type<IntTraits<std::uint32_t>>(DataType::u32, rng);
  check_type<IntTraits<std::int64_t>>(DataType::i64, rng);
  check_type<IntTraits<std::uint64_t>>(DataType::u64, rng);
}

TEST(Reduce, MatchesScalarReferenceOnEveryTarget) {
  std::mt19937_64 rng(2024);
  const std::vector<std::int64_t> targets = hwy::SupportedAndGeneratedTargets();
  ASSERT_FALSE(targets.empty());
  std::string names;
  for (std::int64_t target : targets) {
    hwy::SetSupportedTargetsForTest(target);
    const std::string name = nexar::reduce::simd_target();
    EXPECT_EQ(name, hwy::TargetName(target));
    names += name + " ";
    SCOPED_TRACE("target " + name);
    check_all_types(rng);
  }
  hwy::SetSupportedTargetsForTest(0);
  std::printf("checked targets: %s(default: %s)\n", names.c_str(), nexar::reduce::simd_target());
}

TEST(Reduce, SimdTargetNamed) {
  const std::string name = nexar::reduce::simd_target();
  EXPECT_FALSE(name.empty());
}

TEST(Reduce, Supports) {
  for (DataType t : kTypes) {
    for (ReduceOp op : kOps) {
      const bool want = op != ReduceOp::avg || nexar::is_floating(t);
      EXPECT_EQ(nexar::reduce::supports(t, op), want) << nexar::to_string(t) << " " << nexar::to_string(op);
    }
  }
  EXPECT_FALSE(nexar::reduce::supports(static_cast<DataType>(77), ReduceOp::sum));
  EXPECT_FALSE(nexar::reduce::supports(DataType::f32, static_cast<ReduceOp>(77)));
}

void expect_invalid(const std::function<void()>& f, const std::vector<std::string>& words) {
  try {
    f();
    ADD_FAILURE() << "no exception";
  } catch (const nexar::Error& e) {
    EXPECT_EQ(e.code(), nexar::Errc::invalid_argument);
    for (const auto& w : words) EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << e.what();
  }
}

TEST(Reduce, UnsupportedThrows) {
  std::int64_t x[4] = {1, 2, 3, 4};
  for (DataType t : {DataType::i8, DataType::u8, DataType::i32, DataType::u32, DataType::i64,
                     DataType::u64}) {
    const std::vector<std::string> words = {"avg", nexar::to_string(t)};
    expect_invalid([&] { nexar::reduce::accumulate(t, ReduceOp::avg, x, x, 1); }, words);
    expect_invalid([&] { nexar::reduce::combine(t, ReduceOp::avg, x, x, x, 1); }, words);
    expect_invalid([&] { nexar::reduce::finish(t, ReduceOp::avg, x, 1, 2); }, words);
    expect_invalid([&] { nexar::reduce::accumulate(t, ReduceOp::avg, x, x, 0); }, words);
  }
  EXPECT_EQ(x[0], 1);
  float f[2] = {1, 2};
  expect_invalid([&] { nexar::reduce::finish(DataType::f32, ReduceOp::avg, f, 2, 0); }, {"ranks"});
  expect_invalid([&] { nexar::reduce::accumulate(DataType::f32, ReduceOp::sum, nullptr, f, 2); }, {"null"});
  expect_invalid([&] { nexar::reduce::combine(DataType::f32, ReduceOp::sum, f, f, nullptr, 2); }, {"null"});
  // n == 0 with null pointers is fine; finish of a non-avg op is a no-op whatever ranks is.
  nexar::reduce::combine(DataType::f32, ReduceOp::sum, nullptr, nullptr, nullptr, 0);
  nexar::reduce::finish(DataType::f32, ReduceOp::sum, f, 2, 0);
  EXPECT_EQ(f[1], 2.0f);
}

TEST(Reduce, Names) {
  EXPECT_STREQ(nexar::to_string(DataType::bf16), "bf16");
  EXPECT_STREQ(nexar::to_string(DataType::u64), "u64");
  EXPECT_STREQ(nexar::to_string(ReduceOp::avg), "avg");
  EXPECT_STREQ(nexar::to_string(ReduceOp::prod), "prod");
}

// A few hand-checked values of the documented policy.
TEST(Reduce, Policy) {
  const float nan1 = bitsf(0x7F800001u);  // sNaN
  const float nan2 = bitsf(0xFFC00002u);
  float a[4] = {-0.0f, 0.0f, nan1, 1.0f};
  float b[4] = {0.0f, -0.0f, nan2, nan2};
  float out[4];
  nexar::reduce::combine(DataType::f32, ReduceOp::min, out, a, b, 4);
  EXPECT_EQ(fbits(out[0]), 0x80000000u);
  EXPECT_EQ(fbits(out[1]), 0x80000000u);
  EXPECT_EQ(fbits(out[2]), 0x7FC00001u);  // the first NaN, quieted
  EXPECT_EQ(fbits(out[3]), 0xFFC00002u);
  nexar::reduce::combine(DataType::f32, ReduceOp::max, out, a, b, 4);
  EXPECT_EQ(fbits(out[0]), 0x00000000u);
  EXPECT_EQ(fbits(out[1]), 0x00000000u);
  EXPECT_EQ(fbits(out[2]), 0x7FC00001u);
  std::int32_t i[2] = {std::numeric_limits<std::int32_t>::max(), -3};
  const std::int32_t j[2] = {1, std::numeric_limits<std::int32_t>::min()};
  nexar::reduce::accumulate(DataType::i32, ReduceOp::sum, i, j, 2);
  EXPECT_EQ(i[0], std::numeric_limits<std::int32_t>::min());
  EXPECT_EQ(i[1], std::numeric_limits<std::int32_t>::max() - 2);
  std::uint16_t h[3] = {nexar::to_half(60000.0f).bits, nexar::to_half(1.0f).bits, 0x7C01};
  const std::uint16_t g[3] = {nexar::to_half(10000.0f).bits, nexar::to_half(2.0f).bits, 0};
  nexar::reduce::accumulate(DataType::f16, ReduceOp::sum, h, g, 3);
  EXPECT_EQ(h[0], 0x7C00);  // overflow -> inf
  EXPECT_EQ(h[1], nexar::to_half(3.0f).bits);
  EXPECT_EQ(h[2], 0x7E01);  // NaN stays NaN, quiet
  nexar::reduce::finish(DataType::f16, ReduceOp::avg, h + 1, 1, 3);
  EXPECT_EQ(h[1], nexar::to_half(1.0f).bits);
}

}  // namespace
