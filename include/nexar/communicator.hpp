// nexar — the communicator: a group of ranks connected over QUIC.
#pragma once

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <type_traits>
#include <vector>

#include <nexar/buffer.hpp>
#include <nexar/collective.hpp>
#include <nexar/compression.hpp>
#include <nexar/config.hpp>
#include <nexar/dtype.hpp>
#include <nexar/error.hpp>
#include <nexar/request.hpp>
#include <nexar/rpc.hpp>

namespace nexar {

namespace detail {
class Group;
}

/// Element types that may be sent as typed spans.
template <class T>
concept Trivial = std::is_trivially_copyable_v<T> && !std::is_pointer_v<T>;

/// A set of `size()` ranks, each holding one Communicator, connected by one QUIC connection
/// per pair with independent lanes (control, data, RPC request, RPC response, bulk).
///
/// Threading: every member function may be called from any thread, concurrently.
/// Ordering: messages from one source with one tag on one communicator arrive in the order
/// they were sent (MPI's non-overtaking rule); nothing is lost or duplicated.
/// Copies of a Communicator share one underlying connection set.
///
/// Errors: functions throw nexar::Error; see error.hpp for the policy. Every message names
/// the operation, this rank, the peer and the elapsed time.
class Communicator {
 public:
  /// An empty communicator (is_open() is false); every other call throws.
  Communicator() = default;
  explicit Communicator(std::shared_ptr<detail::Group> group);

  /// This process's rank, 0 <= rank() < size().
  int rank() const;
  /// Number of ranks.
  int size() const;
  /// The configuration this communicator runs with.
  const Config& config() const;

  // ---- point-to-point, data lane ------------------------------------------------------

  /// Sends `bytes` bytes to `dest` with `tag`. Returns when `data` may be reused.
  /// Errors: invalid_argument (dest out of range or == rank(), tag outside 0..max_tag,
  /// bytes > max_frame_bytes), timeout, peer_closed, peer_failed, closed.
  void send(int dest, int tag, const void* data, std::size_t bytes);

  /// Non-blocking send; `data` must stay valid until the Request completes.
  Request isend(int dest, int tag, const void* data, std::size_t bytes);

  /// Sends the concatenation of `parts` as one message (scatter/gather I/O). The parts
  /// are not copied into one buffer first for large messages.
  void send_iov(int dest, int tag, std::span<const ConstBuffer> parts);
  /// Non-blocking send_iov; the parts (not the span) must stay valid until completion.
  Request isend_iov(int dest, int tag, std::span<const ConstBuffer> parts);

  /// Receives one message from `source` (or any_source) with `tag` (or any_tag) into
  /// `data`, which has room for `capacity` bytes. Returns who sent it and its size.
  /// Errors: invalid_argument, truncated (message larger than capacity: the message is
  /// consumed and dropped), timeout, peer_closed, peer_failed, closed.
  Status recv(int source, int tag, void* data, std::size_t capacity);

  /// Non-blocking receive; `data` must stay valid until the Request completes.
  Request irecv(int source, int tag, void* data, std::size_t capacity);

  template <Trivial T>
  void send(int dest, int tag, std::span<const T> data) {
    send(dest, tag, data.data(), data.size_bytes());
  }
  template <Trivial T>
  Request isend(int dest, int tag, std::span<const T> data) {
    return isend(dest, tag, data.data(), data.size_bytes());
  }
  /// Typed receive. Throws invalid_argument if the message size is not a multiple of
  /// sizeof(T); the returned Status counts bytes.
  template <Trivial T>
  Status recv(int source, int tag, std::span<T> data) {
    Status s = recv(source, tag, data.data(), data.size_bytes());
    check_element_multiple(s, sizeof(T));
    return s;
  }
  template <Trivial T>
  Request irecv(int source, int tag, std::span<T> data) {
    return irecv(source, tag, data.data(), data.size_bytes());
  }

  // ---- raw tagged byte streams, bulk lane -----------------------------------------------

