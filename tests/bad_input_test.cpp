// Bad input and hostile peers: argument validation, certificates from another cluster, a
// peer that speaks QUIC and TLS correctly but sends invalid nexar frames, and garbage UDP
// datagrams thrown at a rank while it works.
#include <nexar/nexar.hpp>

#include <gtest/gtest.h>

#include "support.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <future>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cluster/local.hpp"
#include "engine/engine.hpp"
#include "quic/address.hpp"
#include "quic/connection.hpp"
#include "quic/endpoint.hpp"
#include "tls/tls_context.hpp"
#include "wire/frame.hpp"

namespace {

using nexar::testing::contains;
using nexar::testing::expect_error;
using nexar::testing::on_engine;
using nexar::testing::random_bytes;

using namespace std::chrono_literals;
using nexar::Communicator;
using nexar::ConstBuffer;
using nexar::Errc;
using nexar::Error;
using nexar::Request;
using nexar::Status;
using Clock = std::chrono::steady_clock;
using Bytes = std::vector<std::byte>;

// Protocol errors below are expected: keep quiet.
nexar::Config test_config() { return nexar::testing::test_config(nexar::LogLevel::off); }

void ping(Communicator& a, Communicator& b, int tag, std::size_t bytes = 100) {
  auto msg = random_bytes(bytes, static_cast<std::uint64_t>(tag) + bytes);
  Bytes got(bytes);
  Request r = b.irecv(a.rank(), tag, got.data(), got.size());
  a.send(b.rank(), tag, msg.data(), msg.size());
  Status s = r.wait();
  EXPECT_EQ(s.bytes, bytes);
  EXPECT_TRUE(got == msg);
}

std::size_t rss_bytes() {
  long pages_total = 0, pages_res = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages_total, &pages_res) != 2) pages_res = 0;
    std::fclose(f);
  }
  return static_cast<std::size_t>(pages_res) * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
}

// A hostile peer is cut off as a failed rank: operations involving it fail with
// rank_failed, and the message says it broke the protocol.
bool cut_off_for_protocol(const Error& e) {
  return e.code() == Errc::rank_failed && std::string(e.what()).find("protocol") != std::string::npos;
}

// ---- argument validation ------------------------------------------------------------------

