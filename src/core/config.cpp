// Config::from_env(), validate() and describe(), driven by the settings table kSettings
// (core/settings.hpp): each setting's variable, kind, range, doc line and tier are declared
// there once. Its variables must be listed in core/env_vars.hpp (a static_assert refuses
// others) and documented in docs/CONFIG.md (tests/settings_test.cpp checks both).
#include <charconv>
#include <nexar/config.hpp>
#include <nexar/error.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string_view>

#include "core/env_vars.hpp"
#include "core/impair_spec.hpp"
#include "core/log.hpp"
#include "core/settings.hpp"

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

std::uint32_t parse_count(const char* var, std::string_view s) {
  std::uint32_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc{} || end != s.data() + s.size() || s.empty())
    malformed(var, s, "not a whole number (examples: 1, 16)");
  return v;
}

FailurePolicy parse_failure_policy(const char* var, std::string_view s) {
  if (iequals(s, "abort")) return FailurePolicy::abort;
  if (iequals(s, "manual")) return FailurePolicy::manual;
  if (iequals(s, "automatic")) return FailurePolicy::automatic;
  malformed(var, s, "not a failure policy (abort, manual, automatic)");
}

Congestion parse_congestion(const char* var, std::string_view s) {
  if (iequals(s, "cubic")) return Congestion::cubic;
  if (iequals(s, "bbr")) return Congestion::bbr;
  malformed(var, s, "not a congestion controller (cubic, bbr)");
}

LinkKind parse_link(const char* var, std::string_view s) {
  if (iequals(s, "quic")) return LinkKind::quic;
  if (iequals(s, "tcp")) return LinkKind::tcp;
  malformed(var, s, "not a link (quic, tcp)");
}

TcpCipher parse_tcp_cipher(const char* var, std::string_view s) {
  if (iequals(s, "tls")) return TcpCipher::tls;
  if (iequals(s, "none")) return TcpCipher::none;
  malformed(var, s, "not a TCP cipher (tls, none)");
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


// ---- the settings table --------------------------------------------------------------------

using detail::Setting;
using detail::SettingKind;
using detail::SettingTier;

std::string on_off(bool b) { return b ? "on" : "off"; }

std::int64_t clamp_i64(std::uint64_t v) {
  return v > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())
             ? std::numeric_limits<std::int64_t>::max()
             : static_cast<std::int64_t>(v);
}

constexpr std::int64_t kTimeoutMax = kMaxTimeout.count();

// One entry per field: the accessors are written by these macros from the field's name.
#define NEXAR_MS(F, VAR, TIER, MIN, DOC)                                                        \
  Setting{#F, VAR, SettingKind::duration_ms, SettingTier::TIER, MIN, kTimeoutMax, " (365 days)", \
          DOC, [](const Config& c) -> std::int64_t { return c.F.count(); },                     \
          [](const Config& c) { return fmt::format("{} ms", c.F.count()); },                   \
          [](const Config& c) { return fmt::format("{}", c.F.count()); },                      \
          [](Config& c, const char* var, std::string_view s) {                                  \
            c.F = parse_duration<milliseconds>(                                                 \
                var, s, "not a duration in milliseconds (examples: 500, 15000)");               \
          }}
#define NEXAR_BYTES_WITH(F, VAR, TIER, MIN, MAX, VALUE, DOC)                             \
  Setting{#F, VAR, SettingKind::bytes, SettingTier::TIER, MIN, MAX, "", DOC, VALUE,      \
          [](const Config& c) { return format_bytes(c.F); },                             \
          [](const Config& c) { return format_bytes(c.F); },                             \
          [](Config& c, const char* var, std::string_view s) { c.F = parse_bytes(var, s); }}
#define NEXAR_BYTES(F, VAR, TIER, MIN, MAX, DOC) \
  NEXAR_BYTES_WITH(F, VAR, TIER, MIN, MAX, [](const Config& c) -> std::int64_t { return clamp_i64(c.F); }, DOC)
