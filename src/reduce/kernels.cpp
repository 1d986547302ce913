// nexar — SIMD reduction kernels, compiled once per Highway target and dispatched at run
// time. The semantics are documented in reduce/reduce.hpp; this file implements them.
//
// Tails (the last n % lanes elements) go through the same vector code on a zero-padded
// stack copy, so every element of every n is computed by the same instructions: there is
// no separate scalar tail whose rounding or NaN handling could drift from the vector loop.
//
// Highway 1.0.3 notes (why some conversions are hand-written):
//  * DemoteTo(bf16 <- f32) truncates (no rounding; a NaN whose payload sits in the low
//    16 bits becomes inf), so the bf16 rounding is done here in integer lanes.
//  * DemoteTo(f16 <- f32) without F16C (SSSE3/SSE4/EMU128/SCALAR targets) truncates the
//    mantissa and mishandles inf/NaN, so it is only used where it maps to vcvtps2ph
//    (AVX2 and up, round-to-nearest-even immediate); elsewhere f16 is converted here.
//  * Float Min/Max follow the x86 minps/maxps rules (second operand on NaN and on ±0
//    ties), so min/max build the documented NaN / signed-zero policy from compares.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "reduce/kernels.hpp"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "reduce/kernels.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace nexar::reduce::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2 && !defined(HWY_DISABLE_F16C)
#define NEXAR_REDUCE_HW_F16 1
#else
#define NEXAR_REDUCE_HW_F16 0
#endif

// ---- element-wise operators -------------------------------------------------------------

struct AddOp {
  template <class D, class V>
  HWY_INLINE V operator()(D /*d*/, V a, V b) const {
    return hn::Add(a, b);
  }
};

struct MulOp {
  template <class D, class V>
  HWY_INLINE V operator()(D /*d*/, V a, V b) const {
    return hn::Mul(a, b);
  }
};

struct IntMinOp {
  template <class D, class V>
  HWY_INLINE V operator()(D /*d*/, V a, V b) const {
    return hn::Min(a, b);
  }
};

struct IntMaxOp {
  template <class D, class V>
  HWY_INLINE V operator()(D /*d*/, V a, V b) const {
    return hn::Max(a, b);
  }
};

// NaN in either operand -> the first NaN operand with its quiet bit set.
template <class D, class V>
HWY_INLINE V PropagateNaN(D d, V a, V b, V result) {
  using T = hn::TFromD<D>;
  const hn::RebindToUnsigned<D> du;
  using TU = hn::TFromD<decltype(du)>;
  constexpr TU kQuiet = TU{1} << (sizeof(T) == 4 ? 22 : 51);
  const auto a_nan = hn::IsNaN(a);
  const auto any_nan = hn::Or(a_nan, hn::IsNaN(b));
  const V nan = hn::Or(hn::IfThenElse(a_nan, a, b), hn::BitCast(d, hn::Set(du, kQuiet)));
  return hn::IfThenElse(any_nan, nan, result);
}

struct FloatMinOp {
  template <class D, class V>
  HWY_INLINE V operator()(D d, V a, V b) const {
    V r = hn::IfThenElse(a < b, a, b);
    r = hn::IfThenElse(a == b, hn::Or(a, b), r);  // equal: same bits, or -0 | +0 = -0
    return PropagateNaN(d, a, b, r);
  }
};

struct FloatMaxOp {
  template <class D, class V>
  HWY_INLINE V operator()(D d, V a, V b) const {
    V r = hn::IfThenElse(a > b, a, b);
    r = hn::IfThenElse(a == b, hn::And(a, b), r);  // equal: same bits, or -0 & +0 = +0
    return PropagateNaN(d, a, b, r);
  }
};

// ---- loops over same-typed lanes ---------------------------------------------------------

