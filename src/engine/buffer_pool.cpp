#include "engine/buffer_pool.hpp"

#include <bit>
#include <new>

namespace nexar::detail {

PooledBuffer& PooledBuffer::operator=(PooledBuffer&& o) noexcept {
  if (this != &o) {
    reset();
    pool_ = o.pool_;
    data_ = o.data_;
    cap_ = o.cap_;
    cls_ = o.cls_;
    o.pool_ = nullptr;
    o.data_ = nullptr;
    o.cap_ = 0;
  }
  return *this;
}

void PooledBuffer::reset() noexcept {
  if (data_ && pool_) pool_->release(data_, cap_, cls_);
  data_ = nullptr;
  pool_ = nullptr;
  cap_ = 0;
}

BufferPool::~BufferPool() {
  for (auto& list : free_)
    for (std::byte* p : list) ::operator delete(p);
}

PooledBuffer BufferPool::acquire(std::size_t bytes) {
  int cls = bytes <= (std::size_t{1} << min_class)
                ? min_class
                : static_cast<int>(std::bit_width(bytes - 1));
  if (cls > max_class) {
    std::lock_guard lk(mu_);
    ++outstanding_;
    return PooledBuffer(this, static_cast<std::byte*>(::operator new(bytes)), bytes, -1);
  }
  std::size_t cap = std::size_t{1} << cls;
  std::lock_guard lk(mu_);
  ++outstanding_;
  auto& list = free_[static_cast<std::size_t>(cls)];
  if (!list.empty()) {
    std::byte* p = list.back();
    list.pop_back();
    return PooledBuffer(this, p, cap, cls);
  }
  return PooledBuffer(this, static_cast<std::byte*>(::operator new(cap)), cap, cls);
}

void BufferPool::release(std::byte* data, std::size_t cap, int cls) noexcept {
  std::lock_guard lk(mu_);
  --outstanding_;
  if (cls < 0) {
    ::operator delete(data);
    return;
  }
  auto& list = free_[static_cast<std::size_t>(cls)];
  if ((list.size() + 1) * cap > keep_bytes_per_class) {
    ::operator delete(data);
    return;
  }
  list.push_back(data);
}

std::size_t BufferPool::outstanding() const {
  std::lock_guard lk(mu_);
  return outstanding_;
}

}  // namespace nexar::detail