// Bytes whose range validate() checks itself (it depends on other settings, or is more
// than bounds).
#define NEXAR_BYTES_CUSTOM(F, VAR, TIER, DOC) NEXAR_BYTES_WITH(F, VAR, TIER, 0, 0, nullptr, DOC)
#define NEXAR_COUNT(F, VAR, TIER, MIN, MAX, DOC)                                         \
  Setting{#F, VAR, SettingKind::count, SettingTier::TIER, MIN, MAX, "", DOC,             \
          [](const Config& c) -> std::int64_t { return c.F; },                           \
          [](const Config& c) { return fmt::format("{}", c.F); },                        \
          [](const Config& c) { return fmt::format("{}", c.F); },                        \
          [](Config& c, const char* var, std::string_view s) { c.F = parse_count(var, s); }}
#define NEXAR_BOOL(F, VAR, TIER, DOC)                                                    \
  Setting{#F, VAR, SettingKind::boolean, SettingTier::TIER, 0, 1, "", DOC, nullptr,      \
          [](const Config& c) { return on_off(c.F); },                                   \
          [](const Config& c) { return on_off(c.F); },                                   \
          [](Config& c, const char* var, std::string_view s) { c.F = parse_bool(var, s); }}
#define NEXAR_ENUM(F, VAR, TIER, TO_STRING, PARSE, DOC)                                        \
  Setting{#F, VAR, SettingKind::enumeration, SettingTier::TIER, 0, 0, "", DOC, nullptr,  \
          [](const Config& c) { return std::string(TO_STRING(c.F)); },                   \
          [](const Config& c) { return std::string(TO_STRING(c.F)); },                   \
          [](Config& c, const char* var, std::string_view s) { c.F = PARSE(var, s); }}

