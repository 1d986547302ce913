#include "rpc/rpc_service.hpp"

#include <pthread.h>

#include <exception>
#include <string>

namespace nexar::detail {

namespace {
std::vector<std::byte> text_bytes(const std::string& s) {
  const auto* p = reinterpret_cast<const std::byte*>(s.data());
  return {p, p + s.size()};
}
}  // namespace

RpcService::RpcService(int rank, ReplyFn reply) : rank_(rank), reply_(std::move(reply)) {
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "nexar-rpc");
    run();
  });
}

RpcService::~RpcService() { stop(); }

void RpcService::add(RpcId id, RpcHandler h) {
  std::lock_guard lk(mu_);
  handlers_[id] = std::make_shared<RpcHandler>(std::move(h));
}

void RpcService::remove(RpcId id) {
  std::lock_guard lk(mu_);
  handlers_.erase(id);
}

void RpcService::submit(int caller, RpcId id, std::uint64_t call, std::vector<std::byte> args) {
  {
    std::lock_guard lk(mu_);
    if (stop_) return;
    jobs_.push_back(Job{caller, id, call, std::move(args)});
  }
  cv_.notify_one();
}

void RpcService::stop() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
    jobs_.clear();
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void RpcService::run() {
  for (;;) {
    Job job;
    std::shared_ptr<RpcHandler> h;
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !jobs_.empty(); });
      if (stop_) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
      if (auto it = handlers_.find(job.id); it != handlers_.end()) h = it->second;
    }
    if (!h) {
      reply_(job.caller, job.call, wire::RpcStatus::unknown_id,
             text_bytes("no handler registered for RPC id " + std::to_string(job.id) +
                        " on rank " + std::to_string(rank_)));
      continue;
    }
    try {
      auto out = (*h)(job.caller, std::span<const std::byte>(job.args));
      reply_(job.caller, job.call, wire::RpcStatus::ok, std::move(out));
    } catch (const std::exception& e) {
      reply_(job.caller, job.call, wire::RpcStatus::handler_failed,
             text_bytes("handler for RPC id " + std::to_string(job.id) + " on rank " +
                        std::to_string(rank_) + " threw: " + e.what()));
    } catch (...) {
      reply_(job.caller, job.call, wire::RpcStatus::handler_failed,
             text_bytes("handler for RPC id " + std::to_string(job.id) + " on rank " +
                        std::to_string(rank_) + " threw a non-standard exception"));
    }
  }
}

}  // namespace nexar::detail
