// The seed: admits joiners over QUIC, signs their certificates, assigns ranks and hands out
// the peer list, with each node's relay keys (those of the pairs it is part of, derived from
// the job's master secret, which never leaves the seed). Everything below runs on the seed's
// own engine thread except the public entry points, which post to it and wait on `mu_`/`cv_`.
#include <nexar/cluster.hpp>

#include <asio/steady_timer.hpp>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <set>

#include "cluster/relay_keys.hpp"
#include "cluster/token.hpp"
#include "core/log.hpp"
#include "engine/engine.hpp"
#include "quic/endpoint.hpp"
#include "tls/ca.hpp"
#include "tls/node_key.hpp"
#include "tls/peer_check.hpp"
#include "tls/tls_context.hpp"
#include "wire/frame.hpp"
#include "wire/seed_message.hpp"

namespace nexar {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kSweep = std::chrono::milliseconds(50);
// A joiner that got its final answer closes the connection itself; one that does not is
// closed after this long.
constexpr auto kLinger = std::chrono::seconds(5);
// After the cluster formed, stop waiting for joiners to confirm after this long.
constexpr auto kDelivery = std::chrono::seconds(30);
// A client that completed the handshake must send its join request within this long, or
// it is closed: silent clients would otherwise fill the connection cap for good.
constexpr auto kRequestWait = std::chrono::seconds(10);
// Elastic: new connections accepted after formation, per second and in a burst. Formation
// itself is not limited (a large world arrives at once); a running job's door is, so a
// flood of handshakes cannot take the seed's (or its host rank's) core.
constexpr double kAdmitRate = 20.0;
constexpr double kAdmitBurst = 40.0;

std::string random_cluster_name() {
  return "cluster-" + cluster::random_token().substr(0, 16);
}

bool valid_node_name(const std::string& n) {
  if (n.empty() || n.size() > 200) return false;
  return std::all_of(n.begin(), n.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '-' || c == '_' || c == '.';
  });
}

std::string seconds_text(std::chrono::milliseconds d) {
  return std::to_string(static_cast<double>(d.count()) / 1000.0).substr(0, 6) + " s";
}

}  // namespace

struct Seed::Impl final : quic::ConnectionHandler {
  struct Joiner {
    quic::Connection* conn = nullptr;
    wire::SeedMessageReader reader{wire::max_join_request};
    std::int64_t out = -1;
    bool hello_sent = false;
    bool admitted = false;
    bool answered = false;
    bool member = false;  // got an accept
    bool linked = false;  // elastic: stays connected to hear of later joiners
    bool evicted = false;  // closing to make room
    Clock::time_point request_by{};  // close it unless it asked to join by then
    Clock::time_point close_by{};
    wire::JoinRequest req;
    std::string addr;  // where peers dial it
    std::string cert;
    std::uint64_t order = 0;
    int rank = -1;  // its world rank, once it got an accept
  };
  enum class State { waiting, delivering, done, failed, stopped };

  SeedOptions opts;
  Config cfg;
  std::string token;
  std::optional<tls::ClusterCa> ca;
  // Every pair's relay key is derived from it (cluster/relay_keys.hpp); it never leaves here.
  cluster::RelayMaster relay_master{};
  tls::NodeCredentials creds;
  std::string fp;
  std::unique_ptr<tls::TlsContext> tls;
  detail::Engine engine{std::chrono::microseconds(0)};
  std::unique_ptr<quic::Endpoint> ep;
  std::unique_ptr<asio::steady_timer> sweep;
  std::string bound;
  std::map<quic::Connection*, std::unique_ptr<Joiner>> joiners;
  std::uint64_t next_order = 0;
  // Elastic: every world rank handed out, in order (formation's, then each late joiner's),
  // and every node name ever signed, so none is ever given twice.
  std::vector<wire::Member> nodes;
  std::set<std::string> names_signed;
  double admit_tokens = kAdmitBurst;
  Clock::time_point admit_refill = Clock::now();
  // After formation: members whose delivery is not confirmed yet (node -> description), and
  // the members that lost theirs.
  std::map<std::string, std::string> undelivered;
  std::vector<std::string> lost;
  Clock::time_point started = Clock::now();
  Clock::time_point deadline{};
  Clock::time_point delivery_deadline{};

