// The state behind a Communicator handle: a set of world ranks on one node, with the id
// its frames carry. The world has id 0 and every rank; split() makes smaller ones. Ranks in
// the public API count within the communicator; the node works in world ranks. A
// CommunicatorImpl is also what its collectives see of it (CollectivePort): their messages
// travel on the collective lane, in its own matching space, and they run on its
// CollectiveRunner.
#pragma once

#include <nexar/communicator.hpp>

#include <array>
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <mutex>
#include <vector>

#include "collective/port.hpp"
#include "comm/notifier.hpp"
#include "comm/recorder.hpp"
#include "comm/watchdog.hpp"
#include "engine/wait_meter.hpp"
#include "membership/agreement.hpp"
#include "rpc/rpc.hpp"
#include "shm/mailbox.hpp"
#include "transport/node.hpp"

namespace nexar::detail {

class CollectiveRunner;
class Tracer;

class CommunicatorImpl final : public CollectivePort, public std::enable_shared_from_this<CommunicatorImpl> {
 public:
  /// The world communicator of `node` (every rank, id 0). It sets up the node's RPC, so call it
  /// before Node::start(): requests may arrive as soon as the mesh is up.
  static std::shared_ptr<CommunicatorImpl> world(std::shared_ptr<Node> node);
  /// What serves a node's communicators: its RPC, its agreement and its stall watchdog.
  struct Services {
    std::shared_ptr<Rpc> rpc;
    std::shared_ptr<Agreement> agreement;
    std::shared_ptr<Watchdog> watchdog;
    std::shared_ptr<Tracer> tracer;  // Config::trace set: the rank's trace; else null
  };
  /// Sets up the node's RPC, agreement and watchdog (before Node::start()), for a node
  /// whose first communicator is made later (a joiner's, from its welcome).
  static Services attach(Node& node);
  /// The services this communicator was made with, for the communicators made from it.
  Services services() const { return Services{rpc_, agreement_, watchdog_, tracer_}; }
  /// `members[i]` is the world rank of communicator rank i; `rank` is ours in the communicator; `s`
  /// serves the node. The communicator watches the failures of its members from the start, and
  /// its recorder is the watchdog's to look at and the members' to ask about.
  static std::shared_ptr<CommunicatorImpl> make(std::shared_ptr<Node> node, Services s, std::uint64_t id,
                                     std::vector<int> members, int rank);
  CommunicatorImpl(std::shared_ptr<Node> node, Services s, std::uint64_t id, std::vector<int> members, int rank);
  ~CommunicatorImpl();
  CommunicatorImpl(const CommunicatorImpl&) = delete;
  CommunicatorImpl& operator=(const CommunicatorImpl&) = delete;

  Node& node() const noexcept { return *node_; }
  Rpc& rpc() const noexcept { return *rpc_; }
  std::uint64_t id() const noexcept { return id_; }
  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return static_cast<int>(members_.size()); }
  const Config& config() const noexcept override { return node_->config(); }
  int world_of(int r) const noexcept { return members_[static_cast<std::size_t>(r)]; }
  const std::shared_ptr<const std::vector<int>>& local_of() const noexcept { return local_of_; }
  /// Communicator ranks, ascending, whose world rank has a direct connection to ours
  /// (Routing::direct). Throws Errc::closed once the communicator or the node is closed.
  std::vector<int> neighbours() const;
  std::vector<int> connected_peers() const;
  bool is_world() const noexcept { return id_ == 0; }

  /// Open until close() of this communicator or of the node.
  bool is_open() const noexcept;
  void close();

  /// Throw invalid_argument naming `op` and the value.
  void check_rank(const char* op, int r, bool allow_any) const;
  void check_tag(const char* op, int tag, bool allow_any) const;
  void check_open(const char* op) const;

  /// Point-to-point in communicator ranks with application tags (validated here), on the data or
  /// the bulk lane.
  Request isend(Domain d, const char* op, int dest, int tag, std::span<const ConstBuffer> parts);
  Request irecv(Domain d, const char* op, int source, int tag, void* data, std::size_t cap);

