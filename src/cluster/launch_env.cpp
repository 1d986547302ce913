// resolve_launch_env(): the rules are listed in launch_env.hpp and docs/CONFIG.md.
#include "cluster/launch_env.hpp"

#include <nexar/error.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <utility>

#include "cluster/ifname.hpp"
#include "core/text.hpp"

namespace nexar::cluster {
namespace {

using std::chrono::milliseconds;

constexpr int kSeedPort = 29400;      // nexar-seed's default port
constexpr int kTorchrunPort = 29500;  // torchrun's default MASTER_PORT
constexpr milliseconds kMaxTimeout = std::chrono::hours(24 * 365);  // as Config's timeouts
constexpr std::size_t kMaxFileBytes = std::size_t{1} << 20;

// `who` is the public function the caller used, named first in the message.
[[noreturn]] void fail(const std::string& message, const char* who = "join_from_env") {
  throw Error(Errc::invalid_argument, std::string(who) + ": " + message);
}

using detail::is_space;

bool all_digits(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

bool is_ipv6_literal(std::string_view s) {
  in6_addr a{};
  return ::inet_pton(AF_INET6, std::string(s).c_str(), &a) == 1;
}

// The environment with empty values treated as unset.
class Env {
 public:
  explicit Env(const EnvLookup& lookup) : lookup_(lookup) {}

  std::optional<std::string> get(const char* name) const {
    auto v = lookup_(name);
    if (v && v->empty()) return std::nullopt;
    return v;
  }

  // The first of `names` (nullptr-terminated or full) that is set, with its name.
  template <std::size_t N>
  std::optional<std::pair<const char*, std::string>> first(
      const std::array<const char*, N>& names) const {
    for (const char* n : names) {
      if (n == nullptr) break;
      if (auto v = get(n)) return std::make_pair(n, *std::move(v));
    }
    return std::nullopt;
  }

 private:
  const EnvLookup& lookup_;
};

// A decimal int (optional '-'); fails naming the variable.
int parse_int(const char* var, const std::string& value) {
  int v = 0;
  const char* const end = value.data() + value.size();
  const auto [ptr, ec] = std::from_chars(value.data(), end, v);
  if (ec == std::errc::result_out_of_range)
    fail(fmt::format("{}='{}' is out of range", var, value));
  if (ec != std::errc() || ptr != end) fail(fmt::format("{}='{}' is not an integer", var, value));
  return v;
}

std::optional<int> parse_port_text(std::string_view text) {
  int v = 0;
  const char* const end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (!all_digits(text) || ec != std::errc() || ptr != end || v < 1 || v > 65535) {
    return std::nullopt;
  }
  return v;
}

int parse_port(const char* var, const std::string& value) {
  const auto v = parse_port_text(value);
  if (!v) fail(fmt::format("{}='{}' is not a port number (1-65535)", var, value));
  return *v;
}

milliseconds parse_timeout(const char* var, const std::string& value) {
  long long v = 0;
  const char* const end = value.data() + value.size();
  const auto [ptr, ec] = std::from_chars(value.data(), end, v);
  if (!all_digits(value) || ec != std::errc() || ptr != end || v <= 0 || v > kMaxTimeout.count()) {
    fail(fmt::format("{}='{}' is not a positive integer number of milliseconds (1 .. {})", var,
                     value, kMaxTimeout.count()));
  }
  return milliseconds(v);
}

// The whole file, for tokens and certificates. Fails naming the variable (or what the file
// is) and the path.
std::string read_file(const char* var, const std::string& path, const char* who = "join_from_env") {
  const std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"),
                                                          &std::fclose);
  if (!f) {
    const int err = errno;
    fail(fmt::format("{}='{}': cannot open the file: {}", var, path, std::strerror(err)), who);
  }
  std::string out;
  char buf[4096];
  for (;;) {
    const std::size_t n = std::fread(buf, 1, sizeof buf, f.get());
    out.append(buf, n);
    if (out.size() > kMaxFileBytes) {
      fail(fmt::format("{}='{}': the file is larger than {} bytes", var, path, kMaxFileBytes), who);
    }
    if (n < sizeof buf) break;
  }
  if (std::ferror(f.get()) != 0) {
    const int err = errno;
    fail(fmt::format("{}='{}': cannot read the file: {}", var, path, std::strerror(err)), who);
  }
  return out;
}

// ---- rank and world ----------------------------------------------------------------------

struct Convention {
  const char* source;
  const char* label;  // for messages: "no seed address for <label> ranks"
  std::array<const char*, 2> rank;
  std::array<const char*, 2> world;
  std::array<const char*, 2> local_rank;
  std::array<const char*, 2> local_world;
  bool local_world_if_integer;  // a non-integer local world is ignored, not an error
};

constexpr std::array<Convention, 5> kConventions = {{
    {"nexar",
     "NEXAR_RANK",
     {"NEXAR_RANK", nullptr},
     {"NEXAR_WORLD_SIZE", nullptr},
     {"NEXAR_LOCAL_RANK", nullptr},
     {"NEXAR_LOCAL_WORLD_SIZE", nullptr},
     false},
    {"torchrun",
     "torchrun",
     {"RANK", nullptr},
     {"WORLD_SIZE", nullptr},
     {"LOCAL_RANK", nullptr},
     {"LOCAL_WORLD_SIZE", nullptr},
     false},
    {"openmpi",
     "Open MPI",
     {"OMPI_COMM_WORLD_RANK", nullptr},
     {"OMPI_COMM_WORLD_SIZE", nullptr},
     {"OMPI_COMM_WORLD_LOCAL_RANK", nullptr},
     {"OMPI_COMM_WORLD_LOCAL_SIZE", nullptr},
     false},
    {"pmi",
     "PMI",
     {"PMI_RANK", "PMIX_RANK"},
     {"PMI_SIZE", nullptr},
     {"PMI_LOCAL_RANK", "MPI_LOCALRANKID"},
     {"PMI_LOCAL_SIZE", "MPI_LOCALNRANKS"},
     false},
    {"slurm",
     "Slurm",
     {"SLURM_PROCID", nullptr},
     {"SLURM_NTASKS", "SLURM_NPROCS"},
     {"SLURM_LOCALID", nullptr},
     {"SLURM_NTASKS_PER_NODE", nullptr},
     true},
}};

// The rank variables, for messages.
constexpr const char* kRankVarsText =
    "NEXAR_RANK, RANK (torchrun), OMPI_COMM_WORLD_RANK (Open MPI), PMI_RANK or PMIX_RANK "
    "(PMI/PMIx), SLURM_PROCID (Slurm)";

// One integer setting and the variable it came from.
struct Field {
  int value;
  const char* var = nullptr;
};

struct Ranks {
  const Convention* convention = nullptr;
  Field rank{-1};
  Field world{0};
  Field local_rank{-1};
  Field local_world{0};
};

Ranks resolve_ranks(const Env& env) {
  Ranks r;
  for (const Convention& c : kConventions) {
    auto rank = env.first(c.rank);
    if (!rank) continue;
    r.convention = &c;
    r.rank = {parse_int(rank->first, rank->second), rank->first};
    if (auto w = env.first(c.world)) {
      r.world = {parse_int(w->first, w->second), w->first};
    } else if (!env.get("NEXAR_WORLD_SIZE")) {
      std::string world_vars = c.world[0];
      if (c.world[1] != nullptr) world_vars += fmt::format(" / {}", c.world[1]);
      fail(fmt::format("{} is set but {} is not{}", rank->first, world_vars,
                       std::string_view(c.source) == "nexar"
                           ? ""
                           : " (set NEXAR_WORLD_SIZE to give the world size)"));
    }
    if (auto lr = env.first(c.local_rank)) {
      r.local_rank = {parse_int(lr->first, lr->second), lr->first};
    }
    if (auto lw = env.first(c.local_world)) {
      if (!c.local_world_if_integer) {
        r.local_world = {parse_int(lw->first, lw->second), lw->first};
      } else if (all_digits(lw->second) && lw->second.size() < 10) {
        r.local_world = {parse_int(lw->first, lw->second), lw->first};
      }
    }
    break;
  }
  // NEXAR_* override single fields.
  const auto override_field = [&](const char* var, Field& f) {
    if (auto v = env.get(var)) f = {parse_int(var, *v), var};
  };
  override_field("NEXAR_RANK", r.rank);
  override_field("NEXAR_WORLD_SIZE", r.world);
  override_field("NEXAR_LOCAL_RANK", r.local_rank);
  override_field("NEXAR_LOCAL_WORLD_SIZE", r.local_world);

  if (r.world.var != nullptr && r.world.value < 1) {
    fail(fmt::format("{}={}: the world size must be at least 1", r.world.var, r.world.value));
  }
  if (r.rank.var != nullptr && r.rank.value < 0) {
    fail(fmt::format("{}={}: the rank must not be negative", r.rank.var, r.rank.value));
  }
  if (r.rank.var != nullptr && r.world.var != nullptr && r.rank.value >= r.world.value) {
    fail(fmt::format("rank {} >= world size {} (from {} / {})", r.rank.value, r.world.value,
                     r.rank.var, r.world.var));
  }
  if (r.local_rank.var != nullptr && r.local_rank.value < 0) {
    fail(fmt::format("{}={}: the local rank must not be negative", r.local_rank.var,
                     r.local_rank.value));
  }
  if (r.local_world.var != nullptr && r.local_world.value < 1) {
    fail(fmt::format("{}={}: the local world size must be at least 1", r.local_world.var,
                     r.local_world.value));
  }
  if (r.local_rank.var != nullptr && r.local_world.var != nullptr &&
      r.local_rank.value >= r.local_world.value) {
    fail(fmt::format("local rank {} >= local world size {} (from {} / {})", r.local_rank.value,
                     r.local_world.value, r.local_rank.var, r.local_world.var));
  }
  if (r.local_world.var != nullptr && r.world.var != nullptr &&
      r.local_world.value > r.world.value) {
    fail(fmt::format("local world size {} > world size {} (from {} / {})", r.local_world.value,
                     r.world.value, r.local_world.var, r.world.var));
  }
  return r;
}

// ---- seed address ------------------------------------------------------------------------

struct Host {
  std::string name;  // without brackets
  bool ipv6 = false;
};

std::string host_port(const Host& h, int port) {
  return h.ipv6 ? fmt::format("[{}]:{}", h.name, port) : fmt::format("{}:{}", h.name, port);
}

void check_host_chars(const char* var, const std::string& value, std::string_view host) {
  if (host.empty()) fail(fmt::format("{}='{}': the host is empty", var, value));
  for (char c : host) {
    if (is_space(c) || c == '[' || c == ']' || c == '/') {
      fail(fmt::format("{}='{}': '{}' is not a host name or address", var, value, host));
    }
  }
}

// "[v6]" or "[v6]:port", with the port text after the ']' returned in `port`.
Host parse_bracketed(const char* var, const std::string& value, std::string_view& port) {
  const std::size_t close = value.find(']');
  if (close == std::string::npos) fail(fmt::format("{}='{}': missing ']'", var, value));
  const std::string_view inner = std::string_view(value).substr(1, close - 1);
  if (!is_ipv6_literal(inner)) {
    fail(fmt::format("{}='{}': '{}' is not an IPv6 address", var, value, inner));
  }
  const std::string_view rest = std::string_view(value).substr(close + 1);
  if (!rest.empty()) {
    if (rest.front() != ':') {
      fail(fmt::format("{}='{}': expected ':<port>' after ']'", var, value));
    }
    port = rest.substr(1);
    if (port.empty()) fail(fmt::format("{}='{}': the port is empty", var, value));
  }
  return {std::string(inner), true};
}

// NEXAR_SEED_ADDR: "host", "host:port", "[v6]" or "[v6]:port"; `port` gets the port text.
Host parse_seed_addr(const std::string& value, std::string_view& port) {
  constexpr const char* var = "NEXAR_SEED_ADDR";
  if (value.front() == '[') return parse_bracketed(var, value, port);
  const std::size_t colon = value.find(':');
  if (colon != std::string::npos && value.find(':', colon + 1) != std::string::npos) {
    fail(fmt::format("{}='{}': write an IPv6 address in brackets, e.g. [fd00::1]:{}", var, value,
                     kSeedPort));
  }
  const std::string_view host = std::string_view(value).substr(0, colon);
  check_host_chars(var, value, host);
  if (colon != std::string::npos) {
    port = std::string_view(value).substr(colon + 1);
    if (port.empty()) fail(fmt::format("{}='{}': the port is empty", var, value));
  }
  return {std::string(host), false};
}

// MASTER_ADDR: a host name, an IPv4 address, or an IPv6 address bare or in brackets.
Host parse_master_addr(const std::string& value) {
  constexpr const char* var = "MASTER_ADDR";
  if (value.front() == '[') {
    std::string_view port;
    Host h = parse_bracketed(var, value, port);
    if (!port.empty()) {
      fail(fmt::format("{}='{}': give the port in MASTER_PORT, not in MASTER_ADDR", var, value));
    }
    return h;
  }
  if (value.find(':') != std::string::npos) {
    if (is_ipv6_literal(value)) return {value, true};
    fail(
        fmt::format("{}='{}' is neither a host name nor an IP address (give the port in "
                    "MASTER_PORT)",
                    var, value));
  }
  check_host_chars(var, value, value);
  return {value, false};
}

}  // namespace

// ---- public ------------------------------------------------------------------------------

EnvLookup process_env() {
  return [](const char* name) -> std::optional<std::string> {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == '\0') return std::nullopt;
    return std::string(v);
  };
}

