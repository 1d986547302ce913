// nexar-run: starts N ranks of a nexar program on this host.
//
//   nexar-run -n 4 -- ./my_program args...
//   nexar-run -n 8 --seed node0:29400 --token-file ~/.nexar/token -- ./my_program
//
// Without --seed it runs a seed inside the launcher (on 127.0.0.1) and hands every rank
// NEXAR_SEED_ADDR, NEXAR_CLUSTER_TOKEN, NEXAR_SEED_FINGERPRINT, NEXAR_RANK, NEXAR_WORLD_SIZE,
// NEXAR_LOCAL_RANK, NEXAR_LOCAL_WORLD_SIZE and NEXAR_LOCAL_CPUS (the CPUs it may use: a
// rank bound to one of them still knows whether the ranks share CPUs), which
// nexar::join_from_env() picks up. With
// --seed the ranks join that seed instead (started by nexar-seed, possibly for several
// hosts each running nexar-run), which assigns their ranks.
//
// Output of every rank is forwarded line by line with a "[rank] " prefix; SIGINT, SIGTERM
// and SIGHUP are forwarded to the ranks, and stop them all in either failure mode.
//
// When a rank fails (exits non-zero or is killed by a signal), --on-failure (else
// NEXAR_RUN_ON_FAILURE) decides:
//   fail-fast (default): the others get NEXAR_RUN_GRACE_MS (3000) to finish, then SIGTERM,
//     then 5 s later SIGKILL; the exit status is the first failure's (128+signal for a
//     rank killed by a signal).
//   continue: the launcher reports the failure at once ("nexar-run: rank 2 (pid 1234) killed
//     by signal SIGKILL; continuing with 3 rank(s) ...") and the others run on (the runtime
//     lets them recover from the loss of a rank). The exit status is that of the first rank
//     that exited non-zero by itself (returned from main or called exit); a rank killed by a
//     signal is reported but sets no status, so a run whose other ranks all exited 0 exits
//     0, unless every rank was killed by a signal: then 128+signal of the first one, so
//     losing everything never reads as success. A seed failure (exit 1) and the user's
//     SIGINT/SIGTERM/SIGHUP still stop every rank as under fail-fast; from then on a killed
//     rank counts again (the status is the first failure's, else 128+signal).
//
// --elastic makes the embedded seed elastic (nexar::SeedOptions::elastic): it keeps admitting
// nodes into the running job until the run ends, and the members admit them with
// Communicator::grow().
// --max-restarts N (implies --elastic and --on-failure continue): once the cluster formed, a
// rank that fails is started again with the same command, on the same CPU and with the same
// NEXAR_LOCAL_RANK, as a joiner of the running job (without NEXAR_RANK and NEXAR_WORLD_SIZE:
// a joiner gets a new rank, appended, when the members grow), up to N restarts over the run,
// all ranks together ("nexar-run: rank 2 (pid 1234) killed by signal SIGKILL; restarting it
// as a joiner (restart 1 of 3): pid 1240"); its output keeps the "[2] " prefix. A rank that
// fails before the cluster formed is restarted once it has. No restart happens once a rank
// exited 0 (the job is ending) or when no other rank runs (nobody could admit the joiner);
// when the restarts are spent, a failure is handled as under continue. A restarted rank
// still running NEXAR_RUN_GRACE_MS after every other rank ended, one with status 0, is a
// joiner the job ended without admitting: it is stopped (SIGTERM, SIGKILL 5 s later), which
// sets no status. Exit status: 0 when the latest incarnation of every rank exited 0; else that
// of the first failure that was not restarted (128+signal for a rank killed by a signal,
// which counts here), 1 for a seed failure, 128+signal when nexar-run was interrupted.
#include <nexar/cluster.hpp>
#include <nexar/config.hpp>
#include <nexar/error.hpp>

#include <CLI/CLI.hpp>

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "launcher.hpp"

extern char** environ;

