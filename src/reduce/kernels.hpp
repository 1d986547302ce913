// nexar — entry points of the dynamically dispatched SIMD kernels (reduce/kernels.cpp).
// Internal to the reduce module: arguments are validated by reduce.cpp.
#pragma once

#include <nexar/dtype.hpp>

#include <cstddef>

namespace nexar::reduce::detail {

/// dst[i] = op(a[i], b[i]); avg adds. t/op must be supported, pointers valid for n.
void combine_kernel(DataType t, ReduceOp op, void* dst, const void* a, const void* b,
                    std::size_t n);

/// data[i] /= ranks for a floating type t; ranks >= 1.
void divide_kernel(DataType t, void* data, std::size_t n, int ranks);

/// Name of the Highway target that the kernels dispatch to now.
const char* kernel_target_name();

}  // namespace nexar::reduce::detail
