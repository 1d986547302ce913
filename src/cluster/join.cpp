// A worker joining through a seed: bind the data socket, reach the seed (retrying while it
// is not up yet), check its token proof, prove ours, send a CSR, wait for the member list,
// then start the mesh on the data socket exactly as bootstrap_local's ranks do.
#include <nexar/cluster.hpp>

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <thread>
#include <future>
#include <mutex>

#include "cluster/ifname.hpp"
#include "cluster/launch_env.hpp"
#include "cluster/local.hpp"
#include "cluster/token.hpp"
#include "comm/communicator_impl.hpp"
#include "core/access.hpp"
#include "core/env_vars.hpp"
#include "core/log.hpp"
#include "engine/engine.hpp"
#include "quic/endpoint.hpp"
#include "tls/node_key.hpp"
#include "tls/peer_check.hpp"
#include "tls/tls_context.hpp"
#include "wire/seed_message.hpp"

namespace nexar {
namespace {

using Clock = std::chrono::steady_clock;
// Pause between attempts to reach a seed that is not up yet.
constexpr auto kRetry = std::chrono::milliseconds(200);
// Longest single attempt: a seed that starts later still gets a retransmitted Initial
// within it, and a dead one is noticed.
constexpr auto kAttempt = std::chrono::seconds(10);

// What one connection to the seed ended with.
struct Outcome {
  bool done = false;
  bool admitted = false;   // the seed proved itself and took our request
  bool retry = false;      // the seed could not be reached: try again
  Errc code = Errc::ok;
  std::string why;
  wire::JoinAccept accept;
};

// One attempt to join over one QUIC connection. Engine thread, except wait().
class Attempt final : public quic::ConnectionHandler {
 public:
  Attempt(detail::Engine& engine, std::string token, std::function<wire::JoinRequest(const std::string&)> request)
      : engine_(engine), token_(std::move(token)), request_(std::move(request)) {}

  std::string on_peer_identity(quic::Connection&, const std::string&) override { return {}; }
  void on_established(quic::Connection&) override {}

  void on_stream_data(quic::Connection& c, std::int64_t stream, const std::uint8_t* data,
                      std::size_t len) override {
    c.consumed(stream, len);
    if (finished() && !linked) return;  // a linked one hears announcements after its accept
    try {
      on_messages(c, data, len);
    } catch (const std::exception& e) {
      end(c, Errc::protocol, std::string("while joining: ") + e.what(), false);
    }
  }

  void on_messages(quic::Connection& c, const std::uint8_t* data, std::size_t len) {
    std::vector<wire::SeedMessage> msgs;
    if (!reader_.feed(data, len, msgs)) {
      end(c, Errc::protocol, "malformed message from the seed: " + reader_.error(), false);
      return;
    }
    for (auto& m : msgs) {
      if (finished() && !linked) return;
      if (!hello_) {
        auto* h = std::get_if<wire::SeedHello>(&m);
        if (!h) {
          end(c, Errc::protocol, "the seed did not start with a hello", false);
          return;
        }
        on_hello(c, *h);
      } else if (auto* an = std::get_if<wire::Announce>(&m)) {
        if (!linked) {
          end(c, Errc::protocol, "the seed announced a node before admitting this one", false);
          return;
        }
        if (announce_) announce_(std::move(*an));
      } else if (auto* a = std::get_if<wire::JoinAccept>(&m)) {
        // Application code 0 tells the seed this member has its assignment; every other
        // way out closes with an error code. Posted (we are inside ngtcp2's processing),
        // and before the waiting thread learns the outcome: its shutdown must come after.
        // An elastic seed's members stay linked, to hear of the nodes admitted later.
        linked = (a->flags & wire::accept_elastic) != 0;
        if (!linked) close_later(c, 0, "joined");
        joined = true;
        std::lock_guard lk(mu_);
        out_.accept = std::move(*a);
        out_.code = Errc::ok;
        finish_locked();
      } else if (auto* r = std::get_if<wire::JoinReject>(&m)) {
        const auto code = static_cast<Errc>(r->code);
        end(c, code == Errc::ok ? Errc::rejected : code, "the seed refused: " + r->reason, false);
      } else {
        end(c, Errc::protocol, "unexpected message from the seed", false);
      }
    }
  }

  void on_closed(quic::Connection&, Errc code, const std::string& why) override {
    conn = nullptr;
    if (linked && !closing)
      log::warn("join: the link to the membership service closed ({}: {}): the job runs on, but no more "
                "nodes can join it", to_string(code), why);
    fail(code, why);
  }

