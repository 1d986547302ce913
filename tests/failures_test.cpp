// transport/failures.*: worlds of MemoryNodes (memory_node.hpp), each running the real
// Failures, joined by in-memory links. No socket, TLS or engine thread; every test runs in
// milliseconds.
//
// Checked: a declaration reaches every rank of a ring through the neighbours' floods and
// revokes exactly the communicators that contain the rank, failing their receives in the
// communicator's numbering; a rank the others gave up on is expelled from everything; a
// revocation reaches the members and nobody else, with the application's code or a
// disagreement's words; revocations and failures that came before a communicator apply
// when it is watched.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "memory_node.hpp"

using namespace nexar;
using detail::Domain;
using detail::OpState;
using detail::RecvOp;
using test::MemoryNode;
using test::MemoryWorld;

namespace {

// What a communicator's listener heard: "<world rank> <code>" per event.
struct Heard {
  std::vector<std::string> events;
  detail::Failures::CommListener listener() {
    return [this](int r, Errc code, const std::string&) { events.push_back(std::to_string(r) + " " + to_string(code)); };
  }
};

// A receive on communicator `comm` from world rank `source`, posted at `n`.
std::shared_ptr<RecvOp> pending(MemoryNode& n, std::uint64_t comm, int source, std::vector<std::byte>& out) {
  return n.post_recv(Domain::data, comm, source, 1, out);
}

std::shared_ptr<OpState> new_op() {
  return std::make_shared<OpState>("barrier", OpState::Clock::now() + std::chrono::hours(1));
}

Config ring() {
  Config c;
  c.topology = Topology::parse("k_regular:2");
  return c;
}

// Rank 0 of a ring of 7 declares rank 3 failed. The news goes from neighbour to neighbour
// (nobody is linked to more than two): every rank learns it. Communicator A holds everyone,
// B = {1, 3, 5} (rank 3 is its member 1), C = {0, 6} holds no 3.
TEST(Failures, ADeclarationReachesEveryRankAndRevokesWhatHoldsIt) {
  MemoryWorld w(7, 1, ring());
  constexpr std::uint64_t A = 10, B = 11, C = 12;
  std::vector<Heard> heard(7);
  std::vector<std::vector<std::byte>> outs(7, std::vector<std::byte>(8));
  std::vector<std::shared_ptr<RecvOp>> in_a, in_b, in_c;
  for (int r = 0; r < 7; ++r) {
    auto& n = w.node(r);
    n.failures.start_liveness();
    n.failures.watch(A, {0, 1, 2, 3, 4, 5, 6}, r, heard[static_cast<std::size_t>(r)].listener());
    if (r != 3) in_a.push_back(pending(n, A, (r + 1) % 7, outs[static_cast<std::size_t>(r)]));
  }
  for (int r : {1, 5}) {
    w.node(r).failures.watch(B, {1, 3, 5}, r == 1 ? 0 : 2, {});
    in_b.push_back(pending(w.node(r), B, r == 1 ? 5 : 1, outs[static_cast<std::size_t>(r)]));
  }
  std::vector<std::byte> out_c(8);
  w.node(0).failures.watch(C, {0, 6}, 0, {});
  in_c.push_back(pending(w.node(0), C, 6, out_c));

  w.node(0).failures.declare_failed(3, "it stopped answering");
  w.run();

  for (int r = 0; r < 7; ++r) {
    if (r == 3) continue;
    EXPECT_TRUE(w.node(r).failures.is_failed(3)) << "rank " << r << " never heard";
    EXPECT_FALSE(w.node(r).failures.is_failed(2)) << r;
    EXPECT_EQ(heard[static_cast<std::size_t>(r)].events, (std::vector<std::string>{"3 rank_failed"})) << r;
    EXPECT_TRUE(w.node(r).failures.revoked(A)) << r;
    EXPECT_TRUE(w.peer(r, 3).gone()) << r;
  }
  EXPECT_FALSE(w.node(3).failures.is_failed(3)) << "the failed rank is told nothing";
  for (const auto& r : in_a) {
    ASSERT_TRUE(r->op->done());
    EXPECT_EQ(r->op->code(), Errc::rank_failed);
    EXPECT_NE(r->op->message().find("rank 3 failed"), std::string::npos) << r->op->message();
  }
  for (const auto& r : in_b) {
    ASSERT_TRUE(r->op->done());
    EXPECT_NE(r->op->message().find("rank 1 (world rank 3) failed"), std::string::npos) << r->op->message();
  }
  EXPECT_FALSE(in_c[0]->op->done()) << "a communicator without rank 3 goes on";
  EXPECT_FALSE(w.node(0).failures.revoked(C));
  // An operation submitted before and run after the revocation fails the same way.
  auto late = new_op();
  EXPECT_TRUE(w.node(5).failures.fail_if_revoked(B, late));
  EXPECT_EQ(late->code(), Errc::rank_failed);
  // Rank 5 heard it from a neighbour, which heard it from 0: each hop says who told it.
  EXPECT_NE(late->message().find("rank 1 (world rank 3) failed: reported by rank "), std::string::npos)
      << late->message();
  EXPECT_NE(late->message().find("reported by rank 0: it stopped answering"), std::string::npos) << late->message();
}

// Rank 1 tells rank 2 that the others gave up on it: rank 2 is out of every communicator,
// and cuts every peer off.
TEST(Failures, ARankTheOthersGaveUpOnIsExpelled) {
  MemoryWorld w(4, 2);
  Heard heard;
  w.node(2).failures.watch(20, {0, 1, 2, 3}, 2, heard.listener());
  w.node(2).failures.watch(21, {2, 3}, 0, {});
  std::vector<std::byte> out(4);
  auto r = pending(w.node(2), 21, 3, out);
  w.node(2).failures.on_failed_notice(1, 2, "silent for 3000 ms");
  EXPECT_TRUE(w.node(2).failures.expelled());
  EXPECT_EQ(heard.events, (std::vector<std::string>{"2 rank_failed"}));
  ASSERT_TRUE(r->op->done());
  EXPECT_EQ(r->op->code(), Errc::rank_failed);
  EXPECT_NE(r->op->message().find("this rank was declared failed by rank 1: silent for 3000 ms"), std::string::npos)
      << r->op->message();
  for (int o : {0, 1, 3}) EXPECT_TRUE(w.peer(2, o).gone()) << o;
  EXPECT_FALSE(w.node(2).failures.is_failed(1)) << "nobody else is declared";
}

// Rank 2 revokes communicator X = {0, 2, 4} of a full mesh of 5: its members' operations
// fail with Errc::revoked naming rank 2; ranks 1 and 3 hear nothing. A revocation with words
// (two members called different collectives) fails them with those words instead.
TEST(Failures, ARevocationReachesTheMembersAndNobodyElse) {
  for (const std::string why : {"", "rank 0 called all_reduce where rank 2 called broadcast"}) {
    MemoryWorld w(5, 3);
    constexpr std::uint64_t X = 30;
    std::vector<std::vector<std::byte>> outs(5, std::vector<std::byte>(4));
    std::vector<std::shared_ptr<RecvOp>> rs;
    for (int r : {0, 2, 4}) {
      w.node(r).failures.watch(X, {0, 2, 4}, r / 2, {});
      rs.push_back(pending(w.node(r), X, (r + 2) % 6, outs[static_cast<std::size_t>(r)]));
    }
    w.node(2).failures.revoke_everywhere(X, why);
    w.run();
    for (int r : {0, 2, 4}) EXPECT_TRUE(w.node(r).failures.revoked(X)) << r;
    for (int r : {1, 3}) EXPECT_FALSE(w.node(r).failures.revoked(X)) << r << " is no member";
    for (const auto& r : rs) {
      ASSERT_TRUE(r->op->done());
      if (why.empty()) {
        EXPECT_EQ(r->op->code(), Errc::revoked);
        EXPECT_NE(r->op->message().find("communicator revoked by rank 2"), std::string::npos) << r->op->message();
      } else {
        EXPECT_EQ(r->op->code(), Errc::invalid_argument);
        EXPECT_NE(r->op->message().find(why), std::string::npos) << r->op->message();
      }
    }
    for (int r = 0; r < 5; ++r) EXPECT_FALSE(w.node(r).failures.is_failed(2)) << "a revocation fails nobody";
  }
}

// A revocation that arrives before the communicator is made here (a split still under way
// on this rank), and a member that failed before it was made: each applies once it is
// watched.
TEST(Failures, WhatCameBeforeACommunicatorAppliesWhenItIsWatched) {
  MemoryWorld w(3, 4);
  auto& n = w.node(0);
  n.failures.on_revoke_notice(1, 40, Errc::revoked, "");
  EXPECT_TRUE(n.failures.revoked(40));
  Heard heard;
  n.failures.watch(40, {0, 1, 2}, 0, heard.listener());
  EXPECT_EQ(heard.events, (std::vector<std::string>{"-1 revoked"}));
  auto op = new_op();
  EXPECT_TRUE(n.failures.fail_if_revoked(40, op));
  EXPECT_EQ(op->code(), Errc::revoked);
  EXPECT_NE(op->message().find("communicator revoked by rank 1"), std::string::npos) << op->message();

  n.failures.declare_failed(2, "killed");
  Heard later;
  n.failures.watch(41, {2, 0}, 1, later.listener());
  EXPECT_EQ(later.events, (std::vector<std::string>{"2 rank_failed"}));
  auto op2 = new_op();
  EXPECT_TRUE(n.failures.fail_if_revoked(41, op2));
  EXPECT_NE(op2->message().find("rank 0 (world rank 2) failed: it had failed before this communicator was made"),
            std::string::npos)
      << op2->message();
  EXPECT_FALSE(n.failures.fail_if_revoked(42, new_op())) << "a communicator nobody revoked";
}

}  // namespace
