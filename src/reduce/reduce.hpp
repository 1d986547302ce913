// nexar — element-wise reduction kernels used by the collectives.
//
// Contract (identical for every SIMD target and for the scalar tail handling, independent
// of pointer alignment and of n; tests/reduce_test.cpp checks it bit for bit):
//
//  * Integers (i8, u8, i32, u32, i64, u64): sum and prod wrap modulo 2^bits (two's
//    complement for the signed types, no UB); min and max are exact. avg is rejected.
//  * f32, f64: sum, prod and avg's accumulation are the IEEE 754 operations in the element
//    type, round to nearest even (the default floating-point environment is assumed).
//    When both operands of a sum/prod are NaN, which of the two payloads survives is up to
//    the hardware (IEEE 754 leaves it open); the result is a NaN either way.
//    min / max:
//      - NaN propagates: if an operand is NaN the result is NaN, namely the FIRST NaN
//        operand (dst for accumulate, a for combine), made quiet (quiet bit set; sign and
//        payload otherwise kept).
//      - min(-0, +0) = min(+0, -0) = -0 and max(-0, +0) = max(+0, -0) = +0.
//      - otherwise the smaller / larger operand, exactly.
//  * f16, bf16: each element is widened to f32 (exactly), the op is applied in f32 with the
//    rules above, and the result is rounded back with round-to-nearest-even: subnormals are
//    produced, overflow gives inf (f16: |x| >= 65520), NaN stays NaN (quiet, sign kept, top
//    payload bits kept). The conversions are those of nexar::to_half / to_bfloat16.
//  * avg: accumulate and combine add (the sum); finish() divides the sum by `ranks`:
//    f64: x / double(ranks); f32: x / float(ranks); f16/bf16: widen to f32, x / float(ranks)
//    (a true division, not a multiplication by 1/ranks), round back as above.
//    finish() is a no-op for every other op.
//  * dst may be the same pointer as a or b (element i is read before element i is written);
//    other partial overlaps are not allowed. Pointers only need the alignment of the
//    element type (unaligned to the vector width is fine). n == 0 does nothing; a null
//    pointer is allowed only with n == 0.
//
// Errors: accumulate/combine/finish throw nexar::Error(Errc::invalid_argument) when
// !supports(t, op) (the message names dtype and op), when a pointer is null with n > 0,
// and finish() for avg when ranks < 1.
#pragma once

#include <nexar/dtype.hpp>

#include <cstddef>

namespace nexar::reduce {

/// True when `op` applies to `t` (avg: floating types only).
bool supports(DataType t, ReduceOp op) noexcept;

/// dst[i] = op(dst[i], src[i]) for i < n. For avg this accumulates the sum (see finish).
void accumulate(DataType t, ReduceOp op, void* dst, const void* src, std::size_t n);

/// dst[i] = op(a[i], b[i]) (dst may alias a or b). For avg: the sum.
void combine(DataType t, ReduceOp op, void* dst, const void* a, const void* b, std::size_t n);

/// Final step of avg: data[i] /= ranks (a no-op for other ops).
void finish(DataType t, ReduceOp op, void* data, std::size_t n, int ranks);

/// Name of the SIMD target chosen at run time (e.g. "AVX2"), for logs and benchmarks.
const char* simd_target();

}  // namespace nexar::reduce
