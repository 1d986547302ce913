// The public face of nexar::Communicator: typed forms over any contiguous range (std::vector,
// std::array, C arrays, std::span), the typed blocking and non-blocking collectives checked
// against references computed here with plain loops, the size checks of the typed forms, the
// bulk-lane calls, and what the umbrella header and the access rules give a program. Ranks
// run as threads of one bootstrap_local world of 4.
#include <nexar/nexar.hpp>

// The umbrella header alone declares every way to make a communicator and every public
// type: this block is compiled before anything else is included.
namespace umbrella_check {
[[maybe_unused]] std::vector<nexar::Communicator> (*const local)(int, const nexar::Config&) =
    &nexar::bootstrap_local;
[[maybe_unused]] nexar::Communicator (*const joiner)(const nexar::JoinOptions&, const nexar::Config&) =
    &nexar::join;
[[maybe_unused]] nexar::Communicator (*const from_env)(const nexar::Config&) = &nexar::join_from_env;
static_assert(std::is_class_v<nexar::RpcCall> && std::is_class_v<nexar::ErrorFeedback> &&
              std::is_class_v<nexar::Seed> && std::is_class_v<nexar::MutableBuffer>);
}  // namespace umbrella_check

#include <gtest/gtest.h>

#include "collective_support.hpp"
#include "core/access.hpp"
#include "support.hpp"

#include <array>
#include <cstdint>
#include <numeric>
#include <span>
#include <string>
#include <vector>

