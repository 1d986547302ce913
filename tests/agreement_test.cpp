// The agreement algorithm (src/membership/agreement.cpp) with no node, engine or socket:
// each member's Agreement talks through an AgreementOwner whose ballots go into one shared
// in-memory exchange. The exchange delivers them in an order drawn from a seed (first in,
// first out between any two ranks, as on the control lane), drops what a crashed rank would
// receive, and spreads failure declarations as the transport does (each member hears of one
// at its own time). Every case runs in milliseconds and checks what the algorithm promises:
// every live member takes the same decision, and the decision is the AND of the values of
// the members that contributed, with the failed ones named. (The schedules come from
// std::uniform_int_distribution, whose draws differ between standard libraries: another
// library runs other schedules, equally valid.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <utility>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "membership/agreement.hpp"

namespace {

using nexar::Errc;
using nexar::detail::Agreement;
using nexar::detail::AgreementOwner;
using nexar::detail::Engine;
using nexar::detail::OpState;
using nexar::wire::Ballot;
using nexar::wire::FrameHeader;
using nexar::wire::FrameType;

class Exchange;

// One rank's view: what it knows failed, and its agreement state machine.
class Member final : public AgreementOwner {
 public:
  Member(Exchange& x, int rank) : x_(x), rank_(rank), agreement(*this) {}

  int rank() const noexcept override { return rank_; }
  bool expelled() const noexcept override { return expelled_; }
  bool is_open() const noexcept override { return open; }
  bool is_failed(int r) const override { return known_failed.count(r) != 0; }
  bool peer_left(int r) override { return left.count(r) != 0; }
  void declare_failed(int r, const std::string& why) override;
  void send_ballot(int dest, FrameType type, std::uint64_t comm, std::uint64_t seq, const Ballot& b) override;
  // Agreement::run is not used here: the tests call its engine-side half, start().
  Engine& engine() noexcept override { std::abort(); }
  std::shared_ptr<OpState> new_op(const char*, std::chrono::milliseconds) override { std::abort(); }

  /// Takes the news that world rank `r` failed (the transport's failed notice).
  void learn_failed(int r) {
    if (r == rank_) {
      if (!expelled_) {
        expelled_ = true;
        agreement.on_expelled("this rank was declared failed by the others");
      }
      return;
    }
    if (!known_failed.insert(r).second) return;
    agreement.on_rank_failed(r);
  }

  /// Starts agreement `seq` of communicator `comm`.
  void start(std::uint64_t comm, const std::vector<int>& members, std::uint64_t seq, std::uint64_t value,
             Agreement::Extra extra = {}) {
    op = std::make_shared<OpState>("agree", std::chrono::steady_clock::now() + std::chrono::hours(1));
    out = std::make_shared<Agreement::Result>();
    agreement.start(comm, members, seq, value, std::move(extra), op, out);
  }

  Exchange& x_;
  const int rank_;
  bool expelled_ = false;
  bool open = true;
  bool crashed = false;  // takes part in nothing any more, says nothing
  std::set<int> known_failed;
  std::set<int> left;
  Agreement agreement;
  std::shared_ptr<OpState> op;
  std::shared_ptr<Agreement::Result> out;
};

// What is on its way: a ballot, or a member's news of a failure.
struct Event {
  int to;
  int from;  // the sender of a ballot; -1 for failure news
  FrameType type = FrameType::agree;
  std::uint64_t comm = 0;
  std::uint64_t seq = 0;
  Ballot ballot{};
  int failed = -1;  // for failure news
};

class Exchange {
 public:
  Exchange(int n, std::uint64_t seed) : rng_(seed) {
    for (int r = 0; r < n; ++r) members_.push_back(std::make_unique<Member>(*this, r));
  }

  Member& operator[](int r) { return *members_[static_cast<std::size_t>(r)]; }
  int size() const { return static_cast<int>(members_.size()); }

  void post(Event e) { pending_.push_back(std::move(e)); }