  /// Elastic: what to do with each later announcement (link engine thread).
  void on_announce(std::function<void(wire::Announce)> fn) { announce_ = std::move(fn); }

  /// The connection while it is open (engine thread only).
  quic::Connection* conn = nullptr;
  /// Whether the seed's accept arrived (engine thread only).
  bool joined = false;
  /// Whether the connection stays open after the accept (elastic), and whether we are
  /// closing it ourselves (engine thread only).
  bool linked = false;
  bool closing = false;

  /// Ends the attempt unless it already ended.
  void fail(Errc code, const std::string& why) {
    std::lock_guard lk(mu_);
    if (out_.done) return;
    out_.code = code;
    out_.why = why;
    // Before the seed proved itself, a broken connection means it is not up (yet); a TLS
    // failure (fingerprint or CA mismatch) will not heal by retrying.
    out_.retry = !hello_ && code != Errc::tls;
    finish_locked();
  }

  /// Waits until the attempt ends or `until`; returns a copy of the outcome.
  Outcome wait(Clock::time_point until) {
    std::unique_lock lk(mu_);
    cv_.wait_until(lk, until, [&] { return out_.done; });
    Outcome o = out_;
    o.admitted = hello_;
    return o;
  }

  bool finished() {
    std::lock_guard lk(mu_);
    return out_.done;
  }

 private:
  void on_hello(quic::Connection& c, const wire::SeedHello& h) {
    const auto secret = c.export_secret(cluster::exporter_label);
    if (!cluster::proofs_equal(cluster::prove(token_, cluster::ProofRole::seed, secret), h.proof)) {
      end(c, Errc::rejected,
          "the seed could not prove it knows the cluster token (wrong token here or there, "
          "or not the seed you meant)",
          false);
      return;
    }
    wire::JoinRequest req;
    try {
      req = request_(h.cluster);
    } catch (const Error& e) {
      end(c, e.code(), e.what(), false);
      return;
    }
    req.proof = cluster::prove(token_, cluster::ProofRole::joiner, secret);
    {
      std::lock_guard lk(mu_);
      hello_ = true;
    }
    request_bytes_ = wire::encode(req);
    const std::int64_t s = c.open_stream(0);
    c.push(s, quic::Chunk{request_bytes_.data(), request_bytes_.size(), {}});
  }

  void end(quic::Connection& c, Errc code, const std::string& why, bool retry) {
    close_later(c, static_cast<std::uint64_t>(code == Errc::ok ? Errc::protocol : code), why.substr(0, 200));
    std::lock_guard lk(mu_);
    out_.code = code;
    out_.why = why;
    out_.retry = retry;
    finish_locked();
  }

  // Connection callbacks run inside ngtcp2's packet processing, which must not be
  // re-entered; posted work runs before the connection could be freed.
  void close_later(quic::Connection& c, std::uint64_t app_code, std::string why) {
    quic::Connection* p = &c;
    engine_.post([p, app_code, why = std::move(why)] { p->close(app_code, why); });
  }

  void finish_locked() {
    out_.done = true;
    cv_.notify_all();
  }

  detail::Engine& engine_;
  std::string token_;
  std::function<wire::JoinRequest(const std::string&)> request_;
  std::function<void(wire::Announce)> announce_;
  wire::SeedMessageReader reader_{wire::max_seed_reply};
  std::vector<std::uint8_t> request_bytes_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool hello_ = false;
  Outcome out_;
};

// The connection(s) to the seed and what runs them. Elastic: the joined connection stays
// open for the node's life, and each node the seed admits later is announced on it and
// handed to the node (members dial it; a joiner learns of the joiners after it).
struct SeedLink {
  explicit SeedLink(const tls::SeedTrust& trust) : tls(trust) {}
  ~SeedLink() { shut(); }

  tls::TlsContext tls;
  detail::Engine engine{std::chrono::microseconds(0)};
  // Declared before the endpoint, so destroyed after it: its connections point at them.
  std::vector<std::unique_ptr<Attempt>> attempts;
  std::unique_ptr<quic::Endpoint> ep;

