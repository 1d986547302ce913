// nexar — scalar 16-bit float conversions (the names of types and operators: core/dtype_names.cpp).
#include <nexar/dtype.hpp>

#include <bit>

#include "reduce/float16.hpp"

namespace nexar {

half to_half(float x) noexcept {
  return half{reduce::fp16::half_from_float_bits(std::bit_cast<std::uint32_t>(x))};
}

float from_half(half h) noexcept {
  return std::bit_cast<float>(reduce::fp16::float_bits_from_half(h.bits));
}

bfloat16 to_bfloat16(float x) noexcept {
  return bfloat16{reduce::fp16::bf16_from_float_bits(std::bit_cast<std::uint32_t>(x))};
}

float from_bfloat16(bfloat16 h) noexcept {
  return std::bit_cast<float>(reduce::fp16::float_bits_from_bf16(h.bits));
}

}  // namespace nexar
