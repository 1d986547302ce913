// shm::Mailbox: the slots that carry the small messages of blocking collectives between two
// ranks of a host. A message comes out as it went in, only for its own key and number;
// older messages of a key are dropped; a length the ranks disagree on is reported without
// copying; full slots hold the writer back; a sleeping waiter is woken through a second
// mapping of the memory (as another process maps it); writers and readers of several keys
// at once never mix their messages up; a message read in place keeps its slot until it is
// released; a key's messages are counted.
#include <gtest/gtest.h>

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "shm/segment.hpp"

using nexar::shm::Mailbox;
using nexar::shm::Segment;
using Take = Mailbox::Take;

namespace {

std::unique_ptr<Segment> make() { return Segment::create(Segment::min_ring, Segment::min_ring); }

Take take(Mailbox& m, std::uint64_t key, std::uint64_t seq, std::string& out, std::size_t want) {
  out.assign(want, '?');
  Mailbox::Want w{key, seq, 0, want};
  Take t = m.try_take(w, out.data());
  if (t == Take::wrong_length) out = std::to_string(w.len);
  return t;
}

}  // namespace

TEST(Mailbox, MessageComesOutOnceForItsKeyAndNumber) {
  auto seg = make();
  Mailbox& m = seg->mailbox(0);
  const std::uint32_t posted = m.posted();
  ASSERT_TRUE(m.try_post(7, 1, 0, "hello", 5));
  EXPECT_EQ(m.posted(), posted + 1);
  std::string out;
  EXPECT_EQ(take(m, 8, 1, out, 5), Take::absent);  // another key
  EXPECT_EQ(take(m, 7, 2, out, 5), Take::absent);  // not posted yet; number 1 is older: dropped
  EXPECT_EQ(take(m, 7, 1, out, 5), Take::absent);
  ASSERT_TRUE(m.try_post(7, 3, 0, "world", 5));
  const std::uint32_t taken = m.taken();
  EXPECT_EQ(take(m, 7, 3, out, 5), Take::taken);
  EXPECT_EQ(out, "world");
  EXPECT_EQ(m.taken(), taken + 1);
  EXPECT_EQ(take(m, 7, 3, out, 5), Take::absent);
  // The other direction is another mailbox.
  ASSERT_TRUE(seg->mailbox(1).try_post(7, 4, 0, "", 0));
  EXPECT_EQ(take(m, 7, 4, out, 0), Take::absent);
  EXPECT_EQ(take(seg->mailbox(1), 7, 4, out, 0), Take::taken);
}

TEST(Mailbox, LaterMessagesWaitAndOtherKeysStay) {
  auto seg = make();
  Mailbox& m = seg->mailbox(0);
  ASSERT_TRUE(m.try_post(1, 5, 0, "a", 1));
  ASSERT_TRUE(m.try_post(1, 6, 0, "b", 1));
  ASSERT_TRUE(m.try_post(2, 1, 0, "c", 1));
  std::string out;
  EXPECT_EQ(take(m, 1, 5, out, 1), Take::taken);
  EXPECT_EQ(out, "a");
  EXPECT_EQ(take(m, 2, 1, out, 1), Take::taken);
  EXPECT_EQ(out, "c");
  // Number 7 lands in the slot number 5 left, ahead of 6 in the reader's scan: taking 6
  // must leave it.
  ASSERT_TRUE(m.try_post(1, 7, 0, "d", 1));
  EXPECT_EQ(take(m, 1, 6, out, 1), Take::taken);
  EXPECT_EQ(out, "b");
  EXPECT_EQ(take(m, 1, 7, out, 1), Take::taken);
  EXPECT_EQ(out, "d");
}

