#include "comm/recorder.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "comm/tracer.hpp"
#include "core/call_check.hpp"
#include "engine/wait_meter.hpp"

namespace nexar {

const char* to_string(OpRecord::State s) noexcept {
  switch (s) {
    case OpRecord::State::queued: return "queued";
    case OpRecord::State::running: return "running";
    case OpRecord::State::done: return "done";
    case OpRecord::State::failed: return "failed";
  }
  return "unknown";
}

namespace detail {
namespace {

constexpr std::uint64_t kNone = ~std::uint64_t{0};

// The writer's half of a slot's sequence lock: the version is odd from begin to end, and
// the release fence keeps the entry's stores after the odd version.
struct Writing {
  explicit Writing(std::atomic<std::uint64_t>& v) : version(v) {
    const std::uint64_t now = version.load(std::memory_order_relaxed);
    version.store(now + 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
  }
  ~Writing() { version.store(version.load(std::memory_order_relaxed) + 1, std::memory_order_release); }
  // One writer per entry at a time (recorder.hpp), so a load and a store advance it.
  Writing(const Writing&) = delete;
  Writing& operator=(const Writing&) = delete;
  std::atomic<std::uint64_t>& version;
};

void raise_to(std::atomic<std::uint64_t>& a, std::uint64_t v) noexcept {
  std::uint64_t cur = a.load(std::memory_order_relaxed);
  while (cur < v && !a.compare_exchange_weak(cur, v, std::memory_order_release, std::memory_order_relaxed)) {
  }
}

}  // namespace

// Below 16, two calls taking numbers at once on two threads could meet in one entry.
Recorder::Recorder(std::size_t capacity)
    : capacity_(capacity ? std::max<std::size_t>(capacity, 16) : 0),
      slots_(capacity_ ? std::make_unique<Slot[]>(capacity_) : nullptr) {}

Recorder::Slot* Recorder::slot_of(std::uint64_t number) noexcept {
  return capacity_ ? &slots_[number % capacity_] : nullptr;
}

std::uint64_t Recorder::posted(const Call& c, Clock::time_point at, bool running) noexcept {
  const std::uint64_t number = called_.fetch_add(1, std::memory_order_acq_rel);
  Slot* s = slot_of(number);
  if (!s) return number;
  // The entry a whole recorder older, still open or being written: it stays (see the
  // header). One seen done or failed, and not written meanwhile, has no writer left.
  const std::uint64_t v1 = s->version.load(std::memory_order_acquire);
  const auto state = static_cast<OpRecord::State>(s->state.load(std::memory_order_relaxed));
  const bool used = s->name.load(std::memory_order_relaxed) != nullptr;
  std::atomic_thread_fence(std::memory_order_acquire);
  if ((v1 & 1) != 0 || s->version.load(std::memory_order_relaxed) != v1 ||
      (used && (state == OpRecord::State::queued || state == OpRecord::State::running)))
    return number;
  const Clock::rep t = at.time_since_epoch().count();
  Writing w(s->version);
  s->number.store(number, std::memory_order_relaxed);
  s->name.store(c.name, std::memory_order_relaxed);
  s->algorithm.store(c.algorithm, std::memory_order_relaxed);
  s->check.store(c.check, std::memory_order_relaxed);
  s->root.store(c.root, std::memory_order_relaxed);
  s->count.store(c.count, std::memory_order_relaxed);
  s->bytes.store(c.bytes, std::memory_order_relaxed);
  s->posted.store(t, std::memory_order_relaxed);
  s->started.store(running ? t : 0, std::memory_order_relaxed);
  s->ended.store(0, std::memory_order_relaxed);
  s->state.store(static_cast<std::uint8_t>(running ? OpRecord::State::running : OpRecord::State::queued),
                 std::memory_order_relaxed);
  return number;
}

void Recorder::started(std::uint64_t number, Clock::time_point at) noexcept {
  Slot* s = slot_of(number);
  // An entry a whole recorder older than the newest call may have been taken over by now.
  if (!s || s->number.load(std::memory_order_relaxed) != number) return;
  Writing w(s->version);
  s->started.store(at.time_since_epoch().count(), std::memory_order_relaxed);
  s->state.store(static_cast<std::uint8_t>(OpRecord::State::running), std::memory_order_relaxed);
}

void Recorder::ended(std::uint64_t number, Clock::time_point at, bool ok, const WaitMeter* meter,
                     bool inline_mailbox) noexcept {
  raise_to(completed_, number + 1);
  if (!ok) failed_any_.store(true, std::memory_order_release);
  Slot* s = slot_of(number);
  if (!s || s->number.load(std::memory_order_relaxed) != number) return;
  const Clock::rep posted = s->posted.load(std::memory_order_relaxed);
  // Given up while queued: it never started, and says so with a start time of 0.
  const Clock::rep end = std::max(at.time_since_epoch().count(), posted);
  {
    Writing w(s->version);
    s->ended.store(end, std::memory_order_relaxed);
    s->state.store(static_cast<std::uint8_t>(ok ? OpRecord::State::done : OpRecord::State::failed),
                   std::memory_order_relaxed);
  }
  // This thread is the entry's one writer (see the header), so its fields hold still.
  const Clock::rep waited = meter ? meter->waited.count() : 0;
  Totals& k = totals_[inline_mailbox ? 1 : 0][(s->check.load(std::memory_order_relaxed) >> 10) & (kKinds - 1)];
  auto add = [inline_mailbox](auto& counter, auto v) {
    if (inline_mailbox) counter.store(counter.load(std::memory_order_relaxed) + v, std::memory_order_relaxed);
    else counter.fetch_add(v, std::memory_order_relaxed);
  };
  add(k.calls, std::uint64_t{1});
  if (!ok) add(k.failed, std::uint64_t{1});
  add(k.bytes, s->bytes.load(std::memory_order_relaxed));
  add(k.total, end - posted);
  if (waited) add(k.waiting, waited);
  if (tracing_) {
    try {
      auto t = tracer_.lock();
      if (auto r = t ? read(*s) : std::nullopt) t->collective(comm_, *r, meter);
    } catch (...) {  // out of memory: the trace misses it
    }
  }
}

void Recorder::trace_to(std::shared_ptr<Tracer> t, std::uint64_t comm) noexcept {
  tracing_ = t != nullptr;
  tracer_ = std::move(t);
  comm_ = comm;
}

std::vector<OpStats> Recorder::totals() const {
  std::vector<OpStats> out;
  for (std::size_t i = 0; i < kKinds; ++i) {
    OpStats o;
    Clock::rep total = 0, waiting = 0;
    for (const auto& set : totals_) {
      const Totals& k = set[i];
      o.calls += k.calls.load(std::memory_order_relaxed);
      o.failed += k.failed.load(std::memory_order_relaxed);
      o.bytes += k.bytes.load(std::memory_order_relaxed);
      total += k.total.load(std::memory_order_relaxed);
      waiting += k.waiting.load(std::memory_order_relaxed);
    }
    if (o.calls == 0) continue;
    // Kind 0: the library's own collectives (the members' vote on the mailboxes).
    o.op = i && i < std::size(kCallNames) ? std::string(kCallNames[i].name) : std::string("internal");
    o.total = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::duration(total));
    o.waiting = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::duration(waiting));
    out.push_back(std::move(o));
  }
  std::sort(out.begin(), out.end(), [](const OpStats& a, const OpStats& b) { return a.op < b.op; });
  return out;
}

std::optional<OpRecord> Recorder::read(const Slot& s) const {
  for (int attempt = 0; attempt < 64; ++attempt) {
    const std::uint64_t v1 = s.version.load(std::memory_order_acquire);
    if (v1 & 1) continue;
    const std::uint64_t number = s.number.load(std::memory_order_relaxed);
    const char* name = s.name.load(std::memory_order_relaxed);
    const char* algorithm = s.algorithm.load(std::memory_order_relaxed);
    const std::uint16_t check = s.check.load(std::memory_order_relaxed);
    const auto state = s.state.load(std::memory_order_relaxed);
    const int root = s.root.load(std::memory_order_relaxed);
    const std::uint64_t count = s.count.load(std::memory_order_relaxed), bytes = s.bytes.load(std::memory_order_relaxed);
    const Clock::rep posted = s.posted.load(std::memory_order_relaxed), started = s.started.load(std::memory_order_relaxed),
                     ended = s.ended.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (s.version.load(std::memory_order_relaxed) != v1) continue;
    if (number == kNone || !name) return std::nullopt;
    OpRecord r;
    r.number = number;
    r.op = name;
    r.algorithm = algorithm ? algorithm : "";
    r.dtype = check_type(check);
    r.reduce_op = check_op(check);
    r.count = count;
    r.bytes = bytes;
    r.root = root;
    r.posted = Clock::time_point(Clock::duration(posted));
    r.started = Clock::time_point(Clock::duration(started));
    r.ended = Clock::time_point(Clock::duration(ended));
    r.state = static_cast<OpRecord::State>(state);
    return r;
  }
  return std::nullopt;
}

std::vector<OpRecord> Recorder::snapshot() const {
  // By slot, not by the last numbers: an entry still open stays when a newer call skips it.
  std::vector<OpRecord> out;
  out.reserve(capacity_);
  for (std::size_t i = 0; i < capacity_; ++i)
    if (auto r = read(slots_[i])) out.push_back(std::move(*r));
  std::sort(out.begin(), out.end(), [](const OpRecord& a, const OpRecord& b) { return a.number < b.number; });
  return out;
}

std::optional<OpRecord> Recorder::find(std::uint64_t number) const {
  if (!capacity_) return std::nullopt;
  auto r = read(slots_[number % capacity_]);
  return r && r->number == number ? r : std::nullopt;
}

std::optional<OpRecord> Recorder::oldest_open() const {
  std::optional<OpRecord> oldest;
  for (std::size_t i = 0; i < capacity_; ++i) {
    auto r = read(slots_[i]);
    if (r && (r->state == OpRecord::State::queued || r->state == OpRecord::State::running) &&
        (!oldest || r->number < oldest->number))
      oldest = std::move(r);
  }
  return oldest;
}

std::string json_quote(std::string_view text) {
  std::string out = "\"";
  for (char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (ch == '"' || ch == '\\') out += {'\\', ch};
    else if (c < 0x20) out += fmt::format("\\u{:04x}", c);
    else out += ch;
  }
  return out + "\"";
}

std::string Recorder::json(std::uint64_t comm, int rank, int size, std::string_view more) const {
  // Steady times become wall-clock ones by their distance from now, so the dumps of ranks
  // on different hosts line up (as well as their clocks do).
  const auto steady_now = Clock::now();
  const auto wall_now = std::chrono::system_clock::now();
  auto wall_us = [&](Clock::time_point t) -> std::string {
    if (t == Clock::time_point{}) return "null";
    const auto wall = wall_now - std::chrono::duration_cast<std::chrono::system_clock::duration>(steady_now - t);
    return fmt::format("{}", std::chrono::duration_cast<std::chrono::microseconds>(wall.time_since_epoch()).count());
  };
  std::string out = fmt::format(R"({{"comm":"{:#x}","rank":{},"size":{},"called":{},"completed":{},"ops":[)", comm,
                                rank, size, called(), completed());
  bool first = true;
  for (const OpRecord& r : snapshot()) {
    out += fmt::format(
        R"({}{{"number":{},"op":{},"dtype":"{}","reduce_op":"{}","count":{},"bytes":{},"root":{},)"
        R"("algorithm":{},"state":"{}","posted_us":{},"started_us":{},"ended_us":{}}})",
        first ? "" : ",", r.number, json_quote(r.op), to_string(r.dtype), to_string(r.reduce_op), r.count, r.bytes,
        r.root, json_quote(r.algorithm), to_string(r.state), wall_us(r.posted), wall_us(r.started), wall_us(r.ended));
    first = false;
  }
  return out + "]" + std::string(more) + "}";
}

void Recorder::set_report(std::uint64_t number, std::string text) {
  std::lock_guard lk(report_mu_);
  report_number_ = number;
  report_ = std::move(text);
}

std::string Recorder::report(std::uint64_t number) const {
  std::lock_guard lk(report_mu_);
  return report_number_ == number ? report_ : std::string();
}

bool Recorder::first_report(std::uint64_t number) noexcept {
  std::uint64_t cur = reported_.load(std::memory_order_relaxed);
  while (cur <= number) {
    if (reported_.compare_exchange_weak(cur, number + 1, std::memory_order_relaxed)) return true;
  }
  return false;
}

}  // namespace detail
}  // namespace nexar
