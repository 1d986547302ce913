#include "transport/node.hpp"

#include "transport/shm_hub.hpp"
#include "transport/tcp_hub.hpp"

#include <asio/steady_timer.hpp>

#include <algorithm>
#include <cstring>
#include <future>
#include <unistd.h>

#include "core/access.hpp"
#include "core/call_check.hpp"
#include "core/log.hpp"

namespace nexar::detail {

using wire::FrameHeader;
using wire::FrameType;
using wire::Lane;

namespace {
quic::ConnectionSettings settings_from(const Config& cfg) {
  quic::ConnectionSettings s;
  s.alpn = {wire::mesh_alpn, wire::extra_alpn};
  // 0: each connection sizes its datagrams by its route's MTU (quic::Endpoint::defaults).
  s.udp_payload = cfg.udp_payload;
  s.stream_window = cfg.stream_window;
  s.conn_window = cfg.stream_window * (wire::lane_count + 1);
  // QUIC's idle timeout is only a backstop: failure detection (failure_timeout) decides.
  s.idle_timeout_ns = static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                     std::max(cfg.idle_timeout, 2 * cfg.failure_timeout))
                                                     .count());
  s.handshake_timeout_ns = static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(cfg.connect_timeout).count());
  s.impair = detail::ImpairSpec::parse(cfg.tuning.impair);
  s.congestion = cfg.congestion;
  // Lazy connections are dialled after formation, to ranks known to be running: one that
  // does not answer within the failure timeout is a failed rank, not a slow start.
  if (cfg.lazy_connect) s.handshake_timeout_ns = std::min(s.handshake_timeout_ns, static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(cfg.failure_timeout).count()));
  return s;
}

// A shard carries extra connections only: it dials them, and accepts nothing else.
quic::ConnectionSettings shard_settings(const Config& cfg) {
  quic::ConnectionSettings s = settings_from(cfg);
  s.alpn = {wire::extra_alpn};
  return s;
}
}  // namespace

namespace {
// How long a closing node waits for its peers to acknowledge its goodbye (a peer that went
// silent without being declared failed must not hold the close up for long).
constexpr auto kGoodbyeWait = std::chrono::seconds(1);

// Handles a connection a peer opened until its certificate says who it is, then hands it
// to that rank's Peer.
class AcceptRouter final : public quic::ConnectionHandler {
 public:
  explicit AcceptRouter(Node& n) : n_(n) {}
  std::string on_peer_identity(quic::Connection& conn, const std::string& node) override {
    const int r = n_.rank_of_node(node);
    if (std::string why = n_.refusal_of(node, r); !why.empty()) return why;
    // The higher rank of a pair that is up dials the pair's extra connections
    // (Config::connections_per_peer), and says so in its handshake: a first connection's
    // dial that reaches a pair already up (a lazy dial its dialler gave up for ours, see
    // below) is refused as a duplicate, never taken for an extra one.
    if (conn.alpn() == wire::extra_alpn) {
      if (r > n_.rank() && n_.peer(r)->up()) return n_.peer(r)->accept_stripe(conn);
      return "rank " + std::to_string(n_.rank()) + " takes extra connections only from a higher rank it is connected to";
    }
    if (n_.config().lazy_connect) {
      // Either rank of a pair dials on first use. When both dial at once, the lower rank's
      // connection is kept: the lower one refuses the higher's dial (which then waits for
      // ours), and the higher one gives its own dial up for the lower's.
      Peer* p = n_.peer(r);
      if (p->dialling()) {
        if (n_.rank() < r) return std::string(Peer::simultaneous_open) + ": rank " + std::to_string(n_.rank()) +
                                  " is dialling rank " + std::to_string(r) + " itself";
        p->abandon_dial();
      }
    } else if (r > n_.rank()) {
      // Lower ranks dial higher ones; a higher rank dialling us breaks that rule.
      return "node '" + node + "' has a higher rank: it is dialled, not accepted";
    }
    if (!n_.routing().direct(r)) {
      return "node '" + node + "' (rank " + std::to_string(r) + ") is no neighbour of rank " +
             std::to_string(n_.rank()) + " under topology " + n_.config().topology.to_string();
    }
    Peer* p = n_.peer(r);
    std::string why = p->on_peer_identity(conn, node);
    if (why.empty()) p->attach(conn);
    return why;
  }
  void on_established(quic::Connection&) override {}
  void on_stream_data(quic::Connection&, std::int64_t, const std::uint8_t*, std::size_t) override {}
  void on_closed(quic::Connection&, Errc, const std::string&) override {}

 private:
  Node& n_;
};
}  // namespace

thread_local Node* Node::t_scope_ = nullptr;
thread_local bool Node::t_scope_asleep_ = false;