constexpr Setting kSettings[] = {
    NEXAR_MS(op_timeout, "NEXAR_TIMEOUT_MS", user, 1,
             "deadline of every blocking call that does not take its own"),
    NEXAR_MS(connect_timeout, "NEXAR_CONNECT_TIMEOUT_MS", user, 1,
             "deadline of connection set-up, handshake included"),
    NEXAR_MS(idle_timeout, "NEXAR_IDLE_TIMEOUT_MS", tuning, 1,
             "QUIC idle timeout (raised to twice failure_timeout)"),
    // Heartbeats go out at a tenth of it: below 50 ms they would be a load, not a probe.
    NEXAR_MS(failure_timeout, "NEXAR_FAILURE_TIMEOUT_MS", user, 50,
             "how long a silent peer lasts before it is declared failed"),
    NEXAR_ENUM(on_failure, "NEXAR_ON_FAILURE", user, to_string, parse_failure_policy,
               "what communicators do when a member fails: abort, manual, automatic"),
    NEXAR_MS(rpc_timeout, "NEXAR_RPC_TIMEOUT_MS", user, 1, "default deadline of an RPC call"),
    NEXAR_COUNT(rpc_threads, "NEXAR_RPC_THREADS", tuning, 1, 1024,
                "most RPC handlers one rank runs at once"),
    NEXAR_MS(stall_warn, "NEXAR_STALL_WARN_MS", user, 0,
             "a collective waiting this long is reported, naming who is missing; 0: off"),
    NEXAR_COUNT(recorder_ops, "NEXAR_RECORDER_OPS", tuning, 0, 1 << 20,
                "collectives each communicator's flight recorder keeps"),
    Setting{"trace", "NEXAR_TRACE", SettingKind::text, SettingTier::user, 0, 0, "",
            "directory where each rank writes a Chrome trace of its operations; empty: none", nullptr,
            [](const Config& c) { return c.trace; },
            [](const Config& c) { return c.trace.empty() ? std::string("empty") : c.trace; },
            [](Config& c, const char*, std::string_view s) { c.trace = std::string(s); }},
    NEXAR_BYTES(max_frame_bytes, "NEXAR_MAX_FRAME_BYTES", tuning, kMinFrame, kMaxFrame,
                "largest payload one frame may claim"),
    NEXAR_BYTES_CUSTOM(eager_limit, "NEXAR_EAGER_LIMIT_BYTES", tuning,
                       "messages up to this size are sent eagerly, larger ones by rendezvous"),
    NEXAR_BYTES_CUSTOM(unexpected_limit, "NEXAR_UNEXPECTED_LIMIT_BYTES", tuning,
                       "unexpected eager bytes buffered per peer and lane"),
    NEXAR_BYTES(stream_window, "NEXAR_STREAM_WINDOW_BYTES", tuning, kMinWindow, kMaxWindow,
                "QUIC per-stream receive window"),
    Setting{"udp_payload", "NEXAR_UDP_PAYLOAD_BYTES", SettingKind::bytes, SettingTier::tuning, 0,
            0, "", "largest UDP payload sent; 0: the path MTU", nullptr,
            [](const Config& c) {
              return c.udp_payload == 0 ? std::string("auto (the path MTU)")
                                        : fmt::format("{} bytes", c.udp_payload);
            },
            [](const Config& c) { return fmt::format("{}", c.udp_payload); },
            [](Config& c, const char* var, std::string_view s) {
              const std::uint64_t v = parse_bytes(var, s);
              // Values that do not even fit the field are refused here; the rest by validate().
              if (v > std::numeric_limits<std::uint32_t>::max()) {
                malformed(var, s, fmt::format("out of range (0 or {}..{})", kMinUdp, kMaxUdp));
              }
              c.udp_payload = static_cast<std::uint32_t>(v);
            }},
    NEXAR_BOOL(udp_gso, "NEXAR_UDP_GSO", tuning, "use UDP GSO/GRO when the kernel has them"),
    NEXAR_BOOL(bulk_scavenger, "NEXAR_BULK_SCAVENGER", tuning,
               "bulk traffic yields the path to every other lane"),
    NEXAR_ENUM(congestion, "NEXAR_CONGESTION", tuning, to_string, parse_congestion,
               "congestion controller between ranks: cubic, bbr"),
    NEXAR_ENUM(link, "NEXAR_LINK", user, to_string, parse_link,
               "carrier of the data lanes between hosts: quic, tcp"),
    NEXAR_ENUM(tcp_cipher, "NEXAR_TCP_CIPHER", user, to_string, parse_tcp_cipher,
               "protection of the TCP link: tls, none"),
    NEXAR_COUNT(connections_per_peer, "NEXAR_CONNECTIONS_PER_PEER", tuning, 1, 16,
                "QUIC connections between two ranks on different hosts"),
    NEXAR_COUNT(engine_threads, "NEXAR_ENGINE_THREADS", tuning, 1, 16,
                "threads that encrypt and move packets for this rank"),
    NEXAR_BOOL(shm, "NEXAR_SHM", user, "carry messages between ranks of a host in shared memory"),
    NEXAR_BYTES_CUSTOM(shm_ring_bytes, "NEXAR_SHM_RING_BYTES", tuning,
                       "bytes of each shared-memory ring (a power of two)"),
    NEXAR_BYTES(shm_collective_bytes, "NEXAR_SHM_COLLECTIVE_BYTES", tuning, 0, GiB,
                "collectives up to this size per rank go through shared-memory mailboxes"),
    Setting{"topology", "NEXAR_TOPOLOGY", SettingKind::topology, SettingTier::user, 0, 0, "",
            "which ranks connect directly: full_mesh, k_regular:K, hypercube", nullptr,
            [](const Config& c) { return c.topology.to_string(); },
            [](const Config& c) { return c.topology.to_string(); },
            [](Config& c, const char* var, std::string_view s) {
              try {
                c.topology = Topology::parse(s);
              } catch (const Error& e) {
                malformed(var, s, e.what());
              }
            }},
    NEXAR_BOOL(lazy_connect, "NEXAR_LAZY_CONNECT", tuning,
               "open a full mesh's connections on first use"),
    Setting{"relay_hop_limit", "NEXAR_RELAY_HOPS", SettingKind::count, SettingTier::tuning, 0, 0,
            "", "most hops a relayed message may take; 0: the diameter + 4", nullptr,
            [](const Config& c) {
              return c.relay_hop_limit == 0 ? std::string("auto (diameter + 4)")
                                            : fmt::format("{}", c.relay_hop_limit);
            },
            [](const Config& c) { return fmt::format("{}", c.relay_hop_limit); },
            [](Config& c, const char* var, std::string_view s) { c.relay_hop_limit = parse_count(var, s); }},
    NEXAR_BYTES(relay_window, "NEXAR_RELAY_WINDOW_BYTES", tuning, 64 * KiB, GiB,
                "bytes in flight to one non-neighbour per lane"),
    Setting{"spin", "NEXAR_SPIN_US", SettingKind::spin_us, SettingTier::tuning, 0,
            std::chrono::duration_cast<microseconds>(kMaxSpin).count(), "",
            "how long a waiting thread spins before sleeping",
            [](const Config& c) -> std::int64_t { return c.spin.count(); },
            [](const Config& c) { return fmt::format("{} us", c.spin.count()); },
            [](const Config& c) { return fmt::format("{}", c.spin.count()); },
            [](Config& c, const char* var, std::string_view s) {
              c.spin = parse_duration<microseconds>(
                  var, s, "not a duration in microseconds (examples: 0, 100)");
            }},
    NEXAR_BOOL(yield_when_idle, "NEXAR_YIELD_WHEN_IDLE", tuning,
               "give up the core after every poll while spinning"),
    // Config::tuning (nexar/tuning.hpp): outside the stable API.
    NEXAR_BYTES(tuning.segment_bytes, "NEXAR_SEGMENT_BYTES", tuning, 4 * KiB, 64 * MiB,
                "pipelining segment of ring and chain collectives"),
    NEXAR_BYTES_CUSTOM(tuning.allreduce_ring_bytes, "NEXAR_ALLREDUCE_RING_BYTES", tuning,
                       "all_reduce uses the ring at or above this size"),
    NEXAR_BYTES_CUSTOM(tuning.allreduce_doubling_bytes, "NEXAR_ALLREDUCE_DOUBLING_BYTES", tuning,
                       "all_reduce uses recursive doubling below this size"),
    NEXAR_BYTES_CUSTOM(tuning.broadcast_chain_bytes, "NEXAR_BROADCAST_CHAIN_BYTES", tuning,
                       "broadcast uses a pipelined chain at or above this size"),
    NEXAR_BYTES_CUSTOM(tuning.collective_eager_bytes, "NEXAR_COLLECTIVE_EAGER_BYTES", tuning,
                       "collectives send messages up to this size eagerly"),
    Setting{"tuning.impair", "NEXAR_IMPAIR", SettingKind::text, SettingTier::debug, 0, 0, "",
            "faults injected where datagrams arrive (tests and benchmarks)", nullptr,
            [](const Config& c) { return c.tuning.impair; },
            [](const Config& c) { return c.tuning.impair.empty() ? std::string("empty") : c.tuning.impair; },
            [](Config& c, const char*, std::string_view s) { c.tuning.impair = std::string(s); }},
    Setting{"log_level", "NEXAR_DEBUG", SettingKind::enumeration, SettingTier::user, 0, 0, "",
            "log level: off, error, warn, info, debug, trace", nullptr,
            [](const Config& c) { return std::string(log::to_string(c.log_level)); },
            [](const Config& c) { return std::string(log::to_string(c.log_level)); },
            [](Config& c, const char* var, std::string_view s) {
              const auto lvl = log::parse_level(s);
              if (!lvl) {
                malformed(var, s, "not a log level (off, error, warn, info, debug, trace or 0-5)");
              }
              c.log_level = *lvl;
            }},
};