  /// Crashes world rank `r` now: nothing more from it or to it. Each live member hears of
  /// it later, at a time of the exchange's choosing (a failure detector's verdict).
  void crash(int r) {
    (*this)[r].crashed = true;
    announce(r, r);
  }

  /// Sends the news that `failed` failed to every member but `from`.
  void announce(int failed, int from) {
    for (int m = 0; m < size(); ++m)
      if (m != from) post({.to = m, .from = -1, .failed = failed});
  }

  /// Delivers one pending event, chosen at random; false when none is left. A ballot goes
  /// only after those sent before it between the same two ranks.
  bool step() {
    if (pending_.empty()) return false;
    std::uniform_int_distribution<std::size_t> pick(0, pending_.size() - 1);
    std::size_t i = pick(rng_);
    if (pending_[i].from >= 0)
      for (std::size_t j = 0; j < i; ++j)
        if (pending_[j].from == pending_[i].from && pending_[j].to == pending_[i].to) {
          i = j;
          break;
        }
    Event e = std::move(pending_[i]);
    pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
    ++delivered_;
    Member& to = (*this)[e.to];
    if (to.crashed) return true;
    if (e.from < 0) {
      to.learn_failed(e.failed);
    } else if (!to.is_failed(e.from)) {
      // What a rank sent before it crashed may still arrive, until the receiver hears it
      // failed: from then on its frames are cut off, as by the transport.
      FrameHeader h;
      h.type = e.type;
      h.comm = e.comm;
      h.seq = e.seq;
      to.agreement.on_ballot(e.from, h, std::move(e.ballot));
    }
    for (auto& [at, victim] : crashes_)
      if (delivered_ == at) crash(victim);
    return true;
  }

  /// Runs until nothing is pending (with a bound: a livelock fails the test).
  void run() {
    for (int i = 0; i < 100000 && step(); ++i) {
    }
    ASSERT_TRUE(pending_.empty()) << "the exchange never went quiet";
  }

  /// After `deliveries` deliveries (over the exchange's life), `victim` crashes.
  void crash_after(std::size_t deliveries, int victim) { crashes_.emplace_back(deliveries, victim); }

