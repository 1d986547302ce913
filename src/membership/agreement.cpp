#include "membership/agreement.hpp"

#include <algorithm>
#include <iterator>

#include "core/access.hpp"
#include "core/error_format.hpp"
#include "core/log.hpp"
#include "engine/engine.hpp"
#include "transport/node.hpp"

namespace nexar::detail {

using wire::Ballot;
using wire::FrameType;

namespace {
// Decisions and contributions older than this many agreements are forgotten: a live member
// is never more than one agreement behind another.
constexpr std::uint64_t kKeep = 4;

// The node's side of its agreements.
class NodeSide final : public AgreementOwner {
 public:
  explicit NodeSide(Node& node) : node_(node) {}
  int rank() const noexcept override { return node_.rank(); }
  bool expelled() const noexcept override { return node_.failures().expelled(); }
  bool is_open() const noexcept override { return node_.is_open(); }
  bool is_failed(int r) const override { return node_.failures().is_failed(r); }
  bool peer_left(int r) override { return node_.peer_left(r); }
  void declare_failed(int r, const std::string& why) override { node_.failures().declare_failed(r, why); }
  void send_ballot(int dest, FrameType type, std::uint64_t comm, std::uint64_t seq, const Ballot& b) override {
    node_.send_ballot(dest, type, comm, seq, b);
  }
  Engine& engine() noexcept override { return node_.engine(); }
  std::shared_ptr<OpState> new_op(const char* op, std::chrono::milliseconds timeout) override {
    return node_.new_op(op, timeout);
  }

