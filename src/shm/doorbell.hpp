// A rank's doorbell: an eventfd its engine watches, rung by the ranks of its host that
// share memory with it when they put bytes in its rings or free room in theirs. The
// descriptor travels to them over the attach socket (shm/attach.hpp).
#pragma once

namespace nexar::shm {

class Doorbell {
 public:
  /// Throws nexar::Error(Errc::io).
  Doorbell();
  ~Doorbell();
  Doorbell(const Doorbell&) = delete;
  Doorbell& operator=(const Doorbell&) = delete;

  int fd() const noexcept { return fd_; }
  /// Reads the rings so far, so the next ring wakes the watcher again.
  void drain() noexcept;
  /// Rings the doorbell whose eventfd is `fd` (ours or a peer's).
  static void ring(int fd) noexcept;

 private:
  int fd_;
};

}  // namespace nexar::shm
