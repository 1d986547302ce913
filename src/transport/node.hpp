// A node: one rank's whole transport. It owns the progress engine, the QUIC endpoint, one
// Peer per other rank, and four parts with state of their own, each reaching the node
// through a narrow owner interface: Matching (the match queues of the message lanes: data,
// bulk, collective), Routing (neighbours, routes, relaying), Failures (failed ranks, revoked
// communicators, liveness) and Joiners (elastic admission). The frames of the RPC lanes go
// to the RPC module above it (RpcLanes). Communicators (src/comm) are sets of ranks on one
// node.
//
// Threads: user threads validate arguments, copy eager payloads into pooled buffers and
// post work to the engine; everything below runs on the engine thread.
#pragma once

#include <nexar/communicator.hpp>

#include <asio/steady_timer.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <type_traits>
#include <vector>

#include "core/error_format.hpp"
#include "engine/buffer_pool.hpp"
#include "engine/engine.hpp"
#include "engine/op_state.hpp"
#include "quic/endpoint.hpp"
#include "tls/node_key.hpp"
#include "tls/tls_context.hpp"
#include "transport/failures.hpp"
#include "transport/joiners.hpp"
#include "transport/match_queue.hpp"
#include "transport/matching.hpp"
#include "transport/membership_lanes.hpp"
#include "transport/peer.hpp"
#include "transport/peer_owner.hpp"
#include "transport/routing.hpp"
#include "transport/rpc_lanes.hpp"
#include "transport/shard.hpp"
#include "transport/shm_presence.hpp"
#include "transport/topology.hpp"
#include "wire/ballot.hpp"

