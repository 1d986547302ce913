// Whether this node watches its shared-memory rings right now, as its peers on the host see
// it: each segment holds a word per side (shm::Segment::asleep), and this keeps this node's
// words in every segment in step with the threads that poll the node.
//
// A write into a ring used to ring the reader's doorbell every time: an eventfd write for
// the writer, and, for a reader whose engine thread sleeps, a wake-up. A reader that a
// thread is polling anyway needs neither. So a writer rings only while the reader's word is
// set, and the reader clears its word while some thread polls it (a waiting user thread,
// or its engine thread while that spins).
//
// No lost wake-up: a reader that stops watching sets its words first and then looks at
// every ring once more (Dekker's pattern, sequentially consistent on both sides), while a
// writer publishes its bytes first and then reads the word. Either the reader sees the
// bytes, or the writer sees the word and rings. The same holds for room freed for a
// waiting writer, with the roles swapped.
#pragma once

#include <atomic>
#include <mutex>
#include <vector>

namespace nexar::detail {

class ShmLink;

class ShmPresence {
 public:
  ShmPresence() = default;
  ShmPresence(const ShmPresence&) = delete;
  ShmPresence& operator=(const ShmPresence&) = delete;

  /// A link joins (from its constructor): its word follows this node's state from now on.
  void add(ShmLink& link);
  /// A link leaves (from its destructor, before its segment goes).
  void remove(ShmLink& link);

  /// Some thread now polls the rings (the number of such threads left zero): peers may
  /// stop ringing. Any thread.
  void watched();
  /// No thread polls them any more: every word is set, then every ring is looked at once
  /// more. Returns whether work was found there (bytes in, room that a waiting writer may
  /// not have been rung for, a lane left at its quantum): the caller must then ring().
  /// Any thread.
  bool unwatched();
  /// Whether some thread polls the rings now (a snapshot; any thread).
  bool is_watched() const noexcept { return watched_.load(std::memory_order_seq_cst); }
  /// Rings this node's own doorbell, so its engine comes back for the work. Any thread.
  void ring();

 private:
  std::mutex mu_;
  std::vector<ShmLink*> links_;
  std::atomic<bool> watched_{false};  // changed under mu_ only
};

}  // namespace nexar::detail
