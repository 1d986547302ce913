// Tests of src/core: error codes and messages, Config parsing and validation, logging.
#include <gtest/gtest.h>

#include <nexar/config.hpp>
#include <nexar/error.hpp>

#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include "core/error_format.hpp"
#include "core/log.hpp"

using namespace std::chrono_literals;
using nexar::Config;
using nexar::Errc;
using nexar::Error;
using nexar::LogLevel;

namespace {

constexpr std::uint64_t KiB = 1024;
constexpr std::uint64_t MiB = 1024 * KiB;
constexpr std::uint64_t GiB = 1024 * MiB;
constexpr std::uint64_t TiB = 1024 * GiB;

const char* const kVars[] = {
    "NEXAR_TIMEOUT_MS",        "NEXAR_CONNECT_TIMEOUT_MS",     "NEXAR_IDLE_TIMEOUT_MS",
    "NEXAR_RPC_TIMEOUT_MS",    "NEXAR_MAX_FRAME_BYTES",        "NEXAR_EAGER_LIMIT_BYTES",
    "NEXAR_UNEXPECTED_LIMIT_BYTES", "NEXAR_STREAM_WINDOW_BYTES", "NEXAR_UDP_PAYLOAD_BYTES",
    "NEXAR_UDP_GSO",           "NEXAR_SPIN_US",                "NEXAR_DEBUG",
    "NEXAR_SEGMENT_BYTES",     "NEXAR_ALLREDUCE_RING_BYTES",   "NEXAR_BROADCAST_CHAIN_BYTES",
    "NEXAR_COLLECTIVE_EAGER_BYTES", "NEXAR_ALLREDUCE_DOUBLING_BYTES", "NEXAR_YIELD_WHEN_IDLE", "NEXAR_RPC_THREADS", "NEXAR_CONNECTIONS_PER_PEER", "NEXAR_ENGINE_THREADS",
    "NEXAR_FAILURE_TIMEOUT_MS", "NEXAR_ON_FAILURE", "NEXAR_SHM", "NEXAR_SHM_RING_BYTES", "NEXAR_SHM_COLLECTIVE_BYTES",
    "NEXAR_BULK_SCAVENGER", "NEXAR_CONGESTION", "NEXAR_LINK", "NEXAR_TCP_CIPHER",
};

// Clears every NEXAR_* variable for the test and puts the original values back after it.
class EnvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : kVars) {
      if (const char* old = std::getenv(v)) saved_[v] = old;
      ::unsetenv(v);
    }
  }
  void TearDown() override {
    for (const char* v : kVars) {
      auto it = saved_.find(v);
      if (it != saved_.end()) {
        ::setenv(v, it->second.c_str(), 1);
      } else {
        ::unsetenv(v);
      }
    }
  }
  static void set(const char* var, const char* value) { ::setenv(var, value, 1); }

 private:
  std::map<std::string, std::string> saved_;
};

// Whether s matches pattern, where '#' stands for one digit and '*' for one or more digits.
// (std::regex trips a GCC 12 -Wmaybe-uninitialized false positive under sanitizers.)
bool like(std::string_view s, std::string_view pattern) {
  std::size_t i = 0;
  for (char p : pattern) {
    const auto digit = [&] { return i < s.size() && s[i] >= '0' && s[i] <= '9'; };
    if (p == '#' || p == '*') {
      if (!digit()) return false;
      ++i;
      while (p == '*' && digit()) ++i;
    } else {
      if (i >= s.size() || s[i] != p) return false;
      ++i;
    }
  }
  return i == s.size();
}

// Runs f, expects nexar::Error(invalid_argument), returns its what().
std::string invalid_what(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument) << e.what();
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "unexpected exception: " << e.what();
    return {};
  }
  ADD_FAILURE() << "no exception thrown";
  return {};
}

}  // namespace

// ---- errors ------------------------------------------------------------------------------

