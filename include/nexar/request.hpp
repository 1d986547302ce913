// nexar — handles of non-blocking operations.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <system_error>

#include <nexar/error.hpp>

namespace nexar {

namespace detail {
class OpState;
struct Access;
}  // namespace detail

/// Rank wildcard for receives: match a message from any source.
inline constexpr int any_source = -1;
/// Tag wildcard for receives: match a message with any tag.
inline constexpr int any_tag = -1;
/// Largest tag an application may use; tags run from 0 to max_tag.
inline constexpr int max_tag = 0x3fffffff;

/// What a completed receive got.
struct Status {
  int source = -1;        ///< rank the message came from
  int tag = -1;           ///< tag it carried
  std::size_t bytes = 0;  ///< payload size in bytes
};

/// Handle of a non-blocking operation (isend, irecv, async RPC, later collectives).
///
/// A Request is a cheap shared handle: copies refer to the same operation. Dropping every
/// copy does not cancel the operation, so buffers passed to it must stay alive until it
/// completes. A default-constructed Request is complete and successful.
class Request {
 public:
  /// A complete, successful request. Requests of operations come from the calls that start
  /// them (isend, irecv, the i-forms of collectives, rpc_async).
  Request() = default;

  /// True once the operation finished, successfully or not. Never blocks, never throws.
  bool test() const noexcept;

  /// Blocks until the operation finishes; throws nexar::Error if it failed.
  /// The operation's own deadline (from Config or the call) bounds the wait.
  Status wait() const;

  /// Waits at most `d`; returns false if the operation is still running (it goes on).
  /// Throws nexar::Error if it finished with a failure.
  bool wait_for(std::chrono::nanoseconds d) const;

  /// The failure, once finished; an empty error_code while running or on success.
  std::error_code error() const noexcept;

  /// Result of a finished receive (source, tag, size). Undefined before completion.
  Status status() const noexcept;

  /// Asks the engine to cancel the operation. A receive not yet matched, a send whose data
  /// has not started to move, or a collective still waiting behind earlier collectives of
  /// its communicator (it then never runs on this rank) completes with Errc::cancelled
  /// (Errc::timeout once its deadline has passed); otherwise the call has no effect and the
  /// operation completes normally.
  void cancel() const;

 private:
  friend struct detail::Access;
  explicit Request(std::shared_ptr<detail::OpState> state) : state_(std::move(state)) {}

  std::shared_ptr<detail::OpState> state_;
};

}  // namespace nexar
