// nexar — the ways to make a world communicator: all ranks in one process
// (bootstrap_local), or a cluster of separate processes and hosts (join, join_from_env,
// with a Seed).
//
// A seed node admits workers: each worker proves it knows the cluster token, sends a
// certificate signing request for a key it generated itself, and waits. When the expected
// world size has joined (or, with a minimum, when the formation timeout passes), the seed
// assigns ranks, signs every worker's certificate with the cluster CA and sends each worker
// the address of every peer. The workers then connect to each other directly (full mesh,
// mutual TLS rooted in the cluster CA) and the seed leaves: it is never on the data path.
//
// Trust (docs/SECURITY.md): the token never travels. Both sides prove knowledge of it with an
// HMAC bound to their TLS session, so an impostor seed learns nothing and cannot hand out
// certificates. A worker may in addition pin the seed's certificate fingerprint or the
// cluster CA file.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <nexar/communicator.hpp>
#include <nexar/config.hpp>

namespace nexar {

/// How a seed runs.
struct SeedOptions {
  /// "host:port" (IPv4 or [IPv6]) to listen on; port 0 picks a free one. Host names are
  /// resolved.
  std::string listen = "0.0.0.0:29400";
  /// Number of ranks that form the cluster (>= 1).
  int world = 0;
  /// When > 0: if `formation_timeout` passes with at least this many workers joined, the
  /// cluster forms with them (world = the number joined). 0: exactly `world` is required.
  int min_world = 0;
  /// How long the seed waits for the world to join. When it passes without a cluster,
  /// every waiting worker is told so (Errc::timeout) and wait() throws.
  std::chrono::milliseconds formation_timeout{std::chrono::minutes(2)};
  /// The cluster token joiners must know. Empty: a random 256-bit token is generated
  /// (read it back with Seed::token()).
  std::string token;
  /// Name of the cluster (certificate organisation). Empty: a random one.
  std::string cluster;
  /// Elastic: after the world formed, keep admitting nodes into the running job for as
  /// long as the seed runs. Members stay linked to the seed and hear of every joiner;
  /// their Communicator::grow() admits it (see communicator.hpp, "elastic membership").
  /// Joiners prove the token and get certificates exactly as at formation, each gets a
  /// world rank never handed out before, and no node name is ever signed twice. New
  /// connections after formation are rate-limited (20 per second, bursts of 40). If the
  /// seed stops or dies the job runs on; only admission stops. The token must be a real
  /// secret: join_from_env refuses elastic mode with a token derived from a launcher's
  /// job id.
  bool elastic = false;
};

/// A seed node (library form of `nexar-seed`). Listens from construction; runs on its own
/// thread; admits one cluster (and, when elastic, the joiners of its running job).
class Seed {
 public:
  /// Binds and starts listening. Throws nexar::Error: invalid_argument (bad options or
  /// address), io (cannot bind), tls.
  explicit Seed(SeedOptions options, const Config& config = Config::from_env());
  /// Stops listening; workers still waiting are told the seed stopped.
  ~Seed();
  Seed(const Seed&) = delete;
  Seed& operator=(const Seed&) = delete;

  /// The address actually bound, "ip:port".
  std::string address() const;
  /// The cluster token.
  const std::string& token() const;
  /// "sha256:<64 hex digits>" of the seed's certificate, for NEXAR_SEED_FINGERPRINT.
  const std::string& fingerprint() const;
  /// The cluster CA certificate (PEM), for NEXAR_SEED_CA.
  const std::string& ca_pem() const;
  /// The cluster name.
  const std::string& cluster() const;

