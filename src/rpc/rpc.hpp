// RPC for one node, on top of the transport: the calling side (calls waiting for their
// replies, matched by call id) and the serving side (RpcService). The transport hands it the
// frames of the two RPC lanes (RpcLanes); it sends with Node::send_rpc_frame. Calls and
// handlers belong to a communicator: a request carries the communicator's id, and the
// handler registered there sees its caller's rank in that communicator.
#pragma once

#include <nexar/rpc.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "rpc/rpc_service.hpp"
#include "transport/node.hpp"
#include "transport/rpc_lanes.hpp"

namespace nexar::detail {

class Rpc final : public RpcLanes, public std::enable_shared_from_this<Rpc> {
 public:
  /// Serves and calls for `node`, which must outlive it (the node owns it: attach_rpc).
  /// Made with make_shared: calls hold it weakly.
  explicit Rpc(Node& node);
  Rpc(const Rpc&) = delete;
  Rpc& operator=(const Rpc&) = delete;

  RpcService& service() noexcept { return service_; }

  /// Calls function `fn` of communicator `comm` on world rank `dest` (this rank too): an
  /// application's RpcId, or one of the library's own above 2^32 (kStallQuery). Throws
  /// invalid_argument for arguments over max_frame_bytes, closed after close.
  RpcCall call(std::uint64_t comm, int dest, std::uint64_t fn, std::span<const std::byte> args,
               std::chrono::milliseconds timeout);

  // RpcLanes
  void on_request(int src, std::uint64_t comm, std::uint64_t fn, std::uint64_t call,
                  std::vector<std::byte> args) override;
  bool awaits(std::uint64_t call) override;
  void on_response(int src, std::uint64_t call, wire::RpcStatus status,
                   std::vector<std::byte> reply) override;
  void on_peer_gone(int peer, Errc code, const std::string& why) override;
  void on_close() override;

 private:
  struct Pending {
    std::shared_ptr<OpState> op;
    std::shared_ptr<std::vector<std::byte>> reply;
    int dest = -1;
  };
  /// Removes call `call`; false if it already finished (reply, failure, timeout).
  bool take(std::uint64_t call, Pending* out);
  /// The outcome of call `call` (a reply, or a result of this rank's own handler).
  void finish(std::uint64_t call, wire::RpcStatus status, std::vector<std::byte> payload);
  /// Sends the outcome of request `call` to world rank `dest` (or finishes a call to self).
  void reply(int dest, std::uint64_t call, wire::RpcStatus status, std::vector<std::byte> payload);

  Node& node_;
  RpcService service_;
  std::mutex mu_;
  std::map<std::uint64_t, Pending> calls_;
  std::atomic<std::uint64_t> next_call_{1};
};

}  // namespace nexar::detail