TEST(BadInput, InvalidArgumentsNameOperationAndValue) {
  nexar::Config cfg = test_config();
  cfg.max_frame_bytes = 1u << 20;
  auto comms = nexar::bootstrap_local(3, cfg);
  Communicator& c = comms[0];
  const int world = 3;
  char buf[64] = {};
  Bytes too_big((1u << 20) + 1);

  // Expects invalid_argument whose text names `op` and `value`.
  auto check = [&](const char* op, const std::string& value, auto&& f) {
    std::string w = expect_error(Errc::invalid_argument, f);
    EXPECT_TRUE(contains(w, op)) << "'" << w << "' does not name " << op;
    EXPECT_TRUE(contains(w, value)) << "'" << w << "' does not name " << value;
  };

  for (int bad : {-2, world, world + 5}) {
    std::string v = std::to_string(bad);
    check("send", v, [&] { c.send(bad, 1, buf, 8); });
    check("send", v, [&] { c.isend(bad, 1, buf, 8); });
    check("recv", v, [&] { c.recv(bad, 1, buf, 8); });
    check("recv", v, [&] { c.irecv(bad, 1, buf, 8); });
    check("bulk_send", v, [&] { c.bulk_send(bad, 1, buf, 8); });
    check("bulk_recv", v, [&] { c.bulk_recv(bad, 1, buf, 8); });
    ConstBuffer part{buf, 8};
    check("send_iov", v, [&] { c.send_iov(bad, 1, std::span<const ConstBuffer>(&part, 1)); });
    check("rpc", v, [&] { c.rpc(bad, 1, {}); });
  }
  // any_source is only for receives.
  check("send", "-1", [&] { c.send(nexar::any_source, 1, buf, 8); });
  for (int bad : {-2, nexar::max_tag + 1}) {
    std::string v = std::to_string(bad);
    check("send", v, [&] { c.send(1, bad, buf, 8); });
    check("recv", v, [&] { c.recv(1, bad, buf, 8); });
    check("bulk_send", v, [&] { c.bulk_send(1, bad, buf, 8); });
    check("bulk_recv", v, [&] { c.ibulk_recv(1, bad, buf, 8); });
  }
  check("send", "-1", [&] { c.isend(1, nexar::any_tag, buf, 8); });  // any_tag only for receives
  check("send", "10", [&] { c.send(1, 1, nullptr, 10); });
  check("recv", "10", [&] { c.irecv(1, 1, nullptr, 10); });
  check("bulk_send", "10", [&] { c.ibulk_send(1, 1, nullptr, 10); });
  ConstBuffer null_part[2] = {{buf, 4}, {nullptr, 10}};
  check("send_iov", "10", [&] { c.isend_iov(1, 1, null_part); });
  std::string limit = std::to_string(1u << 20);
  std::string size = std::to_string(too_big.size());
  check("send", size, [&] { c.send(1, 1, too_big.data(), too_big.size()); });
  check("bulk_send", size, [&] { c.bulk_send(1, 1, too_big.data(), too_big.size()); });
  ConstBuffer halves[2] = {{too_big.data(), 1u << 19}, {too_big.data(), (1u << 19) + 1}};
  check("send_iov", size, [&] { c.send_iov(1, 1, halves); });
  check("rpc", size, [&] { c.rpc(1, 1, too_big); });
  expect_error(Errc::invalid_argument, [&] { c.register_rpc(1, nexar::RpcHandler{}); });
  // A null buffer with zero bytes is fine.
  Request r = comms[1].irecv(0, 2, nullptr, 0);
  c.send(1, 2, nullptr, 0);
  EXPECT_EQ(r.wait().bytes, 0u);
  // The largest allowed message still goes through, and the communicator keeps working.
  Bytes max_msg = random_bytes(1u << 20, 1);
  Bytes got(max_msg.size());
  Request r2 = comms[1].irecv(0, 3, got.data(), got.size());
  c.send(1, 3, max_msg.data(), max_msg.size());
  r2.wait();
  EXPECT_TRUE(got == max_msg);
  ping(comms[0], comms[2], 4);
  ping(comms[2], comms[0], 4);
  EXPECT_TRUE(c.is_open());
  // A default-constructed communicator is refused, not a crash.
  Communicator none;
  expect_error(Errc::invalid_argument, [&] { none.send(1, 1, buf, 1); });
  EXPECT_FALSE(none.is_open());
}

// ---- certificates from another cluster ------------------------------------------------------

TEST(BadInput, CertificateFromAnotherCluster) {
  nexar::Config cfg = test_config();
  cfg.connect_timeout = 3s;
  auto a = nexar::cluster::plan_local(2, cfg);
  auto b = nexar::cluster::plan_local(2, cfg);
  a[1].creds = b[1].creds;  // rank 1 of cluster A presents cluster B's identity
  nexar::cluster::discard(b, -1);
  auto t0 = Clock::now();
  auto start = [&](int r) {
    return std::async(std::launch::async, [&, r] {
      try {
        nexar::cluster::start_node(std::move(a[static_cast<std::size_t>(r)]), cfg);
      } catch (const Error& e) {
        return std::make_pair(e.code(), std::string(e.what()));
      }
      return std::make_pair(Errc::ok, std::string("started"));
    });
  };
  auto f0 = start(0);
  auto f1 = start(1);
  ASSERT_EQ(f0.wait_for(30s), std::future_status::ready) << "rank 0 hangs";
  ASSERT_EQ(f1.wait_for(30s), std::future_status::ready) << "rank 1 hangs";
  auto [c0, w0] = f0.get();
  auto [c1, w1] = f1.get();
  EXPECT_LT(Clock::now() - t0, 15s) << "took far longer than connect_timeout";
  EXPECT_TRUE(c0 == Errc::tls || c0 == Errc::timeout) << w0;
  EXPECT_TRUE(c1 == Errc::tls || c1 == Errc::timeout) << w1;
  EXPECT_TRUE(c0 == Errc::tls || c1 == Errc::tls) << "neither side reported a TLS failure:\n"
                                                  << w0 << "\n" << w1;
  for (auto& [code, w] : {std::pair{c0, w0}, std::pair{c1, w1}}) {
    if (code == Errc::tls) {
      EXPECT_TRUE(contains(w, "certificate") || contains(w, "cluster")) << w;
    }
  }
  std::printf("rank 0: %s\nrank 1: %s\n", w0.c_str(), w1.c_str());
}

