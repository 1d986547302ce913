#include "transport/relay_link.hpp"

#include <algorithm>

namespace nexar::detail {

RelayLink::RelayLink(std::uint64_t window, LaneWork pump, LaneWork ack)
    : window_(window), pump_(std::move(pump)), ack_(std::move(ack)) {
  for (auto& o : out_) o.limit = window;
}

RelayLink::~RelayLink() { fail(Errc::closed, "communicator closed"); }

void RelayLink::push(wire::Lane lane, quic::Chunk c) {
  Out& o = out_[static_cast<int>(lane)];
  if (c.len == 0) {
    // Nothing to carry: complete it in order, once what precedes it is acknowledged.
    if (o.chunks.empty()) {
      if (c.done) c.done(Errc::ok, {});
      return;
    }
  }
  o.end += c.len;
  o.chunks.push_back(std::move(c));
  pump_(lane);
}

bool RelayLink::next_segment(wire::Lane lane, std::size_t max, std::uint64_t& offset, std::vector<Piece>& out,
                             std::uint64_t now) {
  Out& o = out_[static_cast<int>(lane)];
  const std::uint64_t stop = std::min({o.end, o.limit, o.sent + max});
  if (stop <= o.sent) return false;
  if (o.sent == o.acked) o.since = now;  // nothing was in flight: the wait starts now
  offset = o.sent;
  while (o.cur < o.chunks.size() && o.sent < stop) {
    const quic::Chunk& c = o.chunks[o.cur];
    const std::uint64_t c_end = o.cur_at + c.len;
    if (c_end > o.sent) {
      const std::uint64_t to = std::min(c_end, stop);
      out.push_back(Piece{c.data + (o.sent - o.cur_at), static_cast<std::size_t>(to - o.sent)});
      o.sent = to;
    }
    if (o.sent >= c_end) {
      ++o.cur;
      o.cur_at = c_end;
    }
  }
  return true;
}

bool RelayLink::on_ack(wire::Lane lane, std::uint64_t received, std::uint64_t limit, std::uint64_t now) {
  Out& o = out_[static_cast<int>(lane)];
  if (received > o.end) return false;
  o.limit = std::max(o.limit, limit);
  if (received <= o.acked) return true;
  o.acked = received;
  o.since = now;
  if (o.sent < o.acked) o.sent = o.acked;
  while (!o.chunks.empty() && o.base + o.chunks.front().len <= o.acked) {
    quic::Chunk c = std::move(o.chunks.front());
    o.chunks.pop_front();
    o.base += c.len;
    if (o.cur > 0) {
      --o.cur;
    } else {
      o.cur_at = o.base;  // the chunk `sent` lay in is gone: sent == acked >= base
    }
    if (c.done) c.done(Errc::ok, {});
  }
  return true;
}

void RelayLink::rewind() {
  for (Out& o : out_) {
    o.sent = o.acked;
    o.cur = 0;
    o.cur_at = o.base;
  }
}

bool RelayLink::stalled(std::uint64_t now, std::uint64_t rto) const noexcept {
  for (const Out& o : out_)
    if (o.sent > o.acked && now - o.since >= rto) return true;
  return false;
}

std::uint64_t RelayLink::unacked() const noexcept {
  std::uint64_t n = 0;
  for (const Out& o : out_) n += o.end - o.acked;
  return n;
}

void RelayLink::fail(Errc code, const std::string& why) {
  for (Out& o : out_) {
    std::deque<quic::Chunk> chunks;
    chunks.swap(o.chunks);
    o.base = o.acked = o.sent = o.cur_at = o.end;
    o.cur = 0;
    for (quic::Chunk& c : chunks)
      if (c.done) c.done(code, why);
  }
}

bool RelayLink::take_ack(wire::Lane lane, std::uint64_t& received, std::uint64_t& limit) noexcept {
  In& in = in_[static_cast<int>(lane)];
  if (!in.ack_owed) return false;
  in.ack_owed = false;
  received = in.received;
  limit = in.consumed + window_;
  return true;
}

}  // namespace nexar::detail
