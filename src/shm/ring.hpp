// A single-producer single-consumer byte ring in memory shared by two processes: one
// direction of one lane of the shared-memory path. The writer copies bytes in, the reader
// reads them in place and then releases them. Besides the ring's room, the writer is held
// to a credit the reader grants, exactly like a QUIC stream's flow-control window: the
// reader keeps credit back while it holds too many unexpected bytes (Config::
// unexpected_limit), and the writer then waits even though the ring has room.
//
// The other process can write anything into the shared memory at any time, so every
// index read from it is checked before it is trusted: a broken index is reported, never
// followed.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>

namespace nexar::shm {

class Ring {
 public:
  /// Bytes of shared memory a ring of `capacity` bytes occupies (indices and data).
  static std::size_t footprint(std::size_t capacity) noexcept;

  /// A view of the ring at `base` (footprint(capacity) bytes, 64-byte aligned);
  /// `capacity` is a power of two.
  Ring(void* base, std::size_t capacity) noexcept;

  /// Zeroes the indices and grants `window` bytes of credit; the creator calls it once,
  /// before the other process maps the memory.
  void init(std::uint64_t window) noexcept;

  // ---- writer ----
  /// Copies as much of `data` as room and credit allow; returns the bytes copied, or -1 if
  /// the reader's indices are broken.
  std::ptrdiff_t write(const std::uint8_t* data, std::size_t len) noexcept;
  /// Marks the writer as waiting for room, then re-checks: true if room appeared meanwhile
  /// (write again), false if the reader will see the mark when it frees some.
  bool wait_for_room() noexcept;
  /// Takes back the mark wait_for_room() left (the writer wrote again, or has nothing left
  /// to write), so nobody rings it for room it no longer waits for.
  void clear_writer_waiting() noexcept;
  /// The writer's mark is set and room and credit are there now: a writer about to sleep
  /// must write again rather than wait for a ring that the reader may have skipped.
  bool writer_waits_with_room() const noexcept;

  // ---- reader ----
  /// The bytes written and not yet released, from the oldest, up to the end of the ring
  /// (call again after release() for the part that wrapped). Empty when there is none;
  /// `broken` is set when the writer's index is impossible.
  std::span<const std::uint8_t> readable(bool& broken) const noexcept;
  /// Releases the first `n` readable bytes: their room goes back to the writer.
  void release(std::size_t n) noexcept;
  /// Grants the writer `n` more bytes of credit.
  void grant(std::uint64_t n) noexcept;
  /// True (once) if the writer waits for room or credit: ring its doorbell.
  bool take_writer_waiting() noexcept;
  /// Whether the writer waits for room or credit, leaving the mark in place.
  bool writer_waiting() const noexcept;
  /// Whether bytes are written and not yet released (a reader about to sleep looks).
  bool has_bytes() const noexcept;
  /// Writer: bytes written and not yet released by the reader (0 if its index is broken).
  std::uint64_t unread() const noexcept;

  std::size_t capacity() const noexcept { return cap_; }

 private:
  struct Indices;
  Indices* ix_;
  std::uint8_t* data_;
  std::size_t cap_;
};

}  // namespace nexar::shm