  /// Blocks until the cluster formed and every member received its assignment; returns the
  /// world size. Throws nexar::Error: timeout (formation timeout passed without enough
  /// workers, or `limit` passed), closed (stop() was called).
  int wait(std::chrono::milliseconds limit = std::chrono::milliseconds::max());
  /// Stops the seed (idempotent). Workers still waiting get Errc::closed.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Creates `n` communicators in this process, ranks 0..n-1, each with its own UDP socket
/// on 127.0.0.1 and its own progress thread, fully connected over real QUIC with mutual
/// TLS rooted in a fresh in-memory cluster CA: the quickest way to a world, for tests and
/// single-process programs (run each rank on a thread of its own). With more ranks than
/// cores, waiting threads do not spin (Config::spin is taken as 0). Throws nexar::Error on
/// failure (invalid_argument for n < 1, io, tls, timeout).
std::vector<Communicator> bootstrap_local(int n, const Config& config = Config::from_env());

/// How a worker joins.
struct JoinOptions {
  /// The seed, "host:port" (IPv4, [IPv6] or a host name).
  std::string seed;
  /// The cluster token (required).
  std::string token;
  /// Optional pins on the seed, checked during the TLS handshake in addition to the token
  /// proof: "sha256:<hex>" of the seed certificate, and/or the cluster CA certificate PEM.
  std::string seed_fingerprint;
  std::string seed_ca_pem;
  /// The rank to ask for (e.g. from a launcher), or -1 to take the lowest free one.
  int rank = -1;
  /// The world size this worker expects, or 0 for no expectation. A seed forming a
  /// different size rejects the worker with a clear error.
  int world = 0;
  /// Local address of this worker's data socket, "ip" or "ip:port" (port 0 or none: any).
  /// Empty: chosen from `ifname` if set, else the wildcard address of the seed's family.
  std::string bind;
  /// Address peers should dial, "host" or "host:port" (no port: the bound port). Empty: the
  /// bound address if it is specific, else the address the seed sees this worker come from.
  std::string advertise;
  /// Interface selection with NCCL_SOCKET_IFNAME syntax: comma-separated name prefixes,
  /// '^' first to exclude them, '=' first for exact names (e.g. "eth", "^docker,lo",
  /// "=ens5"). Used when `bind` is empty.
  std::string ifname;
  /// How long to keep trying to reach the seed and to wait for the cluster to form.
  std::chrono::milliseconds join_timeout{std::chrono::minutes(3)};
};

/// Joins a cluster through its seed and connects to every peer. Returns a communicator that
/// works exactly like one from bootstrap_local. Throws nexar::Error: invalid_argument (bad
/// options), rejected (wrong token, rank taken, world mismatch, cluster full), timeout
/// (seed unreachable or the world never formed), tls (seed failed its checks), io.
Communicator join(const JoinOptions& options, const Config& config = Config::from_env());

/// Joins the cluster described by the environment: explicit NEXAR_* variables first, then
/// torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), Open MPI
/// (OMPI_COMM_WORLD_*), PMI/PMIx (PMI_RANK, PMI_SIZE, PMIX_RANK), Slurm (SLURM_PROCID,
/// SLURM_NTASKS, SLURM_LOCALID, SLURM_STEP_NODELIST). Rank 0 runs a seed inside its process
/// when no external seed (NEXAR_SEED_ADDR) is named. docs/CONFIG.md lists every variable
/// and the precedence. Throws nexar::Error(invalid_argument) naming what is missing or
/// inconsistent, and whatever join() throws.
Communicator join_from_env(const Config& config = Config::from_env());

/// The cluster token in the file at `path`: its contents without trailing white space.
/// Throws nexar::Error(invalid_argument) naming the path when it cannot be read, is larger
/// than 1 MiB, or holds no token.
std::string read_token_file(const std::string& path);

/// The token from NEXAR_CLUSTER_TOKEN, or from the file NEXAR_CLUSTER_TOKEN_FILE names
/// (exactly as join_from_env reads them), or "" when neither is set. Throws
/// nexar::Error(invalid_argument) when both are set or the file is unusable.
std::string token_from_env();

/// True when the environment describes one rank of a launched cluster: a rank variable of
/// any convention above, or NEXAR_SEED_ADDR. Programs use it to choose between
/// join_from_env() and running all ranks in one process.
bool launched_from_env();

}  // namespace nexar
