// nexar — element types and reduction operators of collectives.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace nexar {

/// Element type of a buffer handed to a collective.
enum class DataType : std::uint8_t { f32, f64, f16, bf16, i8, u8, i32, u32, i64, u64 };

/// Reduction operator. avg is allowed for floating types only (f32, f64, f16, bf16): the
/// sum divided by the number of ranks.
enum class ReduceOp : std::uint8_t { sum, prod, min, max, avg };

/// IEEE 754 binary16, stored as its bit pattern.
struct half {
  std::uint16_t bits = 0;
  friend bool operator==(half a, half b) noexcept { return a.bits == b.bits; }
};
/// bfloat16 (the upper half of an IEEE binary32), stored as its bit pattern.
struct bfloat16 {
  std::uint16_t bits = 0;
  friend bool operator==(bfloat16 a, bfloat16 b) noexcept { return a.bits == b.bits; }
};

/// Bytes per element.
constexpr std::size_t size_of(DataType t) noexcept {
  switch (t) {
    case DataType::f64:
    case DataType::i64:
    case DataType::u64:
      return 8;
    case DataType::f32:
    case DataType::i32:
    case DataType::u32:
      return 4;
    case DataType::f16:
    case DataType::bf16:
      return 2;
    case DataType::i8:
    case DataType::u8:
      return 1;
  }
  return 0;
}

/// True for f32, f64, f16, bf16.
constexpr bool is_floating(DataType t) noexcept {
  return t == DataType::f32 || t == DataType::f64 || t == DataType::f16 || t == DataType::bf16;
}

/// "f32", "bf16", ... and "sum", "avg", ...
const char* to_string(DataType t) noexcept;
const char* to_string(ReduceOp op) noexcept;

/// The DataType of a C++ element type, for the typed API.
template <class T>
struct dtype_of;
template <> struct dtype_of<float> { static constexpr DataType value = DataType::f32; };
template <> struct dtype_of<double> { static constexpr DataType value = DataType::f64; };
template <> struct dtype_of<half> { static constexpr DataType value = DataType::f16; };
template <> struct dtype_of<bfloat16> { static constexpr DataType value = DataType::bf16; };
template <> struct dtype_of<std::int8_t> { static constexpr DataType value = DataType::i8; };
template <> struct dtype_of<std::uint8_t> { static constexpr DataType value = DataType::u8; };
template <> struct dtype_of<std::int32_t> { static constexpr DataType value = DataType::i32; };
template <> struct dtype_of<std::uint32_t> { static constexpr DataType value = DataType::u32; };
template <> struct dtype_of<std::int64_t> { static constexpr DataType value = DataType::i64; };
template <> struct dtype_of<std::uint64_t> { static constexpr DataType value = DataType::u64; };
template <class T>
inline constexpr DataType dtype_of_v = dtype_of<std::remove_cv_t<T>>::value;

/// Element types the typed collectives accept: those with a dtype_of mapping above
/// (cv-qualifiers ignored). Another type, or a pointer, is a compile-time error naming this
/// concept.
template <class T>
concept HasDataType = requires {
  { dtype_of<std::remove_cv_t<T>>::value } -> std::convertible_to<DataType>;
};

/// Round-to-nearest-even conversions (subnormals, infinities and NaN preserved; NaN stays
/// a quiet NaN).
half to_half(float x) noexcept;
float from_half(half h) noexcept;
bfloat16 to_bfloat16(float x) noexcept;
float from_bfloat16(bfloat16 h) noexcept;

}  // namespace nexar
