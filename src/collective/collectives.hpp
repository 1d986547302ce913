// The collectives' entry points over a port, one per non-blocking operation of
// nexar::Communicator. Each is defined in its collective's own file, next to its
// algorithms and the Communicator member functions that call it: it checks the arguments
// (throwing Errc::invalid_argument before anything is queued), knows which algorithms the
// collective offers, and starts the chosen one through the port. The contracts are those
// of the public functions of the same name (communicator.hpp). Tests call them on ports of
// their own (tests/memory_port.hpp).
#pragma once

#include <nexar/buffer.hpp>
#include <nexar/collective.hpp>
#include <nexar/compression.hpp>
#include <nexar/dtype.hpp>
#include <nexar/request.hpp>

#include <cstddef>
#include <span>

#include "collective/port.hpp"

namespace nexar::detail::coll {

using Counts = std::span<const std::size_t>;

Request iall_reduce(CollectivePort& p, const void* send, void* recv, std::size_t count, DataType t,
                    ReduceOp op, const CollectiveOptions& o);
Request iall_reduce_bucketed(CollectivePort& p, std::span<const MutableBuffer> buffers, DataType t,
                             ReduceOp op, const CollectiveOptions& o);
Request iall_reduce_sharded(CollectivePort& p, const void* send, void* recv, void* shard,
                            std::size_t count, DataType t, ReduceOp op, const CollectiveOptions& o);
Request iall_reduce_compressed(CollectivePort& p, void* data, std::size_t count, DataType t,
                               ReduceOp op, ErrorFeedback& state, const CollectiveOptions& o);
Request ibroadcast(CollectivePort& p, void* buf, std::size_t count, DataType t, int root,
                   const CollectiveOptions& o);
Request ireduce(CollectivePort& p, const void* send, void* recv, std::size_t count, DataType t,
                ReduceOp op, int root, const CollectiveOptions& o);
Request iall_gather(CollectivePort& p, const void* send, void* recv, std::size_t count, DataType t,
                    const CollectiveOptions& o);
Request iall_gather_v(CollectivePort& p, const void* send, std::size_t send_count, void* recv,
                      Counts counts, Counts displs, DataType t, const CollectiveOptions& o);
Request ireduce_scatter(CollectivePort& p, const void* send, void* recv, std::size_t count,
                        DataType t, ReduceOp op, const CollectiveOptions& o);
Request iall_to_all(CollectivePort& p, const void* send, void* recv, std::size_t count, DataType t,
                    const CollectiveOptions& o);
Request iall_to_all_v(CollectivePort& p, const void* send, Counts send_counts, Counts send_displs,
                      void* recv, Counts recv_counts, Counts recv_displs, DataType t,
                      const CollectiveOptions& o);
Request igather(CollectivePort& p, const void* send, void* recv, std::size_t count, DataType t,
                int root, const CollectiveOptions& o);
Request igather_v(CollectivePort& p, const void* send, std::size_t send_count, void* recv,
                  Counts counts, Counts displs, DataType t, int root, const CollectiveOptions& o);
Request iscatter(CollectivePort& p, const void* send, void* recv, std::size_t count, DataType t,
                 int root, const CollectiveOptions& o);
Request iscatter_v(CollectivePort& p, const void* send, Counts counts, Counts displs, void* recv,
                   std::size_t recv_count, DataType t, int root, const CollectiveOptions& o);
Request iscan(CollectivePort& p, const void* send, void* recv, std::size_t count, DataType t,
              ReduceOp op, bool exclusive, const CollectiveOptions& o);
Request ibarrier(CollectivePort& p, const CollectiveOptions& o);

}  // namespace nexar::detail::coll