  /// Sends a large byte range on the bulk lane. Bulk traffic has its own matching space
  /// (a stream_recv never matches a send and vice versa), its own QUIC stream, written
  /// only when no other lane has data to send, and its own unexpected-message budget, so
  /// a multi-gigabyte transfer (or one the receiver has not taken yet) never delays
  /// control, data, RPC or collective traffic: collectives have a lane of their own.
  /// Contract and errors as send().
  void stream_send(int dest, int tag, const void* data, std::size_t bytes);
  Request istream_send(int dest, int tag, const void* data, std::size_t bytes);
  /// Receives from the bulk lane; contract and errors as recv().
  Status stream_recv(int source, int tag, void* data, std::size_t capacity);
  Request istream_recv(int source, int tag, void* data, std::size_t capacity);

  // ---- RPC ---------------------------------------------------------------------------

  /// Registers `handler` as function `id` of this communicator, replacing any previous
  /// one: calls made through this communicator (or a copy) reach it, and it sees the
  /// caller's rank in this communicator. Another communicator of the same ranks (a split)
  /// has handlers of its own. Errors: invalid_argument (empty handler), closed.
  void register_rpc(RpcId id, RpcHandler handler);
  /// Removes the handler of `id`; later calls to it fail with Errc::unknown_rpc.
  void unregister_rpc(RpcId id);

  /// Calls function `id` of this communicator on rank `dest` (which may be this rank) and
  /// returns its reply. Errors: invalid_argument (dest out of range, arguments over
  /// max_frame_bytes), unknown_rpc (no such handler there, reported at once), rpc_failed
  /// (the handler threw, or every handler thread there waits for a nested call: see
  /// Config::rpc_threads), timeout (default Config::rpc_timeout), peer_closed, peer_failed,
  /// closed.
  std::vector<std::byte> rpc(int dest, RpcId id, std::span<const std::byte> args,
                             std::optional<std::chrono::milliseconds> timeout = {});

  /// Non-blocking rpc(): `args` are copied before it returns; the RpcCall brings the reply.
  RpcCall rpc_async(int dest, RpcId id, std::span<const std::byte> args,
                    std::optional<std::chrono::milliseconds> timeout = {});

  // ---- communicators -----------------------------------------------------------------

  /// Collective over this communicator: ranks passing the same `color` (>= 0) form a new
  /// communicator, ranked by (`key`, rank here). A negative color returns an empty
  /// Communicator (is_open() false). Sub-communicators nest; their traffic carries their
  /// own id and never mixes with another communicator's. Errors: as a collective.
  Communicator split(int color, int key) const;

  /// Identifier carried by this communicator's frames (0 for the world).
  std::uint64_t id() const;

  // ---- collectives -------------------------------------------------------------------
  //
  // Every rank of the communicator calls the same collectives in the same order with
  // matching arguments (counts, dtype, op, root). Each has a non-blocking form (i-prefix)
  // returning a Request; several may be in flight on one communicator (they complete in
  // the order they were started) and on different communicators at once. Buffers must
  // stay valid until the Request completes. `send` may equal `recv` (in place) where the
  // sizes allow. Results are bitwise identical on every rank that receives them.
  // Errors: invalid_argument (root out of range, op not valid for dtype, null buffer with
  // count > 0, forced algorithm the collective lacks), timeout, peer_* (a rank failed),
  // closed.

