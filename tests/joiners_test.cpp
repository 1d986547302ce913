// transport/joiners.*: the joiners a member sees waiting, and the welcome a joiner waits
// for, with test nodes (memory_node.hpp) as their owners: no network, no membership
// service. Runs in milliseconds, but for the deadlines it checks (tens of milliseconds).
//
// Checked: the starting table's joiners, announced ones, and which of them are waiting
// (not failed, not admitted, not gone) or ready (connected); a welcome counts only when it
// names this rank and its sender, and only the first; wait_welcome returns once every
// member is connected, skips a failed member, and fails naming the member that left, the
// member never connected, the missing welcome, or the node's close.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "memory_node.hpp"

using namespace nexar;
using detail::Joiners;
using test::MemoryNode;
using test::MemoryWorld;

namespace {

using Clock = std::chrono::steady_clock;

std::string error_of(Joiners& j, std::chrono::milliseconds within) {
  try {
    j.wait_welcome(Clock::now() + within);
  } catch (const Error& e) {
    return std::string(to_string(e.code())) + ": " + e.what();
  }
  return "no error";
}

TEST(Joiners, AMemberSeesWhoWaitsAndWhoIsReady) {
  MemoryWorld w(5, 1);  // every pair linked: every peer is up
  auto& n = w.node(0);
  // The starting table names 2, 3, this rank and one beyond the world: 2 and 3 wait.
  Joiners j(n, 0, 5, false, {3, 0, 2, 7}, n.engine, n.failures);
  EXPECT_EQ(j.waiting(), (std::vector<int>{2, 3}));
  j.add(4);
  EXPECT_EQ(j.waiting(), (std::vector<int>{2, 3, 4}));
  EXPECT_EQ(j.ready(), (std::vector<int>{2, 3, 4}));
  EXPECT_EQ(j.connecting(), 0) << "no handshake is under way over in-memory links";
  n.failures.declare_failed(3, "killed");
  EXPECT_EQ(j.waiting(), (std::vector<int>{2, 4})) << "a failed joiner waits no more";
  j.admitted({2, 1});
  EXPECT_EQ(j.waiting(), (std::vector<int>{4}));
  j.left(4);
  EXPECT_TRUE(j.waiting().empty());
  EXPECT_TRUE(j.ready().empty());

  // Without links no peer is up: joiners wait, none is ready.
  MemoryNode alone(0, 3);
  Joiners k(alone, 0, 3, false, {1, 2}, alone.engine, alone.failures);
  EXPECT_EQ(k.waiting(), (std::vector<int>{1, 2}));
  EXPECT_TRUE(k.ready().empty());
}

TEST(Joiners, TheFirstWelcomeNamingThisRankAndItsSenderCounts) {
  MemoryWorld w(4, 2);
  auto& n = w.node(3);
  Joiners j(n, 3, 4, true, {}, n.engine, n.failures);
  j.on_welcome(0, 70, {0, 1, 2});     // does not name this rank: ignored
  j.on_welcome(1, 71, {0, 2, 3});     // does not name its sender: ignored
  j.on_welcome(2, 72, {0, 1, 2, 3});  // counts
  j.on_welcome(0, 73, {0, 3});        // a later one: ignored
  const auto got = j.wait_welcome(Clock::now() + std::chrono::seconds(5));
  EXPECT_EQ(got.comm, 72u);
  EXPECT_EQ(got.members, (std::vector<int>{0, 1, 2, 3}));

  // A member node that is no joiner takes no welcome.
  Joiners member(w.node(1), 1, 4, false, {}, w.node(1).engine, w.node(1).failures);
  member.on_welcome(0, 74, {0, 1});
  EXPECT_NE(error_of(member, std::chrono::milliseconds(20)).find("timeout"), std::string::npos);
}

TEST(Joiners, WaitingForTheWelcomeFailsNamingWhatIsMissing) {
  // No welcome at all.
  {
    MemoryNode n(2, 3);
    Joiners j(n, 2, 3, true, {}, n.engine, n.failures);
    const auto e = error_of(j, std::chrono::milliseconds(20));
    EXPECT_NE(e.find("timeout"), std::string::npos) << e;
    EXPECT_NE(e.find("no grow of the members took this rank in"), std::string::npos) << e;
  }
  // Welcomed, but a member never connected; or one beyond the table, never announced.
  {
    MemoryNode n(2, 3);
    Joiners j(n, 2, 3, true, {}, n.engine, n.failures);
    j.on_welcome(0, 80, {0, 1, 2});
    const auto e = error_of(j, std::chrono::milliseconds(20));
    EXPECT_NE(e.find("peer 0"), std::string::npos) << e;
    EXPECT_NE(e.find("welcomed, but this member never connected"), std::string::npos) << e;
  }
  {
    MemoryWorld w(3, 3);
    auto& n = w.node(2);
    Joiners j(n, 2, 3, true, {}, n.engine, n.failures);
    j.on_welcome(0, 81, {0, 1, 2, 5});
    const auto e = error_of(j, std::chrono::milliseconds(20));
    EXPECT_NE(e.find("the membership service never announced this member here"), std::string::npos) << e;
  }
  // A member left: the wait fails at once with its departure. A failed member is skipped.
  {
    MemoryWorld w(4, 4);
    auto& n = w.node(3);
    Joiners j(n, 3, 4, true, {}, n.engine, n.failures);
    j.on_welcome(0, 82, {0, 1, 2, 3});
    n.failures.declare_failed(1, "killed");
    EXPECT_EQ(j.wait_welcome(Clock::now() + std::chrono::seconds(5)).comm, 82u) << "failed member 1 is skipped";
    w.links.at({2, 3}).first->cut(Errc::peer_closed, "rank 2 closed");
    const auto t0 = Clock::now();
    const auto e = error_of(j, std::chrono::seconds(5));
    EXPECT_LT(Clock::now() - t0, std::chrono::seconds(1)) << "a departure is not waited out";
    EXPECT_NE(e.find("peer 2"), std::string::npos) << e;
    EXPECT_NE(e.find("a member of the communicator we were welcomed into: rank 2 closed"), std::string::npos) << e;
  }
}

TEST(Joiners, CloseEndsTheWait) {
  MemoryNode n(1, 2);
  Joiners j(n, 1, 2, true, {}, n.engine, n.failures);
  std::thread closer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    n.open = false;
    j.closing();
  });
  const auto t0 = Clock::now();
  const auto e = error_of(j, std::chrono::seconds(30));
  closer.join();
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(10));
  EXPECT_NE(e.find("closed: "), std::string::npos) << e;
}

}  // namespace
