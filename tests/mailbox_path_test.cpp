// The mailbox path of all_reduce, reduce_scatter, all_gather, broadcast and barrier
// (collective/mailbox_path.*, comm/communicator_impl_mailboxes.cpp), on local worlds whose
// ranks share memory: every dtype and op against the plain-loop references, in one round, two rounds and chunks, in place too,
// with results bitwise equal on every rank; the path is taken up to the agreed size and
// not beyond; blocking and non-blocking calls meet each other; communicators used at once
// from several threads keep their messages apart, and two that ranks use in different
// orders do not wait on each other; ranks that disagree on the size, a rank that never
// comes and a rank that closes all give errors that name the peer.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "collective_support.hpp"
#include "comm/communicator_impl.hpp"
#include "core/access.hpp"

using namespace nexar;
using namespace nexar::coll_test;

namespace {

std::uint64_t via_mailboxes(const Communicator& c) { return detail::Access::impl(c)->mailbox_collectives(); }

// Runs `fn(rank)` on a fresh local world of `n` ranks made with `cfg`, one thread per rank.
void with_world(int n, const Config& cfg, const std::function<void(std::vector<Communicator>&, int)>& fn) {
  auto comms = bootstrap_local(n, cfg);
  run_ranks(comms, "world of " + std::to_string(n), [&](int r) { fn(comms, r); });
  for (auto& c : comms) c.close();
}

template <class T>
void check_all_reduce(std::vector<Communicator>& w, DataType t, ReduceOp op, std::size_t count, bool blocking,
                      bool in_place = false) {
  const int n = static_cast<int>(w.size());
  std::vector<std::vector<T>> in(static_cast<std::size_t>(n)), out(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    in[static_cast<std::size_t>(r)] = gen<T>(count, op, Data::random, mix(static_cast<std::uint64_t>(r), count));
    out[static_cast<std::size_t>(r)].assign(count, T{});
  }
  const std::string ctx = std::string(to_string(t)) + " " + to_string(op) + " x" + std::to_string(count) +
                          (blocking ? " blocking" : " non-blocking") + (in_place ? " in place" : "") + ", " +
                          std::to_string(n) + " ranks";
  if (in_place) out = in;
  run_ranks(w, ctx, [&](int r) {
    auto& c = w[static_cast<std::size_t>(r)];
    void* d = out[static_cast<std::size_t>(r)].data();
    const void* s = in_place ? d : in[static_cast<std::size_t>(r)].data();
    if (blocking) {
      c.all_reduce(s, d, count, t, op);
    } else {
      c.iall_reduce(s, d, count, t, op).wait();
    }
  });
  for (int r = 0; r < n; ++r) {
    check_elements(ctx, r, "recv", out[static_cast<std::size_t>(r)].data(), count,
                   [&](std::size_t i) { return reference(in, i, op, 0, n, Data::random); });
    check_bytes(ctx, r, "recv vs rank 0", reinterpret_cast<const std::byte*>(out[static_cast<std::size_t>(r)].data()),
                reinterpret_cast<const std::byte*>(out[0].data()), count * sizeof(T), sizeof(T));
  }
}

// The chunk tests' driver: for 2, 3 and 4 ranks and every dtype, `fn(world, n,
// std::type_identity<T>, other)` with `other` an op besides sum, each in turn (max where
// avg does not apply), returning how many collectives it ran; every one of them but the
// first two (they may agree on the path, in a fresh world) must go through the mailboxes.
template <class Fn>
void each_world_and_type(Fn fn) {
  for (int n : {2, 3, 4}) {
    auto& w = pooled_world(n);
    const std::uint64_t before = via_mailboxes(w[0]);
    std::uint64_t calls = 0;
    std::size_t round = 0;
    for (DataType t : all_dtypes) {
      with_type(t, [&]<class T>(std::type_identity<T> type) {
        const ReduceOp ops[] = {ReduceOp::prod, ReduceOp::min, ReduceOp::max, ReduceOp::avg};
        ReduceOp other = ops[round++ % 4];
        if (other == ReduceOp::avg && !is_float_v<T>) other = ReduceOp::max;
        calls += fn(w, n, type, other);
      });
    }
    EXPECT_GE(via_mailboxes(w[0]) + 2, before + calls) << n << " ranks: the mailbox path was not taken";
  }
}

// Chunks in a message, and (the most the tests use) blocks of more chunks than a
// communicator may keep in a mailbox; with 2 ranks, within the 128 KiB they take chunks for.
template <class T>
constexpr std::size_t kChunkElems = detail::CollectivePort::kMailboxBytes / sizeof(T);
inline std::size_t many_chunks(int n) { return n == 2 ? 7 : 9; }

}  // namespace