  /// recv[i] = op over ranks of send[i], on every rank. count elements each.
  Request iall_reduce(const void* send, void* recv, std::size_t count, DataType t, ReduceOp op,
                      const CollectiveOptions& o = {});
  /// buf (count elements) of `root` is copied to every rank's buf.
  Request ibroadcast(void* buf, std::size_t count, DataType t, int root,
                     const CollectiveOptions& o = {});
  /// recv at `root` = op over ranks of send; recv is ignored (may be null) elsewhere.
  Request ireduce(const void* send, void* recv, std::size_t count, DataType t, ReduceOp op,
                  int root, const CollectiveOptions& o = {});
  /// recv (count * size() elements) = concatenation of every rank's send (count each).
  Request iall_gather(const void* send, void* recv, std::size_t count, DataType t,
                      const CollectiveOptions& o = {});
  /// send has `count` elements on every rank; rank r receives block r (block_of(count,
  /// size(), r)) of their element-wise reduction in recv.
  Request ireduce_scatter(const void* send, void* recv, std::size_t count, DataType t,
                          ReduceOp op, const CollectiveOptions& o = {});
  /// send holds size() blocks of `count` elements; block j goes to rank j, and recv block
  /// i comes from rank i.
  Request iall_to_all(const void* send, void* recv, std::size_t count, DataType t,
                      const CollectiveOptions& o = {});
  /// recv at root (count * size() elements) = concatenation of every rank's send.
  Request igather(const void* send, void* recv, std::size_t count, DataType t, int root,
                  const CollectiveOptions& o = {});
  /// Block r (count elements) of root's send goes to rank r's recv.
  Request iscatter(const void* send, void* recv, std::size_t count, DataType t, int root,
                   const CollectiveOptions& o = {});
  /// recv on rank r = op over ranks 0..r of send (inclusive prefix); for avg, the sum over
  /// ranks 0..r divided by r + 1.
  Request iscan(const void* send, void* recv, std::size_t count, DataType t, ReduceOp op,
                const CollectiveOptions& o = {});
  /// recv on rank r = op over ranks 0..r-1 of send (avg: divided by r); rank 0's recv is
  /// left unchanged.
  Request iexclusive_scan(const void* send, void* recv, std::size_t count, DataType t,
                          ReduceOp op, const CollectiveOptions& o = {});
  /// Completes once every rank has entered it.
  Request ibarrier(const CollectiveOptions& o = {});

  /// Variable-size forms: counts[i] / displs[i] (in elements) describe rank i's part of
  /// the concatenated buffer; `counts` and `displs` have size() entries.
  Request iall_gather_v(const void* send, std::size_t send_count, void* recv,
                        std::span<const std::size_t> counts, std::span<const std::size_t> displs,
                        DataType t, const CollectiveOptions& o = {});
  Request igather_v(const void* send, std::size_t send_count, void* recv,
                    std::span<const std::size_t> counts, std::span<const std::size_t> displs,
                    DataType t, int root, const CollectiveOptions& o = {});
  Request iscatter_v(const void* send, std::span<const std::size_t> counts,
                     std::span<const std::size_t> displs, void* recv, std::size_t recv_count,
                     DataType t, int root, const CollectiveOptions& o = {});
  Request iall_to_all_v(const void* send, std::span<const std::size_t> send_counts,
                        std::span<const std::size_t> send_displs, void* recv,
                        std::span<const std::size_t> recv_counts,
                        std::span<const std::size_t> recv_displs, DataType t,
                        const CollectiveOptions& o = {});

  /// Fused all_reduce of many buffers (e.g. a model's gradients) as one operation: the
  /// buffers are reduced in place, each with its own count, all of dtype `t`.
  Request iall_reduce_bucketed(std::span<const MutableBuffer> buffers, DataType t, ReduceOp op,
                               const CollectiveOptions& o = {});
  /// all_reduce as an explicit reduce-scatter + all-gather (ring). If `shard` is not null
  /// it receives this rank's reduced block (block_of(count, size(), rank()) elements) as
  /// soon as the reduce-scatter phase ends; if `recv` is null the all-gather is skipped
  /// (a pure reduce-scatter into `shard`, as ZeRO-style optimizers want).
  Request iall_reduce_sharded(const void* send, void* recv, void* shard, std::size_t count,
                              DataType t, ReduceOp op, const CollectiveOptions& o = {});

  /// Compressed all_reduce with error feedback, in place on `data` (f32 or f64; op sum or
  /// avg). Each rank adds its residual to `data`, sends only k = ceil(ratio * count)
  /// elements chosen by `state`'s compression, and keeps what it did not send as the new
  /// residual. On return `data` holds, on every rank identically, the reduction of what
  /// was sent (zero elsewhere). Errors: invalid_argument for another dtype or op, a ratio
  /// outside (0, 1], or a count different from the state's previous one.
  Request iall_reduce_compressed(void* data, std::size_t count, DataType t, ReduceOp op,
                                 ErrorFeedback& state, const CollectiveOptions& o = {});