 private:
  Node& node_;
};
}  // namespace

std::shared_ptr<Agreement> Agreement::over(Node& node) {
  struct Both {
    explicit Both(Node& n) : side(n), agreement(side) {}
    NodeSide side;
    Agreement agreement;
  };
  auto both = std::make_shared<Both>(node);
  return std::shared_ptr<Agreement>(both, &both->agreement);
}

Agreement::Result Agreement::run(const char* op_name, std::uint64_t comm, const std::vector<int>& members, int rank,
                                 std::uint64_t seq, std::uint64_t value, std::chrono::milliseconds timeout,
                                 Extra extra) {
  auto op = owner_.new_op(op_name, timeout);
  auto out = std::make_shared<Result>();
  std::weak_ptr<OpState> weak = op;
  op->canceller = [this, weak, comm, rank](Errc code) {
    auto give_up = [this, weak, comm, rank, code] {
      auto s = weak.lock();
      if (!s || s->done()) return;
      if (auto it = comms_.find(comm); it != comms_.end() && it->second.op == s) {
        it->second.pending = false;
        it->second.op.reset();
      }
      ErrorContext ctx{s->op(), rank, -1, {}, s->start()};
      s->complete(code, format_error(code, ctx,
                                     code == Errc::timeout ? "not every live member joined the agreement in time"
                                                           : "agreement cancelled"));
    };
    if (owner_.engine().stopped()) {
      if (auto s = weak.lock()) s->complete(Errc::closed, std::string(s->op()) + ": communicator closed");
      return;
    }
    owner_.engine().post(give_up);
  };
  owner_.engine().post([this, comm, members, seq, value, extra = std::move(extra), op, out]() mutable {
    start(comm, members, seq, value, std::move(extra), op, out);
  });
  Access::make_request(op).wait();
  return *out;
}

void Agreement::start(std::uint64_t id, std::vector<int> members, std::uint64_t seq, std::uint64_t value,
                      Extra extra, std::shared_ptr<OpState> op, std::shared_ptr<Result> out) {
  if (owner_.expelled()) {
    op->complete(Errc::rank_failed, std::string(op->op()) + ": this rank was declared failed by the others");
    return;
  }
  if (!owner_.is_open()) {
    op->complete(Errc::closed, std::string(op->op()) + ": communicator closed");
    return;
  }
  Comm& c = comms_[id];
  c.members = std::move(members);
  c.pending = true;
  c.seq = seq;
  c.value = value;
  c.extra = std::move(extra);
  c.op = std::move(op);
  c.out = std::move(out);
  if (auto it = c.decided.find(seq); it != c.decided.end()) {
    const Ballot b = it->second;
    c.decided.erase(it);  // accept() takes it again, completing the waiter
    accept(id, c, seq, b);
    return;
  }
  c.coordinator = -1;
  // A member whose connection already ended (it closed without failing) can contribute
  // nothing: left out, as on_rank_left() does for one that goes while we wait.
  const std::vector<int> members_now = c.members;
  for (int m : members_now)
    if (m != owner_.rank() && owner_.peer_left(m))
      owner_.declare_failed(m, "its connection had ended when an agreement began");
  send_state(id, c);
}

int Agreement::coordinator(const Comm& c) const {
  for (int m : c.members)
    if (m == owner_.rank() ? !owner_.expelled() : !owner_.is_failed(m)) return m;
  return -1;
}

Ballot Agreement::contribution(const Comm& c) const {
  Ballot b;
  b.value = c.value;
  for (int m : c.members)
    if (owner_.is_failed(m)) b.failed.push_back(static_cast<std::uint32_t>(m));
  std::sort(b.failed.begin(), b.failed.end());
  b.joiners.assign(c.extra.joiners.begin(), c.extra.joiners.end());
  if (c.extra.leaving) b.leaving.push_back(static_cast<std::uint32_t>(owner_.rank()));
  return b;
}

void Agreement::send_state(std::uint64_t id, Comm& c) {
  const int to = coordinator(c);
  if (to < 0 || to == c.coordinator) return;
  c.coordinator = to;
  if (to == owner_.rank()) {
    if (c.pending) {
      c.collected[c.seq][to] = contribution(c);
      try_decide(id, c, c.seq);
    }
    return;
  }
  // The last decision first: a new coordinator that missed it (its predecessor failed while
  // sending it) adopts it rather than deciding anew.
  if (!c.decided.empty()) {
    auto last = std::prev(c.decided.end());
    owner_.send_ballot(to, FrameType::decided, id, last->first, last->second);
  }
  if (c.pending) owner_.send_ballot(to, FrameType::agree, id, c.seq, contribution(c));
}

void Agreement::try_decide(std::uint64_t id, Comm& c, std::uint64_t seq) {
  if (!c.pending || c.seq != seq || coordinator(c) != owner_.rank() || c.decided.count(seq)) return;
  auto& got = c.collected[seq];
  Ballot d;
  d.value = ~std::uint64_t{0};
  bool first = true;
  for (int m : c.members) {
    if (owner_.is_failed(m)) {
      d.failed.push_back(static_cast<std::uint32_t>(m));
      continue;
    }
    auto it = got.find(m);
    if (it == got.end()) return;  // a live member has not contributed yet
    const Ballot& b = it->second;
    d.value &= b.value;
    if (first) {
      d.joiners = b.joiners;
      first = false;
    } else {
      std::vector<std::uint32_t> both;
      std::set_intersection(d.joiners.begin(), d.joiners.end(), b.joiners.begin(), b.joiners.end(),
                            std::back_inserter(both));
      d.joiners = std::move(both);
    }
    // Only a member may say it leaves, and only for itself.
    if (b.leaving.size() == 1 && b.leaving[0] == static_cast<std::uint32_t>(m))
      d.leaving.push_back(static_cast<std::uint32_t>(m));
  }
  std::sort(d.failed.begin(), d.failed.end());
  std::sort(d.leaving.begin(), d.leaving.end());
  std::erase_if(d.joiners, [&](std::uint32_t j) { return owner_.is_failed(static_cast<int>(j)); });
  accept(id, c, seq, d);
}

void Agreement::accept(std::uint64_t id, Comm& c, std::uint64_t seq, const Ballot& b) {
  if (c.decided.count(seq)) return;
  c.decided[seq] = b;
  while (c.decided.size() > kKeep) c.decided.erase(c.decided.begin());
  c.collected.erase(c.collected.begin(), c.collected.upper_bound(seq));
  learn_failures(b, -1);
  if (!c.members.empty() && coordinator(c) == owner_.rank()) {
    for (int m : c.members)
      if (m != owner_.rank() && !owner_.is_failed(m)) owner_.send_ballot(m, FrameType::decided, id, seq, b);
  }
  if (c.pending && c.seq == seq) {
    c.pending = false;
    c.out->value = b.value;
    c.out->failed.assign(b.failed.begin(), b.failed.end());
    c.out->joiners.assign(b.joiners.begin(), b.joiners.end());
    c.out->leaving.assign(b.leaving.begin(), b.leaving.end());
    auto op = std::move(c.op);
    op->succeed();
  }
}

void Agreement::learn_failures(const Ballot& b, int from) {
  for (std::uint32_t r : b.failed) {
    const int w = static_cast<int>(r);
    if (w == owner_.rank() || owner_.is_failed(w)) continue;
    owner_.declare_failed(w, from >= 0 ? "named failed by rank " + std::to_string(from) + " in an agreement"
                                      : "named failed by an agreement's decision");
  }
}

void Agreement::on_ballot(int src, const wire::FrameHeader& h, Ballot b) {
  const std::uint64_t id = h.comm;
  const std::uint64_t seq = h.seq;
  learn_failures(b, src);
  Comm& c = comms_[id];
  if (h.type == FrameType::decided) {
    accept(id, c, seq, b);
    return;
  }
  if (auto it = c.decided.find(seq); it != c.decided.end()) {
    // A member that missed the decision (its coordinator failed) asks anew: answer it.
    owner_.send_ballot(src, FrameType::decided, id, seq, it->second);
    return;
  }
  if (!c.decided.empty() && seq + kKeep <= c.decided.rbegin()->first) return;  // long settled
  c.collected[seq][src] = std::move(b);
  if (!c.members.empty()) try_decide(id, c, seq);
}

void Agreement::on_rank_failed(int r) {
  for (auto& [id, c] : comms_) {
    if (c.members.empty() || std::find(c.members.begin(), c.members.end(), r) == c.members.end()) continue;
    send_state(id, c);  // a new coordinator hears from us
    if (c.pending) try_decide(id, c, c.seq);  // as coordinator, r's contribution is no longer awaited
  }
}

void Agreement::on_rank_left(int r, const std::string& why) {
  for (auto& [id, c] : comms_) {
    if (!c.pending || std::find(c.members.begin(), c.members.end(), r) == c.members.end()) continue;
    // It can contribute nothing now. Declared failed, it is left out the same way by every
    // member (the declaration spreads, and decisions carry the failed set).
    owner_.declare_failed(r, "its connection ended while an agreement waited for it: " + why);
    return;
  }
}

void Agreement::on_expelled(const std::string& why) {
  for (auto& [id, c] : comms_) {
    if (!c.pending) continue;
    c.pending = false;
    auto op = std::move(c.op);
    op->complete(Errc::rank_failed, std::string(op->op()) + ": " + why);
  }
}

void Agreement::on_close() {
  for (auto& [id, c] : comms_) {
    if (!c.pending) continue;
    c.pending = false;
    auto op = std::move(c.op);
    op->complete(Errc::closed, std::string(op->op()) + ": communicator closed");
  }
}

}  // namespace nexar::detail
