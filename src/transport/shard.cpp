#include "transport/shard.hpp"

#include <future>
#include <utility>

#include "quic/udp_socket.hpp"

namespace nexar::detail {

// ---- Hosted: the node's side ---------------------------------------------------------------

void Hosted::push(std::int64_t stream, quic::Chunk c) {
  in_transit_.fetch_add(c.len, std::memory_order_relaxed);
  host_.shard_engine().post([this, stream, c = std::move(c)]() mutable {
    in_transit_.fetch_sub(c.len, std::memory_order_relaxed);
    if (conn_) {
      conn_->push(stream, std::move(c));
    } else {
      c.done(Errc::peer_failed, "connection closed");
    }
  });
}

std::uint64_t Hosted::unacked(std::int64_t stream) {
  // Read first: a chunk leaves the count only under the shard's lock, where the
  // connection's count already holds it.
  std::uint64_t n = in_transit_.load(std::memory_order_relaxed);
  with([&](quic::Connection& c) { n += c.unacked(stream); });
  return n;
}

void Hosted::consumed(std::int64_t stream, std::uint64_t n) {
  host_.shard_engine().post([this, stream, n] {
    if (conn_) conn_->consumed(stream, n);
  });
}

void Hosted::close(std::uint64_t app_code, std::string why) {
  host_.shard_engine().post([this, app_code, why = std::move(why)] {
    if (conn_ && !conn_->closed()) conn_->close(app_code, why);
  });
}

void Hosted::drain() {
  {
    std::lock_guard lk(in_mu_);
    taken_.swap(in_);
    taken_runs_.swap(runs_);
    drain_posted_ = false;
  }
  std::size_t at = 0;
  for (const Run& r : taken_runs_) {
    if (events_) events_->hosted_data(*this, r.stream, taken_.data() + at, r.len);
    at += r.len;
  }
  taken_.clear();
  taken_runs_.clear();
}

// ---- Hosted: the shard's side --------------------------------------------------------------

std::string Hosted::on_peer_identity(quic::Connection& c, const std::string& node) {
  // A dialled one: the connection itself checked that it names the node dialled.
  if (!c.is_server()) return {};
  // Whether the node keeps it depends on its peers' state, which only its engine thread
  // reads: it decides there, before any later event of this connection reaches it.
  host_.node_engine().post([this, node] { host_.accept(*this, node); });
  return {};
}

void Hosted::on_established(quic::Connection&) {
  host_.node_engine().post([this] {
    if (events_) events_->hosted_established(*this);
  });
}

void Hosted::on_stream_data(quic::Connection&, std::int64_t stream, const std::uint8_t* data, std::size_t len) {
  std::lock_guard lk(in_mu_);
  in_.insert(in_.end(), data, data + len);
  if (runs_.empty() || runs_.back().stream != stream) {
    runs_.push_back({stream, len});
  } else {
    runs_.back().len += len;
  }
  // One drain per turn of the node's engine thread, however many packets came meanwhile.
  if (!std::exchange(drain_posted_, true)) host_.node_engine().post([this] { drain(); });
}

void Hosted::on_closed(quic::Connection&, Errc code, const std::string& why) {
  conn_ = nullptr;
  host_.node_engine().post([this, code, why] {
    if (events_) events_->hosted_closed(*this, code, why);
  });
}

// ---- Shard ---------------------------------------------------------------------------------

Shard::Shard(Engine& node_engine, const Config& cfg, const tls::TlsContext& tls, quic::ConnectionSettings settings,
             quic::Address bind)
    : node_engine_(node_engine), engine_(cfg.spin, cfg.yield_when_idle) {
  bind.set_port(0);
  const int fd = quic::UdpSocket::open_bound(bind);
  ep_ = std::make_unique<quic::Endpoint>(engine_, fd, tls, std::move(settings), cfg.udp_gso);
  port_ = ep_->local().port();
}

Shard::~Shard() { stop("shard stopped"); }

void Shard::start(AcceptFn accept) {
  accept_ = std::move(accept);
  engine_.set_spin_hook([this] { ep_->service_timers(); });
  engine_.start();
  std::promise<void> started;
  engine_.post([this, &started] {
    ep_->start([this](quic::Connection& c) -> quic::ConnectionHandler* {
      hosted_.push_back(std::make_unique<Hosted>(static_cast<Hosted::Host&>(*this)));
      Hosted* h = hosted_.back().get();
      h->attach(c);
      return h;
    });
    started.set_value();
  });
  started.get_future().wait();
}

void Shard::stop(const std::string& why) {
  if (engine_.stopped()) return;
  engine_.post([this, why] { ep_->shutdown(why); });
  engine_.stop();
}

Hosted* Shard::dial(const quic::Address& to, const std::string& node) {
  std::lock_guard lk(engine_.lock());
  if (ep_->stopped() || engine_.stopped()) return nullptr;
  hosted_.push_back(std::make_unique<Hosted>(static_cast<Hosted::Host&>(*this)));
  Hosted* h = hosted_.back().get();
  h->attach(ep_->connect(to, node, h));
  return h;
}

}  // namespace nexar::detail
