// nexar-run's process side: starts the ranks, forwards their output line by line, forwards
// signals to them, and reaps them, terminating the rest when one fails (or, with
// OnFailure::keep_going, reporting the failure and letting the rest run on, and with
// max_restarts starting a failed rank again as a joiner of the running job).
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "dump.hpp"

namespace nexar_run {

/// What the launcher does when a rank fails (exits non-zero or is killed by a signal).
enum class OnFailure {
  /// The others get `grace` to finish, then SIGTERM, then SIGKILL (--on-failure fail-fast).
  fail_fast,
  /// The failure is reported and the others run on (--on-failure continue): the runtime lets
  /// them recover from the loss of a rank.
  keep_going,
};

struct LauncherOptions {
  /// Put "[<rank>] " in front of every forwarded line.
  bool prefix = true;
  OnFailure on_failure = OnFailure::fail_fast;
  /// After the first failure, how long the other ranks get to finish on their own before
  /// SIGTERM; SIGKILL follows `kill_after` later.
  std::chrono::milliseconds grace{3000};
  std::chrono::milliseconds kill_after{5000};
  /// Under keep_going, restarts: a rank that fails once the cluster formed (cluster_formed())
  /// is started again with the same command, as a joiner of the running job (the seed must be
  /// elastic), up to this many times over the run, all ranks together. Negative: never.
  int max_restarts = -1;
  /// --dump: where SIGUSR1 to nexar-run puts the ranks' merged dump (dump.hpp). Empty:
  /// SIGUSR1 is forwarded to the ranks, which write their dumps where NEXAR_DUMP_DIR says.
  std::string dump_file;
};

class Launcher {
 public:
  /// The directory the ranks write their dumps to (their NEXAR_DUMP_DIR) under --dump;
  /// empty otherwise.
  std::string dump_dir() const { return dump_ ? dump_->dir() : std::string(); }

  /// Blocks SIGINT, SIGTERM, SIGHUP (unless it is ignored, as under nohup), SIGUSR1
  /// and SIGCHLD in the calling thread (call it from main before any thread starts, so every thread
  /// inherits the mask and only the launcher's signalfd sees them) and ignores SIGPIPE.
  /// Returns the previous mask, for the children.
  static sigset_t block_signals();

  /// `child_mask`: the signal mask the children start with (block_signals()' result).
  Launcher(LauncherOptions options, const sigset_t& child_mask);
  /// Kills (SIGKILL, whole process group) and reaps every child still running.
  ~Launcher();
  Launcher(const Launcher&) = delete;
  Launcher& operator=(const Launcher&) = delete;

  /// Starts `argv` (argv[0] searched in PATH) with exactly `env` as its environment, in its
  /// own process group, stdout and stderr piped to the launcher, confined to CPU `cpu`
  /// when it is not negative. Throws std::runtime_error when the process cannot be
  /// created; a program that cannot be executed is a child that exits 127 after writing
  /// why to its stderr. A restart of this rank (max_restarts) runs the same command on the
  /// same CPU with `restart_env` (empty: `env`), its output under the same prefix.
  void spawn(int rank, const std::vector<std::string>& argv, const std::vector<std::string>& env,
             int cpu = -1, const std::vector<std::string>& restart_env = {});

  /// From any thread: the cluster formed, so a failed rank may be restarted as a joiner of
  /// the running job. A rank that fails before this waits for it to be restarted.
  void cluster_formed();

  /// From any thread: a failure outside the children (the embedded seed); `message` is
  /// printed as "nexar-run: <message>", and it counts as a failure with status 1. It stops
  /// the ranks (grace, SIGTERM, SIGKILL) under either OnFailure.
  void report_failure(const std::string& message);

  /// Runs until every child has exited; returns the exit status nexar-run should end with.
  /// OnFailure::fail_fast: 0 when every rank succeeded, else the first failure's status
  /// (128+signal for a rank killed by a signal, 1 for a reported failure), else
  /// 128+signal if the launcher itself was interrupted.
  /// OnFailure::keep_going: the same, except that a rank killed by a signal is reported but
  /// sets no status; so: the status of the first rank that exited non-zero (or 1 for a
  /// reported failure, if that came first), else 128+signal if the launcher was
  /// interrupted, else 128+signal of the first rank killed when every rank was killed by a
  /// signal, else 0. Once the launcher is interrupted (SIGINT, SIGTERM, SIGHUP) or a failure
  /// was reported, it handles failures as under fail_fast, killed ranks included.
  /// With restarts (max_restarts >= 0): 0 when the latest incarnation of every rank exited 0,
  /// else the status of the first failure that was not restarted (128+signal for a rank
  /// killed by a signal, killed or not; 1 for a reported failure), else 128+signal if the
  /// launcher was interrupted. A failure is restarted while restarts are left, unless a rank
  /// already exited 0 (the job is ending) or no other rank runs (nobody could admit the
  /// joiner). A restarted rank still running `grace` after every rank that is not a restart
  /// ended, one of them with status 0, is presumably a joiner the job ended without
  /// admitting (it would wait for its join timeout): it is stopped (SIGTERM, then SIGKILL
  /// after `kill_after`), which sets no status.
  int run();

