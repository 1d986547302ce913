// nexar._torch: a c10d::ProcessGroup for torch 1.13 that runs torch.distributed's operations
// on a nexar::Communicator. nexar/torch.py registers it as backend "nexar".
//
// Each operation starts the matching non-blocking nexar collective on the caller's thread and
// returns a WorkNexar at once. A Work completes (its future too, which DDP waits on) either
// when someone wait()s for it or on the process group's completion thread (Completer), so
// that DDP's future callbacks run without anyone polling.
#include <algorithm>
#include <atomic>
#include <cctype>
#include <charconv>
#include <cstring>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <numeric>
#include <thread>

#include <pybind11/chrono.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/utils/pybind.h>

#include <nexar/nexar.hpp>

namespace nexar_torch {

namespace py = pybind11;
using c10d::OpType;

// ---- tensors -------------------------------------------------------------------------------

// Checks what nexar can take: a dense CPU tensor. `what` names the operation and argument.
void check_cpu(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.device().is_cpu(), "nexar backend: ", what,
              ": CPU tensors only (this tensor is on ", t.device(),
              "); move it with .cpu() until nexar has a device adapter");
  TORCH_CHECK(t.layout() == c10::kStrided, "nexar backend: ", what,
              ": dense tensors only (this one is ", t.layout(), ")");
}

// A tensor's memory as one contiguous block: the tensor itself, or a contiguous copy that is
// copied back into it once the operation succeeds (for outputs).
struct Flat {
  at::Tensor user;
  at::Tensor flat;
  void* data() const { return flat.data_ptr(); }
  std::size_t bytes() const { return flat.numel() * flat.element_size(); }
  void copy_back() const {
    if (!user.is_same(flat)) user.copy_(flat.view_as(user));
  }
};

Flat flat_of(const at::Tensor& t, const char* what) {
  check_cpu(t, what);
  return {t, t.is_contiguous() ? t : t.contiguous()};
}

// The nexar element type of a reduction over `t`, and how many nexar elements it holds.
// Complex tensors reduce as pairs of reals, which is right for SUM and AVG only.
std::pair<nexar::DataType, std::size_t> reduction_type(const at::Tensor& t, nexar::ReduceOp op,
                                                       const char* what) {
  using nexar::DataType;
  const auto n = static_cast<std::size_t>(t.numel());
  const bool sum_like = op == nexar::ReduceOp::sum || op == nexar::ReduceOp::avg;
  switch (t.scalar_type()) {
    case at::kFloat: return {DataType::f32, n};
    case at::kDouble: return {DataType::f64, n};
    case at::kHalf: return {DataType::f16, n};
    case at::kBFloat16: return {DataType::bf16, n};
    case at::kChar: return {DataType::i8, n};
    case at::kByte: return {DataType::u8, n};
    case at::kInt: return {DataType::i32, n};
    case at::kLong: return {DataType::i64, n};
    case at::kBool:
      // Bytes of 0/1: MIN is a logical AND and MAX a logical OR.
      if (op == nexar::ReduceOp::min || op == nexar::ReduceOp::max) return {DataType::u8, n};
      break;
    case at::kComplexFloat:
      if (sum_like) return {DataType::f32, 2 * n};
      break;
    case at::kComplexDouble:
      if (sum_like) return {DataType::f64, 2 * n};
      break;
    default:
      break;
  }
  TORCH_CHECK(false, "nexar backend: ", what, ": cannot reduce ", t.scalar_type(), " tensors",
              " with ", nexar::to_string(op),
              " (nexar reduces float32, float64, float16, bfloat16, int8, uint8, int32 and int64;"
              " bool with MIN/MAX; complex with SUM/AVG)");
  return {};  // not reached
}

nexar::ReduceOp reduce_op(const c10d::ReduceOp& op, const char* what) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return nexar::ReduceOp::sum;
    case c10d::ReduceOp::PRODUCT: return nexar::ReduceOp::prod;
    case c10d::ReduceOp::MIN: return nexar::ReduceOp::min;
    case c10d::ReduceOp::MAX: return nexar::ReduceOp::max;
    case c10d::ReduceOp::AVG: return nexar::ReduceOp::avg;
    default: break;
  }
  const char* names[] = {"SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM"};
  const auto i = static_cast<std::size_t>(op.op_);
  TORCH_CHECK(false, "nexar backend: ", what, ": ReduceOp ", i < std::size(names) ? names[i] : "?",
              " is not supported (nexar has SUM, PRODUCT, MIN, MAX and AVG)");
  return nexar::ReduceOp::sum;  // not reached
}

void check_avg(nexar::ReduceOp op, nexar::DataType t, const char* what) {
  TORCH_CHECK(op != nexar::ReduceOp::avg || nexar::is_floating(t), "nexar backend: ", what,
              ": ReduceOp AVG needs a floating-point tensor (this one is ", nexar::to_string(t),
              ")");
}

const at::Tensor& single(const std::vector<at::Tensor>& v, const char* what) {
  TORCH_CHECK(v.size() == 1, "nexar backend: ", what,
              " takes exactly one tensor per call (got ", v.size(), ")");
  return v[0];
}

// ---- work ----------------------------------------------------------------------------------

class WorkNexar;

// How messages name group rank `group_rank`: "rank 2" when `ranks` (each member's rank in
// the default group) is empty or numbers it the same, else "rank 5 (group rank 1)".
std::string rank_name(const std::vector<int>& ranks, int group_rank) {
  const bool known = group_rank >= 0 && static_cast<std::size_t>(group_rank) < ranks.size();
  const int global = known ? ranks[static_cast<std::size_t>(group_rank)] : group_rank;
  std::string s = "rank " + std::to_string(global);
  if (global != group_rank) s += " (group rank " + std::to_string(group_rank) + ")";
  return s;
}

