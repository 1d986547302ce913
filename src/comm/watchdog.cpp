#include "comm/watchdog.hpp"

#include <nexar/error.hpp>

#include <algorithm>
#include <optional>

#include <fmt/format.h>

#include "comm/dump_signal.hpp"
#include "core/call_check.hpp"
#include "core/log.hpp"
#include "rpc/rpc.hpp"
#include "wire/bytes.hpp"

namespace nexar::detail {

namespace {

// How long the watchdog waits for the members' answers before it reports without them.
constexpr std::chrono::seconds kAnswerWait{1};
// A reply's fixed part: called, completed, the fingerprint (docs/PROTOCOL.md).
constexpr std::size_t kAnswerHead = 18;

double seconds(Watchdog::Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// "rank 3 (last completed #7; in no operation)": how far a member has got, as it answered.
std::string progress(std::size_t rank, const Watchdog::Answer& a) {
  return fmt::format("rank {} ({}; {})", rank,
                     a.completed == 0 ? std::string("none completed") : fmt::format("last completed #{}", a.completed - 1),
                     a.doing);
}

}  // namespace

std::string describe(const OpRecord& r) {
  std::string s = fmt::format("{} #{}", r.op, r.number);
  if (r.op == "barrier") return s;
  s += fmt::format(" ({}, {} element{}", to_string(r.dtype), r.count, r.count == 1 ? "" : "s");
  if (kCallNames[call_kind(r.op)].reduces) s += fmt::format(", {}", to_string(r.reduce_op));
  if (r.root >= 0) s += fmt::format(", root {}", r.root);
  return s + ")";
}

Watchdog::Watchdog(std::chrono::milliseconds stall_warn, std::weak_ptr<Rpc> rpc)
    : stall_warn_(stall_warn), rpc_(std::move(rpc)) {
  if (stall_warn_.count() > 0) thread_ = std::thread([this] { run(); });
  add_to_dumps(this);
}

Watchdog::~Watchdog() {
  remove_from_dumps(this);  // first: a dump in progress holds it until done
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Watchdog::add(std::shared_ptr<const Comm> c) {
  std::lock_guard lk(mu_);
  comms_[c->id] = std::move(c);
}

void Watchdog::remove(std::uint64_t id) {
  std::lock_guard lk(mu_);
  comms_.erase(id);
}

std::vector<std::shared_ptr<const Watchdog::Comm>> Watchdog::registered() const {
  std::lock_guard lk(mu_);
  std::vector<std::shared_ptr<const Comm>> out;
  for (auto& [id, c] : comms_) out.push_back(c);
  return out;
}

std::string Watchdog::doing(Clock::time_point now) const {
  const auto comms = registered();
  // The oldest operation in flight on any communicator of the node.
  std::string what;
  Clock::time_point since = Clock::time_point::max();
  for (auto& c : comms) {
    if (auto r = c->recorder->oldest_open(); r && r->posted < since) {
      since = r->posted;
      what = fmt::format("{} of communicator {:#x}", describe(*r), c->id);
    }
    if (auto p = c->p2p->oldest(); p && p->state->start() < since) {
      since = p->state->start();
      what = fmt::format("{} on communicator {:#x}", describe(*p), c->id);
    }
  }
  if (what.empty()) return "in no operation";
  return fmt::format("in {} for {:.1f} s", what, seconds(now - since));
}

std::string Watchdog::dump() const {
  const auto comms = registered();
  const auto now = Clock::now();
  const int world = comms.empty() ? -1 : comms.front()->members[static_cast<std::size_t>(comms.front()->rank)];
  std::string out = fmt::format(R"({{"world_rank":{},"doing":{},"comms":[)", world, json_quote(doing(now)));
  bool first = true;
  for (auto& c : comms) {
    std::string pending = R"(,"pending":[)";
    bool first_op = true;
    for (const auto& op : c->p2p->open()) {
      if (!first_op) pending += ',';
      pending += json_quote(fmt::format("{} for {:.1f} s", describe(op), seconds(now - op.state->start())));
      first_op = false;
    }
    if (!first) out += ',';
    out += c->recorder->json(c->id, c->rank, static_cast<int>(c->members.size()), pending + "]");
    first = false;
  }
  return out + "]}";
}

std::vector<std::byte> Watchdog::answer(const Recorder& r, std::span<const std::byte> args) const {
  const std::string text = doing(Clock::now());
  std::uint16_t check = 0;
  if (args.size() >= 8)
    if (auto op = r.find(wire::get_u64(args.data()))) check = call_check(op->op, op->dtype, op->reduce_op, op->root);
  std::vector<std::byte> out(kAnswerHead + text.size());
  wire::put_u64(out.data(), r.called());
  wire::put_u64(out.data() + 8, r.completed());
  wire::put_u16(out.data() + 16, check);
  std::copy_n(reinterpret_cast<const std::byte*>(text.data()), text.size(), out.data() + kAnswerHead);
  return out;
}

Watchdog::Answer Watchdog::decode(std::span<const std::byte> reply) {
  Answer a;
  if (reply.size() < kAnswerHead) {
    a.doing = fmt::format("an answer of {} bytes, fewer than {}", reply.size(), kAnswerHead);
    return a;
  }
  a.ok = true;
  a.called = wire::get_u64(reply.data());
  a.completed = wire::get_u64(reply.data() + 8);
  a.check = wire::get_u16(reply.data() + 16);
  a.doing.assign(reinterpret_cast<const char*>(reply.data()) + kAnswerHead, reply.size() - kAnswerHead);
  return a;
}

std::string Watchdog::report(const Comm& c, const OpRecord& op, Clock::time_point now,
                             const std::vector<std::optional<Answer>>& answers) {
  std::string s = fmt::format("stall: {} of communicator {:#x} has waited {:.1f} s on rank {} of {}", describe(op),
                              c.id, seconds(now - op.posted), c.rank, c.members.size());
  std::string missing, silent, inside, past;
  int in_it = 0, done = 0;
  static const Answer none;  // ours, never asked
  for (std::size_t r = 0; r < answers.size(); ++r) {
    const Answer& a = answers[r] ? *answers[r] : none;
    if (static_cast<int>(r) == c.rank || (a.ok && a.called > op.number && a.completed <= op.number)) {
      inside += fmt::format("{}{}", in_it++ ? ", " : "", r);
    } else if (!a.ok) {
      silent += fmt::format("{}rank {} ({})", silent.empty() ? "" : ", ", r, a.doing);
    } else if (a.called <= op.number) {
      missing += fmt::format("{}{}", missing.empty() ? "" : ", ", progress(r, a));
    } else {
      past += fmt::format("{}{}", done++ ? ", " : "", r);  // its part is over (a root, a sender)
    }
  }
  if (!missing.empty()) s += "; not called by " + missing;
  if (!silent.empty()) s += "; no answer from " + silent;
  if (missing.empty() && silent.empty()) s += "; every member has called it";
  s += "; still in it: rank" + std::string(in_it > 1 ? "s " : " ") + inside;
  if (done) s += "; past it: rank" + std::string(done > 1 ? "s " : " ") + past;
  return s;
}

std::string Watchdog::report(const Comm& c, const PendingP2p::Op& op, Clock::time_point now,
                             const std::vector<std::optional<Answer>>& answers) {
  std::string s = fmt::format("stall: {} on communicator {:#x} has waited {:.1f} s on rank {} of {}", describe(op),
                              c.id, seconds(now - op.state->start()), c.rank, c.members.size());
  for (std::size_t r = 0; r < answers.size(); ++r) {
    if (!answers[r]) continue;
    const Answer& a = *answers[r];
    if (a.ok) s += "; " + progress(r, a);
    else s += fmt::format("; no answer from rank {} ({})", r, a.doing);
  }
  return s;
}

void Watchdog::run() {
  const auto period = std::clamp<std::chrono::milliseconds>(stall_warn_ / 4, std::chrono::milliseconds(10),
                                                            std::chrono::seconds(1));
  std::unique_lock lk(mu_);
  while (!stop_) {
    wake_.wait_for(lk, period, [this] { return stop_; });
    if (stop_) break;
    lk.unlock();
    look(Clock::now());
    lk.lock();
  }
}

void Watchdog::look(Clock::time_point now) {
  auto rpc = rpc_.lock();
  if (!rpc) return;
  const auto comms = registered();
  // A stalled operation, the members asked about it, and their answers.
  struct Stall {
    std::shared_ptr<const Comm> comm;
    std::optional<OpRecord> collective;
    std::optional<PendingP2p::Op> p2p;
    std::vector<std::optional<RpcCall>> calls;
    std::vector<std::optional<Answer>> answers;
  };
  std::vector<Stall> stalls;
  // Every rank to ask is asked at once; the answers are awaited together below.
  auto ask = [&](Stall& st, std::size_t r) {
    st.answers[r] = Answer{};
    // About a collective: its number, so the member says how it called it.
    std::byte number[8];
    std::span<const std::byte> args;
    if (st.collective) {
      wire::put_u64(number, st.collective->number);
      args = number;
    }
    try {
      st.calls[r] = rpc->call(st.comm->id, st.comm->members[r], kStallQuery, args, kAnswerWait);
    } catch (const Error& e) {
      st.answers[r]->doing = e.what();
    }
  };
  for (auto& c : comms) {
    const std::size_t n = c->members.size();
    const auto me = static_cast<std::size_t>(c->rank);
    if (auto op = c->recorder->oldest_open();
        op && now - op->posted >= stall_warn_ && c->recorder->first_report(op->number)) {
      Stall& st = stalls.emplace_back(Stall{c, std::move(op), std::nullopt, std::vector<std::optional<RpcCall>>(n),
                                            std::vector<std::optional<Answer>>(n)});
      for (std::size_t r = 0; r < n; ++r)
        if (r != me) ask(st, r);
    }
    for (auto& op : c->p2p->stalled(now, stall_warn_)) {
      Stall& st = stalls.emplace_back(
          Stall{c, std::nullopt, op, std::vector<std::optional<RpcCall>>(n), std::vector<std::optional<Answer>>(n)});
      for (std::size_t r = 0; r < n; ++r)
        if (r != me && (op.peer < 0 || static_cast<int>(r) == op.peer)) ask(st, r);
    }
  }
  for (auto& st : stalls) {
    for (std::size_t r = 0; r < st.calls.size(); ++r) {
      if (!st.calls[r]) continue;
      try {
        st.answers[r] = decode(st.calls[r]->wait());
      } catch (const Error& e) {
        // A member that has not made the communicator yet has no handler for it.
        st.answers[r]->doing =
            e.code() == Errc::unknown_rpc ? "it has no such communicator: not made yet, or closed" : e.what();
      }
    }
    const Comm& c = *st.comm;
    if (st.collective) {
      std::string text = report(c, *st.collective, Clock::now(), st.answers);
      log::warn("{}", text);
      c.recorder->set_report(st.collective->number, std::move(text));
      // Members in it that called it otherwise: nobody sent what the others wait for (in
      // a reduce where two ranks each take the other for the root), so no message told.
      const OpRecord& op = *st.collective;
      const std::uint16_t ours = call_check(op.op, op.dtype, op.reduce_op, op.root);
      for (std::size_t r = 0; r < st.answers.size(); ++r) {
        const auto& a = st.answers[r];
        if (!a || !a->ok || a->check == 0 || a->check == ours || !c.revoke) continue;
        c.revoke(calls_differ("collective #" + std::to_string(op.number), c.id, c.rank, ours, static_cast<int>(r),
                              a->check, static_cast<int>(c.members.size())));
        break;
      }
    } else {
      std::string text = report(c, *st.p2p, Clock::now(), st.answers);
      log::warn("{}", text);
      st.p2p->state->annotate(std::move(text));
    }
  }
}

}  // namespace nexar::detail
