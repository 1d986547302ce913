// nexar — names of element types and operators, scalar 16-bit float conversions.
#include <nexar/dtype.hpp>

#include <bit>

#include "reduce/float16.hpp"

namespace nexar {

const char* to_string(DataType t) noexcept {
  switch (t) {
    case DataType::f32: return "f32";
    case DataType::f64: return "f64";
    case DataType::f16: return "f16";
    case DataType::bf16: return "bf16";
    case DataType::i8: return "i8";
    case DataType::u8: return "u8";
    case DataType::i32: return "i32";
    case DataType::u32: return "u32";
    case DataType::i64: return "i64";
    case DataType::u64: return "u64";
  }
  return "unknown-dtype";
}

const char* to_string(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::prod: return "prod";
    case ReduceOp::min: return "min";
    case ReduceOp::max: return "max";
    case ReduceOp::avg: return "avg";
  }
  return "unknown-op";
}

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
