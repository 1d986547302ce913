// Argument checks shared by the collectives' entry points. Each throws nexar::Error
// (Errc::invalid_argument) naming the operation, this rank and what was wrong, before
// anything is queued, so the communicator stays usable.
#pragma once

#include <nexar/collective.hpp>
#include <nexar/dtype.hpp>

#include <cstddef>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "collective/port.hpp"

namespace nexar::detail::coll {

[[noreturn]] void bad(const CollectivePort& p, const char* op, const std::string& why);
/// A null buffer is allowed only with count 0.
void check_buffer(const CollectivePort& p, const char* op, const char* what, const void* buf,
                  std::size_t count);
void check_root(const CollectivePort& p, const char* op, int root);
/// The reduction must be defined for the element type.
void check_op(const CollectivePort& p, const char* op, DataType t, ReduceOp r);
/// A forced algorithm must be one of `ok` (automatic always is).
void check_algorithm(const CollectivePort& p, const char* op, Algorithm a,
                     std::initializer_list<Algorithm> ok);
/// Every all_reduce variant offers the same algorithms (ring, halving_doubling,
/// recursive_doubling).
void check_all_reduce_algorithm(const CollectivePort& p, const char* op, Algorithm a);
/// counts and displs of a v-collective need size() entries each.
void check_v(const CollectivePort& p, const char* op, std::span<const std::size_t> counts,
             std::span<const std::size_t> displs);
/// counts[index] must equal the count this rank passes as `what`.
void check_own(const CollectivePort& p, const char* op, const char* what, std::size_t value,
               std::span<const std::size_t> counts, int index);

/// counts / displs held by a collective until it has run.
using Layout = std::shared_ptr<const std::vector<std::size_t>>;
Layout copy_of(std::span<const std::size_t> s);
/// counts and displs of `count` elements per rank, back to back.
std::pair<Layout, Layout> uniform_layout(int ranks, std::size_t count);
/// counts and displs of a rooted v-collective: checked and copied at the root, the only rank
/// that reads them; empty elsewhere. `own` (named `own_name`) is the root's own count.
std::pair<Layout, Layout> root_layout(const CollectivePort& p, const char* op, int root,
                                      std::span<const std::size_t> counts,
                                      std::span<const std::size_t> displs, const char* own_name,
                                      std::size_t own);

}  // namespace nexar::detail::coll