// What a process group's completion thread and its Works share: new Works, and the wake-ups
// (a new Work, a future asked for, the group stopping).
struct Inbox {
  std::mutex mutex;
  std::condition_variable cv;
  std::deque<c10::intrusive_ptr<WorkNexar>> queue;
  bool poked = false;
  bool stop = false;

  void poke() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      poked = true;
    }
    cv.notify_one();
  }
};

class WorkNexar : public c10d::Work {
 public:
  using Clock = std::chrono::steady_clock;

  // `ranks`: the group's numbering for messages (rank_name), shared with the group;
  // `timeout` bounds the operation as torch defines (the option given to the call, else the
  // group's). Messages are only composed when an operation times out.
  WorkNexar(int rank, OpType type, nexar::Request request, std::vector<at::Tensor> outputs,
            std::vector<at::Tensor> keep, std::function<void()> on_success,
            std::weak_ptr<Inbox> inbox, std::shared_ptr<const std::vector<int>> ranks,
            std::chrono::milliseconds timeout)
      : Work(rank, type),
        inbox_(std::move(inbox)),
        request_(std::move(request)),
        outputs_(std::move(outputs)),
        keep_(std::move(keep)),
        on_success_(std::move(on_success)),
        future_(c10::make_intrusive<c10::ivalue::Future>(
            c10::ListType::create(c10::TensorType::get()))),
        ranks_(std::move(ranks)),
        timeout_(timeout),
        // A timeout of centuries (timedelta.max) would overflow the clock's nanoseconds.
        deadline_(Clock::now() + std::min(timeout, std::chrono::milliseconds(std::chrono::hours(24 * 365 * 100)))) {}

  bool isCompleted() override {
    if (request_.test()) settle();
    return Work::isCompleted();
  }

  // Without a timeout of its own, a wait ends by the operation's deadline plus a short grace
  // for the operation to report its own error (a collective carries its deadline too, and
  // its error names the rank it waited for); past that it raises a timeout while the
  // operation is given up (a receive not yet matched ends at once; the completion thread
  // holds the tensors of anything still moving).
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override {
    if (timeout == kNoTimeout) {
      if (!finished_by(expiry())) {
        expire();
        if (!finished_by(Clock::now() + kGrace / 10)) {
          throw nexar::Error(nexar::Errc::timeout, timed_out_message("the operation is still running"));
        }
      }
    } else {
      const bool done = finished_by(Clock::now() + timeout);
      TORCH_CHECK(done, "nexar backend: ", c10d::opTypeToString(opType_), " still running after ",
                  timeout.count(), " ms (Work.wait timeout)");
    }
    settle();
    std::lock_guard<std::mutex> lock(mutex_);
    if (exception_) std::rethrow_exception(exception_);
    return true;
  }

  void abort() override { request_.cancel(); }
  std::vector<at::Tensor> result() override { return outputs_; }
  // Asking for the future (DDP does, for every bucket) tells the completion thread that
  // someone waits on it: from then on that thread waits for this Work actively.
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    if (!wanted_.exchange(true)) {
      if (auto in = inbox_.lock()) in->poke();
    }
    return future_;
  }
  bool wanted() const { return wanted_.load(); }
  int sourceRank() const override { return request_.test() ? request_.status().source : -1; }

  const nexar::Request& request() const { return request_; }
  // When the operation is given up if it has not ended: its deadline plus the grace.
  Clock::time_point expiry() const { return deadline_ + kGrace; }

  // The deadline passed: the operation is given up, and the error it then ends with is
  // reported as this timeout. Idempotent.
  void expire() {
    if (!expired_.exchange(true)) request_.cancel();
  }

  // Completes the Work once its request has finished: runs the copy-out step, records the
  // error, completes the future. Idempotent, from any thread.
  void settle() {
    std::call_once(settled_, [this] {
      std::exception_ptr error;
      try {
        request_.wait();  // finished: returns at once or throws its error
        if (on_success_) on_success_();
      } catch (const nexar::Error& e) {
        // torch's callers (and its tests) know a timeout by the words "Timed out".
        if (e.code() == nexar::Errc::timeout || (expired_ && e.code() == nexar::Errc::cancelled)) {
          error = std::make_exception_ptr(nexar::Error(nexar::Errc::timeout, timed_out_message(e.what())));
        } else {
          error = std::current_exception();
        }
      } catch (...) {
        error = std::current_exception();
      }
      on_success_ = nullptr;
      keep_.clear();
      finish(error);
      if (error) {
        future_->setError(error);
      } else {
        future_->markCompleted(c10::IValue(outputs_));
      }
    });
  }

 private:
  static constexpr std::chrono::milliseconds kGrace{1000};

  // Whether the request finished (well or not) by `until`.
  bool finished_by(Clock::time_point until) const {
    try {
      return request_.wait_for(std::max(until - Clock::now(), Clock::duration::zero()));
    } catch (const nexar::Error&) {
      return true;  // settle() records it
    }
  }

  std::string timed_out_message(const std::string& detail) const {
    std::string op = c10d::opTypeToString(opType_);
    std::transform(op.begin(), op.end(), op.begin(), [](unsigned char c) { return std::tolower(c); });
    std::string waited;
    if (const int peer = peer_in(detail); peer >= 0) waited = " for " + rank_name(*ranks_, peer);
    return "nexar backend: " + op + " on " + rank_name(*ranks_, rank_) + " Timed out waiting " +
           std::to_string(timeout_.count()) + " ms" + waited + ": " + detail;
  }

  // The peer a nexar error names ("<op>: rank R, peer P ...", core/error_format.cpp), or -1.
  static int peer_in(const std::string& message) {
    const auto at = message.find(", peer ");
    if (at == std::string::npos) return -1;
    int peer = -1;
    const char* first = message.data() + at + 7;
    std::from_chars(first, message.data() + message.size(), peer);
    return peer;
  }

  std::weak_ptr<Inbox> inbox_;
  std::atomic<bool> wanted_{false};
  std::atomic<bool> expired_{false};
  nexar::Request request_;
  std::vector<at::Tensor> outputs_;
  std::vector<at::Tensor> keep_;  // inputs and temporaries nexar reads or writes meanwhile
  std::function<void()> on_success_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::once_flag settled_;
  std::shared_ptr<const std::vector<int>> ranks_;
  std::chrono::milliseconds timeout_;
  Clock::time_point deadline_;
};