  std::mutex stop_mu;
  // Outcome, shared with user threads.
  std::mutex mu;
  std::condition_variable cv;
  State state = State::waiting;  // written on the engine thread under mu
  int formed_world = 0;
  Errc fail_code = Errc::ok;
  std::string fail_why;

  Impl(SeedOptions o, const Config& c) : opts(std::move(o)), cfg(c) {}

  // ---- set-up ---------------------------------------------------------------------------

  void start() {
    if (opts.world < 1)
      throw Error(Errc::invalid_argument, "seed: world size " + std::to_string(opts.world) + " must be >= 1");
    if (opts.min_world < 0 || opts.min_world > opts.world)
      throw Error(Errc::invalid_argument, "seed: minimum world size " + std::to_string(opts.min_world) +
                                              " must be in 0.." + std::to_string(opts.world));
    if (opts.formation_timeout.count() <= 0 || opts.formation_timeout > std::chrono::hours(24 * 365))
      throw Error(Errc::invalid_argument, "seed: formation timeout of " + std::to_string(opts.formation_timeout.count()) +
                                              " ms is outside 1 ms .. 365 days");
    cfg.validate();
    token = opts.token.empty() ? cluster::random_token() : opts.token;
    relay_master = cluster::random_relay_master();
    ca.emplace(tls::ClusterCa::create(opts.cluster.empty() ? random_cluster_name() : opts.cluster));
    creds = tls::issue_local(*ca, std::string(tls::seed_node));
    fp = tls::fingerprint(creds.cert_pem);
    tls = std::make_unique<tls::TlsContext>(creds, tls::TlsContext::Role::seed);

    const quic::Address at = quic::Address::resolve(opts.listen);
    const int fd = quic::UdpSocket::open_bound(at);
    quic::Address local;
    local.len = sizeof local.storage;
    ::getsockname(fd, local.sa(), &local.len);
    bound = local.to_string();

    quic::ConnectionSettings s;
    s.alpn = {wire::seed_alpn};
    s.udp_payload = cfg.udp_payload;
    s.stream_window = 1u << 20;
    s.conn_window = 4u << 20;
    s.idle_timeout_ns = static_cast<std::uint64_t>(std::chrono::nanoseconds(cfg.idle_timeout).count());
    s.handshake_timeout_ns = static_cast<std::uint64_t>(std::chrono::nanoseconds(cfg.connect_timeout).count());
    ep = std::make_unique<quic::Endpoint>(engine, fd, *tls, s, cfg.udp_gso);
    sweep = std::make_unique<asio::steady_timer>(engine.io());
    deadline = Clock::now() + opts.formation_timeout;
    engine.start();
    engine.post([this] {
      ep->start([this](quic::Connection&) -> quic::ConnectionHandler* {
        // Bound what unauthenticated clients can make us hold; at the cap the oldest client
        // that has not proved the token yet makes room, so idle clients cannot lock real
        // joiners out.
        const std::size_t cap = std::max<std::size_t>(static_cast<std::size_t>(opts.world), nodes.size()) * 4 + 64;
        // The rate limit first: a client it turns away must not cost a real joiner its place.
        if (!nodes.empty() && !take_admit_token()) return nullptr;
        if (ep->live_connections() >= cap && !evict_unproven()) return nullptr;
        return this;
      });
      arm_sweep();
    });
    log::info("seed: listening on {} for {} ranks (cluster {})", bound, opts.world, ca->cluster());
  }

  // ---- connection events (engine thread) --------------------------------------------------

  Joiner* joiner_of(quic::Connection& c) {
    auto it = joiners.find(&c);
    if (it != joiners.end()) return it->second.get();
    auto j = std::make_unique<Joiner>();
    j->conn = &c;
    j->request_by = Clock::now() + std::min<Clock::duration>(kRequestWait, cfg.connect_timeout);
    Joiner* p = j.get();
    joiners.emplace(&c, std::move(j));
    return p;
  }