namespace {

using nexar::Communicator;
using nexar::Errc;
using nexar::ReduceOp;
using nexar::Request;
using nexar::Status;
using nexar::coll_test::pooled_world;
using nexar::coll_test::run_ranks;
using nexar::testing::expect_error;

constexpr int kWorld = 4;

class PoolEnvironment : public ::testing::Environment {
 public:
  void TearDown() override { nexar::coll_test::WorldPool::instance().clear(); }
};
[[maybe_unused]] const auto* const pool_env = ::testing::AddGlobalTestEnvironment(new PoolEnvironment);

// ---- what binds where, checked at compile time ---------------------------------------------

using FVec = std::vector<float>;
using CFVec = const std::vector<float>;

// Whether a call accepts arguments of these types (R&& forwards lvalues and temporaries as
// given: R = FVec is a temporary, R = FVec& an lvalue).
template <class R>
concept CanSend = requires(Communicator& c, R&& r) { c.send(0, 0, std::forward<R>(r)); };
template <class R>
concept CanIsend = requires(Communicator& c, R&& r) { c.isend(0, 0, std::forward<R>(r)); };
template <class R>
concept CanBulkSend = requires(Communicator& c, R&& r) { c.bulk_send(0, 0, std::forward<R>(r)); };
template <class R>
concept CanIbulkSend = requires(Communicator& c, R&& r) { c.ibulk_send(0, 0, std::forward<R>(r)); };
template <class R>
concept CanRecv = requires(Communicator& c, R&& r) { c.recv(0, 0, std::forward<R>(r)); };
template <class R>
concept CanIrecv = requires(Communicator& c, R&& r) { c.irecv(0, 0, std::forward<R>(r)); };
template <class R>
concept CanBulkRecv = requires(Communicator& c, R&& r) { c.bulk_recv(0, 0, std::forward<R>(r)); };
template <class R>
concept CanAllReduceInPlace = requires(Communicator& c, R&& r) { c.all_reduce(std::forward<R>(r), ReduceOp::sum); };
template <class R>
concept CanIallReduceInPlace = requires(Communicator& c, R&& r) { c.iall_reduce(std::forward<R>(r), ReduceOp::sum); };
template <class R>
concept CanBroadcast = requires(Communicator& c, R&& r) { c.broadcast(std::forward<R>(r), 0); };
template <class In, class Out>
concept CanAllReduce = requires(Communicator& c, In&& in, Out&& out) {
  c.all_reduce(std::forward<In>(in), std::forward<Out>(out), ReduceOp::sum);
};
template <class In, class Out>
concept CanIallReduce = requires(Communicator& c, In&& in, Out&& out) {
  c.iall_reduce(std::forward<In>(in), std::forward<Out>(out), ReduceOp::sum);
};
template <class In, class Out>
concept CanAllGather = requires(Communicator& c, In&& in, Out&& out) {
  c.all_gather(std::forward<In>(in), std::forward<Out>(out));
};
template <class In, class Out>
concept CanIscan = requires(Communicator& c, In&& in, Out&& out) {
  c.iscan(std::forward<In>(in), std::forward<Out>(out), ReduceOp::sum);
};

// Inputs: any contiguous range, const or not, temporaries included for blocking calls.
static_assert(CanSend<CFVec&> && CanSend<FVec> && CanSend<std::array<int, 2>&> && CanSend<const char (&)[4]>);
static_assert(CanIsend<std::span<const float>> && CanIsend<CFVec&> && CanBulkSend<const int (&)[3]>);
static_assert(CanAllReduce<FVec, FVec&> && CanAllReduce<CFVec&, std::span<float>>);
// ... but a non-blocking call refuses a temporary container: it would dangle.
static_assert(!CanIsend<FVec> && !CanIbulkSend<FVec> && !CanIallReduce<FVec, FVec&>);

// Outputs: writable lvalues and spans of non-const elements passed by value, nothing else.
static_assert(CanRecv<FVec&> && CanRecv<std::span<float>> && CanIrecv<float (&)[2]> &&
              CanRecv<std::array<double, 3>&> && CanIallReduceInPlace<std::span<float>>);
static_assert(!CanRecv<CFVec&> && !CanIrecv<CFVec&> && !CanBulkRecv<CFVec&>);
static_assert(!CanRecv<std::span<const float>> && !CanRecv<FVec> && !CanRecv<const float (&)[2]>);
static_assert(!CanAllReduceInPlace<CFVec&> && !CanIallReduceInPlace<CFVec&> && !CanAllReduceInPlace<FVec>);
static_assert(!CanBroadcast<const std::array<double, 2>&> && CanBroadcast<std::array<double, 2>&>);
static_assert(!CanAllGather<FVec&, CFVec&> && !CanIscan<FVec&, CFVec&> && !CanAllReduce<FVec&, FVec>);

// Element types: p2p takes trivially copyable non-pointers, collectives types with a DataType,
// and one call's ranges share one element type.
struct Pod {
  int a;
  float b;
};
static_assert(CanRecv<std::vector<Pod>&> && !CanSend<std::vector<std::string>&> && !CanSend<std::vector<int*>&>);
static_assert(!CanAllReduceInPlace<std::vector<Pod>&> && !CanBroadcast<std::vector<long double>&>);
static_assert(!CanAllReduce<FVec&, std::vector<double>&> && CanAllReduce<std::vector<double>&, std::vector<double>&>);
static_assert(nexar::HasDataType<const float> && nexar::HasDataType<nexar::bfloat16> &&
              !nexar::HasDataType<char*> && !nexar::HasDataType<long double>);

// No detail type in a public signature: the constructors from internals are private.
static_assert(!std::is_constructible_v<Communicator, std::shared_ptr<nexar::detail::CommunicatorImpl>>);
static_assert(!std::is_constructible_v<Request, std::shared_ptr<nexar::detail::OpState>>);

// ---- inputs and references -------------------------------------------------------------------

// Element i of rank r's input: small integers, so that float sums are exact.
template <class T>
T val(int r, std::size_t i) {
  return static_cast<T>((r + 1) * 3 + static_cast<int>(i % 11) * 2 + (r == 2 ? 1 : 0));
}

template <class T, std::size_t N>
std::array<T, N> filled_array(int r) {
  std::array<T, N> a{};
  for (std::size_t i = 0; i < N; ++i) a[i] = val<T>(r, i);
  return a;
}
template <class T>
std::vector<T> filled(int r, std::size_t n) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = val<T>(r, i);
  return v;
}

template <class Got, class Want>
void expect_range_eq(const Got& got, const Want& want, const std::string& what) {
  ASSERT_EQ(std::size(got), std::size(want)) << what;
  for (std::size_t i = 0; i < std::size(want); ++i)
    ASSERT_EQ(got[i], want[i]) << what << " at element " << i;
}