TEST(Error, ErrorCodeIntegration) {
  std::error_code ec = Errc::peer_failed;  // via is_error_code_enum
  EXPECT_EQ(ec.value(), 5);
  EXPECT_EQ(&ec.category(), &nexar::error_category());
  EXPECT_STREQ(ec.category().name(), "nexar");
  EXPECT_EQ(ec, Errc::peer_failed);
  EXPECT_NE(ec, Errc::peer_closed);
  EXPECT_EQ(ec.message().rfind("peer_failed: ", 0), 0u) << ec.message();
  EXPECT_GT(ec.message().size(), std::string("peer_failed: ").size());

  auto ok = nexar::make_error_code(Errc::ok);
  EXPECT_EQ(ok.value(), 0);
  EXPECT_FALSE(ok);  // value 0 means success for std::error_code
  EXPECT_NE(std::error_code(Errc::timeout), std::make_error_code(std::errc::timed_out));

  EXPECT_NE(nexar::error_category().message(999).find("999"), std::string::npos);
}

TEST(Error, ToStringNamesEveryCode) {
  const std::pair<Errc, const char*> names[] = {
      {Errc::ok, "ok"},
      {Errc::invalid_argument, "invalid_argument"},
      {Errc::truncated, "truncated"},
      {Errc::timeout, "timeout"},
      {Errc::peer_closed, "peer_closed"},
      {Errc::peer_failed, "peer_failed"},
      {Errc::protocol, "protocol"},
      {Errc::tls, "tls"},
      {Errc::unknown_rpc, "unknown_rpc"},
      {Errc::rpc_failed, "rpc_failed"},
      {Errc::closed, "closed"},
      {Errc::io, "io"},
      {Errc::cancelled, "cancelled"},
      {Errc::rejected, "rejected"},
  };
  for (const auto& [code, name] : names) {
    EXPECT_STREQ(nexar::to_string(code), name);
    const std::string msg = nexar::make_error_code(code).message();
    EXPECT_EQ(msg.rfind(std::string(name) + ": ", 0), 0u) << msg;
  }
  EXPECT_STREQ(nexar::to_string(static_cast<Errc>(77)), "unknown");
}

TEST(Error, ErrorCarriesCode) {
  const Error e(Errc::truncated, "recv: truncated");
  EXPECT_EQ(e.code(), Errc::truncated);
  EXPECT_STREQ(e.what(), "recv: truncated");
}

TEST(ErrorFormat, AllVariants) {
  using nexar::detail::ErrorContext;
  using nexar::detail::make_error;

  const Error full = make_error(Errc::peer_failed, {"recv", 0, 3, "127.0.0.1:40211", {}},
                                "idle timeout");
  EXPECT_EQ(full.code(), Errc::peer_failed);
  EXPECT_STREQ(full.what(), "recv: rank 0, peer 3 (127.0.0.1:40211): peer_failed: idle timeout");

  EXPECT_STREQ(make_error(Errc::timeout, {"send", 2, 1, "", {}}, "deadline 5000 ms").what(),
               "send: rank 2, peer 1: timeout: deadline 5000 ms");
  EXPECT_STREQ(make_error(Errc::invalid_argument, {"send", 2, -1, "", {}}, "bad tag").what(),
               "send: rank 2: invalid_argument: bad tag");
  EXPECT_STREQ(make_error(Errc::tls, {"connect", 1, -1, "10.0.0.2:7000", {}}, "bad cert").what(),
               "connect: rank 1, peer at 10.0.0.2:7000: tls: bad cert");
  EXPECT_STREQ(make_error(Errc::io, {"bind", -1, -1, "", {}}, "EADDRINUSE").what(),
               "bind: io: EADDRINUSE");
  EXPECT_STREQ(make_error(Errc::closed, {"wait", 0, 4, "", {}}, "").what(),
               "wait: rank 0, peer 4: closed");
  EXPECT_STREQ(make_error(Errc::protocol, {"", -1, 7, "", {}}, "bad frame").what(),
               "peer 7: protocol: bad frame");
  EXPECT_STREQ(make_error(Errc::cancelled, ErrorContext{}, "").what(), "cancelled");

  // Elapsed time, with three decimals.
  ErrorContext ctx{"recv", 0, 3, "127.0.0.1:40211", std::chrono::steady_clock::now() - 1204ms};
  const Error timed = make_error(Errc::peer_failed, ctx, "idle timeout");
  EXPECT_TRUE(like(timed.what(),
                   "recv: rank 0, peer 3 (127.0.0.1:40211), after 1.2## s: peer_failed: idle timeout"))
      << timed.what();

  ErrorContext bare;
  bare.op = "barrier";
  bare.start = std::chrono::steady_clock::now();
  EXPECT_TRUE(like(make_error(Errc::timeout, bare, "x").what(), "barrier: after 0.### s: timeout: x"));

  // A start in the future does not produce a negative duration.
  bare.start = std::chrono::steady_clock::now() + 1h;
  EXPECT_STREQ(make_error(Errc::timeout, bare, "x").what(), "barrier: after 0.000 s: timeout: x");

  EXPECT_EQ(nexar::detail::format_error(Errc::io, {"send", 0, 1, "", {}}, "EPIPE"),
            "send: rank 0, peer 1: io: EPIPE");
}

