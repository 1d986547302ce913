// nexar — argument checking and dispatch of the reduction kernels.
#include "reduce/reduce.hpp"

#include <nexar/error.hpp>

#include <string>

#include "reduce/kernels.hpp"

namespace nexar::reduce {

namespace {

bool known(DataType t) noexcept {
  switch (t) {
    case DataType::f32:
    case DataType::f64:
    case DataType::f16:
    case DataType::bf16:
    case DataType::i8:
    case DataType::u8:
    case DataType::i32:
    case DataType::u32:
    case DataType::i64:
    case DataType::u64:
      return true;
  }
  return false;
}

bool known(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::prod:
    case ReduceOp::min:
    case ReduceOp::max:
    case ReduceOp::avg:
      return true;
  }
  return false;
}

[[noreturn]] void fail(const char* what, const std::string& detail) {
  throw Error(Errc::invalid_argument, std::string("reduce::") + what + ": " + detail);
}

void check(const char* what, DataType t, ReduceOp op) {
  if (!supports(t, op)) {
    fail(what, std::string("reduction op '") + to_string(op) +
                   "' is not supported for dtype '" + to_string(t) + "'");
  }
}

void check_ptr(const char* what, const void* p, std::size_t n, const char* name) {
  if (p == nullptr && n != 0) {
    fail(what, std::string("null ") + name + " pointer with " + std::to_string(n) + " elements");
  }
}

}  // namespace

bool supports(DataType t, ReduceOp op) noexcept {
  if (!known(t) || !known(op)) return false;
  if (op == ReduceOp::avg) return is_floating(t);
  return true;
}

void accumulate(DataType t, ReduceOp op, void* dst, const void* src, std::size_t n) {
  check("accumulate", t, op);
  check_ptr("accumulate", dst, n, "dst");
  check_ptr("accumulate", src, n, "src");
  if (n == 0) return;
  detail::combine_kernel(t, op, dst, dst, src, n);
}

void combine(DataType t, ReduceOp op, void* dst, const void* a, const void* b, std::size_t n) {
  check("combine", t, op);
  check_ptr("combine", dst, n, "dst");
  check_ptr("combine", a, n, "a");
  check_ptr("combine", b, n, "b");
  if (n == 0) return;
  detail::combine_kernel(t, op, dst, a, b, n);
}

void finish(DataType t, ReduceOp op, void* data, std::size_t n, int ranks) {
  check("finish", t, op);
  if (op != ReduceOp::avg) return;
  if (ranks < 1) fail("finish", "avg needs ranks >= 1, got " + std::to_string(ranks));
  check_ptr("finish", data, n, "data");
  if (n == 0) return;
  detail::divide_kernel(t, data, n, ranks);
}

const char* simd_target() { return detail::kernel_target_name(); }

}  // namespace nexar::reduce