#undef NEXAR_MS
#undef NEXAR_BYTES
#undef NEXAR_BYTES_WITH
#undef NEXAR_BYTES_CUSTOM
#undef NEXAR_COUNT
#undef NEXAR_BOOL
#undef NEXAR_ENUM

// Every variable of the table is one kEnvVars lists for Config::from_env().
constexpr bool settings_listed() {
  for (const Setting& s : kSettings) {
    const detail::EnvVar* v = detail::find_env_var(s.var);
    if (v == nullptr || v->reader != detail::EnvReader::config) return false;
  }
  return true;
}
static_assert(settings_listed(), "a Config setting's variable is missing from kEnvVars");

// The range of a plain setting as validate() names it.
std::string allowed_range(const Setting& s) {
  switch (s.kind) {
    case SettingKind::duration_ms:
      return fmt::format("{} ms .. {} ms{}", s.min, s.max, s.range_note);
    case SettingKind::spin_us: return fmt::format("{} .. {} us{}", s.min, s.max, s.range_note);
    case SettingKind::bytes:
      return fmt::format("{} .. {}{}",
                         s.min == 0 ? std::string("0") : format_bytes(static_cast<std::uint64_t>(s.min)),
                         format_bytes(static_cast<std::uint64_t>(s.max)), s.range_note);
    default: return fmt::format("{} .. {}{}", s.min, s.max, s.range_note);
  }
}

}  // namespace