// ---- config: defaults and parsing ---------------------------------------------------------

TEST_F(EnvTest, DefaultsValidate) {
  const Config c;
  EXPECT_NO_THROW(c.validate());
  const Config e = Config::from_env();
  EXPECT_EQ(e.op_timeout, c.op_timeout);
  EXPECT_EQ(e.connect_timeout, c.connect_timeout);
  EXPECT_EQ(e.idle_timeout, c.idle_timeout);
  EXPECT_EQ(e.rpc_timeout, c.rpc_timeout);
  EXPECT_EQ(e.rpc_threads, c.rpc_threads);
  EXPECT_EQ(e.connections_per_peer, c.connections_per_peer);
  EXPECT_EQ(e.engine_threads, c.engine_threads);
  EXPECT_EQ(e.max_frame_bytes, c.max_frame_bytes);
  EXPECT_EQ(e.eager_limit, c.eager_limit);
  EXPECT_EQ(e.unexpected_limit, c.unexpected_limit);
  EXPECT_EQ(e.stream_window, c.stream_window);
  EXPECT_EQ(e.udp_payload, c.udp_payload);
  EXPECT_EQ(e.udp_gso, c.udp_gso);
  EXPECT_EQ(e.bulk_scavenger, c.bulk_scavenger);
  EXPECT_EQ(e.congestion, c.congestion);
  EXPECT_EQ(e.shm, c.shm);
  EXPECT_EQ(e.shm_ring_bytes, c.shm_ring_bytes);
  EXPECT_EQ(e.shm_collective_bytes, c.shm_collective_bytes);
  EXPECT_EQ(e.spin, c.spin);
  EXPECT_EQ(e.yield_when_idle, c.yield_when_idle);
  EXPECT_EQ(e.log_level, c.log_level);
}

TEST_F(EnvTest, CollectiveSettings) {
  setenv("NEXAR_SEGMENT_BYTES", "64K", 1);
  setenv("NEXAR_ALLREDUCE_RING_BYTES", "1M", 1);
  setenv("NEXAR_ALLREDUCE_DOUBLING_BYTES", "2K", 1);
  setenv("NEXAR_BROADCAST_CHAIN_BYTES", "0", 1);
  setenv("NEXAR_COLLECTIVE_EAGER_BYTES", "256K", 1);
  Config c = Config::from_env();
  EXPECT_EQ(c.tuning.segment_bytes, 64u * 1024);
  EXPECT_EQ(c.tuning.allreduce_ring_bytes, 1024u * 1024);
  EXPECT_EQ(c.tuning.allreduce_doubling_bytes, 2048u);
  EXPECT_EQ(c.tuning.broadcast_chain_bytes, 0u);
  EXPECT_EQ(c.tuning.collective_eager_bytes, 256u * 1024);
  setenv("NEXAR_COLLECTIVE_EAGER_BYTES", "1x", 1);
  try {
    Config::from_env();
    ADD_FAILURE() << "collective_eager_bytes '1x' accepted";
  } catch (const nexar::Error& e) {
    EXPECT_EQ(e.code(), nexar::Errc::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("NEXAR_COLLECTIVE_EAGER_BYTES"), std::string::npos) << e.what();
  }
  unsetenv("NEXAR_COLLECTIVE_EAGER_BYTES");
  setenv("NEXAR_SEGMENT_BYTES", "1K", 1);  // below the 4 KiB minimum
  try {
    Config::from_env();
    ADD_FAILURE() << "segment_bytes 1 KiB accepted";
  } catch (const nexar::Error& e) {
    EXPECT_EQ(e.code(), nexar::Errc::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("NEXAR_SEGMENT_BYTES"), std::string::npos) << e.what();
  }
  unsetenv("NEXAR_SEGMENT_BYTES");
  unsetenv("NEXAR_ALLREDUCE_RING_BYTES");
  unsetenv("NEXAR_ALLREDUCE_DOUBLING_BYTES");
  unsetenv("NEXAR_BROADCAST_CHAIN_BYTES");
  unsetenv("NEXAR_COLLECTIVE_EAGER_BYTES");
}

