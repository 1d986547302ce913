// A rank's trace (Config::trace, NEXAR_TRACE=dir): every collective of its communicators as
// a span with the waits inside it as child spans, and every send and receive as a span, in
// Chrome's trace-event JSON, which Perfetto and chrome://tracing open. The rank writes
// `<dir>/nexar-trace-<rank>-<pid>.json` when the last of its communicators lets go of the
// tracer; `tools/trace/nexar-trace merge` puts the ranks on one timeline and names the
// straggler.
//
// Costs nothing unless on: no tracer exists then. When on, each event is formatted under a
// lock as it ends, and the whole trace stays in memory until written (at most kMaxBytes;
// events beyond are counted, not kept).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>

#include <nexar/recorder.hpp>

#include "engine/op_state.hpp"
#include "engine/wait_meter.hpp"

namespace nexar::detail {

class Tracer {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::size_t kMaxBytes = std::size_t{256} << 20;

  /// The trace of world rank `rank` of `world`, to be written into directory `dir`.
  Tracer(std::string dir, int rank, int world);
  /// Writes the file (errors are logged, not thrown).
  ~Tracer();
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;

  /// Collective `r` of communicator `comm` ended; `meter`, if any, holds its waits on its
  /// peers and its algorithm's steps, drawn inside its span.
  void collective(std::uint64_t comm, const OpRecord& r, const WaitMeter* meter);
  /// A send (or receive) of communicator `comm` to (from) communicator rank `peer` was
  /// posted: its span is drawn once it completes (its OpState must have stamp_end set).
  void p2p(std::uint64_t comm, std::shared_ptr<OpState> op, bool sending, int peer, int tag, std::uint64_t bytes);

  /// The file this tracer writes: `<dir>/nexar-trace-<rank>-<pid>.json`, or with `-2`,
  /// `-3`, ... before `.json` when that file exists when it is written.
  const std::string& path() const noexcept { return path_; }
  /// Writes the file now (also done by the destructor); returns false after logging why.
  bool write();

 private:
  struct Open {
    std::uint64_t comm;
    std::shared_ptr<OpState> op;
    bool sending;
    int peer, tag;
    std::uint64_t bytes;
  };
  void drain(bool all);     // mu_ held: draws the p2p operations that completed (all: and
                            // forgets the others)
  int track(std::uint64_t comm);  // mu_ held: the trace's thread id for `comm`
  void add(std::string event);    // mu_ held
  double us(Clock::time_point t) const noexcept;

  std::string dir_, path_;
  int rank_, world_;
  Clock::time_point zero_;
  double unix_us_at_zero_;
  std::mutex mu_;
  std::string events_;
  std::uint64_t dropped_ = 0;
  std::map<std::uint64_t, int> tracks_;
  std::deque<Open> open_;
  std::size_t sweep_at_ = 64;  // open_ size at which every completed entry is drawn
  bool written_ = false;
};

}  // namespace nexar::detail
