#include "launcher.hpp"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <system_error>
#include <utility>

namespace nexar_run {

namespace {

constexpr std::size_t kReadChunk = 64 * 1024;
// A line longer than this is forwarded in pieces (each ending with a newline), so a rank
// that never writes a newline cannot make the launcher buffer without bound.
constexpr std::size_t kMaxLine = 64 * 1024;

std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

[[noreturn]] void throw_errno(const std::string& what) {
  throw std::runtime_error(what + ": " + errno_text(errno));
}

// SIGHUP ignored when nexar-run started (nohup) stays ignored, for the ranks too, and is not
// forwarded. SIGINT and SIGTERM are always forwarded, and the ranks start with their default
// actions: a shell starts background commands with SIGINT ignored, which would otherwise make
// a forwarded SIGINT do nothing.
bool hup_ignored = false;

sigset_t launcher_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGUSR1);
  if (!hup_ignored) sigaddset(&set, SIGHUP);
  sigaddset(&set, SIGCHLD);
  return set;
}

void set_nonblocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) throw_errno("fcntl");
}

// ---- used between fork and exec: async-signal-safe only -------------------------------

// Makes `fd` the child's descriptor `target`, inheritable across exec.
bool move_fd(int fd, int target) {
  if (fd == target) return ::fcntl(fd, F_SETFD, 0) == 0;
  return ::dup2(fd, target) == target;
}

void close_from(int first) {
  if (::syscall(SYS_close_range, static_cast<unsigned>(first), UINT_MAX, 0u) == 0) return;
  const long max = ::sysconf(_SC_OPEN_MAX);
  const int limit = max > 0 && max < 65536 ? static_cast<int>(max) : 65536;
  for (int fd = first; fd < limit; ++fd) ::close(fd);
}

std::size_t append(char* buf, std::size_t at, std::size_t cap, const char* s) {
  while (*s != '\0' && at + 1 < cap) buf[at++] = *s++;
  return at;
}

[[noreturn]] void child_fail(const char* what, const char* prog) {
  const int err = errno;
  char buf[1024];
  std::size_t n = 0;
  n = append(buf, n, sizeof buf, "nexar-run: ");
  n = append(buf, n, sizeof buf, what);
  n = append(buf, n, sizeof buf, " '");
  n = append(buf, n, sizeof buf, prog);
  n = append(buf, n, sizeof buf, "': ");
  const char* text = ::strerrordesc_np(err);
  n = append(buf, n, sizeof buf, text != nullptr ? text : "unknown error");
  buf[n++] = '\n';
  [[maybe_unused]] const ssize_t w = ::write(2, buf, n);
  ::_exit(127);
}

}  // namespace

std::string signal_name(int sig) {
  if (const char* abbrev = ::sigabbrev_np(sig); abbrev != nullptr)
    return std::string("SIG") + abbrev;
  return "signal " + std::to_string(sig);
}

sigset_t Launcher::block_signals() {
  struct sigaction hup {};
  hup_ignored = ::sigaction(SIGHUP, nullptr, &hup) == 0 && hup.sa_handler == SIG_IGN;
  const sigset_t set = launcher_signals();
  sigset_t old;
  if (const int err = ::pthread_sigmask(SIG_BLOCK, &set, &old); err != 0)
    throw std::runtime_error("cannot block signals: " + errno_text(err));
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  ::sigaction(SIGPIPE, &ignore, nullptr);
  return old;
}

Launcher::Launcher(LauncherOptions options, const sigset_t& child_mask)
    : options_(options), child_mask_(child_mask) {
  const sigset_t set = launcher_signals();
  signal_fd_ = ::signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
  if (signal_fd_ < 0) throw_errno("signalfd");
  event_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (event_fd_ < 0) {
    ::close(signal_fd_);
    throw_errno("eventfd");
  }
  null_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (null_fd_ < 0) {
    ::close(signal_fd_);
    ::close(event_fd_);
    throw_errno("/dev/null");
  }
  if (!options_.dump_file.empty()) dump_ = std::make_unique<DumpCollector>(options_.dump_file);
}

Launcher::~Launcher() {
  for (auto& c : children_) {
    if (c.running) {
      ::kill(-c.pid, SIGKILL);
      ::kill(c.pid, SIGKILL);
      int status = 0;
      while (::waitpid(c.pid, &status, 0) < 0 && errno == EINTR) {
      }
      c.running = false;
    }
    for (Stream* s : {&c.out, &c.err})
      if (s->fd >= 0) ::close(s->fd);
  }
  ::close(null_fd_);
  ::close(event_fd_);
  ::close(signal_fd_);
}