TEST_F(EnvTest, Describe) {
  Config c;
  const std::string d = c.describe();
  const char* expected =
      "op_timeout = 300000 ms\n"
      "connect_timeout = 20000 ms\n"
      "idle_timeout = 15000 ms\n"
      "failure_timeout = 3000 ms\n"
      "on_failure = abort\n"
      "rpc_timeout = 30000 ms\n"
      "rpc_threads = 16\n"
      "stall_warn = 10000 ms\n"
      "recorder_ops = 1024\n"
      "max_frame_bytes = 2 GiB\n"
      "eager_limit = 64 KiB\n"
      "unexpected_limit = 64 MiB\n"
      "stream_window = 16 MiB\n"
      "udp_payload = auto (the path MTU)\n"
      "udp_gso = on\n"
      "bulk_scavenger = on\n"
      "congestion = cubic\n"
      "link = quic\n"
      "tcp_cipher = tls\n"
      "connections_per_peer = 4\n"
      "engine_threads = 1\n"
      "shm = on\n"
      "shm_ring_bytes = 1 MiB\n"
      "shm_collective_bytes = 1 GiB\n"
      "topology = full_mesh\n"
      "lazy_connect = off\n"
      "relay_hop_limit = auto (diameter + 4)\n"
      "relay_window = 4 MiB\n"
      "spin = 100 us\n"
      "yield_when_idle = off\n"
      "tuning.segment_bytes = 512 KiB\n"
      "tuning.allreduce_ring_bytes = 256 KiB\n"
      "tuning.allreduce_doubling_bytes = 16 KiB\n"
      "tuning.broadcast_chain_bytes = 1 MiB\n"
      "tuning.collective_eager_bytes = 1 MiB\n"
      "log_level = warn";
  EXPECT_EQ(d, expected);

  c.eager_limit = 1000;
  c.max_frame_bytes = TiB;
  c.udp_payload = 1452;
  c.udp_gso = false;
  c.log_level = LogLevel::trace;
  const std::string d2 = c.describe();
  EXPECT_NE(d2.find("eager_limit = 1000 bytes\n"), std::string::npos) << d2;
  EXPECT_NE(d2.find("max_frame_bytes = 1 TiB\n"), std::string::npos) << d2;
  EXPECT_NE(d2.find("udp_payload = 1452 bytes\n"), std::string::npos) << d2;
  EXPECT_NE(d2.find("udp_gso = off\n"), std::string::npos) << d2;
  EXPECT_NE(d2.find("log_level = trace"), std::string::npos) << d2;
}