template <class D, class Op, typename T>
HWY_INLINE void BinaryLoop(D d, Op op, T* dst, const T* a, const T* b, std::size_t n) {
  const std::size_t N = hn::Lanes(d);
  std::size_t i = 0;
  if (n >= 2 * N) {
    for (; i <= n - 2 * N; i += 2 * N) {
      const auto a0 = hn::LoadU(d, a + i);
      const auto b0 = hn::LoadU(d, b + i);
      const auto a1 = hn::LoadU(d, a + i + N);
      const auto b1 = hn::LoadU(d, b + i + N);
      hn::StoreU(op(d, a0, b0), d, dst + i);
      hn::StoreU(op(d, a1, b1), d, dst + i + N);
    }
  }
  for (; i + N <= n; i += N) {
    hn::StoreU(op(d, hn::LoadU(d, a + i), hn::LoadU(d, b + i)), d, dst + i);
  }
  if (i < n) {
    const std::size_t rest = n - i;
    HWY_ALIGN T pa[HWY_MAX_BYTES / sizeof(T)] = {};
    HWY_ALIGN T pb[HWY_MAX_BYTES / sizeof(T)] = {};
    std::memcpy(pa, a + i, rest * sizeof(T));
    std::memcpy(pb, b + i, rest * sizeof(T));
    hn::StoreU(op(d, hn::LoadU(d, pa), hn::LoadU(d, pb)), d, pa);
    std::memcpy(dst + i, pa, rest * sizeof(T));
  }
}

template <class D, typename T = hn::TFromD<D>>
HWY_INLINE void DivideLoop(D d, T* data, std::size_t n, T divisor) {
  const std::size_t N = hn::Lanes(d);
  const auto v = hn::Set(d, divisor);
  std::size_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(hn::Div(hn::LoadU(d, data + i), v), d, data + i);
  if (i < n) {
    const std::size_t rest = n - i;
    HWY_ALIGN T p[HWY_MAX_BYTES / sizeof(T)] = {};
    std::memcpy(p, data + i, rest * sizeof(T));
    hn::StoreU(hn::Div(hn::LoadU(d, p), v), d, p);
    std::memcpy(data + i, p, rest * sizeof(T));
  }
}

// ---- 16-bit float <-> f32 ----------------------------------------------------------------

template <class DF>
using D16 = hn::Rebind<std::uint16_t, DF>;

struct Half {
  template <class DF>
  static HWY_INLINE hn::Vec<DF> Widen(DF df, hn::Vec<D16<DF>> h16) {
#if NEXAR_REDUCE_HW_F16
    const hn::Rebind<hwy::float16_t, DF> dh;
    return hn::PromoteTo(df, hn::BitCast(dh, h16));
#else
    const hn::RebindToUnsigned<DF> du;
    const hn::RebindToSigned<DF> di;
    const auto h = hn::PromoteTo(du, h16);
    const auto sign = hn::ShiftLeft<16>(hn::And(h, hn::Set(du, 0x8000u)));
    const auto a = hn::And(h, hn::Set(du, 0x7FFFu));
    const auto ai = hn::BitCast(di, a);  // < 2^15: signed compares are exact
    const auto normal = hn::Add(hn::ShiftLeft<13>(a), hn::Set(du, 0x38000000u));
    const auto special = hn::Or(hn::ShiftLeft<13>(a), hn::Set(du, 0x7F800000u));
    // Subnormal (and zero): m * 2^-24, exact in f32 (the product is a normal number).
    const auto sub = hn::BitCast(du, hn::Mul(hn::ConvertTo(df, ai), hn::Set(df, 0x1p-24f)));
    auto r = hn::IfThenElse(hn::RebindMask(du, ai < hn::Set(di, 0x0400)), sub, normal);
    r = hn::IfThenElse(hn::RebindMask(du, ai > hn::Set(di, 0x7BFF)), special, r);
    return hn::BitCast(df, hn::Or(r, sign));
#endif
  }