// ---- point-to-point ----------------------------------------------------------------------------

TEST(Communicator, TypedPointToPointTakesVectorsArraysCArraysAndSpans) {
  auto& comms = pooled_world(kWorld);
  run_ranks(comms, "typed p2p", [&](int r) {
    Communicator& c = comms[static_cast<std::size_t>(r)];
    if (r == 0) {
      const std::vector<float> v = filled<float>(0, 7);
      c.send(1, 1, v);                                // const vector
      std::array<std::int32_t, 5> a = filled_array<std::int32_t, 5>(0);
      c.send(1, 2, a);                                // std::array
      double carr[3] = {1.5, -2.25, 1e300};
      c.send(1, 3, carr);                             // C array
      std::vector<std::uint16_t> w{9, 8, 7, 6};
      c.send(1, 4, std::span<const std::uint16_t>(w));  // span of const, by value
      Pod pods[2] = {{1, 0.5f}, {-7, 2.5f}};
      Request q = c.isend(1, 5, pods);                // non-blocking, user struct
      std::vector<std::int64_t> big = filled<std::int64_t>(0, 3000);
      Request q2 = c.isend(1, 6, std::span(big));
      c.send(1, 7, filled<float>(0, 2));              // a temporary is fine when blocking
      q.wait();
      q2.wait();
    } else if (r == 1) {
      std::vector<float> v(7);
      Status s = c.recv(0, 1, v);
      EXPECT_EQ(s.bytes, 7 * sizeof(float));
      EXPECT_EQ(s.source, 0);
      expect_range_eq(v, filled<float>(0, 7), "vector");

      std::int32_t carr[5] = {};
      s = c.recv(0, 2, carr);
      EXPECT_EQ(s.bytes, sizeof carr);
      expect_range_eq(carr, filled_array<std::int32_t, 5>(0), "C array from std::array");

      std::vector<double> backing(4, 0.0);
      s = c.recv(0, 3, std::span<double>(backing));   // span<T> by value
      EXPECT_EQ(s.bytes, 3 * sizeof(double));
      expect_range_eq(std::span<double>(backing).first(3), std::array<double, 3>{1.5, -2.25, 1e300}, "span");
      EXPECT_EQ(backing[3], 0.0);

      std::array<std::uint16_t, 4> a{};
      s = c.recv(0, 4, a);
      expect_range_eq(a, std::array<std::uint16_t, 4>{9, 8, 7, 6}, "std::array from span");

      Pod pods[2] = {};
      Request rq = c.irecv(0, 5, pods);
      std::vector<std::int64_t> big(3000);
      Request rq2 = c.irecv(0, 6, big);
      EXPECT_EQ(rq.wait().bytes, sizeof pods);
      EXPECT_EQ(pods[0].a, 1);
      EXPECT_EQ(pods[0].b, 0.5f);
      EXPECT_EQ(pods[1].a, -7);
      EXPECT_EQ(pods[1].b, 2.5f);
      EXPECT_EQ(rq2.wait().bytes, 3000 * sizeof(std::int64_t));
      expect_range_eq(big, filled<std::int64_t>(0, 3000), "irecv vector");

      std::array<float, 2> t{};
      c.recv(0, 7, t);
      expect_range_eq(t, filled<float>(0, 2), "temporary");
    }
  });
}

TEST(Communicator, TypedReceiveRejectsPartialElements) {
  auto& comms = pooled_world(kWorld);
  run_ranks(comms, "partial elements", [&](int r) {
    Communicator& c = comms[static_cast<std::size_t>(r)];
    if (r == 2) {
      const char six[6] = {1, 2, 3, 4, 5, 6};
      c.send(3, 11, six);
      c.bulk_send(3, 12, six);
    } else if (r == 3) {
      std::vector<std::int32_t> v(4);
      std::string w = expect_error(Errc::invalid_argument, [&] { c.recv(2, 11, v); });
      EXPECT_EQ(w.rfind("recv:", 0), 0u) << w;
      EXPECT_TRUE(nexar::testing::contains(w, "6 bytes")) << w;
      w = expect_error(Errc::invalid_argument, [&] { c.bulk_recv(2, 12, v); });
      EXPECT_EQ(w.rfind("bulk_recv:", 0), 0u) << w;
    }
  });
}

