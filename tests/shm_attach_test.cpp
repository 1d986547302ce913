// How two processes of a host come to share memory: the segment (shm/segment.*), the
// doorbell (shm/doorbell.*) and the attach handshake on an abstract Unix socket
// (shm/attach.*). A request with the right proof gets the segment and the listener's
// doorbell; a wrong proof, an unknown rank or another user's process gets nothing.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <atomic>
#include <optional>
#include <utility>
#include <thread>
#include <vector>

#include <nexar/error.hpp>

#include "shm/attach.hpp"
#include "shm/doorbell.hpp"
#include "shm/segment.hpp"

using namespace nexar;
using namespace std::chrono_literals;

namespace {

bool readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1;
}

template <class F>
Errc error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.code();
  }
  return Errc::ok;
}

// A listener that accepts rank 7 with `good`, handing out `seg` and `bell`.
struct Served {
  shm::Proof good{};
  std::unique_ptr<shm::Segment> seg = shm::Segment::create(64 * 1024, 1u << 20);
  shm::Doorbell bell;
  std::atomic<int> accepted{0};
  std::atomic<int> unconfirmed{0};
  std::optional<shm::Listener> listener;
  Served() {
    for (std::size_t i = 0; i < good.size(); ++i) good[i] = static_cast<std::uint8_t>(i * 7 + 1);
    listener.emplace([this](std::uint32_t rank, const shm::Proof& proof, int doorbell)
                         -> std::optional<shm::Listener::Answer> {
      ::close(doorbell);
      if (rank != 7 || !shm::same_proof(proof, good)) return std::nullopt;
      shm::Listener::Answer a;
      a.segment_fd = seg->fd();
      a.doorbell_fd = bell.fd();
      a.then = [this](bool confirmed) { ++(confirmed ? accepted : unconfirmed); };
      return a;
    });
  }
};

}  // namespace

TEST(Segment, TheOpenerSeesTheCreatorsRings) {
  auto a = shm::Segment::create(64 * 1024, 1u << 20);
  auto b = shm::Segment::open(::dup(a->fd()));
  const std::uint8_t msg[] = "through shared memory";
  ASSERT_EQ(a->ring(0, 2).write(msg, sizeof msg), static_cast<std::ptrdiff_t>(sizeof msg));
  bool broken = false;
  auto got = b->ring(0, 2).readable(broken);
  ASSERT_FALSE(broken);
  ASSERT_EQ(got.size(), sizeof msg);
  EXPECT_EQ(std::memcmp(got.data(), msg, sizeof msg), 0);
  // The other rings are separate.
  EXPECT_TRUE(b->ring(1, 2).readable(broken).empty());
  EXPECT_TRUE(b->ring(0, 1).readable(broken).empty());
}

// Each side's asleep word starts set (a writer rings until told otherwise), is shared
// between the two mappings, and lies apart from the rings.
TEST(Segment, EachSidesAsleepWordIsSharedAndStartsSet) {
  auto a = shm::Segment::create(64 * 1024, 1u << 20);
  auto b = shm::Segment::open(::dup(a->fd()));
  for (int side = 0; side < 2; ++side) {
    EXPECT_NE(a->asleep(side).load(), 0u) << "side " << side;
    EXPECT_NE(b->asleep(side).load(), 0u) << "side " << side;
  }
  a->asleep(0).store(0);
  EXPECT_EQ(b->asleep(0).load(), 0u);
  EXPECT_NE(b->asleep(1).load(), 0u) << "the sides' words are separate";
  b->asleep(1).store(0);
  EXPECT_EQ(a->asleep(1).load(), 0u);
  // The words are not in any ring's bytes or indices.
  const std::uint8_t msg[] = "x";
  for (int dir = 0; dir < 2; ++dir)
    for (int lane = 0; lane < shm::Segment::lanes; ++lane) {
      ASSERT_EQ(a->ring(dir, lane).write(msg, sizeof msg), static_cast<std::ptrdiff_t>(sizeof msg));
      EXPECT_TRUE(b->ring(dir, lane).has_bytes());
    }
  EXPECT_EQ(a->asleep(0).load(), 0u);
  EXPECT_EQ(a->asleep(1).load(), 0u);
}