// Every dtype and op, odd world sizes, 0, 1, odd and the largest counts that fit.
TEST(MailboxPath, AllReduceMatchesTheReferenceOnEveryRank) {
  for (int n : {2, 3, 4}) {
    auto& w = pooled_world(n);
    const std::uint64_t before = via_mailboxes(w[0]);
    for (DataType t : all_dtypes) {
      with_type(t, [&]<class T>(std::type_identity<T>) {
        for (ReduceOp op : {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max, ReduceOp::avg}) {
          if (op == ReduceOp::avg && !is_float_v<T>) continue;
          // Empty, one element, odd, the most one round takes, the least two rounds take,
          // odd again, and the most two rounds take (a block of 8 KiB each).
          const std::size_t one = 4096 / sizeof(T);
          const std::size_t two = std::min<std::size_t>(65536, n * detail::CollectivePort::kMailboxBytes) / sizeof(T);
          for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, one, one + 1, std::size_t{999}, two}) {
            check_all_reduce<T>(w, t, op, count, true);
            check_all_reduce<T>(w, t, op, count, false);
          }
        }
      });
    }
    EXPECT_GT(via_mailboxes(w[0]), before + 100) << n << " ranks: the mailbox path was not taken";
  }
}

// Blocks larger than a message go in chunks: just over one message per block, blocks of
// whole chunks, blocks of several chunks and a few elements (counts not divisible by the
// world), and blocks of more chunks than a mailbox has slots; every dtype, in place too.
TEST(MailboxPath, ChunkedAllReduceMatchesTheReference) {
  each_world_and_type([]<class T>(std::vector<Communicator>& w, int n, std::type_identity<T>, ReduceOp other) {
    const std::size_t ranks = static_cast<std::size_t>(n), c = kChunkElems<T>;
    std::uint64_t calls = 0;
    for (ReduceOp op : {ReduceOp::sum, other}) {
      for (std::size_t count :
           {ranks * c + 1, ranks * 2 * c, ranks * 3 * c + 5, ranks * many_chunks(n) * c + 2 * ranks - 1}) {
        check_all_reduce<T>(w, dtype_of_v<T>, op, count, true);
        check_all_reduce<T>(w, dtype_of_v<T>, op, count, false);
        check_all_reduce<T>(w, dtype_of_v<T>, op, count, true, true);
        calls += 3;
      }
    }
    return calls;
  });
}

