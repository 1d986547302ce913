#include "shm/doorbell.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include <nexar/error.hpp>

namespace nexar::shm {

Doorbell::Doorbell() : fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  if (fd_ < 0) throw Error(Errc::io, std::string("shared memory: eventfd: ") + std::strerror(errno));
}

Doorbell::~Doorbell() { ::close(fd_); }

void Doorbell::drain() noexcept {
  std::uint64_t v;
  while (::read(fd_, &v, sizeof v) == sizeof v) {
  }
}

void Doorbell::ring(int fd) noexcept {
  const std::uint64_t one = 1;
  // EAGAIN only when the counter is near overflow: it is readable already.
  [[maybe_unused]] ssize_t n = ::write(fd, &one, sizeof one);
}

}  // namespace nexar::shm