// ---- a hostile rank 1 speaking valid QUIC/TLS but invalid nexar frames ---------------------

// Plays rank 1 on the engine thread: accepts rank 0's connection, opens every lane
// with correct preambles and a correct hello, then writes whatever the test asks for.
class HostilePeer final : public nexar::quic::ConnectionHandler {
 public:
  std::string on_peer_identity(nexar::quic::Connection&, const std::string& node) override {
    return node == "rank-0" ? std::string() : "unexpected node " + node;
  }
  void on_established(nexar::quic::Connection& c) override {
    conn_ = &c;
    for (int l = 0; l < nexar::wire::lane_count; ++l) {
      out_[l] = c.open_stream(l);
      std::vector<std::uint8_t> pre(nexar::wire::preamble_size);
      nexar::wire::encode_preamble(static_cast<nexar::wire::Lane>(l),
                                   std::span<std::byte, nexar::wire::preamble_size>(
                                       reinterpret_cast<std::byte*>(pre.data()), pre.size()));
      push(static_cast<nexar::wire::Lane>(l), std::move(pre));
    }
    const std::string name = "rank-1";
    nexar::wire::FrameHeader h;
    h.type = nexar::wire::FrameType::hello;
    h.src = 1;
    h.tag = 2;  // world size
    h.length = name.size();
    std::vector<std::uint8_t> frame(nexar::wire::header_size + name.size());
    nexar::wire::encode_header(h, std::span<std::byte, nexar::wire::header_size>(
                                      reinterpret_cast<std::byte*>(frame.data()), nexar::wire::header_size));
    std::memcpy(frame.data() + nexar::wire::header_size, name.data(), name.size());
    push(nexar::wire::Lane::control, std::move(frame));
  }
  void on_stream_data(nexar::quic::Connection& c, std::int64_t stream, const std::uint8_t*,
                      std::size_t len) override {
    c.consumed(stream, len);
  }
  void on_closed(nexar::quic::Connection&, Errc code, const std::string& why) override {
    conn_ = nullptr;
    if (!closed_.exchange(true)) closed_promise_.set_value(std::string(nexar::to_string(code)) + ": " + why);
  }

  // Engine thread only. The bytes stay alive until this object goes.
  bool push(nexar::wire::Lane lane, std::vector<std::uint8_t> bytes) {
    if (!conn_) return false;
    keep_.push_back(std::move(bytes));
    auto& k = keep_.back();
    conn_->push(out_[static_cast<int>(lane)], nexar::quic::Chunk{k.data(), k.size(), {}});
    return true;
  }

  std::future<std::string> closed_future() { return closed_promise_.get_future(); }

 private:
  nexar::quic::Connection* conn_ = nullptr;
  std::int64_t out_[nexar::wire::lane_count] = {-1, -1, -1, -1, -1, -1};
  std::deque<std::vector<std::uint8_t>> keep_;
  std::atomic<bool> closed_{false};
  std::promise<std::string> closed_promise_;
};