// reduce_scatter (the first of the two rounds) and all_gather (the second) through the
// mailboxes: every dtype, sum and another op, counts that leave the blocks uneven, empty
// and one-element calls, blocks of many chunks; all_gather in place too.
TEST(MailboxPath, ReduceScatterAndAllGatherMatchTheReference) {
  each_world_and_type([]<class T>(std::vector<Communicator>& w, int n, std::type_identity<T>, ReduceOp other) {
    const std::size_t ranks = static_cast<std::size_t>(n), per_chunk = kChunkElems<T>, many = many_chunks(n);
    const DataType t = dtype_of_v<T>;
    std::uint64_t calls = 0;
    for (ReduceOp op : {ReduceOp::sum, other}) {
      for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, ranks * per_chunk + 1,
                                ranks * 3 * per_chunk + 5, ranks * many * per_chunk + 2 * ranks - 1}) {
        std::vector<std::vector<T>> in(ranks), out(ranks);
        for (std::size_t r = 0; r < ranks; ++r) {
          in[r] = gen<T>(count, op, Data::random, mix(r, count + 17));
          out[r].assign(block_of(count, n, static_cast<int>(r)).second, T{});
        }
        const std::string ctx = std::string("reduce_scatter ") + to_string(t) + " " + to_string(op) + " x" +
                                std::to_string(count) + ", " + std::to_string(n) + " ranks";
        run_ranks(w, ctx, [&](int r) {
          auto& c = w[static_cast<std::size_t>(r)];
          auto& o = out[static_cast<std::size_t>(r)];
          if (r % 2) {
            c.reduce_scatter(std::span<const T>(in[static_cast<std::size_t>(r)]), std::span<T>(o), op);
          } else {
            c.ireduce_scatter(std::span<const T>(in[static_cast<std::size_t>(r)]), std::span<T>(o), op).wait();
          }
        });
        ++calls;
        for (int r = 0; r < n; ++r) {
          const std::size_t off = block_of(count, n, r).first;
          check_elements(ctx, r, "recv", out[static_cast<std::size_t>(r)].data(),
                         out[static_cast<std::size_t>(r)].size(),
                         [&](std::size_t i) { return reference(in, off + i, op, 0, n, Data::random); });
        }
      }
    }
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, per_chunk + 3, 3 * per_chunk,
                              many * per_chunk + 1}) {
      for (bool in_place : {false, true}) {
        std::vector<std::vector<T>> in(ranks), out(ranks);
        std::vector<T> want;
        for (std::size_t r = 0; r < ranks; ++r) {
          in[r] = gen<T>(count, ReduceOp::sum, Data::random, mix(r, count + 29));
          want.insert(want.end(), in[r].begin(), in[r].end());
          out[r].assign(count * ranks, T{});
          if (in_place) std::copy(in[r].begin(), in[r].end(), out[r].begin() + static_cast<std::ptrdiff_t>(r * count));
        }
        const std::string ctx = std::string("all_gather ") + to_string(t) + " x" + std::to_string(count) +
                                (in_place ? " in place" : "") + ", " + std::to_string(n) + " ranks";
        run_ranks(w, ctx, [&](int r) {
          auto& c = w[static_cast<std::size_t>(r)];
          const std::size_t me = static_cast<std::size_t>(r);
          const T* s = in_place ? out[me].data() + me * count : in[me].data();
          if (r % 2) {
            c.all_gather(s, out[me].data(), count, t);
          } else {
            c.iall_gather(s, out[me].data(), count, t).wait();
          }
        });
        ++calls;
        for (int r = 0; r < n; ++r)
          check_bytes(ctx, r, "recv", reinterpret_cast<const std::byte*>(out[static_cast<std::size_t>(r)].data()),
                      reinterpret_cast<const std::byte*>(want.data()), want.size() * sizeof(T), sizeof(T));
      }
    }
    return calls;
  });
}

TEST(MailboxPath, BroadcastAndBarrier) {
  auto& w = pooled_world(3);
  const std::uint64_t before = via_mailboxes(w[1]);
  for (int root = 0; root < 3; ++root) {
    // One message, and chunks: a few, and more than a communicator may keep in a mailbox.
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{111}, std::size_t{3000}, std::size_t{50001}}) {
      std::vector<std::vector<std::uint32_t>> data(3);
      for (int r = 0; r < 3; ++r)
        data[static_cast<std::size_t>(r)] = gen<std::uint32_t>(count, ReduceOp::sum, Data::random,
                                                               mix(static_cast<std::uint64_t>(r), count));
      const auto want = data[static_cast<std::size_t>(root)];
      run_ranks(w, "broadcast", [&](int r) {
        auto& c = w[static_cast<std::size_t>(r)];
        c.barrier();
        if (r % 2) {
          c.broadcast(std::span<std::uint32_t>(data[static_cast<std::size_t>(r)]), root);
        } else {
          c.ibroadcast(std::span<std::uint32_t>(data[static_cast<std::size_t>(r)]), root).wait();
        }
        c.ibarrier().wait();
      });
      for (int r = 0; r < 3; ++r) EXPECT_EQ(data[static_cast<std::size_t>(r)], want) << "root " << root << " rank " << r;
    }
  }
  // Every call (3 per round) but the first two (they may agree on the path).
  EXPECT_GE(via_mailboxes(w[1]) + 2, before + 3 * 5 * 3);
}

