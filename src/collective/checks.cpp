#include "collective/checks.hpp"

#include "core/error_format.hpp"
#include "reduce/reduce.hpp"

namespace nexar::detail::coll {

void bad(const CollectivePort& p, const char* op, const std::string& why) {
  ErrorContext ctx{op, p.rank(), -1, {}, {}};
  throw make_error(Errc::invalid_argument, ctx, why);
}

void check_buffer(const CollectivePort& p, const char* op, const char* what, const void* buf,
                  std::size_t count) {
  if (count && !buf) bad(p, op, std::string("null ") + what + " buffer with count " + std::to_string(count));
}

void check_root(const CollectivePort& p, const char* op, int root) {
  if (root < 0 || root >= p.size())
    bad(p, op, "root " + std::to_string(root) + " out of range [0, " + std::to_string(p.size()) + ")");
}

void check_op(const CollectivePort& p, const char* op, DataType t, ReduceOp r) {
  if (!reduce::supports(t, r))
    bad(p, op, std::string("reduction ") + to_string(r) + " is not defined for " + to_string(t));
}

void check_algorithm(const CollectivePort& p, const char* op, Algorithm a,
                     std::initializer_list<Algorithm> ok) {
  if (a == Algorithm::automatic) return;
  for (Algorithm x : ok)
    if (x == a) return;
  bad(p, op, std::string("algorithm ") + to_string(a) + " is not available for " + op);
}

void check_all_reduce_algorithm(const CollectivePort& p, const char* op, Algorithm a) {
  check_algorithm(p, op, a,
                  {Algorithm::ring, Algorithm::halving_doubling, Algorithm::recursive_doubling, Algorithm::hierarchical});
}

void check_v(const CollectivePort& p, const char* op, std::span<const std::size_t> counts,
             std::span<const std::size_t> displs) {
  auto n = static_cast<std::size_t>(p.size());
  if (counts.size() != n || displs.size() != n)
    bad(p, op, "counts and displs need " + std::to_string(n) + " entries, got " +
                   std::to_string(counts.size()) + " and " + std::to_string(displs.size()));
}

void check_own(const CollectivePort& p, const char* op, const char* what, std::size_t value,
               std::span<const std::size_t> counts, int index) {
  const std::size_t c = counts[static_cast<std::size_t>(index)];
  if (c != value)
    bad(p, op, std::string(what) + " " + std::to_string(value) + " differs from its entry in counts, " +
                   std::to_string(c));
}

Layout copy_of(std::span<const std::size_t> s) {
  return std::make_shared<const std::vector<std::size_t>>(s.begin(), s.end());
}

std::pair<Layout, Layout> uniform_layout(int ranks, std::size_t count) {
  auto n = static_cast<std::size_t>(ranks);
  auto counts = std::make_shared<std::vector<std::size_t>>(n, count);
  auto displs = std::make_shared<std::vector<std::size_t>>(n);
  for (std::size_t i = 0; i < n; ++i) (*displs)[i] = i * count;
  return {std::move(counts), std::move(displs)};
}

std::pair<Layout, Layout> root_layout(const CollectivePort& p, const char* op, int root,
                                      std::span<const std::size_t> counts,
                                      std::span<const std::size_t> displs, const char* own_name,
                                      std::size_t own) {
  if (p.rank() != root) {
    auto none = std::make_shared<const std::vector<std::size_t>>();
    return {none, none};
  }
  check_v(p, op, counts, displs);
  check_own(p, op, own_name, own, counts, root);
  return {copy_of(counts), copy_of(displs)};
}

}  // namespace nexar::detail::coll
