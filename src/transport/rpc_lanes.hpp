// What the transport hands to the RPC module above it: whole frames of the two RPC lanes, the
// failure of a peer, and the node's close. The RPC module (src/rpc) implements it and sends
// through Node::send_rpc_frame, so the transport knows nothing of calls, handlers or
// their threads.
#pragma once

#include <nexar/error.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "wire/frame.hpp"

namespace nexar::detail {

class RpcLanes {
 public:
  /// A whole rpc_request frame from world rank `src`: call `call` of function `fn` on
  /// communicator `comm`. Engine lock held: queue the work, never block.
  virtual void on_request(int src, std::uint64_t comm, std::uint64_t fn, std::uint64_t call,
                          std::vector<std::byte> args) = 0;
  /// Whether call `call` still waits for its reply; a reply to anything else (a call that
  /// timed out meanwhile) is discarded as it arrives instead of being buffered.
  virtual bool awaits(std::uint64_t call) = 0;
  /// A whole rpc_response frame from world rank `src`. Engine lock held.
  virtual void on_response(int src, std::uint64_t call, wire::RpcStatus status,
                           std::vector<std::byte> reply) = 0;
  /// World rank `peer` is gone (`code`, `why`): calls waiting on it fail now.
  virtual void on_peer_gone(int peer, Errc code, const std::string& why) = 0;
  /// The node is closing: stop serving, fail every waiting call with Errc::closed.
  virtual void on_close() = 0;

 protected:
  ~RpcLanes() = default;
};

}  // namespace nexar::detail
