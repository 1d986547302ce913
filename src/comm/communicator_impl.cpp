#include "comm/communicator_impl.hpp"

#include <algorithm>
#include <atomic>
#include <limits>

#include "collective/algorithms.hpp"
#include "comm/runner.hpp"
#include "comm/tracer.hpp"
#include "engine/wait_meter.hpp"
#include "core/access.hpp"
#include "core/call_check.hpp"
#include "core/error_format.hpp"

namespace nexar::detail {

CommunicatorImpl::Services CommunicatorImpl::attach(Node& node) {
  Services s{std::make_shared<Rpc>(node), Agreement::over(node), nullptr, nullptr};
  s.watchdog = std::make_shared<Watchdog>(node.config().stall_warn, s.rpc);
  if (!node.config().trace.empty())
    s.tracer = std::make_shared<Tracer>(node.config().trace, node.rank(), node.size());
  node.attach_rpc(s.rpc);
  node.attach_membership(s.agreement);
  return s;
}

std::shared_ptr<CommunicatorImpl> CommunicatorImpl::world(std::shared_ptr<Node> node) {
  Services s = attach(*node);
  std::vector<int> members(static_cast<std::size_t>(node->size()));
  for (int r = 0; r < node->size(); ++r) members[static_cast<std::size_t>(r)] = r;
  const int rank = node->rank();
  return make(std::move(node), std::move(s), 0, std::move(members), rank);
}

std::shared_ptr<CommunicatorImpl> CommunicatorImpl::make(std::shared_ptr<Node> node, Services s, std::uint64_t id,
                                   std::vector<int> members, int rank) {
  auto g = std::make_shared<CommunicatorImpl>(std::move(node), std::move(s), id, std::move(members), rank);
  g->node_->watch_comm(g->id_, g->members_, rank,
                       [weak = std::weak_ptr<CommunicatorImpl>(g)](int failed_world, Errc code, const std::string& why) {
                         if (auto self = weak.lock()) self->on_event(failed_world, code, why);
                       });
  // The members' stall queries about this communicator, and the watchdog's look at it.
  g->rpc_->service().add(g->id_, g->local_of_, kStallQuery,
                         [rec = g->recorder_, weak = std::weak_ptr<Watchdog>(g->watchdog_)](
                             int, std::span<const std::byte> args) {
                           auto w = weak.lock();
                           return w ? w->answer(*rec, args) : std::vector<std::byte>{};
                         });
  g->watchdog_->add(std::make_shared<const Watchdog::Comm>(Watchdog::Comm{
      g->id_, rank, g->members_, g->recorder_, g->p2p_,
      [node = std::weak_ptr<Node>(g->node_), id = g->id_](const std::string& why) {
        if (auto n = node.lock()) n->revoke_comm(id, why);
      }}));
  return g;
}

CommunicatorImpl::CommunicatorImpl(std::shared_ptr<Node> node, Services s, std::uint64_t id, std::vector<int> members, int rank)
    : node_(std::move(node)),
      rpc_(std::move(s.rpc)),
      agreement_(std::move(s.agreement)),
      watchdog_(std::move(s.watchdog)),
      tracer_(std::move(s.tracer)),
      recorder_(std::make_shared<Recorder>(node_->config().recorder_ops)),
      id_(id),
      members_(std::move(members)),
      rank_(rank) {
  int known = node_->size();
  for (int m : members_) known = std::max(known, m + 1);
  auto local = std::make_shared<std::vector<int>>(static_cast<std::size_t>(known), -1);
  for (std::size_t i = 0; i < members_.size(); ++i)
    (*local)[static_cast<std::size_t>(members_[i])] = static_cast<int>(i);
  local_of_ = std::move(local);
  if (tracer_) recorder_->trace_to(tracer_, id_);
}

CommunicatorImpl::~CommunicatorImpl() {
  node_->unwatch_comm(id_);
  watchdog_->remove(id_);
  rpc_->service().remove(id_, kStallQuery);
  // Collectives still queued fail with Errc::closed; the thread is joined.
  if (runner_) runner_->stop();
}

bool CommunicatorImpl::is_open() const noexcept {
  return !closed_.load(std::memory_order_acquire) && node_->is_open();
}

void CommunicatorImpl::close() {
  closed_.store(true, std::memory_order_release);
  if (is_world() || joined_by_grow_) node_->close();
  {
    std::lock_guard lk(runner_mu_);
    if (runner_) runner_->stop();
  }
  // Rebuilt in place (FailurePolicy::automatic): the communicator the application holds
  // is the whole chain.
  std::shared_ptr<CommunicatorImpl> next;
  {
    std::lock_guard lk(fail_mu_);
    next = successor_;
  }
  if (next) next->close();
}

void CommunicatorImpl::check_open(const char* op) const {
  if (closed_.load(std::memory_order_acquire)) {
    ErrorContext ctx{op, rank_, -1, {}, {}};
    throw make_error(Errc::closed, ctx, "communicator is closed");
  }
  node_->check_open(op, -1);
  if (is_revoked()) throw_revoked(op);
}

std::vector<int> CommunicatorImpl::other_members(const char* op, const std::function<bool(int)>& keep) const {
  if (closed_.load(std::memory_order_acquire)) {
    ErrorContext ctx{op, rank_, -1, {}, {}};
    throw make_error(Errc::closed, ctx, "communicator is closed");
  }
  node_->check_open(op, -1);
  std::vector<int> out;
  for (int r = 0; r < size(); ++r)
    if (r != rank_ && keep(world_of(r))) out.push_back(r);
  return out;
}

std::vector<int> CommunicatorImpl::connected_peers() const {
  const std::vector<int> world = node_->connected_peers();
  return other_members("connected_peers",
                       [&world](int w) { return std::binary_search(world.begin(), world.end(), w); });
}

std::vector<int> CommunicatorImpl::neighbours() const {
  return other_members("neighbours", [this](int w) { return node_->routing().direct(w); });
}

void CommunicatorImpl::check_rank(const char* op, int r, bool allow_any) const {
  if (allow_any && r == any_source) return;
  if (r < 0 || r >= size()) {
    ErrorContext ctx{op, rank_, -1, {}, {}};
    throw make_error(Errc::invalid_argument, ctx,
                     "rank " + std::to_string(r) + " out of range [0, " + std::to_string(size()) + ")");
  }
}

void CommunicatorImpl::check_tag(const char* op, int tag, bool allow_any) const {
  if (allow_any && tag == any_tag) return;
  if (tag < 0 || tag > max_tag) {
    ErrorContext ctx{op, rank_, -1, {}, {}};
    throw make_error(Errc::invalid_argument, ctx,
                     "tag " + std::to_string(tag) + " out of range [0, " + std::to_string(max_tag) + "]");
  }
}

Request CommunicatorImpl::isend(Domain d, const char* op, int dest, int tag, std::span<const ConstBuffer> parts) {
  check_open(op);
  check_rank(op, dest, false);
  check_tag(op, tag, false);
  if (dest == rank_) {
    ErrorContext ctx{op, rank_, -1, {}, {}};
    throw make_error(Errc::invalid_argument, ctx,
                     "peer " + std::to_string(dest) + " is this rank; point-to-point needs another rank");
  }
  Node::P2p a{d, op, id_, tag, node_->config().op_timeout, local_of_};
  std::uint64_t bytes = 0;
  for (const ConstBuffer& p : parts) bytes += p.bytes;
  return watch_for_stall(watch_for_failure(node_->isend(a, world_of(dest), parts)), true, dest, tag, bytes);
}

Request CommunicatorImpl::irecv(Domain d, const char* op, int source, int tag, void* data, std::size_t cap) {
  check_open(op);
  check_rank(op, source, true);
  check_tag(op, tag, true);
  if (source == rank_) {
    ErrorContext ctx{op, rank_, -1, {}, {}};
    throw make_error(Errc::invalid_argument, ctx,
                     "peer " + std::to_string(source) + " is this rank; point-to-point needs another rank");
  }
  Node::P2p a{d, op, id_, tag, node_->config().op_timeout, local_of_};
  return watch_for_stall(
      watch_for_failure(node_->irecv(a, source == any_source ? any_source : world_of(source), data, cap)), false,
      source, tag, cap);
}

Request CommunicatorImpl::watch_for_stall(Request r, bool sending, int peer, int tag, std::uint64_t bytes) {
  const auto& st = Access::state(r);
  if (tracer_ && st) tracer_->p2p(id_, st, sending, peer, tag, bytes);
  // An eager send is done when it returns: only what still waits is worth a place.
  if (st && !st->done()) p2p_->add(PendingP2p::Op{st, sending, peer, tag, bytes});
  return r;
}

CollectiveRunner& CommunicatorImpl::runner() {
  std::lock_guard lk(runner_mu_);
  if (!runner_) runner_ = std::make_unique<CollectiveRunner>();
  return *runner_;
}

// ---- collectives ----------------------------------------------------------------------------

namespace {

thread_local int t_blocking_calls = 0;

// Where a started collective is: waiting on the collective thread, running, or given up
// before it ran (its deadline passed or it was cancelled while waiting).
constexpr int kQueued = 0, kRunning = 1, kGivenUp = 2;

std::chrono::milliseconds left(CollectivePort::Clock::time_point deadline) {
  auto d = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - CollectivePort::Clock::now());
  return std::max(d, std::chrono::milliseconds(1));
}

// Lets the thread waiting for a collective run it when it is next in line, and otherwise
// poll the engine like any waiter.
class CollectiveHelper final : public Progress {
 public:
  CollectiveHelper(std::weak_ptr<CommunicatorImpl> g, std::uint64_t task) : g_(std::move(g)), task_(task) {}
  bool poll(bool bounded) override {
    auto g = g_.lock();
    if (!g) return false;
    if (bounded) {
      // wait_for(d) must return by d: leave the collective to its thread.
      g->runner().kick(task_);
      return g->node().poll();
    }
    if (g->runner().ready(task_)) {
      // The collective's own waits poll while it runs; this wait must not count as a
      // poller meanwhile, or the engine would stop watching the socket while those waits
      // sleep.
      g->node().waiting(-1);
      bool ran = g->runner().help(task_);
      g->node().waiting(1);
      if (ran) return true;
    }
    return g->node().poll();
  }
  bool run_here() override {
    auto g = g_.lock();
    return g && g->runner().help(task_);
  }
  void waiting(int delta) override {
    if (auto g = g_.lock()) g->node().waiting(delta);
  }
  void settle() override {
    if (auto g = g_.lock()) g->node().settle();
  }
  std::chrono::microseconds settle_delay(std::chrono::steady_clock::time_point now) override {
    auto g = g_.lock();
    return g ? g->node().settle_delay(now) : std::chrono::microseconds(0);
  }
  void sleeping() override {
    if (auto g = g_.lock()) {
      g->runner().kick(task_);
      g->node().sleeping();
    }
  }
  void woke() override {
    if (auto g = g_.lock()) g->node().woke();
  }

