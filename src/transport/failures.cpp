// Failures (failures.hpp): liveness of each peer, declaring a rank failed, spreading the
// news, and revoking the communicators that contain it.
//
// Detection is receive-based: every authenticated packet from a peer proves it alive
// (quic::Connection::last_rx), whatever lane or traffic it belongs to, so a link saturated
// by bulk data never looks silent. While nothing arrives from a peer, a heartbeat frame goes
// to it every tenth of Config::failure_timeout, and its acknowledgement comes back; a peer
// from which nothing arrived for the whole failure timeout is declared failed. A broken
// connection (the peer's port unreachable, a reset, a protocol violation) is declared at
// once, from Peer::mark_gone.
#include <algorithm>
#include <cstring>

#include "transport/failures.hpp"

#include "core/error_format.hpp"
#include "core/log.hpp"
#include "engine/engine.hpp"
#include "quic/endpoint.hpp"
#include "transport/matching.hpp"
#include "transport/membership_lanes.hpp"
#include "transport/peer.hpp"
#include "transport/routing.hpp"

namespace nexar::detail {

using wire::FrameHeader;
using wire::FrameType;

namespace {

constexpr std::uint64_t to_ns(std::chrono::milliseconds ms) {
  return static_cast<std::uint64_t>(ms.count()) * 1'000'000u;
}

// Time since `then` on the Endpoint clock; 0 when `then` is later than `now`.
constexpr std::uint64_t age(std::uint64_t now, std::uint64_t then) { return now > then ? now - then : 0; }

bool contains(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }

}  // namespace

std::string describe_failure(int local, int world, const std::string& why) {
  std::string who = "rank " + std::to_string(local);
  if (local != world) who += " (world rank " + std::to_string(world) + ")";
  return who + " failed: " + why;
}

Failures::Failures(Owner& owner, int rank, int world, const Config& cfg, Engine& engine, Matching& matching,
                   Routing& routing)
    : owner_(owner),
      rank_(rank),
      cfg_(cfg),
      engine_(engine),
      matching_(matching),
      routing_(routing),
      failed_(static_cast<std::size_t>(world), 0) {}

// ---- liveness ------------------------------------------------------------------------------

void Failures::start_liveness() {
  judging_ = true;
  last_tick_ = quic::Endpoint::now();
  liveness_timer_ = std::make_unique<asio::steady_timer>(engine_.io());
  liveness_tick();
}

void Failures::stop_liveness() {
  if (liveness_timer_) liveness_timer_->cancel();
}

void Failures::liveness_tick() {
  quic::Endpoint* ep = owner_.endpoint();
  if (!owner_.is_open() || !ep) return;
  const std::uint64_t timeout = to_ns(cfg_.failure_timeout);
  const std::uint64_t period = std::max<std::uint64_t>(timeout / 10, 5'000'000u);
  std::uint64_t now = quic::Endpoint::now();
  // A tick far behind its schedule means this process did not run meanwhile (descheduled
  // on an overloaded host, stopped, swapped out): silence measured across that gap says
  // nothing about the peers, so nobody is judged this time.
  const bool late = age(now, last_tick_) > timeout / 2;
  last_tick_ = now;
  quic::Endpoint::Batch batch(*ep);
  bool drained = false;
  for (int r = 0; r < owner_.size(); ++r) {
    Peer* p = owner_.peer_locked(r);
    if (!p || !p->up() || !p->connection()) continue;
    if (!late && age(now, p->connection()->last_rx()) >= timeout) {
      if (!drained) {
        // Datagrams still waiting in the socket count: read them before judging anyone.
        drained = true;
        ep->poll();
        now = quic::Endpoint::now();
        if (!p->up() || !p->connection()) continue;
      }
      const std::uint64_t silent = age(now, p->connection()->last_rx());
      if (silent >= timeout) {
        declare_failed(r, "nothing arrived from it for " + std::to_string(silent / 1'000'000u) +
                              " ms (failure_timeout " + std::to_string(cfg_.failure_timeout.count()) + " ms)");
        continue;
      }
    }
    p->heartbeat(now, period);
  }
  // Relayed bytes that no acknowledgement moved on for a heartbeat period or more: a relay
  // on the way lost them (it died before it heard of an earlier failure). Sent again.
  if (!late) routing_.resend_stalled(now, 2 * period);
  liveness_timer_->expires_after(std::chrono::nanoseconds(period));
  liveness_timer_->async_wait(engine_.guard([this](asio::error_code ec) {
    if (!ec) liveness_tick();
  }));
}

// ---- declaring and spreading ---------------------------------------------------------------

bool Failures::is_failed(int r) const {
  std::lock_guard lk(mu_);
  return r >= 0 && static_cast<std::size_t>(r) < failed_.size() && failed_[static_cast<std::size_t>(r)];
}

void Failures::add_rank() {
  std::lock_guard lk(mu_);
  failed_.push_back(0);
}

FrameHeader Failures::failed_header(int r) const {
  FrameHeader h;
  h.type = FrameType::failed;
  h.src = static_cast<std::uint32_t>(rank_);
  h.tag = static_cast<std::uint64_t>(r);
  return h;
}

void Failures::flood(const FrameHeader& h, std::string_view payload, int except) {
  for (int r = 0; r < owner_.size(); ++r) {
    if (r == rank_ || r == except) continue;
    Peer* p = owner_.peer_locked(r);
    // Neighbours only: each forwards it once, so it reaches every rank of a connected
    // topology without crossing relays.
    if (!p || !p->up() || p->relayed()) continue;
    p->send_frame(wire::Lane::control, h, std::as_bytes(std::span(payload)));
  }
}

void Failures::tell_failed(Peer& p) {
  for (int r = 0; r < owner_.size(); ++r) {
    if (r == rank_ || r == p.rank() || !is_failed(r)) continue;
    const std::string why = "known failed at rank " + std::to_string(rank_);
    p.send_frame(wire::Lane::control, failed_header(r), std::as_bytes(std::span(why)));
  }
}

void Failures::declare_failed(int r, const std::string& why) {
  Peer* p = owner_.peer_locked(r);
  if (!p || !owner_.is_open()) return;
  std::vector<std::uint64_t> hit;
  {
    std::lock_guard lk(mu_);
    if (failed_[static_cast<std::size_t>(r)]) return;
    failed_[static_cast<std::size_t>(r)] = 1;
    for (auto& [id, w] : comms_)
      if (contains(w.members, r)) hit.push_back(id);
  }
  log::warn("rank {}: rank {} ({}) failed: {}", rank_, r, p->addr_text(), why);
  // Revoke first, so every pending operation of those communicators fails naming the rank
  // in the communicator's own numbering; what is left with the peer (RPC calls, operations
  // of communicators already gone) fails as it is cut off.
  for (std::uint64_t id : hit) revoke_local(id, Errc::rank_failed, r, why);
  p->cut_off("rank " + std::to_string(r) + " failed: " + why);
  // Everyone is told, and forwards it once: the news outlives our own death half-way.
  flood(failed_header(r), std::string_view(why).substr(0, 1000), r);
  if (MembershipLanes* m = owner_.membership()) m->on_rank_failed(r);
}

void Failures::on_failed_notice(int from, int r, const std::string& why) {
  if (r == rank_) {
    // The others gave up on us (we were silent too long for them): we are out of every
    // communicator. Operations fail naming this rank; nothing more is sent.
    if (expelled_.exchange(true)) return;
    const std::string text = "this rank was declared failed by rank " + std::to_string(from) + ": " + why;
    log::error("rank {}: {}", rank_, text);
    std::vector<std::uint64_t> all;
    {
      std::lock_guard lk(mu_);
      for (auto& [id, w] : comms_) all.push_back(id);
    }
    for (std::uint64_t id : all) revoke_local(id, Errc::rank_failed, rank_, text);
    if (MembershipLanes* m = owner_.membership()) m->on_expelled(text);
    for (int q = 0; q < owner_.size(); ++q)
      if (Peer* p = owner_.peer_locked(q)) p->cut_off(text);
    return;
  }
  if (is_failed(r)) return;
  declare_failed(r, "reported by rank " + std::to_string(from) + ": " + why);
}

// ---- revocation ---------------------------------------------------------------------------

void Failures::revoke_local(std::uint64_t id, Errc code, int failed_world, const std::string& why) {
  Watch w;
  bool known = false;
  {
    std::lock_guard lk(mu_);
    if (auto it = comms_.find(id); it != comms_.end()) {
      w = it->second;
      known = true;
    }
  }
  const bool first = revoked_.emplace(id, Revoked{code, failed_world, why}).second;
  // The communicator hears of every failure of a member, not only the one that revoked it,
  // and before its operations fail: a caller woken by the failure sees it in failed_ranks().
  if (known && w.on_event) w.on_event(failed_world, code, why);
  if (known && first) {
    const RevokeError err = revoke_error(w, code, failed_world, why);
    auto fail = [&err](const std::shared_ptr<OpState>& op) { err.fail(op); };
    for (auto& q : matching_.queues()) {
      auto& posted = q.posted();
      for (auto it = posted.begin(); it != posted.end();) {
        if ((*it)->comm == id) {
          fail((*it)->op);
          it = posted.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (int r = 0; r < owner_.size(); ++r)
      if (Peer* p = owner_.peer_locked(r)) p->fail_comm(id, fail);
    // Messages of the communicator nobody received yet will never be: free their credit.
    for (int di = 0; di < domain_count; ++di) {
      auto& list = matching_.queue(static_cast<Domain>(di)).unexpected();
      for (auto it = list.begin(); it != list.end();) {
        const Unexpected& u = **it;
        if (u.comm == id && !u.waiter) {
          if (Peer* src = owner_.peer_locked(u.source); src && !u.data.empty())
            src->release_unexpected(static_cast<Domain>(di), u.data.size());
          it = list.erase(it);
        } else {
          ++it;
        }
      }
    }
  }
}

Failures::RevokeError Failures::revoke_error(const Watch& w, Errc code, int failed_world, const std::string& why) {
  RevokeError e;
  e.code = code;
  e.rank = w.rank;
  for (std::size_t i = 0; i < w.members.size(); ++i)
    if (w.members[i] == failed_world) e.peer = static_cast<int>(i);
  e.detail = code == Errc::rank_failed && failed_world != rank_ ? describe_failure(e.peer, failed_world, why) : why;
  if (failed_world != rank_)
    if (const Peer* p = owner_.peer_locked(failed_world)) e.addr = p->addr_text();
  std::lock_guard lk(mu_);
  for (std::size_t i = 0; i < w.members.size(); ++i)
    if (failed_[static_cast<std::size_t>(w.members[i])] || (w.members[i] == rank_ && expelled_.load()))
      e.failed.push_back(static_cast<int>(i));
  return e;
}

void Failures::RevokeError::fail(const std::shared_ptr<OpState>& op) const {
  if (!op || op->done()) return;
  ErrorContext ctx{op->op(), rank, peer, addr, op->start()};
  op->fail_ranks(code, format_error(code, ctx, detail), failed);
}

bool Failures::fail_if_revoked(std::uint64_t comm, const std::shared_ptr<OpState>& op) {
  if (revoked_.empty()) return false;
  auto it = revoked_.find(comm);
  if (it == revoked_.end()) return false;
  Watch w;
  {
    std::lock_guard lk(mu_);
    if (auto c = comms_.find(comm); c != comms_.end()) w = c->second;
  }
  revoke_error(w, it->second.code, it->second.failed_world, it->second.why).fail(op);
  return true;
}

void Failures::revoke_everywhere(std::uint64_t id, const std::string& why) {
  std::vector<int> members;
  {
    std::lock_guard lk(mu_);
    auto it = comms_.find(id);
    if (it == comms_.end()) return;
    members = it->second.members;
  }
  if (revoked_.count(id)) return;
  const Errc code = why.empty() ? Errc::revoked : Errc::invalid_argument;
  revoke_local(id, code, -1, why.empty() ? "communicator revoked by rank " + std::to_string(rank_) : why);
  FrameHeader h;
  h.type = FrameType::revoke;
  h.src = static_cast<std::uint32_t>(rank_);
  h.comm = id;
  h.tag = static_cast<std::uint64_t>(code);
  // The reason travels whole or not at all (the receiver's limit, docs/PROTOCOL.md).
  const std::string_view said = why.size() <= wire::max_revoke_payload ? std::string_view(why) : std::string_view();
  for (int m : members) {
    if (m == rank_) continue;
    if (Peer* p = owner_.peer_locked(m); p && p->up())
      p->send_frame(wire::Lane::control, h, std::as_bytes(std::span(said)));
  }
}

void Failures::on_revoke_notice(int from, std::uint64_t comm, Errc code, const std::string& why) {
  if (revoked_.count(comm)) return;
  // Remembered even for a communicator not made here yet (a split still under way): it is
  // revoked as soon as it is.
  revoke_local(comm, code, -1, why.empty() ? "communicator revoked by rank " + std::to_string(from) : why);
}

// ---- communicators ---------------------------------------------------------------------------

void Failures::watch(std::uint64_t id, std::vector<int> members, int rank, CommListener on_event) {
  int dead = -1;
  {
    std::lock_guard lk(mu_);
    for (int m : members)
      if (failed_[static_cast<std::size_t>(m)]) dead = m;
    comms_[id] = Watch{std::move(members), rank, std::move(on_event)};
  }
  if (auto it = revoked_.find(id); it != revoked_.end()) {
    // Revoked before it existed here: apply it now.
    Revoked r = it->second;
    revoked_.erase(it);
    revoke_local(id, r.code, r.failed_world, r.why);
  } else if (dead >= 0) {
    revoke_local(id, Errc::rank_failed, dead, "it had failed before this communicator was made");
  }
}

void Failures::unwatch(std::uint64_t id) {
  std::lock_guard lk(mu_);
  comms_.erase(id);
}

}  // namespace nexar::detail
