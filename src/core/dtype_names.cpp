// The names of element types and reduction operators (include/nexar/dtype.hpp), in core so
// that every module's errors can spell them (core/call_check.cpp among them).
#include <nexar/dtype.hpp>

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

}  // namespace nexar
