#include "quic/wake_timer.hpp"

#include <sys/timerfd.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

namespace nexar::quic {

WakeTimer::WakeTimer() : fd_(::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC)) {
  if (fd_ < 0) throw std::system_error(errno, std::generic_category(), "timerfd_create");
}

WakeTimer::~WakeTimer() { ::close(fd_); }

void WakeTimer::arm_at(std::uint64_t at_ns) noexcept {
  itimerspec spec{};
  // Zero would disarm: the earliest representable time fires at once instead.
  if (at_ns == 0) at_ns = 1;
  spec.it_value.tv_sec = static_cast<time_t>(at_ns / 1'000'000'000);
  spec.it_value.tv_nsec = static_cast<long>(at_ns % 1'000'000'000);
  ::timerfd_settime(fd_, TFD_TIMER_ABSTIME, &spec, nullptr);
}

void WakeTimer::disarm() noexcept {
  itimerspec spec{};
  ::timerfd_settime(fd_, 0, &spec, nullptr);
}

bool WakeTimer::clear() noexcept {
  std::uint64_t expirations = 0;
  return ::read(fd_, &expirations, sizeof expirations) == static_cast<ssize_t>(sizeof expirations);
}

}  // namespace nexar::quic