// ---- bulk lane ---------------------------------------------------------------------------------

TEST(Communicator, BulkLaneCallsKeepTheirOwnMatchingSpace) {
  auto& comms = pooled_world(kWorld);
  run_ranks(comms, "bulk lane", [&](int r) {
    Communicator& c = comms[static_cast<std::size_t>(r)];
    if (r == 1) {
      std::vector<std::uint8_t> bulk(1 << 20);
      for (std::size_t i = 0; i < bulk.size(); ++i) bulk[i] = static_cast<std::uint8_t>(i * 7 + 3);
      const std::array<std::uint8_t, 3> small{1, 2, 3};
      // The bulk message goes first with the same tag: a data-lane receive must not take it.
      Request b = c.ibulk_send(2, 9, bulk);
      c.send(2, 9, small);
      b.wait();
      std::array<std::uint32_t, 2> more{0xdeadbeef, 42};
      c.bulk_send(2, 10, more);
      c.bulk_send(2, 13, bulk.data(), 100);                  // untyped forms
      Request u = c.ibulk_send(2, 14, bulk.data() + 100, 50);
      u.wait();
    } else if (r == 2) {
      std::array<std::uint8_t, 3> small{};
      Status s = c.recv(1, 9, small);
      EXPECT_EQ(s.bytes, 3u);
      expect_range_eq(small, std::array<std::uint8_t, 3>{1, 2, 3}, "data lane");
      std::vector<std::uint8_t> got(1 << 20);
      Request b = c.ibulk_recv(1, 9, got);
      EXPECT_EQ(b.wait().bytes, got.size());
      for (std::size_t i = 0; i < got.size(); ++i)
        ASSERT_EQ(got[i], static_cast<std::uint8_t>(i * 7 + 3)) << "bulk byte " << i;
      std::uint32_t more[2] = {};
      s = c.bulk_recv(1, 10, more);
      EXPECT_EQ(s.bytes, sizeof more);
      EXPECT_EQ(more[0], 0xdeadbeefu);
      EXPECT_EQ(more[1], 42u);
      std::vector<std::uint8_t> raw(200);
      EXPECT_EQ(c.bulk_recv(1, 13, raw.data(), raw.size()).bytes, 100u);
      EXPECT_EQ(raw[99], static_cast<std::uint8_t>(99 * 7 + 3));
      EXPECT_EQ(c.ibulk_recv(1, 14, raw.data(), raw.size()).wait().bytes, 50u);
      EXPECT_EQ(raw[0], static_cast<std::uint8_t>(100 * 7 + 3));
    }
  });
}

TEST(Communicator, BulkLaneErrorsNameTheOperation) {
  auto& comms = pooled_world(kWorld);
  Communicator& c = comms[0];
  char buf[8] = {};
  auto check = [](const char* op, auto&& f) {
    const std::string w = expect_error(Errc::invalid_argument, f);
    EXPECT_TRUE(nexar::testing::contains(w, op)) << w;
    EXPECT_FALSE(nexar::testing::contains(w, "stream")) << w;
  };
  check("bulk_send", [&] { c.bulk_send(kWorld, 1, buf); });
  check("bulk_send", [&] { c.ibulk_send(-3, 1, buf, 8); });
  check("bulk_recv", [&] { c.bulk_recv(kWorld + 1, 1, buf); });
  check("bulk_recv", [&] { c.ibulk_recv(0, nexar::max_tag + 1, buf, 8); });
}

// ---- typed collectives --------------------------------------------------------------------------

