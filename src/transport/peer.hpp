// One remote rank as seen from a node: the links that carry the pair's lanes (its first
// QUIC connection, extra connections, shared memory or relays: transport/link.hpp), the
// rule that picks one for each chunk (route), the incoming streams of every link (each with
// its own frame reader), and the rendezvous transfers in flight with it. Engine thread only.
#pragma once

#include <asio/steady_timer.hpp>

#include <atomic>
#include <functional>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nexar/communicator.hpp>
#include <nexar/stats.hpp>

#include "engine/buffer_pool.hpp"
#include "engine/op_state.hpp"
#include "quic/connection.hpp"
#include "transport/link.hpp"
#include "transport/match_queue.hpp"
#include "transport/peer_owner.hpp"
#include "transport/quic_link.hpp"
#include "transport/relay_link.hpp"
#include "transport/shm_link.hpp"
#include "transport/stripes.hpp"
#include "transport/tcp_link.hpp"
#include "wire/frame.hpp"

namespace nexar::detail {

/// A frame in a pooled buffer: `h` (its length set to the payload's) followed by `payload`.
PooledBuffer encode_frame(BufferPool& pool, wire::FrameHeader h, std::span<const std::byte> payload);

class Peer final : public quic::ConnectionHandler, private Stripes::Owner, private LinkOwner {
 public:
  Peer(PeerOwner& owner, const PeerContext& ctx, int rank, std::string name, quic::Address addr);
  /// Fails what still waits for a verdict (the node closed meanwhile).
  ~Peer();

  int rank() const noexcept { return rank_; }
  const std::string& name() const noexcept { return name_; }
  const std::string& addr_text() const noexcept { return addr_text_; }
  const quic::Address& addr() const noexcept { return addr_; }
  /// Readable from any thread: lets user threads fail sends to a gone peer at once.
  bool up() const noexcept { return state_.load(std::memory_order_acquire) == State::up; }
  bool gone() const noexcept { return state_.load(std::memory_order_acquire) == State::gone; }
  Errc gone_code() const noexcept { return gone_code_; }
  const std::string& gone_why() const noexcept { return gone_why_; }

  void attach(quic::Connection& c);
  quic::Connection* connection() const noexcept { return quic_.connection(); }

