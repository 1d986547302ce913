// A communicator's flight recorder on this rank: the last Config::recorder_ops collectives
// it called, each with its number, call and times, and how far the rank has got (the
// numbers called and completed), which the stall reports compare across ranks.
//
// Always on, so recording must cost next to nothing beside an 8-byte all_reduce through
// the mailboxes (about 0.5 us here): no lock and no allocation, and on the mailbox path no
// clock read of its own (the runner's path reads the clock when a collective starts and
// ends). Readers (Communicator::recorder(), the watchdog, a peer's stall query) copy an
// entry without stopping the writers: each entry is a sequence lock over atomics, and a
// copy that overlapped a write is taken again.
//
// One writer per entry at a time: the thread that calls a collective writes its entry, then
// the one thread that starts and ends it (the runner, the caller, or whoever gives it up
// while queued; never two of them). A call whose entry would replace one still open (more
// than the recorder's size in flight at once) is counted but not recorded, so the open one,
// the likelier stall, stays, and no two threads ever write one entry.
#pragma once

#include <nexar/recorder.hpp>
#include <nexar/stats.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace nexar::detail {

class Tracer;
struct WaitMeter;

class Recorder {
 public:
  using Clock = std::chrono::steady_clock;

  /// Keeps the last `capacity` collectives, at least 16 unless 0 (0: none; the progress
  /// counts are kept anyway).
  explicit Recorder(std::size_t capacity);
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  /// What is known of a call when it is made.
  struct Call {
    const char* name;       // static text: the collective's name
    const char* algorithm;  // static text: to_string(Algorithm) or "mailbox"
    std::uint16_t check;    // its fingerprint (core/call_check.hpp): type and operator
    std::uint64_t count;
    std::uint64_t bytes;
    int root;
  };

  /// A collective was called at `at`: returns its number in the communicator (0, 1, 2, ...
  /// in the order of calls, so the same on every rank). `running`: it starts at once (a
  /// blocking call through the mailboxes), otherwise it is queued until started().
  std::uint64_t posted(const Call& c, Clock::time_point at, bool running) noexcept;
  void started(std::uint64_t number, Clock::time_point at) noexcept;
  /// Collective `number` ended at `at`; `meter`, if any, holds the time it was blocked on
  /// its peers (engine/wait_meter.hpp). Its entry, if still held, adds to the totals
  /// (Communicator::stats()) and goes to the tracer. `inline_mailbox`: it ran in its
  /// caller through the mailboxes, where one collective runs at a time, so its totals take
  /// plain stores instead of atomic additions (a tenth of an 8-byte collective otherwise).
  void ended(std::uint64_t number, Clock::time_point at, bool ok, const WaitMeter* meter = nullptr,
             bool inline_mailbox = false) noexcept;

  /// Draws every collective that ends from now on in `t`'s trace as one of communicator
  /// `comm`. Before any collective is posted.
  void trace_to(std::shared_ptr<Tracer> t, std::uint64_t comm) noexcept;
  /// Whether it traces: a collective's meter then keeps its waits' spans.
  bool tracing() const noexcept { return tracing_; }

  /// What the collectives that ended cost, per kind, ordered by name (OpStats).
  std::vector<OpStats> totals() const;

  /// Collectives called so far (the next number), and completed (the highest number that
  /// ended + 1; collectives of a communicator end in order, but for one given up while
  /// queued).
  std::uint64_t called() const noexcept { return called_.load(std::memory_order_acquire); }
  std::uint64_t completed() const noexcept { return completed_.load(std::memory_order_acquire); }
  /// Whether a collective ended with a failure here (given up while queued included): its
  /// members' messages of it may be left behind legitimately (CommunicatorImpl::mail_unwanted).
  bool failed_any() const noexcept { return failed_any_.load(std::memory_order_acquire); }

  /// The entries still held, oldest first.
  std::vector<OpRecord> snapshot() const;
  /// Entry `number`, if the recorder still holds it.
  std::optional<OpRecord> find(std::uint64_t number) const;
  /// The oldest entry that has not ended, if the recorder still holds it.
  std::optional<OpRecord> oldest_open() const;

  /// The recorder as one JSON object (Communicator::dump(), docs/CONFIG.md "Diagnosis"):
  /// the communicator, this rank, the progress counts and the entries, oldest first, with
  /// their times in microseconds since the Unix epoch (null when not reached yet).
  /// `more`: further members of the object, already JSON, each after a comma.
  std::string json(std::uint64_t comm, int rank, int size, std::string_view more = {}) const;

  /// The stall report about collective `number` (the watchdog's), kept so that its timeout
  /// can carry it; empty if none.
  void set_report(std::uint64_t number, std::string text);
  std::string report(std::uint64_t number) const;
  /// Marks collective `number` reported: true the first time for each number.
  bool first_report(std::uint64_t number) noexcept;

 private:
  struct Slot {
    std::atomic<std::uint64_t> version{0};  // odd while an entry is being written
    std::atomic<std::uint64_t> number{~std::uint64_t{0}};
    std::atomic<const char*> name{nullptr};
    std::atomic<const char*> algorithm{nullptr};
    std::atomic<std::uint16_t> check{0};
    std::atomic<std::uint8_t> state{0};
    std::atomic<int> root{-1};
    std::atomic<std::uint64_t> count{0}, bytes{0};
    std::atomic<Clock::rep> posted{0}, started{0}, ended{0};
  };
  Slot* slot_of(std::uint64_t number) noexcept;
  /// A consistent copy of `s`, or nothing if it is empty or kept changing.
  std::optional<OpRecord> read(const Slot& s) const;

  // Per collective kind (core/call_check.hpp's numbering), in two sets: [0] added to by
  // whichever thread ends a collective (atomic additions), [1] by the one caller running
  // a collective through the mailboxes at a time (plain stores). Relaxed: each is a
  // counter read on its own.
  struct Totals {
    std::atomic<std::uint64_t> calls{0}, failed{0}, bytes{0};
    std::atomic<Clock::rep> total{0}, waiting{0};
  };
  static constexpr std::size_t kKinds = 32;
  Totals totals_[2][kKinds];
  // Weak: the communicators own the tracer, and the trace is written when the last of them goes,
  // however long a Request's canceller keeps this recorder.
  std::weak_ptr<Tracer> tracer_;
  bool tracing_ = false;
  std::uint64_t comm_ = 0;

  std::size_t capacity_;  // before slots_, which it sizes
  std::unique_ptr<Slot[]> slots_;
  std::atomic<std::uint64_t> called_{0}, completed_{0};
  std::atomic<bool> failed_any_{false};
  std::atomic<std::uint64_t> reported_{0};  // numbers below this were reported
  mutable std::mutex report_mu_;
  std::uint64_t report_number_ = 0;
  std::string report_;
};

/// `text` as a JSON string, quotes included.
std::string json_quote(std::string_view text);

}  // namespace nexar::detail
