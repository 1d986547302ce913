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

#include <nexar/config.hpp>
#include <nexar/error.hpp>
#include <nexar/request.hpp>

namespace nexar {

namespace detail {
class CommImpl;
}

/// Element types that may be sent as typed spans.
template <class T>
concept Trivial = std::is_trivially_copyable_v<T> && !std::is_pointer_v<T>;

/// One piece of a gather list for send_iov.
struct ConstBuffer {
  const void* data = nullptr;
  std::size_t bytes = 0;
};

/// Identifier of an RPC handler.
using RpcId = std::uint32_t;

/// An RPC handler: gets the caller's rank and the argument bytes, returns the reply bytes.
/// It runs on the communicator's RPC thread, one call at a time per communicator; an
/// exception it throws is sent back to the caller as Errc::rpc_failed with its what().
using RpcHandler =
    std::function<std::vector<std::byte>(int caller, std::span<const std::byte> args)>;

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
  Communicator() = default;
  explicit Communicator(std::shared_ptr<detail::CommImpl> impl);

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
  /// (a stream_recv never matches a send and vice versa) and its own QUIC stream, so a
  /// multi-gigabyte transfer never delays control, data or RPC traffic. Contract and
  /// errors as send().
  void stream_send(int dest, int tag, const void* data, std::size_t bytes);
  Request istream_send(int dest, int tag, const void* data, std::size_t bytes);
  /// Receives from the bulk lane; contract and errors as recv().
  Status stream_recv(int source, int tag, void* data, std::size_t capacity);
  Request istream_recv(int source, int tag, void* data, std::size_t capacity);

  // ---- RPC ---------------------------------------------------------------------------

  /// Registers `handler` under `id`, replacing any previous one.
  void register_rpc(RpcId id, RpcHandler handler);
  /// Removes the handler of `id`; later calls to it fail with Errc::unknown_rpc.
  void unregister_rpc(RpcId id);

  /// Calls handler `id` on rank `dest` (which may be this rank) and returns its reply.
  /// Errors: invalid_argument, unknown_rpc (no such handler there, reported at once),
  /// rpc_failed (the handler threw), timeout (default Config::rpc_timeout), peer_*, closed.
  std::vector<std::byte> rpc(int dest, RpcId id, std::span<const std::byte> args,
                             std::optional<std::chrono::milliseconds> timeout = {});

  /// Non-blocking RPC call; the reply is written to `*reply` when the Request completes
  /// (`reply` must outlive it; `args` are copied before the call returns).
  Request rpc_async(int dest, RpcId id, std::span<const std::byte> args,
                    std::vector<std::byte>* reply,
                    std::optional<std::chrono::milliseconds> timeout = {});

  // ---- lifetime ------------------------------------------------------------------------

  /// Closes every connection (telling peers, whose operations on this rank then fail with
  /// peer_closed), fails this rank's pending operations with Errc::closed, and releases
  /// sockets, threads and buffers. Idempotent. The destructor of the last copy calls it.
  void close();

  /// True until close().
  bool is_open() const;

  /// Internal, for the library's own use.
  const std::shared_ptr<detail::CommImpl>& impl() const noexcept { return impl_; }

 private:
  static void check_element_multiple(const Status& s, std::size_t elem);
  detail::CommImpl& self() const;

  std::shared_ptr<detail::CommImpl> impl_;
};

/// Creates `n` communicators in this process, ranks 0..n-1, each with its own UDP socket
/// on 127.0.0.1 and its own progress thread, fully connected over real QUIC with mutual
/// TLS rooted in a fresh in-memory cluster CA. Throws nexar::Error on failure
/// (invalid_argument for n < 1, io, tls, timeout).
std::vector<Communicator> bootstrap_local(int n, const Config& config = Config::from_env());

}  // namespace nexar
