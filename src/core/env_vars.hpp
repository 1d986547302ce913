// Every NEXAR_* environment variable anything of nexar reads, in one table, and the warning
// for the others (a misspelled setting would otherwise be ignored without a word).
//
// Config::from_env() reads the variables of the settings table (core/settings.hpp), which a
// static_assert in src/core/config.cpp checks against this table; the other readers go
// through EnvName, which refuses at compile time a name missing from it; tests check the other direction (every config entry is read
// by from_env(), every launcher entry by resolve_launch_env(), and nothing else there).
// docs/CONFIG.md documents each variable.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace nexar::detail {

/// Who reads a variable.
enum class EnvReader {
  config,     ///< Config::from_env() (src/core/config.cpp; NEXAR_DEBUG also the logger)
  launcher,   ///< join_from_env() (src/cluster/launch_env.cpp), nexar-run and nexar.torch
  nexar_run,  ///< the nexar-run tool only (tools/run/main.cpp)
  dump,       ///< where a rank writes its dump on SIGUSR1 (src/comm/dump_signal.cpp)
  scripts,    ///< the project's own test and benchmark scripts; set around the ranks they
              ///< start, so known here to keep those ranks quiet
};

struct EnvVar {
  std::string_view name;
  EnvReader reader;
};

inline constexpr EnvVar kEnvVars[] = {
    // Config::from_env(), in the order of struct Config.
    {"NEXAR_TIMEOUT_MS", EnvReader::config},
    {"NEXAR_CONNECT_TIMEOUT_MS", EnvReader::config},
    {"NEXAR_IDLE_TIMEOUT_MS", EnvReader::config},
    {"NEXAR_FAILURE_TIMEOUT_MS", EnvReader::config},
    {"NEXAR_ON_FAILURE", EnvReader::config},
    {"NEXAR_RPC_TIMEOUT_MS", EnvReader::config},
    {"NEXAR_RPC_THREADS", EnvReader::config},
    {"NEXAR_STALL_WARN_MS", EnvReader::config},
    {"NEXAR_RECORDER_OPS", EnvReader::config},
    {"NEXAR_TRACE", EnvReader::config},
    {"NEXAR_MAX_FRAME_BYTES", EnvReader::config},
    {"NEXAR_EAGER_LIMIT_BYTES", EnvReader::config},
    {"NEXAR_UNEXPECTED_LIMIT_BYTES", EnvReader::config},
    {"NEXAR_STREAM_WINDOW_BYTES", EnvReader::config},
    {"NEXAR_UDP_PAYLOAD_BYTES", EnvReader::config},
    {"NEXAR_UDP_GSO", EnvReader::config},
    {"NEXAR_BULK_SCAVENGER", EnvReader::config},
    {"NEXAR_CONGESTION", EnvReader::config},
    {"NEXAR_LINK", EnvReader::config},
    {"NEXAR_TCP_CIPHER", EnvReader::config},
    {"NEXAR_CONNECTIONS_PER_PEER", EnvReader::config},
    {"NEXAR_ENGINE_THREADS", EnvReader::config},
    {"NEXAR_SHM", EnvReader::config},
    {"NEXAR_SHM_RING_BYTES", EnvReader::config},
    {"NEXAR_SHM_COLLECTIVE_BYTES", EnvReader::config},
    {"NEXAR_TOPOLOGY", EnvReader::config},
    {"NEXAR_LAZY_CONNECT", EnvReader::config},
    {"NEXAR_RELAY_HOPS", EnvReader::config},
    {"NEXAR_RELAY_WINDOW_BYTES", EnvReader::config},
    {"NEXAR_IMPAIR", EnvReader::config},
    {"NEXAR_SPIN_US", EnvReader::config},
    {"NEXAR_YIELD_WHEN_IDLE", EnvReader::config},
    {"NEXAR_SEGMENT_BYTES", EnvReader::config},
    {"NEXAR_ALLREDUCE_RING_BYTES", EnvReader::config},
    {"NEXAR_ALLREDUCE_DOUBLING_BYTES", EnvReader::config},
    {"NEXAR_BROADCAST_CHAIN_BYTES", EnvReader::config},
    {"NEXAR_COLLECTIVE_EAGER_BYTES", EnvReader::config},
    {"NEXAR_DEBUG", EnvReader::config},
    // join_from_env() (docs/CONFIG.md, "Cluster formation and launchers").
    {"NEXAR_RANK", EnvReader::launcher},
    {"NEXAR_WORLD_SIZE", EnvReader::launcher},
    {"NEXAR_LOCAL_RANK", EnvReader::launcher},
    {"NEXAR_LOCAL_WORLD_SIZE", EnvReader::launcher},
    {"NEXAR_LOCAL_CPUS", EnvReader::launcher},
    {"NEXAR_SEED_ADDR", EnvReader::launcher},
    {"NEXAR_SEED_PORT", EnvReader::launcher},
    {"NEXAR_CLUSTER_TOKEN", EnvReader::launcher},
    {"NEXAR_CLUSTER_TOKEN_FILE", EnvReader::launcher},
    {"NEXAR_ELASTIC", EnvReader::launcher},
    {"NEXAR_SEED_FINGERPRINT", EnvReader::launcher},
    {"NEXAR_SEED_CA", EnvReader::launcher},
    {"NEXAR_BIND_ADDR", EnvReader::launcher},
    {"NEXAR_ADVERTISE_ADDR", EnvReader::launcher},
    {"NEXAR_SOCKET_IFNAME", EnvReader::launcher},
    {"NEXAR_JOIN_TIMEOUT_MS", EnvReader::launcher},
    {"NEXAR_FORMATION_TIMEOUT_MS", EnvReader::launcher},
    // The dump on SIGUSR1 (docs/CONFIG.md, "Diagnosis"); nexar-run --dump sets it.
    {"NEXAR_DUMP_DIR", EnvReader::dump},
    // nexar-run (docs/CONFIG.md, "nexar-run").
    {"NEXAR_RUN_ON_FAILURE", EnvReader::nexar_run},
    {"NEXAR_RUN_GRACE_MS", EnvReader::nexar_run},
    // scripts/test.sh, scripts/torch_suite.sh, tests/fuzz_smoke.sh, bench/netns_loss.sh and
    // the Python tests.
    {"NEXAR_TEST_STAGES", EnvReader::scripts},
    {"NEXAR_JOBS", EnvReader::scripts},
    {"NEXAR_TEST_JOBS", EnvReader::scripts},
    {"NEXAR_FUZZ_SECONDS", EnvReader::scripts},
    {"NEXAR_PYTHON", EnvReader::scripts},
    {"NEXAR_PYTHON_PATH", EnvReader::scripts},
    {"NEXAR_RUN", EnvReader::scripts},
    {"NEXAR_ENV", EnvReader::scripts},
};

