// A one-shot timer as a descriptor (timerfd on CLOCK_MONOTONIC, the clock of
// std::chrono::steady_clock), so the endpoint's loop watches it next to the socket
// (EventLoop::watch). Unlike an Asio timer, re-arming it from a user thread posts no
// cancelled handler to the loop's thread, so moving the deadline wakes nobody.
#pragma once

#include <cstdint>

namespace nexar::quic {

class WakeTimer {
 public:
  /// Throws std::system_error.
  WakeTimer();
  ~WakeTimer();
  WakeTimer(const WakeTimer&) = delete;
  WakeTimer& operator=(const WakeTimer&) = delete;

  /// Fires (the descriptor becomes readable) at `at_ns` on the steady clock, replacing
  /// any earlier setting; a time already past fires at once.
  void arm_at(std::uint64_t at_ns) noexcept;
  void disarm() noexcept;
  /// Clears a fired timer; returns whether it had fired.
  bool clear() noexcept;
  int fd() const noexcept { return fd_; }

 private:
  int fd_ = -1;
};

}  // namespace nexar::quic