void Launcher::spawn(int rank, const std::vector<std::string>& argv,
                     const std::vector<std::string>& env, int cpu,
                     const std::vector<std::string>& restart_env) {
  if (argv.empty()) throw std::runtime_error("no program to start");
  Slot slot;
  slot.rank = rank;
  slot.argv = argv;
  slot.restart_env = restart_env.empty() ? env : restart_env;
  slot.cpu = cpu;
  slots_.push_back(std::move(slot));
  start(slots_.size() - 1, env);
}

void Launcher::start(std::size_t slot_index, const std::vector<std::string>& env) {
  const Slot& slot = slots_[slot_index];
  const int incarnation = slot.incarnations - 1;
  std::vector<char*> args;
  for (const auto& a : slot.argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<char*> envp;
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const int cpu = slot.cpu;

  // Rank 0 reads the launcher's stdin when that is not a terminal (a terminal would stop it
  // with SIGTTIN: the ranks are not in the foreground process group); the others get
  // /dev/null, and so does a restart (what its predecessor read is gone).
  const int stdin_fd = slot.rank == 0 && incarnation == 0 && ::isatty(0) == 0 ? 0 : null_fd_;

  int out[2];
  int err[2];
  if (::pipe2(out, O_CLOEXEC) != 0) throw_errno("pipe");
  if (::pipe2(err, O_CLOEXEC) != 0) {
    const int e = errno;
    ::close(out[0]);
    ::close(out[1]);
    errno = e;
    throw_errno("pipe");
  }
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    // Die with the launcher, even when it is killed by SIGKILL.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    ::sigaction(SIGPIPE, &dfl, nullptr);
    ::sigaction(SIGINT, &dfl, nullptr);
    ::sigaction(SIGTERM, &dfl, nullptr);
    ::sigprocmask(SIG_SETMASK, &child_mask_, nullptr);
    if (!move_fd(out[1], 1) || !move_fd(err[1], 2)) ::_exit(127);
    if (stdin_fd != 0 && !move_fd(stdin_fd, 0)) child_fail("cannot redirect stdin of", args[0]);
    close_from(3);
    if (cpu >= 0) {
      // Binding is a performance hint: a refusal leaves the child where it is.
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(cpu, &set);
      ::sched_setaffinity(0, sizeof set, &set);
    }
    ::execvpe(args[0], args.data(), envp.data());
    child_fail("cannot execute", args[0]);
  }
  const int fork_errno = errno;
  ::close(out[1]);
  ::close(err[1]);
  if (pid < 0) {
    ::close(out[0]);
    ::close(err[0]);
    errno = fork_errno;
    throw_errno("fork");
  }
  // Also here, so the group exists before the first signal the launcher forwards. It fails
  // harmlessly (EACCES) when the child already called exec.
  ::setpgid(pid, pid);
  Child c;
  c.rank = slot.rank;
  c.slot = slot_index;
  c.incarnation = incarnation;
  c.pid = pid;
  c.out.fd = out[0];
  c.out.out = 1;
  c.err.fd = err[0];
  c.err.out = 2;
  children_.push_back(std::move(c));
  set_nonblocking(out[0]);
  set_nonblocking(err[0]);
}

void Launcher::cluster_formed() {
  formed_.store(true, std::memory_order_release);
  const std::uint64_t one = 1;
  [[maybe_unused]] const ssize_t n = ::write(event_fd_, &one, sizeof one);
}

void Launcher::report_failure(const std::string& message) {
  {
    std::lock_guard lock(reports_mu_);
    reports_.push_back(message);
  }
  const std::uint64_t one = 1;
  [[maybe_unused]] const ssize_t n = ::write(event_fd_, &one, sizeof one);
}

bool Launcher::flush_reports() {
  std::vector<std::string> reports;
  {
    std::lock_guard lock(reports_mu_);
    reports.swap(reports_);
  }
  for (const auto& r : reports) say(r);
  return !reports.empty();
}

int Launcher::running_count() const {
  return static_cast<int>(
      std::count_if(children_.begin(), children_.end(), [](const Child& c) { return c.running; }));
}

void Launcher::say(const std::string& line) { write_out(2, "nexar-run: " + line + "\n"); }

void Launcher::write_out(int fd, const std::string& data) {
  bool& broken = fd == 1 ? stdout_broken_ : stderr_broken_;
  std::size_t done = 0;
  while (!broken && done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n >= 0) {
      done += static_cast<std::size_t>(n);
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, 1000);
    } else if (errno != EINTR) {
      broken = true;  // EPIPE and the like: the output is gone; keep running the ranks
    }
  }
}

