#include "comm/pending_p2p.hpp"

#include <algorithm>

#include <fmt/format.h>

namespace nexar::detail {

void PendingP2p::add(Op op) {
  std::lock_guard lk(mu_);
  ops_.push_back(std::move(op));
  // Drop the finished ones once the list doubled since the last time: amortised, a push.
  if (ops_.size() >= prune_at_) {
    drop_finished();
    prune_at_ = std::max<std::size_t>(64, 2 * ops_.size());
  }
}

void PendingP2p::drop_finished() {
  ops_.erase(std::remove_if(ops_.begin(), ops_.end(), [](const Op& o) { return o.state->done(); }), ops_.end());
}

std::vector<PendingP2p::Op> PendingP2p::stalled(Clock::time_point now, Clock::duration age) {
  std::lock_guard lk(mu_);
  drop_finished();
  std::vector<Op> out;
  for (Op& o : ops_) {
    if (o.reported || now - o.state->start() < age) continue;
    o.reported = true;
    out.push_back(o);
  }
  return out;
}

std::optional<PendingP2p::Op> PendingP2p::oldest() {
  std::lock_guard lk(mu_);
  for (const Op& o : ops_)
    if (!o.state->done()) return o;
  return std::nullopt;
}

std::vector<PendingP2p::Op> PendingP2p::open() {
  std::lock_guard lk(mu_);
  drop_finished();
  return {ops_.begin(), ops_.end()};
}

std::string describe(const PendingP2p::Op& op) {
  const std::string peer = op.peer < 0 ? std::string("any rank") : fmt::format("rank {}", op.peer);
  const std::string tag = op.tag < 0 ? std::string("any tag") : fmt::format("tag {}", op.tag);
  if (op.sending) return fmt::format("{} to {} ({}, {} bytes)", op.state->op(), peer, tag, op.bytes);
  return fmt::format("{} from {} ({}, up to {} bytes)", op.state->op(), peer, tag, op.bytes);
}

}  // namespace nexar::detail