// The completion thread of a process group. It holds every Work until its operation ends
// (the Work may be the only owner of memory nexar writes into: packed temporaries, and
// tensors of a Work whose handle Python dropped) and settles it then. A Work whose future was
// asked for (DDP chains its buckets on them) is waited for actively, in start order, as
// collectives complete; the others are only checked every few milliseconds, since whoever
// needs them calls wait() and settles them on its own thread. Not spinning for those matters
// on a host with more ranks than cores, where every spinning thread takes a core from a rank.
class Completer {
 public:
  Completer() : inbox_(std::make_shared<Inbox>()), thread_([this] { run(); }) {}
  ~Completer() {
    {
      std::lock_guard<std::mutex> lock(inbox_->mutex);
      inbox_->stop = true;
    }
    inbox_->cv.notify_one();
    thread_.join();
  }
  Completer(const Completer&) = delete;
  Completer& operator=(const Completer&) = delete;

  std::weak_ptr<Inbox> inbox() const { return inbox_; }

  void add(c10::intrusive_ptr<WorkNexar> w) {
    {
      std::lock_guard<std::mutex> lock(inbox_->mutex);
      inbox_->queue.push_back(std::move(w));
    }
    inbox_->cv.notify_one();
  }

 private:
  void run() {
    using namespace std::chrono_literals;
    Inbox& in = *inbox_;
    std::vector<c10::intrusive_ptr<WorkNexar>> pending;
    bool cancelled = false;
    for (;;) {
      const auto now = WorkNexar::Clock::now();
      std::erase_if(pending, [now](const c10::intrusive_ptr<WorkNexar>& w) {
        if (!w->request().test()) {
          // Past its timeout, nobody may be waiting for it (a future's callbacks): give it
          // up here too, so that the future fails instead of waiting for nexar's own limit.
          if (now > w->expiry()) w->expire();
          return false;
        }
        w->settle();
        return true;
      });
      const bool wanted = std::any_of(pending.begin(), pending.end(),
                                      [](const auto& w) { return w->wanted(); });
      bool stopping = false;
      {
        std::unique_lock<std::mutex> lock(in.mutex);
        auto news = [&] { return in.stop || in.poked || !in.queue.empty(); };
        if (pending.empty()) {
          in.cv.wait(lock, news);
        } else if (!wanted) {
          in.cv.wait_for(lock, 5ms, news);
        }
        in.poked = false;
        for (auto& w : in.queue) pending.push_back(std::move(w));
        in.queue.clear();
        stopping = in.stop;
      }
      if (stopping && pending.empty()) return;
      // The group is going away: what is still pending is cancelled (on a communicator the
      // group owns, closing it already failed everything) and settled before the thread ends.
      if (stopping && !cancelled) {
        for (auto& w : pending) w->abort();
        cancelled = true;
      }
      auto first = std::find_if(pending.begin(), pending.end(),
                                [](const auto& w) { return w->wanted(); });
      if (first != pending.end()) {
        try {
          // Bounded, so that a stop or a newly wanted Work is seen within 50 ms.
          (void)(*first)->request().wait_for(50ms);
        } catch (const nexar::Error&) {
          // finished with an error: settled at the top of the loop
        }
      }
    }
  }

  std::shared_ptr<Inbox> inbox_;
  std::thread thread_;
};

// ---- the process group -------------------------------------------------------------------

class ProcessGroupNexar : public c10d::ProcessGroup {
 public:
  // `ranks`: the default group's rank of each member, for messages (empty: the same as the
  // group's own numbering).
  ProcessGroupNexar(nexar::Communicator comm, std::chrono::milliseconds timeout, bool owns,
                    std::vector<int> ranks)
      : ProcessGroup(comm.rank(), comm.size()),
        comm_(std::move(comm)),
        timeout_(timeout),
        owns_(owns),
        ranks_(std::make_shared<const std::vector<int>>(std::move(ranks))),
        completer_(std::make_unique<Completer>()) {
    TORCH_CHECK(ranks_->empty() || static_cast<int>(ranks_->size()) == getSize(),
                "nexar backend: the group has ", getSize(), " members but ", ranks_->size(),
                " global ranks were given");
    init();
  }

  ~ProcessGroupNexar() override {
    // Python drops the group with the GIL held, while the completer thread may need the GIL
    // to settle a Work (releasing tensors that Python objects own, running future callbacks):
    // it is released for the shutdown, which joins that thread.
    if (Py_IsInitialized() != 0 && PyGILState_Check() != 0) {
      py::gil_scoped_release r;
      shutdown();
    } else {
      shutdown();
    }
  }

  const std::string getBackendName() const override { return "nexar"; }