 private:
  std::mt19937_64 rng_;
  std::vector<std::unique_ptr<Member>> members_;
  std::vector<Event> pending_;
  std::size_t delivered_ = 0;
  std::vector<std::pair<std::size_t, int>> crashes_;  // (after how many deliveries, who)
};

void Member::declare_failed(int r, const std::string&) {
  learn_failed(r);
  x_.announce(r, rank_);
}

void Member::send_ballot(int dest, FrameType type, std::uint64_t comm, std::uint64_t seq, const Ballot& b) {
  if (crashed || is_failed(dest)) return;
  x_.post({.to = dest, .from = rank_, .type = type, .comm = comm, .seq = seq, .ballot = b});
}

std::vector<int> world(int n) {
  std::vector<int> v(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) v[static_cast<std::size_t>(r)] = r;
  return v;
}

// Every member that did not crash decided, successfully, and all took the same result.
// Returns that result.
Agreement::Result same_everywhere(Exchange& x) {
  const Agreement::Result* first = nullptr;
  for (int r = 0; r < x.size(); ++r) {
    Member& m = x[r];
    if (m.crashed) continue;
    EXPECT_TRUE(m.op->done()) << "rank " << r << " has no decision";
    if (!m.op->done()) continue;
    EXPECT_EQ(m.op->code(), Errc::ok) << "rank " << r << ": " << m.op->message();
    if (!first) {
      first = m.out.get();
      continue;
    }
    EXPECT_EQ(m.out->value, first->value) << "rank " << r;
    EXPECT_EQ(m.out->failed, first->failed) << "rank " << r;
    EXPECT_EQ(m.out->joiners, first->joiners) << "rank " << r;
    EXPECT_EQ(m.out->leaving, first->leaving) << "rank " << r;
  }
  return first ? *first : Agreement::Result{};
}

TEST(Agreement, EveryMemberDecidesTheAndOfAllValues) {
  for (int n = 1; n <= 9; ++n) {
    for (std::uint64_t seed = 0; seed < 8; ++seed) {
      SCOPED_TRACE("world " + std::to_string(n) + " seed " + std::to_string(seed));
      Exchange x(n, seed);
      std::mt19937_64 values(seed * 31 + static_cast<std::uint64_t>(n));
      std::uint64_t want = ~std::uint64_t{0};
      for (int r = 0; r < n; ++r) {
        const std::uint64_t v = values() | values();  // mostly ones, so the AND is not 0
        want &= v;
        x[r].start(7, world(n), 0, v);
      }
      x.run();
      const Agreement::Result got = same_everywhere(x);
      EXPECT_EQ(got.value, want);
      EXPECT_TRUE(got.failed.empty());
    }
  }
}

TEST(Agreement, SuccessiveAgreementsOnOneCommunicator) {
  Exchange x(5, 11);
  for (std::uint64_t seq = 0; seq < 6; ++seq) {
    SCOPED_TRACE("agreement " + std::to_string(seq));
    for (int r = 0; r < x.size(); ++r) x[r].start(3, world(5), seq, r == static_cast<int>(seq % 5) ? seq : ~0ull);
    x.run();
    EXPECT_EQ(same_everywhere(x).value, seq);
  }
}

// The coordinator waits for every live member: three that started decide nothing until the
// fourth starts, and the decision then holds its value too.
TEST(Agreement, StartedLateStillTakesTheDecision) {
  Exchange x(4, 5);
  for (int r = 0; r < 3; ++r) x[r].start(1, world(4), 0, 0xff);
  x.run();
  for (int r = 0; r < 3; ++r) EXPECT_FALSE(x[r].op->done()) << "decided without rank 3";
  x[3].start(1, world(4), 0, 0x0f);
  x.run();
  EXPECT_EQ(same_everywhere(x).value, 0x0fu);
}

// The value each rank of the crash cases brings: all ones but its own bit, so the decision
// shows exactly whose values it holds.
std::uint64_t value_of(int r) { return ~(std::uint64_t{1} << r); }

// The AND of the values of the ranks of a world of 5 that a decision does not name failed.
std::uint64_t and_without(const std::vector<int>& failed) {
  std::uint64_t v = ~std::uint64_t{0};
  for (int r = 0; r < 5; ++r)
    if (std::find(failed.begin(), failed.end(), r) == failed.end()) v &= value_of(r);
  return v;
}

// A member crashes at one of the first deliveries (or before it started), the coordinator
// among them: the survivors still take one decision. Either the one made before the crash
// (every value, nobody failed), or a later one that names the crashed rank and leaves its
// value out. Both kinds must come up among the crashes during the run.
TEST(Agreement, SurvivorsAgreeWhenAMemberCrashesAtAnyMoment) {
  int kept = 0, named = 0;  // crashes during the run, decided before / after them
  for (int victim : {0, 1, 4}) {
    for (std::uint64_t seed = 0; seed < 60; ++seed) {
      SCOPED_TRACE("victim " + std::to_string(victim) + " seed " + std::to_string(seed));
      Exchange x(5, seed);
      const std::size_t at = seed % 12;
      if (at == 0) x.crash(victim);
      else x.crash_after(at, victim);
      for (int r = 0; r < 5; ++r)
        if (!x[r].crashed) x[r].start(9, world(5), 0, value_of(r));
      x.run();
      const Agreement::Result got = same_everywhere(x);
      if (!got.failed.empty()) {
        EXPECT_EQ(got.failed, std::vector<int>{victim});
      }
      EXPECT_EQ(got.value, and_without(got.failed));
      if (at != 0) ++(got.failed.empty() ? kept : named);
    }
  }
  EXPECT_GT(kept, 0) << "no crash during a run came after the decision";
  EXPECT_GT(named, 0) << "no crash during a run came before the decision";
}

// The coordinator crashes, then its successor, each at one of the first deliveries: the
// decision a member holds must reach the next coordinator (the last decision goes first).
TEST(Agreement, SurvivorsAgreeWhenTwoCoordinatorsCrashInTurn) {
  int both = 0;
  for (std::uint64_t seed = 0; seed < 200; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Exchange x(5, seed);
    const std::size_t first = 1 + seed % 8;
    x.crash_after(first, 0);
    x.crash_after(first + 1 + (seed / 8) % 8, 1);
    for (int r = 0; r < 5; ++r) x[r].start(6, world(5), 0, value_of(r));
    x.run();
    const Agreement::Result got = same_everywhere(x);
    for (int f : got.failed) {
      EXPECT_TRUE(f == 0 || f == 1) << f;
    }
    EXPECT_EQ(got.value, and_without(got.failed));
    both += got.failed.size() == 2;
  }
  EXPECT_GT(both, 0) << "no case decided after both crashes";
}

TEST(Agreement, AMemberWhoseConnectionEndedIsLeftOut) {
  Exchange x(3, 2);
  for (int r = 0; r < 3; ++r) x[r].left.insert(2);
  x[2].crashed = true;  // it closed: it says nothing more
  x[0].start(4, world(3), 0, 6);
  x[1].start(4, world(3), 0, 3);
  x.run();
  const Agreement::Result got = same_everywhere(x);
  EXPECT_EQ(got.value, 2u);
  EXPECT_EQ(got.failed, std::vector<int>{2});
}

// A member whose connection ends while the others wait for it is declared failed, and the
// decision leaves it out.
TEST(Agreement, AMemberLeavingDuringTheAgreementIsLeftOut) {
  Exchange x(3, 6);
  x[0].start(8, world(3), 0, 6);
  x[1].start(8, world(3), 0, 3);
  x.run();
  ASSERT_FALSE(x[0].op->done());
  x[2].crashed = true;  // it closed without a word
  x[1].left.insert(2);
  x[1].agreement.on_rank_left(2, "connection closed");
  x.run();
  const Agreement::Result got = same_everywhere(x);
  EXPECT_EQ(got.value, 2u);
  EXPECT_EQ(got.failed, std::vector<int>{2});
}

TEST(Agreement, JoinersEveryoneSawAndMembersThatLeave) {
  Exchange x(4, 3);
  x[0].start(2, world(4), 0, 1, {.joiners = {4, 5, 6}, .leaving = false});
  x[1].start(2, world(4), 0, 1, {.joiners = {4, 6}, .leaving = true});
  x[2].start(2, world(4), 0, 1, {.joiners = {4, 5, 6}, .leaving = false});
  x[3].start(2, world(4), 0, 1, {.joiners = {4, 6, 7}, .leaving = true});
  x.run();
  const Agreement::Result got = same_everywhere(x);
  EXPECT_EQ(got.joiners, (std::vector<int>{4, 6}));
  EXPECT_EQ(got.leaving, (std::vector<int>{1, 3}));
}

TEST(Agreement, ExpelledAndClosedMembersFailTheirWait) {
  Exchange x(3, 4);
  for (int r = 0; r < 3; ++r) x[r].start(5, world(3), 0, 1);
  x[1].learn_failed(1);  // the others declared rank 1 failed
  ASSERT_TRUE(x[1].op->done());
  EXPECT_EQ(x[1].op->code(), Errc::rank_failed);
  x[2].agreement.on_close();
  ASSERT_TRUE(x[2].op->done());
  EXPECT_EQ(x[2].op->code(), Errc::closed);
  // A new agreement on an expelled member, or on a closed one, fails at once.
  x[1].start(5, world(3), 1, 1);
  ASSERT_TRUE(x[1].op->done());
  EXPECT_EQ(x[1].op->code(), Errc::rank_failed);
  x[0].open = false;
  x[0].start(5, world(3), 1, 1);
  ASSERT_TRUE(x[0].op->done());
  EXPECT_EQ(x[0].op->code(), Errc::closed);
}

}  // namespace
