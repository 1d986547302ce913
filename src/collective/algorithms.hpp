// The collective algorithms. Each runs on the communicator's collective thread with a
// Coll describing the call; arguments were validated by the collective's entry point in
// its own file.
// Counts are in elements of c.dtype.
#pragma once

#include <cstddef>
#include <functional>
#include <span>
#include <utility>

#include <nexar/compression.hpp>

#include "collective/context.hpp"

namespace nexar::detail::coll {

/// {offset, length} in elements of block b of a concatenated buffer.
using BlockFn = std::function<std::pair<std::size_t, std::size_t>(int b)>;

// Building blocks shared by several collectives (ring.cpp).
/// After it, rank r's block r of `data` holds the reduction over ranks of block r. This
/// rank's contribution is read from `local` (default: `data` itself); with a separate
/// `local`, `data` need not be initialised (its block r-1 stays unwritten).
void ring_reduce_scatter(const Coll& c, void* data, const BlockFn& block, const void* local = nullptr);
/// Starting with block r at rank r, fills every block of `data` on every rank.
void ring_all_gather(const Coll& c, void* data, const BlockFn& block);

void all_reduce(const Coll& c, const void* send, void* recv, std::size_t count);
void all_reduce_sharded(const Coll& c, const void* send, void* recv, void* shard, std::size_t count);
void reduce_scatter(const Coll& c, const void* send, void* recv, std::size_t count);
void all_gather(const Coll& c, const void* send, void* recv, std::size_t count);
void all_gather_v(const Coll& c, const void* send, std::size_t send_count, void* recv,
                  std::span<const std::size_t> counts, std::span<const std::size_t> displs);
void broadcast(const Coll& c, void* buf, std::size_t count, int root);
void reduce(const Coll& c, const void* send, void* recv, std::size_t count, int root);
void gather_v(const Coll& c, const void* send, std::size_t send_count, void* recv,
              std::span<const std::size_t> counts, std::span<const std::size_t> displs, int root);
void scatter_v(const Coll& c, const void* send, std::span<const std::size_t> counts,
               std::span<const std::size_t> displs, void* recv, std::size_t recv_count, int root);
void all_to_all_v(const Coll& c, const void* send, std::span<const std::size_t> send_counts,
                  std::span<const std::size_t> send_displs, void* recv,
                  std::span<const std::size_t> recv_counts, std::span<const std::size_t> recv_displs);
void scan(const Coll& c, const void* send, void* recv, std::size_t count, bool exclusive);
void barrier(const Coll& c);
void all_reduce_compressed(const Coll& c, void* data, std::size_t count, ErrorFeedback& state);

}  // namespace nexar::detail::coll
