// A gate between a node's descriptors (its UDP socket and its timer) and the engine
// thread's reactor. The reactor waits on the gate, an epoll instance of its own that holds
// another one holding those descriptors, not on them directly, so they can be taken out of the reactor's sight
// cheaply while user threads poll the socket and run due timers themselves: a packet those
// threads will read anyway then wakes nobody. Waking the sleeping engine thread for every
// packet costs tens of microseconds on small hosts and, with few cores, takes the core a
// spinning user thread needs.
#pragma once

#include <atomic>
#include <mutex>
#include <vector>

namespace nexar::detail {

class ReadinessGate {
 public:
  ReadinessGate() = default;
  ~ReadinessGate();
  ReadinessGate(const ReadinessGate&) = delete;
  ReadinessGate& operator=(const ReadinessGate&) = delete;

  /// Starts watching `fds` for input (replacing any earlier ones) and returns the gate's
  /// own descriptor, which is readable while one of them is and the gate is open. The gate
  /// keeps its descriptor; callers must not close it. Throws std::system_error.
  int watch(std::vector<int> fds);
  /// Stops watching; call before the watched descriptors are closed. Idempotent.
  void unwatch();
  /// A thread starts (+1) or stops (-1) polling the descriptors itself; any thread. The
  /// gate may be closed (the reactor does not see them) only while some thread polls, and
  /// it reopens when the last one stops. Reopening while input is pending makes the gate
  /// readable at once, so nothing that arrived while it was closed is left unseen.
  void add_pollers(int delta);
  /// Closes the gate if some thread polls; any thread. Pollers call it once they have
  /// polled for a while: most short waits end before it, and then cost no system call at
  /// all (closing and reopening take one each).
  void settle();
  /// Threads polling now (a snapshot; any thread).
  int pollers() const noexcept { return pollers_.load(std::memory_order_relaxed); }

  /// Call from the reactor's handler before reading the descriptors: consumes the
  /// readiness the gate reported, so the next event reports again (edge-triggered).
  void consume();

 private:
  std::mutex mu_;
  int inner_ = -1;  // holds fds_ for good
  int outer_ = -1;  // what the reactor waits on; holds inner_ while the gate is open
  std::vector<int> fds_;
  std::atomic<int> pollers_{0};  // changed under mu_ only
  std::atomic<bool> open_{false};  // changed under mu_ only
};

}  // namespace nexar::detail
