// The serving side of RPC: handlers registered per communicator, and the pool of threads
// that runs them, so a slow handler never stalls the progress engine and a handler may
// itself call RPCs (back to its caller too) without deadlock. One thread waits for
// requests; another starts whenever a request arrives while every thread is busy, up to
// Config::rpc_threads. When every thread waits for a nested call of its own, nothing queued
// could ever run: queued and new requests are answered with an error at once.
#pragma once

#include <nexar/rpc.hpp>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "wire/frame.hpp"

namespace nexar::detail {

class RpcService {
 public:
  /// Sends the outcome of request `call` back to world rank `caller` (any thread).
  using ReplyFn = std::function<void(int caller, std::uint64_t call, wire::RpcStatus st,
                                     std::vector<std::byte> payload)>;

  RpcService(int rank, std::uint32_t max_threads, ReplyFn reply);
  ~RpcService();
  RpcService(const RpcService&) = delete;
  RpcService& operator=(const RpcService&) = delete;

  /// Registers `h` as function `fn` of communicator `comm`; `members` maps world ranks to
  /// ranks in `comm` (-1: not a member), so the handler sees its caller's rank there.
  /// Functions above 2^32 are the library's own (kStallQuery): no RpcId reaches them.
  void add(std::uint64_t comm, std::shared_ptr<const std::vector<int>> members, std::uint64_t fn,
           RpcHandler h);
  void remove(std::uint64_t comm, std::uint64_t fn);
  /// Queues a request from world rank `caller` (any thread; never blocks on a handler).
  void submit(int caller, std::uint64_t comm, std::uint64_t fn, std::uint64_t call,
              std::vector<std::byte> args);
  /// Drops queued requests, lets running handlers finish and joins the threads. Idempotent.
  void stop();

  /// While alive on one of this service's handler threads, counts that thread as waiting
  /// for a nested call of its own (elsewhere it does nothing).
  class NestedWait {
   public:
    explicit NestedWait(RpcService& s);
    ~NestedWait();
    NestedWait(const NestedWait&) = delete;
    NestedWait& operator=(const NestedWait&) = delete;

   private:
    RpcService* s_;
  };

 private:
  struct Job {
    int caller = -1;
    std::uint64_t comm = 0;
    std::uint64_t fn = 0;
    std::uint64_t call = 0;
    std::vector<std::byte> args;
  };
  struct Entry {
    std::shared_ptr<const std::vector<int>> members;
    std::shared_ptr<const RpcHandler> handler;
  };
  void worker();
  void serve(Job& job);
  /// Starts a thread when more requests wait than threads do (mu_ held).
  void grow();
  /// Every thread waits for a nested call and no more may start: nothing queued can run.
  bool stuck() const noexcept;
  std::string stuck_reason() const;
  /// Answers the queued requests with an error (stuck()); called with mu_ held, replies
  /// after releasing it.
  std::vector<Job> take_queue();

  int rank_;
  std::uint32_t max_threads_;
  ReplyFn reply_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  std::map<std::pair<std::uint64_t, std::uint64_t>, Entry> handlers_;
  std::vector<std::thread> threads_;
  std::size_t idle_ = 0;    // threads waiting for a job
  std::size_t nested_ = 0;  // threads waiting for a nested call of their handler
  bool stop_ = false;
};

}  // namespace nexar::detail
