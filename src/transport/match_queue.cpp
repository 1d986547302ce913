#include "transport/match_queue.hpp"

namespace nexar::detail {

std::shared_ptr<RecvOp> MatchQueue::take_posted(std::uint64_t comm, int source, Tag tag) {
  for (auto it = posted_.begin(); it != posted_.end(); ++it) {
    if ((*it)->matches(comm, source, tag)) {
      auto r = std::move(*it);
      posted_.erase(it);
      return r;
    }
  }
  return nullptr;
}

std::list<std::shared_ptr<Unexpected>>::iterator MatchQueue::find_unexpected(const RecvOp& r) {
  for (auto it = unexpected_.begin(); it != unexpected_.end(); ++it) {
    const Unexpected& u = **it;
    if (!u.waiter && r.matches(u.comm, u.source, u.tag)) return it;
  }
  return unexpected_.end();
}

bool MatchQueue::remove_posted(const OpState* op) {
  for (auto it = posted_.begin(); it != posted_.end(); ++it) {
    if ((*it)->op.get() == op) {
      posted_.erase(it);
      return true;
    }
  }
  return false;
}

bool MatchQueue::awaits_arrival(const OpState* op) const {
  for (const auto& u : unexpected_)
    if (u->waiter && u->waiter->op.get() == op) return true;
  return false;
}

std::shared_ptr<Unexpected> MatchQueue::add_unexpected(Unexpected u) {
  unexpected_.push_back(std::make_shared<Unexpected>(std::move(u)));
  return unexpected_.back();
}

void MatchQueue::erase(const Unexpected* u) {
  unexpected_.remove_if([u](const std::shared_ptr<Unexpected>& x) { return x.get() == u; });
}

}  // namespace nexar::detail