namespace {

// A problem with the command line or its inputs: exit 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Options {
  int nprocs = 0;
  std::string seed;  // external seed, empty: embedded
  std::string token_file;
  bool no_prefix = false;
  std::string bind_to = "auto";
  std::int64_t timeout_ms = 120000;
  std::vector<std::string> command;
  std::chrono::milliseconds grace{3000};
  std::string on_failure = "fail-fast";
  bool elastic = false;
  int max_restarts = -1;  // negative: no restarts
  std::string dump;       // --dump FILE
};


// The CPUs this process may run on, in ascending order.
std::vector<int> allowed_cpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

// Parses the command line; returns the exit status when nexar-run should stop right away.
std::optional<int> parse(int argc, char** argv, Options& o) {
  CLI::App app{
      "nexar-run -n N [options] [--] program [args...]\n"
      "Starts N ranks of a nexar program on this host.",
      "nexar-run"};
  app.add_option("-n,--nprocs", o.nprocs, "number of ranks to start here")->required();
  app.add_option("--seed", o.seed,
                 "HOST:PORT of an external seed (nexar-seed) to join instead of running one in "
                 "the launcher; it assigns the ranks");
  app.add_option("--token-file", o.token_file,
                 "file holding the cluster token (else NEXAR_CLUSTER_TOKEN or "
                 "NEXAR_CLUSTER_TOKEN_FILE; the embedded seed generates one when none is given)");
  app.add_flag("--no-prefix", o.no_prefix, "forward output lines without the \"[rank] \" prefix");
  app.add_option("--bind-to", o.bind_to,
                 "core: each rank on a CPU of its own (in the order of the CPUs this launcher "
                 "may use); none: wherever the scheduler puts them; auto (default): core when "
                 "there are at least as many CPUs as ranks")
      ->check(CLI::IsMember({"auto", "core", "none"}))
      ->capture_default_str();
  app.add_option("--on-failure", o.on_failure,
                 "when a rank fails: fail-fast (default) stops the others; continue reports it "
                 "and lets the others run on (also NEXAR_RUN_ON_FAILURE; this option wins)")
      ->check(CLI::IsMember({"fail-fast", "continue"}));
  app.add_flag("--elastic", o.elastic,
               "the embedded seed keeps admitting nodes into the running job until the run "
               "ends; the ranks admit them with Communicator::grow()");
  app.add_option("--max-restarts", o.max_restarts,
                 "restart a rank that fails after the cluster formed, as a joiner of the running "
                 "job, up to N times over the run; implies --elastic and --on-failure continue")
      ->check(CLI::Range(0, 1000000));
  app.add_option("--dump", o.dump,
                 "on SIGUSR1 to nexar-run, every rank writes what its communicators' flight "
                 "recorders hold and what it is doing; nexar-run merges them into FILE (JSON) and "
                 "prints which ranks are behind. Without it, SIGUSR1 is forwarded to the ranks, "
                 "which write their dumps to NEXAR_DUMP_DIR (or the temporary directory)");
  app.add_option("--timeout-ms", o.timeout_ms,
                 "formation timeout of the embedded seed: how long the ranks get to join")
      ->capture_default_str();
  app.footer(
      "Each rank gets NEXAR_SEED_ADDR, NEXAR_CLUSTER_TOKEN, NEXAR_LOCAL_RANK, "
      "NEXAR_LOCAL_WORLD_SIZE and NEXAR_LOCAL_CPUS; with the embedded seed also "
      "NEXAR_SEED_FINGERPRINT, NEXAR_RANK and NEXAR_WORLD_SIZE.\n"
      "With --on-failure fail-fast, after a rank fails the others get NEXAR_RUN_GRACE_MS "
      "(default 3000) to finish, then SIGTERM, then SIGKILL 5 s later. With continue they run "
      "on; a seed failure and SIGINT/SIGTERM/SIGHUP still stop them all.\n"
      "Exit status: 0 when every rank succeeded, else the first failure's status (128+signal "
      "for a rank killed by a signal), 1 for a launcher or seed failure, 2 for bad usage, 127 "
      "for a program that cannot be executed. With --on-failure continue a rank killed by a "
      "signal sets no status: the status is that of the first rank that exited non-zero by "
      "itself, else 0, or 128+signal of the first rank killed when every rank was killed.\n"
      "With --max-restarts N a failed rank is restarted (same command, CPU and "
      "NEXAR_LOCAL_RANK; no NEXAR_RANK or NEXAR_WORLD_SIZE) and joins the running job, while "
      "restarts are left, no rank has exited 0 yet and another rank runs; then failures are "
      "handled as under continue. A restart never admitted, still running "
      "NEXAR_RUN_GRACE_MS after the others ended (one with 0), is stopped without setting a "
      "status. Exit status: 0 when the latest incarnation of every rank exited 0, else the "
      "first failure not restarted (128+signal for a killed rank), 1 for a seed failure.");
  // Everything from the program name on belongs to the program.
  app.prefix_command();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }

  o.command = app.remaining();
  const bool dashdash = !o.command.empty() && o.command.front() == "--";
  if (dashdash) o.command.erase(o.command.begin());
  if (o.nprocs < 1) throw UsageError("-n must be at least 1, not " + std::to_string(o.nprocs));
  if (o.command.empty()) throw UsageError("no program given");
  if (!dashdash && o.command.front().size() > 1 && o.command.front().front() == '-')
    throw UsageError("unknown option " + o.command.front() +
                     " (put the program after -- if its name starts with '-')");
  if (o.timeout_ms < 1) throw UsageError("--timeout-ms must be positive");
  if (*app.get_option("--seed") && o.seed.empty()) throw UsageError("--seed is empty");
  const bool restarts = app.get_option("--max-restarts")->count() > 0;
  if (!o.seed.empty() && (o.elastic || restarts))
    throw UsageError(std::string(restarts ? "--max-restarts" : "--elastic") +
                     " needs the embedded seed (no --seed): an external seed is made elastic "
                     "with nexar-seed --elastic");
  if (restarts && *app.get_option("--on-failure") && o.on_failure != "continue")
    throw UsageError("--max-restarts implies --on-failure continue, not " + o.on_failure);

  if (const std::string f = env_or_empty("NEXAR_RUN_ON_FAILURE"); !f.empty()) {
    if (f != "fail-fast" && f != "continue")
      throw UsageError("NEXAR_RUN_ON_FAILURE must be fail-fast or continue, not '" + f + "'");
    if (!*app.get_option("--on-failure")) o.on_failure = f;
  }
  if (restarts) {
    o.elastic = true;
    o.on_failure = "continue";  // the command line wins over NEXAR_RUN_ON_FAILURE
  } else {
    o.max_restarts = -1;
  }
  if (const std::string g = env_or_empty("NEXAR_RUN_GRACE_MS"); !g.empty()) {
    std::size_t used = 0;
    long long ms = -1;
    try {
      ms = std::stoll(g, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != g.size() || ms < 0)
      throw UsageError("NEXAR_RUN_GRACE_MS must be a number of milliseconds, not '" + g + "'");
    o.grace = std::chrono::milliseconds(ms);
  }
  return std::nullopt;
}