// Runs every typed collective once on rank `r`, blocking or as i-forms all in flight at once,
// with a mix of range kinds, and checks each result against a reference computed here.
void typed_collectives(Communicator& c, bool nonblocking) {
  const int r = c.rank();
  const int n = c.size();
  const auto un = static_cast<std::size_t>(n);
  std::vector<Request> reqs;
  auto go = [&](auto&& blocking, auto&& start) {
    if (nonblocking)
      reqs.push_back(start());
    else
      blocking();
  };

  // all_reduce in place, vector<float>, sum.
  std::vector<float> ar = filled<float>(r, 9);
  go([&] { c.all_reduce(ar, ReduceOp::sum); }, [&] { return c.iall_reduce(ar, ReduceOp::sum); });
  // all_reduce out of place, const std::array<int32_t> -> vector, max.
  const std::array<std::int32_t, 6> ar_in = filled_array<std::int32_t, 6>(r);
  std::vector<std::int32_t> ar_out(6, -1);
  go([&] { c.all_reduce(ar_in, ar_out, ReduceOp::max); },
     [&] { return c.iall_reduce(ar_in, ar_out, ReduceOp::max); });
  // broadcast from rank 1, std::array<double>.
  std::array<double, 5> bc{};
  bc.fill(-1.0);
  if (r == 1) bc = filled_array<double, 5>(1);
  go([&] { c.broadcast(bc, 1); }, [&] { return c.ibroadcast(bc, 1); });
  // reduce to rank 2, vector<int64_t>, sum; the other ranks pass an empty output.
  const std::vector<std::int64_t> rd_in = filled<std::int64_t>(r, 7);
  std::vector<std::int64_t> rd_out(r == 2 ? 7 : 0);
  go([&] { c.reduce(rd_in, rd_out, ReduceOp::sum, 2); },
     [&] { return c.ireduce(rd_in, rd_out, ReduceOp::sum, 2); });
  // all_gather, C array -> vector.
  std::uint32_t ag_in[3];
  for (std::size_t i = 0; i < 3; ++i) ag_in[i] = val<std::uint32_t>(r, i);
  std::vector<std::uint32_t> ag_out(3 * un);
  go([&] { c.all_gather(ag_in, ag_out); }, [&] { return c.iall_gather(ag_in, ag_out); });
  // reduce_scatter of 10 elements (not a multiple of 4), vector<float> -> span.
  const std::vector<float> rs_in = filled<float>(r, 10);
  const auto [rs_off, rs_len] = nexar::block_of(10, n, r);
  std::vector<float> rs_store(rs_len + 1, -5.0f);
  const std::span<float> rs_out(rs_store);
  go([&] { c.reduce_scatter(rs_in, rs_out, ReduceOp::sum); },
     [&] { return c.ireduce_scatter(std::span<const float>(rs_in), rs_out, ReduceOp::sum); });
  // all_to_all, 2 elements per rank, vector -> std::array.
  const std::vector<std::int32_t> a2a_in = filled<std::int32_t>(r, 2 * un);
  std::array<std::int32_t, 2 * kWorld> a2a_out{};
  go([&] { c.all_to_all(a2a_in, a2a_out); }, [&] { return c.iall_to_all(a2a_in, a2a_out); });
  // gather to rank 3, std::array<uint8_t> -> vector (empty elsewhere).
  const std::array<std::uint8_t, 2> g_in = filled_array<std::uint8_t, 2>(r);
  std::vector<std::uint8_t> g_out(r == 3 ? 2 * un : 0);
  go([&] { c.gather(g_in, g_out, 3); }, [&] { return c.igather(g_in, g_out, 3); });
  // scatter from rank 0, vector (empty elsewhere) -> std::array.
  const std::vector<std::int64_t> sc_in = r == 0 ? filled<std::int64_t>(0, 3 * un) : std::vector<std::int64_t>{};
  std::array<std::int64_t, 3> sc_out{};
  go([&] { c.scatter(sc_in, sc_out, 0); }, [&] { return c.iscatter(sc_in, sc_out, 0); });
  // scan, std::array<float> -> vector, sum.
  const std::array<float, 4> scan_in = filled_array<float, 4>(r);
  std::vector<float> scan_out(4);
  go([&] { c.scan(scan_in, scan_out, ReduceOp::sum); },
     [&] { return c.iscan(scan_in, scan_out, ReduceOp::sum); });
  // exclusive_scan, vector<int32_t> -> std::array, min; rank 0 keeps its output.
  const std::vector<std::int32_t> ex_in = filled<std::int32_t>(r, 3);
  std::array<std::int32_t, 3> ex_out{-7, -7, -7};
  go([&] { c.exclusive_scan(ex_in, ex_out, ReduceOp::min); },
     [&] { return c.iexclusive_scan(ex_in, ex_out, ReduceOp::min); });

  for (auto& q : reqs) q.wait();

  // References, from the inputs' definition.
  std::vector<float> ar_ref(9, 0.0f);
  for (int s = 0; s < n; ++s)
    for (std::size_t i = 0; i < 9; ++i) ar_ref[i] += val<float>(s, i);
  expect_range_eq(ar, ar_ref, "all_reduce in place");

  std::vector<std::int32_t> max_ref(6);
  for (std::size_t i = 0; i < 6; ++i) {
    max_ref[i] = val<std::int32_t>(0, i);
    for (int s = 1; s < n; ++s) max_ref[i] = std::max(max_ref[i], val<std::int32_t>(s, i));
  }
  expect_range_eq(ar_out, max_ref, "all_reduce max");

  expect_range_eq(bc, filled_array<double, 5>(1), "broadcast");

  if (r == 2) {
    std::vector<std::int64_t> sum_ref(7, 0);
    for (int s = 0; s < n; ++s)
      for (std::size_t i = 0; i < 7; ++i) sum_ref[i] += val<std::int64_t>(s, i);
    expect_range_eq(rd_out, sum_ref, "reduce");
  }

  std::vector<std::uint32_t> ag_ref;
  for (int s = 0; s < n; ++s)
    for (std::size_t i = 0; i < 3; ++i) ag_ref.push_back(val<std::uint32_t>(s, i));
  expect_range_eq(ag_out, ag_ref, "all_gather");

  std::vector<float> rs_ref(rs_len + 1, -5.0f);  // the element past the block stays untouched
  for (std::size_t i = 0; i < rs_len; ++i) {
    rs_ref[i] = 0.0f;
    for (int s = 0; s < n; ++s) rs_ref[i] += val<float>(s, rs_off + i);
  }
  expect_range_eq(rs_store, rs_ref, "reduce_scatter");

  std::array<std::int32_t, 2 * kWorld> a2a_ref{};
  for (std::size_t from = 0; from < un; ++from)
    for (std::size_t k = 0; k < 2; ++k)
      a2a_ref[from * 2 + k] = val<std::int32_t>(static_cast<int>(from), static_cast<std::size_t>(r) * 2 + k);
  expect_range_eq(a2a_out, a2a_ref, "all_to_all");

  if (r == 3) {
    std::vector<std::uint8_t> g_ref;
    for (int s = 0; s < n; ++s)
      for (std::size_t i = 0; i < 2; ++i) g_ref.push_back(val<std::uint8_t>(s, i));
    expect_range_eq(g_out, g_ref, "gather");
  }

  std::array<std::int64_t, 3> sc_ref{};
  for (std::size_t k = 0; k < 3; ++k) sc_ref[k] = val<std::int64_t>(0, static_cast<std::size_t>(r) * 3 + k);
  expect_range_eq(sc_out, sc_ref, "scatter");

  std::vector<float> scan_ref(4, 0.0f);
  for (int s = 0; s <= r; ++s)
    for (std::size_t i = 0; i < 4; ++i) scan_ref[i] += val<float>(s, i);
  expect_range_eq(scan_out, scan_ref, "scan");

  std::array<std::int32_t, 3> ex_ref{-7, -7, -7};
  for (std::size_t i = 0; i < 3; ++i)
    for (int s = 0; s < r; ++s) ex_ref[i] = s == 0 ? val<std::int32_t>(0, i) : std::min(ex_ref[i], val<std::int32_t>(s, i));
  expect_range_eq(ex_out, ex_ref, "exclusive_scan");
}