// A populated segment is resident from the start in both processes' view (no page fault
// on the first pass through a ring); an unpopulated one only where it was touched.
TEST(Segment, APopulatedSegmentIsResidentFromTheStart) {
  const long page = ::sysconf(_SC_PAGESIZE);
  auto pages_in = [&](int fd) {
    struct stat st {};
    EXPECT_EQ(::fstat(fd, &st), 0);
    // Map it once more, unpopulated, and ask which pages the memfd holds.
    const auto size = static_cast<std::size_t>(st.st_size);
    void* m = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    EXPECT_NE(m, MAP_FAILED);
    std::vector<unsigned char> v((size + static_cast<std::size_t>(page) - 1) / static_cast<std::size_t>(page));
    EXPECT_EQ(::mincore(m, size, v.data()), 0);
    ::munmap(m, size);
    std::size_t n = 0;
    for (auto b : v) n += b & 1;
    return std::pair<std::size_t, std::size_t>{n, v.size()};
  };
  auto lazy = shm::Segment::create(1u << 20, 1u << 20);
  auto [lazy_in, lazy_all] = pages_in(lazy->fd());
  EXPECT_LT(lazy_in, lazy_all / 2) << "an unpopulated segment holds only the pages touched";
  auto eager = shm::Segment::create(1u << 20, 1u << 20, true);
  auto [eager_in, eager_all] = pages_in(eager->fd());
  EXPECT_EQ(eager_in, eager_all);
  // The opener may populate its own mapping too: the segment still works.
  auto opened = shm::Segment::open(::dup(eager->fd()), true);
  const std::uint8_t msg[] = "populated";
  ASSERT_EQ(eager->ring(1, 0).write(msg, sizeof msg), static_cast<std::ptrdiff_t>(sizeof msg));
  EXPECT_TRUE(opened->ring(1, 0).has_bytes());
}

