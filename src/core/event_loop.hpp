// What an I/O component needs of the loop that drives it: to be called when its descriptors
// turn readable, to have work run later, and to say that packets moved. The progress engine
// (src/engine) implements it; the QUIC endpoint (src/quic) uses it. Neither module sees the
// other, so QUIC stays a leaf that knows no engine, no operation states and no threads.
//
// Everything the loop calls runs on its thread with its lock held, never two at a time.
#pragma once

#include <functional>
#include <vector>

namespace nexar::detail {

class EventLoop {
 public:
  /// Calls `ready` whenever one of `fds` may be readable, until unwatch() or until `ready`
  /// returns false. One watch per loop. Throws std::system_error.
  virtual void watch(std::vector<int> fds, std::function<bool()> ready) = 0;
  /// Stops watching; call before the watched descriptors close.
  virtual void unwatch() = 0;
  /// Runs `f` later, on the loop's thread.
  virtual void post(std::function<void()> f) = 0;
  /// Packets moved: the loop may keep polling a while rather than sleep at once.
  virtual void note_activity() noexcept = 0;

 protected:
  ~EventLoop() = default;
};

}  // namespace nexar::detail