TEST_F(EnvTest, EveryVariableParsed) {
  set("NEXAR_TIMEOUT_MS", "1234");
  set("NEXAR_CONNECT_TIMEOUT_MS", "2345");
  set("NEXAR_IDLE_TIMEOUT_MS", "3456");
  set("NEXAR_RPC_TIMEOUT_MS", "4567");
  set("NEXAR_FAILURE_TIMEOUT_MS", "750");
  set("NEXAR_ON_FAILURE", "Automatic");
  set("NEXAR_RPC_THREADS", "3");
  set("NEXAR_CONNECTIONS_PER_PEER", "2");
  set("NEXAR_ENGINE_THREADS", "3");
  set("NEXAR_MAX_FRAME_BYTES", "1G");
  set("NEXAR_EAGER_LIMIT_BYTES", "32768");
  set("NEXAR_UNEXPECTED_LIMIT_BYTES", "128M");
  set("NEXAR_STREAM_WINDOW_BYTES", "4M");
  set("NEXAR_UDP_PAYLOAD_BYTES", "1452");
  set("NEXAR_UDP_GSO", "0");
  set("NEXAR_BULK_SCAVENGER", "off");
  set("NEXAR_CONGESTION", "BBR");
  set("NEXAR_LINK", "TCP");
  set("NEXAR_TCP_CIPHER", "none");
  set("NEXAR_SPIN_US", "250");
  set("NEXAR_YIELD_WHEN_IDLE", "1");
  set("NEXAR_DEBUG", "debug");
  const Config c = Config::from_env();
  EXPECT_EQ(c.op_timeout, 1234ms);
  EXPECT_EQ(c.connect_timeout, 2345ms);
  EXPECT_EQ(c.idle_timeout, 3456ms);
  EXPECT_EQ(c.rpc_timeout, 4567ms);
  EXPECT_EQ(c.failure_timeout, 750ms);
  EXPECT_EQ(c.on_failure, nexar::FailurePolicy::automatic);
  EXPECT_EQ(c.rpc_threads, 3u);
  EXPECT_EQ(c.connections_per_peer, 2u);
  EXPECT_EQ(c.engine_threads, 3u);
  EXPECT_EQ(c.max_frame_bytes, GiB);
  EXPECT_EQ(c.eager_limit, 32768u);
  EXPECT_EQ(c.unexpected_limit, 128 * MiB);
  EXPECT_EQ(c.stream_window, 4 * MiB);
  EXPECT_EQ(c.udp_payload, 1452u);
  EXPECT_FALSE(c.udp_gso);
  EXPECT_FALSE(c.bulk_scavenger);
  EXPECT_EQ(c.congestion, nexar::Congestion::bbr);
  EXPECT_EQ(c.link, nexar::LinkKind::tcp);
  EXPECT_EQ(c.tcp_cipher, nexar::TcpCipher::none);
  EXPECT_EQ(c.spin, 250us);
  EXPECT_TRUE(c.yield_when_idle);
  EXPECT_EQ(c.log_level, LogLevel::debug);
}

TEST_F(EnvTest, ByteSuffixes) {
  const std::pair<const char*, std::uint64_t> cases[] = {
      {"0", 0},           {"65536", 65536},   {"64K", 64 * KiB}, {"64k", 64 * KiB},
      {"1M", MiB},        {"16m", 16 * MiB},  {"1G", GiB},       {"1g", GiB},
      {"0K", 0},          {"007", 7},
  };
  for (const auto& [text, value] : cases) {
    set("NEXAR_EAGER_LIMIT_BYTES", text);
    set("NEXAR_STREAM_WINDOW_BYTES", "1G");  // keep eager_limit <= stream_window
    set("NEXAR_UNEXPECTED_LIMIT_BYTES", "1G");
    EXPECT_EQ(Config::from_env().eager_limit, value) << text;
  }
  set("NEXAR_MAX_FRAME_BYTES", "1024G");
  EXPECT_EQ(Config::from_env().max_frame_bytes, TiB);
}

TEST_F(EnvTest, BooleansAndLevels) {
  const std::pair<const char*, bool> bools[] = {
      {"0", false},    {"1", true},    {"true", true},  {"false", false}, {"on", true},
      {"off", false},  {"TRUE", true}, {"Off", false},  {"ON", true},     {"False", false},
  };
  for (const auto& [text, value] : bools) {
    set("NEXAR_UDP_GSO", text);
    EXPECT_EQ(Config::from_env().udp_gso, value) << text;
  }
  const std::pair<const char*, LogLevel> levels[] = {
      {"off", LogLevel::off},     {"error", LogLevel::error}, {"warn", LogLevel::warn},
      {"info", LogLevel::info},   {"debug", LogLevel::debug}, {"trace", LogLevel::trace},
      {"TRACE", LogLevel::trace}, {"Info", LogLevel::info},   {"0", LogLevel::off},
      {"1", LogLevel::error},     {"2", LogLevel::warn},      {"3", LogLevel::info},
      {"4", LogLevel::debug},     {"5", LogLevel::trace},
  };
  for (const auto& [text, value] : levels) {
    set("NEXAR_DEBUG", text);
    EXPECT_EQ(Config::from_env().log_level, value) << text;
  }
}

