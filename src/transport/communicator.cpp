// nexar::Communicator: argument checks, then forwarding to the Group (point-to-point, RPC)
// or to the group's collective thread (collectives).
#include <nexar/communicator.hpp>

#include <cstring>

#include "collective/algorithms.hpp"
#include "collective/runner.hpp"
#include "core/error_format.hpp"
#include "reduce/reduce.hpp"
#include "transport/group.hpp"

namespace nexar {

using detail::Domain;
using detail::Group;

Communicator::Communicator(std::shared_ptr<detail::Group> group) : group_(std::move(group)) {}

detail::Group& Communicator::self() const {
  if (!group_) throw Error(Errc::invalid_argument, "communicator: used an empty Communicator");
  return *group_;
}

int Communicator::rank() const { return self().rank(); }
int Communicator::size() const { return self().size(); }
std::uint64_t Communicator::id() const { return self().id(); }
const Config& Communicator::config() const { return self().node().config(); }
bool Communicator::is_open() const { return group_ && group_->is_open(); }
void Communicator::close() {
  if (group_) group_->close();
}

void Communicator::check_element_multiple(const Status& s, std::size_t elem) {
  if (elem > 1 && s.bytes % elem != 0) {
    throw Error(Errc::invalid_argument,
                "recv: message of " + std::to_string(s.bytes) + " bytes from rank " +
                    std::to_string(s.source) + " is not a whole number of " + std::to_string(elem) +
                    "-byte elements");
  }
}

void Communicator::check_span_size(const char* op, std::size_t have, std::size_t need) {
  if (have < need) {
    throw Error(Errc::invalid_argument, std::string(op) + ": receive span holds " +
                                            std::to_string(have) + " elements, " +
                                            std::to_string(need) + " needed");
  }
}

// ---- point-to-point ----------------------------------------------------------------------

void Communicator::send(int dest, int tag, const void* data, std::size_t bytes) {
  isend(dest, tag, data, bytes).wait();
}
Request Communicator::isend(int dest, int tag, const void* data, std::size_t bytes) {
  ConstBuffer b{data, bytes};
  return self().isend(Domain::data, "send", dest, tag, std::span<const ConstBuffer>(&b, 1));
}
void Communicator::send_iov(int dest, int tag, std::span<const ConstBuffer> parts) {
  isend_iov(dest, tag, parts).wait();
}
Request Communicator::isend_iov(int dest, int tag, std::span<const ConstBuffer> parts) {
  return self().isend(Domain::data, "send_iov", dest, tag, parts);
}
Status Communicator::recv(int source, int tag, void* data, std::size_t capacity) {
  return irecv(source, tag, data, capacity).wait();
}
Request Communicator::irecv(int source, int tag, void* data, std::size_t capacity) {
  return self().irecv(Domain::data, "recv", source, tag, data, capacity);
}
void Communicator::stream_send(int dest, int tag, const void* data, std::size_t bytes) {
  istream_send(dest, tag, data, bytes).wait();
}
Request Communicator::istream_send(int dest, int tag, const void* data, std::size_t bytes) {
  ConstBuffer b{data, bytes};
  return self().isend(Domain::bulk, "stream_send", dest, tag, std::span<const ConstBuffer>(&b, 1));
}
Status Communicator::stream_recv(int source, int tag, void* data, std::size_t capacity) {
  return istream_recv(source, tag, data, capacity).wait();
}
Request Communicator::istream_recv(int source, int tag, void* data, std::size_t capacity) {
  return self().irecv(Domain::bulk, "stream_recv", source, tag, data, capacity);
}

// ---- RPC (world ranks: RPC is addressed to processes) -------------------------------------

void Communicator::register_rpc(RpcId id, RpcHandler handler) {
  if (!handler) throw Error(Errc::invalid_argument, "register_rpc: empty handler for id " + std::to_string(id));
  self().node().rpc().add(id, std::move(handler));
}

void Communicator::unregister_rpc(RpcId id) { self().node().rpc().remove(id); }

std::vector<std::byte> Communicator::rpc(int dest, RpcId id, std::span<const std::byte> args,
                                         std::optional<std::chrono::milliseconds> timeout) {
  std::vector<std::byte> reply;
  rpc_async(dest, id, args, &reply, timeout).wait();
  return reply;
}

Request Communicator::rpc_async(int dest, RpcId id, std::span<const std::byte> args,
                                std::vector<std::byte>* reply,
                                std::optional<std::chrono::milliseconds> timeout) {
  auto& g = self();
  g.check_open("rpc");
  g.check_rank("rpc", dest, false);
  auto& n = g.node();
  return n.rpc_call(g.world_of(dest), id, args, reply, timeout.value_or(n.config().rpc_timeout));
}

// ---- collectives ---------------------------------------------------------------------------

namespace {
thread_local int t_blocking_calls = 0;
}  // namespace

Communicator::BlockingCall::BlockingCall() noexcept { ++t_blocking_calls; }
Communicator::BlockingCall::~BlockingCall() { --t_blocking_calls; }

namespace {

using detail::Coll;

[[noreturn]] void bad(const Group& g, const char* op, const std::string& why) {
  detail::ErrorContext ctx{op, g.rank(), -1, {}, {}};
  throw detail::make_error(Errc::invalid_argument, ctx, why);
}

void check_buffer(const Group& g, const char* op, const char* what, const void* p, std::size_t count) {
  if (count && !p) bad(g, op, std::string("null ") + what + " buffer with count " + std::to_string(count));
}

void check_root(const Group& g, const char* op, int root) {
  if (root < 0 || root >= g.size())
    bad(g, op, "root " + std::to_string(root) + " out of range [0, " + std::to_string(g.size()) + ")");
}

void check_op(const Group& g, const char* op, DataType t, ReduceOp r) {
  if (!reduce::supports(t, r))
    bad(g, op, std::string("reduction ") + to_string(r) + " is not defined for " + to_string(t));
}

void check_algorithm(const Group& g, const char* op, Algorithm a, std::initializer_list<Algorithm> ok) {
  if (a == Algorithm::automatic) return;
  for (Algorithm x : ok)
    if (x == a) return;
  bad(g, op, std::string("algorithm ") + to_string(a) + " is not available for " + op);
}

// Every all_reduce variant takes the same algorithms.
void check_all_reduce_algorithm(const Group& g, const char* op, Algorithm a) {
  check_algorithm(g, op, a, {Algorithm::ring, Algorithm::halving_doubling, Algorithm::recursive_doubling});
}

void check_v(const Group& g, const char* op, std::span<const std::size_t> counts,
             std::span<const std::size_t> displs) {
  auto n = static_cast<std::size_t>(g.size());
  if (counts.size() != n || displs.size() != n)
    bad(g, op, "counts and displs need " + std::to_string(n) + " entries, got " +
                   std::to_string(counts.size()) + " and " + std::to_string(displs.size()));
}

// counts/displs of `count` elements per rank, back to back.
std::pair<std::shared_ptr<std::vector<std::size_t>>, std::shared_ptr<std::vector<std::size_t>>>
uniform_layout(int ranks, std::size_t count) {
  auto n = static_cast<std::size_t>(ranks);
  auto counts = std::make_shared<std::vector<std::size_t>>(n, count);
  auto displs = std::make_shared<std::vector<std::size_t>>(n);
  for (std::size_t i = 0; i < n; ++i) (*displs)[i] = i * count;
  return {counts, displs};
}

// Lets the thread waiting for a collective run it when it is next in line, and otherwise
// poll the engine like any waiter.
class CollectiveHelper final : public detail::Progress {
 public:
  CollectiveHelper(std::weak_ptr<Group> g, std::uint64_t task) : g_(std::move(g)), task_(task) {}
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
  std::weak_ptr<Group> g_;
  std::uint64_t task_;
};

// Starts `body` on the group's collective thread; the Request completes when it returns
// (or fails with the Error it throws).
template <class Body>
Request start(Group& g, const char* name, const CollectiveOptions& o, DataType t, ReduceOp op,
              Body body) {
  g.check_open(name);
  auto& cfg = g.node().config();
  auto timeout = o.timeout.value_or(cfg.op_timeout);
  auto deadline = std::chrono::steady_clock::now() + timeout;
  auto st = std::make_shared<detail::OpState>(name, deadline);
  st->spin = cfg.spin;
  st->yield_when_idle = cfg.yield_when_idle;
  Coll c{g, name, g.next_collective_tag(), deadline,
         o.segment_bytes ? o.segment_bytes : static_cast<std::size_t>(cfg.segment_bytes),
         o.algorithm, t, op};
  std::weak_ptr<detail::OpState> weak = st;
  std::uint64_t id = g.runner().submit(t_blocking_calls > 0, detail::CollectiveRunner::Task{
      [c, st, body]() mutable {
        try {
          detail::CommImpl::PollScope scope(c.g.node());
          body(c);
          st->succeed();
        } catch (const Error& e) {
          st->complete(e.code(), e.what());
        } catch (const std::exception& e) {
          st->complete(Errc::io, std::string(c.name) + ": " + e.what());
        }
      },
      [weak, name, rank = g.rank()] {
        if (auto s = weak.lock())
          s->complete(Errc::closed, std::string(name) + ": rank " + std::to_string(rank) +
                                        ": communicator closed before the collective ran");
      }});
  // Only this thread touches `helper`, and before any waiter can see the Request.
  if (id != 0) st->helper = std::make_shared<CollectiveHelper>(g.weak_from_this(), id);
  return Request(st);
}

}  // namespace

Request Communicator::iall_reduce(const void* send, void* recv, std::size_t count, DataType t,
                                  ReduceOp op, const CollectiveOptions& o) {
  auto& g = self();
  const char* name = "all_reduce";
  check_op(g, name, t, op);
  check_buffer(g, name, "send", send, count);
  check_buffer(g, name, "recv", recv, count);
  check_all_reduce_algorithm(g, name, o.algorithm);
  return start(g, name, o, t, op, [=](const Coll& c) { detail::coll::all_reduce(c, send, recv, count); });
}

Request Communicator::iall_reduce_bucketed(std::span<const MutableBuffer> buffers, DataType t,
                                           ReduceOp op, const CollectiveOptions& o) {
  auto& g = self();
  const char* name = "all_reduce_bucketed";
  check_op(g, name, t, op);
  check_all_reduce_algorithm(g, name, o.algorithm);
  auto bufs = std::make_shared<std::vector<MutableBuffer>>(buffers.begin(), buffers.end());
  std::size_t total = 0;
  for (auto& b : *bufs) {
    check_buffer(g, name, "bucket", b.data, b.count);
    total += b.count;
  }
  return start(g, name, o, t, op, [bufs, total](const Coll& c) {
    // One operation over the concatenation: pack, reduce, unpack.
    std::byte* flat = c.scratch(1, c.bytes(total));
    std::size_t off = 0;
    for (auto& b : *bufs) {
      if (b.count) std::memcpy(flat + off, b.data, c.bytes(b.count));
      off += c.bytes(b.count);
    }
    detail::coll::all_reduce(c, flat, flat, total);
    off = 0;
    for (auto& b : *bufs) {
      if (b.count) std::memcpy(b.data, flat + off, c.bytes(b.count));
      off += c.bytes(b.count);
    }
  });
}

Request Communicator::iall_reduce_sharded(const void* send, void* recv, void* shard, std::size_t count,
                                          DataType t, ReduceOp op, const CollectiveOptions& o) {
  auto& g = self();
  const char* name = "all_reduce_sharded";
  check_op(g, name, t, op);
  check_buffer(g, name, "send", send, count);
  if (!recv && !shard) bad(g, name, "recv and shard are both null: nothing to produce");
  check_algorithm(g, name, o.algorithm, {Algorithm::ring});
  return start(g, name, o, t, op,
               [=](const Coll& c) { detail::coll::all_reduce_sharded(c, send, recv, shard, count); });
}

Request Communicator::iall_reduce_compressed(void* data, std::size_t count, DataType t, ReduceOp op,
                                             ErrorFeedback& state, const CollectiveOptions& o) {
  auto& g = self();
  const char* name = "all_reduce_compressed";
  if (t != DataType::f32 && t != DataType::f64)
    bad(g, name, std::string("dtype ") + to_string(t) + " is not supported (f32 or f64)");
  if (op != ReduceOp::sum && op != ReduceOp::avg)
    bad(g, name, std::string("reduction ") + to_string(op) + " is not supported (sum or avg)");
  const double ratio = state.compression().ratio;
  if (!(ratio > 0.0 && ratio <= 1.0)) bad(g, name, "compression ratio " + std::to_string(ratio) + " outside (0, 1]");
  if (!state.residual_.empty() && state.residual_.size() != count * size_of(t))
    bad(g, name, "count " + std::to_string(count) + " differs from the previous step's " +
                     std::to_string(state.residual_.size() / size_of(t)) + " (reset() the state first)");
  check_buffer(g, name, "data", data, count);
  check_all_reduce_algorithm(g, name, o.algorithm);
  ErrorFeedback* st = &state;
  return start(g, name, o, t, op,
               [=](const Coll& c) { detail::coll::all_reduce_compressed(c, data, count, *st); });
}

Request Communicator::ibroadcast(void* buf, std::size_t count, DataType t, int root,
                                 const CollectiveOptions& o) {
  auto& g = self();
  const char* name = "broadcast";
  check_root(g, name, root);
  check_buffer(g, name, "", buf, count);
  check_algorithm(g, name, o.algorithm, {Algorithm::tree, Algorithm::ring});
  return start(g, name, o, t, ReduceOp::sum, [=](const Coll& c) { detail::coll::broadcast(c, buf, count, root); });
}

Request Communicator::ireduce(const void* send, void* recv, std::size_t count, DataType t, ReduceOp op,
                              int root, const CollectiveOptions& o) {
  auto& g = self();
  const char* name = "reduce";
  check_root(g, name, root);
  check_op(g, name, t, op);
  check_buffer(g, name, "send", send, count);
  if (g.rank() == root) check_buffer(g, name, "recv", recv, count);
  check_algorithm(g, name, o.algorithm, {Algorithm::tree});
  return start(g, name, o, t, op, [=](const Coll& c) { detail::coll::reduce(c, send, recv, count, root); });
}

Request Communicator::iall_gather(const void* send, void* recv, std::size_t count, DataType t,
                                  const CollectiveOptions& o) {
  auto& g = self();
  const char* name = "all_gather";
  check_buffer(g, name, "send", send, count);
  check_buffer(g, name, "recv", recv, count);
  check_algorithm(g, name, o.algorithm, {Algorithm::ring});
  return start(g, name, o, t, ReduceOp::sum, [=](const Coll& c) { detail::coll::all_gather(c, send, recv, count); });
}

Request Communicator::ireduce_scatter(const void* send, void* recv, std::size_t count, DataType t,
                                      ReduceOp op, const CollectiveOptions& o) {
  auto& g = self();
  const char* name = "reduce_scatter";
  check_op(g, name, t, op);
  check_buffer(g, name, "send", send, count);
  check_buffer(g, name, "recv", recv, block_of(count, g.size(), g.rank()).second);
  check_algorithm(g, name, o.algorithm, {Algorithm::ring});
  return start(g, name, o, t, op, [=](const Coll& c) { detail::coll::reduce_scatter(c, send, recv, count); });
}

Request Communicator::iall_to_all(const void* send, void* recv, std::size_t count, DataType t,
                                  const CollectiveOptions& o) {
  auto& g = self();
  const char* name = "all_to_all";
  check_buffer(g, name, "send", send, count);
  check_buffer(g, name, "recv", recv, count);
  check_algorithm(g, name, o.algorithm, {Algorithm::pairwise});
  auto [counts, displs] = uniform_layout(g.size(), count);
  return start(g, name, o, t, ReduceOp::sum, [=, counts = counts, displs = displs](const Coll& c) {
    detail::coll::all_to_all_v(c, send, *counts, *displs, recv, *counts, *displs);
  });
}

Request Communicator::igather(const void* send, void* recv, std::size_t count, DataType t, int root,
                              const CollectiveOptions& o) {
  auto& g = self();
  const char* name = "gather";
  check_root(g, name, root);
  check_buffer(g, name, "send", send, count);
  if (g.rank() == root) check_buffer(g, name, "recv", recv, count);
  check_algorithm(g, name, o.algorithm, {Algorithm::linear});
  auto [counts, displs] = uniform_layout(g.size(), count);
  return start(g, name, o, t, ReduceOp::sum, [=, counts = counts, displs = displs](const Coll& c) {
    detail::coll::gather_v(c, send, count, recv, *counts, *displs, root);
  });
}

Request Communicator::iscatter(const void* send, void* recv, std::size_t count, DataType t, int root,
                               const CollectiveOptions& o) {
  auto& g = self();
  const char* name = "scatter";
  check_root(g, name, root);
  if (g.rank() == root) check_buffer(g, name, "send", send, count);
  check_buffer(g, name, "recv", recv, count);
  check_algorithm(g, name, o.algorithm, {Algorithm::linear});
  auto [counts, displs] = uniform_layout(g.size(), count);
  return start(g, name, o, t, ReduceOp::sum, [=, counts = counts, displs = displs](const Coll& c) {
    detail::coll::scatter_v(c, send, *counts, *displs, recv, count, root);
  });
}

Request Communicator::iscan(const void* send, void* recv, std::size_t count, DataType t, ReduceOp op,
                            const CollectiveOptions& o) {
  auto& g = self();
  const char* name = "scan";
  check_op(g, name, t, op);
  check_buffer(g, name, "send", send, count);
  check_buffer(g, name, "recv", recv, count);
  check_algorithm(g, name, o.algorithm, {Algorithm::linear});
  return start(g, name, o, t, op, [=](const Coll& c) { detail::coll::scan(c, send, recv, count, false); });
}

Request Communicator::iexclusive_scan(const void* send, void* recv, std::size_t count, DataType t,
                                      ReduceOp op, const CollectiveOptions& o) {
  auto& g = self();
  const char* name = "exclusive_scan";
  check_op(g, name, t, op);
  check_buffer(g, name, "send", send, count);
  check_buffer(g, name, "recv", recv, count);
  check_algorithm(g, name, o.algorithm, {Algorithm::linear});
  return start(g, name, o, t, op, [=](const Coll& c) { detail::coll::scan(c, send, recv, count, true); });
}

Request Communicator::ibarrier(const CollectiveOptions& o) {
  auto& g = self();
  check_algorithm(g, "barrier", o.algorithm, {Algorithm::dissemination});
  return start(g, "barrier", o, DataType::u8, ReduceOp::sum, [](const Coll& c) { detail::coll::barrier(c); });
}

namespace {
using Counts = std::shared_ptr<std::vector<std::size_t>>;

Counts copy_of(std::span<const std::size_t> s) { return std::make_shared<std::vector<std::size_t>>(s.begin(), s.end()); }

// The own entry of a v-collective's counts must match the count this rank passes.
void check_own(const Group& g, const char* op, const char* what, std::size_t value,
               std::span<const std::size_t> counts, int index) {
  const std::size_t c = counts[static_cast<std::size_t>(index)];
  if (c != value)
    bad(g, op, std::string(what) + " " + std::to_string(value) + " differs from its entry in counts, " +
                   std::to_string(c));
}

// counts/displs of a rooted v-collective: checked and copied at the root, the only rank
// that reads them; empty elsewhere.
std::pair<Counts, Counts> root_layout(const Group& g, const char* op, int root,
                                      std::span<const std::size_t> counts,
                                      std::span<const std::size_t> displs, const char* own_name,
                                      std::size_t own) {
  if (g.rank() != root) {
    auto none = std::make_shared<std::vector<std::size_t>>();
    return {none, none};
  }
  check_v(g, op, counts, displs);
  check_own(g, op, own_name, own, counts, root);
  return {copy_of(counts), copy_of(displs)};
}
}  // namespace

Request Communicator::iall_gather_v(const void* send, std::size_t send_count, void* recv,
                                    std::span<const std::size_t> counts,
                                    std::span<const std::size_t> displs, DataType t,
                                    const CollectiveOptions& o) {
  auto& g = self();
  const char* name = "all_gather_v";
  check_v(g, name, counts, displs);
  check_buffer(g, name, "send", send, send_count);
  check_own(g, name, "send_count", send_count, counts, g.rank());
  check_algorithm(g, name, o.algorithm, {Algorithm::ring});
  auto cs = copy_of(counts), ds = copy_of(displs);
  return start(g, name, o, t, ReduceOp::sum, [=](const Coll& c) {
    detail::coll::all_gather_v(c, send, send_count, recv, *cs, *ds);
  });
}

Request Communicator::igather_v(const void* send, std::size_t send_count, void* recv,
                                std::span<const std::size_t> counts, std::span<const std::size_t> displs,
                                DataType t, int root, const CollectiveOptions& o) {
  auto& g = self();
  const char* name = "gather_v";
  check_root(g, name, root);
  check_buffer(g, name, "send", send, send_count);
  auto [cs, ds] = root_layout(g, name, root, counts, displs, "send_count", send_count);
  check_algorithm(g, name, o.algorithm, {Algorithm::linear});
  return start(g, name, o, t, ReduceOp::sum, [=, cs = cs, ds = ds](const Coll& c) {
    detail::coll::gather_v(c, send, send_count, recv, *cs, *ds, root);
  });
}

Request Communicator::iscatter_v(const void* send, std::span<const std::size_t> counts,
                                 std::span<const std::size_t> displs, void* recv, std::size_t recv_count,
                                 DataType t, int root, const CollectiveOptions& o) {
  auto& g = self();
  const char* name = "scatter_v";
  check_root(g, name, root);
  check_buffer(g, name, "recv", recv, recv_count);
  auto [cs, ds] = root_layout(g, name, root, counts, displs, "recv_count", recv_count);
  check_algorithm(g, name, o.algorithm, {Algorithm::linear});
  return start(g, name, o, t, ReduceOp::sum, [=, cs = cs, ds = ds](const Coll& c) {
    detail::coll::scatter_v(c, send, *cs, *ds, recv, recv_count, root);
  });
}

Request Communicator::iall_to_all_v(const void* send, std::span<const std::size_t> send_counts,
                                    std::span<const std::size_t> send_displs, void* recv,
                                    std::span<const std::size_t> recv_counts,
                                    std::span<const std::size_t> recv_displs, DataType t,
                                    const CollectiveOptions& o) {
  auto& g = self();
  const char* name = "all_to_all_v";
  check_v(g, name, send_counts, send_displs);
  check_v(g, name, recv_counts, recv_displs);
  check_own(g, name, "send_counts[rank]", send_counts[static_cast<std::size_t>(g.rank())], recv_counts,
            g.rank());
  check_algorithm(g, name, o.algorithm, {Algorithm::pairwise});
  auto sc = copy_of(send_counts), sd = copy_of(send_displs), rc = copy_of(recv_counts),
       rd = copy_of(recv_displs);
  return start(g, name, o, t, ReduceOp::sum, [=](const Coll& c) {
    detail::coll::all_to_all_v(c, send, *sc, *sd, recv, *rc, *rd);
  });
}

// ---- split ---------------------------------------------------------------------------------

Communicator Communicator::split(int color, int key) const {
  auto& g = self();
  const char* name = "split";
  // Every member learns every (color, key) through an all_gather on this communicator.
  std::int64_t mine[2] = {color, key};
  std::vector<std::int64_t> all(2 * static_cast<std::size_t>(g.size()));
  const std::uint64_t seq = g.next_split();
  start(g, name, {}, DataType::i64, ReduceOp::sum,
        [&](const Coll& c) { detail::coll::all_gather(c, mine, all.data(), 2); })
      .wait();
  if (color < 0) return Communicator();
  std::vector<std::pair<std::int64_t, int>> members;  // (key, parent rank)
  for (int r = 0; r < g.size(); ++r)
    if (all[2 * static_cast<std::size_t>(r)] == color)
      members.emplace_back(all[2 * static_cast<std::size_t>(r) + 1], r);
  std::sort(members.begin(), members.end());
  std::vector<int> world;
  int my_rank = -1;
  for (auto& [k, r] : members) {
    if (r == g.rank()) my_rank = static_cast<int>(world.size());
    world.push_back(g.world_of(r));
  }
  return Communicator(std::make_shared<Group>(g.node_ptr(), detail::split_id(g.id(), seq, color),
                                              std::move(world), my_rank));
}

}  // namespace nexar