  // Token bucket on connections accepted once the world formed (elastic).
  bool take_admit_token() {
    const auto now = Clock::now();
    admit_tokens = std::min(kAdmitBurst, admit_tokens + kAdmitRate * std::chrono::duration<double>(now - admit_refill).count());
    admit_refill = now;
    if (admit_tokens < 1.0) return false;
    admit_tokens -= 1.0;
    return true;
  }

  // Makes room by closing the longest-connected client that is not admitted: one that has
  // not sent its request yet, or one already refused that lingers.
  bool evict_unproven() {
    Joiner* oldest = nullptr;
    for (auto& [c, j] : joiners)
      if (!j->admitted && !j->evicted && !c->closed() && (!oldest || j->request_by < oldest->request_by))
        oldest = j.get();
    if (!oldest) return false;
    log::info("seed: at the connection cap, closing {} (not admitted)", oldest->conn->remote().to_string());
    oldest->evicted = true;
    close_later(*oldest->conn, Errc::protocol, "seed busy: not admitted");
    return true;
  }

  std::string on_peer_identity(quic::Connection&, const std::string&) override { return {}; }

  // Connection events arrive inside ngtcp2's packet processing, which must not be
  // re-entered: closes are posted, and nothing may throw out of a callback (an exception
  // would end the engine thread, and with it the seed).
  void close_later(quic::Connection& c, Errc code, const std::string& why) {
    quic::Connection* p = &c;
    engine.post([p, code, why] { p->close(static_cast<std::uint64_t>(code), why); });
  }

  void on_established(quic::Connection& c) override {
    Joiner* j = joiner_of(c);
    try {
      wire::SeedHello hello;
      hello.cluster = ca->cluster();
      hello.proof = cluster::prove(token, cluster::ProofRole::seed, c.export_secret(cluster::exporter_label));
      j->out = c.open_stream(0);
      send(*j, wire::encode(hello));
      j->hello_sent = true;
    } catch (const std::exception& e) {
      log::info("seed: dropping {}: {}", c.remote().to_string(), e.what());
      close_later(c, Errc::protocol, e.what());
    }
  }

  void on_stream_data(quic::Connection& c, std::int64_t stream, const std::uint8_t* data,
                      std::size_t len) override {
    c.consumed(stream, len);
    Joiner* j = joiner_of(c);
    if (j->answered) return;
    try {
      std::vector<wire::SeedMessage> msgs;
      if (!j->reader.feed(data, len, msgs)) {
        refuse(*j, Errc::protocol, "malformed join request: " + j->reader.error());
        return;
      }
      for (auto& m : msgs) {
        if (j->answered) return;
        auto* req = std::get_if<wire::JoinRequest>(&m);
        if (!req || !j->hello_sent || j->admitted) {
          refuse(*j, Errc::protocol, "unexpected seed message from a joiner");
          return;
        }
        admit(*j, std::move(*req));
      }
    } catch (const std::exception& e) {
      if (!j->answered) refuse(*j, Errc::protocol, e.what());
      close_later(c, Errc::protocol, e.what());
    }
  }

  void on_closed(quic::Connection& c, Errc code, const std::string& why) override {
    auto it = joiners.find(&c);
    if (it == joiners.end()) return;
    Joiner& j = *it->second;
    if (j.admitted && state_now() == State::waiting)
      log::warn("seed: node {} ({}) left before the cluster formed: {}: {}", j.req.node, j.addr,
                to_string(code), why);
    // A member that closed the connection itself has its assignment (it closes once it has
    // read it); one whose connection broke may not. One whose port vanished after the answer
    // went out has it too: a member closes its socket only once its join is over, and under
    // loss its close can be lost while the seed still resends the answer.
    if (auto m = undelivered.find(j.req.node); j.member && m != undelivered.end()) {
      if (code != Errc::peer_closed && !(j.answered && c.port_gone()))
        lost.push_back(m->second + ": " + to_string(code) + ": " + why);
      undelivered.erase(m);
    }
    joiners.erase(it);
    if (state_now() == State::delivering) check_delivered();
  }

