// gloo_bench: nccl-tests-style collective benchmark on Gloo (Debian's 2022-05 snapshot,
// GLOO_VERSION 0.5.0), TCP transport, one process per rank, FileStore rendezvous.
//
//   gloo_bench --launch 4 all_reduce -b 8 -e 64M          # forks 4 ranks itself
//   gloo_bench --rank R --size N --store-dir DIR all_reduce ...   # one rank per command
//
// Collectives (this snapshot):
//   all_reduce      --algo ring (default; gloo::allreduce, out of place)
//                   --algo bcube (gloo::allreduce BCUBE, out of place)
//                   --algo halving_doubling (gloo::AllreduceHalvingDoubling, in place)
//   broadcast       gloo::broadcast
//   reduce          gloo::reduce
//   all_gather      gloo::allgather
//   reduce_scatter  gloo::ReduceScatterHalvingDoubling (the only reduce-scatter here; in place)
//   all_to_all      gloo::alltoall
//   barrier         gloo::barrier
// In-place algorithms get their input copied into the working buffer before each
// iteration, outside the timed region (so they are measured in place).
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/config.h>
#include <gloo/math.h>
#include <gloo/reduce.h>
#include <gloo/reduce_scatter.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common.hpp"

namespace {

using peers::Coll;

enum class Algo { ring, bcube, halving_doubling };

const char* algo_name(Algo a) {
  switch (a) {
    case Algo::ring: return "ring";
    case Algo::bcube: return "bcube";
    case Algo::halving_doubling: return "halving_doubling";
  }
  return "?";
}

struct Args {
  peers::Options o;
  Algo algo = Algo::ring;
  int rank = -1;
  int size = -1;
  int launch = 0;
  std::string store_dir;
  std::string host = "127.0.0.1";
  std::string iface;
  int timeout_s = 120;
};

template <class T>
using ElemFn = void (*)(void*, const void*, const void*, size_t);

template <class T> ElemFn<T> sum_fn() { return static_cast<ElemFn<T>>(&gloo::sum<T>); }
template <class T> ElemFn<T> max_fn() { return static_cast<ElemFn<T>>(&gloo::max<T>); }

struct GlooComm {
  std::shared_ptr<gloo::Context> ctx;
  int rank() const { return ctx->rank; }
  int size() const { return ctx->size; }
  void barrier() {
    gloo::BarrierOptions opts(ctx);
    gloo::barrier(opts);
  }
  void max_inplace(double* v, size_t len) {
    gloo::AllreduceOptions opts(ctx);
    opts.setOutput(v, len);
    opts.setReduceFunction(max_fn<double>());
    gloo::allreduce(opts);
  }
  long sum_long(long x) {
    int64_t v = x;
    gloo::AllreduceOptions opts(ctx);
    opts.setOutput(&v, 1);
    opts.setReduceFunction(sum_fn<int64_t>());
    gloo::allreduce(opts);
    return long(v);
  }
};

// Out-of-place collectives of Gloo's "options" API; the options object (and its unbound
// buffers) is built inside the timed call, as a caller of this API does for every call.
template <class T>
struct GlooOp : peers::Op<T> {
  Coll c;
  Algo algo;
  std::shared_ptr<gloo::Context> ctx;
  int root;
  size_t count;
  T* in;
  T* out;
  GlooOp(Coll c_, Algo a_, std::shared_ptr<gloo::Context> ctx_, int root_, size_t count_, T* in_,
         T* out_)
      : c(c_), algo(a_), ctx(std::move(ctx_)), root(root_), count(count_), in(in_), out(out_) {}