void Launcher::emit(const Child& child, Stream& s, bool flush_partial) {
  // Appended piece by piece: `"[" + std::string&&` trips GCC 12's bogus -Wrestrict at -O3.
  std::string prefix;
  if (options_.prefix) prefix.append("[").append(std::to_string(child.rank)).append("] ");
  std::string out;
  std::size_t start = 0;
  for (;;) {
    const std::size_t nl = s.pending.find('\n', start);
    if (nl == std::string::npos) break;
    out += prefix;
    out.append(s.pending, start, nl + 1 - start);
    start = nl + 1;
  }
  s.pending.erase(0, start);
  while (s.pending.size() >= kMaxLine) {
    out += prefix;
    out.append(s.pending, 0, kMaxLine);
    out += '\n';
    s.pending.erase(0, kMaxLine);
  }
  if (flush_partial && !s.pending.empty()) {
    out += prefix;
    out += s.pending;
    out += '\n';
    s.pending.clear();
  }
  if (!out.empty()) write_out(s.out, out);
}

bool Launcher::read_stream(const Child& child, Stream& s) {
  char buf[kReadChunk];
  for (;;) {
    const ssize_t n = ::read(s.fd, buf, sizeof buf);
    if (n > 0) {
      s.pending.append(buf, static_cast<std::size_t>(n));
      emit(child, s, false);
      return true;
    }
    if (n == 0) return false;
    if (errno == EINTR) continue;
    return errno == EAGAIN || errno == EWOULDBLOCK;
  }
}

void Launcher::close_stream(const Child& child, Stream& s) {
  emit(child, s, true);
  ::close(s.fd);
  s.fd = -1;
}

void Launcher::signal_all(int sig) {
  for (const auto& c : children_)
    if (c.running) ::kill(-c.pid, sig);
}

void Launcher::fail(int status) {
  if (!failed_) {
    failed_ = true;
    first_failure_ = status;
  }
  stopping_ = true;
  if (!term_at_ && !kill_at_ && running_count() > 0) term_at_ = Clock::now() + options_.grace;
}

bool Launcher::keep_going() const {
  // A user's SIGINT or SIGTERM, or a seed failure, stops everything as under fail-fast.
  return options_.on_failure == OnFailure::keep_going && interrupted_by_ == 0 && !stopping_;
}

void Launcher::on_exit(Child& child, int status) {
  child.running = false;
  int code = 0;  // the exit status it stands for
  bool killed = false;
  std::string what;
  if (WIFEXITED(status)) {
    code = WEXITSTATUS(status);
    if (code == 0) {
      if (restarts()) {
        slots_[child.slot].outcome = 0;
        if (!child.straggler) ending_ = true;
      }
      return;
    }
    what = "exited with status " + std::to_string(code);
  } else if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    code = 128 + sig;
    killed = true;
    what = "killed by signal " + signal_name(sig) + (WCOREDUMP(status) ? " (core dumped)" : "");
  } else {
    return;
  }
  const std::string rank = "rank " + std::to_string(child.rank);
  if (!keep_going()) {
    say(rank + " " + what);
    fail(code);
    return;
  }
  if (restarts()) {
    on_restartable_exit(child, code, what);
    return;
  }
  // The others run on; only a rank that exited non-zero by itself sets the status.
  if (killed) {
    if (killed_++ == 0) first_killed_ = code;
  } else if (!failed_) {
    failed_ = true;
    first_failure_ = code;
  }
  const int left = running_count();
  say(rank + " (pid " + std::to_string(child.pid) + ") " + what +
      (left > 0 ? "; continuing with " + std::to_string(left) + " rank(s) (--on-failure continue)"
                : "; no rank left"));
}

// Under restarts, a rank that failed while the others run on.
void Launcher::on_restartable_exit(Child& child, int code, const std::string& what) {
  Slot& slot = slots_[child.slot];
  std::string who = "rank ";
  who.append(std::to_string(child.rank)).append(" (pid ").append(std::to_string(child.pid)).append(")");
  if (child.straggler) {
    // Stopped by stop_stragglers(): not a failure of the job.
    slot.outcome = 0;
    say(who + " " + what + " (stopped: restarted, it was never admitted into the job)");
    return;
  }
  std::string why;
  if (restarts_ >= options_.max_restarts)
    why = "no restarts left (" + std::to_string(options_.max_restarts) + " used)";
  else if (ending_)
    why = "not restarted: a rank already finished, the job is ending";
  else if (running_count() == 0)
    why = "not restarted: no rank is left to admit it";
  if (!why.empty()) {
    not_restarted(slot, code, who + " " + what + "; " + why);
    return;
  }
  slot.restart_due = ++restarts_;
  slot.due_code = code;
  slot.due_what = who + " " + what;
  if (!formed_.load(std::memory_order_acquire))
    say(slot.due_what + "; it restarts as a joiner once the cluster has formed (restart " +
        std::to_string(slot.restart_due) + " of " + std::to_string(options_.max_restarts) + ")");
}