  // Link engine thread: to the node, or kept until it exists.
  void announce(wire::Announce a) {
    std::lock_guard lk(mu_);
    if (node_) {
      pass(a);
    } else {
      early_.push_back(std::move(a));
    }
  }
  // The node exists: it gets what was announced meanwhile. It calls shut() (Node::on_close)
  // before it goes, so the pointer never dangles.
  void attach(detail::Node& n) {
    std::lock_guard lk(mu_);
    node_ = &n;
    for (auto& a : early_) pass(a);
    early_.clear();
  }
  // The joined attempt closes with code 0 (its own posted close may still be queued behind
  // this task: asio runs work posted from its thread after work posted from others); any
  // other connection still open belongs to a join that failed and closes with an error
  // code, so the seed does not count it as delivered. Idempotent; never on the link's thread.
  void shut() {
    std::call_once(shut_once_, [this] {
      {
        std::lock_guard lk(mu_);
        node_ = nullptr;
      }
      if (!ep) return;
      engine.post([this] {
        for (auto& a : attempts) {
          a->closing = true;
          if (a->joined && a->conn) a->conn->close(0, "joined");
        }
        ep->shutdown("join over", static_cast<std::uint64_t>(Errc::timeout));
      });
      engine.stop();
    });
  }

 private:
  void pass(const wire::Announce& a) {
    try {
      node_->add_peer(a.rank, a.member.node, quic::Address::parse(a.member.addr), a.member.late, a.key);
    } catch (const Error& e) {
      log::warn("join: the seed announced world rank {} at an unusable address '{}': {}", a.rank, a.member.addr,
                e.what());
    }
  }
  std::mutex mu_;
  detail::Node* node_ = nullptr;
  std::vector<wire::Announce> early_;
  std::once_flag shut_once_;
};

std::string local_host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "host";
  return buf;
}

// A node name unique in the cluster and readable in logs: host-pid-random.
std::string make_node_name(const std::string& host) {
  std::string n;
  for (char c : host) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
    n += ok ? c : '-';
    if (n.size() >= 40) break;
  }
  if (n.empty()) n = "node";
  return n + "-" + std::to_string(::getpid()) + "-" + cluster::random_token().substr(0, 8);
}

// "ip" or "ip:port" / "[ip6]:port" -> address; a bare IPv6 literal has no brackets.
quic::Address parse_bind(const std::string& text) {
  try {
    return quic::Address::with_host(text, 0);
  } catch (const Error&) {
    return quic::Address::parse(text);
  }
}

// The host part of an advertised address, resolved to an IP literal, and its port (0: the
// bound port).
std::pair<std::string, std::uint16_t> parse_advertise(const std::string& text) {
  try {
    return {quic::Address::with_host(text, 0).host(), 0};
  } catch (const Error&) {
  }
  const bool has_port = text.front() == '[' || text.find(':') != std::string::npos;
  quic::Address a = quic::Address::resolve(has_port ? text : text + ":0");
  return {a.host(), a.port()};
}

quic::Address local_of(int fd) {
  quic::Address a;
  a.len = sizeof a.storage;
  ::getsockname(fd, a.sa(), &a.len);
  return a;
}