  // ---- admission ------------------------------------------------------------------------

  State state_now() {
    std::lock_guard lk(mu);
    return state;
  }

  std::vector<Joiner*> admitted() {
    std::vector<Joiner*> v;
    for (auto& [c, j] : joiners)
      if (j->admitted && !j->answered) v.push_back(j.get());
    std::sort(v.begin(), v.end(), [](Joiner* a, Joiner* b) { return a->order < b->order; });
    return v;
  }

  void admit(Joiner& j, wire::JoinRequest req) {
    const std::string from = j.conn->remote().to_string();
    const wire::Proof expect =
        cluster::prove(token, cluster::ProofRole::joiner, j.conn->export_secret(cluster::exporter_label));
    if (!cluster::proofs_equal(expect, req.proof)) {
      log::warn("seed: rejected a joiner from {}: wrong cluster token", from);
      refuse(j, Errc::rejected, "wrong cluster token");
      return;
    }
    const State st = state_now();
    if (opts.elastic && (st == State::delivering || st == State::done)) {
      admit_late(j, std::move(req));
      return;
    }
    if (st != State::waiting) {
      refuse(j, Errc::rejected,
             st == State::delivering || st == State::done
                 ? "cluster already formed with " + std::to_string(formed_world) + " ranks"
                 : "the seed is no longer admitting nodes");
      return;
    }
    const int lo = opts.min_world > 0 ? opts.min_world : opts.world;
    if (req.world != 0 && (req.world < lo || req.world > opts.world)) {
      refuse(j, Errc::rejected, "this node expects world size " + std::to_string(req.world) +
                                    ", the seed forms a cluster of " + std::to_string(opts.world));
      return;
    }
    if (req.rank < -1 || req.rank >= opts.world) {
      refuse(j, Errc::rejected, "requested rank " + std::to_string(req.rank) +
                                    " is outside 0.." + std::to_string(opts.world - 1));
      return;
    }
    if (!valid_node_name(req.node) || req.node == tls::seed_node) {
      refuse(j, Errc::protocol, "invalid node name '" + req.node.substr(0, 64) + "'");
      return;
    }
    for (Joiner* o : admitted()) {
      if (req.rank >= 0 && o->req.rank == req.rank) {
        refuse(j, Errc::rejected, "rank " + std::to_string(req.rank) + " is already taken by " +
                                      o->req.node + " (" + o->addr + ")");
        return;
      }
      if (o->req.node == req.node) {
        refuse(j, Errc::rejected, "node name '" + req.node + "' is already taken");
        return;
      }
    }
    if (!address_and_sign(j, req)) return;
    j.req = std::move(req);
    j.admitted = true;
    j.order = next_order++;
    const std::size_t n = admitted().size();
    log::info("seed: admitted {} ({}, host '{}', asks rank {}): {} of {}", j.req.node, j.addr,
              j.req.host, j.req.rank, n, opts.world);
    if (n == static_cast<std::size_t>(opts.world)) form(static_cast<int>(n));
  }

  // Works out the address peers dial `j` at (the advertised IP, else where its request came
  // from, with its data port) and signs its certificate; refuses it (false) when either fails.
  bool address_and_sign(Joiner& j, const wire::JoinRequest& req) {
    try {
      if (req.port == 0)
        throw Error(Errc::invalid_argument,
                    "node " + req.node + " from " + j.conn->remote().to_string() + " announced data port 0");
      quic::Address a = req.advertise.empty() ? j.conn->remote() : quic::Address::with_host(req.advertise, req.port);
      a.set_port(req.port);
      j.addr = a.to_string();
      j.cert = ca->sign(req.csr_pem, req.node);
      return true;
    } catch (const Error& e) {
      refuse(j, e.code() == Errc::tls ? Errc::tls : Errc::invalid_argument, e.what());
      return false;
    }
  }