  /// Blocking forms: the non-blocking call followed by wait().
  void all_reduce(const void* send, void* recv, std::size_t count, DataType t, ReduceOp op,
                  const CollectiveOptions& o = {}) {
    BlockingCall b;
    iall_reduce(send, recv, count, t, op, o).wait();
  }
  void broadcast(void* buf, std::size_t count, DataType t, int root, const CollectiveOptions& o = {}) {
    BlockingCall b;
    ibroadcast(buf, count, t, root, o).wait();
  }
  void reduce(const void* send, void* recv, std::size_t count, DataType t, ReduceOp op, int root,
              const CollectiveOptions& o = {}) {
    BlockingCall b;
    ireduce(send, recv, count, t, op, root, o).wait();
  }
  void all_gather(const void* send, void* recv, std::size_t count, DataType t,
                  const CollectiveOptions& o = {}) {
    BlockingCall b;
    iall_gather(send, recv, count, t, o).wait();
  }
  void reduce_scatter(const void* send, void* recv, std::size_t count, DataType t, ReduceOp op,
                      const CollectiveOptions& o = {}) {
    BlockingCall b;
    ireduce_scatter(send, recv, count, t, op, o).wait();
  }
  void all_to_all(const void* send, void* recv, std::size_t count, DataType t,
                  const CollectiveOptions& o = {}) {
    BlockingCall b;
    iall_to_all(send, recv, count, t, o).wait();
  }
  void gather(const void* send, void* recv, std::size_t count, DataType t, int root,
              const CollectiveOptions& o = {}) {
    BlockingCall b;
    igather(send, recv, count, t, root, o).wait();
  }
  void scatter(const void* send, void* recv, std::size_t count, DataType t, int root,
               const CollectiveOptions& o = {}) {
    BlockingCall b;
    iscatter(send, recv, count, t, root, o).wait();
  }
  void scan(const void* send, void* recv, std::size_t count, DataType t, ReduceOp op,
            const CollectiveOptions& o = {}) {
    BlockingCall b;
    iscan(send, recv, count, t, op, o).wait();
  }
  void exclusive_scan(const void* send, void* recv, std::size_t count, DataType t, ReduceOp op,
                      const CollectiveOptions& o = {}) {
    BlockingCall b;
    iexclusive_scan(send, recv, count, t, op, o).wait();
  }
  void barrier(const CollectiveOptions& o = {}) {
    BlockingCall b;
    ibarrier(o).wait();
  }