// Beyond the agreed size (the setting; the smallest any member allows) the ordinary path
// runs, and a setting of 0 turns the path off.
TEST(MailboxPath, OnlyUpToTheAgreedSize) {
  Config cfg = test_config();
  cfg.shm_collective_bytes = 65536;
  with_world(2, cfg, [&](std::vector<Communicator>& w, int r) {
    auto& c = w[static_cast<std::size_t>(r)];
    constexpr std::size_t most = 65536 / sizeof(float);
    std::vector<float> a(most + 1, 1.0f);  // one element over the largest size
    for (int i = 0; i < 4; ++i) c.all_reduce(std::span<float>(a.data(), most), ReduceOp::sum);
    const std::uint64_t at = via_mailboxes(c);
    EXPECT_GT(at, 0u);
    c.all_reduce(std::span<float>(a), ReduceOp::sum);
    EXPECT_EQ(via_mailboxes(c), at);
    EXPECT_EQ(a[0], 32.0f);
    EXPECT_EQ(a[most], 2.0f);
  });
  // A setting of 16 bytes: 16 go through, 20 do not.
  cfg.shm_collective_bytes = 16;
  with_world(2, cfg, [&](std::vector<Communicator>& w, int r) {
    auto& c = w[static_cast<std::size_t>(r)];
    std::vector<float> a(5, 1.0f);
    for (int i = 0; i < 4; ++i) c.all_reduce(std::span<float>(a.data(), 4), ReduceOp::max);
    const std::uint64_t at = via_mailboxes(c);
    EXPECT_GT(at, 0u);
    c.all_reduce(std::span<float>(a), ReduceOp::max);
    EXPECT_EQ(via_mailboxes(c), at);
  });
  cfg.shm_collective_bytes = 0;
  with_world(2, cfg, [&](std::vector<Communicator>& w, int r) {
    auto& c = w[static_cast<std::size_t>(r)];
    int x = r + 1;
    for (int i = 0; i < 8; ++i) c.all_reduce(std::span<int>(&x, 1), ReduceOp::max);
    EXPECT_EQ(x, 2);
    EXPECT_EQ(via_mailboxes(c), 0u);
  });
}

// With the default setting: two ranks take the chunks up to 128 KiB per rank and the
// ordinary ring above; three ranks take them above too (16 MiB and more), and so do ten,
// whose blocks of a 100 KiB vector are over one message each. all_gather takes them up
// to 1 MiB in all.
TEST(MailboxPath, TheWorldSizeDecidesTheLargestSize) {
  for (int n : {2, 3}) {
    const std::size_t most = n == 2 ? (std::size_t{128} << 10) / sizeof(float) : (std::size_t{16} << 20) / sizeof(float);
    with_world(n, test_config(), [&](std::vector<Communicator>& w, int r) {
      auto& c = w[static_cast<std::size_t>(r)];
      std::vector<float> a(most + 1, 1.0f);
      for (int i = 0; i < 4; ++i) c.all_reduce(std::span<float>(a.data(), 1), ReduceOp::max);
      const std::uint64_t at = via_mailboxes(c);
      EXPECT_GT(at, 0u);
      c.all_reduce(std::span<float>(a.data(), most), ReduceOp::sum);
      EXPECT_EQ(via_mailboxes(c), at + 1);
      c.all_reduce(std::span<float>(a), ReduceOp::sum);
      EXPECT_EQ(via_mailboxes(c), at + 1 + (n > 2 ? 1 : 0)) << n << " ranks";
      const float nf = static_cast<float>(n);
      EXPECT_EQ(a[0], nf * nf);
      EXPECT_EQ(a[most - 1], nf * nf);
      EXPECT_EQ(a[most], nf);
    });
  }
  // all_gather: up to 1 MiB in all.
  with_world(3, test_config(), [&](std::vector<Communicator>& w, int r) {
    auto& c = w[static_cast<std::size_t>(r)];
    constexpr std::size_t per_rank = (std::size_t{1} << 20) / 3 / sizeof(float);
    std::vector<float> mine(per_rank + 1, static_cast<float>(r)), all(3 * (per_rank + 1));
    for (int i = 0; i < 4; ++i) c.barrier();
    const std::uint64_t at = via_mailboxes(c);
    c.all_gather(std::span<const float>(mine.data(), per_rank), std::span<float>(all.data(), 3 * per_rank));
    EXPECT_EQ(via_mailboxes(c), at + 1);
    EXPECT_EQ(all[2 * per_rank], 2.0f);
    c.all_gather(std::span<const float>(mine), std::span<float>(all));
    EXPECT_EQ(via_mailboxes(c), at + 1);
    EXPECT_EQ(all[2 * (per_rank + 1)], 2.0f);
  });
  with_world(10, test_config(), [&](std::vector<Communicator>& w, int r) {
    auto& c = w[static_cast<std::size_t>(r)];
    std::vector<float> b(25600, static_cast<float>(r));
    for (int i = 0; i < 4; ++i) c.all_reduce(std::span<float>(b.data(), 1), ReduceOp::max);
    const std::uint64_t at = via_mailboxes(c);
    std::fill(b.begin(), b.end(), static_cast<float>(r));
    c.all_reduce(std::span<float>(b), ReduceOp::sum);
    EXPECT_EQ(via_mailboxes(c), at + 1);
    EXPECT_EQ(b[0], 45.0f);
    EXPECT_EQ(b[25599], 45.0f);
  });
}