  template <class DF>
  static HWY_INLINE hn::Vec<D16<DF>> Narrow(DF df, hn::Vec<DF> v) {
    const D16<DF> d16;
#if NEXAR_REDUCE_HW_F16
    const hn::Rebind<hwy::float16_t, DF> dh;
    (void)df;
    return hn::BitCast(d16, hn::DemoteTo(dh, v));
#else
    const hn::RebindToUnsigned<DF> du;
    const hn::RebindToSigned<DF> di;
    const auto x = hn::BitCast(du, v);
    const auto sign = hn::And(hn::ShiftRight<16>(x), hn::Set(du, 0x8000u));
    const auto a = hn::And(x, hn::Set(du, 0x7FFFFFFFu));
    const auto ai = hn::BitCast(di, a);  // >= 0: signed compares are exact
    const auto nan = hn::Or(hn::And(hn::ShiftRight<13>(a), hn::Set(du, 0x7FFFu)),
                            hn::Set(du, 0x0200u));
    const auto bias = hn::Add(hn::Set(du, 0x0FFFu), hn::And(hn::ShiftRight<13>(a), hn::Set(du, 1u)));
    const auto normal = hn::ShiftRight<13>(hn::Sub(hn::Add(a, bias), hn::Set(du, 0x38000000u)));
    // |x| < 2^-14: 0.5 + |x| rounds (to nearest even) at 2^-24, the binary16 subnormal step.
    const auto sub = hn::Sub(hn::BitCast(du, hn::Add(hn::BitCast(df, a), hn::Set(df, 0.5f))),
                             hn::Set(du, 0x3F000000u));
    auto r = hn::IfThenElse(hn::RebindMask(du, ai < hn::Set(di, 0x38800000)), sub, normal);
    r = hn::IfThenElse(hn::RebindMask(du, ai > hn::Set(di, 0x477FEFFF)), hn::Set(du, 0x7C00u), r);
    r = hn::IfThenElse(hn::RebindMask(du, ai > hn::Set(di, 0x7F800000)), nan, r);
    return hn::TruncateTo(d16, hn::Or(r, sign));  // < 2^16: plain truncation
#endif
  }
};

struct BF16 {
  template <class DF>
  static HWY_INLINE hn::Vec<DF> Widen(DF df, hn::Vec<D16<DF>> h16) {
    const hn::RebindToUnsigned<DF> du;
    return hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du, h16)));
  }

  template <class DF>
  static HWY_INLINE hn::Vec<D16<DF>> Narrow(DF df, hn::Vec<DF> v) {
    (void)df;
    const D16<DF> d16;
    const hn::RebindToUnsigned<DF> du;
    const auto x = hn::BitCast(du, v);
    const auto hi = hn::ShiftRight<16>(x);
    const auto bias = hn::Add(hn::Set(du, 0x7FFFu), hn::And(hi, hn::Set(du, 1u)));
    auto r = hn::ShiftRight<16>(hn::Add(x, bias));  // a carry rounds up to inf
    r = hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(v)), hn::Or(hi, hn::Set(du, 0x0040u)), r);
    return hn::TruncateTo(d16, r);  // < 2^16: no saturation needed
  }
};

template <class Fmt, class DF, class Op>
HWY_INLINE void Step16(DF df, Op op, std::uint16_t* dst, const std::uint16_t* a,
                       const std::uint16_t* b) {
  const D16<DF> d16;
  const auto fa = Fmt::Widen(df, hn::LoadU(d16, a));
  const auto fb = Fmt::Widen(df, hn::LoadU(d16, b));
  hn::StoreU(Fmt::Narrow(df, op(df, fa, fb)), d16, dst);
}

