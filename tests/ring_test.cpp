// shm::Ring: the byte ring one direction of one lane of the shared-memory path runs on.
// Bytes come out as they went in, across the wrap; room and credit both hold the writer;
// the writer-waiting mark is never lost; indices the other process broke are reported.
#include <gtest/gtest.h>

#include <cstdint>
#include <atomic>
#include <cstdlib>
#include <random>
#include <thread>
#include <vector>

#include "shm/ring.hpp"

using nexar::shm::Ring;

namespace {

struct Memory {
  explicit Memory(std::size_t cap) : bytes(Ring::footprint(cap) + 64), ring(aligned(), cap) {}
  void* aligned() {
    auto p = reinterpret_cast<std::uintptr_t>(bytes.data());
    return reinterpret_cast<void*>((p + 63) & ~std::uintptr_t{63});
  }
  std::vector<std::uint8_t> bytes;
  Ring ring;
};

std::vector<std::uint8_t> random_bytes(std::size_t n, unsigned seed) {
  std::mt19937 g(seed);
  std::vector<std::uint8_t> v(n);
  for (auto& b : v) b = static_cast<std::uint8_t>(g());
  return v;
}

// Reads whatever is readable (both parts of a wrap) into `out`; returns the bytes read.
std::size_t drain(Ring& r, std::vector<std::uint8_t>& out) {
  std::size_t got = 0;
  for (int part = 0; part < 2; ++part) {
    bool broken = false;
    auto s = r.readable(broken);
    EXPECT_FALSE(broken);
    if (s.empty()) break;
    out.insert(out.end(), s.begin(), s.end());
    r.release(s.size());
    got += s.size();
  }
  return got;
}

}  // namespace