/// The entry of `name` in kEnvVars, or nullptr.
constexpr const EnvVar* find_env_var(std::string_view name) noexcept {
  for (const EnvVar& v : kEnvVars) {
    if (v.name == name) return &v;
  }
  return nullptr;
}

/// Not constexpr on purpose: EnvName calls it for a name that is not in kEnvVars, which
/// makes the compiler refuse the name (and name this function in its error).
void env_name_missing_from_kEnvVars();

/// The name of a variable nexar reads, checked against kEnvVars at compile time:
/// `env(EnvName("NEXAR_TYPO"))` does not build. Add the variable to kEnvVars (and to
/// docs/CONFIG.md) to read a new one.
class EnvName {
 public:
  consteval EnvName(const char* name) : name_(name) {  // NOLINT(google-explicit-constructor)
    if (find_env_var(name) == nullptr) env_name_missing_from_kEnvVars();
  }
  const char* c_str() const noexcept { return name_; }

 private:
  const char* name_;
};

/// The variable of kEnvVars closest to `name` by edit distance (insertion, deletion,
/// substitution or transposition of adjacent characters, after the NEXAR_ prefix), when it
/// is close enough to be a likely typo (at most a third of the longer name differs, or one
/// is the other with a word more: "NEXAR_EAGER_LIMIT"); empty otherwise. Ties go to the
/// earlier entry. Case is ignored.
std::string_view closest_env_var(std::string_view name);

/// The warning for an unlisted NEXAR_* variable `name`: "NAME is not a nexar setting (did
/// you mean CLOSEST?)", or without a close one "NAME is not a nexar setting (docs/CONFIG.md
/// lists them)".
std::string unknown_env_message(std::string_view name);

/// The names of the NEXAR_* variables in `environment` ("NAME=value" entries ending with a
/// null pointer, as environ) that are not in kEnvVars, in the environment's order.
std::vector<std::string> unknown_env_vars(const char* const* environment);

/// Logs unknown_env_message() at warn level for every unlisted NEXAR_* variable of the
/// process environment, each name once per process (Config::from_env() calls it).
void warn_unknown_env();

}  // namespace nexar::detail
