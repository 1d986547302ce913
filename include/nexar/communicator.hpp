// nexar — the communicator: a set of ranks connected over QUIC.
#pragma once

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <ranges>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <nexar/buffer.hpp>
#include <nexar/collective.hpp>
#include <nexar/compression.hpp>
#include <nexar/config.hpp>
#include <nexar/dtype.hpp>
#include <nexar/error.hpp>
#include <nexar/recorder.hpp>
#include <nexar/request.hpp>
#include <nexar/rpc.hpp>
#include <nexar/stats.hpp>

namespace nexar {

namespace detail {
class CollectivePort;
class CommunicatorImpl;
struct Access;
}  // namespace detail

/// Element types that point-to-point calls carry: trivially copyable, not pointers (a
/// pointer means nothing in another process).
template <class T>
concept Trivial = std::is_trivially_copyable_v<T> && !std::is_pointer_v<T>;

/// A range a call reads from: contiguous and sized, such as std::vector, std::array,
/// std::string, a C array or a std::span (of const elements or not).
template <class R>
concept ContiguousRange = std::ranges::contiguous_range<R> && std::ranges::sized_range<R>;

/// A range whose storage outlives the call: an lvalue, or a view such as std::span passed by
/// value. Non-blocking calls take their ranges this way, since the data must stay valid until
/// the Request completes; a temporary std::vector is refused.
template <class R>
concept BorrowedContiguousRange = ContiguousRange<R> && std::ranges::borrowed_range<R>;

/// A range a call writes to: borrowed (see above) with non-const elements. A const
/// container, a std::span<const T> or a temporary container is not one.
template <class R>
concept WritableContiguousRange =
    BorrowedContiguousRange<R> &&
    !std::is_const_v<std::remove_reference_t<std::ranges::range_reference_t<R>>>;

/// The element type of a range.
template <class R>
using range_element_t = std::ranges::range_value_t<R>;

/// What typed point-to-point calls take: ranges as above of Trivial elements.
template <class R>
concept SendRange = ContiguousRange<R> && Trivial<range_element_t<R>>;
template <class R>
concept BorrowedSendRange = BorrowedContiguousRange<R> && Trivial<range_element_t<R>>;
template <class R>
concept RecvRange = WritableContiguousRange<R> && Trivial<range_element_t<R>>;

/// What typed collectives take: ranges as above of elements with a DataType (HasDataType,
/// in dtype.hpp).
template <class R>
concept CollectiveInput = ContiguousRange<R> && HasDataType<range_element_t<R>>;
template <class R>
concept BorrowedCollectiveInput = BorrowedContiguousRange<R> && HasDataType<range_element_t<R>>;
template <class R>
concept CollectiveOutput = WritableContiguousRange<R> && HasDataType<range_element_t<R>>;
/// The input and output of one collective hold the same element type.
template <class In, class Out>
concept SameElementType = std::same_as<range_element_t<In>, range_element_t<Out>>;

/// A set of `size()` ranks, each holding one Communicator. Each pair of ranks is connected
/// over QUIC (Config::connections_per_peer connections between hosts, 4 by default; one
/// inside a host, whose message lanes move to shared memory), with independent lanes:
/// control, data, RPC request, RPC response, bulk and collective.
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
  /// An empty communicator (is_open() is false); every other call throws. Communicators
  /// come from bootstrap_local(), join(), join_from_env() and split().
  Communicator() = default;

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