  // CollectivePort: what the communicator's collectives see of it.
  Request isend(const char* op, std::int64_t tag, Clock::time_point deadline, int to,
                const void* data, std::size_t bytes) override;
  Request irecv(const char* op, std::int64_t tag, Clock::time_point deadline, int from, void* data,
                std::size_t bytes) override;
  std::byte* scratch(int slot, std::size_t bytes) override;
  std::uint64_t host_id() const noexcept override { return node_->host_id(); }
  const std::vector<std::uint64_t>* hosts() const noexcept override { return hosts_ ? &*hosts_ : nullptr; }
  void set_hosts(std::vector<std::uint64_t> ids) override { hosts_ = std::move(ids); }
  Request start(const char* name, const CollectiveOptions& o, DataType t, ReduceOp op, CallShape shape,
                std::function<void(const Coll&)> body) override;
  // The mailboxes (comm/communicator_impl_mailboxes.cpp).
  std::optional<Ticket> mailboxes(const char* op, std::size_t bytes, const CollectiveOptions& o, bool blocking,
                                  std::uint16_t check, CallShape shape) override;
  void finished(const Ticket& t) noexcept override;
  void ran(const Ticket& t, bool ok) noexcept override;
  bool try_post(const Ticket& t, std::uint64_t part, int to, const void* data, std::size_t len) override;
  bool try_take(const Ticket& t, std::uint64_t part, int from, void* out, std::size_t len) override;
  const void* try_peek(const Ticket& t, std::uint64_t part, int from, std::size_t len) override;
  /// Mail from `from` for `t` was posted by another call, or has another length: revokes
  /// the communicator everywhere with the reason, and throws it (Errc::invalid_argument).
  [[noreturn]] void mail_disagrees(const Ticket& t, int from, const shm::Mailbox::Want& w);
  /// The take for `t` freed a message `from` posted for an earlier mailbox collective that
  /// this rank completed without taking it: unless a collective of the communicator failed here
  /// (whose messages are left behind legitimately), the ranks disagree on that call; as
  /// mail_disagrees.
  void mail_unwanted(const Ticket& t, int from, const shm::Mailbox::Want& w);
  void release(int from, const void* data) override;
  void idle(const Ticket& t, MailWait& w, int peer, bool taking) override;
  /// Collectives this rank ran through the mailboxes so far (tests look).
  std::uint64_t mailbox_collectives() const noexcept { return mailbox_seq_.load(std::memory_order_relaxed); }

  /// Collective: the members passing the same `color` form a new communicator ranked by (`key`,
  /// rank here); nullptr for a negative color.
  std::shared_ptr<CommunicatorImpl> split(int color, int key);

  // ---- failures (comm/communicator_impl_failures.cpp) ----------------------------------
  const std::vector<int>& members() const noexcept { return members_; }
  std::vector<int> failed_ranks() const;
  bool is_revoked() const noexcept { return revoked_.load(std::memory_order_acquire); }
  void on_failure(std::function<void(const std::vector<int>&)> fn);
  void revoke();
  Communicator::Agreement agree(const char* op, std::uint64_t value);
  std::shared_ptr<CommunicatorImpl> shrink();
  // ---- elastic membership (comm/communicator_impl_membership.cpp) ----------------------
  /// Collective over the members: admits the joiners every live member is connected to
  /// and drops the members that call leave() and the failed ones, into a new communicator.
  std::shared_ptr<CommunicatorImpl> grow();
  /// This rank's side of the others' grow(): it leaves; returns once it is decided.
  void leave();
  /// Joiners ready for admission that this rank is connected to.
  int pending_joiners() const;
  /// Whether this communicator came from a join into a running job.
  bool joined_by_grow() const noexcept { return joined_by_grow_; }
  /// Marks this as the communicator a joiner was welcomed into (its handle came from join()):
  /// like a world communicator, closing it closes the node.
  void set_joined_by_grow() noexcept { joined_by_grow_ = true; }

  /// The communicator that calls go to: this one, or under FailurePolicy::automatic the
  /// survivors' communicator it was rebuilt into (rebuilding it first if it is revoked by a
  /// failure).
  CommunicatorImpl& current();