// Rank 0 calls the blocking forms, rank 1 the non-blocking ones and waits; both meet, in
// order, with non-blocking calls in flight meanwhile (an ordinary one, and one through the
// mailboxes, which rank 0's blocking calls then follow on the collective thread).
TEST(MailboxPath, BlockingMeetsNonBlocking) {
  auto& w = pooled_world(2);
  std::vector<std::vector<double>> got(2, std::vector<double>(40));
  run_ranks(w, "mixed forms", [&](int r) {
    auto& c = w[static_cast<std::size_t>(r)];
    for (int i = 0; i < 40; ++i) {
      constexpr std::size_t kBig = 9000;  // 72000 bytes, by a ring: the ordinary path
      constexpr std::size_t kMid = 1100;  // 8800 bytes: two rounds through the mailboxes
      double x = r * 100 + i;
      std::vector<double> big(kBig, r + i), big_out(kBig), mid(kMid, 2 * r + i);
      CollectiveOptions ring;
      ring.algorithm = Algorithm::ring;
      Request pending = c.iall_reduce(big.data(), big_out.data(), kBig, DataType::f64, ReduceOp::sum, ring);
      Request mid_pending = c.iall_reduce(std::span<double>(mid), ReduceOp::sum);
      if (r == 0) {
        c.all_reduce(&x, &x, 1, DataType::f64, ReduceOp::sum);
        c.barrier();
      } else {
        Request a = c.iall_reduce(&x, &x, 1, DataType::f64, ReduceOp::sum);
        Request b = c.ibarrier();
        b.wait();
        a.wait();
      }
      pending.wait();
      mid_pending.wait();
      got[static_cast<std::size_t>(r)][static_cast<std::size_t>(i)] = x;
      if (mid[kMid - 1] != 2 + 2 * i) throw std::runtime_error("mid all_reduce wrong at " + std::to_string(i));
      if (big_out[kBig - 1] != 1 + 2 * i) throw std::runtime_error("large all_reduce wrong at " + std::to_string(i));
    }
  });
  for (int i = 0; i < 40; ++i) {
    EXPECT_EQ(got[0][static_cast<std::size_t>(i)], 100 + 2 * i);
    EXPECT_EQ(got[1][static_cast<std::size_t>(i)], 100 + 2 * i);
  }
}

// The world and two halves split from it, each driven by its own thread on every rank at
// the same time: each communicator's messages reach only its own collectives.
TEST(MailboxPath, CommunicatorsAtOnceKeepApart) {
  auto comms = bootstrap_local(4, test_config());
  std::vector<Communicator> halves(4);
  run_ranks(comms, "split", [&](int r) { halves[static_cast<std::size_t>(r)] = comms[static_cast<std::size_t>(r)].split(r % 2, r); });
  std::vector<std::string> errors(8);
  std::vector<std::thread> ts;
  for (int r = 0; r < 4; ++r) {
    for (int which = 0; which < 2; ++which) {
      ts.emplace_back([&, r, which] {
        Communicator& c = which == 0 ? comms[static_cast<std::size_t>(r)] : halves[static_cast<std::size_t>(r)];
        try {
          for (int i = 0; i < 500; ++i) {
            std::int64_t x[3] = {r, i, which};
            c.all_reduce(std::span<std::int64_t>(x), ReduceOp::sum);
            const std::int64_t ranks = which == 0 ? 0 + 1 + 2 + 3 : (r % 2 == 0 ? 0 + 2 : 1 + 3);
            const std::int64_t m = which == 0 ? 4 : 2;
            if (x[0] != ranks || x[1] != m * i || x[2] != m * which)
              throw std::runtime_error("iteration " + std::to_string(i) + " wrong");
          }
          if (via_mailboxes(c) == 0) throw std::runtime_error("no mailbox collectives");
        } catch (const std::exception& e) {
          errors[static_cast<std::size_t>(2 * r + which)] = e.what();
        }
      });
    }
  }
  for (auto& t : ts) t.join();
  for (std::size_t i = 0; i < errors.size(); ++i) EXPECT_EQ(errors[i], "") << "rank " << i / 2 << " comm " << i % 2;
  for (auto& c : halves) c.close();
  for (auto& c : comms) c.close();
}