  /// Typed forms: `data` is any contiguous range of a Trivial element type (std::vector,
  /// std::array, a C array, std::span, ...; SendRange), written to only by receives
  /// (RecvRange: not const); sizes are counted in bytes on the wire. Non-blocking forms
  /// take ranges whose storage outlives the call (BorrowedSendRange: lvalues or spans).
  /// Contract and errors as the byte forms above.
  template <SendRange R>
  void send(int dest, int tag, R&& data) {
    const std::span s(data);
    send(dest, tag, s.data(), s.size_bytes());
  }
  template <BorrowedSendRange R>
  Request isend(int dest, int tag, R&& data) {
    const std::span s(data);
    return isend(dest, tag, s.data(), s.size_bytes());
  }
  /// Typed receive into a writable range. Besides recv()'s errors, throws invalid_argument
  /// if the message size is not a multiple of the element size; the Status counts bytes.
  template <RecvRange R>
  Status recv(int source, int tag, R&& data) {
    const std::span s(data);
    Status st = recv(source, tag, s.data(), s.size_bytes());
    check_element_multiple("recv", st, sizeof(range_element_t<R>));
    return st;
  }
  /// Typed non-blocking receive. The Status of the Request counts bytes; a message that is
  /// not a whole number of elements is not detected here (compare status().bytes).
  template <RecvRange R>
  Request irecv(int source, int tag, R&& data) {
    const std::span s(data);
    return irecv(source, tag, s.data(), s.size_bytes());
  }

  // ---- point-to-point, bulk lane --------------------------------------------------------

  /// Sends a large message on the bulk lane. Bulk traffic has its own matching space (a
  /// bulk_recv never matches a send, and a recv never matches a bulk_send), its own QUIC
  /// stream per peer, written only when no other lane has data to send, and its own
  /// unexpected-message budget, so a multi-gigabyte transfer (or one the receiver has not
  /// taken yet) never delays control, data, RPC or collective traffic: collectives have a
  /// lane of their own. Contract and errors as send(); messages name the operation
  /// "bulk_send".
  void bulk_send(int dest, int tag, const void* data, std::size_t bytes);
  /// Non-blocking bulk_send; `data` must stay valid until the Request completes.
  Request ibulk_send(int dest, int tag, const void* data, std::size_t bytes);
  /// Receives from the bulk lane; contract and errors as recv(), named "bulk_recv".
  Status bulk_recv(int source, int tag, void* data, std::size_t capacity);
  /// Non-blocking bulk_recv; `data` must stay valid until the Request completes.
  Request ibulk_recv(int source, int tag, void* data, std::size_t capacity);

  /// Typed bulk-lane forms, as the typed send/isend/recv/irecv.
  template <SendRange R>
  void bulk_send(int dest, int tag, R&& data) {
    const std::span s(data);
    bulk_send(dest, tag, s.data(), s.size_bytes());
  }
  template <BorrowedSendRange R>
  Request ibulk_send(int dest, int tag, R&& data) {
    const std::span s(data);
    return ibulk_send(dest, tag, s.data(), s.size_bytes());
  }
  template <RecvRange R>
  Status bulk_recv(int source, int tag, R&& data) {
    const std::span s(data);
    Status st = bulk_recv(source, tag, s.data(), s.size_bytes());
    check_element_multiple("bulk_recv", st, sizeof(range_element_t<R>));
    return st;
  }
  template <RecvRange R>
  Request ibulk_recv(int source, int tag, R&& data) {
    const std::span s(data);
    return ibulk_recv(source, tag, s.data(), s.size_bytes());
  }

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

  /// The ranks of this communicator, in its numbering, ascending, that this rank holds a
  /// direct connection to (its neighbours under Config::topology): every other rank when
  /// the topology is full_mesh. Messages to the rest travel through relays. A property of
  /// the topology, not of liveness: a failed neighbour stays listed. Errors: closed.
  std::vector<int> neighbours() const;

  /// The ranks of this communicator, in its numbering, ascending, that this rank holds a
  /// working connection of its own to right now: its neighbours once formed, and under
  /// Config::lazy_connect only those it has exchanged messages with so far (the set grows
  /// as it is used). A failed or departed rank is not listed. Errors: closed.
  std::vector<int> connected_peers() const;

  // ---- diagnosis -----------------------------------------------------------------------