TEST_F(EnvTest, MalformedValuesThrow) {
  const std::vector<const char*> common_bad = {"12abc", "", "-1", "+5", " 5", "5 ", "1.5",
                                               "0x10", "abc", "99999999999999999999999"};
  const std::vector<const char*> byte_bad = {"K", "16MB", "16 M", "64KiB", "1T",
                                             "17179869184G" /* 2^64 */, "18446744073709551616"};
  const std::vector<const char*> dur_bad = {"5s", "1e3", "9223372036854775808" /* 2^63 */};

  auto check = [](const char* var, const char* value) {
    ::setenv(var, value, 1);
    const std::string what = invalid_what([] { (void)Config::from_env(); });
    EXPECT_NE(what.find(var), std::string::npos) << var << "='" << value << "': " << what;
    EXPECT_NE(what.find(std::string("'") + value + "'"), std::string::npos) << what;
    ::unsetenv(var);
  };

  for (const char* var : kVars) {
    for (const char* v : common_bad) check(var, v);
  }
  for (const char* var : {"NEXAR_MAX_FRAME_BYTES", "NEXAR_EAGER_LIMIT_BYTES",
                          "NEXAR_UNEXPECTED_LIMIT_BYTES", "NEXAR_STREAM_WINDOW_BYTES",
                          "NEXAR_UDP_PAYLOAD_BYTES"}) {
    for (const char* v : byte_bad) check(var, v);
  }
  for (const char* var : {"NEXAR_TIMEOUT_MS", "NEXAR_CONNECT_TIMEOUT_MS", "NEXAR_IDLE_TIMEOUT_MS",
                          "NEXAR_RPC_TIMEOUT_MS", "NEXAR_FAILURE_TIMEOUT_MS", "NEXAR_SPIN_US"}) {
    for (const char* v : dur_bad) check(var, v);
  }
  for (const char* v : {"yes", "2", "enable", "tru"}) {
    check("NEXAR_UDP_GSO", v);
    check("NEXAR_BULK_SCAVENGER", v);
  }
  for (const char* v : {"ignore", "auto", "1", "abort "}) check("NEXAR_ON_FAILURE", v);
  for (const char* v : {"reno", "bbr2", "0", "bbr "}) check("NEXAR_CONGESTION", v);
  for (const char* v : {"udp", "rdma", "1", "tcp "}) check("NEXAR_LINK", v);
  for (const char* v : {"aes", "off", "0", "tls "}) check("NEXAR_TCP_CIPHER", v);
  for (const char* v : {"6", "warning", "verbose", "-0", "00"}) check("NEXAR_DEBUG", v);
  check("NEXAR_UDP_PAYLOAD_BYTES", "4294967296");  // does not fit the 32-bit field

  // The exact format of the message.
  ::setenv("NEXAR_EAGER_LIMIT_BYTES", "12abc", 1);
  EXPECT_EQ(invalid_what([] { (void)Config::from_env(); }),
            "NEXAR_EAGER_LIMIT_BYTES='12abc': not a byte size (examples: 65536, 64K, 16M)");
}

// ---- config: ranges -----------------------------------------------------------------------