  /// Typed conveniences (sizes checked: recv must hold what the collective writes).
  template <class T>
  void all_reduce(std::span<T> data, ReduceOp op, const CollectiveOptions& o = {}) {
    all_reduce(data.data(), data.data(), data.size(), dtype_of_v<T>, op, o);
  }
  template <class T>
  void all_reduce(std::span<const T> send, std::span<T> recv, ReduceOp op,
                  const CollectiveOptions& o = {}) {
    check_span_size("all_reduce", recv.size(), send.size());
    all_reduce(send.data(), recv.data(), send.size(), dtype_of_v<T>, op, o);
  }
  template <class T>
  void broadcast(std::span<T> data, int root, const CollectiveOptions& o = {}) {
    broadcast(data.data(), data.size(), dtype_of_v<T>, root, o);
  }
  template <class T>
  void all_gather(std::span<const T> send, std::span<T> recv, const CollectiveOptions& o = {}) {
    check_span_size("all_gather", recv.size(), send.size() * static_cast<std::size_t>(size()));
    all_gather(send.data(), recv.data(), send.size(), dtype_of_v<T>, o);
  }
  template <class T>
  void reduce_scatter(std::span<const T> send, std::span<T> recv, ReduceOp op,
                      const CollectiveOptions& o = {}) {
    check_span_size("reduce_scatter", recv.size(), block_of(send.size(), size(), rank()).second);
    reduce_scatter(send.data(), recv.data(), send.size(), dtype_of_v<T>, op, o);
  }
  /// recv must hold send.size() elements at `root`; it is not touched (may be empty)
  /// elsewhere.
  template <class T>
  void reduce(std::span<const T> send, std::span<T> recv, ReduceOp op, int root,
              const CollectiveOptions& o = {}) {
    if (rank() == root) check_span_size("reduce", recv.size(), send.size());
    reduce(send.data(), recv.data(), send.size(), dtype_of_v<T>, op, root, o);
  }
  /// send holds size() equal blocks; recv as many elements.
  template <class T>
  void all_to_all(std::span<const T> send, std::span<T> recv, const CollectiveOptions& o = {}) {
    const auto n = static_cast<std::size_t>(size());
    check_span_size("all_to_all", n * (send.size() / n), send.size());
    check_span_size("all_to_all", recv.size(), send.size());
    all_to_all(send.data(), recv.data(), send.size() / n, dtype_of_v<T>, o);
  }
  /// recv must hold size() * send.size() elements at `root`.
  template <class T>
  void gather(std::span<const T> send, std::span<T> recv, int root, const CollectiveOptions& o = {}) {
    if (rank() == root)
      check_span_size("gather", recv.size(), send.size() * static_cast<std::size_t>(size()));
    gather(send.data(), recv.data(), send.size(), dtype_of_v<T>, root, o);
  }
  /// send must hold size() * recv.size() elements at `root`.
  template <class T>
  void scatter(std::span<const T> send, std::span<T> recv, int root, const CollectiveOptions& o = {}) {
    if (rank() == root)
      check_span_size("scatter", send.size(), recv.size() * static_cast<std::size_t>(size()));
    scatter(send.data(), recv.data(), recv.size(), dtype_of_v<T>, root, o);
  }
  template <class T>
  void scan(std::span<const T> send, std::span<T> recv, ReduceOp op, const CollectiveOptions& o = {}) {
    check_span_size("scan", recv.size(), send.size());
    scan(send.data(), recv.data(), send.size(), dtype_of_v<T>, op, o);
  }

  // ---- lifetime ------------------------------------------------------------------------

  /// On the world communicator: closes every connection (telling peers, whose operations
  /// on this rank then fail with peer_closed), fails this rank's pending operations with
  /// Errc::closed, and releases sockets, threads and buffers. On a communicator made by
  /// split(): only that communicator stops accepting calls. Idempotent. The connections
  /// are also closed when the last communicator of this rank is destroyed.
  void close();

  /// True until close().
  bool is_open() const;

  /// Internal, for the library's own use.
  const std::shared_ptr<detail::Group>& group() const noexcept { return group_; }

 private:
  static void check_element_multiple(const Status& s, std::size_t elem);
  /// Marks the calling thread as about to wait for the collective it starts, so the
  /// collective thread is not woken for it: the caller runs it itself.
  struct BlockingCall {
    BlockingCall() noexcept;
    ~BlockingCall();
    BlockingCall(const BlockingCall&) = delete;
    BlockingCall& operator=(const BlockingCall&) = delete;
  };
  /// Throws invalid_argument unless `have` >= `need` elements.
  static void check_span_size(const char* op, std::size_t have, std::size_t need);
  detail::Group& self() const;

  std::shared_ptr<detail::Group> group_;
};

/// Creates `n` communicators in this process, ranks 0..n-1, each with its own UDP socket
/// on 127.0.0.1 and its own progress thread, fully connected over real QUIC with mutual
/// TLS rooted in a fresh in-memory cluster CA. With more ranks than cores, waiting threads
/// do not spin (Config::spin is taken as 0). Throws nexar::Error on failure
/// (invalid_argument for n < 1, io, tls, timeout).
std::vector<Communicator> bootstrap_local(int n, const Config& config = Config::from_env());

}  // namespace nexar
