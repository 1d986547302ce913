// Compressed all_reduce with error feedback (top-k and random-k sparsification).
//
// random_k: every rank picks the same k positions from (seed, step), so the picked values
// are reduced with an ordinary dense all_reduce of k elements.
// top_k: ranks pick different positions; every rank all-gathers everyone's (index, value)
// pairs and adds them up in rank order, so all ranks compute bitwise the same result.
#include <nexar/communicator.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "collective/algorithms.hpp"
#include "collective/checks.hpp"
#include "collective/collectives.hpp"

namespace nexar::detail {

// The state ErrorFeedback keeps for this file alone.
struct ErrorFeedbackAccess {
  static std::vector<std::byte>& residual(ErrorFeedback& s) noexcept { return s.residual_; }
  static DataType& dtype(ErrorFeedback& s) noexcept { return s.dtype_; }
  static std::uint64_t next_step(ErrorFeedback& s) noexcept { return s.step_++; }
};

namespace coll {

namespace {

template <class T>
void run(const Coll& c, T* data, std::size_t count, ErrorFeedback& st) {
  const Compression& cfg = st.compression();
  const auto n = static_cast<std::size_t>(c.size());
  std::vector<std::byte>& residual = ErrorFeedbackAccess::residual(st);
  if (residual.size() != count * sizeof(T)) residual.assign(count * sizeof(T), std::byte{0});
  ErrorFeedbackAccess::dtype(st) = c.dtype;
  T* res = reinterpret_cast<T*>(residual.data());
  // g = data + residual: what this rank would like to send.
  for (std::size_t i = 0; i < count; ++i) data[i] += res[i];
  const std::uint64_t step = ErrorFeedbackAccess::next_step(st);
  if (count == 0) return;
  const std::size_t k = std::min<std::size_t>(
      count, std::max<std::size_t>(1, static_cast<std::size_t>(std::ceil(cfg.ratio * static_cast<double>(count)))));

  std::vector<std::uint64_t> idx(k);
  if (cfg.kind == Compression::Kind::random_k) {
    // The same k distinct positions on every rank: a partial Fisher-Yates shuffle driven
    // by a generator whose output is fixed by the standard.
    std::mt19937_64 rng(cfg.seed * 0x9e3779b97f4a7c15ull + step);
    std::vector<std::uint64_t> perm(count);
    std::iota(perm.begin(), perm.end(), 0);
    for (std::size_t i = 0; i < k; ++i) {
      std::size_t j = i + static_cast<std::size_t>(rng() % (count - i));
      std::swap(perm[i], perm[j]);
    }
    std::copy_n(perm.begin(), k, idx.begin());
  } else {
    std::vector<std::uint64_t> order(count);
    std::iota(order.begin(), order.end(), 0);
    // Largest magnitude first; ties (and NaN, treated as largest) broken by index.
    auto key = [&](std::uint64_t i) { return std::isnan(data[i]) ? INFINITY : std::fabs(static_cast<double>(data[i])); };
    std::nth_element(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k - 1), order.end(),
                     [&](std::uint64_t a, std::uint64_t b) {
                       double ka = key(a), kb = key(b);
                       return ka != kb ? ka > kb : a < b;
                     });
    std::copy_n(order.begin(), k, idx.begin());
  }
  std::sort(idx.begin(), idx.end());

  std::vector<T> vals(k);
  for (std::size_t i = 0; i < k; ++i) vals[i] = data[idx[i]];
  // What is sent leaves the residual; the rest stays for the next step.
  for (std::size_t i = 0; i < count; ++i) res[i] = data[i];
  for (std::uint64_t i : idx) res[i] = T(0);
  std::fill(data, data + count, T(0));

  if (cfg.kind == Compression::Kind::random_k) {
    all_reduce(c, vals.data(), vals.data(), k);  // finishes avg too
    for (std::size_t i = 0; i < k; ++i) data[idx[i]] = vals[i];
    return;
  }
  std::vector<std::uint64_t> all_idx(k * n);
  std::vector<T> all_vals(k * n);
  Coll ci = c;
  ci.dtype = DataType::u64;
  all_gather(ci, idx.data(), all_idx.data(), k);
  all_gather(c, vals.data(), all_vals.data(), k);
  for (std::size_t r = 0; r < n; ++r)
    for (std::size_t i = 0; i < k; ++i) data[all_idx[r * k + i]] += all_vals[r * k + i];
  if (c.op == ReduceOp::avg)
    for (std::size_t i = 0; i < count; ++i) data[i] /= static_cast<T>(n);
}

}  // namespace

void all_reduce_compressed(const Coll& c, void* data, std::size_t count, ErrorFeedback& state) {
  if (c.dtype == DataType::f32) {
    run(c, static_cast<float*>(data), count, state);
  } else {
    run(c, static_cast<double*>(data), count, state);
  }
}

Request iall_reduce_compressed(CollectivePort& p, void* data, std::size_t count, DataType t,
                               ReduceOp op, ErrorFeedback& state, const CollectiveOptions& o) {
  const char* name = "all_reduce_compressed";
  if (t != DataType::f32 && t != DataType::f64)
    bad(p, name, std::string("dtype ") + to_string(t) + " is not supported (f32 or f64)");
  if (op != ReduceOp::sum && op != ReduceOp::avg)
    bad(p, name, std::string("reduction ") + to_string(op) + " is not supported (sum or avg)");
  const double ratio = state.compression().ratio;
  if (!(ratio > 0.0 && ratio <= 1.0)) bad(p, name, "compression ratio " + std::to_string(ratio) + " outside (0, 1]");
  const std::size_t held = state.residual().size();
  const DataType held_type = ErrorFeedbackAccess::dtype(state);
  if (held != 0 && held_type != t)
    bad(p, name, std::string("dtype ") + to_string(t) + " differs from the previous step's " +
                     to_string(held_type) + " (reset() the state first)");
  if (held != 0 && held != count * size_of(t))
    bad(p, name, "count " + std::to_string(count) + " differs from the previous step's " +
                     std::to_string(held / size_of(t)) + " (reset() the state first)");
  check_buffer(p, name, "data", data, count);
  check_all_reduce_algorithm(p, name, o.algorithm);
  ErrorFeedback* st = &state;
  return p.start(name, o, t, op, {count, -1}, [=](const Coll& c) { all_reduce_compressed(c, data, count, *st); });
}

}  // namespace coll
}  // namespace nexar::detail

namespace nexar {

Request Communicator::iall_reduce_compressed(void* data, std::size_t count, DataType t, ReduceOp op,
                                             ErrorFeedback& state, const CollectiveOptions& o) {
  return detail::coll::iall_reduce_compressed(port(), data, count, t, op, state, o);
}

}  // namespace nexar
