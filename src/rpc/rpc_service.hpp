// The serving side of RPC: the handler registry and the thread that runs handlers, so a
// slow handler never stalls the progress engine. Requests are served one at a time in
// arrival order; replies go back through CommImpl::send_rpc_response.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include <nexar/communicator.hpp>

#include "wire/frame.hpp"

namespace nexar::detail {

class RpcService {
 public:
  /// `reply` is called on the RPC thread with the outcome of each request.
  using ReplyFn = std::function<void(int caller, std::uint64_t call, wire::RpcStatus st,
                                     std::vector<std::byte> payload)>;

  RpcService(int rank, ReplyFn reply);
  ~RpcService();
  RpcService(const RpcService&) = delete;
  RpcService& operator=(const RpcService&) = delete;

  void add(RpcId id, RpcHandler h);
  void remove(RpcId id);
  /// Queues a request (any thread).
  void submit(int caller, RpcId id, std::uint64_t call, std::vector<std::byte> args);
  /// Stops the thread after the request being served; queued requests are dropped.
  void stop();

 private:
  struct Job {
    int caller;
    RpcId id;
    std::uint64_t call;
    std::vector<std::byte> args;
  };
  void run();

  int rank_;
  ReplyFn reply_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  std::map<RpcId, std::shared_ptr<RpcHandler>> handlers_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace nexar::detail
