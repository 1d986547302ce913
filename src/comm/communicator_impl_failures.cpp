// A communicator's side of failures: what it knows of its failed members, the errors of a revoked
// communicator, agree and shrink on its members, and the in-place rebuild of
// FailurePolicy::automatic. The transport (transport/failures.cpp) detects, spreads and
// revokes; the membership module (membership/agreement.*) agrees.
#include <algorithm>

#include "comm/communicator_impl.hpp"
#include "core/access.hpp"
#include "core/error_format.hpp"

namespace nexar::detail {

void CommunicatorImpl::on_event(int failed_world, Errc code, const std::string& why) {
  std::vector<int> failed;
  std::shared_ptr<FailureCallback> cb;
  {
    std::lock_guard lk(fail_mu_);
    const int local = failed_world >= 0 ? (*local_of_)[static_cast<std::size_t>(failed_world)] : -1;
    if (code == Errc::rank_failed && local >= 0 && !std::binary_search(failed_.begin(), failed_.end(), local))
      failed_.insert(std::upper_bound(failed_.begin(), failed_.end(), local), local);
    if (!revoked_.load(std::memory_order_relaxed)) {
      revoke_code_ = code;
      revoke_peer_ = local;
      revoke_detail_ = code == Errc::rank_failed && local != rank_ ? describe_failure(local, failed_world, why) : why;
      revoked_.store(true, std::memory_order_release);
    }
    failed = failed_;
    cb = on_failure_;
  }
  // No thread is started for a communicator nobody watches.
  if (!cb->set.load(std::memory_order_acquire)) return;
  notifier_.post([cb = std::move(cb), failed = std::move(failed)] {
    std::lock_guard lk(cb->mu);
    // A copy: the callback may replace itself while it runs.
    if (auto fn = cb->fn) fn(failed);
  });
}

Request CommunicatorImpl::watch_for_failure(Request r) {
  if (config().on_failure != FailurePolicy::automatic) return r;
  const auto& st = Access::state(r);
  if (!st) return r;
  st->before_throw = [weak = weak_from_this()](Errc code) {
    if (code != Errc::rank_failed && code != Errc::revoked) return;
    if (auto g = weak.lock(); g && g->is_revoked()) g->seen_.store(true, std::memory_order_release);
  };
  return r;
}

void CommunicatorImpl::throw_revoked(const char* op) const {
  seen_.store(true, std::memory_order_release);
  std::lock_guard lk(fail_mu_);
  ErrorContext ctx{op, rank_, revoke_peer_ == rank_ ? -1 : revoke_peer_, {}, {}};
  throw Error(revoke_code_, format_error(revoke_code_, ctx, revoke_detail_), failed_);
}

std::vector<int> CommunicatorImpl::failed_ranks() const {
  std::lock_guard lk(fail_mu_);
  return failed_;
}

void CommunicatorImpl::on_failure(std::function<void(const std::vector<int>&)> fn) {
  std::shared_ptr<FailureCallback> cb;
  {
    std::lock_guard lk(fail_mu_);
    cb = on_failure_;
  }
  // Waits for a call in progress on the notifier thread (unless made from it): once this
  // returns, the previous callback never runs again.
  std::lock_guard lk(cb->mu);
  cb->fn = std::move(fn);
  cb->set.store(static_cast<bool>(cb->fn), std::memory_order_release);
}

void CommunicatorImpl::revoke() {
  if (closed_.load(std::memory_order_acquire)) {
    ErrorContext ctx{"revoke", rank_, -1, {}, {}};
    throw make_error(Errc::closed, ctx, "communicator is closed");
  }
  node_->revoke_comm(id_);
}

void CommunicatorImpl::check_recoverable(const char* op) const {
  if (config().on_failure == FailurePolicy::abort) {
    ErrorContext ctx{op, rank_, -1, {}, {}};
    throw make_error(Errc::invalid_argument, ctx,
                     "the failure policy is abort (Config::on_failure, NEXAR_ON_FAILURE): set manual or "
                     "automatic to agree and shrink");
  }
}

Communicator::Agreement CommunicatorImpl::agree(const char* op, std::uint64_t value) {
  check_recoverable(op);
  if (closed_.load(std::memory_order_acquire)) {
    ErrorContext ctx{op, rank_, -1, {}, {}};
    throw make_error(Errc::closed, ctx, "communicator is closed");
  }
  node_->check_open(op, -1);
  const std::uint64_t seq = agreements_.fetch_add(1);
  Agreement::Result r = agreement_->run(op, id_, members_, rank_, seq, value, config().op_timeout, Agreement::Extra{});
  Communicator::Agreement out;
  out.value = r.value;
  for (int w : r.failed)
    if (int local = (*local_of_)[static_cast<std::size_t>(w)]; local >= 0) out.failed.push_back(local);
  std::sort(out.failed.begin(), out.failed.end());
  return out;
}

std::shared_ptr<CommunicatorImpl> CommunicatorImpl::shrink() {
  check_recoverable("shrink");
  // One agreement with grow() and leave() (comm/communicator_impl_membership.cpp): a member
  // may shrink (the automatic policy's rebuild) at the number at which another grows or
  // leaves, and both must build the same communicator. A shrink admits nobody.
  return change_membership("shrink", false, false);
}

CommunicatorImpl& CommunicatorImpl::current() {
  if (!is_revoked()) return *this;  // the common case: no successor can exist yet
  CommunicatorImpl* g = this;
  for (;;) {
    std::shared_ptr<CommunicatorImpl> next;
    {
      std::lock_guard lk(g->rebuild_mu_);
      if (!g->successor_ && g->is_revoked() && g->seen_.load(std::memory_order_acquire) &&
          g->config().on_failure == FailurePolicy::automatic &&
          !g->node_->failures().expelled() && !g->closed_.load(std::memory_order_acquire)) {
        // Every survivor gets here: its operations on the revoked communicator fail, and its next
        // call rebuilds. Other threads of this rank wait for the one rebuilding.
        std::shared_ptr<CommunicatorImpl> s = g->shrink();
        {
          // One callback for both: replacing it on the rebuilt communicator silences the old one.
          std::scoped_lock fl(g->fail_mu_, s->fail_mu_);
          s->on_failure_ = g->on_failure_;
        }
        g->successor_ = std::move(s);
      }
      next = g->successor_;
    }
    if (!next) return *g;
    g = next.get();
  }
}

}  // namespace nexar::detail
