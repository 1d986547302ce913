// Small messages of collectives between two ranks of one host, one direction: a
// handful of slots in the pair's shared segment, each holding at most one message of up
// to kPayload bytes labelled with a key (the communicator), a sequence number (the
// collective's number on it) and the fingerprint of the call that posted it. Any thread of the writing process posts into a free slot; a
// thread of the reading process takes the message with the key and number it waits for,
// wherever it lies. There is no ring, no framing and no engine in the way: a post is one
// compare-and-swap, a copy and a store, a take is a scan of the slots, a copy and a store.
//
// Waiting: two counters (messages posted, messages taken) are futex words, so a waiter
// that stops spinning sleeps on the counter it needs to change and is woken by the other
// process. The other process can write anything into the shared memory at any time: a
// length it wrote is checked before it is used, and a counter it does not advance only
// makes a waiter wait until its own deadline.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>

namespace nexar::shm {

class Mailbox {
 public:
  static constexpr std::size_t kSlots = 16;
  static constexpr std::size_t kSlotBytes = 8192 + 64;
  /// Largest message a slot holds (the rest of the slot is its label).
  static constexpr std::size_t kPayload = kSlotBytes - 64;

  /// Shared bytes one mailbox occupies (64-byte aligned).
  static constexpr std::size_t footprint() noexcept { return 2 * 64 + kSlots * kSlotBytes; }

  /// A view of the mailbox at `base` (footprint() bytes, 64-byte aligned).
  explicit Mailbox(void* base) noexcept;
  /// Empties every slot and zeroes the counters; the creator calls it once, before the other
  /// process maps the memory.
  void init() noexcept;

  // ---- writer ----
  /// Posts `len` bytes (at most kPayload) as message (`key`, `seq`) of a call with
  /// fingerprint `check` into a free slot; false if every slot is in use (wait on taken()
  /// and try again).
  bool try_post(std::uint64_t key, std::uint64_t seq, std::uint32_t check, const void* data, std::size_t len) noexcept;

  /// Messages of `key` in the mailbox now, not yet freed by the reader (a scan of every
  /// slot: a writer that counts its own posts calls it only near its limit).
  std::size_t count(std::uint64_t key) const noexcept;

  // ---- reader ----
  /// What try_take found.
  enum class Take { absent, taken, wrong_length, wrong_call };
  /// What the reader expects of message (`key`, `seq`), and what it found.
  struct Want {
    std::uint64_t key;
    std::uint64_t seq;
    std::uint32_t check;       // its call's fingerprint (0: compare none)
    std::size_t bytes;
    std::size_t len = 0;       // out: the message's length
    std::uint32_t theirs = 0;  // out: the fingerprint it was posted with
    // out: a message of `key` numbered below `seq` that this look freed (see try_take),
    // with its fingerprint; 0 and 0 if none.
    std::uint64_t stale = 0;
    std::uint32_t stale_check = 0;
  };
  /// If message (`key`, `seq`) is there, posted by the same call and `bytes` long, copies it
  /// into `out` and frees its slot: Take::taken. Take::absent if it is not there yet.
  /// Take::wrong_call if another call posted it (its fingerprint in `theirs`), else
  /// Take::wrong_length if it has another length (in `len`): nothing is copied, the slot is
  /// freed (the ranks disagree on the operation). Also frees messages of `key` numbered
  /// below `seq`: left by collectives that failed on this side after the writer posted, or
  /// posted by a call this side made differently (it never took them), and names one of
  /// them in `stale`.
  Take try_take(Want& w, void* out) noexcept;
  /// As try_take, but on Take::taken the message stays in its slot and `data` points at
  /// its bytes, which stay put until release(data): a reader can reduce straight from the
  /// slots of several mailboxes. Its slot counts as in use until then.
  Take try_peek(Want& w, const void*& data) noexcept;
  /// Frees the slot of a message try_peek found (`data` as it gave it).
  void release(const void* data) noexcept;

  // ---- waiting (either side) ----
  /// Counters of messages posted and taken so far (wrapping). Read one before trying, then
  /// wait on the same value: a change in between is not missed.
  std::uint32_t posted() const noexcept;
  std::uint32_t taken() const noexcept;
  /// Sleeps until posted() (or taken()) differs from `seen`, for at most `timeout`
  /// (spurious returns are allowed: try again, then wait again).
  void wait_posted(std::uint32_t seen, std::chrono::microseconds timeout) noexcept;
  void wait_taken(std::uint32_t seen, std::chrono::microseconds timeout) noexcept;

 private:
  struct Counter;
  struct Slot;
  // The slot of message (key, seq), whatever its length and call (Take::absent: none),
  // freeing the key's messages numbered below it.
  Take find(Want& w, Slot*& at) noexcept;
  void free(Slot& s) noexcept;
  static void wait_on(Counter& c, std::uint32_t seen, std::chrono::microseconds timeout) noexcept;
  static void bump(Counter& c) noexcept;

  Counter* posted_;
  Counter* taken_;
  Slot* slots_;
};

}  // namespace nexar::shm