template <class Fmt, class Op>
HWY_INLINE void Binary16(Op op, std::uint16_t* dst, const std::uint16_t* a,
                         const std::uint16_t* b, std::size_t n) {
  const hn::ScalableTag<float> df;
  const std::size_t N = hn::Lanes(df);
  std::size_t i = 0;
  for (; i + N <= n; i += N) Step16<Fmt>(df, op, dst + i, a + i, b + i);
  if (i < n) {
    const std::size_t rest = n - i;
    HWY_ALIGN std::uint16_t pa[HWY_MAX_BYTES / sizeof(float)] = {};
    HWY_ALIGN std::uint16_t pb[HWY_MAX_BYTES / sizeof(float)] = {};
    std::memcpy(pa, a + i, rest * sizeof(std::uint16_t));
    std::memcpy(pb, b + i, rest * sizeof(std::uint16_t));
    Step16<Fmt>(df, op, pa, pa, pb);
    std::memcpy(dst + i, pa, rest * sizeof(std::uint16_t));
  }
}

template <class Fmt>
HWY_INLINE void Divide16(std::uint16_t* data, std::size_t n, float divisor) {
  const hn::ScalableTag<float> df;
  const D16<decltype(df)> d16;
  const std::size_t N = hn::Lanes(df);
  const auto v = hn::Set(df, divisor);
  std::size_t i = 0;
  for (; i + N <= n; i += N) {
    const auto x = Fmt::Widen(df, hn::LoadU(d16, data + i));
    hn::StoreU(Fmt::Narrow(df, hn::Div(x, v)), d16, data + i);
  }
  if (i < n) {
    const std::size_t rest = n - i;
    HWY_ALIGN std::uint16_t p[HWY_MAX_BYTES / sizeof(float)] = {};
    std::memcpy(p, data + i, rest * sizeof(std::uint16_t));
    const auto x = Fmt::Widen(df, hn::LoadU(d16, p));
    hn::StoreU(Fmt::Narrow(df, hn::Div(x, v)), d16, p);
    std::memcpy(data + i, p, rest * sizeof(std::uint16_t));
  }
}

// ---- per-type dispatch -------------------------------------------------------------------

template <typename T>
HWY_INLINE void CombineFloat(ReduceOp op, void* dst, const void* a, const void* b,
                             std::size_t n) {
  const hn::ScalableTag<T> d;
  T* out = static_cast<T*>(dst);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg: return BinaryLoop(d, AddOp(), out, x, y, n);
    case ReduceOp::prod: return BinaryLoop(d, MulOp(), out, x, y, n);
    case ReduceOp::min: return BinaryLoop(d, FloatMinOp(), out, x, y, n);
    case ReduceOp::max: return BinaryLoop(d, FloatMaxOp(), out, x, y, n);
  }
}

template <class Fmt>
HWY_INLINE void Combine16(ReduceOp op, void* dst, const void* a, const void* b, std::size_t n) {
  auto* out = static_cast<std::uint16_t*>(dst);
  const auto* x = static_cast<const std::uint16_t*>(a);
  const auto* y = static_cast<const std::uint16_t*>(b);
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg: return Binary16<Fmt>(AddOp(), out, x, y, n);
    case ReduceOp::prod: return Binary16<Fmt>(MulOp(), out, x, y, n);
    case ReduceOp::min: return Binary16<Fmt>(FloatMinOp(), out, x, y, n);
    case ReduceOp::max: return Binary16<Fmt>(FloatMaxOp(), out, x, y, n);
  }
}

template <typename TU>
HWY_INLINE void ProdScalar(TU* dst, const TU* a, const TU* b, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    // Promote 8-bit operands to unsigned (int would do, but this states the intent).
    using Wide = std::conditional_t<(sizeof(TU) < sizeof(unsigned)), unsigned, TU>;
    dst[i] = static_cast<TU>(static_cast<Wide>(a[i]) * static_cast<Wide>(b[i]));
  }
}