 private:
  std::weak_ptr<CommunicatorImpl> g_;
  std::uint64_t task_;
};

}  // namespace

void CommunicatorImpl::blocking_calls(int delta) noexcept { t_blocking_calls += delta; }

Request CommunicatorImpl::isend(const char* op, std::int64_t tag, Clock::time_point deadline, int to,
                     const void* data, std::size_t bytes) {
  const Message m = message(tag, to, true);
  Node::P2p a{Domain::collective, op, id_, m.tag, left(deadline), local_of_};
  a.check = m.check;
  const Config& cfg = node_->config();
  a.eager_in_place = std::min({cfg.tuning.collective_eager_bytes, cfg.max_frame_bytes, cfg.stream_window, cfg.unexpected_limit});
  ConstBuffer b{data, bytes};
  return node_->isend(a, world_of(to), std::span<const ConstBuffer>(&b, 1));
}

Request CommunicatorImpl::irecv(const char* op, std::int64_t tag, Clock::time_point deadline, int from, void* data,
                     std::size_t bytes) {
  const Message m = message(tag, from, false);
  Node::P2p a{Domain::collective, op, id_, m.tag, left(deadline), local_of_, true};
  a.check = m.check;
  return node_->irecv(a, world_of(from), data, bytes);
}

CommunicatorImpl::Message CommunicatorImpl::message(Tag tag, int peer, bool sending) {
  std::lock_guard lk(messages_mu_);
  auto& [sent, received] = messages_[{tag, peer}];
  const auto call = calls_.find(tag);
  const std::uint16_t check = call == calls_.end() ? 0 : call->second;
  return {collective_message_tag(tag, sending ? sent++ : received++), check};
}

