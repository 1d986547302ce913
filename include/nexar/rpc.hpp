// nexar — remote procedure calls between the ranks of a communicator.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include <nexar/request.hpp>

namespace nexar {

/// Identifier of an RPC handler.
using RpcId = std::uint32_t;

/// An RPC handler: gets the caller's rank (in the communicator the handler was registered
/// on) and the argument bytes, returns the reply bytes. Handlers run on the rank's RPC
/// handler threads, several at once (Config::rpc_threads), so a handler must be safe to run
/// beside others, itself included; it may call RPCs itself, back to its caller too. An
/// exception it throws is sent back to the caller as Errc::rpc_failed with its what().
using RpcHandler =
    std::function<std::vector<std::byte>(int caller, std::span<const std::byte> args)>;

/// A non-blocking RPC call (Communicator::rpc_async): a Request plus the reply it brings.
/// Copies share the call and its reply.
class RpcCall {
 public:
  /// A completed call with an empty reply.
  RpcCall() : reply_(std::make_shared<std::vector<std::byte>>()) {}
  RpcCall(Request request, std::shared_ptr<std::vector<std::byte>> reply)
      : request_(std::move(request)), reply_(std::move(reply)) {}

  /// True once the call finished, successfully or not. Never blocks, never throws.
  bool test() const noexcept { return request_.test(); }
  /// Blocks until the reply arrives and returns it (it stays owned by the call: move it
  /// out to keep it). Throws nexar::Error as Communicator::rpc does.
  std::vector<std::byte>& wait() const {
    request_.wait();
    return *reply_;
  }
  /// Waits at most `d`; false if the call is still running. Throws like wait().
  bool wait_for(std::chrono::nanoseconds d) const { return request_.wait_for(d); }
  /// Gives the call up: it completes with Errc::cancelled unless the reply already came.
  void cancel() const { request_.cancel(); }
  /// The call as a plain Request (for waiting on it together with other operations).
  const Request& request() const noexcept { return request_; }

 private:
  Request request_;
  std::shared_ptr<std::vector<std::byte>> reply_;
};

}  // namespace nexar
