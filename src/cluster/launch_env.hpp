// Reading a launcher's environment into join settings (join_from_env). Pure: everything
// goes through an EnvLookup, so tests and tools can feed any environment; only
// process_env() and the argument-less resolve_launch_env() read the real one.
//
// Empty values count as unset everywhere (launch scripts often export empty variables).
// docs/CONFIG.md, "Cluster formation and launchers", documents the same rules for users;
// keep the two in step.
//
// Rank, world size, local rank, local world size
//   come AS A GROUP from the first convention whose rank variable is set, in this order
//   (rank; world; local rank; local world; "a | b": the first of them that is set):
//     "nexar"     NEXAR_RANK; NEXAR_WORLD_SIZE; NEXAR_LOCAL_RANK; NEXAR_LOCAL_WORLD_SIZE
//     "torchrun"  RANK; WORLD_SIZE; LOCAL_RANK; LOCAL_WORLD_SIZE
//     "openmpi"   OMPI_COMM_WORLD_RANK; OMPI_COMM_WORLD_SIZE; OMPI_COMM_WORLD_LOCAL_RANK;
//                 OMPI_COMM_WORLD_LOCAL_SIZE
//     "pmi"       PMI_RANK | PMIX_RANK; PMI_SIZE; PMI_LOCAL_RANK | MPI_LOCALRANKID;
//                 PMI_LOCAL_SIZE | MPI_LOCALNRANKS
//     "slurm"     SLURM_PROCID; SLURM_NTASKS | SLURM_NPROCS; SLURM_LOCALID;
//                 SLURM_NTASKS_PER_NODE (only when a plain integer, else ignored)
//   Variables of other conventions are never mixed in.
//   Then NEXAR_RANK, NEXAR_WORLD_SIZE, NEXAR_LOCAL_RANK and NEXAR_LOCAL_WORLD_SIZE, where
//   set, override the single field. A convention whose rank is set but whose world size is
//   not is an error naming both, unless NEXAR_WORLD_SIZE supplies it. NEXAR_WORLD_SIZE
//   alone (no rank anywhere) is allowed: rank stays -1 and the seed assigns one.
//   Checked: integers; world >= 1; 0 <= rank < world; local rank >= 0; local world >= 1;
//   local rank < local world; local world <= world.
//
// Seed address (the first rule that applies)
//   1. NEXAR_SEED_ADDR = "host:port" or "[ipv6]:port": an external seed (embed_seed false).
//      Without a port: NEXAR_SEED_PORT, else 29400; both given and different: error.
//   2. MASTER_ADDR (torchrun style; a host name, an IPv4 address, or an IPv6 address bare
//      or in brackets) with port NEXAR_SEED_PORT, else MASTER_PORT, else 29500. Rank 0
//      runs the seed inside its process (embed_seed).
//   3. Source "slurm": the first host of SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST),
//      port NEXAR_SEED_PORT, else 29400. Rank 0 embeds the seed.
//   4. Otherwise an error: no seed address for that launcher's ranks, or, with no
//      convention at all, nothing found (the message lists what is looked for).
//   An embedded seed needs this process's rank and world size (error otherwise). On rank 0
//   seed_listen is "0.0.0.0:<port>", or "[::]:<port>" when the seed host is an IPv6
//   address. IPv6 seeds are written "[addr]:port" in `seed`.
//
// Cluster token (the first that is set)
//   NEXAR_CLUSTER_TOKEN (verbatim); NEXAR_CLUSTER_TOKEN_FILE (the file's contents without
//   trailing white space; unreadable or empty: error); both set: error. Else derived from
//   the launcher's job identity, "derived:<source>:<id>" with token_derived = true:
//     torchrun  TORCHELASTIC_RUN_ID
//     openmpi   OMPI_MCA_orte_hnp_uri | PMIX_NAMESPACE | OMPI_MCA_ess_base_jobid
//     pmi       PMIX_NAMESPACE | PMI_KVSNAME
//     slurm     SLURM_JOB_ID, plus "." SLURM_STEP_ID when set
//   A derived token only keeps separate jobs apart; it is no secret (anyone who can read
//   the job's environment or guess its id knows it). Else: error.
//
// Other settings
//   NEXAR_SEED_FINGERPRINT  "sha256:" + 64 hex digits, any case (stored in lower case)
//   NEXAR_SEED_CA           path of a PEM file holding the cluster CA; its contents go to
//                           seed_ca_pem (unreadable, empty or not PEM: error)
//   NEXAR_BIND_ADDR, NEXAR_ADVERTISE_ADDR   copied; join() checks them
//   NEXAR_SOCKET_IFNAME     interface spec, checked with InterfaceFilter (cluster/ifname.hpp)
//   NEXAR_JOIN_TIMEOUT_MS, NEXAR_FORMATION_TIMEOUT_MS   positive integers (ms), <= 365 days
//
// Every error is nexar::Error(Errc::invalid_argument) whose message starts with
// "join_from_env: " and names the variable(s) and the bad value.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace nexar::cluster {

