#include "transport/relay_link.hpp"

#include <algorithm>

namespace nexar::detail {

RelayLink::RelayLink(std::uint64_t window) : window_(window) {
  for (auto& o : out_) o.limit = window;
}

RelayLink::~RelayLink() { fail_pending(Errc::closed, "communicator closed"); }

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
}

bool RelayLink::next_segment(wire::Lane lane, std::size_t max, std::uint64_t& offset, std::vector<Piece>& out) {
  Out& o = out_[static_cast<int>(lane)];
  const std::uint64_t stop = std::min({o.end, o.limit, o.sent + max});
  if (stop <= o.sent) return false;
  offset = o.sent;
  // Find the chunk holding o.sent: chunks before it are sent and unacknowledged, few.
  std::uint64_t at = o.base;
  for (const quic::Chunk& c : o.chunks) {
    const std::uint64_t c_end = at + c.len;
    if (c_end > o.sent) {
      const std::uint64_t from = std::max(at, o.sent);
      const std::uint64_t to = std::min(c_end, stop);
      out.push_back(Piece{c.data + (from - at), static_cast<std::size_t>(to - from)});
      o.sent = to;
      if (o.sent >= stop) break;
    }
    at = c_end;
  }
  return true;
}

bool RelayLink::on_ack(wire::Lane lane, std::uint64_t received, std::uint64_t limit) {
  Out& o = out_[static_cast<int>(lane)];
  if (received > o.end) return false;
  o.limit = std::max(o.limit, limit);
  if (received <= o.acked) return true;
  o.acked = received;
  if (o.sent < o.acked) o.sent = o.acked;
  while (!o.chunks.empty() && o.base + o.chunks.front().len <= o.acked) {
    quic::Chunk c = std::move(o.chunks.front());
    o.chunks.pop_front();
    o.base += c.len;
    if (c.done) c.done(Errc::ok, {});
  }
  return true;
}

void RelayLink::rewind() {
  for (Out& o : out_) o.sent = o.acked;
}

std::uint64_t RelayLink::unacked() const noexcept {
  std::uint64_t n = 0;
  for (const Out& o : out_) n += o.end - o.acked;
  return n;
}

void RelayLink::fail_pending(Errc code, const std::string& why) {
  for (Out& o : out_) {
    std::deque<quic::Chunk> chunks;
    chunks.swap(o.chunks);
    o.base = o.acked = o.sent = o.end;
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
