#include "shm/mailbox.hpp"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <cstring>
#include <ctime>

namespace nexar::shm {

// A futex word and the number of threads asleep on it, on a line of their own: one side
// advances the word, the other sleeps on it.
struct alignas(64) Mailbox::Counter {
  std::atomic<std::uint32_t> value;
  std::atomic<std::uint32_t> sleepers;
};

// A slot's label on its first line, the message on the lines after it.
struct alignas(64) Mailbox::Slot {
  enum : std::uint32_t { empty = 0, filling = 1, full = 2 };
  // The label is atomic because threads of the reading process waiting for other keys
  // read it while the slot changes hands; only the key's own reader frees the slot, so
  // its message stays put while that one copies it.
  std::atomic<std::uint32_t> state;
  std::atomic<std::uint32_t> len;
  std::atomic<std::uint64_t> key;
  std::atomic<std::uint64_t> seq;
  std::atomic<std::uint32_t> check;
  alignas(64) std::uint8_t data[kPayload];
};

static_assert(std::atomic<std::uint32_t>::is_always_lock_free, "shared words must be lock-free");

Mailbox::Mailbox(void* base) noexcept
    : posted_(static_cast<Counter*>(base)),
      taken_(static_cast<Counter*>(base) + 1),
      slots_(reinterpret_cast<Slot*>(static_cast<std::uint8_t*>(base) + 2 * 64)) {}

void Mailbox::init() noexcept {
  static_assert(sizeof(Slot) == kSlotBytes && sizeof(Counter) == 64);
  for (Counter* c : {posted_, taken_}) {
    c->value.store(0, std::memory_order_relaxed);
    c->sleepers.store(0, std::memory_order_relaxed);
  }
  for (std::size_t i = 0; i < kSlots; ++i) slots_[i].state.store(Slot::empty, std::memory_order_release);
}

bool Mailbox::try_post(std::uint64_t key, std::uint64_t seq, std::uint32_t check, const void* data,
                       std::size_t len) noexcept {
  if (len > kPayload) return false;
  // Start where this key's messages usually go, so a reader usually finds them first.
  const std::size_t first = static_cast<std::size_t>(key % kSlots);
  for (std::size_t k = 0; k < kSlots; ++k) {
    Slot& s = slots_[(first + k) % kSlots];
    std::uint32_t expect = Slot::empty;
    if (s.state.load(std::memory_order_relaxed) != Slot::empty ||
        !s.state.compare_exchange_strong(expect, Slot::filling, std::memory_order_acquire))
      continue;
    s.seq.store(seq, std::memory_order_relaxed);
    s.check.store(check, std::memory_order_relaxed);
    s.len.store(static_cast<std::uint32_t>(len), std::memory_order_relaxed);
    s.key.store(key, std::memory_order_release);  // after the rest of the label (try_take)
    if (len) std::memcpy(s.data, data, len);
    s.state.store(Slot::full, std::memory_order_release);
    bump(*posted_);
    return true;
  }
  return false;
}

std::size_t Mailbox::count(std::uint64_t key) const noexcept {
  std::size_t n = 0;
  for (std::size_t i = 0; i < kSlots; ++i) {
    const Slot& s = slots_[i];
    n += s.state.load(std::memory_order_acquire) != Slot::empty && s.key.load(std::memory_order_acquire) == key;
  }
  return n;
}

Mailbox::Take Mailbox::find(Want& w, Slot*& at) noexcept {
  const std::uint64_t key = w.key, seq = w.seq;
  const std::size_t first = static_cast<std::size_t>(key % kSlots);
  Take found = Take::absent;
  bool freed = false;
  for (std::size_t k = 0; k < kSlots && found == Take::absent; ++k) {
    Slot& s = slots_[(first + k) % kSlots];
    // The slot may change hands between these loads (another key's reader frees it, the
    // writer fills it again). Only this key's reader frees this key's messages, so once the
    // slot is seen full after its key was seen to be ours, it holds a whole message of ours
    // and keeps it until it is freed here.
    if (s.state.load(std::memory_order_acquire) != Slot::full || s.key.load(std::memory_order_acquire) != key)
      continue;
    const std::uint64_t label = s.seq.load(std::memory_order_relaxed);
    if (label > seq || s.state.load(std::memory_order_acquire) != Slot::full) continue;  // a later one's
    if (label == seq) {
      // Read once: the writer may not change them now, but a broken one could.
      w.len = s.len.load(std::memory_order_relaxed);
      w.theirs = s.check.load(std::memory_order_relaxed);
      if (w.check != 0 && w.theirs != 0 && w.theirs != w.check) found = Take::wrong_call;
      else found = w.len != w.bytes || w.len > kPayload ? Take::wrong_length : Take::taken;
      at = &s;
      continue;
    }
    w.stale = label;
    w.stale_check = s.check.load(std::memory_order_relaxed);
    s.state.store(Slot::empty, std::memory_order_release);
    freed = true;
  }
  if (freed) bump(*taken_);
  return found;
}

void Mailbox::free(Slot& s) noexcept {
  s.state.store(Slot::empty, std::memory_order_release);
  bump(*taken_);
}

Mailbox::Take Mailbox::try_take(Want& w, void* out) noexcept {
  Slot* at = nullptr;
  const Take found = find(w, at);
  if (found == Take::absent) return found;
  if (found == Take::taken && w.len) std::memcpy(out, at->data, w.len);
  free(*at);
  return found;
}

Mailbox::Take Mailbox::try_peek(Want& w, const void*& data) noexcept {
  Slot* at = nullptr;
  const Take found = find(w, at);
  if (found == Take::taken) {
    data = at->data;
  } else if (found != Take::absent) {
    free(*at);
  }
  return found;
}

void Mailbox::release(const void* data) noexcept {
  const auto off = static_cast<std::size_t>(static_cast<const std::uint8_t*>(data) -
                                            reinterpret_cast<const std::uint8_t*>(slots_));
  free(slots_[off / kSlotBytes]);
}

std::uint32_t Mailbox::posted() const noexcept { return posted_->value.load(std::memory_order_seq_cst); }
std::uint32_t Mailbox::taken() const noexcept { return taken_->value.load(std::memory_order_seq_cst); }

void Mailbox::wait_posted(std::uint32_t seen, std::chrono::microseconds timeout) noexcept {
  wait_on(*posted_, seen, timeout);
}
void Mailbox::wait_taken(std::uint32_t seen, std::chrono::microseconds timeout) noexcept {
  wait_on(*taken_, seen, timeout);
}

void Mailbox::bump(Counter& c) noexcept {
  c.value.fetch_add(1, std::memory_order_seq_cst);
  // Paired with wait_on: a sleeper either counts itself before this load, or its futex
  // call sees the new value and returns at once.
  if (c.sleepers.load(std::memory_order_seq_cst) != 0)
    ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&c.value), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

void Mailbox::wait_on(Counter& c, std::uint32_t seen, std::chrono::microseconds timeout) noexcept {
  c.sleepers.fetch_add(1, std::memory_order_seq_cst);
  if (c.value.load(std::memory_order_seq_cst) == seen) {
    timespec ts{static_cast<time_t>(timeout.count() / 1000000), static_cast<long>(timeout.count() % 1000000) * 1000};
    // Not FUTEX_PRIVATE_FLAG: the word lies in memory another process maps.
    ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&c.value), FUTEX_WAIT, seen, &ts, nullptr, 0);
  }
  c.sleepers.fetch_sub(1, std::memory_order_seq_cst);
}

}  // namespace nexar::shm