// The failure stands: it sets the status (the first such one) and the others run on.
void Launcher::not_restarted(Slot& slot, int code, const std::string& why) {
  slot.outcome = code;
  if (!failed_) {
    failed_ = true;
    first_failure_ = code;
  }
  const int left = running_count();
  say(why + (left > 0 ? "; continuing with " + std::to_string(left) + " rank(s)"
                      : std::string("; no rank left")));
}

void Launcher::start_restarts() {
  if (!formed_.load(std::memory_order_acquire)) return;
  for (std::size_t i = 0; i < slots_.size(); ++i) {
    Slot& slot = slots_[i];
    if (slot.restart_due == 0) continue;
    const int nth = slot.restart_due;
    slot.restart_due = 0;
    // Decided earlier (before the cluster formed, or in the same round as other exits):
    // things may have changed since.
    if (!keep_going() || ending_ || running_count() == 0) {
      --restarts_;
      not_restarted(slot, slot.due_code,
                    slot.due_what + "; not restarted: " +
                        (!keep_going() ? std::string("the ranks are being stopped")
                         : ending_     ? std::string("a rank already finished, the job is ending")
                                       : std::string("no rank is left to admit it")));
      continue;
    }
    ++slot.incarnations;
    try {
      start(i, slot.restart_env);
    } catch (const std::exception& e) {
      --slot.incarnations;
      not_restarted(slot, slot.due_code, slot.due_what + "; cannot restart it: " + e.what());
      continue;
    }
    say(slot.due_what + "; restarting it as a joiner (restart " + std::to_string(nth) + " of " +
        std::to_string(options_.max_restarts) + "): pid " + std::to_string(children_.back().pid));
  }
}

// A restarted rank waits, as a joiner, for the members to admit it. Once every other rank
// ended and the job ended well (a rank exited 0), nobody will: it would wait for its join
// timeout. A restarted rank that was admitted has finished by then, or soon after.
void Launcher::stop_stragglers(Clock::time_point now) {
  bool alone = running_count() > 0 && keep_going();
  bool ended_well = false;
  for (const auto& c : children_)
    if (c.running && (c.incarnation == 0 || c.straggler)) alone = false;
  for (const auto& slot : slots_) {
    if (slot.restart_due != 0) alone = false;
    if (slot.outcome == 0) ended_well = true;
  }
  if (!alone || !ended_well) {
    stragglers_at_.reset();
    return;
  }
  if (!stragglers_at_) {
    stragglers_at_ = now + options_.grace;
    return;
  }
  if (now < *stragglers_at_) return;
  stragglers_at_.reset();
  for (auto& c : children_) {
    if (!c.running) continue;
    c.straggler = true;
    std::string line = "rank ";
    line.append(std::to_string(c.rank)).append(" (pid ").append(std::to_string(c.pid));
    line.append("), restarted, still runs ").append(std::to_string(options_.grace.count()));
    line.append(" ms after every other rank ended: a joiner the job ended without admitting; ");
    say(line.append("sending it SIGTERM"));
    ::kill(-c.pid, SIGTERM);
  }
  if (!kill_at_) kill_at_ = now + options_.kill_after;
}

void Launcher::reap() {
  for (auto& c : children_) {
    if (!c.running) continue;
    int status = 0;
    const pid_t r = ::waitpid(c.pid, &status, WNOHANG);
    if (r == c.pid && (WIFEXITED(status) || WIFSIGNALED(status))) {
      // What it wrote before it exited comes before the news of its exit. The pipes stay
      // open: processes it started may still write to them.
      for (Stream* s : {&c.out, &c.err})
        for (int round = 0; round < 256 && s->fd >= 0; ++round) {
          pollfd p{s->fd, POLLIN, 0};
          if (::poll(&p, 1, 0) <= 0) break;
          if (!read_stream(c, *s)) close_stream(c, *s);
        }
      on_exit(c, status);
    }
  }
}