// The parent's environment without the variables nexar-run sets or that would contradict
// them, plus `extra`.
std::vector<std::string> child_environment(const std::vector<std::string>& drop,
                                           const std::vector<std::string>& extra) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('='));
    bool dropped = false;
    for (const auto& d : drop) dropped = dropped || name == d;
    if (!dropped) env.push_back(entry);
  }
  env.insert(env.end(), extra.begin(), extra.end());
  return env;
}

// Waits for the embedded seed on its own thread and reports a formation failure to the
// launcher, which then terminates the ranks.
class SeedWatch {
 public:
  SeedWatch(nexar::Seed& seed, nexar_run::Launcher& launcher)
      : seed_(seed), launcher_(launcher), thread_([this] { run(); }) {}
  ~SeedWatch() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    seed_.stop();
    thread_.join();
  }
  SeedWatch(const SeedWatch&) = delete;
  SeedWatch& operator=(const SeedWatch&) = delete;

  // Called once every rank has exited. A rank can finish before the seed thread learns the
  // cluster formed, so the outcome gets a moment; a cluster still not formed never will be.
  // Returns whether the cluster formed; a failure is reported to the launcher.
  bool settle(std::chrono::milliseconds patience) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, patience, [this] { return state_ != State::pending; });
    if (state_ == State::pending) {
      stopping_ = true;
      launcher_.report_failure("seed: every rank exited before the cluster formed");
    }
    return state_ == State::formed;
  }

 private:
  enum class State { pending, formed, failed };

  void run() {
    try {
      seed_.wait();
      launcher_.cluster_formed();
      std::lock_guard lock(mu_);
      state_ = State::formed;
    } catch (const std::exception& e) {
      std::lock_guard lock(mu_);
      state_ = State::failed;
      if (!stopping_) launcher_.report_failure(std::string("seed: ") + e.what());
    }
    cv_.notify_all();
  }

  nexar::Seed& seed_;
  nexar_run::Launcher& launcher_;
  std::mutex mu_;
  std::condition_variable cv_;
  State state_ = State::pending;
  bool stopping_ = false;
  std::thread thread_;
};