bool launched(const EnvLookup& lookup) {
  const Env env(lookup);
  if (env.get("NEXAR_SEED_ADDR")) return true;
  for (const Convention& c : kConventions) {
    if (env.first(c.rank)) return true;
  }
  return false;
}

std::string slurm_first_host(std::string_view nodelist, std::string_view var) {
  const auto bad = [&](std::string_view why) {
    throw Error(Errc::invalid_argument,
                fmt::format("{}='{}': cannot read the Slurm host list: {}", var, nodelist, why));
  };
  std::string host;
  std::size_t i = 0;
  while (i < nodelist.size() && nodelist[i] != ',') {
    const char c = nodelist[i];
    if (c == '[') {
      const std::size_t close = nodelist.find(']', i);
      if (close == std::string_view::npos) bad("'[' without ']'");
      const std::string_view inner = nodelist.substr(i + 1, close - i - 1);
      if (inner.find('[') != std::string_view::npos) bad("nested '['");
      // The first item of "01-04,07" and the first number of its range.
      const std::string_view item = inner.substr(0, inner.find(','));
      const std::size_t dash = item.find('-');
      const std::string_view lo = item.substr(0, dash);
      if (!all_digits(lo) ||
          (dash != std::string_view::npos && !all_digits(item.substr(dash + 1)))) {
        bad(fmt::format("'[{}]' is not a list of numbers and ranges", inner));
      }
      host += lo;
      i = close + 1;
      continue;
    }
    if (c == ']') bad("']' without '['");
    if (is_space(c)) bad("white space");
    host += c;
    ++i;
  }
  if (host.empty()) bad("the first host name is empty");
  return host;
}

