// Config::from_env(), validate() and describe(). The variables and ranges are documented
// in docs/CONFIG.md; keep the two in step. Every variable read here must be listed in
// core/env_vars.hpp (EnvName refuses others at compile time).
#include <charconv>
#include <nexar/config.hpp>
#include <nexar/error.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <limits>
#include <optional>
#include <string_view>

#include "core/env_vars.hpp"
#include "core/impair_spec.hpp"
#include "core/log.hpp"

namespace nexar {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;

constexpr std::uint64_t KiB = 1024;
constexpr std::uint64_t MiB = KiB * 1024;
constexpr std::uint64_t GiB = MiB * 1024;
constexpr std::uint64_t TiB = GiB * 1024;

// Upper bound of every timeout. Not a user-facing limit so much as a guard: deadlines are
// computed as steady_clock::now() + timeout in nanoseconds, which overflows int64 for
// timeouts of a few hundred years.
constexpr milliseconds kMaxTimeout = std::chrono::hours(24 * 365);
constexpr microseconds kMaxSpin = std::chrono::seconds(10);
constexpr std::uint64_t kMinFrame = 64 * KiB;
constexpr std::uint64_t kMaxFrame = TiB;
constexpr std::uint64_t kMinWindow = 64 * KiB;
constexpr std::uint64_t kMaxWindow = GiB;
constexpr std::uint32_t kMinUdp = 1200;   // QUIC's minimum datagram size (RFC 9000)
constexpr std::uint32_t kMaxUdp = 65527;  // largest UDP payload over IPv6

// ---- parsing -----------------------------------------------------------------------------

[[noreturn]] void malformed(const char* var, std::string_view value, std::string_view what) {
  throw Error(Errc::invalid_argument, fmt::format("{}='{}': {}", var, value, what));
}

// Strict unsigned decimal: digits only, no sign, no spaces, no empty string.
std::optional<std::uint64_t> parse_u64(std::string_view s, bool& overflow) {
  overflow = false;
  if (s.empty()) return std::nullopt;
  std::uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    const auto d = static_cast<std::uint64_t>(c - '0');
    if (v > (std::numeric_limits<std::uint64_t>::max() - d) / 10) {
      overflow = true;
      return std::nullopt;
    }
    v = v * 10 + d;
  }
  return v;
}

std::uint64_t parse_bytes(const char* var, std::string_view s) {
  constexpr std::string_view kHint = "not a byte size (examples: 65536, 64K, 16M)";
  std::uint64_t mult = 1;
  std::string_view digits = s;
  if (!s.empty()) {
    switch (s.back()) {
      case 'K': case 'k': mult = KiB; break;
      case 'M': case 'm': mult = MiB; break;
      case 'G': case 'g': mult = GiB; break;
      default: break;
    }
    if (mult != 1) digits.remove_suffix(1);
  }
  bool overflow = false;
  const auto v = parse_u64(digits, overflow);
  if (overflow || (v && *v > std::numeric_limits<std::uint64_t>::max() / mult)) {
    malformed(var, s, "byte size too large");
  }
  if (!v) malformed(var, s, kHint);
  return *v * mult;
}

// Whole number of `Dur` units that fits Dur's signed representation.
template <class Dur>
Dur parse_duration(const char* var, std::string_view s, std::string_view hint) {
  bool overflow = false;
  const auto v = parse_u64(s, overflow);
  if (overflow ||
      (v && *v > static_cast<std::uint64_t>(std::numeric_limits<typename Dur::rep>::max()))) {
    malformed(var, s, "duration too large");
  }
  if (!v) malformed(var, s, hint);
  return Dur(static_cast<typename Dur::rep>(*v));
}

bool iequals(std::string_view a, std::string_view lower) {
  if (a.size() != lower.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    char c = a[i];
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    if (c != lower[i]) return false;
  }
  return true;
}