Node::Node(NodeOptions opts, const Config& cfg)
    : cfg_(cfg),
      rank_(opts.rank),
      world_(opts.world),
      elastic_(opts.elastic),
      late_(opts.late),
      names_(std::move(opts.names)),
      addrs_(std::move(opts.addrs)),
      tls_(std::make_unique<tls::TlsContext>(opts.creds)),
      engine_(cfg.spin, cfg.yield_when_idle),
      routing_(*this, opts.rank, opts.world, opts.elastic, cfg_, std::move(opts.relay_keys), pool_, engine_),
      failures_(*this, opts.rank, opts.world, cfg_, engine_, matching_, routing_),
      joiners_(*this, opts.rank, opts.world, opts.late, opts.joiners, engine_, failures_),
      udp_fd_(opts.udp_fd) {
  router_ = std::make_unique<AcceptRouter>(*this);
  const int world = opts.world;
  // Elastic: user threads read these while the engine appends to them (add_peer); with
  // the room reserved up front, appending never moves what they read.
  if (elastic_) {
    names_.reserve(wire::max_node_ids);
    addrs_.reserve(wire::max_node_ids);
    peers_.reserve(wire::max_node_ids);
  }
  peers_.resize(static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r)
    if (r != rank_) peers_[static_cast<std::size_t>(r)] = make_peer(r);
  // Under a sparse topology, peers that are not neighbours are reached through relays.
  for (int r = 0; r < world; ++r)
    if (r != rank_ && !routing_.direct(r)) routing_.relay_to(*peers_[static_cast<std::size_t>(r)]);
  host_id_ = 14695981039346656037ull;
  for (unsigned char ch : shm::host_key()) host_id_ = (host_id_ ^ ch) * 1099511628211ull;
  if (cfg_.shm) {
    try {
      shm_ = std::make_unique<ShmHub>(*this);
    } catch (const Error& e) {
      log::info("rank {}: no shared-memory path: {}", rank_, e.what());
    }
  }
}

Node::~Node() { close(); }

std::unique_ptr<Peer> Node::make_peer(int r) {
  const auto i = static_cast<std::size_t>(r);
  return std::make_unique<Peer>(static_cast<PeerOwner&>(*this), peer_context(), r, names_[i], addrs_[i]);
}

int Node::rank_of_node(const std::string& node) const {
  for (std::size_t r = 0; r < names_.size(); ++r)
    if (names_[r] == node) return static_cast<int>(r);
  return -1;
}