TEST_F(EnvTest, RangeViolationsNameTheSetting) {
  struct Case {
    const char* setting;
    std::function<void(Config&)> mutate;
  };
  const std::vector<Case> cases = {
      {"op_timeout", [](Config& c) { c.op_timeout = 0ms; }},
      {"op_timeout", [](Config& c) { c.op_timeout = -1ms; }},
      {"op_timeout", [](Config& c) { c.op_timeout = std::chrono::hours(24 * 366); }},
      {"connect_timeout", [](Config& c) { c.connect_timeout = 0ms; }},
      {"idle_timeout", [](Config& c) { c.idle_timeout = 0ms; }},
      {"rpc_timeout", [](Config& c) { c.rpc_timeout = -5ms; }},
      {"connections_per_peer", [](Config& c) { c.connections_per_peer = 0; }},
      {"connections_per_peer", [](Config& c) { c.connections_per_peer = 17; }},
      {"engine_threads", [](Config& c) { c.engine_threads = 0; }},
      {"engine_threads", [](Config& c) { c.engine_threads = 17; }},
      {"rpc_threads", [](Config& c) { c.rpc_threads = 0; }},
      {"rpc_threads", [](Config& c) { c.rpc_threads = 1025; }},
      {"max_frame_bytes", [](Config& c) { c.max_frame_bytes = 64 * KiB - 1; c.eager_limit = 0; }},
      {"max_frame_bytes", [](Config& c) { c.max_frame_bytes = TiB + 1; }},
      {"eager_limit", [](Config& c) { c.max_frame_bytes = 64 * KiB; c.eager_limit = 64 * KiB + 1; }},
      {"eager_limit", [](Config& c) { c.stream_window = 64 * KiB; c.eager_limit = 128 * KiB; }},
      {"unexpected_limit", [](Config& c) { c.unexpected_limit = c.eager_limit - 1; }},
      {"stream_window", [](Config& c) { c.stream_window = 64 * KiB - 1; c.eager_limit = 0; }},
      {"stream_window", [](Config& c) { c.stream_window = GiB + 1; }},
      {"udp_payload", [](Config& c) { c.udp_payload = 1199; }},
      {"udp_payload", [](Config& c) { c.udp_payload = 1; }},
      {"udp_payload", [](Config& c) { c.udp_payload = 65528; }},
      {"shm_ring_bytes", [](Config& c) { c.shm_ring_bytes = 3u << 20; }},
      {"shm_ring_bytes", [](Config& c) { c.shm_ring_bytes = 32u << 10; }},
      {"shm_collective_bytes", [](Config& c) { c.shm_collective_bytes = (std::uint64_t{1} << 30) + 1; }},
      {"spin", [](Config& c) { c.spin = 10s + 1us; }},
      {"spin", [](Config& c) { c.spin = -1us; }},
      {"log_level", [](Config& c) { c.log_level = static_cast<LogLevel>(9); }},
      {"congestion", [](Config& c) { c.congestion = static_cast<nexar::Congestion>(2); }},
  };
  for (const auto& tc : cases) {
    Config c;
    tc.mutate(c);
    const std::string what = invalid_what([&] { c.validate(); });
    EXPECT_NE(what.find(std::string("Config::") + tc.setting + " = "), std::string::npos)
        << tc.setting << ": " << what;
    EXPECT_NE(what.find("allowed"), std::string::npos) << what;
  }

  // Value and range appear in the message.
  Config c;
  c.udp_payload = 1199;
  EXPECT_EQ(invalid_what([&] { c.validate(); }),
            "Config::udp_payload = 1199 (NEXAR_UDP_PAYLOAD_BYTES) is out of range: "
            "allowed 0 (automatic) or 1200 .. 65527");
  c = Config{};
  c.stream_window = 2 * GiB;
  EXPECT_EQ(invalid_what([&] { c.validate(); }),
            "Config::stream_window = 2 GiB (NEXAR_STREAM_WINDOW_BYTES) is out of range: "
            "allowed 64 KiB .. 1 GiB");
}

TEST_F(EnvTest, RangeViolationsFromEnvironment) {
  const std::pair<const char*, const char*> cases[] = {
      {"NEXAR_TIMEOUT_MS", "0"},          {"NEXAR_CONNECT_TIMEOUT_MS", "0"},
      {"NEXAR_IDLE_TIMEOUT_MS", "0"},     {"NEXAR_RPC_TIMEOUT_MS", "0"},
      {"NEXAR_FAILURE_TIMEOUT_MS", "49"},
      {"NEXAR_MAX_FRAME_BYTES", "1K"},    {"NEXAR_MAX_FRAME_BYTES", "1025G"},
      {"NEXAR_EAGER_LIMIT_BYTES", "32M"}, {"NEXAR_UNEXPECTED_LIMIT_BYTES", "1K"},
      {"NEXAR_STREAM_WINDOW_BYTES", "2G"}, {"NEXAR_UDP_PAYLOAD_BYTES", "1000"},
      {"NEXAR_UDP_PAYLOAD_BYTES", "64K"}, {"NEXAR_SPIN_US", "10000001"},
  };
  for (const auto& [var, value] : cases) {
    ::setenv(var, value, 1);
    const std::string what = invalid_what([] { (void)Config::from_env(); });
    EXPECT_NE(what.find(var), std::string::npos) << var << "=" << value << ": " << what;
    ::unsetenv(var);
  }
}