  /// This rank's flight recorder of the communicator: its last Config::recorder_ops
  /// collectives, oldest first, with their numbers, calls, times and states (OpRecord).
  /// Safe from any thread while collectives run; never blocks them. Errors: invalid_argument
  /// for an empty Communicator.
  std::vector<OpRecord> recorder() const;
  /// The same as one JSON object, for logs and tools: {"comm", "rank", "size", "called",
  /// "completed", "ops": [...]}, each op with the OpRecord fields and its times in
  /// microseconds since the Unix epoch (null until reached). README, "Diagnosing a job".
  std::string dump() const;
  /// What this communicator's collectives cost on this rank, per kind (count, bytes, time,
  /// and the part of it spent waiting for members), and how the path to each other member
  /// behaves (RTT, congestion window, lost packets, bytes per lane, the links that carry
  /// it); see Stats. Takes the rank's engine lock briefly; any thread. Errors:
  /// invalid_argument for an empty Communicator.
  Stats stats() const;

  // ---- failures ----------------------------------------------------------------------
  //
  // A member that fails is declared failed by the first rank that notices (its port is
  // unreachable, or nothing arrived from it for Config::failure_timeout), and every live
  // member of every communicator containing it learns so within a round trip. Each such
  // communicator is then revoked: its pending and later operations fail with
  // Errc::rank_failed naming the failed rank(s) in its numbering, except agree() and
  // shrink(). Communicators without the failed rank are untouched. What happens next is
  // Config::on_failure (see FailurePolicy).

  /// World rank of each member: world_ranks()[r] is rank r's rank in the world communicator.
  std::vector<int> world_ranks() const;

  /// Members known to have failed, in this communicator's numbering, ascending. Local
  /// knowledge: another member may learn of a failure a moment earlier or later; agree()
  /// makes it common.
  std::vector<int> failed_ranks() const;

  /// True once the communicator was revoked, by a failed member or by revoke().
  bool is_revoked() const;

  /// Calls `fn` with the communicator's failed ranks (as failed_ranks()) each time a member
  /// is newly found failed, and with an empty list when the communicator is revoked by
  /// revoke(). It runs on a nexar thread of its own, never inside the failing operation,
  /// and may call any function of this communicator. Replaces the previous callback;
  /// an empty function removes it. Once this returns, the previous callback never starts
  /// again, and a call of it that was running has returned (unless this is called from
  /// that callback itself), so the callback may refer to objects that die after its
  /// removal. Under FailurePolicy::automatic the rebuilt communicator keeps the callback.
  void on_failure(std::function<void(const std::vector<int>& failed)> fn);

  /// Revokes the communicator on every member, without waiting for them: their pending and
  /// later operations on it fail with Errc::revoked (agree() and shrink() still work).
  /// For an application that found a fault nexar cannot see (a bad gradient, a lost
  /// worker thread) and wants every member to stop and recover together. Idempotent.
  void revoke();

  /// What agree() decided.
  struct Agreement {
    /// Bitwise AND of the values passed by every member that is not in `failed`.
    std::uint64_t value = 0;
    /// The members all survivors agree have failed, in this communicator's numbering,
    /// ascending.
    std::vector<int> failed;
  };

  /// Fault-tolerant agreement, collective over the live members, usable on a revoked
  /// communicator. Every live member returns the same Agreement, even when members
  /// (whichever rank coordinates included) fail during the call; it returns once the
  /// members that did not fail have all called it. Calls are numbered: every member must
  /// call agree() (and shrink(), which agrees inside) in the same order. The algorithm and
  /// its guarantee are in docs/ARCHITECTURE.md.
  /// Errors: invalid_argument under FailurePolicy::abort; rank_failed when this rank was
  /// itself declared failed by the others; timeout (Config::op_timeout) when a live member
  /// never calls it; closed.
  Agreement agree(std::uint64_t value = ~std::uint64_t{0});

  /// Collective over the live members, usable on a revoked communicator: agrees on the
  /// failed set and returns a new communicator of the others, ranked in their old order,
  /// with a fresh id, ready for every operation (RPC handlers are not carried over). May be
  /// called again on the result, any number of times; works on split communicators.
  /// Errors: as agree().
  Communicator shrink() const;

