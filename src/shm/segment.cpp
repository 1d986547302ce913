#include "shm/segment.hpp"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <string>

#include <nexar/error.hpp>

namespace nexar::shm {

namespace {
constexpr std::uint32_t kMagic = 0x4853584e;  // "NXSH"
constexpr std::uint32_t kVersion = 4;

// The first 64 bytes: what the opener checks before it trusts the layout.
struct Header {
  std::uint32_t magic;
  std::uint32_t version;
  std::uint64_t ring_bytes;
  std::uint32_t lanes;
};
constexpr std::size_t kHeaderBytes = 64;
// Then each side's asleep word, on a line of its own: each is stored by one side and read
// by the other on every write.
constexpr std::size_t kAsleepBytes = 2 * 64;
// Then a mailbox per direction (shm/mailbox.hpp), then the rings.
constexpr std::size_t kMailboxBytes = 2 * Mailbox::footprint();
static_assert(Mailbox::footprint() % 64 == 0);
static_assert(std::atomic<std::uint32_t>::is_always_lock_free, "shared words must be lock-free");

std::size_t slot_bytes(std::size_t ring_bytes) { return (Ring::footprint(ring_bytes) + 63) & ~std::size_t{63}; }
std::size_t total_bytes(std::size_t ring_bytes) {
  return kHeaderBytes + kAsleepBytes + kMailboxBytes + 2 * Segment::lanes * slot_bytes(ring_bytes);
}

[[noreturn]] void fail_io(const char* what) {
  throw Error(Errc::io, std::string("shared memory: ") + what + ": " + std::strerror(errno));
}

// Closes `fd` and throws the error errno holds, naming `what`.
[[noreturn]] void close_and_fail(int fd, const char* what) {
  const int e = errno;
  ::close(fd);
  errno = e;
  fail_io(what);
}

// Maps `size` bytes of `fd`; closes it and throws on failure.
void* map_or_close(int fd, std::size_t size, bool populate) {
  void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | (populate ? MAP_POPULATE : 0), fd, 0);
  if (base == MAP_FAILED) close_and_fail(fd, "mmap");
  return base;
}
}  // namespace

Segment::Segment(int fd, void* base, std::size_t size, std::size_t ring_bytes)
    : fd_(fd), base_(base), size_(size) {
  auto* p = static_cast<std::uint8_t*>(base) + kHeaderBytes;
  for (int side = 0; side < 2; ++side) asleep_[side] = reinterpret_cast<std::atomic<std::uint32_t>*>(p + 64 * side);
  p += kAsleepBytes;
  for (int dir = 0; dir < 2; ++dir) mailboxes_.emplace_back(p + dir * Mailbox::footprint());
  p += kMailboxBytes;
  rings_.reserve(2 * lanes);
  for (int i = 0; i < 2 * lanes; ++i) rings_.emplace_back(p + i * slot_bytes(ring_bytes), ring_bytes);
}

Segment::~Segment() {
  ::munmap(base_, size_);
  ::close(fd_);
}

std::unique_ptr<Segment> Segment::create(std::size_t ring_bytes, std::uint64_t window, bool populate) {
  if (!std::has_single_bit(ring_bytes) || ring_bytes < min_ring || ring_bytes > max_ring)
    throw Error(Errc::invalid_argument, "shared memory: ring size " + std::to_string(ring_bytes) +
                                            " is not a power of two in [64 KiB, 256 MiB]");
  // Sealed against shrinking: a peer that truncated it would make our accesses fault.
  int fd = ::memfd_create("nexar-shm", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) fail_io("memfd_create");
  const std::size_t size = total_bytes(ring_bytes);
  if (::ftruncate(fd, static_cast<off_t>(size)) != 0 ||
      ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    close_and_fail(fd, "sizing the segment");
  }
  void* base = map_or_close(fd, size, populate);
  auto* h = static_cast<Header*>(base);
  h->magic = kMagic;
  h->version = kVersion;
  h->ring_bytes = ring_bytes;
  h->lanes = lanes;
  auto seg = std::unique_ptr<Segment>(new Segment(fd, base, size, ring_bytes));
  for (int i = 0; i < 2 * lanes; ++i) seg->rings_[i].init(window);
  for (auto& m : seg->mailboxes_) m.init();
  for (int side = 0; side < 2; ++side) seg->asleep(side).store(1, std::memory_order_release);
  return seg;
}

std::unique_ptr<Segment> Segment::open(int fd, bool populate) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) close_and_fail(fd, "fstat");
  // A memfd that can still shrink could be truncated under us later: refuse it.
  const int seals = ::fcntl(fd, F_GET_SEALS);
  const auto size = static_cast<std::size_t>(st.st_size);
  Header h{};
  if (seals < 0 || !(seals & F_SEAL_SHRINK) || size < kHeaderBytes || ::pread(fd, &h, sizeof h, 0) != sizeof h ||
      h.magic != kMagic || h.version != kVersion || h.lanes != lanes || !std::has_single_bit(h.ring_bytes) ||
      h.ring_bytes < min_ring || h.ring_bytes > max_ring || size != total_bytes(h.ring_bytes)) {
    ::close(fd);
    throw Error(Errc::protocol, "shared memory: the peer's segment is not a nexar segment of this version");
  }
  void* base = map_or_close(fd, size, populate);
  return std::unique_ptr<Segment>(new Segment(fd, base, size, static_cast<std::size_t>(h.ring_bytes)));
}

}  // namespace nexar::shm