bool parse_bool(const char* var, std::string_view s) {
  if (s == "1" || iequals(s, "true") || iequals(s, "on")) return true;
  if (s == "0" || iequals(s, "false") || iequals(s, "off")) return false;
  malformed(var, s, "not a boolean (0, 1, true, false, on, off)");
}

using detail::EnvName;

// Set variables only; unset ones leave the default. A set but empty variable is an
// error like any other malformed value: it is usually a broken script, not intent.
// EnvName: only variables listed in core/env_vars.hpp compile.
std::optional<std::string_view> env(EnvName name) {
  const char* v = std::getenv(name.c_str());
  if (v == nullptr) return std::nullopt;
  return std::string_view(v);
}

void env_ms(EnvName name, milliseconds& out) {
  if (auto s = env(name)) {
    out = parse_duration<milliseconds>(name.c_str(), *s,
                                       "not a duration in milliseconds (examples: 500, 15000)");
  }
}

void env_bytes(EnvName name, std::uint64_t& out) {
  if (auto s = env(name)) out = parse_bytes(name.c_str(), *s);
}

void env_bool(EnvName name, bool& out) {
  if (auto s = env(name)) out = parse_bool(name.c_str(), *s);
}

void env_count(EnvName name, std::uint32_t& out) {
  const char* var = name.c_str();
  if (auto s = env(name)) {
    std::uint32_t v = 0;
    auto [end, ec] = std::from_chars(s->data(), s->data() + s->size(), v);
    if (ec != std::errc{} || end != s->data() + s->size() || s->empty())
      malformed(var, *s, "not a whole number (examples: 1, 16)");
    out = v;
  }
}

// ---- formatting --------------------------------------------------------------------------

// Exact, human-readable: the largest binary unit that divides the value, else bytes.
std::string format_bytes(std::uint64_t v) {
  if (v != 0) {
    if (v % TiB == 0) return fmt::format("{} TiB", v / TiB);
    if (v % GiB == 0) return fmt::format("{} GiB", v / GiB);
    if (v % MiB == 0) return fmt::format("{} MiB", v / MiB);
    if (v % KiB == 0) return fmt::format("{} KiB", v / KiB);
  }
  return fmt::format("{} bytes", v);
}

[[noreturn]] void out_of_range(std::string_view setting, const char* var, std::string_view value,
                               std::string_view allowed) {
  throw Error(Errc::invalid_argument,
              fmt::format("Config::{} = {} ({}) is out of range: allowed {}", setting, value,
                          var, allowed));
}

void check_timeout(std::string_view setting, const char* var, milliseconds v) {
  if (v.count() <= 0 || v > kMaxTimeout) {
    out_of_range(setting, var, fmt::format("{} ms", v.count()),
                 fmt::format("1 ms .. {} ms (365 days)", kMaxTimeout.count()));
  }
}

}  // namespace

Topology Topology::parse(std::string_view text) {
  auto bad = [&](std::string_view what) -> Topology {
    throw Error(Errc::invalid_argument, fmt::format("topology '{}': {}", text, what));
  };
  Topology t;
  if (iequals(text, "full_mesh")) return t;
  if (iequals(text, "hypercube")) {
    t.kind = Kind::hypercube;
    return t;
  }
  constexpr std::string_view kRegular = "k_regular:";
  if (text.size() > kRegular.size() && iequals(text.substr(0, kRegular.size()), kRegular)) {
    bool overflow = false;
    const auto k = parse_u64(text.substr(kRegular.size()), overflow);
    if (!k || overflow || *k > 65536) return bad("K is not a whole number 2 .. 65536");
    if (*k < 2 || *k % 2 != 0) return bad("K must be even and at least 2 (K/2 neighbours on each side of the ring)");
    t.kind = Kind::k_regular;
    t.k = static_cast<std::uint32_t>(*k);
    return t;
  }
  return bad("not a topology (full_mesh, k_regular:K, hypercube)");
}

std::string Topology::to_string() const {
  switch (kind) {
    case Kind::full_mesh: return "full_mesh";
    case Kind::k_regular: return fmt::format("k_regular:{}", k);
    case Kind::hypercube: return "hypercube";
  }
  return "unknown";
}