  /// Queues a whole frame (header + payload already in `buf`) on `lane`, over `via` if
  /// given (a link route() picked), else over the one route() picks for a small frame;
  /// `done`, if set, succeeds once the peer acknowledged it.
  void send_frame(wire::Lane lane, PooledBuffer buf, std::size_t len,
                  std::shared_ptr<OpState> done = {}, Link* via = nullptr);
  /// Queues a small frame on `lane`: header `h` (its length set to the payload's) followed
  /// by a copy of `payload`.
  void send_frame(wire::Lane lane, wire::FrameHeader h, std::span<const std::byte> payload);
  /// A message frame's header from this rank.
  wire::FrameHeader message_header(wire::FrameType type, std::uint64_t comm, Tag tag, std::uint64_t seq,
                                   std::uint64_t length, std::uint16_t check = 0) const;
  /// Queues a header-only frame.
  void send_header(wire::Lane lane, const wire::FrameHeader& h, Link* via = nullptr);
  /// Queues a payload straight from the caller's memory after its header; `op` succeeds
  /// when the peer acknowledged the last byte.
  void push_payload(wire::Lane lane, const std::vector<ConstBuffer>& parts,
                    const std::shared_ptr<OpState>& op, Link* via = nullptr);
  /// The routing rule: the link that the frames of a message of `bytes` on `lane` under
  /// `tag` take. In order: a link from outside the node (use_link); the relays, for a peer
  /// that is no neighbour; the first
  /// connection while it is not ready (the chunks wait there); the lane's shared-memory
  /// ring once it switched; for a collective message of 64 KiB or more, one of the pair's
  /// connections, round them by message (transport/stripes.hpp); else the first connection.
  /// A new carrier is a Link and a line here.
  Link& route(wire::Lane lane, Tag tag, std::uint64_t bytes);
  /// Starts a rendezvous send: announces it and keeps `parts` until the peer is ready.
  void start_rendezvous(Domain d, std::uint64_t comm, Tag tag, std::uint16_t check, std::vector<ConstBuffer> parts,
                        std::uint64_t size, std::shared_ptr<OpState> op);
  /// Sends a whole message as one eager frame whose payload is `parts` themselves (not a
  /// copy): `op` succeeds once the peer acknowledged the last byte.
  void send_eager_in_place(Domain d, std::uint64_t comm, Tag tag, std::uint16_t check, std::vector<ConstBuffer> parts,
                           std::uint64_t size, std::shared_ptr<OpState> op);
  /// Gives up on this peer from posted work (not inside packet processing): fails what is
  /// in flight with it and closes the connection, which releases every queued byte.
  void abort(const std::string& why);
  /// The peer cannot be reached any more, though nobody failed (the ranks it was relayed
  /// through closed): what is in flight with it fails with Errc::peer_closed, and so do later
  /// operations. Nothing is declared or told to other ranks.
  void lost(const std::string& why);
  /// Cancels a rendezvous send not yet under way; false if it already started.
  bool cancel_rendezvous(const OpState* op);
  /// A matched receive for an announced message: ask the peer for the data.
  void accept_rendezvous(Domain d, std::uint64_t seq, Tag tag, std::shared_ptr<RecvOp> r,
                         std::uint64_t size);
  /// Whether the receive `op` is matched with a message from this peer that is still
  /// arriving (its bytes land in the receive's buffer as they come, or a clear-to-send is
  /// out for it).
  bool receiving(const OpState* op) const;
  /// Returns credit held back for buffered unexpected bytes of domain `d` that were now
  /// consumed.
  void release_unexpected(Domain d, std::uint64_t bytes);
  /// Unacknowledged bytes on all outgoing lanes.
  std::uint64_t unacked() const;
  /// Orderly close: goodbye on the control lane.
  void say_goodbye();
  /// Sends a heartbeat on the control lane if nothing arrived from the peer and none was
  /// sent for `period` ns (`now` on the Endpoint clock).
  void heartbeat(std::uint64_t now, std::uint64_t period);
  /// Declared failed (by the node): fails what is in flight with it, refuses what comes,
  /// and closes the connection once the current packet processing is over.
  void cut_off(const std::string& why);
  /// Communicator `comm` was revoked: `fail` every operation of it in flight with this
  /// peer that can still be given up. Rendezvous sends not started are withdrawn (the
  /// peer's cts, if it comes, gets a cancelled rdata); receives whose data is still coming
  /// fail, and the rest of their data is dropped as it arrives.
  template <class Fail>
  void fail_comm(std::uint64_t comm, Fail&& fail) {
    for (auto& [seq, r] : rdv_out_) {
      if (r.comm == comm && !r.cancelled) {
        r.cancelled = true;
        r.parts.clear();
        fail(r.op);
      }
    }
    for (auto& m : rdv_in_)
      for (auto& [seq, r] : m)
        if (r.recv->comm == comm) fail(r.recv->op);
    for (auto& [id, st] : in_) {
      if (st->sink.kind == Sink::user && st->sink.recv->comm == comm) fail(st->sink.recv->op);
      if (st->sink.kind == Sink::unexpected && st->sink.unexp->waiter && st->sink.unexp->comm == comm)
        fail(st->sink.unexp->waiter->op);
    }
  }

  // quic::ConnectionHandler
  std::string on_peer_identity(quic::Connection& c, const std::string& node) override;
  void on_established(quic::Connection& c) override;
  void on_stream_data(quic::Connection& c, std::int64_t stream, const std::uint8_t* data,
                      std::size_t len) override;
  void on_closed(quic::Connection& c, Errc code, const std::string& why) override;

  /// The peer's hello arrived (it knows who we are and the world size matched).
  bool hello_seen() const noexcept { return hello_seen_; }

  // ---- lazy connections (Config::lazy_connect), engine thread ----
  /// What a rank says when it refuses a dial because its own dial to the same peer is
  /// under way (the lower rank's connection is the one a pair keeps).
  static constexpr std::string_view simultaneous_open = "simultaneous open";
  /// Whether our connection to the peer is one we dialled and the peer has not confirmed.
  bool dialling() const noexcept {
    const quic::Connection* c = quic_.connection();
    return c && !c->closed() && !c->is_server() && state_.load(std::memory_order_relaxed) == State::connecting;
  }
  /// Gives up our unconfirmed dial: the peer's own dial (arriving now) is kept instead.
  void abandon_dial();

  // ---- the shared-memory path (transport/shm_hub.hpp), engine thread ----
  /// An offer to share memory went out to the peer, or came from it and an attach is
  /// under way: its lanes may switch to shared memory (a shm_switch frame) any time now.
  void expect_shm() noexcept { shm_expected_ = true; }
  bool shm_expected() const noexcept { return shm_expected_; }
  /// Whether this connection's shared-memory question is answered: attached, failed,
  /// declined, or no offer made (Node::start waits for it, so a communicator starts warm).
  bool shm_settled() const noexcept { return shm_settled_; }
  void settle_shm() noexcept { shm_settled_ = true; }
  /// The attach failed before it was confirmed: the pair stays on QUIC. Should the peer
  /// have moved a lane anyway (its confirmation raced our failure), its messages would wait
  /// in memory nobody maps: the connection ends instead.
  void shm_failed();
  /// The segment is mapped on this side: move our message lanes onto it.
  void attach_shm(std::unique_ptr<ShmLink> link);
  /// Writes what waits for room in the rings out and reads the rings in. Returns whether
  /// anything moved.
  bool poll_shm();
  bool has_shm() const noexcept { return shm_ != nullptr; }

