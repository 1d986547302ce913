#include "delay_line.hpp"

#include <algorithm>
#include <cstring>

namespace nexar_relay {

DelayLine::DelayLine(std::size_t capacity_bytes)
    : capacity_(capacity_bytes),
      ring_(std::make_unique_for_overwrite<std::uint8_t[]>(capacity_bytes)),
      records_(1024) {
  heap_.reserve(records_.size());
}

bool DelayLine::push(std::int64_t due_ns, std::uint32_t client, const std::uint8_t* data, std::size_t len) {
  if (len > capacity_) return false;
  // An empty ring starts again at position 0, so that a large datagram never needs to skip
  // the end of an otherwise empty ring.
  if (first_seq_ == next_seq_) head_ = tail_ = 0;
  std::uint64_t start = head_;
  const std::size_t pos = static_cast<std::size_t>(start % capacity_);
  // A datagram is stored in one piece (it is sent from there): one that would cross the end
  // starts at the beginning instead, and the skipped end counts as used until it is passed.
  if (pos + len > capacity_) start += capacity_ - pos;
  if (start + len - tail_ > capacity_) return false;
  if (next_seq_ - first_seq_ == records_.size()) grow_records();
  std::memcpy(ring_.get() + (start % capacity_), data, len);
  head_ = start + len;
  record(next_seq_) = Record{head_, static_cast<std::uint32_t>(len), client, false};
  heap_.push_back(Slot{due_ns, next_seq_});
  std::push_heap(heap_.begin(), heap_.end(), Later{});
  ++next_seq_;
  return true;
}

DelayLine::Held DelayLine::front() const {
  const Slot& s = heap_.front();
  const Record& r = record(s.seq);
  return Held{s.seq, s.due_ns, r.client, ring_.get() + ((r.end - r.len) % capacity_), r.len};
}

void DelayLine::pop() {
  std::pop_heap(heap_.begin(), heap_.end(), Later{});
  heap_.pop_back();
}

void DelayLine::unpop(const Held& h) {
  heap_.push_back(Slot{h.due_ns, h.seq});
  std::push_heap(heap_.begin(), heap_.end(), Later{});
}

void DelayLine::release(std::uint64_t seq) {
  record(seq).released = true;
  while (first_seq_ != next_seq_ && record(first_seq_).released) {
    tail_ = record(first_seq_).end;
    ++first_seq_;
  }
}

void DelayLine::grow_records() {
  std::vector<Record> bigger(records_.size() * 2);
  for (std::uint64_t s = first_seq_; s != next_seq_; ++s) bigger[s & (bigger.size() - 1)] = record(s);
  records_.swap(bigger);
  heap_.reserve(records_.size());
}

}  // namespace nexar_relay