  /// Failures reported after run() returned, printed now; whether there were any.
  bool flush_reports();

 private:
  struct Stream {
    int fd = -1;
    int out = 1;          // where its lines go: 1 or 2
    std::string pending;  // bytes after the last newline
  };
  struct Child {
    int rank = 0;
    std::size_t slot = 0;  // index in slots_
    int incarnation = 0;   // 0: the first start, n: the rank's n-th restart
    pid_t pid = -1;
    bool running = true;
    bool straggler = false;  // stopped as a joiner the job ended without admitting
    Stream out;
    Stream err;
  };
  // One rank as the user sees it: its command and its successive incarnations (restarts).
  struct Slot {
    int rank = 0;
    std::vector<std::string> argv;
    std::vector<std::string> restart_env;
    int cpu = -1;
    int incarnations = 1;
    // The latest incarnation's end: -1 while it runs (or a restart is due), else its exit
    // status (128+signal when killed).
    int outcome = -1;
    // A restart decided but not started yet: which of the run's restarts it is, the status
    // of the failure it replaces, and the failure in words.
    int restart_due = 0;
    int due_code = 0;
    std::string due_what;
  };

  using Clock = std::chrono::steady_clock;

  void start(std::size_t slot, const std::vector<std::string>& env);
  void reap();
  void on_exit(Child& child, int status);
  bool restarts() const { return options_.max_restarts >= 0; }
  void on_restartable_exit(Child& child, int code, const std::string& what);
  void not_restarted(Slot& slot, int code, const std::string& why);
  void start_restarts();
  void stop_stragglers(Clock::time_point now);
  bool keep_going() const;
  void fail(int status);
  void handle_signals();
  /// SIGUSR1: every running rank dumps; under --dump the dumps are merged (dump.hpp).
  void dump();
  void handle_reports();
  bool read_stream(const Child& child, Stream& s);  // false at EOF or error
  void emit(const Child& child, Stream& s, bool flush_partial);
  void close_stream(const Child& child, Stream& s);
  void signal_all(int sig);
  int running_count() const;
  void write_out(int fd, const std::string& data);
  void say(const std::string& line);  // "nexar-run: <line>\n" to stderr

  LauncherOptions options_;
  sigset_t child_mask_;
  int signal_fd_ = -1;
  std::unique_ptr<DumpCollector> dump_;
  int event_fd_ = -1;
  int null_fd_ = -1;
  std::vector<Child> children_;  // every incarnation of every rank, in start order
  std::vector<Slot> slots_;

  std::mutex reports_mu_;
  std::vector<std::string> reports_;

  int first_failure_ = 0;  // exit status of the first failure, 0 while none
  bool failed_ = false;
  bool stopping_ = false;  // fail() ran: the ranks are being stopped, whatever OnFailure says
  // Under keep_going: ranks killed by a signal, and 128+signal of the first one.
  std::size_t killed_ = 0;
  int first_killed_ = 0;
  int interrupted_by_ = 0;  // first terminating signal the launcher received
  int sigint_count_ = 0;
  std::optional<Clock::time_point> term_at_;  // when the survivors get SIGTERM
  std::optional<Clock::time_point> kill_at_;  // when they get SIGKILL
  bool stdout_broken_ = false;
  bool stderr_broken_ = false;
  // Restarts.
  std::atomic<bool> formed_{false};
  int restarts_ = 0;               // decided so far, over the run
  bool ending_ = false;            // a rank exited 0: no more restarts
  std::optional<Clock::time_point> stragglers_at_;  // when restarted ranks left alone get SIGTERM
};

/// "SIGTERM", or "signal 42" for one without a name.
std::string signal_name(int sig);

}  // namespace nexar_run