// Rank 0 is a real node; rank 1 is a HostilePeer on an engine and endpoint of its own.
struct HostileWorld {
  explicit HostileWorld(nexar::Config c)
      : cfg(c), plan(nexar::cluster::plan_local(2, cfg)), engine(cfg.spin), tls(plan[1].creds) {
    nexar::quic::ConnectionSettings settings;
    settings.idle_timeout_ns = 15'000'000'000ull;
    settings.handshake_timeout_ns = 15'000'000'000ull;
    ep = std::make_unique<nexar::quic::Endpoint>(engine, plan[1].udp_fd, tls, settings, false);
    plan[1].udp_fd = -1;  // the endpoint owns it now
    engine.start();
    closed = hostile.closed_future();
    on_engine(engine, [&] { ep->start([&](nexar::quic::Connection&) { return &hostile; }); });
    auto started = std::async(std::launch::async,
                              [&] { return nexar::cluster::start_node(std::move(plan[0]), cfg); });
    if (started.wait_for(30s) != std::future_status::ready) throw std::runtime_error("rank 0 never finished connecting");
    c0 = started.get();
  }
  ~HostileWorld() {
    c0.close();
    on_engine(engine, [&] { ep->shutdown("test over"); });
    engine.stop();
    ep.reset();
  }
  bool push(nexar::wire::Lane lane, std::vector<std::uint8_t> bytes) {
    return on_engine(engine, [&] { return hostile.push(lane, std::move(bytes)); });
  }

  nexar::Config cfg;
  std::vector<nexar::cluster::NodePlan> plan;
  HostilePeer hostile;  // outlives the endpoint, which points at it
  nexar::detail::Engine engine;
  nexar::tls::TlsContext tls;
  std::unique_ptr<nexar::quic::Endpoint> ep;
  std::future<std::string> closed;
  Communicator c0;
};

void hostile_data_lane(const std::vector<std::uint8_t>& evil) {
  nexar::Config cfg = test_config();
  cfg.op_timeout = 20s;  // a failure must come from the protocol error, not a deadline
  HostileWorld w(cfg);
  Communicator& c0 = w.c0;
  auto& closed = w.closed;
  const std::size_t rss_before = rss_bytes();

  char buf[64];
  Request pending = c0.irecv(1, 5, buf, sizeof buf);
  Request pending_any = c0.irecv(nexar::any_source, 6, buf, sizeof buf);
  Bytes args(4);
  nexar::RpcCall pending_rpc = c0.rpc_async(1, 1, args);
  EXPECT_FALSE(pending.test());

  ASSERT_TRUE(w.push(nexar::wire::Lane::data, evil));

  // The pending receive from rank 1 fails promptly with a clear error.
  bool done = false;
  std::string what;
  try {
    done = pending.wait_for(10s);
  } catch (const Error& e) {
    done = true;
    what = e.what();
    EXPECT_TRUE(cut_off_for_protocol(e))
        << "pending recv failed with " << nexar::to_string(e.code()) << ": " << e.what();
  }
  EXPECT_TRUE(done) << "pending recv from the hostile peer did not fail";
  std::printf("pending recv: %s\n", what.c_str());
  try {
    EXPECT_TRUE(pending_rpc.wait_for(10s)) << "pending rpc to the hostile peer did not fail";
  } catch (const Error& e) {
    EXPECT_TRUE(cut_off_for_protocol(e))
        << "pending rpc failed with " << nexar::to_string(e.code()) << ": " << e.what();
  }
  // Rank 0 closed the connection and told the peer why.
  ASSERT_EQ(closed.wait_for(10s), std::future_status::ready) << "rank 0 kept the connection open";
  std::string why = closed.get();
  std::printf("hostile peer saw: %s\n", why.c_str());
  EXPECT_TRUE(contains(why, "protocol")) << why;

  // Rank 0 is still up, did not reserve memory for the claimed payload, and refuses
  // further traffic to the bad peer with a peer error.
  EXPECT_TRUE(c0.is_open());
  EXPECT_LT(rss_bytes(), std::size_t{1} << 30);
  EXPECT_LT(rss_bytes(), rss_before + (std::size_t{256} << 20));
  try {
    c0.send(1, 5, buf, 8);
    ADD_FAILURE() << "send to the hostile peer succeeded after the protocol error";
  } catch (const Error& e) {
    EXPECT_TRUE(cut_off_for_protocol(e))
        << nexar::to_string(e.code()) << ": " << e.what();
  }
  // The any-source receive failed too: the world communicator contains the failed rank.
  pending_any.cancel();
  try {
    pending_any.wait();
  } catch (const Error&) {
  }
}