  // Elastic, after formation: the joiner gets the next world rank, a certificate, and the
  // table of every rank handed out; every linked node hears of it and the members dial it.
  // The requested rank and world size are launcher hints for formation only: a joiner of a
  // running job is appended.
  void admit_late(Joiner& j, wire::JoinRequest req) {
    if (!valid_node_name(req.node) || req.node == tls::seed_node) {
      refuse(j, Errc::protocol, "invalid node name '" + req.node.substr(0, 64) + "'");
      return;
    }
    // Names are identities (the certificate carries them): one never signed before cannot
    // be a live member's.
    if (names_signed.count(req.node)) {
      refuse(j, Errc::rejected, "node name '" + req.node + "' was already admitted to this cluster");
      return;
    }
    if (nodes.size() >= wire::max_node_ids) {
      refuse(j, Errc::rejected, "this cluster handed out all " + std::to_string(wire::max_node_ids) + " world ranks");
      return;
    }
    if (!address_and_sign(j, req)) return;
    j.req = std::move(req);
    j.admitted = true;
    j.member = true;
    j.linked = true;
    j.answered = true;
    names_signed.insert(j.req.node);
    const int id = static_cast<int>(nodes.size());
    nodes.push_back({j.req.node, j.addr, true});
    j.rank = id;
    wire::JoinAccept acc;
    acc.rank = id;
    acc.flags = wire::accept_elastic | wire::accept_late;
    acc.ca_pem = ca->cert_pem();
    acc.cert_pem = j.cert;
    acc.members = nodes;
    acc.keys = cluster::relay_keys_of(relay_master, id, names_of(acc.members));
    send(j, wire::encode(acc));
    // Each linked node hears of the new rank with the key it shares with it, and only that.
    wire::Announce ann;
    ann.rank = id;
    ann.member = nodes.back();
    int told = 0;
    for (auto& [c, o] : joiners) {
      if (o.get() == &j || !o->linked || c->closed() || o->out < 0 || o->rank < 0) continue;
      ann.key = cluster::relay_key(relay_master, id, j.req.node, o->rank, o->req.node);
      send(*o, wire::encode(ann));
      ++told;
    }
    log::info("seed: admitted {} ({}, host '{}') into the running job as world rank {}; told {} linked nodes",
              j.req.node, j.addr, j.req.host, id, told);
  }

  // Assigns ranks to the admitted joiners (requested ranks first, then the lowest free ones
  // in arrival order) and sends every one of them the full member list.
  void form(int world) {
    std::vector<Joiner*> js = admitted();
    // Under a minimum, a joiner may have asked for a rank (or world size) the smaller cluster
    // cannot give it: turn it away and form without it (which may turn away others).
    std::vector<Joiner*> turned_away;
    for (;;) {
      auto bad = std::find_if(js.begin(), js.end(), [&](Joiner* j) {
        return j->req.rank >= world || (j->req.world != 0 && j->req.world != world);
      });
      if (bad == js.end()) break;
      turned_away.push_back(*bad);
      js.erase(bad);
      world = static_cast<int>(js.size());
    }
    for (Joiner* j : turned_away)
      refuse(*j, Errc::rejected, "the cluster formed with " + std::to_string(world) +
                                     " ranks, which cannot honour this node's requested rank " +
                                     std::to_string(j->req.rank) + " / world size " +
                                     std::to_string(j->req.world));
    if (world == 0 || world < opts.min_world) {
      fail(Errc::timeout, "cluster did not form: too few nodes could be admitted");
      return;
    }
    std::vector<Joiner*> slot(static_cast<std::size_t>(world), nullptr);
    for (Joiner* j : js)
      if (j->req.rank >= 0) slot[static_cast<std::size_t>(j->req.rank)] = j;
    std::size_t next = 0;
    for (Joiner* j : js) {
      if (j->req.rank >= 0) continue;
      while (slot[next] != nullptr) ++next;
      slot[next] = j;
    }
    wire::JoinAccept acc;
    acc.ca_pem = ca->cert_pem();
    if (opts.elastic) acc.flags = wire::accept_elastic;
    for (Joiner* j : slot) {
      acc.members.push_back({j->req.node, j->addr, false});
      names_signed.insert(j->req.node);
    }
    if (opts.elastic) nodes = acc.members;
    {
      std::lock_guard lk(mu);
      state = State::delivering;
      formed_world = world;
    }
    delivery_deadline = Clock::now() + kDelivery;
    const std::vector<std::string> names = names_of(acc.members);
    for (int r = 0; r < world; ++r) {
      Joiner& j = *slot[static_cast<std::size_t>(r)];
      j.member = true;
      undelivered[j.req.node] = "rank " + std::to_string(r) + " " + j.req.node + " (" + j.addr + ")";
      j.rank = r;
      acc.rank = r;
      acc.cert_pem = j.cert;
      acc.keys = cluster::relay_keys_of(relay_master, r, names);
      answer(j, wire::encode(acc));
      j.close_by = delivery_deadline;  // a member closes itself once it has the answer
      j.linked = opts.elastic;          // ... unless it stays linked to hear of joiners
    }
    log::info("seed: cluster {} formed with {} ranks", ca->cluster(), world);
    check_delivered();
  }

