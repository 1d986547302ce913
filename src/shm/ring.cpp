#include "shm/ring.hpp"

#include <cstring>

namespace nexar::shm {

// Each index on a cache line of its own: the writer's and the reader's stores must not
// make each other's lines bounce.
struct Ring::Indices {
  alignas(64) std::atomic<std::uint64_t> head;    // bytes ever written (writer)
  alignas(64) std::atomic<std::uint64_t> tail;    // bytes ever released (reader)
  std::atomic<std::uint64_t> credit;              // head may not pass it (reader)
  alignas(64) std::atomic<std::uint32_t> writer_waiting;
};
static_assert(std::atomic<std::uint64_t>::is_always_lock_free, "shared indices must be lock-free");

std::size_t Ring::footprint(std::size_t capacity) noexcept { return sizeof(Indices) + capacity; }

Ring::Ring(void* base, std::size_t capacity) noexcept
    : ix_(static_cast<Indices*>(base)), data_(static_cast<std::uint8_t*>(base) + sizeof(Indices)), cap_(capacity) {}

void Ring::init(std::uint64_t window) noexcept {
  ix_->head.store(0, std::memory_order_relaxed);
  ix_->tail.store(0, std::memory_order_relaxed);
  ix_->credit.store(window, std::memory_order_relaxed);
  ix_->writer_waiting.store(0, std::memory_order_release);
}

std::ptrdiff_t Ring::write(const std::uint8_t* data, std::size_t len) noexcept {
  const std::uint64_t head = ix_->head.load(std::memory_order_relaxed);
  const std::uint64_t tail = ix_->tail.load(std::memory_order_acquire);
  const std::uint64_t credit = ix_->credit.load(std::memory_order_acquire);
  if (tail > head || head - tail > cap_) return -1;
  std::uint64_t room = cap_ - (head - tail);
  room = credit > head ? std::min(room, credit - head) : 0;
  const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(room, len));
  if (n == 0) return 0;
  const std::size_t at = static_cast<std::size_t>(head & (cap_ - 1));
  const std::size_t first = std::min(n, cap_ - at);
  std::memcpy(data_ + at, data, first);
  if (first < n) std::memcpy(data_, data + first, n - first);
  ix_->head.store(head + n, std::memory_order_release);
  return static_cast<std::ptrdiff_t>(n);
}

bool Ring::wait_for_room() noexcept {
  ix_->writer_waiting.store(1, std::memory_order_seq_cst);
  // Paired with the reader's release/grant followed by take_writer_waiting(): either the
  // reader sees the mark, or we see its room here.
  const std::uint64_t head = ix_->head.load(std::memory_order_seq_cst);
  const std::uint64_t tail = ix_->tail.load(std::memory_order_seq_cst);
  const std::uint64_t credit = ix_->credit.load(std::memory_order_seq_cst);
  return head - tail < cap_ && credit > head;
}

void Ring::clear_writer_waiting() noexcept {
  if (ix_->writer_waiting.load(std::memory_order_relaxed) != 0) ix_->writer_waiting.store(0, std::memory_order_relaxed);
}

bool Ring::writer_waits_with_room() const noexcept {
  if (ix_->writer_waiting.load(std::memory_order_seq_cst) == 0) return false;
  const std::uint64_t head = ix_->head.load(std::memory_order_seq_cst);
  const std::uint64_t tail = ix_->tail.load(std::memory_order_seq_cst);
  const std::uint64_t credit = ix_->credit.load(std::memory_order_seq_cst);
  return head - tail < cap_ && credit > head;
}

std::span<const std::uint8_t> Ring::readable(bool& broken) const noexcept {
  const std::uint64_t head = ix_->head.load(std::memory_order_acquire);
  const std::uint64_t tail = ix_->tail.load(std::memory_order_relaxed);
  if (head < tail || head - tail > cap_) {
    broken = true;
    return {};
  }
  const std::size_t at = static_cast<std::size_t>(tail & (cap_ - 1));
  const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(head - tail, cap_ - at));
  return {data_ + at, n};
}

void Ring::release(std::size_t n) noexcept {
  ix_->tail.store(ix_->tail.load(std::memory_order_relaxed) + n, std::memory_order_seq_cst);
}

void Ring::grant(std::uint64_t n) noexcept {
  ix_->credit.store(ix_->credit.load(std::memory_order_relaxed) + n, std::memory_order_seq_cst);
}

std::uint64_t Ring::unread() const noexcept {
  const std::uint64_t head = ix_->head.load(std::memory_order_relaxed);
  const std::uint64_t tail = ix_->tail.load(std::memory_order_acquire);
  return tail <= head && head - tail <= cap_ ? head - tail : 0;
}

bool Ring::writer_waiting() const noexcept {
  return ix_->writer_waiting.load(std::memory_order_seq_cst) != 0;
}

bool Ring::has_bytes() const noexcept {
  return ix_->head.load(std::memory_order_seq_cst) != ix_->tail.load(std::memory_order_relaxed);
}

bool Ring::take_writer_waiting() noexcept {
  if (ix_->writer_waiting.load(std::memory_order_seq_cst) == 0) return false;
  return ix_->writer_waiting.exchange(0, std::memory_order_seq_cst) != 0;
}

}  // namespace nexar::shm