/// Returns the value of an environment variable, or nullopt when it is unset.
using EnvLookup = std::function<std::optional<std::string>(const char* name)>;

/// Lookup in the process environment (getenv); empty values count as unset.
EnvLookup process_env();

/// The join settings found in the environment.
struct LaunchEnv {
  /// The convention rank and world came from: "nexar", "torchrun", "openmpi", "pmi",
  /// "slurm", or "" when no rank variable is set.
  std::string source;
  int rank = -1;        ///< -1: unknown (the seed assigns one)
  int world = 0;        ///< 0: unknown
  int local_rank = -1;  ///< -1: unknown
  int local_world = 0;  ///< 0: unknown
  /// NEXAR_LOCAL_CPUS: how many CPUs the job's ranks on this host have between them, when a
  /// launcher that binds each rank to its own CPUs says so (nexar-run does); 0: unknown.
  int local_cpus = 0;
  /// The seed to dial, "host:port" or "[ipv6]:port".
  std::string seed;
  /// This process runs the seed (rank 0 when the seed address came from MASTER_ADDR or
  /// Slurm) before joining it.
  bool embed_seed = false;
  /// When embed_seed: where the embedded seed listens, "0.0.0.0:<port>" or "[::]:<port>".
  std::string seed_listen;
  std::string token;
  /// The token was derived from the launcher's job id (no secret; see above).
  bool token_derived = false;
  /// NEXAR_ELASTIC: the embedded seed keeps admitting joiners after formation (requires an
  /// explicit token: a derived one is refused).
  bool elastic = false;
  std::string seed_fingerprint;  ///< "sha256:<64 lower-case hex digits>" or empty
  std::string seed_ca_pem;       ///< PEM contents of NEXAR_SEED_CA, or empty
  std::string bind;
  std::string advertise;
  std::string ifname;
  std::chrono::milliseconds join_timeout{std::chrono::minutes(3)};
  std::chrono::milliseconds formation_timeout{std::chrono::minutes(2)};
};

/// True when the process was started by a launcher or told where a seed is: any rank
/// variable of the conventions above (NEXAR_RANK, RANK, OMPI_COMM_WORLD_RANK, PMI_RANK,
/// PMIX_RANK, SLURM_PROCID) or NEXAR_SEED_ADDR is set. Tools use it to choose between one
/// rank per process (join_from_env) and threads in one process (bootstrap_local).
bool launched(const EnvLookup& env);

/// Applies the rules above. Throws nexar::Error(invalid_argument).
LaunchEnv resolve_launch_env(const EnvLookup& env);

/// resolve_launch_env(process_env()).
LaunchEnv resolve_launch_env();

/// The first host of a Slurm host list, e.g. "node[01-04,07],gpu5" -> "node01",
/// "rack[1-2]-n[3-4]" -> "rack1-n3", "a,b" -> "a". Only the first host is expanded; the rest
/// of the list is not checked. Throws nexar::Error(invalid_argument) naming `var` and the
/// list when it cannot be read (empty, unbalanced or non-numeric brackets, white space).
std::string slurm_first_host(std::string_view nodelist, std::string_view var);

}  // namespace nexar::cluster