void Node::start() {
  ep_ = std::make_unique<quic::Endpoint>(engine_, udp_fd_, *tls_, settings_from(cfg_),
                                          cfg_.udp_gso);
  udp_fd_ = -1;
  // Shards host only extra connections: without those they would have nothing to do.
  if (cfg_.connections_per_peer > 1) {
    for (std::uint32_t i = 1; i < cfg_.engine_threads; ++i) {
      shards_.push_back(std::make_unique<Shard>(engine_, cfg_, *tls_, shard_settings(cfg_), ep_->local()));
      shards_.back()->start([this](Hosted& h, const std::string& node) { adopt_stripe(h, node); });
    }
  }
  engine_.set_spin_hook([this] {
    ep_->service_timers();
    poll_shm();
  });
  if (shm_) {
    engine_.set_watch_hooks([this] { presence_.watched(); }, [this] { stop_watching(); });
    engine_.watch_extra(shm_->doorbell().fd(), [this] {
      shm_->doorbell().drain();
      poll_shm();
    });
  }
  engine_.start();
  // Lower ranks dial higher ones, so a pair's first connection is opened once; the extra
  // connections between hosts (Config::connections_per_peer) follow it (stripes.hpp).
  std::promise<void> started;
  engine_.post([this, &started] {
    ep_->start([this](quic::Connection&) -> quic::ConnectionHandler* { return router_.get(); });
    if (!cfg_.lazy_connect) {
      for (int r = rank_ + 1; r < size(); ++r)
        if (routing_.direct(r)) dial(r);
    }
    // A joiner of a running job awaits nobody (the members dial it as they learn of it),
    // and lazy connections are made on first use: failures are judged from now on.
    if (late_ || cfg_.lazy_connect) failures_.start_liveness();
    started.set_value();
  });
  started.get_future().wait();
  if (late_) {
    log::info("rank {}: joined a running job on {}, waiting for admission", rank_, ep_->local().to_string());
    return;
  }
  if (cfg_.lazy_connect) {
    log::info("rank {}: {} peers, connected on first use, on {}", rank_, size() - 1, ep_->local().to_string());
    return;
  }

  // Wait until every peer is up and has greeted us.
  auto deadline = std::chrono::steady_clock::now() + cfg_.connect_timeout;
  const int world = size();
  for (;;) {
    std::promise<std::pair<int, std::string>> probe;
    engine_.post([this, &probe, world] {
      for (int r = 0; r < world; ++r) {
        if (r == rank_) continue;
        Peer* p = peer(r);
        if (p->relayed()) continue;  // up through its neighbours'
        if (p->gone()) {
          probe.set_value({r, p->gone_why()});
          return;
        }
        if (!p->up() || !p->hello_seen()) {
          probe.set_value({r, {}});
          return;
        }
      }
      // Every peer is up: failures are judged from here on. Started in this same step, not
      // posted for later, so a peer that misbehaves the moment start() returns is already
      // declared failed (posted work can run after packets a user thread processes inline).
      failures_.start_liveness();
      probe.set_value({-1, {}});
    });
    auto [missing, why] = probe.get_future().get();
    if (missing < 0) break;
    // close() destroys the peers: copy what the error needs first.
    std::string addr = peer(missing)->addr_text();
    ErrorContext ctx{"connect", rank_, missing, addr, {}};
    if (!why.empty()) {
      Errc code = peer(missing)->gone_code();
      close();
      throw make_error(code, ctx, why);
    }
    if (std::chrono::steady_clock::now() > deadline) {
      close();
      throw make_error(Errc::timeout, ctx,
                       "peer not connected within " + std::to_string(cfg_.connect_timeout.count()) + " ms");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  log::info("rank {}: connected to {} neighbours of {} peers ({}) on {}", rank_, routing_.direct_peers().size(), world - 1,
            cfg_.topology.to_string(), ep_->local().to_string());
  if (shm_) wait_shm_settled();
}

void Node::wait_shm_settled() {
  // Peers on this host move to shared memory within milliseconds of connecting; waiting for
  // that here makes the first operations as fast as the later ones. Bounded: a pair whose
  // attach is slow keeps QUIC meanwhile and switches later, in order.
  const auto deadline = std::chrono::steady_clock::now() + kShmSettleLimit;
  for (;;) {
    int unsettled = 0;
    {
      std::lock_guard lk(engine_.lock());
      for (int r = 0; r < size(); ++r) {
        Peer* p = r == rank_ ? nullptr : peer(r);
        if (p && !p->relayed() && !p->gone() && !p->shm_settled()) ++unsettled;
      }
    }
    if (unsettled == 0) return;
    if (std::chrono::steady_clock::now() > deadline) {
      log::info("rank {}: {} peers still settling shared memory after {} ms; going on", rank_, unsettled,
                kShmSettleLimit.count());
      return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

void Node::dial(int r) {
  Peer* p = peer(r);
  if (!p || p->connection()) return;
  quic::Connection& c = ep_->connect(addrs_[static_cast<std::size_t>(r)], p->name(), p);
  p->attach(c);
}

void Node::connect_lazily(int r) {
  // Closing still dials, until the endpoint shuts down: a send the caller made before
  // close() may reach the engine after close() began (posted while a thread held the
  // lock), and close() delivers what was sent before the goodbye.
  if (!cfg_.lazy_connect || !ep_ || ep_->stopped()) return;
  Peer* p = peer_locked(r);
  if (!p || p->gone() || p->relayed() || p->connection() || failures_.is_failed(r)) return;
  dial(r);
}

void Node::redial_later(int r, int attempt) {
  // The peer's own dial normally lands within a round trip; a few milliseconds more each
  // time it did not, so a lost handshake costs little and a slow peer is not hammered.
  auto t = std::make_shared<asio::steady_timer>(engine_.io(), std::chrono::milliseconds(std::min(5 * attempt, 200)));
  t->async_wait(engine_.guard([this, t, r](asio::error_code ec) {
    if (!ec) connect_lazily(r);
  }));
}

void Node::on_peer_up(Peer& p) {
  // The higher rank dials the pair's extra connections, to the shards named here; before
  // the offer, which is what sets it dialling.
  if (!shards_.empty() && p.rank() > rank_) {
    std::vector<std::byte> ports;
    for (const auto& sh : shards_) {
      ports.push_back(static_cast<std::byte>(sh->port() >> 8));
      ports.push_back(static_cast<std::byte>(sh->port() & 0xff));
    }
    FrameHeader h;
    h.type = FrameType::ports;
    h.src = static_cast<std::uint32_t>(rank_);
    p.send_frame(Lane::control, h, ports);
  }
  offer_shm(p);
  if (!cfg_.lazy_connect) return;
  // A failure flood reaches only the ranks connected at the time: a rank connected later
  // hears of what it missed now, so it never waits on a member the others know is dead.
  failures_.tell_failed(p);
}

std::vector<int> Node::connected_peers() {
  std::vector<int> out;
  std::lock_guard lk(engine_.lock());
  for (int r = 0; r < size(); ++r) {
    if (r == rank_) continue;
    const Peer* p = peer_locked(r);
    if (p && p->up() && !p->relayed()) out.push_back(r);
  }
  return out;
}

PeerStats Node::peer_stats(int r) {
  std::lock_guard lk(engine_.lock());
  const Peer* p = r != rank_ ? peer_locked(r) : nullptr;
  PeerStats s = p ? p->stats() : PeerStats{};
  s.world_rank = r;
  return s;
}

std::pair<std::uint64_t, std::uint64_t> Node::socket_drops() {
  std::lock_guard lk(engine_.lock());
  return ep_ ? std::pair{ep_->receive_drops(), ep_->send_drops()} : std::pair<std::uint64_t, std::uint64_t>{};
}

// ---- shutdown ----------------------------------------------------------------------------

void Node::drain_then_shutdown(std::chrono::steady_clock::time_point until,
                                   const std::shared_ptr<OpState>& done, bool said_goodbye) {
  if (membership_) membership_->on_close();
  std::uint64_t pending = 0;
  for (auto& p : peers_)
    if (p && routing_.routable(p->rank())) pending += p->unacked();
  const auto now = std::chrono::steady_clock::now();
  if (!said_goodbye && (pending == 0 || now >= until)) {
    // Every byte we promised is acknowledged (or we gave up on it): say goodbye, and linger
    // until each peer still up acknowledged that too, briefly. Meanwhile our own delayed
    // ACKs of what the peers sent us go out (an ACK waits a fraction of a round trip), so a
    // peer whose last send we received sees it complete, instead of failing when our
    // connection close overtakes the acknowledgement.
    for (auto& p : peers_)
      if (p && routing_.routable(p->rank())) p->say_goodbye();
    said_goodbye = true;
    until = std::min(until, now + kGoodbyeWait);
    pending = 1;  // check again once the goodbyes are out
  }
  if (pending > 0 && now < until) {
    // Bytes we promised (completed eager sends), or our goodbyes, are still
    // unacknowledged: linger.
    auto t = std::make_shared<asio::steady_timer>(engine_.io(), std::chrono::milliseconds(1));
    t->async_wait(engine_.guard([this, t, until, done, said_goodbye](asio::error_code) {
      drain_then_shutdown(until, done, said_goodbye);
    }));
    return;
  }
  failures_.stop_liveness();
  ep_->shutdown("communicator closed");
  // Receives that only a peer could have satisfied failed with it; fail the rest.
  for (auto& q : matching_.queues()) {
    for (auto& r : q.posted()) fail(r->op, Errc::closed, -1, "communicator closed");
    q.posted().clear();
    q.unexpected().clear();
  }
  done->succeed();
}

void Node::close() {
  if (closed_.exchange(true)) return;
  std::vector<std::function<void()>> closers;
  {
    std::lock_guard lk(closers_mu_);
    closers.swap(closers_);
  }
  joiners_.closing();
  for (auto& fn : closers) fn();
  // Handlers stop and waiting calls fail with Errc::closed before the connections go.
  if (rpc_) rpc_->on_close();
  if (ep_) {
    auto done = std::make_shared<OpState>("close", std::chrono::steady_clock::time_point::max());
    auto until = std::chrono::steady_clock::now() + std::min<std::chrono::milliseconds>(
                                                         cfg_.op_timeout, std::chrono::seconds(5));
    engine_.post([this, until, done] { drain_then_shutdown(until, done); });
    done->wait_until(std::chrono::steady_clock::now() + std::chrono::seconds(10), {});
  }
  // Everything promised was drained above, the shards' bytes included (Peer::unacked):
  // their connections close now, and their threads stop before the node's, so the closes
  // they post still run.
  for (auto& sh : shards_) sh->stop("communicator closed");
  engine_.stop();
  // A user thread may still be polling (it found the engine open a moment ago).
  std::lock_guard lk(engine_.lock());
  ep_.reset();
  shards_.clear();
  peers_.clear();
  // Its threads post to the engine, which runs nothing any more.
  shm_.reset();
  tcp_.reset();
  if (udp_fd_ >= 0) {
    ::close(udp_fd_);
    udp_fd_ = -1;
  }
}

void Node::on_close(std::function<void()> fn) {
  {
    std::lock_guard lk(closers_mu_);
    if (!closed_.load(std::memory_order_acquire)) {
      closers_.push_back(std::move(fn));
      return;
    }
  }
  fn();
}

// ---- errors ------------------------------------------------------------------------------

std::string Node::format(Errc code, const OpState& op, int peer_rank, std::string_view why) const {
  std::string addr;
  if (peer_rank >= 0 && peer_rank < size() && peer_rank != rank_)
    addr = addrs_[static_cast<std::size_t>(peer_rank)].to_string();
  ErrorContext ctx{op.op(), rank_, peer_rank, addr, op.start()};
  return format_error(code, ctx, why);
}

void Node::fail(const std::shared_ptr<OpState>& op, Errc code, int peer_rank, std::string_view why) {
  if (!op || op->done()) return;
  op->complete(code, format(code, *op, peer_rank, why));
}

bool Node::peer_left(int r) {
  if (r < 0 || r >= size() || r == rank_) return false;
  Peer* p = peer(r);
  return p && p->gone() && !failures_.is_failed(r);
}

void Node::on_peer_closed(Peer& p) {
  // A joiner that went away before a grow took it in waits no more, so grows stop waiting
  // for it to get ready.
  joiners_.left(p.rank());
  // Receives naming this peer can never complete now. Any-source receives stay posted.
  for (auto& q : matching_.queues()) {
    auto& posted = q.posted();
    for (auto it = posted.begin(); it != posted.end();) {
      if ((*it)->source == p.rank()) {
        fail((*it)->op, p.gone_code(), p.rank(), p.gone_why());
        it = posted.erase(it);
      } else {
        ++it;
      }
    }
  }
  if (rpc_) rpc_->on_peer_gone(p.rank(), p.gone_code(), p.gone_why());
  {
    std::lock_guard lk(mailbox_mu_);
    departed_.emplace(p.rank(), std::make_pair(p.gone_code(), p.gone_why()));
  }
  // Routes avoid it from now on (a failed relay's bytes are sent again around it).
  routing_.route_around(p.rank(), p.gone_code() == Errc::rank_failed);
  // A peer that went away in an orderly way is no failure, but an agreement waiting for it
  // would wait until op_timeout: the membership module decides (last: it may declare it).
  if (membership_ && failures_.judging() && p.gone_code() != Errc::rank_failed && !failures_.is_failed(p.rank()))
    membership_->on_rank_left(p.rank(), p.gone_why());
}

// ---- validation ----------------------------------------------------------------------------

void Node::check_open(const char* op, int peer_rank) const {
  if (!is_open()) {
    ErrorContext ctx{op, rank_, peer_rank, {}, {}};
    throw make_error(Errc::closed, ctx, "communicator is closed");
  }
}

std::shared_ptr<OpState> Node::new_op(const char* op, std::chrono::milliseconds timeout) {
  const auto now = std::chrono::steady_clock::now();
  auto s = std::make_shared<OpState>(op, now + timeout, now);
  s->spin = cfg_.spin;
  s->yield_when_idle = cfg_.yield_when_idle;
  s->progress = weak_from_this();
  s->stamp_end = !cfg_.trace.empty();  // the trace draws its span (comm/tracer.hpp)
  return s;
}

bool Node::poll(bool) {
  if (engine_.engine_waiting()) return false;
  std::unique_lock lk(engine_.lock(), std::try_to_lock);
  if (!lk.owns_lock() || !ep_ || !is_open()) return false;
  // With peers on shared memory the socket mostly carries heartbeats, and reading it (a
  // system call that finds nothing) would be most of what a small collective costs: read
  // it on every fourth poll while messages come over QUIC (RPC replies, peers on other
  // hosts: Engine::socket_busy), else on every 32nd (8 B all_reduce between 2 processes,
  // two sets of 5 runs alternating: medians 3.10 -> 2.71 and 4.39 -> 4.20 us, lower in
  // every pair), and on every poll while its last read found packets.
  if (socket_busy_ || shm_peers_.empty() ||
      (++socket_skips_ % 4 == 0 && (socket_skips_ % 32 == 0 || engine_.socket_busy())))
    socket_busy_ = ep_->poll();
  poll_shm();
  if (tcp_) tcp_->poll();
  return true;
}

void Node::stop_watching() {
  // Work that came while this thread polled and was not read yet goes to the engine
  // thread. (Reading it here instead made each operation's end pay for whatever was
  // there: beside a bulk transfer, a bulk turn's copy per barrier.)
  if (presence_.unwatched()) presence_.ring();
}

void Node::offer_shm(Peer& p) {
  if (shm_) {
    shm_->offer(p);
  } else if (p.rank() > rank_) {
    ShmHub::say_no(*this, p);  // so the peer does not wait for an offer
  }
}

void Node::on_shm_offer(Peer& p, std::string_view payload) {
  if (p.rank() > rank_) {
    // From the higher rank, only an empty one: it declines ours.
    if (payload.empty() && shm_ && p.shm_expected() && !p.has_shm()) shm_->declined(p);
    return;
  }
  if (shm_) {
    shm_->on_offer(p, payload);
  } else {
    if (!payload.empty()) ShmHub::say_no(*this, p);
    p.settle_shm();
  }
  // Answered without shared memory: the pair's extra connections, if it wants any, go now.
  if (cfg_.connections_per_peer > 1 && p.shm_settled() && !p.shm_expected() && !p.has_shm()) {
    // Extra connection i lives on engine thread i mod n at each end (0: the node's own), so
    // with equal settings both ends spread a pair's collective traffic alike.
    p.dial_stripes([this, &p](int slot, quic::ConnectionHandler* h) -> Stripes::Placed {
      quic::Address to = addrs_[static_cast<std::size_t>(p.rank())];
      const auto& ports = p.shard_ports();
      if (const auto j = static_cast<std::size_t>(slot) % (ports.size() + 1); j > 0) to.set_port(ports[j - 1]);
      if (const auto k = static_cast<std::size_t>(slot) % (shards_.size() + 1); k > 0)
        return {nullptr, shards_[k - 1]->dial(to, p.name())};
      return {&ep_->connect(to, p.name(), h, wire::extra_alpn), nullptr};
    });
  }
  // The same answer opens the TCP link, if this rank wants one (the peer says whether it
  // does when the offer reaches it).
  if (cfg_.link == LinkKind::tcp && p.shm_settled() && !p.shm_expected() && !p.has_shm()) {
    if (!tcp_) tcp_ = std::make_unique<TcpHub>(*this);
    tcp_->offer(p);
  }
}

void Node::on_tcp_offer(Peer& p, std::uint16_t port, std::uint64_t cipher) {
  if (port == 0 && !tcp_) return;  // declines an offer we never made
  if (!tcp_) tcp_ = std::make_unique<TcpHub>(*this);
  tcp_->on_offer(p, port, cipher);
}

std::string Node::refusal_of(const std::string& node, int r) {
  if (r < 0 || r == rank_) return "node '" + node + "' is not a member of this world";
  // Failed, or departed: it stays so (a lazy dial from it after we gave up on it, say).
  if (Peer* p = peer(r); p->gone())
    return "node '" + node + "' (rank " + std::to_string(r) + ") is failed or gone here: " + p->gone_why();
  return {};
}

void Node::adopt_stripe(Hosted& h, const std::string& node) {
  const int r = rank_of_node(node);
  std::string why = refusal_of(node, r);
  if (why.empty()) {
    // A shard takes only what the first connection's rules make an extra connection.
    why = r < rank_ || !peer(r)->up()
              ? "rank " + std::to_string(rank_) + " takes only extra connections from a higher rank it is connected to on this port"
              : peer(r)->accept_stripe(h);
  }
  if (why.empty()) return;
  log::debug("rank {}: refused a connection on a shard: {}", rank_, why);
  h.close(quic::close_error, why);
}

void Node::on_shm_attached(int rank, const ShmLink& link) {
  shm_peers_.push_back(rank);
  std::lock_guard lk(mailbox_mu_);
  if (mailboxes_.size() <= static_cast<std::size_t>(rank)) mailboxes_.resize(static_cast<std::size_t>(rank) + 1);
  const int out = link.creator() ? 0 : 1;
  mailboxes_[static_cast<std::size_t>(rank)] = {link.segment(), &link.segment()->mailbox(out), &link.segment()->mailbox(1 - out)};
}

std::optional<std::pair<Errc, std::string>> Node::departure(int r) const {
  std::lock_guard lk(mailbox_mu_);
  auto it = departed_.find(r);
  if (it == departed_.end()) return std::nullopt;
  return it->second;
}

Node::Mailboxes Node::mailboxes(int r) const {
  std::lock_guard lk(mailbox_mu_);
  return r >= 0 && static_cast<std::size_t>(r) < mailboxes_.size() ? mailboxes_[static_cast<std::size_t>(r)] : Mailboxes{};
}

bool Node::poll_shm() {
  bool moved = false;
  // By index: a peer's poll can run code that attaches another peer.
  for (std::size_t i = 0; i < shm_peers_.size(); ++i) {
    if (Peer* p = peer_locked(shm_peers_[i])) moved |= p->poll_shm();
  }
  return moved;
}

// ---- point-to-point --------------------------------------------------------------------

Request Node::isend(const P2p& a, int dest, std::span<const ConstBuffer> parts) {
  const char* op = a.op;
  const Domain d = a.domain;
  const Tag tag = a.tag;
  check_open(op, dest);
  std::uint64_t size = 0;
  for (auto& p : parts) {
    if (p.bytes && !p.data) {
      ErrorContext ctx{op, rank_, dest, {}, {}};
      throw make_error(Errc::invalid_argument, ctx, "null buffer with " + std::to_string(p.bytes) + " bytes");
    }
    size += p.bytes;
  }
  if (size > cfg_.max_frame_bytes) {
    ErrorContext ctx{op, rank_, dest, {}, {}};
    throw make_error(Errc::invalid_argument, ctx,
                     "message of " + std::to_string(size) + " bytes exceeds max_frame_bytes " +
                         std::to_string(cfg_.max_frame_bytes));
  }
  if (std::string why = routing_.beyond_hop_limit(dest); !why.empty()) {
    ErrorContext ctx{op, rank_, dest, {}, {}};
    throw make_error(Errc::invalid_argument, ctx, why);
  }
  auto st = new_op(op, a.timeout);
  Peer* p = peer(dest);
  if (p->gone()) {
    fail(st, p->gone_code(), dest, p->gone_why());
    return Access::make_request(st);
  }
  const Lane lane = lane_of(d);
  if (size <= cfg_.eager_limit) {
    // Small: copy once into a pooled buffer behind the header; the caller's buffer is free
    // as soon as we return.
    PooledBuffer b = pool_.acquire(wire::header_size + size);
    FrameHeader h;
    h.type = FrameType::eager;
    h.src = static_cast<std::uint32_t>(rank_);
    h.comm = a.comm;
    h.tag = static_cast<std::uint64_t>(tag);
    h.check = a.check;
    h.length = size;
    wire::encode_header(h, std::span<std::byte, wire::header_size>(b.data(), wire::header_size));
    std::byte* out = b.data() + wire::header_size;
    for (auto& part : parts) {
      if (part.bytes) std::memcpy(out, part.data, part.bytes);
      out += part.bytes;
    }
    std::size_t len = wire::header_size + size;
    submit([this, dest, lane, tag, b = std::move(b), len]() mutable {
      Peer* q = peer(dest);
      q->send_frame(lane, std::move(b), len, {}, &q->route(lane, tag, len - wire::header_size));
    });
    RecvOp shape;  // only for mapping the destination into the caller's communicator
    shape.local_of = a.local_of;
    st->succeed(shape.status(dest, tag, static_cast<std::size_t>(size)));
    return Access::make_request(st);
  }
  // Empty parts carry nothing; the last queued part is the one whose acknowledgement
  // completes the send, so it must hold bytes.
  std::vector<ConstBuffer> copy;
  for (auto& part : parts)
    if (part.bytes) copy.push_back(part);
  if (size <= a.eager_in_place) {
    // A collective's segment: its receiver posts the matching receive by construction, so
    // the rendezvous round trip (which waits behind a full link queue for the cts) only
    // costs time. Sent from the caller's memory, so it cannot simply be withdrawn: a
    // cancelled send still completes when acknowledged, and one still unacknowledged at its
    // deadline (the receiver stopped taking data) gives up on the peer, which drops the
    // queued bytes, rather than wait forever.
    install_canceller(st, dest, "receiver did not take the data in time; connection dropped", "",
                      [dest](Node& c, OpState*, Errc why) {
                        if (why != Errc::timeout) return false;
                        c.peer(dest)->abort("a collective send was not acknowledged before its deadline");
                        return true;
                      });
    submit([this, dest, d, comm = a.comm, tag, check = a.check, copy = std::move(copy), size, st]() mutable {
      peer(dest)->send_eager_in_place(d, comm, tag, check, std::move(copy), size, st);
    });
    return Access::make_request(st);
  }
  install_canceller(st, dest, "receiver did not post a matching receive in time", "send cancelled",
                    [dest](Node& c, OpState* s) { return c.peer(dest)->cancel_rendezvous(s); });
  submit([this, dest, d, comm = a.comm, tag, check = a.check, copy = std::move(copy), size, st]() mutable {
    peer(dest)->start_rendezvous(d, comm, tag, check, std::move(copy), size, st);
  });
  return Access::make_request(st);
}

void Node::collective_started(std::uint64_t comm, Tag tag, std::uint16_t check) {
  if (std::string why = matching_.calls().started(comm, collective_number(tag), check); !why.empty())
    revoke_comm(comm, std::move(why));
}

void Node::collective_ended(std::uint64_t comm, Tag tag, bool ok) {
  if (std::string why = matching_.calls().ended(comm, collective_number(tag), ok); !why.empty()) revoke_comm(comm, std::move(why));
}

bool Node::receiving(Domain d, const OpState* op) const {
  if (queue(d).awaits_arrival(op)) return true;
  for (const auto& p : peers_)
    if (p && p->receiving(op)) return true;
  return false;
}

Request Node::irecv(const P2p& a, int source, void* data, std::size_t cap) {
  const char* op = a.op;
  const Domain d = a.domain;
  check_open(op, source);
  if (cap && !data) {
    ErrorContext ctx{op, rank_, source, {}, {}};
    throw make_error(Errc::invalid_argument, ctx, "null buffer with capacity " + std::to_string(cap));
  }
  auto st = new_op(op, a.timeout);
  auto r = std::make_shared<RecvOp>();
  r->op = st;
  r->comm = a.comm;
  r->source = source;
  r->tag = a.tag;
  r->local_of = a.local_of;
  r->exact = a.exact;
  r->check = a.check;
  r->buf = static_cast<std::byte*>(data);
  r->cap = cap;
  install_canceller(st, source, "no matching message arrived in time", "receive cancelled",
                    [d](Node& c, OpState* s, Errc code) {
                      // A receive matched with a message still arriving has no posted entry
                      // to withdraw. Cancelling it has no effect (it is matched), but its
                      // deadline still holds: it fails, and the rest of that message is
                      // dropped as it comes (the waiter is done: nothing lands in its buffer).
                      return c.queue(d).remove_posted(s) || (code == Errc::timeout && c.receiving(d, s));
                    });
  submit([this, d, r] {
    if (failures_.fail_if_revoked(r->comm, r->op)) return;
    if (r->source != any_source) {
      Peer* p = peer(r->source);
      auto& q = queue(d);
      auto it = q.find_unexpected(*r);
      if (it != q.end()) {
        matching_.deliver_unexpected(d, r, it);
        return;
      }
      if (p->gone()) {
        fail(r->op, p->gone_code(), r->source, p->gone_why());
        return;
      }
      q.post(r);
      // Lazy connections: waiting on a rank connects to it, so its death is noticed.
      connect_lazily(r->source);
      return;
    }
    auto& q = queue(d);
    auto it = q.find_unexpected(*r);
    if (it != q.end()) {
      matching_.deliver_unexpected(d, r, it);
      return;
    }
    if (!is_open()) {
      fail(r->op, Errc::closed, -1, "communicator closed");
      return;
    }
    q.post(r);
  });
  return Access::make_request(st);
}

// ---- elastic membership ------------------------------------------------------------------

void Node::add_peer(int id, std::string name, quic::Address addr, bool joiner, RelayKey key) {
  engine_.post([this, id, name = std::move(name), addr, joiner, key]() mutable {
    if (!elastic_ || !is_open() || !ep_) return;
    const int n = size();
    if (id < n) return;  // known already (the list we joined with named it)
    if (id != n || id >= static_cast<int>(wire::max_node_ids)) {
      // Announcements come in order on one stream: a gap means a broken service.
      log::warn("rank {}: membership service announced world rank {}, expected {}: ignored", rank_, id, n);
      return;
    }
    if (rank_of_node(name) >= 0) {
      log::warn("rank {}: membership service announced '{}' again as world rank {}: ignored", rank_, name, id);
      return;
    }
    names_.push_back(std::move(name));
    addrs_.push_back(addr);
    routing_.add_rank(id, key);
    failures_.add_rank();
    if (joiner) joiners_.add(id);
    peers_.push_back(make_peer(id));
    if (!routing_.direct(id)) {
      try {
        routing_.relay_to(*peers_.back());
      } catch (const Error& e) {
        log::warn("rank {}: world rank {}: {}", rank_, id, e.what());
      }
    }
    world_.store(n + 1, std::memory_order_release);
    routing_.grown(n + 1);
    log::info("rank {}: world rank {} ({}, {}) {}", rank_, id, names_.back(), addr.to_string(),
              joiner ? "waits to join" : "announced");
    if (id > rank_ && routing_.direct(id)) dial(id);
  });
}

Peer* Node::peer_locked(int r) noexcept {
  // close() empties the table (engine lock held) but leaves size() as it was.
  return r >= 0 && static_cast<std::size_t>(r) < peers_.size() ? peers_[static_cast<std::size_t>(r)].get() : nullptr;
}

void Node::send_welcome(int dest, std::uint64_t comm, std::uint64_t seq, std::vector<std::uint32_t> members) {
  submit([this, dest, comm, seq, members = std::move(members)] {
    Peer* p = dest < size() ? peer(dest) : nullptr;
    if (!p || !p->up() || failures_.is_failed(dest)) return;
    const std::vector<std::byte> payload = wire::encode_members(members);
    FrameHeader h;
    h.type = FrameType::welcome;
    h.src = static_cast<std::uint32_t>(rank_);
    h.comm = comm;
    h.seq = seq;
    p->send_frame(wire::Lane::control, h, payload);
  });
}

// ---- communicators and membership frames -------------------------------------------------

void Node::watch_comm(std::uint64_t id, std::vector<int> members, int rank, CommListener on_event) {
  // A joiner in a communicator made here was admitted, whichever grow admitted it.
  joiners_.admitted(members);
  matching_.calls().watch(id, members, rank);
  submit([this, id, members = std::move(members), rank, on_event = std::move(on_event)]() mutable {
    failures_.watch(id, std::move(members), rank, std::move(on_event));
  });
}

void Node::unwatch_comm(std::uint64_t id) {
  matching_.calls().forget(id);
  failures_.unwatch(id);
}

void Node::revoke_comm(std::uint64_t id, std::string why) {
  submit([this, id, why = std::move(why)] { failures_.revoke_everywhere(id, why); });
}

bool Node::send_ballot(int dest, FrameType type, std::uint64_t comm, std::uint64_t seq, const wire::Ballot& b) {
  Peer* p = peer(dest);
  if (!p || !p->up() || failures_.is_failed(dest)) return false;
  const std::vector<std::byte> payload = wire::encode_ballot(b);
  FrameHeader h;
  h.type = type;
  h.src = static_cast<std::uint32_t>(rank_);
  h.comm = comm;
  h.seq = seq;
  p->send_frame(wire::Lane::control, h, payload);
  return true;
}

void Node::on_ballot(int from, const FrameHeader& h, wire::Ballot b) {
  if (membership_) membership_->on_ballot(from, h, std::move(b));
}

// ---- RPC lanes ---------------------------------------------------------------------------

bool Node::send_rpc_frame(int dest, wire::Lane lane, const FrameHeader& h,
                              std::span<const std::byte> payload) {
  Peer* p = peer(dest);
  if (!p || p->gone()) return false;
  PooledBuffer b = encode_frame(pool_, h, payload);
  const std::size_t len = wire::header_size + payload.size();
  submit([this, dest, lane, b = std::move(b), len]() mutable {
    // A peer that went away meanwhile was reported to on_peer_gone: nothing to send.
    if (Peer* pp = peer(dest); !pp->gone()) pp->send_frame(lane, std::move(b), len);
  });
  return true;
}


}  // namespace nexar::detail