  // ---- elastic membership --------------------------------------------------------------
  //
  // In an elastic job (a seed with SeedOptions::elastic, NEXAR_ELASTIC=1, or nexar-run
  // --elastic / --max-restarts) the seed keeps admitting nodes after the world formed. A
  // node that joins then (join(), join_from_env()) is connected to by every member and
  // waits; the members admit it when the application chooses, by calling grow() together,
  // typically between steps. The joiner's join call returns at that moment with its rank in
  // the grown communicator. Members leave the same way: leave() on the leaving rank
  // matches the others' grow(). Failures are handled as everywhere (shrink() or grow()
  // drops failed members). The protocol and its guarantees are in docs/ARCHITECTURE.md.

  /// Joiners waiting for admission that this rank is connected to: what grow() would
  /// admit if every member saw the same. Local knowledge, like failed_ranks(); to act on
  /// it together, agree on it (e.g. an all_reduce of the count, or agree()).
  int pending_joiners() const;

  /// Collective over the members (fault-tolerant, like shrink()): admits every waiting
  /// joiner that all live members are connected to, and removes the members that call
  /// leave() at this point and those that failed. Returns the new communicator: the
  /// remaining members keep their order, then the joiners in the order they joined; its id
  /// is fresh. Each admitted joiner's join call returns its own handle to the same
  /// communicator; what it needs to catch up (a step, a model) is ordinary communication
  /// on it, for example a broadcast from rank 0. A joiner that fails during grow is dropped
  /// or, if it fails just after the decision, makes the new communicator revoked like any
  /// failed member, so shrink() removes it. grow(), leave(), agree() and shrink() are
  /// numbered alike: every member calls them in the same order. One mix is allowed: a
  /// member may call grow() where another calls shrink() (for instance when the automatic
  /// policy's in-place rebuild on one member meets a grow the others decided before they saw
  /// the failure); the shrinking member contributes no joiners, so nobody is admitted and
  /// both get the communicator shrink() returns (a leave() met by a shrink() is honoured
  /// too). Grow one line of communicators at a time (the one holding the job's members): a
  /// joiner enters one communicator, and two grows admitting it at once would disagree.
  /// Works in a job that is not elastic too (then nobody joins; leavers still leave), and
  /// under every failure policy. This communicator stays usable.
  /// Errors: rank_failed when this rank was declared failed by the others; timeout
  /// (Config::op_timeout) when a live member never calls grow() or leave(); closed.
  Communicator grow() const;

  /// This rank leaves the communicator in an orderly way: collective with the other
  /// members' grow(), whose result does not contain it. Returns once that is decided; the
  /// communicator stays open (close() it, or keep using others this rank belongs to).
  /// Errors: as grow().
  void leave();

  /// True for the communicator a join into a running (elastic) job returned, and only for
  /// it: the application's cue to receive the state the members send (see grow()).
  bool joined_by_grow() const;

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

  /// Blocking forms: the non-blocking call followed by wait(), in effect. When every rank
  /// of the communicator shares memory with every other (one host, Config::shm),
  /// all_reduce, reduce_scatter and all_gather (up to Config::shm_collective_bytes per
  /// rank; with 2 ranks up to 128 KiB), broadcast (up to 256 KiB) and barrier calls
  /// (algorithm automatic) go through mailboxes in shared memory, and the blocking forms
  /// run them in the calling thread; a blocking call still meets a non-blocking one on
  /// another rank. Contracts and errors as the non-blocking forms.
  void all_reduce(const void* send, void* recv, std::size_t count, DataType t, ReduceOp op,
                  const CollectiveOptions& o = {});
  void broadcast(void* buf, std::size_t count, DataType t, int root, const CollectiveOptions& o = {});
  void reduce(const void* send, void* recv, std::size_t count, DataType t, ReduceOp op, int root,
              const CollectiveOptions& o = {}) {
    BlockingCall b;
    ireduce(send, recv, count, t, op, root, o).wait();
  }
  void all_gather(const void* send, void* recv, std::size_t count, DataType t,
                  const CollectiveOptions& o = {});
  void reduce_scatter(const void* send, void* recv, std::size_t count, DataType t, ReduceOp op,
                      const CollectiveOptions& o = {});
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
  void barrier(const CollectiveOptions& o = {});

