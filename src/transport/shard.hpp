// An extra engine thread of a node (Config::engine_threads): a UDP socket, a QUIC endpoint,
// a timer, a lock and a thread of its own, hosting a share of the pairs' extra connections
// (transport/stripes.hpp). ngtcp2 and GnuTLS are not thread-safe, so the unit of
// parallelism is the connection: whatever a hosted connection does runs on the shard's
// thread or under its lock, and its packets are encrypted, decrypted and acknowledged there,
// on another core than the node's engine thread.
//
// Lock order: the node's engine lock, then a shard's lock, never the other way round. The
// shard's thread therefore never calls into the node: what a hosted connection reports (the
// acceptor's check, the handshake's end, its bytes, its close) reaches the node's engine
// thread as posted work, in the order it happened.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nexar/config.hpp>

#include "engine/engine.hpp"
#include "quic/connection.hpp"
#include "quic/endpoint.hpp"

namespace nexar::detail {

/// One connection hosted on a shard, as the node sees it. Lives as long as its shard, so
/// work posted on either side may refer to it after the connection ended.
class Hosted final : public quic::ConnectionHandler {
 public:
  /// What the node learns of a hosted connection, on its engine thread (engine lock held).
  class Events {
   public:
    /// The handshake ended.
    virtual void hosted_established(Hosted& h) = 0;
    /// Bytes of a stream the peer opened, in order. Return credit with consumed().
    virtual void hosted_data(Hosted& h, std::int64_t stream, const std::uint8_t* data, std::size_t len) = 0;
    /// The connection is gone; called once.
    virtual void hosted_closed(Hosted& h, Errc code, const std::string& why) = 0;

   protected:
    ~Events() = default;
  };

  /// What a hosted connection reaches of the shard that owns it.
  class Host {
   public:
    /// The shard's engine: its thread runs the connection, and its lock guards it.
    virtual Engine& shard_engine() noexcept = 0;
    /// The node's engine, whose thread gets the events.
    virtual Engine& node_engine() noexcept = 0;
    /// A peer dialled `h`, and its certificate names `node`: the node keeps it or closes it
    /// (node engine thread).
    virtual void accept(Hosted& h, const std::string& node) = 0;

   protected:
    ~Host() = default;
  };

  explicit Hosted(Host& host) : host_(host) {}
  /// The connection this one is (the shard's, before any of its events).
  void attach(quic::Connection& c) noexcept { conn_ = &c; }

  // ---- the node's engine thread, its lock held; never the shard's thread ----
  /// Who gets the events; set before the node's engine thread runs its next posted work.
  void set_events(Events* e) noexcept { events_ = e; }
  /// Runs `fn(connection)` now, under the shard's lock, if the connection is still open;
  /// returns whether it ran. `fn` must not call back into this Hosted.
  template <class F>
  bool with(F&& fn);
  /// Queues `c` on `stream`, in order with everything queued before; a connection that
  /// closed meanwhile fails it.
  void push(std::int64_t stream, quic::Chunk c);
  /// Bytes on `stream` not acknowledged yet, those still on their way to the shard's
  /// thread included.
  std::uint64_t unacked(std::int64_t stream);
  /// Returns `n` bytes of credit on `stream`.
  void consumed(std::int64_t stream, std::uint64_t n);
  /// Closes the connection (if still open) with `app_code`.
  void close(std::uint64_t app_code, std::string why);

 private:
  // ConnectionHandler, on the shard's thread with its lock held.
  std::string on_peer_identity(quic::Connection& c, const std::string& node) override;
  void on_established(quic::Connection& c) override;
  void on_stream_data(quic::Connection& c, std::int64_t stream, const std::uint8_t* data, std::size_t len) override;
  void on_closed(quic::Connection& c, Errc code, const std::string& why) override;
  /// Hands what arrived to the events (node engine thread).
  void drain();

  Host& host_;
  quic::Connection* conn_ = nullptr;  // shard lock; null once closed
  std::atomic<std::uint64_t> in_transit_{0};  // pushed, not yet queued on the connection
  Events* events_ = nullptr;          // node engine thread
  // Bytes received and not yet handed to the node: one run per stream in arrival order.
  // The peer's credit returns only once the node consumed them, so this stays within the
  // stream window.
  struct Run {
    std::int64_t stream;
    std::size_t len;
  };
  std::mutex in_mu_;
  std::vector<std::uint8_t> in_;
  std::vector<Run> runs_;
  bool drain_posted_ = false;
  // What drain() works on (node engine thread), kept to reuse its capacity.
  std::vector<std::uint8_t> taken_;
  std::vector<Run> taken_runs_;
};

class Shard final : private Hosted::Host {
 public:
  /// The node's side of a connection a peer dialled to this shard: `node` is what its
  /// verified certificate names. Runs on the node's engine thread; the callee keeps the
  /// connection (set_events) or closes it.
  using AcceptFn = std::function<void(Hosted& h, const std::string& node)>;

  /// Binds a UDP socket on `bind` (its port ignored: one is picked). `node_engine` runs what
  /// the hosted connections report. Throws nexar::Error(Errc::io) when the socket fails.
  Shard(Engine& node_engine, const Config& cfg, const tls::TlsContext& tls, quic::ConnectionSettings settings,
        quic::Address bind);
  ~Shard();
  Shard(const Shard&) = delete;
  Shard& operator=(const Shard&) = delete;

  /// Starts the thread and the endpoint; connections peers dial here go to `accept`.
  void start(AcceptFn accept);
  /// Closes every hosted connection with `why` and stops the thread. Not with the node's
  /// engine lock held.
  void stop(const std::string& why);

  /// The port peers dial to reach this shard.
  std::uint16_t port() const noexcept { return port_; }
  /// Dials `to` expecting its certificate to name `node` (node engine thread, its lock
  /// held). Null once the shard stopped.
  Hosted* dial(const quic::Address& to, const std::string& node);

 private:
  // Hosted::Host
  Engine& shard_engine() noexcept override { return engine_; }
  Engine& node_engine() noexcept override { return node_engine_; }
  void accept(Hosted& h, const std::string& node) override { accept_(h, node); }

  Engine& node_engine_;
  Engine engine_;
  AcceptFn accept_;
  std::uint16_t port_ = 0;
  // Every connection ever hosted (a handful per peer); they outlive their endpoint's
  // connections, which call them until the end.
  std::vector<std::unique_ptr<Hosted>> hosted_;
  std::unique_ptr<quic::Endpoint> ep_;
};

template <class F>
bool Hosted::with(F&& fn) {
  std::lock_guard lk(host_.shard_engine().lock());
  if (!conn_ || conn_->closed()) return false;
  fn(*conn_);
  return true;
}

}  // namespace nexar::detail