  /// The peer broke the protocol: it is gone, and its connection closes.
  void protocol_error(const std::string& why);

  // ---- extra connections (Config::connections_per_peer), engine thread ----
  /// Dials the extra connections this rank wants with the peer, once (the higher rank of
  /// a pair dials them, after the shared-memory question was answered without it).
  void dial_stripes(const Stripes::Dialer& dialer);
  /// An extra connection the peer dialled, its certificate checked: kept (empty), or why
  /// not. On the node's endpoint or on a shard's (Config::engine_threads).
  std::string accept_stripe(quic::Connection& c);
  std::string accept_stripe(Hosted& h);
  /// The ports of the peer's shards (a `ports` frame), where its extra connections go.
  const std::vector<std::uint16_t>& shard_ports() const noexcept { return shard_ports_; }
  /// Connections carrying this pair's collective messages now (1 + the active stripes).
  int collective_connections() const noexcept { return 1 + stripes_.active(); }
  /// Of those, the ones on a shard of this node (Config::engine_threads).
  int hosted_connections() const noexcept { return stripes_.hosted(); }
  /// Collective frames sent on the extra connections so far (diagnostics, tests).
  std::uint64_t striped_frames() const noexcept { return striped_; }
  /// The pair's path and lanes for Communicator::stats() (rank fields left to the caller).
  /// Engine lock held.
  PeerStats stats() const;

  // ---- the TCP link (transport/tcp_hub.hpp), engine thread ----
  /// A TCP connection for `a.lane` attached: our frames of that lane go on it from now on
  /// (after a tcp_switch on the lane's QUIC stream), and the peer's once it switched too.
  void attach_tcp(TcpAttached a);
  /// Reads what waits on the TCP link (a waiting user thread polls it, Node::poll).
  /// Returns whether anything came.
  bool poll_tcp();
  /// Lanes that moved to the TCP link both ways (0 .. 3; diagnostics, tests).
  int tcp_lanes() const noexcept { return tcp_ ? tcp_->lanes() : 0; }

  // ---- relaying (Routing makes a peer relayed: transport/routing.hpp), engine thread ----
  /// This rank is not our neighbour (Config::topology): every lane travels through relays,
  /// end to end over `link`. The peer counts as up from now on.
  void make_relayed(std::unique_ptr<RelayLink> link);
  /// Whether this peer is reached through relays (it has no connection of its own).
  bool relayed() const noexcept { return relay_ != nullptr; }
  RelayLink* relay_link() noexcept { return relay_.get(); }
  /// A segment of `lane`'s stream from this rank, at `offset`, reached us through relays.
  void relay_in(wire::Lane lane, std::uint64_t offset, const std::uint8_t* data, std::size_t len);

  // ---- a carrier from outside the node ----
  /// Carries every lane of the pair over `link` from now on, ahead of every other carrier
  /// (the routing rule's first line): a carrier the node does not build, such as the
  /// in-memory link of the unit tests. The pair counts as up. Returns what `link` hands its
  /// incoming bytes and its end to; `link` must outlive the Peer or be failed first.
  LinkOwner& use_link(Link& link);

 private:
  enum class State { connecting, up, gone };

  struct InStream;
  struct Sink {
    enum Kind { none, user, unexpected, rpc_request, rpc_response, hello, control, discard, relay } kind = none;
    std::shared_ptr<RecvOp> recv;  // user
    std::shared_ptr<Unexpected> unexp;
    std::vector<std::byte> bytes;  // rpc / hello payload
    PooledBuffer segment;          // relay: header and payload, forwarded or delivered whole
    std::uint64_t got = 0;
    bool truncated = false;
  };
  struct InStream {
    Link* link = nullptr;
    std::uint64_t stream = 0;  // the link's number for it
    wire::FrameReader reader;
    Sink sink;
    std::uint64_t deferred = 0;      // bytes held back while unexpected data is over budget
    std::uint64_t deferred_now = 0;  // of those, bytes deferred by the current delivery
    explicit InStream(std::uint64_t max) : reader(max) {}
  };
  struct RdvOut {
    Domain domain;
    std::uint64_t comm = 0;
    Tag tag = 0;
    std::vector<ConstBuffer> parts;
    std::uint64_t size = 0;
    std::shared_ptr<OpState> op;
    bool cancelled = false;
  };
  struct Reader;  // FrameReader handler

