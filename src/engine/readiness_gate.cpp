#include "engine/readiness_gate.hpp"

#include <sys/epoll.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

namespace nexar::detail {

ReadinessGate::~ReadinessGate() {
  if (epfd_ >= 0) ::close(epfd_);
}

int ReadinessGate::watch(std::vector<int> fds) {
  std::lock_guard lk(mu_);
  if (epfd_ < 0) {
    epfd_ = ::epoll_create1(EPOLL_CLOEXEC);
    if (epfd_ < 0) throw std::system_error(errno, std::generic_category(), "epoll_create1");
  }
  remove_locked();
  fds_ = std::move(fds);
  if (pollers_ == 0 && !add_locked())
    throw std::system_error(errno, std::generic_category(), "epoll_ctl(ADD)");
  return epfd_;
}

void ReadinessGate::unwatch() {
  std::lock_guard lk(mu_);
  remove_locked();
  fds_.clear();
}

bool ReadinessGate::add_locked() {
  // Edge-triggered: the reactor's handler reads until EAGAIN and then consume()s, so each
  // later event links the descriptor into the gate's ready list afresh and reports once.
  for (int fd : fds_) {
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLET;
    ev.data.fd = fd;
    // Fails only for a descriptor already closed, and then there is nothing to watch.
    if (::epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev) != 0) return false;
    added_ = true;
  }
  return true;
}

void ReadinessGate::remove_locked() {
  if (!added_) return;
  for (int fd : fds_) ::epoll_ctl(epfd_, EPOLL_CTL_DEL, fd, nullptr);
  added_ = false;
}

void ReadinessGate::add_pollers(int delta) {
  std::lock_guard lk(mu_);
  pollers_ += delta;
  if (fds_.empty()) return;
  if (pollers_ == 0 && !added_) {
    add_locked();
  } else if (pollers_ > 0) {
    remove_locked();
  }
}

void ReadinessGate::consume() {
  if (epfd_ < 0) return;
  epoll_event ev[4];
  while (::epoll_wait(epfd_, ev, 4, 0) == 4) {
  }
}

}  // namespace nexar::detail