struct FdGuard {
  int fd = -1;
  ~FdGuard() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

Communicator join(const JoinOptions& o, const Config& config) {
  config.validate();
  log::set_level(config.log_level);
  if (o.seed.empty()) throw Error(Errc::invalid_argument, "join: no seed address given");
  if (o.token.empty()) throw Error(Errc::invalid_argument, "join: no cluster token given");
  if (o.world < 0) throw Error(Errc::invalid_argument, "join: world size " + std::to_string(o.world) + " must be >= 0");
  if (o.join_timeout.count() <= 0 || o.join_timeout > std::chrono::hours(24 * 365))
    throw Error(Errc::invalid_argument, "join: join timeout of " + std::to_string(o.join_timeout.count()) +
                                            " ms is outside 1 ms .. 365 days");
  if (o.rank < -1 || (o.world > 0 && o.rank >= o.world))
    throw Error(Errc::invalid_argument, "join: rank " + std::to_string(o.rank) + " is outside 0.." +
                                            std::to_string(o.world - 1));
  const quic::Address seed = quic::Address::resolve(o.seed);

  // The data socket first: its port goes into the request, and peers may dial it as soon
  // as the member list is out (the kernel queues their first packets until we read).
  quic::Address bind_at;
  if (!o.bind.empty()) {
    bind_at = parse_bind(o.bind);
  } else if (!o.ifname.empty()) {
    bind_at = quic::Address::with_host(cluster::require_interface(o.ifname, seed.family()).ip, 0);
  } else {
    bind_at = quic::Address::with_host(seed.family() == AF_INET6 ? "::" : "0.0.0.0", 0);
  }
  FdGuard data{quic::UdpSocket::open_bound(bind_at)};
  const quic::Address data_local = local_of(data.fd);
  std::string advertise;
  std::uint16_t port = data_local.port();
  if (!o.advertise.empty()) {
    auto [host, p] = parse_advertise(o.advertise);
    advertise = host;
    if (p != 0) port = p;
  } else if (!data_local.is_wildcard()) {
    advertise = data_local.host();
  }

  const std::string host = local_host_name();
  const std::string node = make_node_name(host);
  const tls::NodeKey key = tls::NodeKey::generate();
  std::string cluster_name;
  auto make_request = [&](const std::string& cluster) {
    cluster_name = cluster;
    wire::JoinRequest r;
    r.rank = o.rank;
    r.world = o.world;
    r.advertise = advertise;
    r.port = port;
    r.node = node;
    r.host = host;
    r.csr_pem = key.make_csr(cluster, node);
    return r;
  };

  auto link = std::make_shared<SeedLink>(tls::SeedTrust{o.seed_fingerprint, o.seed_ca_pem});
  quic::ConnectionSettings s;
  s.alpn = {wire::seed_alpn};
  s.udp_payload = config.udp_payload;
  s.idle_timeout_ns = static_cast<std::uint64_t>(std::chrono::nanoseconds(config.idle_timeout).count());
  s.handshake_timeout_ns = static_cast<std::uint64_t>(std::chrono::nanoseconds(kAttempt).count());
  link->ep = std::make_unique<quic::Endpoint>(
      link->engine, quic::UdpSocket::open_bound(quic::Address::with_host(seed.family() == AF_INET6 ? "::" : "0.0.0.0", 0)),
      link->tls, s, config.udp_gso);
  link->engine.start();
  // Reads replies; nobody may open a connection to a joiner's seed socket.
  link->engine.post([&] { link->ep->start([](quic::Connection&) -> quic::ConnectionHandler* { return nullptr; }); });

  const auto start = Clock::now();
  const auto deadline = start + o.join_timeout;
  Outcome last;
  int tries = 0;
  for (;;) {
    link->attempts.push_back(std::make_unique<Attempt>(link->engine, o.token, make_request));
    Attempt* a = link->attempts.back().get();
    a->on_announce([l = link.get()](wire::Announce an) { l->announce(std::move(an)); });
    ++tries;
    link->engine.post([&, a] {
      try {
        a->conn = &link->ep->connect(seed, std::string(tls::seed_node), a);
      } catch (const Error& e) {
        a->fail(e.code(), e.what());
      }
    });
    last = a->wait(deadline);
    if (last.done && !last.retry) break;
    if (Clock::now() + kRetry >= deadline) break;
    if (last.done) {
      log::debug("join: seed {} not reachable yet ({}: {}), retrying", o.seed, to_string(last.code), last.why);
      std::this_thread::sleep_for(kRetry);
    }
  }
  const bool elastic = last.done && last.code == Errc::ok && (last.accept.flags & wire::accept_elastic);
  if (!elastic) link->shut();

  const double waited = std::chrono::duration<double>(Clock::now() - start).count();
  auto failure = [&](Errc code, const std::string& why) {
    return Error(code, "join: seed " + o.seed + ", after " + std::to_string(waited).substr(0, 6) +
                           " s: " + to_string(code) + ": " + why);
  };
  // An attempt that failed in a way worth retrying, with no time left to retry, is a timeout
  // (the documented result), saying what the last attempt met.
  if (!last.done || last.retry) {
    if (last.admitted)
      throw failure(Errc::timeout, "admitted, but the cluster did not form within " +
                                       std::to_string(o.join_timeout.count()) + " ms");
    throw failure(Errc::timeout, "the seed did not answer within " + std::to_string(o.join_timeout.count()) +
                                     " ms (" + std::to_string(tries) + " attempts" +
                                     (last.why.empty() ? std::string() : ", last: " + last.why) + ")");
  }
  if (last.code != Errc::ok) throw failure(last.code, last.why);

  const wire::JoinAccept& acc = last.accept;
  const bool late = (acc.flags & wire::accept_late) != 0;
  const int world = static_cast<int>(acc.members.size());
  if (acc.members[static_cast<std::size_t>(acc.rank)].node != node)
    throw failure(Errc::protocol, "the seed's member list names '" + acc.members[static_cast<std::size_t>(acc.rank)].node +
                                      "' at rank " + std::to_string(acc.rank) + ", this node is '" + node + "'");
  // A joiner of a running job is appended to it: the launcher's rank and world size were
  // meant for formation.
  if (!late && o.world > 0 && world != o.world)
    throw failure(Errc::rejected, "the cluster formed with " + std::to_string(world) + " ranks, expected " +
                                      std::to_string(o.world));
  if (!late && o.rank >= 0 && acc.rank != o.rank)
    throw failure(Errc::protocol, "the seed assigned rank " + std::to_string(acc.rank) + ", asked for " +
                                      std::to_string(o.rank));
  detail::NodeOptions no;
  no.rank = acc.rank;
  no.world = world;
  no.elastic = elastic;
  no.late = late;
  for (std::size_t r = 0; r < acc.members.size(); ++r) {
    const auto& m = acc.members[r];
    no.names.push_back(m.node);
    if (m.late) no.joiners.push_back(static_cast<int>(r));
    try {
      no.addrs.push_back(quic::Address::parse(m.addr));
    } catch (const Error& e) {
      throw failure(Errc::protocol, "address of rank " + std::to_string(r) + " (" + m.node + "): " + e.what());
    }
  }
  no.creds = tls::NodeCredentials{cluster_name, node, acc.ca_pem, acc.cert_pem, key.key_pem()};
  no.relay_keys = acc.keys;  // one per member (the decoder checked), ours zero
  no.udp_fd = data.fd;
  data.fd = -1;
  if (!elastic) {
    log::info("join: rank {} of {} in cluster {} (data socket {})", acc.rank, world, cluster_name,
              data_local.to_string());
    return cluster::start_member(std::move(no), config);
  }
  // The link goes with the node: it is shut when the node closes.
  auto keep_link = [link](detail::Node& n) {
    link->attach(n);
    n.on_close([link] { link->shut(); });
  };
  if (!late) {
    log::info("join: rank {} of {} in elastic cluster {} (data socket {})", acc.rank, world, cluster_name,
              data_local.to_string());
    return cluster::start_member(std::move(no), config, keep_link);
  }
  log::info("join: admitted into running cluster {} as world rank {} (data socket {}); waiting for the members "
            "to grow", cluster_name, acc.rank, data_local.to_string());
  try {
    return cluster::start_joiner(std::move(no), config, keep_link, deadline);
  } catch (const Error& e) {
    throw failure(e.code(), e.what());
  }
}

bool launched_from_env() { return cluster::launched(cluster::process_env()); }

Communicator join_from_env(const Config& config) {
  const cluster::LaunchEnv env = cluster::resolve_launch_env();
  JoinOptions o;
  o.seed = env.seed;
  o.token = env.token;
  o.seed_fingerprint = env.seed_fingerprint;
  o.seed_ca_pem = env.seed_ca_pem;
  o.rank = env.rank;
  o.world = env.world;
  o.bind = env.bind;
  o.advertise = env.advertise;
  o.ifname = env.ifname;
  o.join_timeout = env.join_timeout;
  if (env.token_derived)
    log::warn("join_from_env: no NEXAR_CLUSTER_TOKEN; using a token derived from the {} job id. "
              "Anyone who can reach {} and knows that id can join: set NEXAR_CLUSTER_TOKEN.",
              env.source, env.seed);
  // More ranks on this host than cores: waiters that spin without yielding take the cores
  // from the ranks they wait for (as in bootstrap_local), unless the user chose otherwise.
  Config cfg = config;
  if (cluster::oversubscribed(env.local_world, env.local_cpus) &&
      std::getenv(detail::EnvName("NEXAR_SPIN_US").c_str()) == nullptr &&
      std::getenv(detail::EnvName("NEXAR_YIELD_WHEN_IDLE").c_str()) == nullptr)
    cluster::wait_politely(cfg);
  std::shared_ptr<Seed> seed;
  if (env.embed_seed) {
    SeedOptions so;
    so.listen = env.seed_listen;
    so.world = env.world;
    so.formation_timeout = env.formation_timeout;
    so.token = env.token;
    so.elastic = env.elastic;
    seed = std::make_shared<Seed>(so, cfg);
  }
  Communicator c = join(o, cfg);
  if (seed && env.elastic) {
    // The membership service lives as long as this rank: admission stops when it goes.
    detail::Access::impl(c)->node().on_close([seed] { seed->stop(); });
  } else if (seed) {
    // Every member has its assignment once our mesh is up; let the seed see them go.
    try {
      seed->wait(std::chrono::seconds(10));
    } catch (const Error& e) {
      log::debug("join_from_env: embedded seed: {}", e.what());
    }
  }
  return c;
}

}  // namespace nexar