// Ranks that pass different counts get an error naming both sizes, not wrong data, and the
// communicator is revoked: the next call fails at once with the same words; a rank that
// never comes makes the other fail at its deadline, naming it.
TEST(MailboxPath, DisagreementAndAbsenceAreErrors) {
  auto comms = bootstrap_local(2, test_config());
  run_ranks(comms, "warm", [&](int r) {
    int x = r;
    for (int i = 0; i < 4; ++i) comms[static_cast<std::size_t>(r)].all_reduce(std::span<int>(&x, 1), ReduceOp::sum);
  });
  CollectiveOptions o;
  o.timeout = std::chrono::milliseconds(500);
  auto f = std::async(std::launch::async, [&] {
    int y[3] = {1, 2, 3};
    comms[1].all_reduce(std::span<int>(y), ReduceOp::sum, o);
  });
  // Whichever rank reads the other's part first finds the mismatch and revokes the
  // communicator; the other rank's error then carries the finder's words.
  const auto names_both = [](const std::string& what) {
    return what.find("rank 1 sent rank 0 12 bytes where rank 0 expects 8") != std::string::npos ||
           what.find("rank 0 sent rank 1 8 bytes where rank 1 expects 12") != std::string::npos;
  };
  int x[2] = {1, 2};
  try {
    comms[0].all_reduce(std::span<int>(x), ReduceOp::sum, o);
    ADD_FAILURE() << "rank 0: no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument) << e.what();
    EXPECT_TRUE(names_both(e.what())) << e.what();
  }
  EXPECT_THROW(f.get(), Error);
  try {
    comms[0].barrier(o);
    ADD_FAILURE() << "rank 0: no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument) << e.what();
    EXPECT_TRUE(names_both(e.what())) << e.what();
  }
  for (auto& c : comms) c.close();
  auto fresh = bootstrap_local(2, test_config());
  run_ranks(fresh, "warm", [&](int r) {
    int v = r;
    for (int i = 0; i < 4; ++i) fresh[static_cast<std::size_t>(r)].all_reduce(std::span<int>(&v, 1), ReduceOp::sum);
  });
  try {
    fresh[0].barrier(o);
    ADD_FAILURE() << "rank 0: no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::timeout) << e.what();
    EXPECT_NE(std::string(e.what()).find("waiting for rank 1"), std::string::npos) << e.what();
  }
  for (auto& c : fresh) c.close();
}

// A rank that closes while another waits for its part (of a barrier, or of a chunked
// all_reduce): the waiter fails at once (not at its deadline), naming it.
TEST(MailboxPath, PeerThatClosesFailsTheWaiter) {
  for (bool chunked : {false, true}) {
    auto comms = bootstrap_local(2, test_config());
    run_ranks(comms, "warm", [&](int r) {
      for (int i = 0; i < 4; ++i) comms[static_cast<std::size_t>(r)].barrier();
    });
    ASSERT_GT(via_mailboxes(comms[0]), 0u);
    const auto t0 = std::chrono::steady_clock::now();
    auto f = std::async(std::launch::async, [&] {
      if (!chunked) return comms[0].barrier();
      std::vector<double> a(16384, 1.0);  // 128 KiB: chunks, with 2 ranks
      comms[0].all_reduce(std::span<double>(a), ReduceOp::sum);
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    comms[1].close();
    try {
      f.get();
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_TRUE(e.code() == Errc::peer_closed || e.code() == Errc::rank_failed || e.code() == Errc::revoked)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("peer 1"), std::string::npos) << e.what();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));  // op_timeout is 60 s
    comms[0].close();
  }
}

