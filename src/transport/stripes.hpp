// The extra QUIC connections of one pair of ranks (Config::connections_per_peer). Each
// carries one stream each way, the collective lane. Every collective message has a tag of
// its own (collective_message_tag in transport/match_queue.hpp), so the Peer may put each
// on any connection (Peer::route takes them in turn); every connection has its own
// congestion window, so a lost packet shrinks one of several, and a lossy link stays full.
// Engine thread only.
//
// A stripe's connection lives on the node's endpoint or, with several engine threads
// (Config::engine_threads), on a shard's (transport/shard.hpp): then its events arrive as
// posted work, and what goes to it is posted to the shard's thread in order.
//
// A stripe is usable once both ends know it: at once on the side that accepted it, and on
// the side that dialled it when the acceptor's first bytes (its preamble) arrive, which
// proves the acceptor kept it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nexar/error.hpp>

#include "quic/connection.hpp"
#include "transport/link.hpp"
#include "transport/shard.hpp"
#include "wire/frame.hpp"

namespace nexar::detail {

class Stripes {
 public:
  /// Where a dialled stripe went: one of the two is set, or neither if it could not be dialled.
  struct Placed {
    quic::Connection* conn = nullptr;
    Hosted* hosted = nullptr;
  };
  /// Dials stripe `slot` (1 ..) with `handler` for a connection on the node's endpoint.
  using Dialer = std::function<Placed(int slot, quic::ConnectionHandler* handler)>;
  /// What the stripes' connection events reach (the Peer).
  class Owner {
   public:
    /// The dialled stripe's certificate names `node`: empty to keep it, else why not.
    virtual std::string on_stripe_identity(const std::string& node) = 0;
    /// A stripe became usable (see above); `hosted`: its connection lives on a shard.
    virtual void on_stripe_ready(bool hosted) = 0;
    /// Bytes of the peer's stream `stream` on stripe `link`. Returns the bytes whose credit
    /// goes back at once (see LinkOwner::on_link_data).
    virtual std::optional<std::uint64_t> on_stripe_data(Link& link, std::uint64_t stream, const std::uint8_t* data,
                                                        std::size_t len) = 0;
    /// A stripe that was usable closed.
    virtual void on_stripe_closed(Errc code, const std::string& why) = 0;

   protected:
    ~Owner() = default;
  };

  /// `stream_priority`: the write priority of the collective lane's stream.
  Stripes(Owner& owner, int stream_priority) : owner_(owner), priority_(stream_priority) {}
  Stripes(const Stripes&) = delete;
  Stripes& operator=(const Stripes&) = delete;

  /// Dials a stripe.
  void dial(const Dialer& dialer);
  /// Takes a stripe the peer dialled (its certificate already checked).
  void accept(quic::Connection& c);
  /// Takes a stripe the peer dialled to a shard.
  void accept(Hosted& h);
  /// Stripes dialled or accepted and not closed.
  int live() const noexcept;
  /// Usable stripes.
  int active() const noexcept { return static_cast<int>(active_.size()); }
  /// Usable stripes whose connection lives on a shard.
  int hosted() const noexcept {
    return static_cast<int>(std::count_if(active_.begin(), active_.end(), [](const Stripe* l) { return l->hosted != nullptr; }));
  }
  /// Usable stripe `i` (0 .. active() - 1), in the order they became usable.
  Link& at(int i) const noexcept { return *active_[static_cast<std::size_t>(i)]; }
  /// Unacknowledged bytes on the active stripes.
  std::uint64_t unacked() const;
  /// Closes every stripe still open with `app_code` (never from inside packet processing).
  void close_all(std::uint64_t app_code, const std::string& why);

 private:
  // One extra connection as a link: the collective lane's stream each way. What it holds
  // completes when its connection closes, so fail() has nothing to do.
  struct Stripe final : Link, quic::ConnectionHandler, Hosted::Events {
    Stripes& set;
    int slot;
    quic::Connection* conn = nullptr;  // on the node's endpoint
    Hosted* hosted = nullptr;          // on a shard's
    bool open = true;
    std::int64_t out = -1;
    bool ready = false;
    bool confirmed = false;  // the acceptor's bytes arrived (possibly before our streams opened)
    std::byte preamble[wire::preamble_size];  // queued as is: must outlive the connection
    Stripe(Stripes& s, int n) : set(s), slot(n) {}
    // Link
    void push(wire::Lane lane, quic::Chunk c) override;
    void consumed(std::uint64_t stream, std::uint64_t n) override;
    std::uint64_t unacked() const override;
    void fail(Errc, const std::string&) override {}
    std::optional<wire::Lane> stream_lane(std::uint64_t) const override { return std::nullopt; }
    bool carries(wire::Lane lane) const noexcept override { return lane == wire::Lane::collective; }
    bool on_socket() const noexcept override { return true; }
    std::string describe(std::uint64_t stream) const override {
      return "stream " + std::to_string(stream) + " of extra connection " + std::to_string(slot);
    }
    // Wherever the connection lives.
    void established(quic::Connection& c);
    std::optional<std::uint64_t> data(std::int64_t stream, const std::uint8_t* data, std::size_t len);
    void closed(Errc code, const std::string& why);
    // quic::ConnectionHandler: a connection on the node's endpoint.
    std::string on_peer_identity(quic::Connection& c, const std::string& node) override;
    void on_established(quic::Connection& c) override { established(c); }
    void on_stream_data(quic::Connection& c, std::int64_t stream, const std::uint8_t* data,
                        std::size_t len) override;
    void on_closed(quic::Connection&, Errc code, const std::string& why) override { closed(code, why); }
    // Hosted::Events: a connection on a shard.
    void hosted_established(Hosted& h) override;
    void hosted_data(Hosted& h, std::int64_t stream, const std::uint8_t* data, std::size_t len) override;
    void hosted_closed(Hosted&, Errc code, const std::string& why) override { closed(code, why); }
  };
  Stripe& add();
  void make_ready(Stripe& l);

  Owner& owner_;
  int priority_;
  // Every stripe ever made stays (a closed one with conn null): a handler must outlive its
  // connection's last callback, and a pair makes at most a few.
  std::vector<std::unique_ptr<Stripe>> links_;
  std::vector<Stripe*> active_;
};

}  // namespace nexar::detail