void CommunicatorImpl::note_call(Tag tag, std::uint16_t check) {
  {
    std::lock_guard lk(messages_mu_);
    calls_[tag] = check;
  }
  node_->collective_started(id_, tag, check);
}

void CommunicatorImpl::forget_messages(Tag tag, bool ran, bool ok) {
  {
    std::lock_guard lk(messages_mu_);
    messages_.erase(messages_.lower_bound({tag, std::numeric_limits<int>::min()}),
                    messages_.lower_bound({tag + 1, std::numeric_limits<int>::min()}));
    calls_.erase(tag);
  }
  if (ran) node_->collective_ended(id_, tag, ok);
}

std::byte* CommunicatorImpl::scratch(int slot, std::size_t bytes) { return runner().scratch(slot, bytes); }

Request CommunicatorImpl::start(const char* name, const CollectiveOptions& o, DataType t, ReduceOp op, CallShape shape,
                     std::function<void(const Coll&)> body) {
  return start_task(name, o, t, op, shape, std::move(body), t_blocking_calls > 0);
}

Request CommunicatorImpl::start_task(const char* name, const CollectiveOptions& o, DataType t, ReduceOp op, CallShape shape,
                          std::function<void(const Coll&)> body, bool caller_waits) {
  check_open(name);
  const Config& cfg = node_->config();
  const auto now = Clock::now();
  auto deadline = now + o.timeout.value_or(cfg.op_timeout);
  auto st = std::make_shared<OpState>(name, deadline, now);
  st->spin = cfg.spin;
  st->yield_when_idle = cfg.yield_when_idle;
  // Collectives start in the same order on every rank, so the n-th one gets the same tag
  // everywhere and its messages never match another collective's.
  // The call's fingerprint, which the recorder keeps and its messages carry (note_call).
  const std::uint16_t check = call_check(name, t, op, shape.root);
  const std::uint64_t number = recorder_->posted(
      Recorder::Call{name, shape.algorithm ? shape.algorithm : to_string(o.algorithm), check, shape.count,
                     shape.count * size_of(t), shape.root},
      now, false);
  const Tag tag = collective_tag(number);
  Coll c{*this, name, tag, deadline,
         o.segment_bytes ? o.segment_bytes : static_cast<std::size_t>(cfg.tuning.segment_bytes),
         o.algorithm, t, op};
  std::weak_ptr<OpState> weak = st;
  // A collective waits on the collective thread behind the ones started before it. If its
  // deadline passes (or it is cancelled) while it still waits there, it is given up at once
  // and never runs: nothing of it has moved, and it would otherwise wait for the earlier
  // one's own, possibly much later, deadline. Once it runs, its messages carry the deadline.
  auto phase = std::make_shared<std::atomic<int>>(kQueued);
  // Given up unrun: the recorder and the node's call registry learn that it failed here, so
  // the members' messages of it are not taken for a disagreement.
  auto give_up = [rec = recorder_, node = std::weak_ptr<Node>(node_), comm = id_, tag, number](Clock::time_point at) {
    rec->ended(number, at, false);
    if (auto n = node.lock()) n->collective_ended(comm, tag, false);
  };
  st->canceller = [weak, phase, name, rank = rank_, deadline, give_up,
                   ms = std::chrono::duration_cast<std::chrono::milliseconds>(o.timeout.value_or(cfg.op_timeout))](
                      Errc code) {
    int queued = kQueued;
    if (!phase->compare_exchange_strong(queued, kGivenUp)) return;
    const auto at = Clock::now();
    give_up(at);
    auto s = weak.lock();
    if (!s) return;
    if (at >= deadline) code = Errc::timeout;  // given up past its deadline: it timed out
    std::string why = code == Errc::timeout
                          ? "Timed out waiting " + std::to_string(ms.count()) +
                                " ms: an earlier collective of this communicator still runs (a member has not "
                                "called it yet)"
                          : std::string("cancelled before it started");
    s->complete(code, format_error(code, ErrorContext{name, rank, -1, {}, {}}, why));
  };
  std::uint64_t id = runner().submit(caller_waits, CollectiveRunner::Task{
      [c, st, phase, number, check, body = std::move(body), node = node_.get(), self = this]() {
        // However the operation ends, its message counts are done with. The communicator
        // outlives its running task (~CommunicatorImpl joins the runner first), as `body`
        // relies on too. It is never locked from a weak reference here: that copy could be
        // the last owner, and ~CommunicatorImpl must not run on the runner's own thread,
        // which it joins.
        struct Forget {
          CommunicatorImpl& g;
          Tag tag;
          bool ran = false, ok = false;
          ~Forget() { g.forget_messages(tag, ran, ok); }
        } forget{*self, c.tag};
        int queued = kQueued;
        if (!phase->compare_exchange_strong(queued, kRunning)) return;  // given up while queued
        Recorder& rec = *self->recorder_;
        rec.started(number, Clock::now());
        self->note_call(c.tag, check);
        forget.ran = true;
        Errc code = Errc::ok;
        std::string what;
        std::vector<int> failed;
        WaitMeter meter;
        meter.keep_spans = rec.tracing();
        try {
          Node::PollScope scope(*node);
          WaitMeter::Scope metered(&meter);
          body(c);
        } catch (const Error& e) {
          code = e.code();
          what = e.what();
          failed = e.failed_ranks();
          // A timeout carries what the stall report found, if one was made.
          if (code == Errc::timeout) what += self->stall_note(number);
        } catch (const std::exception& e) {
          code = Errc::io;
          what = std::string(c.name) + ": " + e.what();
        }
        // Recorded first, so whoever the operation wakes finds it ended in the recorder.
        rec.ended(number, Clock::now(), code == Errc::ok, &meter);
        forget.ok = code == Errc::ok;
        if (code == Errc::ok) st->succeed();
        else if (failed.empty()) st->complete(code, std::move(what));
        else st->fail_ranks(code, std::move(what), std::move(failed));
      },
      [weak, phase, name, rank = rank_, give_up] {
        // Abandoned unrun (the communicator closed): unless its deadline gave it up first.
        int queued = kQueued;
        if (!phase->compare_exchange_strong(queued, kGivenUp)) return;
        give_up(Clock::now());
        if (auto s = weak.lock())
          s->complete(Errc::closed, std::string(name) + ": rank " + std::to_string(rank) +
                                        ": communicator closed before the collective ran");
      }});
  // Only this thread touches `helper`, and before any waiter can see the Request.
  if (id != 0) st->helper = std::make_shared<CollectiveHelper>(weak_from_this(), id);
  return watch_for_failure(Access::make_request(st));
}