// Chunked: ranks whose blocks are both whole chunks, 2 against 3 of them (no chunk's length
// tells them apart), fail at once, each naming the other's size; so does the receiver of
// a broadcast in chunks.
TEST(MailboxPath, ChunkedDisagreementNamesBothSizes) {
  constexpr std::size_t kChunk = detail::CollectivePort::kMailboxBytes / sizeof(float);
  auto comms = bootstrap_local(2, test_config());
  run_ranks(comms, "warm", [&](int r) {
    int x = r;
    for (int i = 0; i < 4; ++i) comms[static_cast<std::size_t>(r)].all_reduce(std::span<int>(&x, 1), ReduceOp::sum);
  });
  std::vector<std::string> errors(2);
  run_ranks(comms, "disagree", [&](int r) {
    std::vector<float> a(2 * (r == 0 ? 2 : 3) * kChunk, 1.0f);
    try {
      comms[static_cast<std::size_t>(r)].all_reduce(std::span<float>(a), ReduceOp::sum);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::invalid_argument) << e.what();
      errors[static_cast<std::size_t>(r)] = e.what();
    }
  });
  EXPECT_NE(errors[0].find("rank 1 has 49152 bytes, this rank 32768"), std::string::npos) << errors[0];
  EXPECT_NE(errors[1].find("rank 0 has 32768 bytes, this rank 49152"), std::string::npos) << errors[1];
  // broadcast: the receiver finds out (the root has sent and is done).
  std::string receiver;
  run_ranks(comms, "disagree on broadcast", [&](int r) {
    std::vector<float> a(2 * (r == 0 ? 2 : 3) * kChunk, 1.0f);
    try {
      comms[static_cast<std::size_t>(r)].broadcast(std::span<float>(a), 0);
    } catch (const Error& e) {
      EXPECT_EQ(r, 1) << e.what();
      EXPECT_EQ(e.code(), Errc::invalid_argument) << e.what();
      receiver = e.what();
    }
  });
  EXPECT_NE(receiver.find("rank 0 has 32768 bytes, this rank 49152"), std::string::npos) << receiver;
  for (auto& c : comms) c.close();
}

// Rank 0 runs large all_reduces on two communicators at once, from two threads; ranks 1
// and 2 run them one after the other, the second communicator's first. Rank 0's first
// communicator may not fill the mailboxes that the second's messages need to reach them.
TEST(MailboxPath, CommunicatorsInDifferentOrdersDoNotWaitOnEachOther) {
  constexpr int kRanks = 3;
  auto comms = bootstrap_local(kRanks, test_config());
  std::vector<Communicator> others(kRanks);
  run_ranks(comms, "split", [&](int r) { others[static_cast<std::size_t>(r)] = comms[static_cast<std::size_t>(r)].split(0, r); });
  CollectiveOptions o;
  o.timeout = std::chrono::seconds(20);
  constexpr std::size_t kCount = 256 * 1024;  // 1 MiB: blocks of 42 or 43 chunks
  const auto step = [&](Communicator& c, int r, int i, int which) {
    std::vector<std::int32_t> a(kCount, r + i + which);
    c.all_reduce(std::span<std::int32_t>(a), ReduceOp::sum, o);
    const std::int32_t want = 0 + 1 + 2 + kRanks * (i + which);
    if (a[0] != want || a[kCount - 1] != want)
      throw std::runtime_error("communicator " + std::to_string(which) + ", round " + std::to_string(i) + " wrong");
  };
  for (int i = 0; i < 4; ++i) {  // the first rounds also agree on the mailboxes
    std::vector<std::string> errors(kRanks + 1);
    std::vector<std::thread> ts;
    ts.emplace_back([&] {
      try {
        step(comms[0], 0, i, 0);
      } catch (const std::exception& e) {
        errors[kRanks] = e.what();
      }
    });
    run_ranks(comms, "different orders", [&](int r) {
      try {
        if (r == 0) return step(others[0], 0, i, 1);
        step(others[static_cast<std::size_t>(r)], r, i, 1);
        step(comms[static_cast<std::size_t>(r)], r, i, 0);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
    for (auto& t : ts) t.join();
    for (std::size_t k = 0; k < errors.size(); ++k) ASSERT_EQ(errors[k], "") << "round " << i << ", thread " << k;
  }
  EXPECT_GT(via_mailboxes(comms[0]), 0u);
  EXPECT_GT(via_mailboxes(others[0]), 0u);
  for (auto& c : others) c.close();
  for (auto& c : comms) c.close();
}
