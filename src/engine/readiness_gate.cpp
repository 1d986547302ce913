#include "engine/readiness_gate.hpp"

#include <sys/epoll.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

namespace nexar::detail {

ReadinessGate::~ReadinessGate() {
  if (epfd_ >= 0) ::close(epfd_);
}

int ReadinessGate::watch(int fd) {
  std::lock_guard lk(mu_);
  if (epfd_ < 0) {
    epfd_ = ::epoll_create1(EPOLL_CLOEXEC);
    if (epfd_ < 0) throw std::system_error(errno, std::generic_category(), "epoll_create1");
  }
  if (added_) ::epoll_ctl(epfd_, EPOLL_CTL_DEL, fd_, nullptr);
  added_ = false;
  fd_ = fd;
  if (pollers_ == 0 && !add_locked())
    throw std::system_error(errno, std::generic_category(), "epoll_ctl(ADD)");
  return epfd_;
}

void ReadinessGate::unwatch() {
  std::lock_guard lk(mu_);
  if (added_) ::epoll_ctl(epfd_, EPOLL_CTL_DEL, fd_, nullptr);
  added_ = false;
  fd_ = -1;
}

bool ReadinessGate::add_locked() {
  // Edge-triggered: the reactor's handler reads until EAGAIN and then consume()s, so each
  // later packet links the socket into the gate's ready list afresh and reports once.
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLET;
  ev.data.fd = fd_;
  added_ = ::epoll_ctl(epfd_, EPOLL_CTL_ADD, fd_, &ev) == 0;
  return added_;
}

void ReadinessGate::add_pollers(int delta) {
  std::lock_guard lk(mu_);
  pollers_ += delta;
  const bool open = pollers_ == 0;
  if (fd_ < 0 || open == added_) return;
  if (open) {
    // Fails only for a descriptor already closed, and then there is nothing to watch.
    add_locked();
  } else {
    ::epoll_ctl(epfd_, EPOLL_CTL_DEL, fd_, nullptr);
    added_ = false;
  }
}

void ReadinessGate::consume() {
  if (epfd_ < 0) return;
  epoll_event ev[4];
  while (::epoll_wait(epfd_, ev, 4, 0) == 4) {
  }
}

}  // namespace nexar::detail