TEST_F(EnvTest, RangeBoundariesAccepted) {
  Config c;
  c.max_frame_bytes = 64 * KiB;
  c.eager_limit = 64 * KiB;
  c.stream_window = 64 * KiB;
  c.unexpected_limit = 64 * KiB;
  c.udp_payload = 1200;
  c.spin = 0us;
  c.log_level = LogLevel::off;
  c.op_timeout = c.connect_timeout = c.idle_timeout = c.rpc_timeout = 1ms;
  EXPECT_NO_THROW(c.validate());

  c.max_frame_bytes = TiB;
  c.stream_window = GiB;
  c.eager_limit = 0;
  c.unexpected_limit = 0;
  c.udp_payload = 65527;
  c.spin = 10s;
  c.log_level = LogLevel::trace;
  c.op_timeout = std::chrono::hours(24 * 365);
  EXPECT_NO_THROW(c.validate());
}

// ---- logging ------------------------------------------------------------------------------

namespace {
struct Counted {
  int* formatted;
};
}  // namespace

template <>
struct fmt::formatter<Counted> : fmt::formatter<int> {
  auto format(const Counted& c, fmt::format_context& ctx) const {
    return fmt::formatter<int>::format(++*c.formatted, ctx);
  }
};

TEST(Log, ParseAndNames) {
  EXPECT_EQ(nexar::log::parse_level("WARN"), LogLevel::warn);
  EXPECT_EQ(nexar::log::parse_level("3"), LogLevel::info);
  EXPECT_EQ(nexar::log::parse_level(""), std::nullopt);
  EXPECT_EQ(nexar::log::parse_level("warning"), std::nullopt);
  EXPECT_STREQ(nexar::log::to_string(LogLevel::debug), "debug");
}

TEST(Log, LevelSwitchingAtRunTime) {
  const LogLevel saved = nexar::log::level();

  nexar::log::set_level(LogLevel::info);
  EXPECT_EQ(nexar::log::level(), LogLevel::info);
  EXPECT_TRUE(nexar::log::enabled(LogLevel::error));
  EXPECT_TRUE(nexar::log::enabled(LogLevel::info));
  EXPECT_FALSE(nexar::log::enabled(LogLevel::debug));
  EXPECT_FALSE(nexar::log::enabled(LogLevel::off));

  int formatted = 0;
  testing::internal::CaptureStderr();
  nexar::log::info("visible {} {}", 42, "text");
  nexar::log::debug("hidden {}", Counted{&formatted});
  nexar::log::trace("hidden {}", Counted{&formatted});
  nexar::log::set_level(LogLevel::trace);
  nexar::log::trace("now visible {}", Counted{&formatted});
  nexar::log::set_level(LogLevel::off);
  nexar::log::error("silenced {}", Counted{&formatted});
  std::string out = testing::internal::GetCapturedStderr();

  EXPECT_EQ(formatted, 1) << "disabled levels must not format their arguments";
  // The first line is the info message, in the project's pattern.
  const std::string first = out.substr(0, out.find('\n'));
  EXPECT_TRUE(like(first, "[##:##:##.###] [nexar] [info] [t*] visible 42 text")) << out;
  EXPECT_NE(out.find("[trace]"), std::string::npos) << out;
  EXPECT_NE(out.find("now visible 1"), std::string::npos) << out;
  EXPECT_EQ(out.find("hidden"), std::string::npos) << out;
  EXPECT_EQ(out.find("silenced"), std::string::npos) << out;
  for (LogLevel l : {LogLevel::error, LogLevel::warn, LogLevel::info, LogLevel::debug,
                     LogLevel::trace}) {
    EXPECT_FALSE(nexar::log::enabled(l));
  }

  // Switching from several threads while others log is safe (meaningful under TSan).
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t] {
      for (int i = 0; i < 200; ++i) {
        nexar::log::set_level(i % 2 ? LogLevel::off : LogLevel::error);
        nexar::log::trace("thread {} iteration {}", t, i);  // never enabled at these levels
      }
    });
  }
  for (auto& th : threads) th.join();

  nexar::log::set_level(saved);
  EXPECT_EQ(nexar::log::level(), saved);
}
