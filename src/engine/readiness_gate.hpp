// A gate between a socket and the engine thread's reactor. The reactor waits on the gate
// (an epoll instance of its own holding the socket), not on the socket, so the socket can be
// taken out of the reactor's sight cheaply while user threads poll it themselves: a packet
// those threads will read anyway then wakes nobody. Waking the sleeping engine thread for
// every packet costs tens of microseconds on small hosts and, with few cores, takes the
// core a spinning user thread needs.
#pragma once

#include <mutex>

namespace nexar::detail {

class ReadinessGate {
 public:
  ReadinessGate() = default;
  ~ReadinessGate();
  ReadinessGate(const ReadinessGate&) = delete;
  ReadinessGate& operator=(const ReadinessGate&) = delete;

  /// Starts watching `fd` for input (replacing any earlier descriptor) and returns the
  /// gate's own descriptor, which is readable while `fd` is and the gate is open. The gate
  /// keeps its descriptor; callers must not close it. Throws std::system_error.
  int watch(int fd);
  /// Stops watching; call before the watched descriptor is closed. Idempotent.
  void unwatch();
  /// A thread starts (+1) or stops (-1) polling the socket itself; any thread. The gate is
  /// closed (the reactor does not see the socket) while any does. Reopening while input is
  /// pending makes the gate readable at once, so no packet that arrived while it was closed
  /// is left unseen.
  void add_pollers(int delta);
  /// Call from the reactor's handler before reading the socket: consumes the readiness
  /// the gate reported, so the next packet reports again (the gate is edge-triggered).
  void consume();
  int native() const noexcept { return epfd_; }

 private:
  bool add_locked();

  std::mutex mu_;
  int epfd_ = -1;
  int fd_ = -1;
  int pollers_ = 0;
  bool added_ = false; // whether fd_ is in the epoll set now
};

}  // namespace nexar::detail