// A frame header and the first `part` bytes of an eager message of `size` bytes with `tag`.
std::vector<std::uint8_t> eager_start(int tag, std::size_t size, std::size_t part, std::uint8_t fill) {
  nexar::wire::FrameHeader h;
  h.type = nexar::wire::FrameType::eager;
  h.src = 1;
  h.tag = static_cast<std::uint64_t>(tag);
  h.length = size;
  std::vector<std::uint8_t> out(nexar::wire::header_size + part, fill);
  nexar::wire::encode_header(h, std::span<std::byte, nexar::wire::header_size>(
                                    reinterpret_cast<std::byte*>(out.data()), nexar::wire::header_size));
  return out;
}

// A peer that stops in the middle of a message must not hold the receive matched with it
// past its deadline, whether the receive was posted first or matched the message while it
// arrived; and the rest of that message, when it comes, lands nowhere (the receive's buffer
// may be gone), while later messages are received intact.
TEST(BadInput, PeerStallingMidMessageTimesOutTheReceive) {
  nexar::Config cfg = test_config();
  cfg.op_timeout = 1s;
  HostileWorld w(cfg);
  constexpr std::size_t kSize = 4096, kPart = 1000;
  for (bool posted_first : {true, false}) {
    SCOPED_TRACE(posted_first ? "receive posted first" : "message arrives first");
    const int tag = posted_first ? 5 : 6;
    auto buf = std::make_unique<std::vector<std::uint8_t>>(kSize, 0);
    Request r;
    if (posted_first) {
      r = w.c0.irecv(1, tag, buf->data(), buf->size());
      ASSERT_TRUE(w.push(nexar::wire::Lane::data, eager_start(tag, kSize, kPart, 0xA1)));
    } else {
      ASSERT_TRUE(w.push(nexar::wire::Lane::data, eager_start(tag, kSize, kPart, 0xA1)));
      std::this_thread::sleep_for(100ms);  // let the start arrive as an unexpected message
      r = w.c0.irecv(1, tag, buf->data(), buf->size());
    }
    // wait() enforces the receive's own deadline (1 s); a receive stuck past it would hang
    // this thread, so it waits on a thread of its own that is abandoned if so.
    auto outcome = std::make_shared<std::promise<std::string>>();
    std::thread([r, outcome] {
      try {
        r.wait();
        outcome->set_value("succeeded without its whole message");
      } catch (const Error& e) {
        outcome->set_value(std::string(nexar::to_string(e.code())));
      }
    }).detach();
    auto f = outcome->get_future();
    ASSERT_EQ(f.wait_for(15s), std::future_status::ready) << "the receive outlived its 1 s deadline by 14 s";
    EXPECT_EQ(f.get(), "timeout");
    buf.reset();  // the application frees the buffer after the error
    // The rest of the cut message, then a whole one with the same tag.
    ASSERT_TRUE(w.push(nexar::wire::Lane::data, std::vector<std::uint8_t>(kSize - kPart, 0xA2)));
    ASSERT_TRUE(w.push(nexar::wire::Lane::data, eager_start(tag, 8, 8, 0xB3)));
    std::vector<std::uint8_t> next(8, 0);
    Status st = w.c0.recv(1, tag, next.data(), next.size());
    EXPECT_EQ(st.bytes, 8u);
    EXPECT_EQ(next, std::vector<std::uint8_t>(8, 0xB3));
  }
}

