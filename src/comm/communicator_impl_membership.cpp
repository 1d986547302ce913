// A communicator's side of elastic membership: grow (admit the waiting joiners, let the leaving
// members go) and leave. One agreement decides both, so every member (and every joiner, by
// the welcome) builds the same next communicator. docs/ARCHITECTURE.md, "Elastic
// membership", states the guarantees.
#include <algorithm>
#include <thread>

#include "comm/communicator_impl.hpp"
#include "core/error_format.hpp"
#include "core/log.hpp"

namespace nexar::detail {

namespace {
// How long a grow waits for joiners this rank already heard of to finish connecting: they
// were announced a moment ago and their handshakes are under way. One that takes longer
// waits for the next grow.
constexpr auto kReadyWait = std::chrono::seconds(2);
}  // namespace

std::shared_ptr<CommunicatorImpl> CommunicatorImpl::change_membership(const char* op, bool leaving, bool admit) {
  if (closed_.load(std::memory_order_acquire)) {
    ErrorContext ctx{op, rank_, -1, {}, {}};
    throw make_error(Errc::closed, ctx, "communicator is closed");
  }
  node_->check_open(op, -1);
  // Joiners announced to us are dialled at once; give those still shaking hands a moment,
  // so that members that heard of them at about the same time all contribute them.
  std::vector<int> ready;
  if (admit) {
    const auto until = std::chrono::steady_clock::now() + std::min<std::chrono::milliseconds>(
                                                                config().connect_timeout, kReadyWait);
    while (node_->joiners().connecting() > 0 && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ready = node_->joiners().ready();
  }
  const std::uint64_t seq = agreements_.fetch_add(1);
  Agreement::Extra extra;
  extra.joiners = std::move(ready);
  extra.leaving = leaving;
  const Agreement::Result r =
      agreement_->run(op, id_, members_, rank_, seq, ~std::uint64_t{0}, config().op_timeout, std::move(extra));
  auto contains = [](const std::vector<int>& v, int x) { return std::binary_search(v.begin(), v.end(), x); };
  if (contains(r.failed, world_of(rank_))) {
    std::vector<int> failed;  // in this communicator's numbering
    for (int w : r.failed)
      if (int local = (*local_of_)[static_cast<std::size_t>(w)]; local >= 0) failed.push_back(local);
    std::sort(failed.begin(), failed.end());
    ErrorContext ctx{op, rank_, -1, {}, {}};
    throw Error(Errc::rank_failed, format_error(Errc::rank_failed, ctx, "this rank was declared failed by the others"),
                failed);
  }
  std::vector<int> members;
  int my_rank = -1;
  for (int w : members_) {
    if (contains(r.failed, w) || contains(r.leaving, w)) continue;
    if (w == world_of(rank_)) my_rank = static_cast<int>(members.size());
    members.push_back(w);
  }
  members.insert(members.end(), r.joiners.begin(), r.joiners.end());
  // A grow that admits nobody and lets nobody leave builds exactly what shrink() would,
  // id included. A member may call grow() at the same number at which another calls
  // shrink(): under FailurePolicy::automatic the in-place rebuild shrinks as soon as a
  // member sees the failure, which the others cannot know when they decide to grow. The
  // shrinking member contributes no joiners, so the intersection is empty, and both must end
  // in the same communicator.
  const int color = r.joiners.empty() && r.leaving.empty() ? shrink_color : grow_color;
  const std::uint64_t id = split_id(id_, seq, color);
  node_->joiners().admitted(r.joiners);
  // Every member that decided welcomes every joiner: one welcome suffices, so a member
  // failing half-way cannot leave a joiner behind.
  const std::vector<std::uint32_t> wire_members(members.begin(), members.end());
  for (int j : r.joiners) node_->send_welcome(j, id, seq, wire_members);
  if (rank_ == 0 && (!r.joiners.empty() || !r.leaving.empty() || !r.failed.empty()))
    log::info("{}: communicator {:#x} of {} ranks -> {:#x} of {} ({} joined, {} left, {} failed)", op, id_,
              size(), id, members.size(), r.joiners.size(), r.leaving.size(), r.failed.size());
  if (leaving) return nullptr;
  if (members.empty() || my_rank < 0) {
    ErrorContext ctx{op, rank_, -1, {}, {}};
    throw make_error(Errc::protocol, ctx, "the agreed membership does not contain this rank");
  }
  return make(node_, services(), id, std::move(members), my_rank);
}

std::shared_ptr<CommunicatorImpl> CommunicatorImpl::grow() { return change_membership("grow", false, true); }

void CommunicatorImpl::leave() { change_membership("leave", true, true); }

int CommunicatorImpl::pending_joiners() const { return static_cast<int>(node_->joiners().ready().size()); }

}  // namespace nexar::detail