const char* to_string(FailurePolicy p) noexcept {
  switch (p) {
    case FailurePolicy::abort: return "abort";
    case FailurePolicy::manual: return "manual";
    case FailurePolicy::automatic: return "automatic";
  }
  return "unknown";
}

const char* to_string(Congestion c) noexcept {
  switch (c) {
    case Congestion::cubic: return "cubic";
    case Congestion::bbr: return "bbr";
  }
  return "unknown";
}

Config Config::from_env() {
  // A NEXAR_* variable nothing reads is most likely a misspelled setting.
  detail::warn_unknown_env();
  Config c;
  env_ms("NEXAR_TIMEOUT_MS", c.op_timeout);
  env_ms("NEXAR_CONNECT_TIMEOUT_MS", c.connect_timeout);
  env_ms("NEXAR_IDLE_TIMEOUT_MS", c.idle_timeout);
  env_ms("NEXAR_FAILURE_TIMEOUT_MS", c.failure_timeout);
  if (auto s = env("NEXAR_ON_FAILURE")) {
    if (iequals(*s, "abort")) c.on_failure = FailurePolicy::abort;
    else if (iequals(*s, "manual")) c.on_failure = FailurePolicy::manual;
    else if (iequals(*s, "automatic")) c.on_failure = FailurePolicy::automatic;
    else malformed("NEXAR_ON_FAILURE", *s, "not a failure policy (abort, manual, automatic)");
  }
  env_ms("NEXAR_RPC_TIMEOUT_MS", c.rpc_timeout);
  env_count("NEXAR_RPC_THREADS", c.rpc_threads);
  env_count("NEXAR_CONNECTIONS_PER_PEER", c.connections_per_peer);
  env_count("NEXAR_ENGINE_THREADS", c.engine_threads);
  env_bytes("NEXAR_MAX_FRAME_BYTES", c.max_frame_bytes);
  env_bytes("NEXAR_EAGER_LIMIT_BYTES", c.eager_limit);
  env_bytes("NEXAR_UNEXPECTED_LIMIT_BYTES", c.unexpected_limit);
  env_bytes("NEXAR_STREAM_WINDOW_BYTES", c.stream_window);
  env_bytes("NEXAR_SEGMENT_BYTES", c.segment_bytes);
  env_bytes("NEXAR_ALLREDUCE_RING_BYTES", c.allreduce_ring_bytes);
  env_bytes("NEXAR_ALLREDUCE_DOUBLING_BYTES", c.allreduce_doubling_bytes);
  env_bytes("NEXAR_BROADCAST_CHAIN_BYTES", c.broadcast_chain_bytes);
  env_bytes("NEXAR_COLLECTIVE_EAGER_BYTES", c.collective_eager_bytes);
  if (auto s = env("NEXAR_UDP_PAYLOAD_BYTES")) {
    const std::uint64_t v = parse_bytes("NEXAR_UDP_PAYLOAD_BYTES", *s);
    // Values that do not even fit the field are refused here; the rest by validate().
    if (v > std::numeric_limits<std::uint32_t>::max()) {
      malformed("NEXAR_UDP_PAYLOAD_BYTES", *s,
                fmt::format("out of range (0 or {}..{})", kMinUdp, kMaxUdp));
    }
    c.udp_payload = static_cast<std::uint32_t>(v);
  }
  if (auto s = env("NEXAR_IMPAIR")) c.impair = std::string(*s);
  env_bool("NEXAR_UDP_GSO", c.udp_gso);
  env_bool("NEXAR_BULK_SCAVENGER", c.bulk_scavenger);
  if (auto s = env("NEXAR_CONGESTION")) {
    if (iequals(*s, "cubic")) c.congestion = Congestion::cubic;
    else if (iequals(*s, "bbr")) c.congestion = Congestion::bbr;
    else malformed("NEXAR_CONGESTION", *s, "not a congestion controller (cubic, bbr)");
  }
  env_bool("NEXAR_SHM", c.shm);
  env_bytes("NEXAR_SHM_RING_BYTES", c.shm_ring_bytes);
  env_bytes("NEXAR_SHM_COLLECTIVE_BYTES", c.shm_collective_bytes);
  if (auto s = env("NEXAR_TOPOLOGY")) {
    try {
      c.topology = Topology::parse(*s);
    } catch (const Error& e) {
      malformed("NEXAR_TOPOLOGY", *s, e.what());
    }
  }
  env_bool("NEXAR_LAZY_CONNECT", c.lazy_connect);
  env_count("NEXAR_RELAY_HOPS", c.relay_hop_limit);
  env_bytes("NEXAR_RELAY_WINDOW_BYTES", c.relay_window);
  env_bool("NEXAR_YIELD_WHEN_IDLE", c.yield_when_idle);
  if (auto s = env("NEXAR_SPIN_US")) {
    c.spin = parse_duration<microseconds>("NEXAR_SPIN_US", *s,
                                          "not a duration in microseconds (examples: 0, 100)");
  }
  if (auto s = env("NEXAR_DEBUG")) {
    const auto lvl = log::parse_level(*s);
    if (!lvl) {
      malformed("NEXAR_DEBUG", *s, "not a log level (off, error, warn, info, debug, trace or 0-5)");
    }
    c.log_level = *lvl;
  }
  c.validate();
  return c;
}