  // ---- typed collectives ---------------------------------------------------------------
  //
  // Ranges are contiguous ranges (std::vector, std::array, C arrays, std::span, ...) of an
  // element type with a DataType (HasDataType: float, double, half, bfloat16, and the 8-,
  // 32- and 64-bit integers); the count and DataType come from the ranges. An input and an
  // output range of one call have the same element type. Inputs may be const; outputs must
  // be writable (a non-const lvalue or a std::span<T>), so a const container never binds
  // to an output. Non-blocking forms take only ranges whose storage outlives the call.
  //
  // Sizes are checked before anything starts: each form below states what its ranges must
  // hold, and a range too small (or, for all_to_all, not a whole number of blocks) throws
  // Errc::invalid_argument naming the collective ("all_gather: recv holds 3 elements, 8
  // needed"). Outputs may be larger than needed; the rest is left untouched. Otherwise
  // contract and errors as the untyped forms. Each blocking form is its i-form followed
  // by wait(), but for all_reduce and broadcast, which call the untyped blocking forms.

  /// In place: `data` is replaced by its element-wise reduction over the ranks.
  template <CollectiveOutput R>
  Request iall_reduce(R&& data, ReduceOp op, const CollectiveOptions& o = {}) {
    const std::span d(data);
    return iall_reduce(d.data(), d.data(), d.size(), dtype_of_v<range_element_t<R>>, op, o);
  }
  /// recv (at least send.size() elements) = reduction of send over the ranks.
  template <BorrowedCollectiveInput In, CollectiveOutput Out>
    requires SameElementType<In, Out>
  Request iall_reduce(In&& send, Out&& recv, ReduceOp op, const CollectiveOptions& o = {}) {
    const std::span s(send);
    const std::span r(recv);
    check_size("all_reduce", "recv", r.size(), s.size());
    return iall_reduce(s.data(), r.data(), s.size(), dtype_of_v<range_element_t<In>>, op, o);
  }
  /// `data` of `root` is copied to every rank's `data`; every rank passes the same size.
  template <CollectiveOutput R>
  Request ibroadcast(R&& data, int root, const CollectiveOptions& o = {}) {
    const std::span d(data);
    return ibroadcast(d.data(), d.size(), dtype_of_v<range_element_t<R>>, root, o);
  }
  /// recv at `root` (at least send.size() elements) = reduction of send over the ranks;
  /// recv is not touched, and may be empty, elsewhere.
  template <BorrowedCollectiveInput In, CollectiveOutput Out>
    requires SameElementType<In, Out>
  Request ireduce(In&& send, Out&& recv, ReduceOp op, int root, const CollectiveOptions& o = {}) {
    const std::span s(send);
    const std::span r(recv);
    if (rank() == root) check_size("reduce", "recv", r.size(), s.size());
    return ireduce(s.data(), r.data(), s.size(), dtype_of_v<range_element_t<In>>, op, root, o);
  }
  /// recv (at least size() * send.size() elements) = concatenation of every rank's send.
  template <BorrowedCollectiveInput In, CollectiveOutput Out>
    requires SameElementType<In, Out>
  Request iall_gather(In&& send, Out&& recv, const CollectiveOptions& o = {}) {
    const std::span s(send);
    const std::span r(recv);
    check_size("all_gather", "recv", r.size(), s.size() * static_cast<std::size_t>(size()));
    return iall_gather(s.data(), r.data(), s.size(), dtype_of_v<range_element_t<In>>, o);
  }
  /// recv on rank r (at least block_of(send.size(), size(), r).second elements) = block r of
  /// the element-wise reduction of send over the ranks.
  template <BorrowedCollectiveInput In, CollectiveOutput Out>
    requires SameElementType<In, Out>
  Request ireduce_scatter(In&& send, Out&& recv, ReduceOp op, const CollectiveOptions& o = {}) {
    const std::span s(send);
    const std::span r(recv);
    check_size("reduce_scatter", "recv", r.size(), block_of(s.size(), size(), rank()).second);
    return ireduce_scatter(s.data(), r.data(), s.size(), dtype_of_v<range_element_t<In>>, op, o);
  }
  /// send holds size() equal blocks (its size a multiple of size()); block j goes to rank
  /// j. recv (at least send.size() elements) gets block i from rank i.
  template <BorrowedCollectiveInput In, CollectiveOutput Out>
    requires SameElementType<In, Out>
  Request iall_to_all(In&& send, Out&& recv, const CollectiveOptions& o = {}) {
    const std::span s(send);
    const std::span r(recv);
    const auto n = static_cast<std::size_t>(size());
    check_blocks("all_to_all", "send", s.size(), n);
    check_size("all_to_all", "recv", r.size(), s.size());
    return iall_to_all(s.data(), r.data(), s.size() / n, dtype_of_v<range_element_t<In>>, o);
  }
  /// recv at `root` (at least size() * send.size() elements) = concatenation of every
  /// rank's send; recv is not touched, and may be empty, elsewhere.
  template <BorrowedCollectiveInput In, CollectiveOutput Out>
    requires SameElementType<In, Out>
  Request igather(In&& send, Out&& recv, int root, const CollectiveOptions& o = {}) {
    const std::span s(send);
    const std::span r(recv);
    if (rank() == root)
      check_size("gather", "recv", r.size(), s.size() * static_cast<std::size_t>(size()));
    return igather(s.data(), r.data(), s.size(), dtype_of_v<range_element_t<In>>, root, o);
  }
  /// Block r (recv.size() elements) of root's send goes to rank r's recv; every rank passes
  /// the same recv size. send must hold size() * recv.size() elements at `root`; it is not
  /// read, and may be empty, elsewhere.
  template <BorrowedCollectiveInput In, CollectiveOutput Out>
    requires SameElementType<In, Out>
  Request iscatter(In&& send, Out&& recv, int root, const CollectiveOptions& o = {}) {
    const std::span s(send);
    const std::span r(recv);
    if (rank() == root)
      check_size("scatter", "send", s.size(), r.size() * static_cast<std::size_t>(size()));
    return iscatter(s.data(), r.data(), r.size(), dtype_of_v<range_element_t<In>>, root, o);
  }
  /// recv (at least send.size() elements) on rank r = reduction of send over ranks 0..r.
  template <BorrowedCollectiveInput In, CollectiveOutput Out>
    requires SameElementType<In, Out>
  Request iscan(In&& send, Out&& recv, ReduceOp op, const CollectiveOptions& o = {}) {
    const std::span s(send);
    const std::span r(recv);
    check_size("scan", "recv", r.size(), s.size());
    return iscan(s.data(), r.data(), s.size(), dtype_of_v<range_element_t<In>>, op, o);
  }
  /// recv (at least send.size() elements) on rank r = reduction of send over ranks
  /// 0..r-1; rank 0's recv is left unchanged.
  template <BorrowedCollectiveInput In, CollectiveOutput Out>
    requires SameElementType<In, Out>
  Request iexclusive_scan(In&& send, Out&& recv, ReduceOp op, const CollectiveOptions& o = {}) {
    const std::span s(send);
    const std::span r(recv);
    check_size("exclusive_scan", "recv", r.size(), s.size());
    return iexclusive_scan(s.data(), r.data(), s.size(), dtype_of_v<range_element_t<In>>, op, o);
  }