TEST(Communicator, TypedBlockingCollectivesMatchReferences) {
  auto& comms = pooled_world(kWorld);
  run_ranks(comms, "typed blocking collectives",
            [&](int r) { typed_collectives(comms[static_cast<std::size_t>(r)], false); });
}

TEST(Communicator, TypedNonBlockingCollectivesMatchReferences) {
  auto& comms = pooled_world(kWorld);
  run_ranks(comms, "typed non-blocking collectives",
            [&](int r) { typed_collectives(comms[static_cast<std::size_t>(r)], true); });
}

// The size checks run before anything starts, so one rank can provoke them alone.
TEST(Communicator, TypedCollectiveSizeChecksNameTheOperation) {
  auto& comms = pooled_world(kWorld);
  Communicator& c = comms[0];  // rank 0 of 4
  std::vector<float> four(4), three(3), eight(8), seven(7), none;
  const std::vector<float>& in4 = four;
  auto check = [](const std::string& op, const std::string& detail, auto&& f) {
    const std::string w = expect_error(Errc::invalid_argument, f);
    EXPECT_EQ(w.rfind(op + ":", 0), 0u) << "'" << w << "' does not start with " << op;
    EXPECT_TRUE(nexar::testing::contains(w, detail)) << "'" << w << "' lacks '" << detail << "'";
  };
  for (bool nb : {false, true}) {
    SCOPED_TRACE(nb ? "i-forms" : "blocking forms");
    auto run = [&](auto&& blocking, auto&& start) {
      if (nb)
        start().wait();
      else
        blocking();
    };
    check("all_reduce", "recv holds 3 elements, 4 needed",
          [&] { run([&] { c.all_reduce(in4, three, ReduceOp::sum); }, [&] { return c.iall_reduce(in4, three, ReduceOp::sum); }); });
    check("reduce", "recv holds 3 elements, 4 needed", [&] {
      run([&] { c.reduce(in4, three, ReduceOp::sum, 0); }, [&] { return c.ireduce(in4, three, ReduceOp::sum, 0); });
    });
    check("all_gather", "recv holds 7 elements, 8 needed",
          [&] { run([&] { c.all_gather(std::span(eight).first(2), seven); }, [&] { return c.iall_gather(std::span(eight).first(2), seven); }); });
    check("reduce_scatter", "recv holds 0 elements, 3 needed", [&] {
      // 9 elements over 4 ranks: rank 0's block has 3.
      std::vector<float> nine(9);
      run([&] { c.reduce_scatter(nine, none, ReduceOp::sum); }, [&] { return c.ireduce_scatter(nine, none, ReduceOp::sum); });
    });
    check("all_to_all", "send holds 7 elements", [&] {
      run([&] { c.all_to_all(seven, eight); }, [&] { return c.iall_to_all(seven, eight); });
    });
    check("all_to_all", "recv holds 7 elements, 8 needed", [&] {
      run([&] { c.all_to_all(eight, seven); }, [&] { return c.iall_to_all(eight, seven); });
    });
    check("gather", "recv holds 7 elements, 8 needed", [&] {
      run([&] { c.gather(std::span(four).first(2), seven, 0); }, [&] { return c.igather(std::span(four).first(2), seven, 0); });
    });
    check("scatter", "send holds 7 elements, 8 needed", [&] {
      std::array<float, 2> out{};
      run([&] { c.scatter(seven, out, 0); }, [&] { return c.iscatter(seven, out, 0); });
    });
    check("scan", "recv holds 3 elements, 4 needed",
          [&] { run([&] { c.scan(in4, three, ReduceOp::sum); }, [&] { return c.iscan(in4, three, ReduceOp::sum); }); });
    check("exclusive_scan", "recv holds 3 elements, 4 needed", [&] {
      run([&] { c.exclusive_scan(in4, three, ReduceOp::sum); }, [&] { return c.iexclusive_scan(in4, three, ReduceOp::sum); });
    });
  }
  // Nothing was started: the world still runs a collective.
  run_ranks(comms, "after size errors", [&](int r) {
    std::array<std::int32_t, 1> x{r};
    comms[static_cast<std::size_t>(r)].all_reduce(x, ReduceOp::sum);
    EXPECT_EQ(x[0], 0 + 1 + 2 + 3);
  });
}

