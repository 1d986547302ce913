// An in-memory Link for unit tests (transport/link.hpp): two ends, each handed to a Peer
// with Peer::use_link, and nothing between them but the test's own hand. What one end
// pushes on a lane reaches the other end's owner only when the test steps the link, as
// the bytes of that lane's stream (numbered by its lane, without a preamble).
//
// Each step is drawn from a seeded generator: a lane with bytes waiting and room in the
// receiver's window, and a piece of 1 to max_piece bytes of it. So frames arrive split at
// any byte, the lanes interleave in any order, and one seed replays one order exactly; a
// lane's own bytes never reorder (it is a stream). Held bytes are the delay; cut() is the
// link lost (both owners hear of it, and what either end held fails).
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <random>
#include <string>
#include <vector>

#include "transport/link.hpp"

namespace nexar::test {

class MemoryLink final : public detail::Link {
 public:
  /// Joins two ends: what `a` pushes arrives at `b`'s owner, and back.
  static void join(MemoryLink& a, MemoryLink& b) noexcept {
    a.other_ = &b;
    b.other_ = &a;
  }
  /// `window`: bytes a lane may hold at the receiver, delivered and not yet consumed (the
  /// flow-control credit); `max_piece`: the largest piece one step hands over.
  explicit MemoryLink(std::uint64_t seed, std::uint64_t window = 1 << 20, std::size_t max_piece = 4096)
      : rng_(seed), window_(window), max_piece_(max_piece) {}
  /// Where this end's incoming bytes go (what Peer::use_link returned).
  void bind(detail::LinkOwner& owner) noexcept { owner_ = &owner; }

  /// Hands one piece from this end to the other; false when nothing can move.
  bool step() {
    if (cut_ || !other_ || !other_->owner_) return false;
    std::vector<int> ready;
    for (int l = 0; l < wire::lane_count; ++l)
      if (!out_[l].empty() && (out_[l].front().c.len == 0 || other_->held_[l] < window_)) ready.push_back(l);
    if (ready.empty()) return false;
    const int l = ready[std::uniform_int_distribution<std::size_t>(0, ready.size() - 1)(rng_)];
    Out& o = out_[l];
    Pending& p = o.front();
    const std::size_t left = p.c.len - p.sent;
    const std::size_t room = static_cast<std::size_t>(window_ - other_->held_[l]);
    const std::size_t n = std::min({left, room, std::uniform_int_distribution<std::size_t>(1, max_piece_)(rng_)});
    if (n > 0) {
      const auto credit = other_->owner_->on_link_data(*other_, static_cast<std::uint64_t>(l), p.c.data + p.sent, n);
      if (!credit) {
        refused_ = true;  // the receiver broke or is gone: nothing more goes its way
        return false;
      }
      other_->held_[l] += n - *credit;
      o.front().sent += n;
      bytes_moved_ += n;
    }
    if (o.front().sent == o.front().c.len) {
      // Whole at the receiver: complete it (after taking it out, as the callback may push).
      quic::Completion done = std::move(o.front().c.done);
      o.pop_front();
      done(Errc::ok, {});
    }
    if (cut_after_ && bytes_moved_ >= cut_after_) cut(Errc::peer_failed, "the in-memory link was cut");
    return true;
  }
  /// Steps both ends, in seeded turns, until neither can move (or `limit` steps).
  static int run(MemoryLink& a, MemoryLink& b, int limit = 1000000) {
    int steps = 0;
    std::bernoulli_distribution coin;
    while (steps < limit) {
      const bool first = coin(a.rng_);
      const bool moved = first ? (a.step() || b.step()) : (b.step() || a.step());
      if (!moved) break;
      ++steps;
    }
    return steps;
  }
  /// The link is lost: both owners hear `code`, then both ends fail what they still hold
  /// (a QUIC connection's end runs in the same order: its handler first).
  void cut(Errc code, const std::string& why) {
    if (cut_) return;
    cut_ = true;
    if (other_) other_->cut_ = true;
    if (owner_) owner_->on_link_closed(*this, code, why);
    if (other_ && other_->owner_) other_->owner_->on_link_closed(*other_, code, why);
    fail(code, why);
    if (other_) other_->fail(code, why);
  }
  /// Cuts the link by itself once this end has handed over `bytes` in all.
  void cut_after(std::uint64_t bytes) noexcept { cut_after_ = bytes; }
  bool refused() const noexcept { return refused_; }

  // Link
  void push(wire::Lane lane, quic::Chunk c) override {
    if (cut_) {
      c.done(Errc::peer_failed, "the in-memory link was cut");
      return;
    }
    out_[static_cast<int>(lane)].push_back(Pending{std::move(c), 0});
  }
  void consumed(std::uint64_t stream, std::uint64_t n) override {
    std::uint64_t& h = held_[stream];
    h -= std::min(h, n);
  }
  std::uint64_t unacked() const override {
    std::uint64_t n = 0;
    for (const auto& o : out_)
      for (const auto& p : o) n += p.c.len - p.sent;
    return n;
  }
  void fail(Errc code, const std::string& why) override {
    for (auto& o : out_) {
      while (!o.empty()) {
        quic::Completion done = std::move(o.front().c.done);
        o.pop_front();
        done(code, why);
      }
    }
  }
  std::optional<wire::Lane> stream_lane(std::uint64_t stream) const override { return static_cast<wire::Lane>(stream); }
  bool carries(wire::Lane) const noexcept override { return true; }
  bool on_socket() const noexcept override { return false; }
  std::string describe(std::uint64_t stream) const override {
    return std::string("in-memory lane ") + wire::to_string(static_cast<wire::Lane>(stream));
  }

 private:
  struct Pending {
    quic::Chunk c;
    std::size_t sent = 0;
  };
  using Out = std::deque<Pending>;

  MemoryLink* other_ = nullptr;
  detail::LinkOwner* owner_ = nullptr;
  std::mt19937_64 rng_;
  std::uint64_t window_;
  std::size_t max_piece_;
  Out out_[wire::lane_count];
  std::uint64_t held_[wire::lane_count] = {};  // delivered to this end's owner, not consumed
  std::uint64_t bytes_moved_ = 0;
  std::uint64_t cut_after_ = 0;
  bool cut_ = false;
  bool refused_ = false;
};

}  // namespace nexar::test
