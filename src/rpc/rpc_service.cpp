#include "rpc/rpc_service.hpp"

#include <pthread.h>

#include <exception>

namespace nexar::detail {

namespace {

std::vector<std::byte> text_bytes(const std::string& s) {
  const auto* p = reinterpret_cast<const std::byte*>(s.data());
  return {p, p + s.size()};
}

// The service whose handler thread this is, if any (for NestedWait).
thread_local RpcService* t_service = nullptr;

}  // namespace

RpcService::RpcService(int rank, std::uint32_t max_threads, ReplyFn reply)
    : rank_(rank), max_threads_(max_threads < 1 ? 1 : max_threads), reply_(std::move(reply)) {}

RpcService::~RpcService() { stop(); }

// A replaced or removed handler is destroyed after the lock is released: it may own the
// last reference to a communicator, whose destruction removes its own handlers here.
void RpcService::add(std::uint64_t comm, std::shared_ptr<const std::vector<int>> members, std::uint64_t fn,
                     RpcHandler h) {
  Entry entry{std::move(members), std::make_shared<const RpcHandler>(std::move(h))};
  std::lock_guard lk(mu_);
  std::swap(handlers_[{comm, fn}], entry);
}

void RpcService::remove(std::uint64_t comm, std::uint64_t fn) {
  Entry old;
  std::lock_guard lk(mu_);
  if (auto it = handlers_.find({comm, fn}); it != handlers_.end()) {
    old = std::move(it->second);
    handlers_.erase(it);
  }
}

bool RpcService::stuck() const noexcept {
  return threads_.size() >= max_threads_ && nested_ == threads_.size();
}

std::string RpcService::stuck_reason() const {
  return "all " + std::to_string(threads_.size()) + " RPC handler threads of rank " + std::to_string(rank_) +
         " are waiting for nested RPC calls of their own, so no request can run there "
         "(Config::rpc_threads, NEXAR_RPC_THREADS)";
}

std::vector<RpcService::Job> RpcService::take_queue() {
  std::vector<Job> out(std::make_move_iterator(jobs_.begin()), std::make_move_iterator(jobs_.end()));
  jobs_.clear();
  return out;
}

void RpcService::submit(int caller, std::uint64_t comm, std::uint64_t fn, std::uint64_t call,
                        std::vector<std::byte> args) {
  std::string refuse;
  {
    std::lock_guard lk(mu_);
    if (stop_) return;
    if (stuck()) {
      refuse = stuck_reason();
    } else {
      jobs_.push_back(Job{caller, comm, fn, call, std::move(args)});
      cv_.notify_one();
      grow();
    }
  }
  if (!refuse.empty()) reply_(caller, call, wire::RpcStatus::handler_failed, text_bytes(refuse));
}

void RpcService::stop() {
  std::vector<std::thread> threads;
  {
    std::lock_guard lk(mu_);
    stop_ = true;
    jobs_.clear();
    threads.swap(threads_);
  }
  cv_.notify_all();
  for (auto& t : threads) {
    // A handler that closes its own communicator cannot wait for itself: its thread ends
    // on its own once the handler returns.
    if (t.get_id() == std::this_thread::get_id()) {
      t.detach();
    } else if (t.joinable()) {
      t.join();
    }
  }
}

void RpcService::grow() {
  // More queued requests than threads waiting for them: start one more, if allowed. A new
  // thread counts as waiting from now on, so a burst of requests starts no more threads
  // than it needs.
  if (jobs_.size() > idle_ && threads_.size() < max_threads_) {
    ++idle_;
    threads_.emplace_back([this] { worker(); });
  }
}

RpcService::NestedWait::NestedWait(RpcService& s) : s_(t_service == &s ? &s : nullptr) {
  if (!s_) return;
  std::vector<Job> refused;
  std::string why;
  {
    std::lock_guard lk(s_->mu_);
    ++s_->nested_;
    if (s_->stuck() && !s_->jobs_.empty()) {
      refused = s_->take_queue();
      why = s_->stuck_reason();
    } else {
      s_->grow();  // this thread takes no request until its call returns
    }
  }
  for (auto& j : refused) s_->reply_(j.caller, j.call, wire::RpcStatus::handler_failed, text_bytes(why));
}

RpcService::NestedWait::~NestedWait() {
  if (!s_) return;
  std::lock_guard lk(s_->mu_);
  --s_->nested_;
}

void RpcService::worker() {
  pthread_setname_np(pthread_self(), "nexar-rpc");
  t_service = this;
  std::unique_lock lk(mu_);
  for (;;) {  // counted in idle_ here (by grow() at first)
    cv_.wait(lk, [&] { return stop_ || !jobs_.empty(); });
    --idle_;
    if (stop_) return;
    Job job = std::move(jobs_.front());
    jobs_.pop_front();
    lk.unlock();
    serve(job);
    lk.lock();
    ++idle_;
  }
}

void RpcService::serve(Job& job) {
  Entry e;
  {
    std::lock_guard lk(mu_);
    if (auto it = handlers_.find({job.comm, job.fn}); it != handlers_.end()) e = it->second;
  }
  const std::string where = "RPC id " + std::to_string(job.fn) + " on rank " + std::to_string(rank_);
  if (!e.handler) {
    reply_(job.caller, job.call, wire::RpcStatus::unknown_id,
           text_bytes("no handler registered for " + where + " in this communicator"));
    return;
  }
  const auto w = static_cast<std::size_t>(job.caller);
  const int caller = w < e.members->size() ? (*e.members)[w] : -1;
  if (caller < 0) {
    reply_(job.caller, job.call, wire::RpcStatus::handler_failed,
           text_bytes("world rank " + std::to_string(job.caller) + " called " + where +
                      " of a communicator it is not a member of"));
    return;
  }
  try {
    auto out = (*e.handler)(caller, std::span<const std::byte>(job.args));
    reply_(job.caller, job.call, wire::RpcStatus::ok, std::move(out));
  } catch (const std::exception& ex) {
    reply_(job.caller, job.call, wire::RpcStatus::handler_failed,
           text_bytes("handler for " + where + " threw: " + ex.what()));
  } catch (...) {
    reply_(job.caller, job.call, wire::RpcStatus::handler_failed,
           text_bytes("handler for " + where + " threw a non-standard exception"));
  }
}

}  // namespace nexar::detail