// ---- documentation and internals --------------------------------------------------------------

// README's "Using it" examples, as written there.
TEST(Communicator, ReadmeExamplesRun) {
  auto& comms = pooled_world(kWorld);
  {
    nexar::Communicator& c = comms[0];

    std::vector<float> x(1024, 1.0f);
    c.send(1, /*tag=*/7, x);                        // blocking; any contiguous range
    nexar::Request r = comms[1].irecv(0, 7, x);     // non-blocking
    r.wait();                                       // throws nexar::Error

    comms[1].register_rpc(42, [](int caller, std::span<const std::byte> args) {
      (void)caller;
      return std::vector<std::byte>(args.begin(), args.end());  // echo
    });
    auto reply = c.rpc(1, 42, std::as_bytes(std::span(x)));
    EXPECT_EQ(reply.size(), x.size() * sizeof(float));
    comms[1].unregister_rpc(42);
  }
  run_ranks(comms, "readme collectives", [&](int rank) {
    nexar::Communicator& c = comms[static_cast<std::size_t>(rank)];

    std::vector<float> grad(1 << 20, 1.0f);
    c.all_reduce(grad, nexar::ReduceOp::avg);                     // in place, every rank
    nexar::Request r = c.iall_reduce(grad, nexar::ReduceOp::sum);  // non-blocking
    r.wait();
    auto evens = c.split(c.rank() % 2, c.rank());                 // sub-communicator

    EXPECT_EQ(grad.front(), 4.0f);
    EXPECT_EQ(grad.back(), 4.0f);
    EXPECT_EQ(evens.size(), 2);
  });
}

