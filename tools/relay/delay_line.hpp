// One direction of nexar-relay: the datagrams it holds until their release time.
//
// The bytes live in one ring allocated up front, written in arrival order; the release order
// is a min-heap of (due time, arrival number). A released datagram frees its bytes once every
// datagram that arrived before it has left too (the ring only gives back space at its tail),
// so with jitter and reordering a datagram sent early keeps its space until the older ones
// leave. What the ring holds, padding at its end included, is what the --queue-bytes bound
// limits: a datagram that does not fit is refused, and the caller counts the drop. Nothing
// is allocated per datagram: the record table and the heap grow by doubling and keep their
// size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

namespace nexar_relay {

class DelayLine {
 public:
  static constexpr std::int64_t kNever = std::numeric_limits<std::int64_t>::max();

  /// A datagram taken off the schedule: its bytes stay valid until release(seq).
  struct Held {
    std::uint64_t seq;
    std::int64_t due_ns;
    std::uint32_t client;
    const std::uint8_t* data;
    std::size_t len;
  };

  explicit DelayLine(std::size_t capacity_bytes);

  /// Copies a datagram in, due at `due_ns`, tagged with `client`. False (nothing held) when
  /// it does not fit in the ring.
  bool push(std::int64_t due_ns, std::uint32_t client, const std::uint8_t* data, std::size_t len);

  /// The earliest due time held and not taken, or kNever.
  std::int64_t next_due() const { return heap_.empty() ? kNever : heap_.front().due_ns; }
  /// The earliest datagram (call only when next_due() != kNever).
  Held front() const;
  /// Takes front() off the schedule.
  void pop();
  /// Puts a datagram taken with pop() back on the schedule, as it was (it could not be sent
  /// yet).
  void unpop(const Held& h);
  /// Gives back the bytes of a datagram taken with pop() (sent or dropped).
  void release(std::uint64_t seq);

  /// Bytes of the ring in use (held datagrams, space not yet given back, padding).
  std::size_t used_bytes() const { return static_cast<std::size_t>(head_ - tail_); }
  std::size_t held() const { return static_cast<std::size_t>(next_seq_ - first_seq_); }

 private:
  struct Record {
    std::uint64_t end;  // ring position (a running byte count) just past the datagram
    std::uint32_t len;
    std::uint32_t client;
    bool released;
  };
  struct Slot {
    std::int64_t due_ns;
    std::uint64_t seq;  // arrival number: among equal due times the older goes first
  };
  struct Later {
    bool operator()(const Slot& a, const Slot& b) const {
      return a.due_ns != b.due_ns ? a.due_ns > b.due_ns : a.seq > b.seq;
    }
  };

  Record& record(std::uint64_t seq) { return records_[seq & (records_.size() - 1)]; }
  const Record& record(std::uint64_t seq) const { return records_[seq & (records_.size() - 1)]; }
  void grow_records();

  std::size_t capacity_;
  std::unique_ptr<std::uint8_t[]> ring_;
  std::uint64_t head_ = 0;  // running byte counts; position in the ring = count % capacity_
  std::uint64_t tail_ = 0;
  std::vector<Record> records_;  // power-of-two size, indexed by seq
  std::uint64_t first_seq_ = 0;  // oldest record whose bytes are not given back
  std::uint64_t next_seq_ = 0;
  std::vector<Slot> heap_;
};

}  // namespace nexar_relay