  /// Runs collectives of this communicator one after another on its own thread.
  CollectiveRunner& runner();
  /// This rank's flight recorder of the communicator's collectives.
  const Recorder& recorder() const noexcept { return *recorder_; }
  /// The recorder and the progress counts as JSON (Communicator::dump()).
  std::string dump() const;
  /// Communicator::stats().
  Stats stats() const;
  bool tracing() const noexcept override { return recorder_->tracing(); }
  /// Adds the step to the calling thread's wait meter, which the recorder hands the tracer.
  void step(const char* name, Clock::time_point from, Clock::time_point to) noexcept override;

  /// Counts the calling thread's blocking collective calls (Communicator::BlockingCall):
  /// a collective started while the count is positive is left to its caller to run.
  static void blocking_calls(int delta) noexcept;

 private:
  /// The other members, in this communicator's numbering, whose world rank `keep` accepts;
  /// throws Errc::closed (naming `op`) once this communicator or its node closed.
  std::vector<int> other_members(const char* op, const std::function<bool(int)>& keep) const;
  /// grow(), leave() and shrink(): one agreement on joiners (when `admit`), leavers and
  /// failures; nullptr for the leaving rank.
  std::shared_ptr<CommunicatorImpl> change_membership(const char* op, bool leaving, bool admit);
  /// Throws invalid_argument naming `op` under FailurePolicy::abort (agree and shrink).
  void check_recoverable(const char* op) const;
  /// A failure event of this communicator (Node::CommListener), engine lock held.
  void on_event(int failed_world, Errc code, const std::string& why);
  /// Throws the error that revoked the communicator, naming `op`.
  [[noreturn]] void throw_revoked(const char* op) const;
  /// A call that could use the mailboxes while the members have not agreed on them: at the
  /// 1st, 2nd, 4th ... such call it starts an agreement (a collective), and at the call after
  /// that it waits for it. Returns the bytes up to which they apply from this call on (0:
  /// not yet, or not every member shares memory with every other, or one turned it off).
  /// The agreement takes the timeout of `o`, the options of the call `op` that starts it; a
  /// failed agreement is thrown by the call that waits for it, naming that call.
  std::size_t vote_mailboxes(const char* op, const CollectiveOptions& o);
  /// start(), with the caller running the collective when it waits for it (`caller_waits`).
  Request start_task(const char* name, const CollectiveOptions& o, DataType t, ReduceOp op, CallShape shape,
                     std::function<void(const Coll&)> body, bool caller_waits);
  /// What a timeout of collective `number` adds to its error: " (<the stall report>)" if
  /// the watchdog made one, else nothing.
  std::string stall_note(std::uint64_t number) const;
  /// Under FailurePolicy::automatic: `r`'s failure, when thrown to the application, marks
  /// the failure seen (the next call rebuilds). Returns `r`.
  Request watch_for_failure(Request r);
  /// An application's send or receive: watched for stalls while it is open. Returns `r`.
  Request watch_for_stall(Request r, bool sending, int peer, int tag, std::uint64_t bytes);