TEST(Communicator, AccessReachesInternals) {
  auto& comms = pooled_world(kWorld);
  using nexar::detail::Access;
  EXPECT_NE(Access::impl(comms[0]), nullptr);
  const Communicator empty;
  EXPECT_EQ(Access::impl(empty), nullptr);
  EXPECT_FALSE(Access::make_communicator(nullptr).is_open());
  const Communicator copy = Access::make_communicator(Access::impl(comms[2]));
  EXPECT_EQ(copy.rank(), 2);
  const Request done;
  EXPECT_EQ(Access::state(done), nullptr);
  EXPECT_TRUE(Access::make_request(nullptr).test());
  std::int32_t buf[1] = {};
  Request pending = comms[1].irecv(0, 77, buf);
  EXPECT_NE(Access::state(pending), nullptr);
  pending.cancel();
  expect_error(Errc::cancelled, [&] { pending.wait(); });
}

// Collectives of a communicator run one after another. One queued behind a collective that a
// member never joins fails at its own deadline (torch's group timeouts rely on it), not at
// the earlier one's; cancelled while queued, it never runs.
TEST(Communicator, QueuedCollectiveEndsAtItsOwnDeadline) {
  using namespace std::chrono_literals;
  auto comms = nexar::bootstrap_local(2);
  nexar::CollectiveOptions slow, quick;
  slow.timeout = 60s;
  quick.timeout = 300ms;
  // reduce never goes through the mailboxes, whose agreement would itself be a collective.
  std::vector<float> x(5, 1.0f), got(5), y(5, 2.0f), z(5, 3.0f);
  Request first = comms[0].ireduce(x, got, ReduceOp::sum, 0, slow);  // rank 1 never joins
  Request second = comms[0].ireduce(y, got, ReduceOp::sum, 0, quick);
  Request third = comms[0].ireduce(z, got, ReduceOp::sum, 0, slow);
  const auto start = std::chrono::steady_clock::now();
  const std::string w = expect_error(Errc::timeout, [&] { second.wait(); });
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s) << w;
  EXPECT_TRUE(nexar::testing::contains(w, "reduce: rank 0")) << w;
  EXPECT_TRUE(nexar::testing::contains(w, "Timed out waiting 300 ms")) << w;
  third.cancel();
  const std::string c = expect_error(Errc::cancelled, [&] { third.wait(); });
  EXPECT_TRUE(nexar::testing::contains(c, "cancelled before it started")) << c;
  EXPECT_FALSE(first.test());  // running: a cancel does not reach it
  first.cancel();
  EXPECT_FALSE(first.test());
  for (auto& comm : comms) comm.close();
  EXPECT_ANY_THROW(first.wait());
}

}  // namespace