TEST(Mailbox, WrongLengthIsReportedNotCopied) {
  auto seg = make();
  Mailbox& m = seg->mailbox(0);
  ASSERT_TRUE(m.try_post(3, 1, 0, "12345678", 8));
  std::string out;
  EXPECT_EQ(take(m, 3, 1, out, 4), Take::wrong_length);
  EXPECT_EQ(out, "8");
  EXPECT_EQ(take(m, 3, 1, out, 8), Take::absent);  // freed
  EXPECT_FALSE(m.try_post(3, 2, 0, std::string(Mailbox::kPayload + 1, 'x').data(), Mailbox::kPayload + 1));
  ASSERT_TRUE(m.try_post(3, 2, 0, std::string(Mailbox::kPayload, 'x').data(), Mailbox::kPayload));
  EXPECT_EQ(take(m, 3, 2, out, Mailbox::kPayload), Take::taken);
  EXPECT_EQ(out, std::string(Mailbox::kPayload, 'x'));
}

TEST(Mailbox, FullSlotsHoldTheWriterBack) {
  auto seg = make();
  Mailbox& m = seg->mailbox(0);
  for (std::uint64_t i = 1; i <= Mailbox::kSlots; ++i) ASSERT_TRUE(m.try_post(9, i, 0, &i, sizeof i)) << i;
  std::uint64_t x = 0;
  EXPECT_FALSE(m.try_post(9, Mailbox::kSlots + 1, 0, &x, sizeof x));
  Mailbox::Want w{9, 1, 0, sizeof x};
  ASSERT_EQ(m.try_take(w, &x), Take::taken);
  EXPECT_EQ(x, 1u);
  x = Mailbox::kSlots + 1;
  EXPECT_TRUE(m.try_post(9, x, 0, &x, sizeof x));
}

// A reader asleep on one mapping is woken by a post through another (the way two
// processes map the segment), well before its timeout.
TEST(Mailbox, SleeperIsWokenThroughAnotherMapping) {
  auto seg = make();
  auto other = Segment::open(::dup(seg->fd()));
  Mailbox& reader = seg->mailbox(0);
  Mailbox& writer = other->mailbox(0);
  std::thread w([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    writer.try_post(1, 1, 0, "x", 1);
  });
  const auto t0 = std::chrono::steady_clock::now();
  std::string out;
  for (;;) {
    const std::uint32_t seen = reader.posted();
    if (take(reader, 1, 1, out, 1) == Take::taken) break;
    reader.wait_posted(seen, std::chrono::seconds(20));
  }
  w.join();
  EXPECT_EQ(out, "x");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
}