  const nexar::Communicator& communicator() const { return comm_; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    const Flat f = flat_of(single(tensors, "broadcast"), "broadcast");
    const int root = static_cast<int>(opts.rootRank);
    auto q = comm_.ibroadcast(f.data(), f.bytes(), nexar::DataType::u8, root, options(opts.timeout));
    return start(OpType::BROADCAST, q, {f.user}, {f.flat}, [f] { f.copy_back(); }, opts.timeout);
  }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    if (single(tensors, "allreduce").is_sparse()) return sparse_allreduce(tensors[0], opts);
    const Flat f = flat_of(single(tensors, "allreduce"), "allreduce");
    const auto op = reduce_op(opts.reduceOp, "allreduce");
    const auto [t, n] = reduction_type(f.flat, op, "allreduce");
    check_avg(op, t, "allreduce");
    auto q = comm_.iall_reduce(f.data(), f.data(), n, t, op, options(opts.timeout));
    return start(OpType::ALLREDUCE, q, {f.user}, {f.flat}, [f] { f.copy_back(); }, opts.timeout);
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override {
    TORCH_CHECK(!tensors.empty(), "nexar backend: allreduce_coalesced: no tensors");
    const auto op = reduce_op(opts.reduceOp, "allreduce_coalesced");
    auto flats = std::make_shared<std::vector<Flat>>();
    auto parts = std::make_shared<std::vector<nexar::MutableBuffer>>();
    std::optional<nexar::DataType> type;
    std::vector<at::Tensor> keep;
    for (const auto& t : tensors) {
      TORCH_CHECK(t.scalar_type() == tensors[0].scalar_type(),
                  "nexar backend: allreduce_coalesced: every tensor must have one dtype (",
                  tensors[0].scalar_type(), " and ", t.scalar_type(), " given)");
      flats->push_back(flat_of(t, "allreduce_coalesced"));
      const auto [dt, n] = reduction_type(flats->back().flat, op, "allreduce_coalesced");
      type = dt;
      parts->push_back({flats->back().data(), n});
      keep.push_back(flats->back().flat);
    }
    check_avg(op, *type, "allreduce_coalesced");
    auto q = comm_.iall_reduce_bucketed(*parts, *type, op, options(opts.timeout));
    return start(OpType::ALLREDUCE_COALESCED, q, tensors, std::move(keep), [flats, parts] {
      for (const auto& f : *flats) f.copy_back();
    }, opts.timeout);
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override {
    const Flat f = flat_of(single(tensors, "reduce"), "reduce");
    const auto op = reduce_op(opts.reduceOp, "reduce");
    const auto [t, n] = reduction_type(f.flat, op, "reduce");
    check_avg(op, t, "reduce");
    const int root = static_cast<int>(opts.rootRank);
    void* recv = getRank() == root ? f.data() : nullptr;
    auto q = comm_.ireduce(f.data(), recv, n, t, op, root, options(opts.timeout));
    return start(OpType::REDUCE, q, {f.user}, {f.flat}, [f] { f.copy_back(); }, opts.timeout);
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override {
    const Flat in = flat_of(single(inputs, "allgather"), "allgather");
    TORCH_CHECK(outputs.size() == 1, "nexar backend: allgather takes one output list");
    auto& outs = outputs[0];
    check_list(outs, in.flat, "allgather", "output_tensor_list");
    at::Tensor tmp = at::empty({getSize() * in.flat.numel()}, in.flat.options());
    auto q = comm_.iall_gather(in.data(), tmp.data_ptr(), in.bytes(), nexar::DataType::u8,
                               options(opts.timeout));
    return start(OpType::ALLGATHER, q, outs, {in.flat, tmp}, [outs, tmp] { unpack(tmp, outs); }, opts.timeout);
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override {
    const Flat in = flat_of(input, "_allgather_base");
    const Flat out = flat_of(output, "_allgather_base");
    TORCH_CHECK(out.flat.numel() == getSize() * in.flat.numel() &&
                    out.flat.scalar_type() == in.flat.scalar_type(),
                "nexar backend: all_gather_into_tensor: the output must hold world size x the "
                "input's elements, of the same dtype");
    auto q = comm_.iall_gather(in.data(), out.data(), in.bytes(), nexar::DataType::u8,
                               options(opts.timeout));
    return start(OpType::_ALLGATHER_BASE, q, {out.user}, {in.flat, out.flat},
                 [out] { out.copy_back(); }, opts.timeout);
  }

  // Each rank's input tensors, one after another as bytes, gathered in one all_gather:
  // outputs[r][i] receives rank r's inputs[i]. Tensors may differ in dtype and size among
  // themselves but not across ranks (a rank whose inputs add up to other bytes gets nexar's
  // size error).
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override {
    const char* op = "allgather_coalesced";
    TORCH_CHECK(!inputs.empty(), "nexar backend: ", op, ": no input tensors");
    TORCH_CHECK(static_cast<int>(outputs.size()) == getSize(), "nexar backend: ", op,
                ": output_tensor_lists must hold world size (", getSize(), ") lists, not ",
                outputs.size());
    for (const auto& t : inputs) check_cpu(t, op);
    for (std::size_t r = 0; r < outputs.size(); ++r) {
      TORCH_CHECK(outputs[r].size() == inputs.size(), "nexar backend: ", op, ": output list ", r,
                  " holds ", outputs[r].size(), " tensors, the input list ", inputs.size());
      for (std::size_t i = 0; i < inputs.size(); ++i) {
        const at::Tensor& o = outputs[r][i];
        check_cpu(o, op);
        TORCH_CHECK(o.sizes() == inputs[i].sizes() && o.scalar_type() == inputs[i].scalar_type(),
                    "nexar backend: ", op, ": output ", r, "[", i, "] is ", o.sizes(), " ",
                    o.scalar_type(), " but input ", i, " is ", inputs[i].sizes(), " ",
                    inputs[i].scalar_type());
      }
    }
    const at::Tensor in = pack_bytes(inputs);
    const auto bytes = static_cast<std::size_t>(in.numel());
    const at::Tensor all = at::empty({getSize() * in.numel()}, in.options());
    auto q = comm_.iall_gather(in.data_ptr(), all.data_ptr(), bytes, nexar::DataType::u8,
                               options(opts.timeout));
    std::vector<at::Tensor> results;
    for (const auto& list : outputs) results.insert(results.end(), list.begin(), list.end());
    return start(OpType::ALLGATHER_COALESCED, q, results, {in, all}, [outputs, all, bytes] {
      const auto* base = static_cast<const std::byte*>(all.data_ptr());
      for (std::size_t r = 0; r < outputs.size(); ++r) {
        const std::byte* p = base + r * bytes;
        for (const auto& t : outputs[r]) {
          copy_bytes_into(t, p);
          p += t.numel() * t.element_size();
        }
      }
    }, opts.timeout);
  }

  // Gloo's monitored barrier: rank 0 waits for every other member (in rank order), then
  // releases them. A member that has not arrived within the timeout is named; with
  // wait_all_ranks, every such member is. Blocks the caller. Messages use the reserved tag
  // nexar::max_tag of the group's communicator.
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override {
    const auto timeout = effective(opts.timeout);
    const auto deadline = WorkNexar::Clock::now() + timeout;
    const auto left = [&] {
      return std::max(deadline - WorkNexar::Clock::now(), WorkNexar::Clock::duration::zero());
    };
    // Whether `q` finished by the deadline; `why` gets its error, if it failed.
    const auto arrived = [&](const nexar::Request& q, std::string& why) {
      try {
        if (q.wait_for(left())) return true;
        q.cancel();
        why = "not arrived";
      } catch (const nexar::Error& e) {
        why = e.what();
      }
      return false;
    };
    const std::string ms = std::to_string(timeout.count()) + " ms";
    std::string why;
    if (getRank() != 0) {
      auto sent = comm_.isend(0, kMonitoredTag, nullptr, 0);
      auto released = comm_.irecv(0, kMonitoredTag, nullptr, 0);
      TORCH_CHECK(arrived(sent, why) && arrived(released, why), "nexar backend: monitored_barrier: ",
                  who(getRank()), " reached the barrier, but ", who(0), " did not release it within ",
                  ms, " (", why, ")");
      return;
    }
    std::vector<nexar::Request> arrivals;
    for (int r = 1; r < getSize(); ++r) arrivals.push_back(comm_.irecv(r, kMonitoredTag, nullptr, 0));
    std::vector<std::string> missing;
    for (int r = 1; r < getSize(); ++r) {
      if (!missing.empty() && !wait_all_ranks) {
        arrivals[static_cast<std::size_t>(r - 1)].cancel();
        continue;
      }
      if (!arrived(arrivals[static_cast<std::size_t>(r - 1)], why)) missing.push_back(who(r) + " (" + why + ")");
    }
    if (!missing.empty()) {
      std::string names;
      for (const auto& m : missing) names += (names.empty() ? "" : ", ") + m;
      TORCH_CHECK(false, "nexar backend: monitored_barrier: ", missing.size() == 1 ? "rank " : "ranks ",
                  "failed to pass monitoredBarrier in ", ms, ": ", names);
    }
    std::vector<nexar::Request> releases;
    for (int r = 1; r < getSize(); ++r) releases.push_back(comm_.isend(r, kMonitoredTag, nullptr, 0));
    for (std::size_t i = 0; i < releases.size(); ++i) {
      TORCH_CHECK(arrived(releases[i], why), "nexar backend: monitored_barrier: ", who(getRank()),
                  " could not release ", who(static_cast<int>(i) + 1), " within ", ms, " (", why, ")");
    }
  }

  // The group's collectives start in the same order on every member, so the count of those
  // started is the same on each (torch compares them to find a desynchronized group).
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return collectives_.load(); }

  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override {
    const Flat in = flat_of(single(inputs, "gather"), "gather");
    const int root = static_cast<int>(opts.rootRank);
    at::Tensor tmp;
    std::vector<at::Tensor> outs;
    if (getRank() == root) {
      TORCH_CHECK(outputs.size() == 1, "nexar backend: gather takes one output list at the root");
      outs = outputs[0];
      check_list(outs, in.flat, "gather", "gather_list");
      tmp = at::empty({getSize() * in.flat.numel()}, in.flat.options());
    } else {
      TORCH_CHECK(outputs.empty() || outputs[0].empty(),
                  "nexar backend: gather: gather_list is only given at the root");
    }
    auto q = comm_.igather(in.data(), tmp.defined() ? tmp.data_ptr() : nullptr, in.bytes(),
                           nexar::DataType::u8, root, options(opts.timeout));
    return start(OpType::GATHER, q, outs, {in.flat, tmp}, [outs, tmp] {
      if (tmp.defined()) unpack(tmp, outs);
    }, opts.timeout);
  }

  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override {
    const Flat out = flat_of(single(outputs, "scatter"), "scatter");
    const int root = static_cast<int>(opts.rootRank);
    at::Tensor tmp;
    if (getRank() == root) {
      TORCH_CHECK(inputs.size() == 1, "nexar backend: scatter takes one input list at the root");
      check_list(inputs[0], out.flat, "scatter", "scatter_list");
      tmp = pack(inputs[0]);
    } else {
      TORCH_CHECK(inputs.empty() || inputs[0].empty(),
                  "nexar backend: scatter: scatter_list is only given at the root");
    }
    auto q = comm_.iscatter(tmp.defined() ? tmp.data_ptr() : nullptr, out.data(), out.bytes(),
                            nexar::DataType::u8, root, options(opts.timeout));
    return start(OpType::SCATTER, q, {out.user}, {out.flat, tmp}, [out] { out.copy_back(); }, opts.timeout);
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    const Flat out = flat_of(single(outputs, "reduce_scatter"), "reduce_scatter");
    TORCH_CHECK(inputs.size() == 1, "nexar backend: reduce_scatter takes one input list");
    check_list(inputs[0], out.flat, "reduce_scatter", "input_list");
    const auto op = reduce_op(opts.reduceOp, "reduce_scatter");
    const at::Tensor in = pack(inputs[0]);
    const auto [t, n] = reduction_type(in, op, "reduce_scatter");
    check_avg(op, t, "reduce_scatter");
    // n splits evenly over the ranks, so nexar's block r is exactly input_list[r]'s slot.
    auto q = comm_.ireduce_scatter(in.data_ptr(), out.data(), n, t, op, options(opts.timeout));
    return start(OpType::REDUCE_SCATTER, q, {out.user}, {in, out.flat}, [out] { out.copy_back(); }, opts.timeout);
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override {
    const Flat in = flat_of(input, "_reduce_scatter_base");
    const Flat out = flat_of(output, "_reduce_scatter_base");
    TORCH_CHECK(in.flat.numel() == getSize() * out.flat.numel() &&
                    in.flat.scalar_type() == out.flat.scalar_type(),
                "nexar backend: reduce_scatter_tensor: the input must hold world size x the "
                "output's elements, of the same dtype");
    const auto op = reduce_op(opts.reduceOp, "reduce_scatter");
    const auto [t, n] = reduction_type(in.flat, op, "reduce_scatter");
    check_avg(op, t, "reduce_scatter");
    auto q = comm_.ireduce_scatter(in.data(), out.data(), n, t, op, options(opts.timeout));
    return start(OpType::_REDUCE_SCATTER_BASE, q, {out.user}, {in.flat, out.flat},
                 [out] { out.copy_back(); }, opts.timeout);
  }

  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override {
    const Flat in = flat_of(input, "all_to_all_single");
    const Flat out = flat_of(output, "all_to_all_single");
    TORCH_CHECK(in.flat.scalar_type() == out.flat.scalar_type(),
                "nexar backend: all_to_all_single: input and output dtypes differ");
    const auto world = static_cast<std::size_t>(getSize());
    if (input_splits.empty() && output_splits.empty()) {
      TORCH_CHECK(in.bytes() % world == 0 && out.bytes() == in.bytes(),
                  "nexar backend: all_to_all_single: input and output must have the same size, "
                  "divisible by the world size");
      auto q = comm_.iall_to_all(in.data(), out.data(), in.bytes() / world, nexar::DataType::u8,
                                 options(opts.timeout));
      return start(OpType::ALLTOALL_BASE, q, {out.user}, {in.flat, out.flat},
                   [out] { out.copy_back(); }, opts.timeout);
    }
    auto counts = std::make_shared<std::array<std::vector<std::size_t>, 4>>();
    split_bytes(in.flat, input_splits, "input_split_sizes", (*counts)[0], (*counts)[1]);
    split_bytes(out.flat, output_splits, "output_split_sizes", (*counts)[2], (*counts)[3]);
    auto& c = *counts;
    auto q = comm_.iall_to_all_v(in.data(), c[0], c[1], out.data(), c[2], c[3],
                                 nexar::DataType::u8, options(opts.timeout));
    return start(OpType::ALLTOALL_BASE, q, {out.user}, {in.flat, out.flat},
                 [out, counts] { out.copy_back(); }, opts.timeout);
  }

  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override {
    const auto world = static_cast<std::size_t>(getSize());
    TORCH_CHECK(inputs.size() == world && outputs.size() == world,
                "nexar backend: all_to_all takes world-size lists of inputs and outputs");
    auto counts = std::make_shared<std::array<std::vector<std::size_t>, 4>>();
    auto& c = *counts;
    for (const auto& t : inputs) {
      check_cpu(t, "all_to_all");
      c[0].push_back(t.numel() * t.element_size());
    }
    for (const auto& t : outputs) {
      check_cpu(t, "all_to_all");
      c[2].push_back(t.numel() * t.element_size());
    }
    c[1] = prefix(c[0]);
    c[3] = prefix(c[2]);
    const at::Tensor in = pack_bytes(inputs);
    const at::Tensor out = at::empty({static_cast<int64_t>(c[3].back() + c[2].back())},
                                     at::TensorOptions().dtype(at::kByte));
    auto q = comm_.iall_to_all_v(in.data_ptr(), c[0], c[1], out.data_ptr(), c[2], c[3],
                                 nexar::DataType::u8, options(opts.timeout));
    return start(OpType::ALLTOALL, q, outputs, {in, out}, [outputs, out, counts] {
      const auto* bytes = static_cast<const std::byte*>(out.data_ptr());
      for (std::size_t i = 0; i < outputs.size(); ++i) copy_bytes_into(outputs[i], bytes + (*counts)[3][i]);
    }, opts.timeout);
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    auto q = comm_.ibarrier(options(opts.timeout));
    return start(OpType::BARRIER, q, {}, {}, nullptr, opts.timeout);
  }

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst,
                                      int tag) override {
    const Flat f = flat_of(single(tensors, "send"), "send");
    auto q = comm_.isend(dst, tag, f.data(), f.bytes());
    return start(OpType::SEND, q, {f.user}, {f.flat}, nullptr);
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src,
                                      int tag) override {
    const Flat f = flat_of(single(tensors, "recv"), "recv");
    auto q = comm_.irecv(src, tag, f.data(), f.bytes());
    return start(OpType::RECV, q, {f.user}, {f.flat}, [f] { f.copy_back(); });
  }

  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors,
                                               int tag) override {
    const Flat f = flat_of(single(tensors, "recv"), "recv");
    auto q = comm_.irecv(nexar::any_source, tag, f.data(), f.bytes());
    return start(OpType::RECVANYSOURCE, q, {f.user}, {f.flat}, [f] { f.copy_back(); });
  }

 private:
  // Pending operations must end before the completer stops: closing our communicator fails
  // them at once; a shared one is left open and the completer cancels what is pending.
  void shutdown() {
    if (owns_) comm_.close();
    completer_.reset();
  }

  // An operation's timeout as torch defines it: its own option, else the group's.
  std::chrono::milliseconds effective(std::chrono::milliseconds timeout) const {
    return timeout == c10d::kUnsetTimeout ? timeout_ : timeout;
  }

  nexar::CollectiveOptions options(std::chrono::milliseconds timeout) const {
    nexar::CollectiveOptions o;
    o.timeout = effective(timeout);
    return o;
  }

  std::string who(int group_rank) const { return rank_name(*ranks_, group_rank); }

  c10::intrusive_ptr<c10d::Work> start(OpType type, nexar::Request q,
                                       std::vector<at::Tensor> outputs,
                                       std::vector<at::Tensor> keep,
                                       std::function<void()> on_success,
                                       std::chrono::milliseconds timeout = c10d::kUnsetTimeout) {
    if (type != OpType::SEND && type != OpType::RECV && type != OpType::RECVANYSOURCE) ++collectives_;
    auto w = c10::make_intrusive<WorkNexar>(getRank(), type, std::move(q), std::move(outputs),
                                            std::move(keep), std::move(on_success), completer_->inbox(),
                                            ranks_, effective(timeout));
    completer_->add(w);
    return w;
  }

  static constexpr int kMonitoredTag = nexar::max_tag;

  // Gloo's sparse all_reduce (SUM only): every rank's coalesced indices and values are
  // gathered, concatenated in rank order and coalesced, which sums the duplicates; every
  // rank computes the same, so the results are identical. Runs on the caller's thread (the
  // sizes of each step depend on the one before) and returns a finished Work.
  c10::intrusive_ptr<c10d::Work> sparse_allreduce(at::Tensor& tensor, const c10d::AllreduceOptions& opts) {
    const char* op = "allreduce (sparse)";
    TORCH_CHECK(tensor.device().is_cpu(), "nexar backend: ", op, ": CPU tensors only (this one is on ",
                tensor.device(), ")");
    TORCH_CHECK(opts.reduceOp == c10d::ReduceOp::SUM, "nexar backend: ", op,
                ": sparse tensors reduce with SUM only");
    const auto o = options(opts.timeout);
    const at::Tensor in = tensor.coalesce();
    // What every rank must agree on, then this rank's count of entries.
    constexpr std::size_t kMaxDims = 24;
    TORCH_CHECK(static_cast<std::size_t>(in.dim()) <= kMaxDims, "nexar backend: ", op, ": at most ",
                kMaxDims, " dimensions (this tensor has ", in.dim(), ")");
    constexpr std::size_t kMeta = 4 + kMaxDims;
    std::vector<int64_t> meta(kMeta, -1);
    meta[0] = static_cast<int64_t>(in.scalar_type());
    meta[1] = in.sparse_dim();
    meta[2] = in.dim();
    for (int64_t d = 0; d < in.dim(); ++d) meta[static_cast<std::size_t>(4 + d)] = in.size(d);
    meta[3] = in._nnz();
    const auto world = static_cast<std::size_t>(getSize());
    std::vector<int64_t> metas(kMeta * world);
    comm_.all_gather(meta.data(), metas.data(), kMeta, nexar::DataType::i64, o);
    std::vector<std::size_t> nnz(world);
    for (std::size_t r = 0; r < world; ++r) {
      const int64_t* m = metas.data() + r * kMeta;
      const bool same = std::equal(m, m + 3, meta.data()) && std::equal(m + 4, m + kMeta, meta.data() + 4);
      TORCH_CHECK(same, "nexar backend: ", op, ": ", who(static_cast<int>(r)), " has a sparse ",
                  static_cast<at::ScalarType>(m[0]), " tensor of ", m[2], " dimensions (", m[1],
                  " sparse) unlike ", who(getRank()), "'s ", in.scalar_type(), " tensor of sizes ",
                  in.sizes(), " (", in.sparse_dim(), " sparse)");
      nnz[r] = static_cast<std::size_t>(m[3]);
    }
    const at::Tensor indices = in._indices().contiguous();  // [sparse_dim, nnz]
    const at::Tensor values = in._values().contiguous();    // [nnz, dense sizes...]
    const auto sparse_dim = static_cast<std::size_t>(in.sparse_dim());
    std::size_t row = static_cast<std::size_t>(values.element_size());  // bytes of one entry's values
    for (int64_t d = 1; d < values.dim(); ++d) row *= static_cast<std::size_t>(values.size(d));
    std::vector<std::size_t> icounts(world), vcounts(world);
    for (std::size_t r = 0; r < world; ++r) {
      icounts[r] = sparse_dim * nnz[r];
      vcounts[r] = row * nnz[r];
    }
    const auto idispls = prefix(icounts), vdispls = prefix(vcounts);
    const auto total = static_cast<int64_t>(std::accumulate(nnz.begin(), nnz.end(), std::size_t{0}));
    at::Tensor all_indices = at::empty({static_cast<int64_t>(idispls.back() + icounts.back())}, indices.options());
    at::Tensor all_values = at::empty({static_cast<int64_t>(vdispls.back() + vcounts.back())},
                                      at::TensorOptions().dtype(at::kByte));
    auto qi = comm_.iall_gather_v(indices.data_ptr(), icounts[static_cast<std::size_t>(getRank())],
                                  all_indices.data_ptr(), icounts, idispls, nexar::DataType::i64, o);
    auto qv = comm_.iall_gather_v(values.data_ptr(), vcounts[static_cast<std::size_t>(getRank())],
                                  all_values.data_ptr(), vcounts, vdispls, nexar::DataType::u8, o);
    qi.wait();
    qv.wait();
    // Rank r's indices are a [sparse_dim, nnz_r] block: side by side, they make the whole.
    std::vector<at::Tensor> blocks;
    for (std::size_t r = 0; r < world; ++r) {
      blocks.push_back(all_indices.narrow(0, static_cast<int64_t>(idispls[r]), static_cast<int64_t>(icounts[r]))
                           .view({static_cast<int64_t>(sparse_dim), static_cast<int64_t>(nnz[r])}));
    }
    std::vector<int64_t> value_sizes = values.sizes().vec();
    value_sizes[0] = total;
    const at::Tensor summed =
        at::sparse_coo_tensor(at::cat(blocks, 1), all_values.view(values.scalar_type()).view(value_sizes),
                              in.sizes(), in.options())
            .coalesce();
    tensor.copy_(summed);
    ++collectives_;
    return start(OpType::ALLREDUCE, nexar::Request{}, {tensor}, {}, nullptr, opts.timeout);
  }

  // Every tensor of a list has `like`'s dtype and size, and there is one per rank.
  void check_list(const std::vector<at::Tensor>& list, const at::Tensor& like, const char* op,
                  const char* arg) const {
    TORCH_CHECK(static_cast<int>(list.size()) == getSize(), "nexar backend: ", op, ": ", arg,
                " must hold world size (", getSize(), ") tensors, not ", list.size());
    for (const auto& t : list) {
      check_cpu(t, op);
      TORCH_CHECK(t.numel() == like.numel() && t.scalar_type() == like.scalar_type(),
                  "nexar backend: ", op, ": every tensor of ", arg, " must have ", like.numel(),
                  " elements of ", like.scalar_type(), " (got ", t.numel(), " of ",
                  t.scalar_type(), ")");
    }
  }

  // Counts and displacements in bytes of a split along dim 0 (empty: equal split).
  void split_bytes(const at::Tensor& t, const std::vector<int64_t>& splits, const char* arg,
                   std::vector<std::size_t>& counts, std::vector<std::size_t>& displs) const {
    const auto world = static_cast<std::size_t>(getSize());
    const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
    const std::size_t row_bytes =
        rows == 0 ? 0 : t.numel() * t.element_size() / static_cast<std::size_t>(rows);
    if (splits.empty()) {
      TORCH_CHECK(static_cast<std::size_t>(rows) % world == 0, "nexar backend: all_to_all_single: ",
                  rows, " rows do not split evenly over ", world, " ranks");
      counts.assign(world, static_cast<std::size_t>(rows) / world * row_bytes);
    } else {
      TORCH_CHECK(splits.size() == world, "nexar backend: all_to_all_single: ", arg,
                  " must have world size entries");
      TORCH_CHECK(std::accumulate(splits.begin(), splits.end(), int64_t{0}) == rows,
                  "nexar backend: all_to_all_single: ", arg, " must add up to the ", rows,
                  " rows of the tensor");
      for (auto s : splits) counts.push_back(static_cast<std::size_t>(s) * row_bytes);
    }
    displs = prefix(counts);
  }

  static std::vector<std::size_t> prefix(const std::vector<std::size_t>& counts) {
    std::vector<std::size_t> d(counts.size());
    std::exclusive_scan(counts.begin(), counts.end(), d.begin(), std::size_t{0});
    return d;
  }

  // The tensors of a list, flattened into one contiguous tensor (rank order).
  static at::Tensor pack(const std::vector<at::Tensor>& list) {
    std::vector<at::Tensor> flat;
    for (const auto& t : list) flat.push_back(t.reshape({-1}));
    return at::cat(flat);
  }

  // The bytes of tensors of any dtypes, one after another.
  static at::Tensor pack_bytes(const std::vector<at::Tensor>& list) {
    std::vector<at::Tensor> bytes;
    for (const auto& t : list) {
      bytes.push_back(t.contiguous().reshape({-1}).view(at::kByte));
    }
    return at::cat(bytes);
  }

  static void copy_bytes_into(const at::Tensor& dst, const std::byte* src) {
    at::Tensor c = dst.is_contiguous() ? dst : at::empty_like(dst, at::MemoryFormat::Contiguous);
    std::memcpy(c.data_ptr(), src, c.numel() * c.element_size());
    if (!c.is_same(dst)) dst.copy_(c);
  }

  // Copies slot i of `tmp` (rank order) into list[i].
  static void unpack(const at::Tensor& tmp, const std::vector<at::Tensor>& list) {
    const int64_t n = list.empty() ? 0 : list[0].numel();
    for (std::size_t i = 0; i < list.size(); ++i) {
      list[i].copy_(tmp.narrow(0, static_cast<int64_t>(i) * n, n).view_as(list[i]));
    }
  }

  nexar::Communicator comm_;
  std::chrono::milliseconds timeout_;
  bool owns_;
  std::shared_ptr<const std::vector<int>> ranks_;  // each member's default-group rank, or empty
  std::atomic<std::uint64_t> collectives_{0};  // started on this group (its sequence number)
  std::unique_ptr<Completer> completer_;
};

}  // namespace nexar_torch

