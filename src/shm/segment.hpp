// The shared memory between two ranks of one host: a memfd holding, for each lane the path
// carries, one ring per direction. The rank that offers the path creates it; the other
// maps the descriptor it receives, after checking that its size and header describe a
// segment it can use.
//
// Besides the rings there is a mailbox per direction for the small messages of
// collectives (shm/mailbox.hpp), and each side has a word saying whether it may be asleep:
// a writer that finds the reader's word set rings the reader's doorbell, and one that
// finds it clear leaves the reader to find the bytes by polling (transport/shm_presence.hpp).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "shm/mailbox.hpp"
#include "shm/ring.hpp"

namespace nexar::shm {

class Segment {
 public:
  /// Lanes one segment carries (the transport's message lanes: data, bulk, collective).
  static constexpr int lanes = 3;
  /// Ring sizes a segment accepts.
  static constexpr std::size_t min_ring = 64 * 1024;
  static constexpr std::size_t max_ring = std::size_t{256} << 20;

  /// A new segment with rings of `ring_bytes` (a power of two in [min_ring, max_ring])
  /// granting `window` bytes of credit each. Throws nexar::Error(Errc::io) naming the step.
  /// `populate`: its memory is allocated and mapped now rather than at each page's first
  /// touch, which would otherwise cost the first megabytes through each ring a page fault
  /// per 4 KiB in each process (32 KiB all_reduce, 2 ranks, first 20 operations: 65 us
  /// each instead of 27).
  static std::unique_ptr<Segment> create(std::size_t ring_bytes, std::uint64_t window, bool populate = false);
  /// Maps a segment another process created (takes `fd`). Throws nexar::Error(Errc::protocol)
  /// when it is not a usable segment, Errc::io when it cannot be mapped. `populate`: map
  /// every page now (as for create).
  static std::unique_ptr<Segment> open(int fd, bool populate = false);
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  /// The memfd (owned); to hand to the other process.
  int fd() const noexcept { return fd_; }
  /// The ring of `lane` (0 .. lanes-1) in direction `dir`: 0 from the creator, 1 to it.
  Ring& ring(int dir, int lane) noexcept { return rings_[dir * lanes + lane]; }
  /// Side `side`'s word (0: the creator's): non-zero while that side may sleep without
  /// looking at its rings, so whoever hands it work must ring its doorbell. Starts set.
  std::atomic<std::uint32_t>& asleep(int side) noexcept { return *asleep_[side]; }
  /// The mailbox of small collective messages in direction `dir` (0: from the creator).
  Mailbox& mailbox(int dir) noexcept { return mailboxes_[static_cast<std::size_t>(dir)]; }

 private:
  Segment(int fd, void* base, std::size_t size, std::size_t ring_bytes);
  int fd_;
  void* base_;
  std::size_t size_;
  std::vector<Ring> rings_;
  std::vector<Mailbox> mailboxes_;
  std::atomic<std::uint32_t>* asleep_[2];
};

}  // namespace nexar::shm
