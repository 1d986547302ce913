// mpi_bench: nccl-tests-style collective benchmark on MPI (written for Open MPI 4.1).
//
//   mpirun --allow-run-as-root --oversubscribe -np 4 --mca pml ob1 --mca btl tcp,self
//          --mca btl_tcp_if_include lo ./mpi_bench all_reduce -b 8 -e 64M
//   (shared memory instead of TCP: --mca btl vader,self).  "--mca pml ob1" matters: Debian's
//   Open MPI is built with UCX, and pml ucx ignores the btl selection (it would use shared
//   memory even when TCP was asked for).
//
// Collectives: all_reduce, broadcast, reduce, all_gather, reduce_scatter
// (MPI_Reduce_scatter_block), all_to_all, barrier.  Out-of-place buffers throughout; see
// common.hpp for how time, algbw, busbw and #wrong are computed.
#include <mpi.h>

#include <cstdio>
#include <exception>
#include <memory>
#include <string>

#include "common.hpp"

namespace {

using peers::Coll;

struct MpiComm {
  MPI_Comm comm = MPI_COMM_WORLD;
  int me = 0, n = 1;
  int rank() const { return me; }
  int size() const { return n; }
  void barrier() { MPI_Barrier(comm); }
  void max_inplace(double* v, size_t len) {
    MPI_Allreduce(MPI_IN_PLACE, v, int(len), MPI_DOUBLE, MPI_MAX, comm);
  }
  long sum_long(long x) {
    long r = 0;
    MPI_Allreduce(&x, &r, 1, MPI_LONG, MPI_SUM, comm);
    return r;
  }
};

template <class T> MPI_Datatype mpi_type();
template <> MPI_Datatype mpi_type<float>() { return MPI_FLOAT; }
template <> MPI_Datatype mpi_type<double>() { return MPI_DOUBLE; }

template <class T>
struct MpiOp : peers::Op<T> {
  Coll c;
  MPI_Comm comm;
  int me, n, root;
  size_t count;
  T* in;
  T* out;
  MpiOp(Coll c_, MPI_Comm comm_, int me_, int n_, int root_, size_t count_, T* in_, T* out_)
      : c(c_), comm(comm_), me(me_), n(n_), root(root_), count(count_), in(in_), out(out_) {}

  void run() override {
    const MPI_Datatype dt = mpi_type<T>();
    const int cnt = int(count);
    const int blk = int(count / size_t(n));
    int rc = MPI_SUCCESS;
    switch (c) {
      case Coll::all_reduce: rc = MPI_Allreduce(in, out, cnt, dt, MPI_SUM, comm); break;
      case Coll::reduce: rc = MPI_Reduce(in, out, cnt, dt, MPI_SUM, root, comm); break;
      // The root broadcasts straight from its input; the others receive into their output.
      case Coll::broadcast: rc = MPI_Bcast(me == root ? in : out, cnt, dt, root, comm); break;
      case Coll::all_gather: rc = MPI_Allgather(in, blk, dt, out, blk, dt, comm); break;
      case Coll::reduce_scatter:
        rc = MPI_Reduce_scatter_block(in, out, blk, dt, MPI_SUM, comm);
        break;
      case Coll::all_to_all: rc = MPI_Alltoall(in, blk, dt, out, blk, dt, comm); break;
      case Coll::barrier: rc = MPI_Barrier(comm); break;
    }
    if (rc != MPI_SUCCESS) MPI_Abort(comm, 2);
  }
  const T* output() const override { return (c == Coll::broadcast && me == root) ? in : out; }
};

void usage(const char* argv0) {
  std::printf(
      "usage: mpirun [mpirun options] %s COLLECTIVE [options]\n"
      "  COLLECTIVE: all_reduce broadcast reduce all_gather reduce_scatter all_to_all barrier\n"
      "%s",
      argv0, peers::common_usage());
}

template <class T>
long sweep(MpiComm& comm, const peers::Options& o, double& avg) {
  auto make = [&](Coll c, size_t count, T* in, T* out) -> std::unique_ptr<peers::Op<T>> {
    if (count > size_t(INT32_MAX)) throw std::runtime_error("count exceeds MPI int range");
    return std::make_unique<MpiOp<T>>(c, comm.comm, comm.me, comm.n, o.root, count, in, out);
  };
  return peers::run_sweep<T>(comm, o, make, avg);
}

}  // namespace

int main(int argc, char** argv) {
  // Parse before MPI_Init so that --help works without a launcher.
  peers::Options o;
  bool want_help = false;
  std::string err;
  try {
    int i = 1;
    if (argc > 1 && argv[1][0] != '-') {
      if (!peers::parse_coll(argv[1], o.coll)) throw std::invalid_argument(std::string("unknown collective: ") + argv[1]);
      i = 2;
    } else if (argc <= 1) {
      throw std::invalid_argument("missing collective name");
    }
    while (i < argc) {
      std::string a = argv[i];
      if (a == "-h" || a == "--help") { want_help = true; ++i; continue; }
      int used = peers::parse_common_flag(argc, argv, i, o);
      if (!used) throw std::invalid_argument("unknown option: " + a);
      i += used;
    }
  } catch (const std::exception& e) {
    if (!want_help) err = e.what();
  }
  if (want_help) { usage(argv[0]); return 0; }
  if (!err.empty()) {
    std::fprintf(stderr, "mpi_bench: %s\n", err.c_str());
    usage(argv[0]);
    return 2;
  }

  MPI_Init(&argc, &argv);
  MpiComm comm;
  MPI_Comm_rank(comm.comm, &comm.me);
  MPI_Comm_size(comm.comm, &comm.n);
  MPI_Comm_set_errhandler(comm.comm, MPI_ERRORS_RETURN);

  int rc = 0;
  try {
    peers::validate(o, comm.n);
    if (comm.me == 0) {
      char lib[MPI_MAX_LIBRARY_VERSION_STRING];
      int len = 0;
      MPI_Get_library_version(lib, &len);
      std::string l(lib, size_t(len));
      if (auto nl = l.find_first_of("\r\n"); nl != std::string::npos) l.resize(nl);
      std::printf("# mpi_bench %s: %s\n", peers::coll_name(o.coll), l.c_str());
      std::printf("# ranks %d  minBytes %zu  maxBytes %zu  step: %g(factor)  warmup iters: %d  "
                  "iters: %d  validation: %d  timing: median over iters of max over ranks\n",
                  comm.n, o.min_bytes, o.max_bytes, o.factor, o.warmup, o.iters, o.check);
      std::fflush(stdout);
    }
    double avg = 0;
    long wrong = o.dtype == peers::DType::f32 ? sweep<float>(comm, o, avg)
                                              : sweep<double>(comm, o, avg);
    if (comm.me == 0) peers::print_footer(wrong, avg, o.check && o.coll != Coll::barrier);
    rc = wrong ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mpi_bench rank %d: %s\n", comm.me, e.what());
    MPI_Abort(comm.comm, 2);
  }
  MPI_Finalize();
  return rc;
}