namespace {

// A token file's contents without trailing white space; fails naming `what` and the path.
std::string read_token(const char* what, const std::string& path, const char* who = "join_from_env") {
  std::string t = read_file(what, path, who);
  while (!t.empty() && is_space(t.back())) t.pop_back();
  if (t.empty())
    fail(fmt::format("{}='{}': the file holds no token (it is empty or only white space)", what, path), who);
  return t;
}

// NEXAR_CLUSTER_TOKEN or the file NEXAR_CLUSTER_TOKEN_FILE names; nothing when neither is set.
std::optional<std::string> explicit_token(const Env& env, const char* who = "join_from_env") {
  const auto token = env.get("NEXAR_CLUSTER_TOKEN");
  const auto token_file = env.get("NEXAR_CLUSTER_TOKEN_FILE");
  if (token && token_file)
    fail("both NEXAR_CLUSTER_TOKEN and NEXAR_CLUSTER_TOKEN_FILE are set; set only one", who);
  if (token) return token;
  if (token_file) return read_token("NEXAR_CLUSTER_TOKEN_FILE", *token_file, who);
  return std::nullopt;
}

}  // namespace

LaunchEnv resolve_launch_env(const EnvLookup& lookup) {
  const Env env(lookup);
  LaunchEnv out;

  const Ranks ranks = resolve_ranks(env);
  const Convention* const conv = ranks.convention;
  if (conv != nullptr) out.source = conv->source;
  out.rank = ranks.rank.value;
  out.world = ranks.world.value;
  out.local_rank = ranks.local_rank.value;
  out.local_world = ranks.local_world.value;
  if (auto c = env.get("NEXAR_LOCAL_CPUS")) {
    out.local_cpus = parse_int("NEXAR_LOCAL_CPUS", *c);
    if (out.local_cpus < 1)
      fail(fmt::format("NEXAR_LOCAL_CPUS={}: the CPU count must be at least 1", out.local_cpus));
  }

  // Seed address.
  std::optional<int> port_override;
  if (auto p = env.get("NEXAR_SEED_PORT")) port_override = parse_port("NEXAR_SEED_PORT", *p);
  Host host;
  int port = 0;
  bool embed = false;
  const char* embed_from = nullptr;
  if (auto addr = env.get("NEXAR_SEED_ADDR")) {
    std::string_view port_text;
    host = parse_seed_addr(*addr, port_text);
    if (!port_text.empty()) {
      const auto p = parse_port_text(port_text);
      if (!p) {
        fail(fmt::format("NEXAR_SEED_ADDR='{}': '{}' is not a port number (1-65535)", *addr,
                         port_text));
      }
      port = *p;
      if (port_override && *port_override != port) {
        fail(fmt::format("NEXAR_SEED_ADDR='{}' and NEXAR_SEED_PORT={} disagree on the port", *addr,
                         *port_override));
      }
    } else {
      port = port_override.value_or(kSeedPort);
    }
  } else if (auto master = env.get("MASTER_ADDR")) {
    host = parse_master_addr(*master);
    if (port_override) {
      port = *port_override;
    } else if (auto mp = env.get("MASTER_PORT")) {
      port = parse_port("MASTER_PORT", *mp);
    } else {
      port = kTorchrunPort;
    }
    embed = true;
    embed_from = "MASTER_ADDR";
  } else if (conv != nullptr && out.source == "slurm") {
    const char* var = "SLURM_STEP_NODELIST";
    auto list = env.get(var);
    if (!list) {
      var = "SLURM_JOB_NODELIST";
      list = env.get(var);
    }
    if (!list) {
      fail(
          "no seed address for Slurm ranks: set NEXAR_SEED_ADDR (an external nexar-seed) or "
          "MASTER_ADDR/MASTER_PORT (rank 0 runs the seed); SLURM_STEP_NODELIST and "
          "SLURM_JOB_NODELIST are unset");
    }
    try {
      host = {slurm_first_host(*list, var), false};
    } catch (const Error& e) {
      fail(e.what());
    }
    port = port_override.value_or(kSeedPort);
    embed = true;
    embed_from = var;
  } else if (conv != nullptr) {
    fail(
        fmt::format("no seed address for {} ranks: set NEXAR_SEED_ADDR (an external "
                    "nexar-seed) or MASTER_ADDR/MASTER_PORT (rank 0 runs the seed)",
                    conv->label));
  } else {
    fail(
        fmt::format("found no launcher environment: looked for a seed address "
                    "(NEXAR_SEED_ADDR, or MASTER_ADDR/MASTER_PORT with a rank) and for a rank "
                    "variable ({})",
                    kRankVarsText));
  }
  out.seed = host_port(host, port);
  if (embed) {
    if (out.rank < 0 || out.world < 1) {
      fail(
          fmt::format("{} names a seed that rank 0 runs, but this process's rank and world "
                      "size are unknown: set one of {} and its world size, or set "
                      "NEXAR_SEED_ADDR to an external nexar-seed",
                      embed_from, kRankVarsText));
    }
    out.embed_seed = out.rank == 0;
    if (out.embed_seed) {
      out.seed_listen = fmt::format("{}:{}", host.ipv6 ? "[::]" : "0.0.0.0", port);
    }
  }

  // Cluster token.
  if (auto t = explicit_token(env)) {
    out.token = std::move(*t);
  } else {
    std::optional<std::string> id;
    if (out.source == "torchrun") {
      id = env.get("TORCHELASTIC_RUN_ID");
    } else if (out.source == "openmpi") {
      if (auto v = env.first(std::array<const char*, 3>{"OMPI_MCA_orte_hnp_uri", "PMIX_NAMESPACE",
                                                        "OMPI_MCA_ess_base_jobid"})) {
        id = std::move(v->second);
      }
    } else if (out.source == "pmi") {
      if (auto v = env.first(std::array<const char*, 2>{"PMIX_NAMESPACE", "PMI_KVSNAME"})) {
        id = std::move(v->second);
      }
    } else if (out.source == "slurm") {
      if (auto job = env.get("SLURM_JOB_ID")) {
        id = *job;
        if (auto step = env.get("SLURM_STEP_ID")) *id += "." + *step;
      }
    }
    if (!id) fail("no cluster token: set NEXAR_CLUSTER_TOKEN or NEXAR_CLUSTER_TOKEN_FILE");
    out.token = fmt::format("derived:{}:{}", out.source, *id);
    out.token_derived = true;
  }

  if (auto v = env.get("NEXAR_ELASTIC")) {
    if (*v == "1" || *v == "true" || *v == "on") {
      out.elastic = true;
    } else if (!(*v == "0" || *v == "false" || *v == "off" || v->empty())) {
      fail(fmt::format("NEXAR_ELASTIC='{}' is not 1/true/on or 0/false/off", *v));
    }
  }
  if (out.elastic && out.token_derived) {
    // Admission stays open for the job's life: a token anyone can work out (torchrun's
    // TORCHELASTIC_RUN_ID is "none" unless set) would let anyone who reaches the seed in.
    fail(fmt::format("NEXAR_ELASTIC=1 keeps the seed admitting nodes for the whole job, so it needs a real "
                     "secret: set NEXAR_CLUSTER_TOKEN or NEXAR_CLUSTER_TOKEN_FILE (the token derived from the "
                     "{} job id can be guessed, and is refused)",
                     out.source));
  }

  // Pins on the seed.
  if (auto fp = env.get("NEXAR_SEED_FINGERPRINT")) {
    constexpr std::string_view prefix = "sha256:";
    std::string lower = *fp;
    for (char& c : lower) {
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    }
    const std::string_view hex =
        std::string_view(lower).substr(std::min(prefix.size(), lower.size()));
    const bool ok = lower.starts_with(prefix) && hex.size() == 64 &&
                    hex.find_first_not_of("0123456789abcdef") == std::string_view::npos;
    if (!ok) {
      fail(
          fmt::format("NEXAR_SEED_FINGERPRINT='{}' is not 'sha256:' followed by 64 hex "
                      "digits (as printed by nexar-seed)",
                      *fp));
    }
    out.seed_fingerprint = std::move(lower);
  }
  if (auto ca = env.get("NEXAR_SEED_CA")) {
    out.seed_ca_pem = read_file("NEXAR_SEED_CA", *ca);
    if (out.seed_ca_pem.find("-----BEGIN CERTIFICATE-----") == std::string::npos) {
      fail(fmt::format("NEXAR_SEED_CA='{}': the file holds no PEM certificate", *ca));
    }
  }

  // This worker's addresses.
  if (auto v = env.get("NEXAR_BIND_ADDR")) out.bind = *v;
  if (auto v = env.get("NEXAR_ADVERTISE_ADDR")) out.advertise = *v;
  if (auto v = env.get("NEXAR_SOCKET_IFNAME")) {
    try {
      (void)InterfaceFilter(*v);
    } catch (const Error& e) {
      fail(e.what());
    }
    out.ifname = *v;
  }

  if (auto v = env.get("NEXAR_JOIN_TIMEOUT_MS")) {
    out.join_timeout = parse_timeout("NEXAR_JOIN_TIMEOUT_MS", *v);
  }
  if (auto v = env.get("NEXAR_FORMATION_TIMEOUT_MS")) {
    out.formation_timeout = parse_timeout("NEXAR_FORMATION_TIMEOUT_MS", *v);
  }
  return out;
}

LaunchEnv resolve_launch_env() { return resolve_launch_env(process_env()); }

}  // namespace nexar::cluster

namespace nexar {

std::string read_token_file(const std::string& path) {
  return cluster::read_token("token file", path, "read_token_file");
}

std::string token_from_env() {
  auto t = cluster::explicit_token(cluster::Env(cluster::process_env()), "token_from_env");
  return t ? *std::move(t) : std::string();
}

}  // namespace nexar
