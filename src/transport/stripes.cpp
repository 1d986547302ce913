#include "transport/stripes.hpp"

#include <algorithm>
#include <utility>

namespace nexar::detail {

Stripes::Stripe& Stripes::add() {
  links_.push_back(std::make_unique<Stripe>(*this, static_cast<int>(links_.size()) + 1));
  return *links_.back();
}

void Stripes::dial(const Dialer& dialer) {
  Stripe& l = add();
  const Placed p = dialer(l.slot, &l);
  l.conn = p.conn;
  l.hosted = p.hosted;
  if (l.hosted) l.hosted->set_events(&l);
  l.open = l.conn || l.hosted;
}

void Stripes::accept(quic::Connection& c) {
  Stripe& l = add();
  l.conn = &c;
  c.set_handler(&l);
}

void Stripes::accept(Hosted& h) {
  Stripe& l = add();
  l.hosted = &h;
  h.set_events(&l);
}

int Stripes::live() const noexcept {
  return static_cast<int>(std::count_if(links_.begin(), links_.end(), [](const auto& l) { return l->open; }));
}

std::uint64_t Stripes::unacked() const {
  std::uint64_t n = 0;
  for (const Stripe* l : active_) n += l->unacked();
  return n;
}

void Stripes::close_all(std::uint64_t app_code, const std::string& why) {
  for (auto& l : links_) {
    if (!l->open) continue;
    if (l->hosted) {
      l->hosted->close(app_code, why);
    } else if (!l->conn->closed()) {
      l->conn->close(app_code, why);
    }
  }
}

void Stripes::make_ready(Stripe& l) {
  if (l.ready) return;
  l.ready = true;
  active_.push_back(&l);
  owner_.on_stripe_ready(l.hosted != nullptr);
}

std::string Stripes::Stripe::on_peer_identity(quic::Connection&, const std::string& node) {
  return set.owner_.on_stripe_identity(node);
}

void Stripes::Stripe::established(quic::Connection& c) {
  out = c.open_stream(set.priority_);
  wire::encode_preamble(wire::Lane::collective, std::span<std::byte, wire::preamble_size>(preamble));
  c.push(out, quic::Chunk{reinterpret_cast<const std::uint8_t*>(preamble), wire::preamble_size, [](Errc, const std::string&) {}});
  // The acceptor kept the connection when it accepted it; the dialler learns so from the
  // acceptor's first bytes.
  if (c.is_server() || confirmed) set.make_ready(*this);
}

std::optional<std::uint64_t> Stripes::Stripe::data(std::int64_t stream, const std::uint8_t* bytes, std::size_t len) {
  if (!ready) {
    confirmed = true;
    if (out >= 0) set.make_ready(*this);
  }
  return set.owner_.on_stripe_data(*this, static_cast<std::uint64_t>(stream), bytes, len);
}

void Stripes::Stripe::closed(Errc code, const std::string& why) {
  conn = nullptr;
  open = false;
  std::erase(set.active_, this);
  if (std::exchange(ready, false)) set.owner_.on_stripe_closed(code, why);
}

void Stripes::Stripe::on_stream_data(quic::Connection& c, std::int64_t stream, const std::uint8_t* bytes,
                                   std::size_t len) {
  const auto n = data(stream, bytes, len);
  if (n && !c.closed()) c.consumed(stream, *n);
}

void Stripes::Stripe::hosted_established(Hosted& h) {
  h.with([this](quic::Connection& c) { established(c); });
}

void Stripes::Stripe::hosted_data(Hosted& h, std::int64_t stream, const std::uint8_t* bytes, std::size_t len) {
  if (!open) return;
  if (const auto n = data(stream, bytes, len)) h.consumed(stream, *n);
}

void Stripes::Stripe::push(wire::Lane, quic::Chunk c) {
  if (hosted) {
    hosted->push(out, std::move(c));
  } else if (conn) {
    conn->push(out, std::move(c));
  } else {
    c.done(Errc::peer_failed, "connection closed");
  }
}

void Stripes::Stripe::consumed(std::uint64_t stream, std::uint64_t n) {
  if (!open) return;
  if (hosted) {
    hosted->consumed(static_cast<std::int64_t>(stream), n);
  } else if (!conn->closed()) {
    conn->consumed(static_cast<std::int64_t>(stream), n);
  }
}

std::uint64_t Stripes::Stripe::unacked() const {
  if (hosted) return hosted->unacked(out);
  return conn ? conn->unacked(out) : 0;
}

}  // namespace nexar::detail