TEST(BadInput, HostilePeerClaimsFourGiBFrame) {
  // A valid header claiming 4 GiB of payload (the data lane's preamble is already out),
  // followed by some payload bytes.
  nexar::wire::FrameHeader h;
  h.type = nexar::wire::FrameType::eager;
  h.src = 1;
  h.tag = 5;
  h.length = std::uint64_t{4} << 30;
  std::vector<std::uint8_t> evil(nexar::wire::header_size + 65536, 0xAB);
  nexar::wire::encode_header(h, std::span<std::byte, nexar::wire::header_size>(
                                    reinterpret_cast<std::byte*>(evil.data()), nexar::wire::header_size));
  hostile_data_lane(evil);
}

TEST(BadInput, HostilePeerSendsGarbageAfterPreamble) {
  std::vector<std::uint8_t> evil(4096);
  std::mt19937 rng(42);
  for (auto& b : evil) b = static_cast<std::uint8_t>(rng());
  evil[0] = 0xEE;  // no valid frame type, whatever the generator gives
  hostile_data_lane(evil);
}

// ---- garbage datagrams ------------------------------------------------------------------------

TEST(BadInput, GarbageDatagramsDuringExchange) {
  nexar::Config cfg = test_config();
  cfg.op_timeout = 10s;
  auto plan = nexar::cluster::plan_local(2, cfg);
  const std::string target = plan[0].addrs[0];
  auto f0 = std::async(std::launch::async, [&] { return nexar::cluster::start_node(std::move(plan[0]), cfg); });
  auto f1 = std::async(std::launch::async, [&] { return nexar::cluster::start_node(std::move(plan[1]), cfg); });
  Communicator c0 = f0.get(), c1 = f1.get();
  const std::size_t eager = c0.config().eager_limit;

  std::atomic<bool> spray_done{false};
  std::thread spray([&] {
    auto to = nexar::quic::Address::parse(target);
    int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
    ASSERT_GE(fd, 0);
    std::mt19937 rng(7);
    std::vector<std::uint8_t> d(1500);
    for (int i = 0; i < 1000; ++i) {
      std::size_t n = 1 + rng() % 1500;
      for (std::size_t k = 0; k < n; ++k) d[k] = static_cast<std::uint8_t>(rng());
      // Every tenth one looks like a QUIC long-header Initial, to reach deeper code.
      if (i % 10 == 0) d[0] = 0xC0 | (d[0] & 0x0F);
      ::sendto(fd, d.data(), n, 0, to.sa(), to.len);
      if (i % 100 == 99) std::this_thread::sleep_for(1ms);
    }
    ::close(fd);
    spray_done = true;
  });
  struct Joiner {
    std::thread& t;
    ~Joiner() {
      if (t.joinable()) t.join();
    }
  } joiner{spray};
  // Exchange both ways while the datagrams arrive.
  int rounds = 0;
  for (int i = 0; i < 150 || !spray_done; ++i) {
    std::size_t size = i % 10 == 0 ? eager * 2 + static_cast<std::size_t>(i) : 10 + static_cast<std::size_t>(i);
    auto msg = random_bytes(size, static_cast<std::uint64_t>(i));
    Bytes got(size);
    Request r = c1.irecv(0, 1, got.data(), got.size());
    c0.send(1, 1, msg.data(), msg.size());
    ASSERT_EQ(r.wait().bytes, size);
    ASSERT_TRUE(got == msg) << "round " << i;
    Request back_send = c1.isend(0, 2, got.data(), got.size());
    Bytes back(size);
    ASSERT_EQ(c0.recv(1, 2, back.data(), back.size()).bytes, size);
    back_send.wait();
    ASSERT_TRUE(back == msg) << "round " << i;
    ++rounds;
    if (i > 100000) break;
  }
  spray.join();
  EXPECT_GE(rounds, 150);
  // Still healthy afterwards.
  ping(c0, c1, 3, eager * 4);
  ping(c1, c0, 3, 1);
  c0.close();
  c1.close();
}

}  // namespace
