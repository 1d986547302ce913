// End-to-end state of the lanes between this rank and one rank it is not connected to
// (Config::topology): what it sent through relays and the destination has not yet
// acknowledged, and what it received in order. Engine thread only.
//
// Each lane is one ordered byte stream end to end, the same bytes a QUIC stream would
// carry (frames without the preamble), cut into segments that travel in relay frames hop
// by hop (docs/PROTOCOL.md, "Relay"). The destination acknowledges the bytes it holds in
// order and grants credit for Config::relay_window bytes beyond what it consumed, so a
// relay never holds more than that window per pair and lane, and a destination that does
// not read stalls only its own senders. The sender keeps every unacknowledged byte (the
// chunks themselves, zero-copy) so that when a relay fails it sends them again on the new
// route; the receiver drops what it already has, and holds segments that arrive ahead of
// a gap until the gap is filled.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nexar/error.hpp>

#include "transport/link.hpp"

namespace nexar::detail {

class RelayLink final : public Link {
 public:
  /// What the node does for a lane of this link: send what the credit allows towards the
  /// next hop, or acknowledge what arrived (transport/routing.hpp).
  using LaneWork = std::function<void(wire::Lane)>;
  /// `pump` runs after every push, `ack` whenever an acknowledgement becomes owed by
  /// consumed().
  RelayLink(std::uint64_t window, LaneWork pump, LaneWork ack);
  ~RelayLink() override;
  RelayLink(const RelayLink&) = delete;
  RelayLink& operator=(const RelayLink&) = delete;

  // ---- sending ----
  /// Queues `c` at the end of `lane`'s stream and pumps the lane; its completion runs once
  /// the destination acknowledged its last byte (or with an error, from fail()).
  void push(wire::Lane lane, quic::Chunk c) override;
  /// A piece of a segment: bytes of one queued chunk.
  struct Piece {
    const std::uint8_t* data;
    std::size_t len;
  };
  /// The next segment of `lane` that the credit allows, at most `max` bytes: its stream
  /// offset and pieces (appended to `out`). False when nothing may go now.
  bool next_segment(wire::Lane lane, std::size_t max, std::uint64_t& offset, std::vector<Piece>& out,
                    std::uint64_t now);
  /// The destination holds every byte of `lane` below `received` and lets us send below
  /// `limit`. Completes the chunks now wholly acknowledged. Returns false when the
  /// acknowledgement claims bytes never sent.
  bool on_ack(wire::Lane lane, std::uint64_t received, std::uint64_t limit, std::uint64_t now);
  /// Sends every unacknowledged byte again from the first (the route changed).
  void rewind();
  /// Whether bytes are in flight that no acknowledgement has advanced on for `rto` ns
  /// (`now` on the same clock as the `now` given to next_segment and on_ack): a relay on
  /// the way may have died before it knew, and the origin already rerouted.
  bool stalled(std::uint64_t now, std::uint64_t rto) const noexcept;
  /// Bytes queued and not yet acknowledged, all lanes.
  std::uint64_t unacked() const noexcept override;
  /// Fails every queued chunk (the destination is gone).
  void fail(Errc code, const std::string& why) override;

  // ---- receiving ----
  /// A segment of `lane` at stream `offset` arrived. Calls `deliver(ptr, len)` for every
  /// byte that is next in order (this segment's, then held ones it unblocks);
  /// `deliver` returns the bytes consumed at once, or false to stop (the stream broke).
  /// Segments ahead of a gap are held. An acknowledgement is owed afterwards (the `ack`
  /// work runs). Returns false when `deliver` failed or the segment lies beyond the credit
  /// granted.
  template <class Deliver>
  bool on_segment(wire::Lane lane, std::uint64_t offset, const std::uint8_t* data, std::size_t len,
                  Deliver&& deliver);
  /// `n` bytes of lane `stream` (its number) delivered earlier were consumed (credit held
  /// back until now): an acknowledgement is owed.
  void consumed(std::uint64_t stream, std::uint64_t n) override {
    if (stream >= wire::lane_count) return;
    in_[stream].consumed += n;
    in_[stream].ack_owed = true;
    ack_(static_cast<wire::Lane>(stream));
  }
  /// Whether an acknowledgement of `lane` is owed; clears it, giving what it says.
  bool take_ack(wire::Lane lane, std::uint64_t& received, std::uint64_t& limit) noexcept;

  // Link: a relayed lane's incoming stream is numbered by its lane and has no preamble.
  std::optional<wire::Lane> stream_lane(std::uint64_t stream) const override {
    return static_cast<wire::Lane>(stream);
  }
  bool carries(wire::Lane) const noexcept override { return true; }
  bool on_socket() const noexcept override { return false; }
  std::string describe(std::uint64_t stream) const override {
    return std::string("relayed lane ") + wire::to_string(static_cast<wire::Lane>(stream));
  }

 private:
  struct Out {
    std::deque<quic::Chunk> chunks;  // not yet wholly acknowledged, in stream order
    std::uint64_t base = 0;          // stream offset of chunks.front()'s first byte
    std::uint64_t end = 0;           // stream offset after the last queued byte
    std::uint64_t sent = 0;          // next byte to send
    std::uint64_t acked = 0;         // the destination holds every byte below
    std::uint64_t limit = 0;         // credit: may send below this
    // Where `sent` lies: the index of its chunk and that chunk's first offset, so that
    // finding the next bytes to send does not walk every unacknowledged chunk.
    std::size_t cur = 0;
    std::uint64_t cur_at = 0;
    std::uint64_t since = 0;  // when the acknowledgements last moved (or sending began)
  };
  struct In {
    std::uint64_t received = 0;  // every byte below arrived and was delivered
    std::uint64_t consumed = 0;  // of those, consumed (credit may go back)
    std::map<std::uint64_t, std::vector<std::uint8_t>> early;  // segments ahead of a gap
    bool ack_owed = false;
  };
  std::uint64_t window_;
  LaneWork pump_;
  LaneWork ack_;
  Out out_[wire::lane_count];
  In in_[wire::lane_count];
};

template <class Deliver>
bool RelayLink::on_segment(wire::Lane lane, std::uint64_t offset, const std::uint8_t* data, std::size_t len,
                           Deliver&& deliver) {
  In& in = in_[static_cast<int>(lane)];
  if (offset + len > in.consumed + window_) return false;  // beyond the credit we granted
  in.ack_owed = true;
  auto take = [&](std::uint64_t off, const std::uint8_t* p, std::size_t n) -> bool {
    if (off + n <= in.received) return true;  // a copy sent again after a reroute
    const std::size_t skip = static_cast<std::size_t>(in.received - off);
    const auto credit = deliver(p + skip, n - skip);
    if (!credit) return false;
    in.received = off + n;
    in.consumed += *credit;
    return true;
  };
  if (offset > in.received) {
    in.early.try_emplace(offset, data, data + len);
    ack_(lane);
    return true;
  }
  if (!take(offset, data, len)) return false;
  while (!in.early.empty() && in.early.begin()->first <= in.received) {
    auto node = in.early.extract(in.early.begin());
    if (!take(node.key(), node.mapped().data(), node.mapped().size())) return false;
  }
  ack_(lane);
  return true;
}

}  // namespace nexar::detail