TEST(Segment, RefusesWhatIsNotASealedSegment) {
  EXPECT_EQ(error_of([] { shm::Segment::create(100 * 1024, 1); }), Errc::invalid_argument);
  EXPECT_EQ(error_of([] { shm::Segment::create(32 * 1024, 1); }), Errc::invalid_argument);
  // The right size and header, but it could still shrink under us: refused.
  auto real = shm::Segment::create(64 * 1024, 1u << 20);
  int plain = ::memfd_create("not-sealed", MFD_CLOEXEC);
  struct stat st {};
  ASSERT_EQ(::fstat(real->fd(), &st), 0);
  std::vector<char> copy(static_cast<std::size_t>(st.st_size));
  ASSERT_EQ(::pread(real->fd(), copy.data(), copy.size(), 0), static_cast<ssize_t>(copy.size()));
  ASSERT_EQ(::pwrite(plain, copy.data(), copy.size(), 0), static_cast<ssize_t>(copy.size()));
  EXPECT_EQ(error_of([&] { shm::Segment::open(plain); }), Errc::protocol);
  // Sealed, but garbage.
  int junk = ::memfd_create("junk", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_EQ(::ftruncate(junk, 4096), 0);
  ASSERT_EQ(::fcntl(junk, F_ADD_SEALS, F_SEAL_SHRINK), 0);
  EXPECT_EQ(error_of([&] { shm::Segment::open(junk); }), Errc::protocol);
}

TEST(Doorbell, RingWakesAndDrainQuiets) {
  shm::Doorbell d;
  EXPECT_FALSE(readable(d.fd()));
  shm::Doorbell::ring(d.fd());
  shm::Doorbell::ring(d.fd());
  EXPECT_TRUE(readable(d.fd()));
  d.drain();
  EXPECT_FALSE(readable(d.fd()));
}

TEST(Attach, TheRightProofGetsTheSegmentAndTheDoorbell) {
  Served s;
  shm::Doorbell mine;
  shm::Attached a = shm::attach(s.listener->name(), 7, s.good, mine.fd(), 2s);
  EXPECT_TRUE(shm::adopt_doorbell(a.doorbell_fd)) << "the listener's doorbell is an eventfd";
  auto seg = shm::Segment::open(std::exchange(a.segment_fd, -1));
  a.confirm();
  const std::uint8_t msg[] = "hello";
  ASSERT_EQ(s.seg->ring(1, 0).write(msg, sizeof msg), static_cast<std::ptrdiff_t>(sizeof msg));
  bool broken = false;
  EXPECT_EQ(seg->ring(1, 0).readable(broken).size(), sizeof msg) << "the same memory";
  shm::Doorbell::ring(a.doorbell_fd);
  EXPECT_TRUE(readable(s.bell.fd())) << "the listener's doorbell";
  for (int i = 0; i < 100 && s.accepted.load() == 0; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(s.accepted.load(), 1);
  EXPECT_EQ(s.listener->refused(), 0u);
}

// Without the confirmation (the requester could not map the segment, or gave up), the
// listener is told so, and moves nothing.
TEST(Attach, AnUnconfirmedAttachMovesNothing) {
  Served s;
  shm::Doorbell mine;
  { shm::Attached a = shm::attach(s.listener->name(), 7, s.good, mine.fd(), 2s); }
  for (int i = 0; i < 300 && s.unconfirmed.load() == 0; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(s.unconfirmed.load(), 1);
  EXPECT_EQ(s.accepted.load(), 0);
}

// A doorbell must be an eventfd: the write end of a pipe could block whoever rings it.
TEST(Attach, ADoorbellThatIsNoEventfdIsRefused) {
  Served s;
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  EXPECT_EQ(error_of([&] { shm::attach(s.listener->name(), 7, s.good, p[1], 2s); }), Errc::protocol);
  EXPECT_EQ(s.listener->refused(), 1u);
  EXPECT_FALSE(shm::adopt_doorbell(p[0]));
  ::close(p[0]);
  ::close(p[1]);
}

TEST(Attach, AWrongProofOrRankGetsNothing) {
  Served s;
  shm::Doorbell mine;
  shm::Proof bad = s.good;
  bad[31] ^= 1;
  EXPECT_EQ(error_of([&] { shm::attach(s.listener->name(), 7, bad, mine.fd(), 2s); }), Errc::protocol);
  EXPECT_EQ(error_of([&] { shm::attach(s.listener->name(), 8, s.good, mine.fd(), 2s); }), Errc::protocol);
  EXPECT_EQ(s.listener->refused(), 2u);
  EXPECT_EQ(s.accepted.load(), 0);
  EXPECT_EQ(error_of([&] { shm::attach("nexar-shm-nobody-listens-here", 7, s.good, mine.fd(), 2s); }), Errc::io);
}

// The listener asks the kernel who connected: another user's process is refused even with
// the right proof.
TEST(Attach, AnotherUsersProcessIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run a process as another user";
  Served s;
  const std::string name = s.listener->name();
  const shm::Proof good = s.good;
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(3);
    shm::Doorbell mine;
    const Errc e = error_of([&] { shm::attach(name, 7, good, mine.fd(), 2s); });
    ::_exit(e == Errc::protocol ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the other user's attach was not refused";
  EXPECT_EQ(s.accepted.load(), 0);
  EXPECT_EQ(s.listener->refused(), 1u);
}

TEST(HostKey, IsStableAndNamesThisUser) {
  const std::string k = shm::host_key();
  EXPECT_EQ(k, shm::host_key());
  const std::string uid = std::to_string(::geteuid());
  ASSERT_GT(k.size(), uid.size());
  EXPECT_EQ(k.substr(k.size() - uid.size() - 1), std::string(1, '/').append(uid)) << k;
}