namespace nexar::detail {

struct NodeOptions {
  int rank = 0;
  int world = 1;
  std::vector<std::string> names;           // node name of every rank
  std::vector<quic::Address> addrs;         // address of every rank
  tls::NodeCredentials creds;
  int udp_fd = -1;
  // Elastic: nodes are added at run time (add_peer) as the membership service announces
  // them, up to wire::max_node_ids world ranks.
  bool elastic = false;
  // Joined a running job (elastic): dials nobody and waits for nobody at start; the members
  // dial it, and a grow welcomes it into a communicator (wait_welcome).
  bool late = false;
  // World ranks among `names` that joined late and may still wait for admission.
  std::vector<int> joiners;
  // The key this rank shares with each rank (indexed by world rank; ours unused). Needed
  // for every rank that is not a neighbour under Config::topology.
  std::vector<RelayKey> relay_keys;
};

class ShmHub;
class TcpHub;

class Node final : public Progress,
             private PeerOwner,
             private Matching::Owner,
             private Routing::Owner,
             private Failures::Owner,  // with Routing::Owner, the PeerTable Joiners reads
             public std::enable_shared_from_this<Node> {
 public:
  Node(NodeOptions opts, const Config& cfg);
  ~Node() override;

  /// Starts the engine and connects the mesh; returns when every peer is up.
  void start();
  void close();
  /// Runs `fn` (any thread, once) when the node closes: what lives beside it (the link to
  /// the membership service) goes with it.
  void on_close(std::function<void()> fn);

  int rank() const noexcept { return rank_; }
  /// World ranks known here: the formed world, plus the nodes announced since (elastic).
  int size() const noexcept override { return world_.load(std::memory_order_acquire); }
  bool elastic() const noexcept { return elastic_; }
  const Config& config() const noexcept { return cfg_; }
  bool is_open() const noexcept override { return !closed_.load(std::memory_order_acquire); }

  /// What a point-to-point operation addresses, already validated by the caller
  /// (CommunicatorImpl checks ranks and tags); ranks below are world ranks.
  struct P2p {
    Domain domain = Domain::data;
    const char* op = "send";
    std::uint64_t comm = 0;
    Tag tag = 0;
    std::chrono::milliseconds timeout{0};
    std::shared_ptr<const std::vector<int>> local_of;  // world -> communicator rank
    bool exact = false;  // receive: the message must fill the buffer exactly
    // send: messages above Config::eager_limit and up to this size go eagerly from the
    // caller's memory (completing when acknowledged) instead of by rendezvous; 0 = never.
    std::uint64_t eager_in_place = 0;
    // A collective's message: the fingerprint of its call (core/call_check.hpp), which the
    // message carries and the receive compares; 0 = none.
    std::uint16_t check = 0;
  };
  /// Ranks (world) this node holds a working connection of its own to, ascending: every
  /// neighbour once formed, and under Config::lazy_connect those used so far. Any thread.
  std::vector<int> connected_peers();
  /// The pair with world rank `r` for Communicator::stats() (its world_rank set, its
  /// communicator rank left to the caller); a default PeerStats if no pair exists. Any thread.
  PeerStats peer_stats(int r);
  /// The QUIC socket's datagrams lost to full queues: on arrival, and on the way out.
  std::pair<std::uint64_t, std::uint64_t> socket_drops();

  /// Throws Errc::closed once close() began.
  void check_open(const char* op, int peer) const;
  Request isend(const P2p& a, int dest, std::span<const ConstBuffer> parts);
  Request irecv(const P2p& a, int source, void* data, std::size_t cap);

  /// Hands the RPC lanes' frames to `rpc` (before start(); the node keeps it alive).
  void attach_rpc(std::shared_ptr<RpcLanes> rpc) { rpc_ = std::move(rpc); }
  RpcLanes* rpc() const noexcept override { return rpc_.get(); }
  /// Sends one whole frame, header `h` followed by `payload` (copied), on an RPC lane to
  /// world rank `dest`. Any thread. Returns false when the peer is already gone (it is told
  /// to RpcLanes::on_peer_gone either way).
  bool send_rpc_frame(int dest, wire::Lane lane, const wire::FrameHeader& h,
                      std::span<const std::byte> payload);
  // ---- failures and communicators ----------------------------------------------------
  //
  // Which ranks failed and which communicators are revoked: the node's Failures
  // (transport/failures.hpp). Its any-thread members may be called from any thread, the
  // others with the engine lock held.
  Failures& failures() noexcept { return failures_; }
  const Failures& failures() const noexcept { return failures_; }

  using CommListener = Failures::CommListener;
  /// Registers communicator `id` of world ranks `members` (ours is `rank` in it). If one of
  /// them is already failed, or the id was revoked already, it is revoked at once. Any
  /// thread; ordered with the operations submitted after it.
  void watch_comm(std::uint64_t id, std::vector<int> members, int rank, CommListener on_event);
  /// Forgets communicator `id` (its CommunicatorImpl is gone). Any thread.
  void unwatch_comm(std::uint64_t id);
  /// Collective `tag` (collective_tag) of communicator `comm` starts here with fingerprint
  /// `check`, and ends (completed: `ok`): the messages of it that no receive awaited are
  /// judged (transport/call_registry.hpp); a disagreement revokes the communicator. Any
  /// thread.
  void collective_started(std::uint64_t comm, Tag tag, std::uint16_t check);
  void collective_ended(std::uint64_t comm, Tag tag, bool ok);
  /// The application revokes communicator `id`: here and on every member. Any thread.
  /// With `why`, its operations fail with Errc::invalid_argument and `why` (ranks that
  /// called different collectives, calls_agree) rather than with Errc::revoked.
  void revoke_comm(std::uint64_t id, std::string why = {});
  /// World rank r's connection ended without r being declared failed (engine thread).
  bool peer_left(int r);

  /// Hands agree and decided frames, and failure events, to `m` (before start()).
  void attach_membership(std::shared_ptr<MembershipLanes> m) { membership_ = std::move(m); }
  /// Sends an agree or decided frame to world rank `dest` on the control lane; false if it
  /// is failed or gone. Engine lock held.
  bool send_ballot(int dest, wire::FrameType type, std::uint64_t comm, std::uint64_t seq,
                   const wire::Ballot& b);

  // ---- elastic membership ---------------------------------------------------------------
  //
  // The membership service announces every node admitted after formation, in order, to
  // every node still linked to it; each adds it here and the lower world rank dials the
  // higher. A joiner waits until the members' grow admits it: each member then sends it a
  // welcome naming the new communicator (Joiners, transport/joiners.hpp).

  /// Adds world rank `id` (the next one) with certificate name `name` at `addr`; `joiner`:
  /// it waits for admission; `key`: the key we share with it. Dials it when `id` is above
  /// ours and a neighbour. Any thread (posted).
  void add_peer(int id, std::string name, quic::Address addr, bool joiner, RelayKey key);
  /// The joiners waiting for admission, and the welcome this node waits for if it is one.
  Joiners& joiners() noexcept { return joiners_; }
  /// Sends a welcome into communicator `comm` (agreement `seq`) of `members` to joiner
  /// `dest`. Any thread.
  void send_welcome(int dest, std::uint64_t comm, std::uint64_t seq, std::vector<std::uint32_t> members);

  /// A new operation named `op` failing after `timeout`, set up for waiters on this node.
  std::shared_ptr<OpState> new_op(const char* op, std::chrono::milliseconds timeout);

  // Progress: waiting user threads drive the engine while they spin.
  bool poll(bool bounded = false) override;
  void waiting(int delta) override {
    if (t_scope_ != this) engine_.add_progressing(delta);
  }
  void settle() override { engine_.settle(); }
  std::chrono::microseconds settle_delay(std::chrono::steady_clock::time_point now) override {
    return engine_.settle_delay(now);
  }
  void sleeping() override {
    if (t_scope_ == this && !t_scope_asleep_) {
      t_scope_asleep_ = true;
      engine_.add_progressing(-1);
    }
  }
  void woke() override {
    if (t_scope_ == this && t_scope_asleep_) {
      t_scope_asleep_ = false;
      engine_.add_progressing(1);
    }
  }
  /// Counts the calling thread as polling this node for its whole life (one collective run
  /// inline: its many short waits then keep the engine's gate closed between them instead
  /// of opening and closing it each time); waits that sleep step out meanwhile. Nests.
  class PollScope {
   public:
    explicit PollScope(Node& n) : n_(t_scope_ == nullptr ? &n : nullptr) {
      if (n_) {
        t_scope_ = n_;
        n_->engine_.add_progressing(1);
      }
    }
    ~PollScope() {
      if (n_) {
        t_scope_ = nullptr;
        if (!t_scope_asleep_) n_->engine_.add_progressing(-1);
        t_scope_asleep_ = false;
      }
    }
    PollScope(const PollScope&) = delete;
    PollScope& operator=(const PollScope&) = delete;

   private:
    Node* n_;
  };

  // ---- engine-thread internals used by Peer and the RPC module ------------------------
  Engine& engine() noexcept { return engine_; }
  /// The endpoint, for its counters (engine thread or the loop's lock); null before start().
  const quic::Endpoint* endpoint() const noexcept { return ep_.get(); }
  quic::Endpoint* endpoint() noexcept override { return ep_.get(); }
  /// The UDP port of shard `i` (0 .. engine_threads() - 2).
  std::uint16_t shard_port(int i) const { return shards_.at(static_cast<std::size_t>(i))->port(); }
  BufferPool& pool() noexcept { return pool_; }
  /// What every Peer of this node keeps for its life.
  PeerContext peer_context() noexcept {
    return {rank_, elastic_, cfg_, pool_, engine_, matching_, routing_, failures_, joiners_};
  }
  MatchQueue& queue(Domain d) noexcept { return matching_.queue(d); }
  const MatchQueue& queue(Domain d) const noexcept { return matching_.queue(d); }
  /// Whether receive `op` of domain `d` is matched with a message still arriving.
  bool receiving(Domain d, const OpState* op) const;
  Peer* peer(int rank) noexcept override { return peers_[static_cast<std::size_t>(rank)].get(); }
  /// The peer of world rank `r`, or null (out of the table, or the node closed). Engine
  /// lock held.
  Peer* peer_locked(int r) noexcept override;
  /// The node name of world rank `r` (what its certificate names).
  const std::string& name_of(int r) const override { return names_.at(static_cast<std::size_t>(r)); }
  int rank_of_node(const std::string& node) const;
  /// Completes `op` with an error formatted with this node's context.
  void fail(const std::shared_ptr<OpState>& op, Errc code, int peer, std::string_view why) override;
  std::string format(Errc code, const OpState& op, int peer, std::string_view why) const;
  /// Why a connection whose certificate names `node` (world rank `r`, -1 if none) is
  /// refused whatever it is for: not a member, or failed or gone here. Empty otherwise.
  std::string refusal_of(const std::string& node, int r);
  /// Engine threads carrying this node's connections: 1 + its shards.
  int engine_threads() const noexcept { return 1 + static_cast<int>(shards_.size()); }
  /// The mailboxes of small collective messages (shm/mailbox.hpp) shared with world rank
  /// `r`: `out` written by this rank, `in` by r; `segment` keeps them mapped. All null
  /// until r's shared memory is attached (and always without it). Any thread.
  struct Mailboxes {
    std::shared_ptr<shm::Segment> segment;
    shm::Mailbox* out = nullptr;
    shm::Mailbox* in = nullptr;
  };
  Mailboxes mailboxes(int r) const;
  /// Why world rank `r`'s connection ended (Peer::gone_code and its reason: peer_closed when
  /// it closed in an orderly way), for waits that no operation state of the node covers
  /// (the mailboxes); nothing while it is up. Any thread.
  std::optional<std::pair<Errc, std::string>> departure(int r) const;
  /// Moves bytes through the shared-memory rings of every peer on this host; returns
  /// whether any moved. Engine lock held.
  bool poll_shm();
  /// start(): waits until every connected peer's shared-memory question is answered (at
  /// most kShmSettleLimit), so the first operations already run on shared memory.
  void wait_shm_settled();
  static constexpr std::chrono::milliseconds kShmSettleLimit{3000};
  /// No thread polls this node any more (Engine::set_watch_hooks): publishes that to
  /// same-host peers, and rings the engine for work that came meanwhile. Any thread.
  void stop_watching();
  /// Whether this node polls its rings now, as its same-host peers see it.
  ShmPresence& shm_presence() noexcept { return presence_; }
  /// Peers whose message lanes run through shared memory (world ranks; engine lock held).
  const std::vector<int>& shm_peers() const noexcept { return shm_peers_; }
  /// This node's host as a number (FNV-1a of shm::host_key()): equal for ranks that can
  /// share memory.
  std::uint64_t host_id() const noexcept { return host_id_; }

  /// Neighbours, routes and relaying (Config::topology). Its any-thread members may be
  /// called from any thread.
  const Routing& routing() const noexcept { return routing_; }

 private:
  /// Lets a waiter give `st` up (deadline or cancel()): on the engine, `withdraw` removes
  /// the operation if nothing has moved yet, and then it fails naming `peer_rank`.
  template <class Withdraw>
  void install_canceller(const std::shared_ptr<OpState>& st, int peer_rank, const char* on_timeout,
                         const char* on_cancel, Withdraw withdraw) {
    st->canceller = [weak = weak_from_this(), raw = st.get(), st_weak = std::weak_ptr<OpState>(st),
                     peer_rank, on_timeout, on_cancel, withdraw](Errc code) {
      auto self = weak.lock();
      if (!self) return;
      if (self->engine_.stopped()) {
        // Nothing will run posted work any more: the operation can only be given up.
        if (auto s = st_weak.lock()) self->fail(s, Errc::closed, peer_rank, "communicator closed");
        return;
      }
      // The posted work holds a raw pointer: a shared_ptr there could make the engine
      // thread drop the last reference and destroy (and join) itself. The engine is
      // stopped before Node is destroyed, so queued work never outlives it.
      Node* node = self.get();
      node->engine_.post([node, raw, st_weak, peer_rank, on_timeout, on_cancel, withdraw, code] {
        auto s = st_weak.lock();
        if (!s || s->done()) return;
        bool withdrawn = false;
        if constexpr (std::is_invocable_v<Withdraw, Node&, OpState*, Errc>)
          withdrawn = withdraw(*node, raw, code);
        else
          withdrawn = withdraw(*node, raw);
        if (withdrawn) node->fail(s, code, peer_rank, code == Errc::timeout ? on_timeout : on_cancel);
      });
    };
  }
  /// Submissions keep their order: nothing runs inline while earlier ones wait in the
  /// engine's queue.
  template <class F>
  void submit(F&& f) {
    std::unique_lock lk(engine_.lock(), std::try_to_lock);
    if (lk.owns_lock() && ep_ && is_open() && queued_.load(std::memory_order_relaxed) == 0) {
      quic::Endpoint::Batch batch(*ep_);
      f();
      return;
    }
    if (lk.owns_lock()) lk.unlock();
    queued_.fetch_add(1, std::memory_order_relaxed);
    engine_.post([this, f = std::forward<F>(f)]() mutable {
      queued_.fetch_sub(1, std::memory_order_relaxed);
      f();
    });
  }
  void drain_then_shutdown(std::chrono::steady_clock::time_point until,
                           const std::shared_ptr<OpState>& done, bool said_goodbye = false);
  // ---- PeerOwner: what only the node's Peers call ----
  /// Config::lazy_connect: dials world rank `r` unless a connection to it exists or is being
  /// set up, or it is gone. Engine lock held.
  void connect_lazily(int r) override;
  /// Our dial to `r` was refused in a simultaneous open (`attempt` times so far): its own
  /// dial is on the way; dial again in a few milliseconds should it not have arrived.
  void redial_later(int r, int attempt) override;
  /// A peer's connection works both ways now. Engine lock held.
  void on_peer_up(Peer& p) override;
  /// A peer went away: fail receives that can only be satisfied by it.
  void on_peer_closed(Peer& p) override;
  /// An agree or decided frame arrived from `from`. Engine lock held.
  void on_ballot(int from, const wire::FrameHeader& h, wire::Ballot b) override;
  void on_shm_offer(Peer& p, std::string_view payload) override;
  void on_tcp_offer(Peer& p, std::uint16_t port, std::uint64_t cipher) override;
  void on_shm_attached(int rank, const ShmLink& link) override;
  /// The shared-memory path (Config::shm): `p` is up, `p` offered, `rank`'s lanes moved.
  void offer_shm(Peer& p);
  /// A peer dialled a shard and its certificate names `node`: keep it as an extra
  /// connection of that pair, or close it.
  void adopt_stripe(Hosted& h, const std::string& node);

  // Matching::Owner, Routing::Owner and Failures::Owner (the rest are public members).
  void revoke_everywhere(std::uint64_t id, const std::string& why) override { failures_.revoke_everywhere(id, why); }
  bool is_failed(int r) const override { return failures_.is_failed(r); }
  bool judging_failures() const noexcept override { return failures_.judging(); }
  MembershipLanes* membership() const noexcept override { return membership_.get(); }

  static thread_local Node* t_scope_;
  static thread_local bool t_scope_asleep_;
  /// Dials world rank `r` (engine thread).
  void dial(int r);
  /// The Peer of world rank `r`, whose name and address are known.
  std::unique_ptr<Peer> make_peer(int r);

  Config cfg_;
  int rank_;
  std::atomic<int> world_;
  bool elastic_;
  bool late_;
  std::vector<std::string> names_;
  std::vector<quic::Address> addrs_;
  std::unique_ptr<tls::TlsContext> tls_;
  BufferPool pool_;
  ShmPresence presence_;  // outlives the engine: its hooks run on user threads until the end
  Engine engine_;
  Routing routing_;  // after engine_ and pool_: it is given them
  std::unique_ptr<quic::Endpoint> ep_;
  // The extra engine threads (Config::engine_threads), hosting extra connections.
  std::vector<std::unique_ptr<Shard>> shards_;
  std::vector<std::unique_ptr<Peer>> peers_;
  std::unique_ptr<ShmHub> shm_;  // when Config::shm
  std::unique_ptr<TcpHub> tcp_;  // made by the first offer made or received
  bool socket_busy_ = false;         // poll(): the last read of the socket found packets
  std::uint32_t socket_skips_ = 0;   // poll(): calls that could skip the socket
  std::vector<int> shm_peers_;
  mutable std::mutex mailbox_mu_;
  std::vector<Mailboxes> mailboxes_;  // by world rank, under mailbox_mu_
  std::map<int, std::pair<Errc, std::string>> departed_;  // under mailbox_mu_
  std::uint64_t host_id_ = 0;
  // The match queues and the collectives running here (after rank_: it is given it).
  Matching matching_{*this, rank_};
  std::unique_ptr<quic::ConnectionHandler> router_;
  std::shared_ptr<RpcLanes> rpc_;
  std::shared_ptr<MembershipLanes> membership_;
  // Failed ranks and revoked communicators (after matching_ and routing_: it is given them).
  Failures failures_;
  Joiners joiners_;  // after failures_: it is given it
  std::mutex closers_mu_;
  std::vector<std::function<void()>> closers_;  // under closers_mu_
  std::atomic<bool> closed_{false};
  std::atomic<int> queued_{0};  // submissions posted to the engine and not yet run
  int udp_fd_;
};

}  // namespace nexar::detail
