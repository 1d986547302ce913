// The pair's first QUIC connection as a link: one outgoing stream per lane, each opened
// with its lane's write priority and preamble, and the chunks queued before the
// connection can take them (a lazy connection being dialled, a dial not yet confirmed by
// the acceptor's hello), sent in order once it can. The Peer stays the connection's handler
// (the handshake, the hello and the close decide what the pair is); this class only moves
// bytes. Engine thread only.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "transport/link.hpp"

namespace nexar::detail {

class QuicLink final : public Link {
 public:
  QuicLink();

  /// Write priority of `lane`'s stream: control first, then RPC, then data and collective
  /// together, bulk last, so a long bulk transfer never sits in front of a barrier or an
  /// RPC. Data and collective share a class: the connection takes turns between streams of
  /// one class, so a large send and a large collective share the link and a small message
  /// of either waits about a packet at most.
  static int priority(wire::Lane lane) noexcept;

  /// The connection now carrying the pair (its streams not open yet).
  void attach(quic::Connection& c) noexcept;
  /// Opens one stream per lane on the attached connection and writes their preambles;
  /// `bulk_scavenger`: the bulk lane's stream yields to the others (Config::bulk_scavenger).
  void open_streams(bool bulk_scavenger);
  /// Queues `c` on `lane`'s stream of the attached connection at once, ahead of what waits
  /// for confirm(): the hello, which tells the peer that this side keeps the connection.
  void push_now(wire::Lane lane, quic::Chunk c) { conn_->push(out_[static_cast<int>(lane)], std::move(c)); }
  /// Both ends keep the connection: what waited goes out, and later chunks go straight on.
  void confirm();
  /// Forgets the connection (refused, given up, or closed); later chunks wait for the next.
  void detach() noexcept;

  quic::Connection* connection() const noexcept { return conn_; }
  /// Counts attach(): tells a new connection from a freed one at the same address.
  std::uint64_t generation() const noexcept { return gen_; }
  /// Whether `lane`'s stream is open on a connection that is not closed.
  bool open(wire::Lane lane) const noexcept {
    return conn_ && !conn_->closed() && out_[static_cast<int>(lane)] >= 0;
  }
  /// Whether chunks go straight on the connection (else they wait).
  bool ready() const noexcept { return conn_ && confirmed_ && out_[0] >= 0; }

  // Link
  void push(wire::Lane lane, quic::Chunk c) override;
  void consumed(std::uint64_t stream, std::uint64_t n) override;
  std::uint64_t unacked() const override;
  void fail(Errc code, const std::string& why) override;
  std::optional<wire::Lane> stream_lane(std::uint64_t) const override { return std::nullopt; }
  bool carries(wire::Lane) const noexcept override { return true; }
  bool on_socket() const noexcept override { return true; }
  std::string describe(std::uint64_t stream) const override { return "stream " + std::to_string(stream); }

 private:
  quic::Connection* conn_ = nullptr;
  std::uint64_t gen_ = 0;
  bool confirmed_ = false;
  std::int64_t out_[wire::lane_count] = {-1, -1, -1, -1, -1, -1};
  std::vector<std::pair<wire::Lane, quic::Chunk>> waiting_;
  // Queued as they are: they must outlive every connection they went out on, and each
  // lane's never changes.
  std::byte preambles_[wire::lane_count][wire::preamble_size];
};

}  // namespace nexar::detail