void Config::validate() const {
  check_timeout("op_timeout", "NEXAR_TIMEOUT_MS", op_timeout);
  check_timeout("connect_timeout", "NEXAR_CONNECT_TIMEOUT_MS", connect_timeout);
  check_timeout("idle_timeout", "NEXAR_IDLE_TIMEOUT_MS", idle_timeout);
  // Heartbeats go out at a tenth of it: below 50 ms they would be a load, not a probe.
  if (failure_timeout < milliseconds(50) || failure_timeout > kMaxTimeout) {
    out_of_range("failure_timeout", "NEXAR_FAILURE_TIMEOUT_MS", fmt::format("{} ms", failure_timeout.count()),
                 fmt::format("50 ms .. {} ms (365 days)", kMaxTimeout.count()));
  }
  if (on_failure != FailurePolicy::abort && on_failure != FailurePolicy::manual &&
      on_failure != FailurePolicy::automatic) {
    out_of_range("on_failure", "NEXAR_ON_FAILURE", fmt::format("{}", static_cast<int>(on_failure)),
                 "abort, manual, automatic");
  }
  if (congestion != Congestion::cubic && congestion != Congestion::bbr) {
    out_of_range("congestion", "NEXAR_CONGESTION", fmt::format("{}", static_cast<int>(congestion)), "cubic, bbr");
  }
  check_timeout("rpc_timeout", "NEXAR_RPC_TIMEOUT_MS", rpc_timeout);
  if (connections_per_peer < 1 || connections_per_peer > 16)
    out_of_range("connections_per_peer", "NEXAR_CONNECTIONS_PER_PEER", fmt::format("{}", connections_per_peer),
                 "1 .. 16");
  if (engine_threads < 1 || engine_threads > 16)
    out_of_range("engine_threads", "NEXAR_ENGINE_THREADS", fmt::format("{}", engine_threads), "1 .. 16");
  if (rpc_threads < 1 || rpc_threads > 1024)
    out_of_range("rpc_threads", "NEXAR_RPC_THREADS", fmt::format("{}", rpc_threads), "1 .. 1024");

  if (max_frame_bytes < kMinFrame || max_frame_bytes > kMaxFrame) {
    out_of_range("max_frame_bytes", "NEXAR_MAX_FRAME_BYTES", format_bytes(max_frame_bytes),
                 fmt::format("{} .. {}", format_bytes(kMinFrame), format_bytes(kMaxFrame)));
  }
  if (stream_window < kMinWindow || stream_window > kMaxWindow) {
    out_of_range("stream_window", "NEXAR_STREAM_WINDOW_BYTES", format_bytes(stream_window),
                 fmt::format("{} .. {}", format_bytes(kMinWindow), format_bytes(kMaxWindow)));
  }
  // An eager message is sent before the receiver asked for it, so it has to fit one frame
  // and one stream window; otherwise it could stall behind flow control forever.
  if (eager_limit > max_frame_bytes || eager_limit > stream_window) {
    out_of_range("eager_limit", "NEXAR_EAGER_LIMIT_BYTES", format_bytes(eager_limit),
                 fmt::format("0 .. min(max_frame_bytes, stream_window) = {}",
                             format_bytes(std::min(max_frame_bytes, stream_window))));
  }
  // The unexpected-message buffer must hold at least one eager message, or a single early
  // send could never be accepted.
  if (unexpected_limit < eager_limit) {
    out_of_range("unexpected_limit", "NEXAR_UNEXPECTED_LIMIT_BYTES",
                 format_bytes(unexpected_limit),
                 fmt::format(">= eager_limit ({})", format_bytes(eager_limit)));
  }
  if (udp_payload != 0 && (udp_payload < kMinUdp || udp_payload > kMaxUdp)) {
    out_of_range("udp_payload", "NEXAR_UDP_PAYLOAD_BYTES", fmt::format("{}", udp_payload),
                 fmt::format("0 (automatic) or {} .. {}", kMinUdp, kMaxUdp));
  }
  if (segment_bytes < 4096 || segment_bytes > (64u << 20)) {
    out_of_range("segment_bytes", "NEXAR_SEGMENT_BYTES", format_bytes(segment_bytes),
                 "4 KiB .. 64 MiB");
  }
  if (shm_ring_bytes < (64u << 10) || shm_ring_bytes > (256u << 20) ||
      (shm_ring_bytes & (shm_ring_bytes - 1)) != 0) {
    out_of_range("shm_ring_bytes", "NEXAR_SHM_RING_BYTES", format_bytes(shm_ring_bytes),
                 "a power of two, 64 KiB .. 256 MiB");
  }
  if (shm_collective_bytes > (std::uint64_t{1} << 30)) {
    out_of_range("shm_collective_bytes", "NEXAR_SHM_COLLECTIVE_BYTES", format_bytes(shm_collective_bytes),
                 "0 .. 1 GiB");
  }
  if (topology.kind == Topology::Kind::k_regular && (topology.k < 2 || topology.k % 2 != 0 || topology.k > 65536)) {
    out_of_range("topology", "NEXAR_TOPOLOGY", topology.to_string(), "k_regular:K with K even, 2 .. 65536");
  }
  if (topology.kind != Topology::Kind::k_regular && topology.k != 0) {
    out_of_range("topology.k", "NEXAR_TOPOLOGY", fmt::format("{}", topology.k), "0 unless the kind is k_regular");
  }
  if (lazy_connect && topology.kind != Topology::Kind::full_mesh) {
    out_of_range("lazy_connect", "NEXAR_LAZY_CONNECT", "on",
                 fmt::format("off under topology {} (only a full mesh connects lazily: sparse topologies "
                             "connect their neighbours at start, to relay through them)",
                             topology.to_string()));
  }
  if (relay_hop_limit > 255) {
    out_of_range("relay_hop_limit", "NEXAR_RELAY_HOPS", fmt::format("{}", relay_hop_limit), "0 (automatic) or 1 .. 255");
  }
  if (relay_window < 64 * KiB || relay_window > GiB) {
    out_of_range("relay_window", "NEXAR_RELAY_WINDOW_BYTES", format_bytes(relay_window), "64 KiB .. 1 GiB");
  }
  if (spin.count() < 0 || spin > kMaxSpin) {
    out_of_range("spin", "NEXAR_SPIN_US", fmt::format("{} us", spin.count()),
                 fmt::format("0 .. {} us", kMaxSpin.count()));
  }
  try {
    (void)detail::ImpairSpec::parse(impair);
  } catch (const Error& e) {
    throw Error(Errc::invalid_argument, fmt::format("impair (NEXAR_IMPAIR) = '{}': {}", impair, e.what()));
  }
  const int lvl = static_cast<int>(log_level);
  if (lvl < static_cast<int>(LogLevel::off) || lvl > static_cast<int>(LogLevel::trace)) {
    out_of_range("log_level", "NEXAR_DEBUG", fmt::format("{}", lvl),
                 "off, error, warn, info, debug, trace (0 .. 5)");
  }
}

