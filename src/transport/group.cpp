#include "transport/group.hpp"

#include "collective/runner.hpp"
#include "core/error_format.hpp"

namespace nexar::detail {

Group::Group(std::shared_ptr<CommImpl> node, std::uint64_t id, std::vector<int> members, int rank)
    : node_(std::move(node)), id_(id), members_(std::move(members)), rank_(rank) {
  auto local = std::make_shared<std::vector<int>>(static_cast<std::size_t>(node_->size()), -1);
  for (std::size_t i = 0; i < members_.size(); ++i)
    (*local)[static_cast<std::size_t>(members_[i])] = static_cast<int>(i);
  local_of_ = std::move(local);
}

Group::~Group() {
  // Collectives still queued fail with Errc::closed; the thread is joined.
  if (runner_) runner_->stop();
}

bool Group::is_open() const noexcept {
  return !closed_.load(std::memory_order_acquire) && node_->is_open();
}

void Group::close() {
  closed_.store(true, std::memory_order_release);
  if (is_world()) node_->close();
  std::lock_guard lk(runner_mu_);
  if (runner_) runner_->stop();
}

void Group::check_open(const char* op) const {
  if (closed_.load(std::memory_order_acquire)) {
    ErrorContext ctx{op, rank_, -1, {}, {}};
    throw make_error(Errc::closed, ctx, "communicator is closed");
  }
  node_->check_open(op, -1);
}

void Group::check_rank(const char* op, int r, bool allow_any) const {
  if (allow_any && r == any_source) return;
  if (r < 0 || r >= size()) {
    ErrorContext ctx{op, rank_, -1, {}, {}};
    throw make_error(Errc::invalid_argument, ctx,
                     "rank " + std::to_string(r) + " out of range [0, " + std::to_string(size()) + ")");
  }
}

void Group::check_tag(const char* op, int tag, bool allow_any) const {
  if (allow_any && tag == any_tag) return;
  if (tag < 0 || tag > max_tag) {
    ErrorContext ctx{op, rank_, -1, {}, {}};
    throw make_error(Errc::invalid_argument, ctx,
                     "tag " + std::to_string(tag) + " out of range [0, " + std::to_string(max_tag) + "]");
  }
}

Request Group::isend(Domain d, const char* op, int dest, int tag, std::span<const ConstBuffer> parts) {
  check_open(op);
  check_rank(op, dest, false);
  check_tag(op, tag, false);
  if (dest == rank_) {
    ErrorContext ctx{op, rank_, -1, {}, {}};
    throw make_error(Errc::invalid_argument, ctx,
                     "peer " + std::to_string(dest) + " is this rank; point-to-point needs another rank");
  }
  CommImpl::P2p a{d, op, id_, tag, node_->config().op_timeout, local_of_};
  return node_->isend(a, world_of(dest), parts);
}

Request Group::irecv(Domain d, const char* op, int source, int tag, void* data, std::size_t cap) {
  check_open(op);
  check_rank(op, source, true);
  check_tag(op, tag, true);
  if (source == rank_) {
    ErrorContext ctx{op, rank_, -1, {}, {}};
    throw make_error(Errc::invalid_argument, ctx,
                     "peer " + std::to_string(source) + " is this rank; point-to-point needs another rank");
  }
  CommImpl::P2p a{d, op, id_, tag, node_->config().op_timeout, local_of_};
  return node_->irecv(a, source == any_source ? any_source : world_of(source), data, cap);
}

Tag Group::next_collective_tag() noexcept {
  return internal_tag_base + static_cast<Tag>(collectives_.fetch_add(1));
}

CollectiveRunner& Group::runner() {
  std::lock_guard lk(runner_mu_);
  if (!runner_) runner_ = std::make_unique<CollectiveRunner>();
  return *runner_;
}

std::uint64_t split_id(std::uint64_t parent, std::uint64_t seq, int color) noexcept {
  // splitmix64 over the three inputs.
  auto mix = [](std::uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  };
  std::uint64_t h = mix(parent ^ mix(seq ^ mix(static_cast<std::uint64_t>(static_cast<std::uint32_t>(color)))));
  return h == 0 ? 1 : h;
}

}  // namespace nexar::detail
