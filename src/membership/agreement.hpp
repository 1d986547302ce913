// Fault-tolerant agreement among the live members of a communicator (Communicator::agree,
// and inside shrink). The algorithm and its guarantee are in docs/ARCHITECTURE.md
// ("Agreement"); in short:
//
//  * The coordinator of a communicator is its lowest member not known failed here.
//  * Each member sends its contribution (value, the failed members it knows) for agreement
//    number k to its coordinator, and sends it again, with the last decision it holds, to
//    each new coordinator when the old one is declared failed.
//  * The coordinator decides once it holds a contribution for k from every member it does
//    not know failed: the AND of their values and every failed member it knows; for a
//    grow, also the joiners every one of them contributed (intersection) and the members
//    that contributed that they leave (union). A decision
//    it learns from anyone (a member that got it from a failed coordinator) it adopts
//    instead. It sends the decision to every live member.
//  * A member takes the first decision for k it receives, never one from a rank it knows
//    failed (those are cut off), and answers later contributions for k with it.
//
// Failure knowledge only grows and is spread by the transport, so the coordinators the
// members see converge on the lowest live member, which decides; a member contributes to a
// new coordinator only after the old one is cut off from it, so no two decisions for k are
// ever accepted by live members. Engine lock held for everything but run().
//
// It reaches its node only through AgreementOwner (membership/agreement_owner.hpp).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/op_state.hpp"
#include "membership/agreement_owner.hpp"
#include "transport/membership_lanes.hpp"
#include "wire/ballot.hpp"

namespace nexar::detail {

class Node;

class Agreement final : public MembershipLanes {
 public:
  explicit Agreement(AgreementOwner& owner) : owner_(owner) {}
  /// An Agreement on `node`, with the adapter it reaches the node through (kept alive with it).
  static std::shared_ptr<Agreement> over(Node& node);

  struct Result {
    std::uint64_t value = 0;
    std::vector<int> failed;   // world ranks, ascending
    std::vector<int> joiners;  // joiners every live member contributed, ascending
    std::vector<int> leaving;  // members that contributed that they leave, ascending
  };
  /// What this rank brings besides its value (grow and leave; empty for agree and shrink).
  struct Extra {
    std::vector<int> joiners;  // waiting joiners this rank is connected to, ascending
    bool leaving = false;      // this rank leaves the communicator
  };

  /// Runs agreement number `seq` of communicator `comm` (of world ranks `members`, ours
  /// being `rank` there) with `value`, and blocks until it is decided. `op` names it in
  /// errors. Throws nexar::Error: timeout after `timeout`, rank_failed when this rank was
  /// declared failed, closed. Any thread but the engine's.
  Result run(const char* op, std::uint64_t comm, const std::vector<int>& members, int rank, std::uint64_t seq,
             std::uint64_t value, std::chrono::milliseconds timeout, Extra extra);

  /// run()'s engine-side half: starts agreement number `seq` of communicator `comm` (of
  /// world ranks `members`) with `value`. `op` completes once it is decided, with `out`
  /// filled, or fails (rank_failed when this rank was expelled, closed). Engine lock held.
  void start(std::uint64_t comm, std::vector<int> members, std::uint64_t seq, std::uint64_t value, Extra extra,
             std::shared_ptr<OpState> op, std::shared_ptr<Result> out);

  // MembershipLanes (engine lock held)
  void on_ballot(int src, const wire::FrameHeader& h, wire::Ballot b) override;
  void on_rank_failed(int r) override;
  void on_rank_left(int r, const std::string& why) override;
  void on_expelled(const std::string& why) override;
  void on_close() override;

 private:
  struct Comm {
    std::vector<int> members;  // world ranks; empty until this rank starts an agreement
    // The agreement this rank waits for, if any.
    bool pending = false;
    std::uint64_t seq = 0;
    std::uint64_t value = 0;
    Extra extra;
    std::shared_ptr<OpState> op;
    std::shared_ptr<Result> out;
    // Decisions known here, by number (the last few).
    std::map<std::uint64_t, wire::Ballot> decided;
    // Contributions received, by number, then by world rank.
    std::map<std::uint64_t, std::map<int, wire::Ballot>> collected;
    int coordinator = -1;  // the coordinator our state last went to
  };

  int coordinator(const Comm& c) const;
  wire::Ballot contribution(const Comm& c) const;
  /// Sends this rank's state (last decision, pending contribution) to the coordinator.
  void send_state(std::uint64_t id, Comm& c);
  void try_decide(std::uint64_t id, Comm& c, std::uint64_t seq);
  /// Takes decision `b` for agreement `seq`: completes the waiter, and as coordinator
  /// passes it to every live member.
  void accept(std::uint64_t id, Comm& c, std::uint64_t seq, const wire::Ballot& b);
  /// Declares every rank `b` names failed that is not yet (news carried by a ballot).
  void learn_failures(const wire::Ballot& b, int from);

  AgreementOwner& owner_;
  std::map<std::uint64_t, Comm> comms_;
};

}  // namespace nexar::detail