  // The node names of `members`, for deriving their relay keys.
  static std::vector<std::string> names_of(const std::vector<wire::Member>& members) {
    std::vector<std::string> names;
    names.reserve(members.size());
    for (const auto& m : members) names.push_back(m.node);
    return names;
  }

  // The bytes live until the peer acknowledged them (the chunk's completion owns them):
  // a linked node hears of every later joiner, so nothing may pile up per connection.
  void send(Joiner& j, std::vector<std::uint8_t> bytes) {
    auto b = std::make_shared<const std::vector<std::uint8_t>>(std::move(bytes));
    j.conn->push(j.out, quic::Chunk{b->data(), b->size(), [b](Errc, const std::string&) {}});
  }

  // Sends the final message; the joiner closes the connection when it has it.
  void answer(Joiner& j, std::vector<std::uint8_t> bytes) {
    if (j.out >= 0) send(j, std::move(bytes));
    j.answered = true;
    j.close_by = Clock::now() + kLinger;
  }

  void refuse(Joiner& j, Errc code, const std::string& why) {
    log::info("seed: refused {}: {}", j.conn->remote().to_string(), why);
    wire::JoinReject rej;
    rej.code = static_cast<std::uint16_t>(code);
    rej.reason = why;
    answer(j, wire::encode(rej));
  }

  void fail(Errc code, const std::string& why) {
    for (Joiner* j : admitted()) refuse(*j, code, why);
    {
      std::lock_guard lk(mu);
      state = State::failed;
      fail_code = code;
      fail_why = why;
    }
    cv.notify_all();
  }

  // Delivered: every member closed its connection itself (it has the answer) or
  // acknowledged all of it. A member whose connection broke first, or that did neither by
  // the delivery deadline, fails the formation: its peers cannot reach a complete mesh.
  void check_delivered() {
    for (auto& [c, j] : joiners)
      if (j->member && !c->closed() && c->unacked(j->out) == 0) undelivered.erase(j->req.node);
    if (!undelivered.empty() && Clock::now() < delivery_deadline) return;
    for (auto& [node, who] : undelivered) lost.push_back(who + ": no acknowledgement within " + seconds_text(kDelivery));
    undelivered.clear();
    std::string why;
    if (!lost.empty()) {
      why = "cluster formed with " + std::to_string(formed_world) + " ranks, but " +
            std::to_string(lost.size()) + " did not receive their assignment:";
      for (const auto& l : lost) why += " [" + l + "]";
      log::warn("seed: {}", why);
    }
    {
      std::lock_guard lk(mu);
      if (state != State::delivering) return;
      state = lost.empty() ? State::done : State::failed;
      if (!lost.empty()) {
        fail_code = Errc::peer_failed;
        fail_why = std::move(why);
      }
    }
    cv.notify_all();
  }

  void arm_sweep() {
    sweep->expires_after(kSweep);
    sweep->async_wait(engine.guard([this](asio::error_code ec) {
      if (ec) return;
      on_sweep();
      arm_sweep();
    }));
  }