  void run() override {
    const size_t n = size_t(ctx->size);
    switch (c) {
      case Coll::all_reduce: {
        gloo::AllreduceOptions opts(ctx);
        opts.setAlgorithm(algo == Algo::bcube ? gloo::AllreduceOptions::Algorithm::BCUBE
                                              : gloo::AllreduceOptions::Algorithm::RING);
        opts.setInput(in, count);
        opts.setOutput(out, count);
        opts.setReduceFunction(sum_fn<T>());
        gloo::allreduce(opts);
        break;
      }
      case Coll::broadcast: {
        gloo::BroadcastOptions opts(ctx);
        opts.setRoot(root);
        if (ctx->rank == root) opts.setInput(in, count);
        opts.setOutput(out, count);
        gloo::broadcast(opts);
        break;
      }
      case Coll::reduce: {
        gloo::ReduceOptions opts(ctx);
        opts.setRoot(root);
        opts.setInput(in, count);
        opts.setOutput(out, count);
        opts.setReduceFunction(sum_fn<T>());
        gloo::reduce(opts);
        break;
      }
      case Coll::all_gather: {
        gloo::AllgatherOptions opts(ctx);
        opts.setInput(in, count / n);
        opts.setOutput(out, count);
        gloo::allgather(opts);
        break;
      }
      case Coll::all_to_all: {
        gloo::AlltoallOptions opts(ctx);
        opts.setInput(in, count);
        opts.setOutput(out, count);
        gloo::alltoall(opts);
        break;
      }
      case Coll::barrier: {
        gloo::BarrierOptions opts(ctx);
        gloo::barrier(opts);
        break;
      }
      case Coll::reduce_scatter:
        throw std::logic_error("reduce_scatter is not an options-API collective");
    }
  }
  const T* output() const override { return out; }
};

// Gloo's older algorithm classes: set up once per buffer (pairs and slots), then run()
// repeatedly, in place on `work`.  prepare() restores the input into `work` (untimed).
template <class T>
struct GlooInPlaceOp : peers::Op<T> {
  std::unique_ptr<gloo::Algorithm> alg;
  std::vector<T> work;
  const T* in;
  GlooInPlaceOp(Coll c, const std::shared_ptr<gloo::Context>& ctx, size_t count, const T* in_)
      : work(count), in(in_) {
    if (count > size_t(INT32_MAX)) throw std::runtime_error("count exceeds Gloo int range");
    std::vector<T*> ptrs{work.data()};
    if (c == Coll::all_reduce) {
      alg = std::make_unique<gloo::AllreduceHalvingDoubling<T>>(ctx, ptrs, int(count));
    } else {
      std::vector<int> recv(size_t(ctx->size), int(count / size_t(ctx->size)));
      alg = std::make_unique<gloo::ReduceScatterHalvingDoubling<T>>(ctx, ptrs, int(count), recv);
    }
  }
  void prepare() override { std::memcpy(work.data(), in, work.size() * sizeof(T)); }
  void run() override { alg->run(); }
  // reduce_scatter leaves this rank's block at the front of the buffer.
  const T* output() const override { return work.data(); }
};

template <class T>
long sweep(GlooComm& comm, const Args& a, double& avg) {
  auto make = [&](Coll c, size_t count, T* in, T* out) -> std::unique_ptr<peers::Op<T>> {
    if (c == Coll::reduce_scatter || (c == Coll::all_reduce && a.algo == Algo::halving_doubling))
      return std::make_unique<GlooInPlaceOp<T>>(c, comm.ctx, count, in);
    return std::make_unique<GlooOp<T>>(c, a.algo, comm.ctx, a.o.root, count, in, out);
  };
  return peers::run_sweep<T>(comm, a.o, make, avg);
}

int worker(const Args& a) {
  try {
    gloo::transport::tcp::attr attr;
    if (!a.iface.empty()) attr.iface = a.iface;
    else attr.hostname = a.host;
    auto dev = gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::FileStore store(a.store_dir);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(a.rank, a.size);
    ctx->setTimeout(std::chrono::seconds(a.timeout_s));
    ctx->connectFullMesh(store, dev);

    GlooComm comm{ctx};
    peers::validate(a.o, comm.size());
    if (comm.rank() == 0) {
      std::string algo = a.o.coll == Coll::all_reduce ? algo_name(a.algo)
                         : a.o.coll == Coll::reduce_scatter ? "halving_doubling"
                                                            : "default";
      std::printf("# gloo_bench %s: Gloo %d.%d.%d (Debian snapshot), transport tcp on %s, "
                  "algorithm %s\n",
                  peers::coll_name(a.o.coll), GLOO_VERSION_MAJOR, GLOO_VERSION_MINOR,
                  GLOO_VERSION_PATCH, a.iface.empty() ? a.host.c_str() : a.iface.c_str(),
                  algo.c_str());
      std::printf("# ranks %d  minBytes %zu  maxBytes %zu  step: %g(factor)  warmup iters: %d  "
                  "iters: %d  validation: %d  timing: median over iters of max over ranks\n",
                  comm.size(), a.o.min_bytes, a.o.max_bytes, a.o.factor, a.o.warmup, a.o.iters,
                  a.o.check);
      std::fflush(stdout);
    }
    double avg = 0;
    long wrong = a.o.dtype == peers::DType::f32 ? sweep<float>(comm, a, avg)
                                                : sweep<double>(comm, a, avg);
    if (comm.rank() == 0) peers::print_footer(wrong, avg, a.o.check && a.o.coll != Coll::barrier);
    // Nobody tears down its connections while a peer still talks to it.
    comm.barrier();
    return wrong ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gloo_bench rank %d: %s\n", a.rank, e.what());
    return 2;
  }
}

// Forks a.launch ranks, each running worker(); a fresh store directory per launch.  A rank
// that fails hard (exit >= 2 or a signal) takes the others down with it.
int launch(Args a) {
  char tmpl[] = "/tmp/gloo_bench.XXXXXX";
  if (!mkdtemp(tmpl)) {
    std::perror("mkdtemp");
    return 2;
  }
  const std::string dir = tmpl;
  a.store_dir = dir;
  a.size = a.launch;
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t parent = getpid();
  std::vector<pid_t> kids;
  for (int r = 0; r < a.launch; ++r) {
    pid_t p = fork();
    if (p < 0) {
      std::perror("fork");
      for (pid_t k : kids) kill(k, SIGKILL);
      for (pid_t k : kids) waitpid(k, nullptr, 0);
      std::filesystem::remove_all(dir);
      return 2;
    }
    if (p == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the launcher
      if (getppid() != parent) _exit(2);
      a.rank = r;
      int rc = worker(a);
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(rc);
    }
    kids.push_back(p);
  }
  int worst = 0;
  size_t alive = kids.size();
  while (alive > 0) {
    int st = 0;
    pid_t p = waitpid(-1, &st, 0);
    if (p < 0) {
      if (errno == EINTR) continue;
      break;
    }
    bool ours = false;
    for (pid_t& k : kids)
      if (k == p) { k = 0; ours = true; }
    if (!ours) continue;
    --alive;
    int rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    if (rc > worst) worst = rc;
    if (rc >= 2)
      for (pid_t k : kids)
        if (k > 0) kill(k, SIGKILL);
  }
  std::filesystem::remove_all(dir);
  return worst;
}

void usage(const char* argv0) {
  std::printf(
      "usage: %s --launch N COLLECTIVE [options]\n"
      "       %s --rank R --size N --store-dir DIR COLLECTIVE [options]\n"
      "  COLLECTIVE: all_reduce broadcast reduce all_gather reduce_scatter all_to_all barrier\n"
      "  --launch N           fork N ranks on this machine (fresh store directory in /tmp)\n"
      "  --rank R, --size N   this process's rank and the world size (without --launch)\n"
      "  --store-dir DIR      shared, initially empty directory for gloo's FileStore\n"
      "  --host ADDR          address the TCP transport binds to, default 127.0.0.1\n"
      "  --iface NAME         network interface to bind to instead of --host\n"
      "  --algo A             all_reduce algorithm: ring (default), bcube, halving_doubling\n"
      "  --timeout S          gloo timeout in seconds, default 120\n"
      "%s",
      argv0, argv0, peers::common_usage());
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  bool have_coll = false;
  try {
    for (int i = 1; i < argc;) {
      std::string s = argv[i];
      if (s == "-h" || s == "--help") {
        usage(argv[0]);
        return 0;
      }
      auto value = [&]() -> std::string {
        if (auto eq = s.find('='); s.rfind("--", 0) == 0 && eq != std::string::npos) {
          std::string v = s.substr(eq + 1);
          s = s.substr(0, eq);
          i += 1;
          return v;
        }
        if (i + 1 >= argc) throw std::invalid_argument("missing value for " + s);
        i += 2;
        return argv[i - 1];
      };
      std::string key = s.substr(0, s.find('='));
      if (key == "--launch") a.launch = std::stoi(value());
      else if (key == "--rank") a.rank = std::stoi(value());
      else if (key == "--size") a.size = std::stoi(value());
      else if (key == "--store-dir") a.store_dir = value();
      else if (key == "--host") a.host = value();
      else if (key == "--iface") a.iface = value();
      else if (key == "--timeout") a.timeout_s = std::stoi(value());
      else if (key == "--algo") {
        std::string v = value();
        if (v == "ring") a.algo = Algo::ring;
        else if (v == "bcube") a.algo = Algo::bcube;
        else if (v == "halving_doubling" || v == "hd" || v == "halving-doubling")
          a.algo = Algo::halving_doubling;
        else throw std::invalid_argument("unknown --algo " + v);
      } else if (int used = peers::parse_common_flag(argc, argv, i, a.o)) {
        i += used;
      } else if (s[0] != '-' && !have_coll) {
        if (!peers::parse_coll(s, a.o.coll)) throw std::invalid_argument("unknown collective: " + s);
        have_coll = true;
        ++i;
      } else {
        throw std::invalid_argument("unknown argument: " + s);
      }
    }
    if (!have_coll) throw std::invalid_argument("missing collective name");
    if (a.launch > 0) {
      if (a.rank >= 0 || !a.store_dir.empty())
        throw std::invalid_argument("--launch excludes --rank and --store-dir");
    } else {
      if (a.rank < 0 || a.size < 1 || a.rank >= a.size || a.store_dir.empty())
        throw std::invalid_argument("need --launch N, or --rank, --size and --store-dir");
    }
    if (a.algo != Algo::ring && a.o.coll != Coll::all_reduce)
      throw std::invalid_argument("--algo applies to all_reduce only");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gloo_bench: %s\n", e.what());
    usage(argv[0]);
    return 2;
  }
  return a.launch > 0 ? launch(a) : worker(a);
}