void Launcher::handle_signals() {
  signalfd_siginfo info;
  while (::read(signal_fd_, &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
    const int sig = static_cast<int>(info.ssi_signo);
    if (sig == SIGCHLD) continue;  // reap() runs every round
    if (sig == SIGUSR1) {
      dump();
      continue;
    }
    if (interrupted_by_ == 0) interrupted_by_ = sig;
    const int n = running_count();
    if (sig == SIGINT && ++sigint_count_ >= 2) {
      if (n > 0) say("second SIGINT: killing " + std::to_string(n) + " rank(s)");
      signal_all(SIGKILL);
      continue;
    }
    if (n > 0)
      say("forwarding " + signal_name(sig) + " to " + std::to_string(n) + " rank(s)" +
          (sig == SIGINT ? " (interrupt again to kill them)" : ""));
    signal_all(sig);
  }
}

void Launcher::dump() {
  const int n = running_count();
  if (dump_) dump_->clear();
  // The rank itself, not its process group: a rank's own children would die of it.
  for (const auto& c : children_)
    if (c.running) ::kill(c.pid, SIGUSR1);
  if (!dump_) {
    say("forwarded SIGUSR1 to " + std::to_string(n) + " rank(s): each writes its dump to NEXAR_DUMP_DIR");
    return;
  }
  for (const std::string& line : dump_->collect(static_cast<std::size_t>(n), std::chrono::seconds(3))) say(line);
}

void Launcher::handle_reports() {
  std::uint64_t count = 0;
  [[maybe_unused]] const ssize_t n = ::read(event_fd_, &count, sizeof count);
  if (flush_reports()) fail(1);
}

int Launcher::run() {
  for (;;) {
    reap();
    if (restarts()) start_restarts();
    if (running_count() == 0) break;

    const auto now = Clock::now();
    if (restarts()) stop_stragglers(now);
    if (term_at_ && now >= *term_at_) {
      say("sending SIGTERM to " + std::to_string(running_count()) + " remaining rank(s)");
      signal_all(SIGTERM);
      term_at_.reset();
      kill_at_ = now + options_.kill_after;
    }
    if (kill_at_ && now >= *kill_at_) {
      say("sending SIGKILL to " + std::to_string(running_count()) + " remaining rank(s)");
      signal_all(SIGKILL);
      kill_at_.reset();
    }
    int timeout = -1;
    for (const auto& at : {term_at_, kill_at_, stragglers_at_}) {
      if (!at) continue;
      const auto ms = std::chrono::ceil<std::chrono::milliseconds>(*at - now).count();
      const int t = static_cast<int>(std::clamp<std::int64_t>(ms, 0, INT_MAX));
      timeout = timeout < 0 ? t : std::min(timeout, t);
    }

    std::vector<pollfd> fds;
    std::vector<std::pair<Child*, Stream*>> owners;
    fds.push_back({signal_fd_, POLLIN, 0});
    fds.push_back({event_fd_, POLLIN, 0});
    for (auto& c : children_)
      for (Stream* s : {&c.out, &c.err})
        if (s->fd >= 0) {
          fds.push_back({s->fd, POLLIN, 0});
          owners.emplace_back(&c, s);
        }
    const int ready = ::poll(fds.data(), fds.size(), timeout);
    if (ready < 0) {
      if (errno == EINTR) continue;
      throw_errno("poll");
    }
    if (fds[0].revents != 0) handle_signals();
    if (fds[1].revents != 0) handle_reports();
    for (std::size_t i = 0; i < owners.size(); ++i) {
      if (fds[i + 2].revents == 0) continue;
      auto [child, stream] = owners[i];
      if (!read_stream(*child, *stream)) close_stream(*child, *stream);
    }
  }

  // Every rank has exited: what they wrote is in the pipes. Output of processes they left
  // behind that still hold a pipe open is not waited for.
  for (auto& c : children_)
    for (Stream* s : {&c.out, &c.err})
      if (s->fd >= 0) {
        // Bounded: a process left behind could keep writing.
        for (int round = 0; round < 256 && read_stream(c, *s); ++round) {
          pollfd p{s->fd, POLLIN, 0};
          if (::poll(&p, 1, 0) <= 0) break;
        }
        close_stream(c, *s);
      }
  // A restart still due never started (the cluster never formed): its failure stands.
  for (auto& slot : slots_)
    if (slot.restart_due != 0) {
      slot.restart_due = 0;
      slot.outcome = slot.due_code;
      if (!failed_) {
        failed_ = true;
        first_failure_ = slot.due_code;
      }
    }
  if (failed_) return first_failure_;
  if (interrupted_by_ != 0) return 128 + interrupted_by_;
  // Under keep-going a killed rank sets no status, but losing every rank is no success.
  if (!restarts() && killed_ > 0 && killed_ == children_.size()) return first_killed_;
  return 0;
}

}  // namespace nexar_run