TEST(Ring, BytesComeOutInOrderAcrossTheWrap) {
  Memory m(64 * 1024);
  m.ring.init(1u << 30);
  const auto data = random_bytes(1'000'003, 1);  // not a multiple of the capacity
  std::vector<std::uint8_t> out;
  std::size_t sent = 0;
  std::mt19937 g(2);
  while (out.size() < data.size()) {
    // Writes and reads of odd sizes, so every offset of the wrap is crossed.
    const std::size_t want = std::min<std::size_t>(g() % 50'000 + 1, data.size() - sent);
    auto n = m.ring.write(data.data() + sent, want);
    ASSERT_GE(n, 0);
    sent += static_cast<std::size_t>(n);
    drain(m.ring, out);
  }
  EXPECT_EQ(out, data);
}

TEST(Ring, RoomAndCreditBothHoldTheWriter) {
  Memory m(64 * 1024);
  m.ring.init(100'000);
  const auto data = random_bytes(200'000, 3);
  EXPECT_EQ(m.ring.write(data.data(), data.size()), 64 * 1024) << "room is the capacity";
  EXPECT_EQ(m.ring.write(data.data(), data.size()), 0) << "full";
  EXPECT_EQ(m.ring.unread(), 64u * 1024);
  std::vector<std::uint8_t> out;
  drain(m.ring, out);
  EXPECT_EQ(m.ring.unread(), 0u);
  // Room again, but only 100000 - 65536 bytes of credit are left.
  EXPECT_EQ(m.ring.write(data.data(), data.size()), 100'000 - 64 * 1024);
  drain(m.ring, out);
  EXPECT_EQ(m.ring.write(data.data(), data.size()), 0) << "out of credit despite room";
  m.ring.grant(10);
  EXPECT_EQ(m.ring.write(data.data(), data.size()), 10);
}

TEST(Ring, WriterWaitingIsSeenOrRoomIsThere) {
  Memory m(64 * 1024);
  m.ring.init(1u << 30);
  const auto data = random_bytes(64 * 1024, 4);
  ASSERT_EQ(m.ring.write(data.data(), data.size()), 64 * 1024);
  EXPECT_FALSE(m.ring.wait_for_room()) << "full: the mark stays for the reader";
  EXPECT_TRUE(m.ring.take_writer_waiting());
  EXPECT_FALSE(m.ring.take_writer_waiting()) << "taken once";
  std::vector<std::uint8_t> out;
  drain(m.ring, out);
  EXPECT_TRUE(m.ring.wait_for_room()) << "room: write again instead of waiting";
}

// What a side about to sleep asks of a ring (transport/shm_presence.hpp): the reader whether
// bytes wait; the writer whether room came for the mark it left, which the reader may not
// have rung for. The mark can be read without taking it, and the writer takes back a mark
// it no longer needs.
TEST(Ring, ASideAboutToSleepSeesBytesAndRoomItWaitsFor) {
  Memory m(64 * 1024);
  m.ring.init(1u << 30);
  EXPECT_FALSE(m.ring.has_bytes());
  EXPECT_FALSE(m.ring.writer_waits_with_room()) << "no mark";
  const auto data = random_bytes(64 * 1024, 5);
  ASSERT_EQ(m.ring.write(data.data(), 10), 10);
  EXPECT_TRUE(m.ring.has_bytes());
  ASSERT_EQ(m.ring.write(data.data() + 10, data.size() - 10), static_cast<std::ptrdiff_t>(data.size() - 10));
  EXPECT_FALSE(m.ring.wait_for_room());
  EXPECT_TRUE(m.ring.writer_waiting());
  EXPECT_TRUE(m.ring.writer_waiting()) << "reading the mark leaves it";
  EXPECT_FALSE(m.ring.writer_waits_with_room()) << "full: nothing to write yet";
  std::vector<std::uint8_t> out;
  drain(m.ring, out);
  EXPECT_FALSE(m.ring.has_bytes());
  EXPECT_TRUE(m.ring.writer_waits_with_room()) << "room came for the mark";
  m.ring.clear_writer_waiting();
  EXPECT_FALSE(m.ring.writer_waiting());
  EXPECT_FALSE(m.ring.writer_waits_with_room());
  EXPECT_FALSE(m.ring.take_writer_waiting());
}

// A writer and a reader on two threads, the writer sleeping on the mark the way the
// transport does (here: spinning on a flag the reader sets when it takes the mark).
TEST(Ring, TwoThreadsMoveEveryByteWithoutLosingAWakeUp) {
  Memory m(64 * 1024);
  m.ring.init(1u << 30);
  const auto data = random_bytes(8'000'017, 5);
  std::atomic<int> wakeups{0};
  std::thread writer([&] {
    std::size_t sent = 0;
    int seen = 0;
    while (sent < data.size()) {
      auto n = m.ring.write(data.data() + sent, std::min<std::size_t>(data.size() - sent, 10'000));
      ASSERT_GE(n, 0);
      sent += static_cast<std::size_t>(n);
      if (n == 0 && !m.ring.wait_for_room()) {
        while (wakeups.load() == seen) std::this_thread::yield();
        seen = wakeups.load();
      }
    }
  });
  std::vector<std::uint8_t> out;
  out.reserve(data.size());
  while (out.size() < data.size()) {
    drain(m.ring, out);
    if (m.ring.take_writer_waiting()) wakeups.fetch_add(1);
  }
  writer.join();
  EXPECT_EQ(out, data);
}

TEST(Ring, BrokenIndicesAreReportedNotFollowed) {
  Memory m(64 * 1024);
  m.ring.init(1u << 30);
  // The other process owns the indices too: scribble a head far beyond the tail.
  auto* head = reinterpret_cast<std::atomic<std::uint64_t>*>(m.aligned());
  head->store(10u << 20);
  bool broken = false;
  EXPECT_TRUE(m.ring.readable(broken).empty());
  EXPECT_TRUE(broken);
  EXPECT_EQ(m.ring.write(reinterpret_cast<const std::uint8_t*>("x"), 1), -1);
  EXPECT_EQ(m.ring.unread(), 0u);
}