int launch(const Options& o) {
  // Before any thread exists (the seed's included), so only the launcher sees the signals.
  const sigset_t child_mask = nexar_run::Launcher::block_signals();

  // The token: --token-file, else NEXAR_CLUSTER_TOKEN or NEXAR_CLUSTER_TOKEN_FILE (as
  // join_from_env reads them), else the embedded seed generates one.
  std::string token;
  try {
    token = o.token_file.empty() ? nexar::token_from_env() : nexar::read_token_file(o.token_file);
  } catch (const nexar::Error& e) {
    throw UsageError(e.what());  // a bad token file or environment is a usage error (exit 2)
  }
  if (!o.seed.empty() && token.empty())
    throw UsageError(
        "--seed needs the cluster token: --token-file, NEXAR_CLUSTER_TOKEN or "
        "NEXAR_CLUSTER_TOKEN_FILE");

  const std::string n = std::to_string(o.nprocs);
  std::vector<std::string> common;
  // The ranks get the token itself; a token file as well would be a conflict to them. An
  // outer launcher's rank variables (nexar-run under srun, mpirun or torchrun) would take
  // precedence over ours in join_from_env and give every local rank the same identity.
  std::vector<std::string> drop = {
      "NEXAR_SEED_ADDR",  "NEXAR_CLUSTER_TOKEN", "NEXAR_CLUSTER_TOKEN_FILE", "NEXAR_RANK",
      "NEXAR_WORLD_SIZE", "NEXAR_LOCAL_RANK",    "NEXAR_LOCAL_WORLD_SIZE",   "NEXAR_SEED_PORT",
      "NEXAR_LOCAL_CPUS",
      "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
      "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
      "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_RANK", "PMIX_RANK", "PMI_SIZE", "PMI_LOCAL_RANK",
      "PMI_LOCAL_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "SLURM_PROCID", "SLURM_NTASKS",
      "SLURM_NPROCS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"};
  std::unique_ptr<nexar::Seed> seed;
  if (o.seed.empty()) {
    nexar::SeedOptions so;
    so.listen = "127.0.0.1:0";
    so.world = o.nprocs;
    so.formation_timeout = std::chrono::milliseconds(o.timeout_ms);
    so.token = token;
    so.elastic = o.elastic;
    seed = std::make_unique<nexar::Seed>(so, nexar::Config::from_env());
    // Pins inherited from another cluster would reject this seed.
    drop.push_back("NEXAR_SEED_FINGERPRINT");
    drop.push_back("NEXAR_SEED_CA");
    common = {"NEXAR_SEED_ADDR=" + seed->address(), "NEXAR_CLUSTER_TOKEN=" + seed->token(),
              "NEXAR_SEED_FINGERPRINT=" + seed->fingerprint(), "NEXAR_WORLD_SIZE=" + n,
              "NEXAR_LOCAL_WORLD_SIZE=" + n};
  } else {
    common = {"NEXAR_SEED_ADDR=" + o.seed, "NEXAR_CLUSTER_TOKEN=" + token,
              "NEXAR_LOCAL_WORLD_SIZE=" + n};
  }

  nexar_run::LauncherOptions lo;
  lo.prefix = !o.no_prefix;
  lo.grace = o.grace;
  lo.on_failure = o.on_failure == "continue" ? nexar_run::OnFailure::keep_going
                                             : nexar_run::OnFailure::fail_fast;
  lo.max_restarts = o.max_restarts;
  lo.dump_file = o.dump;
  nexar_run::Launcher launcher(lo, child_mask);
  if (!o.dump.empty()) {
    drop.push_back("NEXAR_DUMP_DIR");
    common.push_back("NEXAR_DUMP_DIR=" + launcher.dump_dir());
  }
  std::optional<SeedWatch> watch;
  if (seed) watch.emplace(*seed, launcher);

  // Like mpirun's default binding: two spinning ranks the scheduler happens to start on
  // one CPU stay there for tens to hundreds of milliseconds before it moves one (measured,
  // 2 processes on 2 CPUs: 8 B all_reduce 240 us instead of 8-10 us for the first
  // 100-700 iterations in about one run in four; bound, 20 runs out of 20 at 9-11 us).
  const std::vector<int> cpus = allowed_cpus();
  const bool bind = o.bind_to == "core" || (o.bind_to == "auto" && cpus.size() >= static_cast<std::size_t>(o.nprocs));
  // A bound rank sees one CPU of its own; the CPUs of the whole job tell it whether ranks
  // share them (more ranks than CPUs: wait politely, docs/CONFIG.md). Without this, two
  // ranks bound to two CPUs each counted themselves oversubscribed and yielded after every
  // poll: a barrier beside a bulk transfer took 2.2-3x its idle time instead of 1.4x.
  if (!cpus.empty()) common.push_back("NEXAR_LOCAL_CPUS=" + std::to_string(cpus.size()));
  for (int i = 0; i < o.nprocs; ++i) {
    std::vector<std::string> extra = common;
    extra.push_back("NEXAR_LOCAL_RANK=" + std::to_string(i));
    // A restart joins the running job and gets a new rank there: the formation's rank and
    // world size would only mislead it (join ignores them for a joiner anyway). It keeps its
    // local rank: it takes the place, and the CPU, of the process it replaces.
    std::vector<std::string> restart_extra;
    for (const auto& e : extra)
      if (e.rfind("NEXAR_WORLD_SIZE=", 0) != 0) restart_extra.push_back(e);
    if (seed) extra.push_back("NEXAR_RANK=" + std::to_string(i));
    const int cpu = bind && !cpus.empty() ? cpus[static_cast<std::size_t>(i) % cpus.size()] : -1;
    std::vector<std::string> restart_env;
    if (o.max_restarts >= 0) restart_env = child_environment(drop, restart_extra);
    launcher.spawn(i, o.command, child_environment(drop, extra), cpu, restart_env);
  }

  int rc = launcher.run();
  if (watch) {
    // After a failure the seed's fate no longer matters; after success it must have formed.
    // (Under --on-failure continue, a rank killed after formation leaves rc 0 and the seed
    // formed: nothing to report. The seed is done once the cluster formed.)
    if (rc == 0) watch->settle(std::chrono::seconds(1));
    watch.reset();  // stops the seed
  }
  if (launcher.flush_reports() && rc == 0) rc = 1;
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  // Descriptors 0-2 closed at start would be reused by the pipes to the ranks and then be
  // overwritten when a rank's stdout and stderr are set up; fill them with /dev/null.
  for (int fd = 0; fd <= 2; ++fd)
    if (::fcntl(fd, F_GETFD) < 0 && ::open("/dev/null", O_RDWR) < 0) return 1;
  Options o;
  try {
    if (auto rc = parse(argc, argv, o)) return *rc;
    return launch(o);
  } catch (const UsageError& e) {
    std::cerr << "nexar-run: " << e.what() << "\nRun with --help for more information.\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "nexar-run: " << e.what() << "\n";
    return 1;
  }
}
