// nexar — scalar bit-level conversions between binary32 and the 16-bit float formats.
//
// These are the reference conversions of the reduce module: nexar::to_half() & co. are thin
// wrappers around them, and the SIMD kernels (reduce/kernels.cpp) are tested to agree with
// them bit for bit. Everything is integer arithmetic, so the results do not depend on the
// floating-point environment (rounding mode, FTZ/DAZ).
//
// binary32 -> 16-bit: round to nearest, ties to even; values that round past the largest
// finite value become infinity (for binary16: |x| >= 65520 -> inf, 65504 stays finite);
// values below the smallest subnormal round to a signed zero; NaN becomes a quiet NaN with
// the same sign and the top payload bits of the input (the quiet bit is set).
// 16-bit -> binary32: exact (every 16-bit value is a binary32 value); NaN payloads are
// widened bit for bit, so a signalling NaN stays signalling.
#pragma once

#include <bit>
#include <cstdint>

namespace nexar::reduce::fp16 {

/// binary32 bit pattern -> binary16 bit pattern, round to nearest even.
constexpr std::uint16_t half_from_float_bits(std::uint32_t x) noexcept {
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t a = x & 0x7FFFFFFFu;
  std::uint32_t h;
  if (a > 0x7F800000u) {                      // NaN: keep the top 10 payload bits, set quiet
    h = ((a >> 13) & 0x7FFFu) | 0x0200u;
  } else if (a >= 0x477FF000u) {              // >= 65520 (half-way to 2^16) and inf
    h = 0x7C00u;
  } else if (a >= 0x38800000u) {              // >= 2^-14: normal binary16
    const std::uint32_t rounded = a + 0x0FFFu + ((a >> 13) & 1u);
    h = (rounded - 0x38000000u) >> 13;        // rebias 127 -> 15; a carry bumps the exponent
  } else {                                    // subnormal binary16 (or zero)
    const std::uint32_t e = a >> 23;          // <= 112
    const std::uint32_t m = (a & 0x007FFFFFu) | 0x00800000u;
    std::uint32_t s = 126u - e;               // value = m * 2^-24 / 2^s, s >= 14
    if (s > 31u) s = 31u;                     // everything below 2^-25 is 0 anyway
    h = (m + ((1u << (s - 1)) - 1u) + ((m >> s) & 1u)) >> s;  // may yield 0x400 (normal)
  }
  return static_cast<std::uint16_t>(sign | h);
}

/// binary16 bit pattern -> binary32 bit pattern (exact).
constexpr std::uint32_t float_bits_from_half(std::uint16_t hb) noexcept {
  const std::uint32_t h = hb;
  const std::uint32_t sign = (h & 0x8000u) << 16;
  const std::uint32_t a = h & 0x7FFFu;
  if (a >= 0x7C00u) return sign | 0x7F800000u | ((a & 0x03FFu) << 13);  // inf / NaN
  if (a >= 0x0400u) return sign | ((a << 13) + 0x38000000u);            // normal
  if (a == 0) return sign;                                              // zero
  // Subnormal: m * 2^-24 with 1 <= m < 2^10; normalise so that bit 10 is the leading one.
  const int shift = std::countl_zero(a) - 21;  // a < 2^10 -> countl_zero >= 22
  const std::uint32_t m = (a << shift) & 0x03FFu;
  const std::uint32_t exp = static_cast<std::uint32_t>(113 - shift);  // 2^-14 has field 113
  return sign | (exp << 23) | (m << 13);
}

/// binary32 bit pattern -> bfloat16 bit pattern, round to nearest even.
constexpr std::uint16_t bf16_from_float_bits(std::uint32_t x) noexcept {
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((x >> 16) | 0x0040u);
  return static_cast<std::uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

/// bfloat16 bit pattern -> binary32 bit pattern (exact).
constexpr std::uint32_t float_bits_from_bf16(std::uint16_t b) noexcept {
  return static_cast<std::uint32_t>(b) << 16;
}

}  // namespace nexar::reduce::fp16
