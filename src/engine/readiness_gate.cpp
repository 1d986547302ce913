#include "engine/readiness_gate.hpp"

#include <sys/epoll.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

namespace nexar::detail {

namespace {
int new_epoll() {
  int fd = ::epoll_create1(EPOLL_CLOEXEC);
  if (fd < 0) throw std::system_error(errno, std::generic_category(), "epoll_create1");
  return fd;
}

// Edge-triggered: the reactor's handler reads until EAGAIN and then consume()s, so each
// later event links the descriptor into the ready list afresh and reports once.
bool add(int epfd, int fd) {
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLET;
  ev.data.fd = fd;
  return ::epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) == 0;
}
}  // namespace

ReadinessGate::~ReadinessGate() {
  if (outer_ >= 0) ::close(outer_);
  if (inner_ >= 0) ::close(inner_);
}

int ReadinessGate::watch(std::vector<int> fds) {
  std::lock_guard lk(mu_);
  if (outer_ < 0) {
    inner_ = new_epoll();
    outer_ = new_epoll();
    // Open from the start: pollers close it only once they settle().
    if (!add(outer_, inner_)) throw std::system_error(errno, std::generic_category(), "epoll_ctl(ADD)");
    open_.store(true, std::memory_order_relaxed);
  }
  for (int fd : fds_) ::epoll_ctl(inner_, EPOLL_CTL_DEL, fd, nullptr);
  fds_ = std::move(fds);
  for (int fd : fds_)
    if (!add(inner_, fd)) throw std::system_error(errno, std::generic_category(), "epoll_ctl(ADD)");
  return outer_;
}

void ReadinessGate::unwatch() {
  std::lock_guard lk(mu_);
  for (int fd : fds_) ::epoll_ctl(inner_, EPOLL_CTL_DEL, fd, nullptr);
  fds_.clear();
}

void ReadinessGate::add_pollers(int delta) {
  std::lock_guard lk(mu_);
  const int pollers = pollers_.fetch_add(delta, std::memory_order_relaxed) + delta;
  if (outer_ < 0) return;
  // One syscall: the watched descriptors stay in the inner set, and only the inner set
  // enters or leaves the outer one the reactor waits on.
  if (pollers == 0 && !open_.load(std::memory_order_relaxed)) open_.store(add(outer_, inner_), std::memory_order_relaxed);
}

void ReadinessGate::settle() {
  if (!open_.load(std::memory_order_relaxed)) return;
  std::lock_guard lk(mu_);
  if (outer_ < 0 || pollers_.load(std::memory_order_relaxed) == 0 || !open_.load(std::memory_order_relaxed)) return;
  ::epoll_ctl(outer_, EPOLL_CTL_DEL, inner_, nullptr);
  open_.store(false, std::memory_order_relaxed);
}

void ReadinessGate::consume() {
  if (outer_ < 0) return;
  epoll_event ev[4];
  while (::epoll_wait(outer_, ev, 4, 0) == 4) {
  }
  while (::epoll_wait(inner_, ev, 4, 0) == 4) {
  }
}

}  // namespace nexar::detail