  std::shared_ptr<Node> node_;
  std::shared_ptr<Rpc> rpc_;
  std::shared_ptr<Agreement> agreement_;
  std::shared_ptr<Watchdog> watchdog_;
  std::shared_ptr<Tracer> tracer_;
  std::shared_ptr<Recorder> recorder_;
  std::shared_ptr<PendingP2p> p2p_ = std::make_shared<PendingP2p>();
  std::uint64_t id_;
  std::vector<int> members_;
  std::shared_ptr<const std::vector<int>> local_of_;
  int rank_;
  std::atomic<bool> closed_{false};
  bool joined_by_grow_ = false;
  // The collectives' message counts (collective_message_tag in transport/match_queue.hpp):
  // per (operation tag, communicator rank of the neighbour), messages sent and receives posted so
  // far; and the fingerprint of each running collective's call (core/call_check.hpp), which
  // its messages carry. Any thread that runs a collective; forgotten when the operation ends.
  std::mutex messages_mu_;
  std::map<std::pair<Tag, int>, std::pair<std::uint64_t, std::uint64_t>> messages_;
  std::map<Tag, std::uint16_t> calls_;
  struct Message {
    Tag tag;             // the message's own tag
    std::uint16_t check; // its call's fingerprint, 0 if the operation has none
  };
  Message message(Tag tag, int peer, bool sending);
  void note_call(Tag tag, std::uint16_t check);
  // `ran`: it started (note_call); `ok`: and completed.
  void forget_messages(Tag tag, bool ran, bool ok);
  std::atomic<std::uint64_t> splits_{0};
  std::optional<std::vector<std::uint64_t>> hosts_;  // collective thread only
  std::mutex runner_mu_;
  std::unique_ptr<CollectiveRunner> runner_;
  // Failure state, written by on_event (engine) and read by any thread.
  mutable std::mutex fail_mu_;
  std::vector<int> failed_;  // communicator ranks, ascending
  std::atomic<bool> revoked_{false};
  // The application saw the revocation (an operation of this communicator threw it): only then
  // does FailurePolicy::automatic rebuild, so no call is moved to the new communicator unseen.
  mutable std::atomic<bool> seen_{false};
  Errc revoke_code_ = Errc::ok;
  int revoke_peer_ = -1;        // the failed rank that revoked it, in communicator ranks
  std::string revoke_detail_;   // what the errors say after the code
  // The application's failure callback. Shared with the communicator an automatic rebuild makes
  // (so replacing it on the rebuilt communicator replaces it here too) and with every run posted
  // to the notifier, which calls it under `mu`: a run queued before the callback was
  // replaced sees the replacement, and replacing waits for a running call to return.
  struct FailureCallback {
    std::recursive_mutex mu;  // the callback may replace itself
    std::function<void(const std::vector<int>&)> fn;
    std::atomic<bool> set{false};  // fn is not empty (read without mu by the engine)
  };
  std::shared_ptr<FailureCallback> on_failure_ = std::make_shared<FailureCallback>();
  Notifier notifier_;
  std::atomic<std::uint64_t> agreements_{0};
  std::mutex rebuild_mu_;
  std::shared_ptr<CommunicatorImpl> successor_;  // under FailurePolicy::automatic, once rebuilt
  // The mailbox path (comm/communicator_impl_mailboxes.cpp). Its collectives run one at a time per
  // rank, in the caller or on the collective thread, after a Ticket was issued under the
  // published limit; the boxes are set before the limit is published and never change
  // after, so they need no lock. The vote's state is touched only by the calling thread.
  std::atomic<std::uint64_t> mailbox_candidates_{0};  // calls that could have used it
  std::atomic<std::uint64_t> mailbox_seq_{0};         // calls that did
  // The last clock reading of a mailbox wait (idle()), the end time of a blocking mailbox
  // collective (ran()): they run one at a time per rank.
  std::atomic<Clock::rep> mail_clock_{0};
  WaitMeter mail_meter_;  // the running blocking mailbox collective's waits (caller thread)
  // The fingerprints of the last mailbox collectives by their seq: (seq << 16) | check at
  // [seq % size], written as each Ticket is issued (mail_unwanted names the call).
  std::array<std::atomic<std::uint64_t>, 64> mail_calls_{};
  std::atomic<std::size_t> mailbox_limit_{0};         // agreed bytes; 0 = not (yet)
  std::atomic<std::uint64_t> mailbox_queued_{0};      // non-blocking ones not finished
  std::vector<Node::Mailboxes> mailbox_boxes_;        // by communicator rank
  // Per communicator rank, this communicator's messages in its mailbox at most (try_post).
  std::vector<std::size_t> mailbox_used_;
  static constexpr std::size_t kMailboxShare = 8;
  // The agreement in flight (vote_mailboxes): started at call number pending_at_ (0: none).
  std::uint64_t mailbox_pending_at_ = 0;
  Request mailbox_pending_;
  std::uint64_t mailbox_vote_ = 0, mailbox_agreed_ = 0;
  std::vector<Node::Mailboxes> mailbox_offered_;
};

/// Id of a communicator split from `parent` at its `seq`-th split with `color`: a 64-bit mix of
/// the three, the same on every member, never 0. Shrinks and grows use it too, with colors
/// no split can pass (splits take colors >= 0).
inline constexpr int shrink_color = -2;
inline constexpr int grow_color = -3;
std::uint64_t split_id(std::uint64_t parent, std::uint64_t seq, int color) noexcept;

}  // namespace nexar::detail