  /// Blocking typed forms: the i-form above followed by wait(). Inputs may be temporaries.
  template <CollectiveOutput R>
  void all_reduce(R&& data, ReduceOp op, const CollectiveOptions& o = {}) {
    const std::span d(data);
    all_reduce(d.data(), d.data(), d.size(), dtype_of_v<range_element_t<R>>, op, o);
  }
  template <CollectiveInput In, CollectiveOutput Out>
    requires SameElementType<In, Out>
  void all_reduce(In&& send, Out&& recv, ReduceOp op, const CollectiveOptions& o = {}) {
    const std::span s(send);
    const std::span r(recv);
    check_size("all_reduce", "recv", r.size(), s.size());
    all_reduce(s.data(), r.data(), s.size(), dtype_of_v<range_element_t<In>>, op, o);
  }
  template <CollectiveOutput R>
  void broadcast(R&& data, int root, const CollectiveOptions& o = {}) {
    const std::span d(data);
    broadcast(d.data(), d.size(), dtype_of_v<range_element_t<R>>, root, o);
  }
  template <CollectiveInput In, CollectiveOutput Out>
    requires SameElementType<In, Out>
  void reduce(In&& send, Out&& recv, ReduceOp op, int root, const CollectiveOptions& o = {}) {
    BlockingCall b;
    ireduce(send, recv, op, root, o).wait();
  }
  template <CollectiveInput In, CollectiveOutput Out>
    requires SameElementType<In, Out>
  void all_gather(In&& send, Out&& recv, const CollectiveOptions& o = {}) {
    const std::span s(send);
    const std::span r(recv);
    check_size("all_gather", "recv", r.size(), s.size() * static_cast<std::size_t>(size()));
    all_gather(s.data(), r.data(), s.size(), dtype_of_v<range_element_t<In>>, o);
  }
  template <CollectiveInput In, CollectiveOutput Out>
    requires SameElementType<In, Out>
  void reduce_scatter(In&& send, Out&& recv, ReduceOp op, const CollectiveOptions& o = {}) {
    const std::span s(send);
    const std::span r(recv);
    check_size("reduce_scatter", "recv", r.size(), block_of(s.size(), size(), rank()).second);
    reduce_scatter(s.data(), r.data(), s.size(), dtype_of_v<range_element_t<In>>, op, o);
  }
  template <CollectiveInput In, CollectiveOutput Out>
    requires SameElementType<In, Out>
  void all_to_all(In&& send, Out&& recv, const CollectiveOptions& o = {}) {
    BlockingCall b;
    iall_to_all(send, recv, o).wait();
  }
  template <CollectiveInput In, CollectiveOutput Out>
    requires SameElementType<In, Out>
  void gather(In&& send, Out&& recv, int root, const CollectiveOptions& o = {}) {
    BlockingCall b;
    igather(send, recv, root, o).wait();
  }
  template <CollectiveInput In, CollectiveOutput Out>
    requires SameElementType<In, Out>
  void scatter(In&& send, Out&& recv, int root, const CollectiveOptions& o = {}) {
    BlockingCall b;
    iscatter(send, recv, root, o).wait();
  }
  template <CollectiveInput In, CollectiveOutput Out>
    requires SameElementType<In, Out>
  void scan(In&& send, Out&& recv, ReduceOp op, const CollectiveOptions& o = {}) {
    BlockingCall b;
    iscan(send, recv, op, o).wait();
  }
  template <CollectiveInput In, CollectiveOutput Out>
    requires SameElementType<In, Out>
  void exclusive_scan(In&& send, Out&& recv, ReduceOp op, const CollectiveOptions& o = {}) {
    BlockingCall b;
    iexclusive_scan(send, recv, op, o).wait();
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

 private:
  friend struct detail::Access;
  explicit Communicator(std::shared_ptr<detail::CommunicatorImpl> impl);

  /// Throws invalid_argument (naming `op`) unless the message is a whole number of
  /// `elem`-byte elements.
  static void check_element_multiple(const char* op, const Status& s, std::size_t elem);
  /// Marks the calling thread as about to wait for the collective it starts, so the
  /// collective thread is not woken for it: the caller runs it itself.
  struct BlockingCall {
    BlockingCall() noexcept;
    ~BlockingCall();
    BlockingCall(const BlockingCall&) = delete;
    BlockingCall& operator=(const BlockingCall&) = delete;
  };
  /// Throws invalid_argument naming `op` and the range `which` unless `have` >= `need`
  /// elements.
  static void check_size(const char* op, const char* which, std::size_t have, std::size_t need);
  /// Throws invalid_argument naming `op` and the range `which` unless `have` elements split
  /// into `blocks` equal blocks.
  static void check_blocks(const char* op, const char* which, std::size_t have, std::size_t blocks);
  detail::CommunicatorImpl& self() const;
  /// What the collectives see of this communicator; each collective's file in
  /// src/collective defines its member functions over it.
  detail::CollectivePort& port() const;

  std::shared_ptr<detail::CommunicatorImpl> impl_;
};

}  // namespace nexar