std::span<const Setting> detail::settings() noexcept { return kSettings; }

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

const char* to_string(LinkKind k) noexcept {
  switch (k) {
    case LinkKind::quic: return "quic";
    case LinkKind::tcp: return "tcp";
  }
  return "unknown";
}

const char* to_string(TcpCipher c) noexcept {
  switch (c) {
    case TcpCipher::tls: return "tls";
    case TcpCipher::none: return "none";
  }
  return "unknown";
}

Config Config::from_env() {
  // A NEXAR_* variable nothing reads is most likely a misspelled setting.
  detail::warn_unknown_env();
  Config c;
  // Set variables only; unset ones leave the default. A set but empty variable is an
  // error like any other malformed value: it is usually a broken script, not intent.
  // The table's variables are all in core/env_vars.hpp (settings_listed() above).
  for (const Setting& s : kSettings) {
    if (const char* v = std::getenv(s.var)) s.parse(c, s.var, v);
  }
  c.validate();
  return c;
}

void Config::validate() const {
  // The plain ranges come from the settings table; the checks below it are those that
  // depend on other settings or are more than bounds.
  for (const Setting& s : kSettings) {
    if (s.value == nullptr) continue;
    const std::int64_t v = s.value(*this);
    if (v < s.min || v > s.max) {
      out_of_range(s.field, s.var, s.show(*this), allowed_range(s));
    }
  }
  if (on_failure != FailurePolicy::abort && on_failure != FailurePolicy::manual &&
      on_failure != FailurePolicy::automatic) {
    out_of_range("on_failure", "NEXAR_ON_FAILURE", fmt::format("{}", static_cast<int>(on_failure)),
                 "abort, manual, automatic");
  }
  if (congestion != Congestion::cubic && congestion != Congestion::bbr) {
    out_of_range("congestion", "NEXAR_CONGESTION", fmt::format("{}", static_cast<int>(congestion)), "cubic, bbr");
  }
  if (link != LinkKind::quic && link != LinkKind::tcp) {
    out_of_range("link", "NEXAR_LINK", fmt::format("{}", static_cast<int>(link)), "quic, tcp");
  }
  if (tcp_cipher != TcpCipher::tls && tcp_cipher != TcpCipher::none) {
    out_of_range("tcp_cipher", "NEXAR_TCP_CIPHER", fmt::format("{}", static_cast<int>(tcp_cipher)), "tls, none");
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
  if (shm_ring_bytes < (64u << 10) || shm_ring_bytes > (256u << 20) ||
      (shm_ring_bytes & (shm_ring_bytes - 1)) != 0) {
    out_of_range("shm_ring_bytes", "NEXAR_SHM_RING_BYTES", format_bytes(shm_ring_bytes),
                 "a power of two, 64 KiB .. 256 MiB");
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
  try {
    (void)detail::ImpairSpec::parse(tuning.impair);
  } catch (const Error& e) {
    throw Error(Errc::invalid_argument, fmt::format("tuning.impair (NEXAR_IMPAIR) = '{}': {}", tuning.impair, e.what()));
  }
  const int lvl = static_cast<int>(log_level);
  if (lvl < static_cast<int>(LogLevel::off) || lvl > static_cast<int>(LogLevel::trace)) {
    out_of_range("log_level", "NEXAR_DEBUG", fmt::format("{}", lvl),
                 "off, error, warn, info, debug, trace (0 .. 5)");
  }
}

std::string Config::describe() const { return describe(true); }

std::string Config::describe(bool all) const {
  static const Config kDefaults;
  std::string out;
  for (const Setting& s : kSettings) {
    std::string value = s.show(*this);
    if (s.kind == SettingKind::text && value.empty()) continue;  // tuning.impair, trace: only when set
    if (!all && value == s.show(kDefaults)) continue;
    if (!out.empty()) out += '\n';
    out += fmt::format("{} = {}", s.field, value);
  }
  return out;
}

}  // namespace nexar
