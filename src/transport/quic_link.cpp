#include "transport/quic_link.hpp"

namespace nexar::detail {

using wire::Lane;

int QuicLink::priority(Lane lane) noexcept {
  constexpr int by_lane[wire::lane_count] = {0, 2, 1, 1, 3, 2};
  return by_lane[static_cast<int>(lane)];
}

QuicLink::QuicLink() {
  for (int l = 0; l < wire::lane_count; ++l)
    wire::encode_preamble(static_cast<Lane>(l), std::span<std::byte, wire::preamble_size>(preambles_[l]));
}

void QuicLink::attach(quic::Connection& c) noexcept {
  conn_ = &c;
  ++gen_;
}

void QuicLink::open_streams(bool bulk_scavenger) {
  for (int l = 0; l < wire::lane_count; ++l) {
    const auto lane = static_cast<Lane>(l);
    out_[l] = conn_->open_stream(priority(lane), lane == Lane::bulk && bulk_scavenger);
    conn_->push(out_[l], quic::Chunk{reinterpret_cast<const std::uint8_t*>(preambles_[l]), wire::preamble_size, {}});
  }
}

void QuicLink::confirm() {
  confirmed_ = true;
  auto waiting = std::move(waiting_);
  waiting_.clear();
  for (auto& [lane, chunk] : waiting) push(lane, std::move(chunk));
}

void QuicLink::detach() noexcept {
  conn_ = nullptr;
  ++gen_;
  confirmed_ = false;
  for (auto& id : out_) id = -1;
}

void QuicLink::push(Lane lane, quic::Chunk c) {
  if (!ready()) {
    waiting_.emplace_back(lane, std::move(c));
    return;
  }
  conn_->push(out_[static_cast<int>(lane)], std::move(c));
}

void QuicLink::consumed(std::uint64_t stream, std::uint64_t n) {
  if (conn_ && !conn_->closed()) conn_->consumed(static_cast<std::int64_t>(stream), n);
}

std::uint64_t QuicLink::unacked() const {
  // Chunks still waiting for the connection were promised to the caller all the same.
  std::uint64_t n = 0;
  for (const auto& [lane, c] : waiting_) n += c.len;
  if (!conn_) return n;
  for (auto id : out_)
    if (id >= 0) n += conn_->unacked(id);
  return n;
}

void QuicLink::fail(Errc code, const std::string& why) {
  // What the connection holds completes when it closes; what waited for it fails here.
  auto waiting = std::move(waiting_);
  waiting_.clear();
  for (auto& [lane, chunk] : waiting)
    if (chunk.done) chunk.done(code, why);
}

}  // namespace nexar::detail