std::string CommunicatorImpl::stall_note(std::uint64_t number) const {
  std::string r = recorder_->report(number);
  return r.empty() ? r : " (" + r + ")";
}

std::string CommunicatorImpl::dump() const {
  return recorder_->json(id_, rank_, size());
}

void CommunicatorImpl::step(const char* name, Clock::time_point from, Clock::time_point to) noexcept {
  if (WaitMeter* m = WaitMeter::current()) m->add_step(name, from, to);
}

Stats CommunicatorImpl::stats() const {
  Stats s;
  s.ops = recorder_->totals();
  for (int r = 0; r < size(); ++r) {
    if (r == rank_) continue;
    PeerStats p = node_->peer_stats(world_of(r));
    p.rank = r;
    s.peers.push_back(std::move(p));
  }
  std::tie(s.receive_drops, s.send_drops) = node_->socket_drops();
  return s;
}

std::shared_ptr<CommunicatorImpl> CommunicatorImpl::split(int color, int key) {
  // Every member learns every (color, key) through an all_gather on this communicator.
  std::int64_t mine[2] = {color, key};
  std::vector<std::int64_t> all(2 * static_cast<std::size_t>(size()));
  const std::uint64_t seq = splits_.fetch_add(1);
  start("split", {}, DataType::i64, ReduceOp::sum, {2, -1},
        [&](const Coll& c) { coll::all_gather(c, mine, all.data(), 2); })
      .wait();
  if (color < 0) return nullptr;
  std::vector<std::pair<std::int64_t, int>> members;  // (key, parent rank)
  for (int r = 0; r < size(); ++r)
    if (all[2 * static_cast<std::size_t>(r)] == color)
      members.emplace_back(all[2 * static_cast<std::size_t>(r) + 1], r);
  std::sort(members.begin(), members.end());
  std::vector<int> world;
  int my_rank = -1;
  for (auto& [k, r] : members) {
    if (r == rank_) my_rank = static_cast<int>(world.size());
    world.push_back(world_of(r));
  }
  return make(node_, services(), split_id(id_, seq, color), std::move(world), my_rank);
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