template <typename T>
HWY_INLINE void CombineInt(ReduceOp op, void* dst, const void* a, const void* b,
                           std::size_t n) {
  // sum and prod run on the unsigned lane type: wrap-around without signed overflow.
  using TU = std::make_unsigned_t<T>;
  const hn::ScalableTag<TU> du;
  const hn::ScalableTag<T> d;
  switch (op) {
    case ReduceOp::sum:
      return BinaryLoop(du, AddOp(), static_cast<TU*>(dst), static_cast<const TU*>(a),
                        static_cast<const TU*>(b), n);
    case ReduceOp::prod:
      if constexpr (sizeof(T) == 4) {  // Highway 1.0.3 multiplies 16/32-bit lanes only
        return BinaryLoop(du, MulOp(), static_cast<TU*>(dst), static_cast<const TU*>(a),
                          static_cast<const TU*>(b), n);
      } else {
        return ProdScalar(static_cast<TU*>(dst), static_cast<const TU*>(a),
                          static_cast<const TU*>(b), n);
      }
    case ReduceOp::min:
      return BinaryLoop(d, IntMinOp(), static_cast<T*>(dst), static_cast<const T*>(a),
                        static_cast<const T*>(b), n);
    case ReduceOp::max:
      return BinaryLoop(d, IntMaxOp(), static_cast<T*>(dst), static_cast<const T*>(a),
                        static_cast<const T*>(b), n);
    case ReduceOp::avg:
      return;  // rejected by reduce.cpp
  }
}

void CombineKernel(DataType t, ReduceOp op, void* dst, const void* a, const void* b,
                   std::size_t n) {
  switch (t) {
    case DataType::f32: return CombineFloat<float>(op, dst, a, b, n);
    case DataType::f64: return CombineFloat<double>(op, dst, a, b, n);
    case DataType::f16: return Combine16<Half>(op, dst, a, b, n);
    case DataType::bf16: return Combine16<BF16>(op, dst, a, b, n);
    case DataType::i8: return CombineInt<std::int8_t>(op, dst, a, b, n);
    case DataType::u8: return CombineInt<std::uint8_t>(op, dst, a, b, n);
    case DataType::i32: return CombineInt<std::int32_t>(op, dst, a, b, n);
    case DataType::u32: return CombineInt<std::uint32_t>(op, dst, a, b, n);
    case DataType::i64: return CombineInt<std::int64_t>(op, dst, a, b, n);
    case DataType::u64: return CombineInt<std::uint64_t>(op, dst, a, b, n);
  }
}

void DivideKernel(DataType t, void* data, std::size_t n, int ranks) {
  switch (t) {
    case DataType::f32:
      return DivideLoop(hn::ScalableTag<float>(), static_cast<float*>(data), n,
                        static_cast<float>(ranks));
    case DataType::f64:
      return DivideLoop(hn::ScalableTag<double>(), static_cast<double*>(data), n,
                        static_cast<double>(ranks));
    case DataType::f16:
      return Divide16<Half>(static_cast<std::uint16_t*>(data), n, static_cast<float>(ranks));
    case DataType::bf16:
      return Divide16<BF16>(static_cast<std::uint16_t*>(data), n, static_cast<float>(ranks));
    default:
      return;  // integers have no avg
  }
}

const char* TargetNameKernel() { return hwy::TargetName(HWY_TARGET); }

#undef NEXAR_REDUCE_HW_F16

}  // namespace nexar::reduce::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace nexar::reduce {

HWY_EXPORT(CombineKernel);
HWY_EXPORT(DivideKernel);
HWY_EXPORT(TargetNameKernel);

namespace detail {

void combine_kernel(DataType t, ReduceOp op, void* dst, const void* a, const void* b,
                    std::size_t n) {
  HWY_DYNAMIC_DISPATCH(CombineKernel)(t, op, dst, a, b, n);
}

void divide_kernel(DataType t, void* data, std::size_t n, int ranks) {
  HWY_DYNAMIC_DISPATCH(DivideKernel)(t, data, n, ranks);
}

const char* kernel_target_name() { return HWY_DYNAMIC_DISPATCH(TargetNameKernel)(); }

}  // namespace detail
}  // namespace nexar::reduce
#endif  // HWY_ONCE