// Two writer threads and two reader threads, one key each, through two mappings: every
// message arrives, in number order, with its own contents.
TEST(Mailbox, SeveralKeysAtOnceNeverMix) {
  auto seg = make();
  auto other = Segment::open(::dup(seg->fd()));
  constexpr std::uint64_t kCount = 20000;
  std::vector<std::thread> ts;
  std::array<std::string, 2> errors;
  // A lost message would leave its reader waiting: give up long after a healthy run ends.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (int k = 0; k < 2; ++k) {
    ts.emplace_back([&, k] {
      Mailbox& m = seg->mailbox(0);
      for (std::uint64_t i = 1; i <= kCount; ++i) {
        std::array<std::uint64_t, 4> msg{static_cast<std::uint64_t>(k), i, i * 3, ~i};
        for (;;) {
          const std::uint32_t seen = m.taken();
          if (m.try_post(static_cast<std::uint64_t>(k) + 100, i, 0, msg.data(), sizeof msg) ||
              std::chrono::steady_clock::now() > give_up)
            break;
          m.wait_taken(seen, std::chrono::milliseconds(10));
        }
      }
    });
    ts.emplace_back([&, k] {
      Mailbox& m = other->mailbox(0);
      for (std::uint64_t i = 1; i <= kCount; ++i) {
        std::array<std::uint64_t, 4> msg{};
        for (;;) {
          const std::uint32_t seen = m.posted();
          Mailbox::Want w{static_cast<std::uint64_t>(k) + 100, i, 0, sizeof msg};
          Take t = m.try_take(w, msg.data());
          if (t == Take::taken) break;
          if (t == Take::wrong_length || std::chrono::steady_clock::now() > give_up) {
            errors[static_cast<std::size_t>(k)] = "message " + std::to_string(i) + " lost or of a wrong length";
            return;
          }
          m.wait_posted(seen, std::chrono::milliseconds(10));
        }
        if (msg != std::array<std::uint64_t, 4>{static_cast<std::uint64_t>(k), i, i * 3, ~i}) {
          errors[static_cast<std::size_t>(k)] = "message " + std::to_string(i) + " wrong";
          return;
        }
      }
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
}

// try_peek leaves the message in its slot, readable in place, until release(); the slot
// is then free for the writer again. A wrong length is reported as try_take reports it.
TEST(Mailbox, PeekedMessageStaysUntilReleased) {
  auto seg = make();
  Mailbox& m = seg->mailbox(0);
  for (std::uint64_t i = 0; i < Mailbox::kSlots; ++i) ASSERT_TRUE(m.try_post(3, 10 + i, 0, "x", 1));
  EXPECT_EQ(m.count(3), Mailbox::kSlots);
  EXPECT_EQ(m.count(4), 0u);
  ASSERT_FALSE(m.try_post(3, 99, 0, "y", 1));  // full
  const void* data = nullptr;
  Mailbox::Want w{3, 10, 0, 1};
  ASSERT_EQ(m.try_peek(w, data), Take::taken);
  ASSERT_NE(data, nullptr);
  EXPECT_EQ(*static_cast<const char*>(data), 'x');
  EXPECT_FALSE(m.try_post(3, 99, 0, "y", 1));  // still held
  EXPECT_EQ(m.count(3), Mailbox::kSlots);
  const std::uint32_t taken = m.taken();
  m.release(data);
  EXPECT_EQ(m.taken(), taken + 1);
  EXPECT_EQ(m.count(3), Mailbox::kSlots - 1);
  ASSERT_TRUE(m.try_post(3, 99, 0, "y", 1));
  // Peeking number 12 drops number 11 (older); a wrong length frees the slot at once.
  w = {3, 12, 0, 2};
  EXPECT_EQ(m.try_peek(w, data), Take::wrong_length);
  EXPECT_EQ(w.len, 1u);
  EXPECT_EQ(m.count(3), Mailbox::kSlots - 2);
  std::string out;
  EXPECT_EQ(take(m, 3, 11, out, 1), Take::absent);
  EXPECT_EQ(take(m, 3, 13, out, 1), Take::taken);
}

// A message posted by another call (its fingerprint differs from the reader's) is refused
// and its slot freed; a reader or writer without one (0) compares nothing.
TEST(Mailbox, MailOfAnotherCallIsRefused) {
  auto seg = make();
  Mailbox& m = seg->mailbox(0);
  ASSERT_TRUE(m.try_post(5, 1, 0x8a48, "abcd", 4));
  char out[4] = {};
  Mailbox::Want w{5, 1, 0x8a50, 4};
  EXPECT_EQ(m.try_take(w, out), Take::wrong_call);
  EXPECT_EQ(w.theirs, 0x8a48u);
  EXPECT_EQ(out[0], 0) << "refused mail was copied";
  EXPECT_EQ(m.count(5), 0u);
  ASSERT_TRUE(m.try_post(5, 2, 0x8a48, "abcd", 4));
  const void* data = nullptr;
  w = {5, 2, 0x8a50, 4};
  EXPECT_EQ(m.try_peek(w, data), Take::wrong_call);
  EXPECT_EQ(m.count(5), 0u);
  ASSERT_TRUE(m.try_post(5, 3, 0x8a48, "abcd", 4));
  w = {5, 3, 0x8a48, 8};
  EXPECT_EQ(m.try_take(w, out), Take::wrong_length) << "the same call, another length";
  ASSERT_TRUE(m.try_post(5, 4, 0, "abcd", 4));
  w = {5, 4, 0x8a48, 4};
  EXPECT_EQ(m.try_take(w, out), Take::taken);
}
