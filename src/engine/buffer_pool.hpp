// Recycles send buffers by power-of-two size class so steady-state messaging allocates
// nothing. Thread-safe: user threads acquire (they copy eager payloads), the engine
// releases once the peer acknowledged the bytes.
#pragma once

#include <array>
#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

namespace nexar::detail {

class BufferPool;

/// A buffer from the pool; returns itself on destruction. Move-only.
class PooledBuffer {
 public:
  PooledBuffer() = default;
  PooledBuffer(BufferPool* pool, std::byte* data, std::size_t cap, int cls) noexcept
      : pool_(pool), data_(data), cap_(cap), cls_(cls) {}
  PooledBuffer(PooledBuffer&& o) noexcept { *this = std::move(o); }
  PooledBuffer& operator=(PooledBuffer&& o) noexcept;
  ~PooledBuffer() { reset(); }

  std::byte* data() const noexcept { return data_; }
  std::size_t capacity() const noexcept { return cap_; }
  explicit operator bool() const noexcept { return data_ != nullptr; }
  void reset() noexcept;

 private:
  BufferPool* pool_ = nullptr;
  std::byte* data_ = nullptr;
  std::size_t cap_ = 0;
  int cls_ = -1;
};

class BufferPool {
 public:
  /// Sizes up to 2^max_class bytes are pooled; larger ones are allocated and freed.
  static constexpr int min_class = 8;   // 256 B
  static constexpr int max_class = 20;  // 1 MiB
  /// Idle bytes kept per class before buffers are freed instead of cached.
  static constexpr std::size_t keep_bytes_per_class = 8u << 20;

  BufferPool() = default;
  ~BufferPool();
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  PooledBuffer acquire(std::size_t bytes);

  /// Buffers handed out and not yet returned (for tests).
  std::size_t outstanding() const;

 private:
  friend class PooledBuffer;
  void release(std::byte* data, std::size_t cap, int cls) noexcept;

  mutable std::mutex mu_;
  std::array<std::vector<std::byte*>, max_class + 1> free_{};
  std::size_t outstanding_ = 0;
};

}  // namespace nexar::detail