  /// Feeds `len` received bytes of `link`'s stream `stream` to its frame reader (LinkOwner).
  std::optional<std::uint64_t> on_link_data(Link& link, std::uint64_t stream, const std::uint8_t* data,
                                            std::size_t len) override;
  void on_link_closed(Link& link, Errc code, const std::string& why) override;
  /// Queues a chunk on `lane`, over `via` if given, else over route()'s pick for it.
  void push(wire::Lane lane, quic::Chunk c, Link* via = nullptr);
  bool on_header(InStream& s, const wire::FrameHeader& h);
  void on_payload(InStream& s, std::span<const std::byte> chunk);
  bool on_frame_end(InStream& s, const wire::FrameHeader& h);
  /// Closes the connection with `app_code` once the current call chain unwinds (ngtcp2's
  /// packet processing must not be re-entered), unless it closed by itself meanwhile.
  void close_later(std::uint64_t app_code, std::string why);
  /// Fails everything in flight with this peer; later operations fail at once.
  void mark_gone(Errc code, const std::string& why);
  /// What a queued chunk calls back: `buf` (if any) goes back to the pool, and `op` (if
  /// any) succeeds once the chunk is delivered (the peer acknowledged its last byte; on TCP,
  /// the kernel holds it). A failed chunk fails `op` later, on the engine thread, with the
  /// peer's verdict if it is gone by then (see chunk_done in peer.cpp).
  quic::Completion chunk_done(PooledBuffer buf, std::shared_ptr<OpState> op);
  /// A link that carried some of the pair's bytes ended by itself.
  void link_ended(Errc code, const std::string& why);
  /// The connection is up both ways: what waited for it goes out.
  void confirm();
  /// Forgets the connection (refused, or given up) while the peer stays connecting.
  void drop_connection();
  /// Why an extra connection from the peer is refused now; empty if it is taken.
  std::string stripe_refusal() const;
  // Stripes::Owner
  std::string on_stripe_identity(const std::string& node) override;
  void on_stripe_ready(bool hosted) override;
  std::optional<std::uint64_t> on_stripe_data(Link& link, std::uint64_t stream, const std::uint8_t* data,
                                              std::size_t len) override;
  void on_stripe_closed(Errc code, const std::string& why) override;

  PeerOwner& owner_;
  const PeerContext ctx_;
  int rank_;
  std::string name_;
  quic::Address addr_;
  std::string addr_text_;
  QuicLink quic_;
  quic::Connection* abandoned_ = nullptr;  // a dial given up, until it closed
  int refusals_ = 0;                       // dials refused by a simultaneous open
  std::atomic<State> state_{State::connecting};
  Errc gone_code_ = Errc::ok;
  std::string gone_why_;
  // Keyed by link and the link's number for the stream.
  std::map<std::pair<const Link*, std::uint64_t>, std::unique_ptr<InStream>> in_;
  std::uint64_t next_seq_ = 1;
  std::map<std::uint64_t, RdvOut> rdv_out_;
  struct RdvIn {
    std::shared_ptr<RecvOp> recv;
    std::uint64_t size = 0;
  };
  std::map<std::uint64_t, RdvIn> rdv_in_[domain_count];
  // Buffered unexpected bytes, per matching space, each bounded by Config::unexpected_limit:
  // with one shared budget, bulk data nobody received yet could use it all, and the
  // collective or data lane's credit would then be held back behind it.
  std::uint64_t unexpected_bytes_[domain_count] = {};
  bool hello_seen_ = false;
  std::uint64_t last_heartbeat_ = 0;
  std::unique_ptr<ShmLink> shm_;
  bool shm_expected_ = false;
  bool shm_settled_ = false;
  std::unique_ptr<TcpLink> tcp_;
  bool tcp_in_[TcpLink::kLanes] = {};  // the peer switched that lane to its TCP connection
  // A TCP connection's end waits this long for the QUIC connection to say why (an orderly
  // goodbye, or a declaration that we failed) before it counts as the peer failing.
  std::unique_ptr<asio::steady_timer> tcp_grace_;
  // Operations whose chunks failed while tcp_grace_ runs: they fail with the verdict
  // (mark_gone), not with the TCP link's words.
  std::vector<std::shared_ptr<OpState>> awaiting_verdict_;
  std::unique_ptr<RelayLink> relay_;
  Link* sole_ = nullptr;  // use_link()
  bool shm_in_[shm::Segment::lanes] = {};  // the peer switched that lane to its ring
  Stripes stripes_;
  bool stripes_dialled_ = false;
  std::vector<std::uint16_t> shard_ports_;
  std::uint64_t striped_ = 0;
  // Bytes queued out and read in per lane, over every link (frame headers included).
  std::uint64_t lane_out_[wire::lane_count] = {};
  std::uint64_t lane_in_[wire::lane_count] = {};

};

}  // namespace nexar::detail