  void on_sweep() {
    const auto now = Clock::now();
    const State st = state_now();
    if (st == State::waiting && now >= deadline) {
      const int n = static_cast<int>(admitted().size());
      if (opts.min_world > 0 && n >= opts.min_world) {
        form(n);
      } else {
        fail(Errc::timeout, "cluster did not form: " + std::to_string(n) + " of " +
                                std::to_string(opts.world) + " ranks joined within " +
                                seconds_text(opts.formation_timeout));
        log::warn("seed: {}", fail_why);
      }
    }
    // Before the linger closes answered connections, so acknowledged members count.
    if (st == State::delivering) check_delivered();
    std::vector<quic::Connection*> answered, silent;
    for (auto& [c, j] : joiners) {
      if (c->closed()) continue;
      if (j->answered && !j->linked && now >= j->close_by) answered.push_back(c);
      if (!j->admitted && !j->answered && now >= j->request_by) silent.push_back(c);
    }
    for (quic::Connection* c : answered) c->close(0, "seed: answered");
    for (quic::Connection* c : silent) {
      log::info("seed: closing {}: no join request in time", c->remote().to_string());
      c->close(static_cast<std::uint64_t>(Errc::protocol), "no join request in time");
    }
  }

  // ---- shutdown -------------------------------------------------------------------------

  void stop() {
    // Idempotent and callable from any thread, also while the destructor runs it.
    std::lock_guard once(stop_mu);
    if (engine.stopped()) return;
    std::promise<void> told;
    engine.post([this, &told] {
      if (state_now() == State::waiting || state_now() == State::delivering) {
        for (Joiner* j : admitted()) refuse(*j, Errc::closed, "the seed stopped");
        std::lock_guard lk(mu);
        if (state == State::waiting || state == State::delivering) state = State::stopped;
      }
      told.set_value();
    });
    told.get_future().wait();
    cv.notify_all();
    // Give the refusals a moment to reach the joiners before the connections go.
    const auto until = Clock::now() + std::chrono::seconds(1);
    while (Clock::now() < until) {
      std::promise<bool> idle;
      engine.post([this, &idle] {
        bool any = false;
        for (auto& [c, j] : joiners)
          if (!c->closed() && j->out >= 0 && c->unacked(j->out) > 0) any = true;
        idle.set_value(!any);
      });
      if (idle.get_future().get()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    engine.post([this] {
      sweep->cancel();
      ep->shutdown("seed stopped");
    });
    engine.stop();
    joiners.clear();
  }
};

Seed::Seed(SeedOptions options, const Config& config)
    : impl_(std::make_unique<Impl>(std::move(options), config)) {
  log::set_level(config.log_level);
  impl_->start();
}

Seed::~Seed() { stop(); }

std::string Seed::address() const { return impl_->bound; }
const std::string& Seed::token() const { return impl_->token; }
const std::string& Seed::fingerprint() const { return impl_->fp; }
const std::string& Seed::ca_pem() const { return impl_->ca->cert_pem(); }
const std::string& Seed::cluster() const { return impl_->ca->cluster(); }

int Seed::wait(std::chrono::milliseconds limit) {
  Impl& s = *impl_;
  std::unique_lock lk(s.mu);
  auto over = [&] { return s.state != Impl::State::waiting && s.state != Impl::State::delivering; };
  if (limit == std::chrono::milliseconds::max()) {
    s.cv.wait(lk, over);
  } else if (!s.cv.wait_for(lk, limit, over)) {
    throw Error(Errc::timeout, "seed " + s.bound + ": cluster not formed within " + seconds_text(limit));
  }
  switch (s.state) {
    case Impl::State::done: return s.formed_world;
    case Impl::State::failed: throw Error(s.fail_code, "seed " + s.bound + ": " + s.fail_why);
    default: throw Error(Errc::closed, "seed " + s.bound + ": stopped");
  }
}

void Seed::stop() {
  if (impl_) impl_->stop();
}

}  // namespace nexar