std::string Config::describe() const {
  std::string out;
  auto it = std::back_inserter(out);
  fmt::format_to(it, "op_timeout = {} ms\n", op_timeout.count());
  fmt::format_to(it, "connect_timeout = {} ms\n", connect_timeout.count());
  fmt::format_to(it, "idle_timeout = {} ms\n", idle_timeout.count());
  fmt::format_to(it, "failure_timeout = {} ms\n", failure_timeout.count());
  fmt::format_to(it, "on_failure = {}\n", to_string(on_failure));
  fmt::format_to(it, "rpc_timeout = {} ms\n", rpc_timeout.count());
  fmt::format_to(it, "rpc_threads = {}\n", rpc_threads);
  fmt::format_to(it, "max_frame_bytes = {}\n", format_bytes(max_frame_bytes));
  fmt::format_to(it, "eager_limit = {}\n", format_bytes(eager_limit));
  fmt::format_to(it, "unexpected_limit = {}\n", format_bytes(unexpected_limit));
  fmt::format_to(it, "stream_window = {}\n", format_bytes(stream_window));
  fmt::format_to(it, "segment_bytes = {}\n", format_bytes(segment_bytes));
  fmt::format_to(it, "allreduce_ring_bytes = {}\n", format_bytes(allreduce_ring_bytes));
  fmt::format_to(it, "allreduce_doubling_bytes = {}\n", format_bytes(allreduce_doubling_bytes));
  fmt::format_to(it, "broadcast_chain_bytes = {}\n", format_bytes(broadcast_chain_bytes));
  fmt::format_to(it, "collective_eager_bytes = {}\n", format_bytes(collective_eager_bytes));
  if (udp_payload == 0) {
    fmt::format_to(it, "udp_payload = auto (the path MTU)\n");
  } else {
    fmt::format_to(it, "udp_payload = {} bytes\n", udp_payload);
  }
  fmt::format_to(it, "udp_gso = {}\n", udp_gso ? "on" : "off");
  fmt::format_to(it, "bulk_scavenger = {}\n", bulk_scavenger ? "on" : "off");
  fmt::format_to(it, "congestion = {}\n", to_string(congestion));
  fmt::format_to(it, "connections_per_peer = {}\n", connections_per_peer);
  fmt::format_to(it, "engine_threads = {}\n", engine_threads);
  fmt::format_to(it, "shm = {}\n", shm ? "on" : "off");
  fmt::format_to(it, "shm_ring_bytes = {}\n", format_bytes(shm_ring_bytes));
  fmt::format_to(it, "shm_collective_bytes = {}\n", format_bytes(shm_collective_bytes));
  fmt::format_to(it, "topology = {}\n", topology.to_string());
  fmt::format_to(it, "lazy_connect = {}\n", lazy_connect ? "on" : "off");
  if (relay_hop_limit == 0) {
    fmt::format_to(it, "relay_hop_limit = auto (diameter + 4)\n");
  } else {
    fmt::format_to(it, "relay_hop_limit = {}\n", relay_hop_limit);
  }
  fmt::format_to(it, "relay_window = {}\n", format_bytes(relay_window));
  if (!impair.empty()) fmt::format_to(it, "impair = {}\n", impair);
  fmt::format_to(it, "spin = {} us\n", spin.count());
  fmt::format_to(it, "yield_when_idle = {}\n", yield_when_idle ? "on" : "off");
  fmt::format_to(it, "log_level = {}", log::to_string(log_level));
  return out;
}

}  // namespace nexar
