// Matching messages with receives, for one node: the match queue of each message domain
// (data, bulk, collective: transport/match_queue.hpp), the registry of the collectives
// running here (transport/call_registry.hpp), and what happens when a receive meets its
// message: the message is copied in, completes the receive, asks a rendezvous sender for its
// data, or shows that the ranks called different collectives.
//
// Peers hand it what arrives (transport/peer.cpp), the node posts receives (Node::irecv), and
// it reaches its node through Matching::Owner alone, so the unit tests of Peer run it as it is
// (tests/peer_test.cpp). Engine thread only; the registry also has its own lock, since user
// threads start and end collectives.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include <nexar/error.hpp>

#include "engine/op_state.hpp"
#include "transport/call_registry.hpp"
#include "transport/match_queue.hpp"

namespace nexar::detail {

class Peer;

class Matching {
 public:
  /// What matching needs of its node.
  class Owner {
   public:
    /// World ranks known here.
    virtual int size() const noexcept = 0;
    /// The pair with world rank `r` (not this rank's own).
    virtual Peer* peer(int r) noexcept = 0;
    /// Fails `op` (unless done) with `code`, its message naming world rank `peer` and `why`.
    virtual void fail(const std::shared_ptr<OpState>& op, Errc code, int peer, std::string_view why) = 0;
    /// Revokes communicator `comm` here and on every member: its operations fail with
    /// Errc::invalid_argument and `why` (its ranks called different collectives).
    virtual void revoke_everywhere(std::uint64_t comm, const std::string& why) = 0;

   protected:
    ~Owner() = default;
  };

  /// `rank`: this node's world rank.
  Matching(Owner& owner, int rank) : owner_(owner), rank_(rank) {}

  MatchQueue& queue(Domain d) noexcept { return queues_[static_cast<int>(d)]; }
  const MatchQueue& queue(Domain d) const noexcept { return queues_[static_cast<int>(d)]; }
  /// Every domain's queue, in Domain order.
  std::span<MatchQueue, domain_count> queues() noexcept { return queues_; }
  /// The collectives running here, by communicator.
  CallRegistry& calls() noexcept { return calls_; }

  /// Receive `r` matched unexpected message `it` of domain `d` (whole, still arriving, or
  /// announced): copies what came, completes `r`, or asks the sender for the data.
  void deliver_unexpected(Domain d, const std::shared_ptr<RecvOp>& r,
                          std::list<std::shared_ptr<Unexpected>>::iterator it);
  /// A receive's message of `size` bytes from world rank `source` has landed (or was
  /// dropped): completes it, or fails it if the message does not fit, or (`r.exact`, a
  /// collective's) if its size differs, which revokes the communicator everywhere.
  void finish_recv(const RecvOp& r, int source, Tag tag, std::uint64_t size);
  /// Whether receive `r` and the message from world rank `source` matched to it belong to
  /// the same collective call: `theirs` is the fingerprint the message carries. If they do
  /// not, `r` fails, and so does every operation on its communicator on every member,
  /// each error naming both calls; the message is to be dropped.
  bool calls_agree(const RecvOp& r, int source, Tag tag, std::uint16_t theirs);
  /// A collective's message from world rank `source` with fingerprint `theirs` (not 0)
  /// arrived and no receive awaits it. If its collective shows the ranks disagree, the
  /// communicator is revoked everywhere and the message is to be dropped: returns false.
  bool unawaited(std::uint64_t comm, int source, Tag tag, std::uint16_t theirs);
  /// The message receive `r` had matched was withdrawn by its sender: matches it again,
  /// ahead of the receives posted after it.
  void repost(Domain d, std::shared_ptr<RecvOp> r);

 private:
  Owner& owner_;
  int rank_;
  MatchQueue queues_[domain_count];
  CallRegistry calls_;
};

}  // namespace nexar::detail