PYBIND11_MODULE(_torch, m) {
  using nexar_torch::ProcessGroupNexar;
  m.doc() = "nexar's torch.distributed backend; registered by `import nexar.torch`.";
  // The base class binding lives in torch; it must be registered before ours refers to it.
  py::module_::import("torch.distributed");
  py::class_<ProcessGroupNexar, c10::intrusive_ptr<ProcessGroupNexar>, c10d::ProcessGroup>(
      m, "ProcessGroupNexar",
      "A torch.distributed ProcessGroup on a nexar communicator (CPU tensors).")
      .def(py::init([](py::capsule comm, std::chrono::milliseconds timeout, bool owns,
                       std::vector<int> ranks) {
             auto* c = static_cast<nexar::Communicator*>(
                 PyCapsule_GetPointer(comm.ptr(), "nexar.Communicator"));
             if (c == nullptr) throw py::error_already_set();
             return c10::make_intrusive<ProcessGroupNexar>(*c, timeout, owns, std::move(ranks));
           }),
           py::arg("comm"), py::arg("timeout"), py::arg("owns") = true,
           py::arg("ranks") = std::vector<int>{},
           "comm: Communicator._capsule(); owns: close the communicator with the group; ranks: "
           "each member's rank in the default group (for messages; empty: the same numbering).");
}
