// The collectives of nexar.Communicator, each in a blocking form and an i-form.
//
// Convention: `recv=None` means in place (MPI_IN_PLACE's meaning for each collective), else
// the result goes to `recv`. Element types come from the buffers (or `dtype=`); the sizes are
// checked here, before anything starts, so that errors name the Python arguments.
#include <algorithm>
#include <cstring>
#include <numeric>

#include "common.hpp"

namespace nexar_py {

namespace {

using nexar::DataType;
using nexar::ReduceOp;

struct Opts {
  std::optional<DataType> dtype;
  nexar::CollectiveOptions o;
};

Opts make_opts(py::handle dtype, nexar::Algorithm algorithm, py::handle timeout,
               std::size_t segment_bytes) {
  Opts r;
  r.dtype = parse_dtype(dtype);
  r.o.algorithm = algorithm;
  r.o.timeout = to_ms(timeout, "timeout");
  r.o.segment_bytes = segment_bytes;
  return r;
}

// How a buffer is counted: in elements of `dt` (size bytes each). `scale` turns the caller's
// element counts (v-forms) into these units: 1, except for types nexar has no DataType for
// (int16, complex, bool), which collectives that only move data carry as bytes.
struct Unit {
  DataType dt;
  std::size_t size;
  std::size_t scale;
};

Unit reduction_unit(const char* op, const char* arg, const Borrowed& b, const Opts& o) {
  if (o.dtype) return {*o.dtype, nexar::size_of(*o.dtype), 1};
  if (!b.dtype()) {
    invalid(std::string(op) + ": " + arg + " holds " + b.type_name() +
            ", which nexar cannot reduce (it reduces float32, float64, float16, bfloat16, "
            "int8, uint8, int32, uint32, int64, uint64); pass dtype= to reinterpret the bytes");
  }
  return {*b.dtype(), b.itemsize(), 1};
}

Unit movement_unit(const Borrowed& b, const Opts& o) {
  if (o.dtype) return {*o.dtype, nexar::size_of(*o.dtype), 1};
  if (b.dtype()) return {*b.dtype(), b.itemsize(), 1};
  return {DataType::u8, 1, b.itemsize()};
}

std::size_t count(const char* op, const char* arg, const Borrowed& b, const Unit& u) {
  if (b.bytes() % u.size != 0) {
    invalid(std::string(op) + ": " + arg + " holds " + std::to_string(b.bytes()) +
            " bytes, not a whole number of " + dtype_name(u.dt) + " elements");
  }
  return b.bytes() / u.size;
}

void need(const char* op, const char* arg, std::size_t have, std::size_t want, const Unit& u) {
  if (have < want) {
    invalid(std::string(op) + ": " + arg + " holds " + std::to_string(have / u.scale) +
            " elements, " + std::to_string(want / u.scale) + " needed");
  }
}

void same_type(const char* op, const Borrowed& a, const char* an, const Borrowed& b,
               const char* bn, const Opts& o) {
  if (o.dtype) return;  // both reinterpreted as the given dtype
  if (a.type_name() != b.type_name() || a.itemsize() != b.itemsize()) {
    invalid(std::string(op) + ": " + an + " holds " + a.type_name() + " but " + bn +
            " holds " + b.type_name() + "; both must have the same element type");
  }
}

// The output `recv` of a call whose input is `send`: borrowed writable into `h`, and of
// send's element type (unless a dtype reinterprets both).
Borrowed& borrow_recv(Hold& h, py::handle recv, const char* op, const Borrowed& send, const Opts& o) {
  Borrowed& rb = h.add(borrow(recv, Access::write, op, "recv"));
  same_type(op, send, "send", rb, "recv", o);
  return rb;
}

std::byte* copy_to_scratch(Hold& h, const std::byte* from, std::size_t bytes) {
  h.scratch.assign(from, from + bytes);
  return h.scratch.data();
}

py::object obj(py::handle h) { return py::reinterpret_borrow<py::object>(h); }

// Starts the operation: non-blocking returns a Request (holding what was borrowed), blocking
// waits without the GIL and returns `result`.
template <class Start, class Block>
py::object run(std::shared_ptr<Hold> hold, py::object result, bool nb, Start&& start,
               Block&& block) {
  if (nb) {
    nexar::Request q;
    {
      py::gil_scoped_release r;
      q = start();
    }
    return py::cast(
        PyRequest(std::move(q), std::move(hold), std::move(result), PyRequest::Kind::value));
  }
  {
    py::gil_scoped_release r;
    block();
  }
  return result;
}

int nranks(const PyComm& s) { return s.c.size(); }
std::size_t usize(const PyComm& s) { return static_cast<std::size_t>(s.c.size()); }

// ---- the collectives --------------------------------------------------------------------

py::object all_reduce(PyComm& s, const Opts& o, bool nb, py::handle send, py::handle recv,
                      ReduceOp op) {
  const char* name = "all_reduce";
  auto h = std::make_shared<Hold>();
  const bool in_place = recv.is_none();
  Borrowed& sb =
      h->add(borrow(send, in_place ? Access::write : Access::read, name, in_place ? "data" : "send"));
  Borrowed* rb = &sb;
  if (!in_place) {
    rb = &h->add(borrow(recv, Access::write, name, "recv"));
    same_type(name, sb, "send", *rb, "recv", o);
  }
  const Unit u = reduction_unit(name, in_place ? "data" : "send", sb, o);
  const std::size_t n = count(name, "send", sb, u);
  need(name, "recv", count(name, "recv", *rb, u), n, u);
  std::byte* sp = sb.data();
  std::byte* rp = rb->data();
  return run(h, obj(in_place ? send : recv), nb,
             [&] { return s.c.iall_reduce(sp, rp, n, u.dt, op, o.o); },
             [&] { s.c.all_reduce(sp, rp, n, u.dt, op, o.o); });
}

py::object broadcast(PyComm& s, const Opts& o, bool nb, py::handle data, int root) {
  const char* name = "broadcast";
  auto h = std::make_shared<Hold>();
  // The root only reads its buffer, so a read-only one is fine there.
  Borrowed& b = h->add(borrow(data, s.c.rank() == root ? Access::read : Access::write, name, "data"));
  const Unit u = movement_unit(b, o);
  const std::size_t n = count(name, "data", b, u);
  std::byte* p = b.data();
  return run(h, obj(data), nb, [&] { return s.c.ibroadcast(p, n, u.dt, root, o.o); },
             [&] { s.c.broadcast(p, n, u.dt, root, o.o); });
}

py::object reduce(PyComm& s, const Opts& o, bool nb, py::handle send, py::handle recv,
                  ReduceOp op, int root) {
  const char* name = "reduce";
  auto h = std::make_shared<Hold>();
  const bool at_root = s.c.rank() == root;
  const bool in_place = recv.is_none();
  Borrowed& sb = h->add(borrow(send, at_root && in_place ? Access::write : Access::read, name,
                               in_place ? "data" : "send"));
  const Unit u = reduction_unit(name, "send", sb, o);
  const std::size_t n = count(name, "send", sb, u);
  std::byte* rp = nullptr;
  py::object result = py::none();
  if (at_root) {
    Borrowed* rb = &sb;
    if (!in_place) {
      rb = &h->add(borrow(recv, Access::write, name, "recv"));
      same_type(name, sb, "send", *rb, "recv", o);
    }
    need(name, "recv", count(name, "recv", *rb, u), n, u);
    rp = rb->data();
    result = obj(in_place ? send : recv);
  }
  std::byte* sp = sb.data();
  return run(h, result, nb, [&] { return s.c.ireduce(sp, rp, n, u.dt, op, root, o.o); },
             [&] { s.c.reduce(sp, rp, n, u.dt, op, root, o.o); });
}

py::object all_gather(PyComm& s, const Opts& o, bool nb, py::handle send, py::handle recv) {
  const char* name = "all_gather";
  auto h = std::make_shared<Hold>();
  std::byte* sp = nullptr;
  std::byte* rp = nullptr;
  std::size_t n = 0;
  Unit u{};
  if (recv.is_none()) {
    // In place: `data` holds size blocks; this rank's block is already at its position.
    Borrowed& d = h->add(borrow(send, Access::write, name, "data"));
    u = movement_unit(d, o);
    const std::size_t total = count(name, "data", d, u);
    if (total % usize(s) != 0) {
      invalid(std::string(name) + ": in place, data holds " + std::to_string(total / u.scale) +
              " elements, not a multiple of the " + std::to_string(nranks(s)) + " ranks");
    }
    n = total / usize(s);
    sp = copy_to_scratch(*h, d.data() + static_cast<std::size_t>(s.c.rank()) * n * u.size,
                         n * u.size);
    rp = d.data();
  } else {
    Borrowed& sb = h->add(borrow(send, Access::read, name, "send"));
    Borrowed& rb = borrow_recv(*h, recv, name, sb, o);
    u = movement_unit(sb, o);
    n = count(name, "send", sb, u);
    need(name, "recv", count(name, "recv", rb, u), n * usize(s), u);
    sp = sb.data();
    rp = rb.data();
  }
  return run(h, obj(recv.is_none() ? send : recv), nb,
             [&] { return s.c.iall_gather(sp, rp, n, u.dt, o.o); },
             [&] { s.c.all_gather(sp, rp, n, u.dt, o.o); });
}

py::object reduce_scatter(PyComm& s, const Opts& o, bool nb, py::handle send, py::handle recv,
                          ReduceOp op) {
  const char* name = "reduce_scatter";
  auto h = std::make_shared<Hold>();
  const bool in_place = recv.is_none();
  Borrowed& sb = h->add(borrow(send, in_place ? Access::write : Access::read, name,
                               in_place ? "data" : "send"));
  const Unit u = reduction_unit(name, "send", sb, o);
  const std::size_t n = count(name, "send", sb, u);
  const auto [off, len] = nexar::block_of(n, nranks(s), s.c.rank());
  std::byte* sp = sb.data();
  std::byte* rp = nullptr;
  if (in_place) {
    // In place: this rank's block of the reduction lands at its own position in `data`
    // (nexar::block_of), the rest is left as it was; the input is read from a copy.
    sp = copy_to_scratch(*h, sb.data(), sb.bytes());
    rp = sb.data() + off * u.size;
  } else {
    Borrowed& rb = borrow_recv(*h, recv, name, sb, o);
    need(name, "recv", count(name, "recv", rb, u), len, u);
    rp = rb.data();
  }
  return run(h, obj(in_place ? send : recv), nb,
             [&] { return s.c.ireduce_scatter(sp, rp, n, u.dt, op, o.o); },
             [&] { s.c.reduce_scatter(sp, rp, n, u.dt, op, o.o); });
}

py::object all_to_all(PyComm& s, const Opts& o, bool nb, py::handle send, py::handle recv) {
  const char* name = "all_to_all";
  auto h = std::make_shared<Hold>();
  const bool in_place = recv.is_none();
  Borrowed& sb = h->add(borrow(send, in_place ? Access::write : Access::read, name,
                               in_place ? "data" : "send"));
  const Unit u = movement_unit(sb, o);
  const std::size_t n = count(name, "send", sb, u);
  if (n % usize(s) != 0) {
    invalid(std::string(name) + ": " + (in_place ? "data" : "send") + " holds " +
            std::to_string(n / u.scale) + " elements, not " + std::to_string(nranks(s)) +
            " equal blocks");
  }
  std::byte* sp = sb.data();
  std::byte* rp = nullptr;
  if (in_place) {
    sp = copy_to_scratch(*h, sb.data(), sb.bytes());
    rp = sb.data();
  } else {
    Borrowed& rb = borrow_recv(*h, recv, name, sb, o);
    need(name, "recv", count(name, "recv", rb, u), n, u);
    rp = rb.data();
  }
  const std::size_t block = n / usize(s);
  return run(h, obj(in_place ? send : recv), nb,
             [&] { return s.c.iall_to_all(sp, rp, block, u.dt, o.o); },
             [&] { s.c.all_to_all(sp, rp, block, u.dt, o.o); });
}

py::object gather(PyComm& s, const Opts& o, bool nb, py::handle send, py::handle recv, int root) {
  const char* name = "gather";
  auto h = std::make_shared<Hold>();
  const bool at_root = s.c.rank() == root;
  std::byte* sp = nullptr;
  std::byte* rp = nullptr;
  std::size_t n = 0;
  Unit u{};
  py::object result = py::none();
  if (at_root && recv.is_none()) {
    // In place at the root: `data` holds size blocks, the root's own already in place.
    Borrowed& d = h->add(borrow(send, Access::write, name, "data"));
    u = movement_unit(d, o);
    const std::size_t total = count(name, "data", d, u);
    if (total % usize(s) != 0) {
      invalid(std::string(name) + ": in place at the root, data holds " +
              std::to_string(total / u.scale) + " elements, not a multiple of the " +
              std::to_string(nranks(s)) + " ranks");
    }
    n = total / usize(s);
    sp = copy_to_scratch(*h, d.data() + static_cast<std::size_t>(root) * n * u.size, n * u.size);
    rp = d.data();
    result = obj(send);
  } else {
    Borrowed& sb = h->add(borrow(send, Access::read, name, "send"));
    u = movement_unit(sb, o);
    n = count(name, "send", sb, u);
    sp = sb.data();
    if (at_root) {
      Borrowed& rb = borrow_recv(*h, recv, name, sb, o);
      need(name, "recv", count(name, "recv", rb, u), n * usize(s), u);
      rp = rb.data();
      result = obj(recv);
    }
  }
  return run(h, result, nb, [&] { return s.c.igather(sp, rp, n, u.dt, root, o.o); },
             [&] { s.c.gather(sp, rp, n, u.dt, root, o.o); });
}

py::object scatter(PyComm& s, const Opts& o, bool nb, py::handle send, py::handle recv, int root) {
  const char* name = "scatter";
  auto h = std::make_shared<Hold>();
  const bool at_root = s.c.rank() == root;
  std::byte* sp = nullptr;
  std::byte* rp = nullptr;
  std::size_t n = 0;
  Unit u{};
  py::object result;
  if (at_root) {
    Borrowed& sb = h->add(borrow(send, Access::read, name, "send"));
    u = movement_unit(sb, o);
    const std::size_t total = count(name, "send", sb, u);
    sp = sb.data();
    if (recv.is_none()) {
      // In place at the root: its own block stays where it is in `send`.
      if (total % usize(s) != 0) {
        invalid(std::string(name) + ": in place at the root, send holds " +
                std::to_string(total / u.scale) + " elements, not a multiple of the " +
                std::to_string(nranks(s)) + " ranks");
      }
      n = total / usize(s);
      h->scratch.resize(n * u.size);
      rp = h->scratch.data();
      result = obj(send);
    } else {
      Borrowed& rb = borrow_recv(*h, recv, name, sb, o);
      n = count(name, "recv", rb, u);
      need(name, "send", total, n * usize(s), u);
      rp = rb.data();
      result = obj(recv);
    }
  } else {
    if (recv.is_none()) {
      throw py::type_error(std::string(name) + ": recv is required on ranks other than the root");
    }
    Borrowed& rb = h->add(borrow(recv, Access::write, name, "recv"));
    u = movement_unit(rb, o);
    n = count(name, "recv", rb, u);
    rp = rb.data();
    result = obj(recv);
  }
  return run(h, result, nb, [&] { return s.c.iscatter(sp, rp, n, u.dt, root, o.o); },
             [&] { s.c.scatter(sp, rp, n, u.dt, root, o.o); });
}

template <bool Exclusive>
py::object scan(PyComm& s, const Opts& o, bool nb, py::handle send, py::handle recv, ReduceOp op) {
  const char* name = Exclusive ? "exclusive_scan" : "scan";
  auto h = std::make_shared<Hold>();
  const bool in_place = recv.is_none();
  Borrowed& sb = h->add(borrow(send, in_place ? Access::write : Access::read, name,
                               in_place ? "data" : "send"));
  Borrowed* rb = &sb;
  if (!in_place) {
    rb = &h->add(borrow(recv, Access::write, name, "recv"));
    same_type(name, sb, "send", *rb, "recv", o);
  }
  const Unit u = reduction_unit(name, "send", sb, o);
  const std::size_t n = count(name, "send", sb, u);
  need(name, "recv", count(name, "recv", *rb, u), n, u);
  std::byte* sp = sb.data();
  std::byte* rp = rb->data();
  return run(
      h, obj(in_place ? send : recv), nb,
      [&] {
        return Exclusive ? s.c.iexclusive_scan(sp, rp, n, u.dt, op, o.o)
                         : s.c.iscan(sp, rp, n, u.dt, op, o.o);
      },
      [&] {
        if constexpr (Exclusive) {
          s.c.exclusive_scan(sp, rp, n, u.dt, op, o.o);
        } else {
          s.c.scan(sp, rp, n, u.dt, op, o.o);
        }
      });
}

// ---- variable-size forms ------------------------------------------------------------------

// counts (in the caller's elements) as nexar units, with `size` entries.
std::vector<std::size_t> units(const char* op, const char* arg, const std::vector<std::size_t>& c,
                               const PyComm& s, const Unit& u) {
  if (c.size() != usize(s)) {
    invalid(std::string(op) + ": " + arg + " has " + std::to_string(c.size()) +
            " entries, one per rank (" + std::to_string(nranks(s)) + ") needed");
  }
  std::vector<std::size_t> r(c.size());
  std::transform(c.begin(), c.end(), r.begin(), [&](std::size_t x) { return x * u.scale; });
  return r;
}

// displs as units, or the packed layout (prefix sums of counts) when not given.
std::vector<std::size_t> displacements(const char* op, const char* arg,
                                       const std::optional<std::vector<std::size_t>>& d,
                                       const std::vector<std::size_t>& counts, const PyComm& s,
                                       const Unit& u) {
  if (d) return units(op, arg, *d, s, u);
  std::vector<std::size_t> r(counts.size());
  std::exclusive_scan(counts.begin(), counts.end(), r.begin(), std::size_t{0});
  return r;
}

std::size_t extent(const std::vector<std::size_t>& counts, const std::vector<std::size_t>& displs) {
  std::size_t e = 0;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    if (counts[i] > 0) e = std::max(e, displs[i] + counts[i]);
  }
  return e;
}

// Counts where a rank that is not the root passed none: only its own entry matters.
std::vector<std::size_t> own_counts(const PyComm& s, std::size_t own, const Unit& u) {
  std::vector<std::size_t> c(usize(s), 0);
  c[static_cast<std::size_t>(s.c.rank())] = own / u.scale;
  return c;
}

py::object all_gather_v(PyComm& s, const Opts& o, bool nb, py::handle send, py::handle recv,
                        std::vector<std::size_t> counts,
                        std::optional<std::vector<std::size_t>> displs) {
  const char* name = "all_gather_v";
  auto h = std::make_shared<Hold>();
  Borrowed& sb = h->add(borrow(send, Access::read, name, "send"));
  Borrowed& rb = borrow_recv(*h, recv, name, sb, o);
  const Unit u = movement_unit(sb, o);
  auto& c = h->counts[0] = units(name, "counts", counts, s, u);
  auto& d = h->counts[1] = displacements(name, "displs", displs, c, s, u);
  const std::size_t mine = c[static_cast<std::size_t>(s.c.rank())];
  need(name, "send", count(name, "send", sb, u), mine, u);
  need(name, "recv", count(name, "recv", rb, u), extent(c, d), u);
  std::byte* sp = sb.data();
  std::byte* rp = rb.data();
  auto start = [&] { return s.c.iall_gather_v(sp, mine, rp, c, d, u.dt, o.o); };
  return run(h, obj(recv), nb, start, [&] { start().wait(); });
}

// What a rooted variable-size collective (gather_v, scatter_v) needs beyond this rank's
// own buffer `own` (named `own_name`): the root must pass counts, another rank may (else
// only its own entry, its buffer's size, matters), and the root's other buffer (`other`,
// borrowed with `access`) must hold the whole layout. Kept in `h`, which the operation
// holds until it completes.
struct RootedV {
  const std::vector<std::size_t>& counts;
  const std::vector<std::size_t>& displs;
  std::size_t mine;       ///< this rank's count, checked against `own`
  std::byte* other;       ///< the root's other buffer; null elsewhere
};
RootedV rooted_v(const char* name, const PyComm& s, const Opts& o, Hold& h, Borrowed& own, const char* own_name,
                 py::handle other, Access access, const char* other_name, const Unit& u, bool at_root,
                 const std::optional<std::vector<std::size_t>>& counts,
                 const std::optional<std::vector<std::size_t>>& displs) {
  const std::size_t have = count(name, own_name, own, u);
  if (at_root && !counts) invalid(std::string(name) + ": the root needs counts");
  auto& c = h.counts[0] = units(name, "counts", counts ? *counts : own_counts(s, have, u), s, u);
  auto& d = h.counts[1] = displacements(name, "displs", displs, c, s, u);
  const std::size_t mine = c[static_cast<std::size_t>(s.c.rank())];
  need(name, own_name, have, mine, u);
  std::byte* p = nullptr;
  if (at_root) {
    Borrowed& b = h.add(borrow(other, access, name, other_name));
    if (access == Access::read) {
      same_type(name, b, other_name, own, own_name, o);
    } else {
      same_type(name, own, own_name, b, other_name, o);
    }
    need(name, other_name, count(name, other_name, b, u), extent(c, d), u);
    p = b.data();
  }
  return {c, d, mine, p};
}

py::object gather_v(PyComm& s, const Opts& o, bool nb, py::handle send, py::handle recv,
                    std::optional<std::vector<std::size_t>> counts,
                    std::optional<std::vector<std::size_t>> displs, int root) {
  const char* name = "gather_v";
  auto h = std::make_shared<Hold>();
  const bool at_root = s.c.rank() == root;
  Borrowed& sb = h->add(borrow(send, Access::read, name, "send"));
  const Unit u = movement_unit(sb, o);
  const RootedV v = rooted_v(name, s, o, *h, sb, "send", recv, Access::write, "recv", u, at_root, counts, displs);
  std::byte* sp = sb.data();
  auto start = [&] { return s.c.igather_v(sp, v.mine, v.other, v.counts, v.displs, u.dt, root, o.o); };
  return run(h, at_root ? obj(recv) : py::none(), nb, start, [&] { start().wait(); });
}

py::object scatter_v(PyComm& s, const Opts& o, bool nb, py::handle send,
                     std::optional<std::vector<std::size_t>> counts, py::handle recv,
                     std::optional<std::vector<std::size_t>> displs, int root) {
  const char* name = "scatter_v";
  auto h = std::make_shared<Hold>();
  const bool at_root = s.c.rank() == root;
  Borrowed& rb = h->add(borrow(recv, Access::write, name, "recv"));
  const Unit u = movement_unit(rb, o);
  const RootedV v = rooted_v(name, s, o, *h, rb, "recv", send, Access::read, "send", u, at_root, counts, displs);
  std::byte* rp = rb.data();
  auto start = [&] { return s.c.iscatter_v(v.other, v.counts, v.displs, rp, v.mine, u.dt, root, o.o); };
  return run(h, obj(recv), nb, start, [&] { start().wait(); });
}

py::object all_to_all_v(PyComm& s, const Opts& o, bool nb, py::handle send,
                        std::vector<std::size_t> send_counts, py::handle recv,
                        std::vector<std::size_t> recv_counts,
                        std::optional<std::vector<std::size_t>> send_displs,
                        std::optional<std::vector<std::size_t>> recv_displs) {
  const char* name = "all_to_all_v";
  auto h = std::make_shared<Hold>();
  Borrowed& sb = h->add(borrow(send, Access::read, name, "send"));
  Borrowed& rb = borrow_recv(*h, recv, name, sb, o);
  const Unit u = movement_unit(sb, o);
  auto& sc = h->counts[0] = units(name, "send_counts", send_counts, s, u);
  auto& sd = h->counts[1] = displacements(name, "send_displs", send_displs, sc, s, u);
  auto& rc = h->counts[2] = units(name, "recv_counts", recv_counts, s, u);
  auto& rd = h->counts[3] = displacements(name, "recv_displs", recv_displs, rc, s, u);
  need(name, "send", count(name, "send", sb, u), extent(sc, sd), u);
  need(name, "recv", count(name, "recv", rb, u), extent(rc, rd), u);
  std::byte* sp = sb.data();
  std::byte* rp = rb.data();
  auto start = [&] { return s.c.iall_to_all_v(sp, sc, sd, rp, rc, rd, u.dt, o.o); };
  return run(h, obj(recv), nb, start, [&] { start().wait(); });
}

// ---- fused forms --------------------------------------------------------------------------

py::object all_reduce_bucketed(PyComm& s, const Opts& o, bool nb, py::sequence buffers,
                               ReduceOp op) {
  const char* name = "all_reduce_bucketed";
  auto h = std::make_shared<Hold>();
  std::optional<Unit> u;
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    const std::string arg = "buffers[" + std::to_string(i) + "]";
    Borrowed& b = h->add(borrow(buffers[i], Access::write, name, arg.c_str()));
    if (!u) {
      u = reduction_unit(name, arg.c_str(), b, o);
    } else {
      same_type(name, *h->buffers.front(), "buffers[0]", b, arg.c_str(), o);
    }
    h->parts.push_back({b.data(), count(name, arg.c_str(), b, *u)});
  }
  const DataType dt = u ? u->dt : DataType::f32;
  auto start = [&] { return s.c.iall_reduce_bucketed(h->parts, dt, op, o.o); };
  return run(h, obj(buffers), nb, start, [&] { start().wait(); });
}

py::object all_reduce_sharded(PyComm& s, const Opts& o, bool nb, py::handle send, py::handle recv,
                              py::handle shard, ReduceOp op) {
  const char* name = "all_reduce_sharded";
  auto h = std::make_shared<Hold>();
  if (recv.is_none() && shard.is_none()) {
    throw py::type_error(std::string(name) + ": pass recv, shard or both");
  }
  const bool in_place = !recv.is_none() && recv.is(send);
  Borrowed& sb = h->add(borrow(send, in_place ? Access::write : Access::read, name, "send"));
  const Unit u = reduction_unit(name, "send", sb, o);
  const std::size_t n = count(name, "send", sb, u);
  std::byte* rp = nullptr;
  std::byte* shp = nullptr;
  if (in_place) {
    rp = sb.data();
  } else if (!recv.is_none()) {
    Borrowed& rb = borrow_recv(*h, recv, name, sb, o);
    need(name, "recv", count(name, "recv", rb, u), n, u);
    rp = rb.data();
  }
  if (!shard.is_none()) {
    Borrowed& b = h->add(borrow(shard, Access::write, name, "shard"));
    same_type(name, sb, "send", b, "shard", o);
    need(name, "shard", count(name, "shard", b, u), nexar::block_of(n, nranks(s), s.c.rank()).second, u);
    shp = b.data();
  }
  std::byte* sp = sb.data();
  auto start = [&] { return s.c.iall_reduce_sharded(sp, rp, shp, n, u.dt, op, o.o); };
  return run(h, obj(recv.is_none() ? shard : recv), nb, start, [&] { start().wait(); });
}

py::object all_reduce_compressed(PyComm& s, const Opts& o, bool nb, py::handle data,
                                 nexar::ErrorFeedback& state, ReduceOp op) {
  const char* name = "all_reduce_compressed";
  auto h = std::make_shared<Hold>();
  Borrowed& b = h->add(borrow(data, Access::write, name, "data"));
  const Unit u = reduction_unit(name, "data", b, o);
  const std::size_t n = count(name, "data", b, u);
  h->ref = py::cast(&state, py::return_value_policy::reference);  // keeps the state alive
  std::byte* p = b.data();
  nexar::ErrorFeedback* st = &state;
  auto start = [&] { return s.c.iall_reduce_compressed(p, n, u.dt, op, *st, o.o); };
  return run(h, obj(data), nb, start, [&] { start().wait(); });
}

// ---- binding ----------------------------------------------------------------------------

// Binds `name` (blocking) and "i" + `name` (non-blocking) from one implementation
// f(comm, opts, nonblocking, args...); every collective takes the keyword-only options
// dtype, algorithm, timeout and segment_bytes after its own arguments.
template <class... A, class... Extra>
void def_pair(CommClass& cls, const char* name, py::object (*f)(PyComm&, const Opts&, bool, A...),
              const std::string& doc, const Extra&... extra) {
  auto make = [f](bool nb) {
    return [f, nb](PyComm& s, A... a, py::handle dtype, nexar::Algorithm algorithm,
                   py::handle timeout, std::size_t segment_bytes) {
      return f(s, make_opts(dtype, algorithm, timeout, segment_bytes), nb, std::forward<A>(a)...);
    };
  };
  const std::string common =
      "\n\nKeyword options: dtype (reinterpret the buffers as this nexar.DataType), algorithm "
      "(nexar.Algorithm), timeout (seconds), segment_bytes (pipelining segment).";
  const std::string idoc = "Non-blocking " + std::string(name) +
                           ": returns a Request whose wait() returns what " + name +
                           " returns. The buffers stay borrowed until it completes." + common;
  const std::string bdoc = doc + common;
  const std::string iname = std::string("i") + name;
  cls.def(name, make(false), extra..., py::kw_only(), py::arg("dtype") = py::none(),
          py::arg("algorithm") = nexar::Algorithm::automatic, py::arg("timeout") = py::none(),
          py::arg("segment_bytes") = 0, bdoc.c_str());
  cls.def(iname.c_str(), make(true), extra..., py::kw_only(), py::arg("dtype") = py::none(),
          py::arg("algorithm") = nexar::Algorithm::automatic, py::arg("timeout") = py::none(),
          py::arg("segment_bytes") = 0, idoc.c_str());
}

}  // namespace

void register_collectives(py::module_& m, CommClass& cls) {
  py::enum_<nexar::Compression::Kind>(m, "CompressionKind",
                                      "Which elements a compressed all_reduce sends.")
      .value("TOP_K", nexar::Compression::Kind::top_k)
      .value("RANDOM_K", nexar::Compression::Kind::random_k);

  py::class_<nexar::ErrorFeedback>(
      m, "ErrorFeedback",
      "Error-feedback state of one tensor for all_reduce_compressed: what a rank did not send "
      "at one step is added to its input at the next. One per tensor and rank.")
      .def(py::init([](nexar::Compression::Kind kind, double ratio, std::uint64_t seed) {
             nexar::Compression c;
             c.kind = kind;
             c.ratio = ratio;
             c.seed = seed;
             return nexar::ErrorFeedback(c);
           }),
           py::arg("kind") = nexar::Compression::Kind::top_k, py::arg("ratio") = 0.01,
           py::arg("seed") = 0)
      .def_property_readonly("steps", &nexar::ErrorFeedback::steps, "Steps run so far.")
      .def_property_readonly(
          "residual",
          [](const nexar::ErrorFeedback& e) {
            const auto r = e.residual();
            return py::bytes(reinterpret_cast<const char*>(r.data()), r.size());
          },
          "The residual carried into the next step (bytes of the tensor's element type).")
      .def("reset", &nexar::ErrorFeedback::reset, "Forgets the residual.");

  const auto none = py::none();
  def_pair(cls, "all_reduce", &all_reduce,
           "recv = element-wise reduction of send over the ranks, on every rank; with "
           "recv=None in place in send. Returns the buffer holding the result.",
           py::arg("send"), py::arg("recv") = none, py::arg("op") = ReduceOp::sum);
  def_pair(cls, "broadcast", &broadcast,
           "data of `root` is copied into every rank's data (same size everywhere). Returns "
           "data.",
           py::arg("data"), py::arg("root") = 0);
  def_pair(cls, "reduce", &reduce,
           "At `root`, recv = reduction of send over the ranks (recv=None: in place in send). "
           "Returns the result buffer at the root, None elsewhere.",
           py::arg("send"), py::arg("recv") = none, py::arg("op") = ReduceOp::sum,
           py::arg("root") = 0);
  def_pair(cls, "all_gather", &all_gather,
           "recv (size * len(send) elements) = concatenation of every rank's send. In place "
           "(recv=None): send holds size blocks, this rank's already at its position. Returns "
           "the result buffer.",
           py::arg("send"), py::arg("recv") = none);
  def_pair(cls, "reduce_scatter", &reduce_scatter,
           "Rank r receives block r (nexar.block_of(len(send), size, r)) of the element-wise "
           "reduction of send. In place (recv=None): the block lands at its own position in "
           "send, the rest is left unchanged. Returns the result buffer.",
           py::arg("send"), py::arg("recv") = none, py::arg("op") = ReduceOp::sum);
  def_pair(cls, "all_to_all", &all_to_all,
           "send holds size equal blocks; block j goes to rank j, and block i of recv comes "
           "from rank i. In place with recv=None. Returns the result buffer.",
           py::arg("send"), py::arg("recv") = none);
  def_pair(cls, "gather", &gather,
           "At `root`, recv (size * len(send) elements) = concatenation of every rank's send. "
           "In place at the root (recv=None there): send holds size blocks, the root's own "
           "already at its position. Returns the result at the root, None elsewhere.",
           py::arg("send"), py::arg("recv") = none, py::arg("root") = 0);
  def_pair(cls, "scatter", &scatter,
           "Block r (len(recv) elements) of root's send goes to rank r's recv; send is only "
           "read at the root (pass None elsewhere). In place at the root (recv=None there): "
           "its own block stays in send. Returns recv (send at an in-place root).",
           py::arg("send"), py::arg("recv") = none, py::arg("root") = 0);
  def_pair(cls, "scan", &scan<false>,
           "recv on rank r = reduction of send over ranks 0..r (in place with recv=None).",
           py::arg("send"), py::arg("recv") = none, py::arg("op") = ReduceOp::sum);
  def_pair(cls, "exclusive_scan", &scan<true>,
           "recv on rank r = reduction of send over ranks 0..r-1; rank 0's recv is left "
           "unchanged (in place with recv=None).",
           py::arg("send"), py::arg("recv") = none, py::arg("op") = ReduceOp::sum);
  def_pair(cls, "all_gather_v", &all_gather_v,
           "Variable-size all_gather: rank i contributes counts[i] elements, placed at "
           "displs[i] of recv (default: packed in rank order).",
           py::arg("send"), py::arg("recv"), py::arg("counts"), py::arg("displs") = none);
  def_pair(cls, "gather_v", &gather_v,
           "Variable-size gather to `root` (counts and recv needed at the root only).",
           py::arg("send"), py::arg("recv") = none, py::arg("counts") = none,
           py::arg("displs") = none, py::arg("root") = 0);
  def_pair(cls, "scatter_v", &scatter_v,
           "Variable-size scatter from `root`: rank i gets counts[i] elements from displs[i] "
           "of root's send (send and counts needed at the root only).",
           py::arg("send"), py::arg("counts"), py::arg("recv"), py::arg("displs") = none,
           py::arg("root") = 0);
  def_pair(cls, "all_to_all_v", &all_to_all_v,
           "Variable-size all_to_all: send_counts[j] elements from send_displs[j] go to rank j; "
           "recv_counts[i] elements from rank i land at recv_displs[i].",
           py::arg("send"), py::arg("send_counts"), py::arg("recv"), py::arg("recv_counts"),
           py::arg("send_displs") = none, py::arg("recv_displs") = none);
  def_pair(cls, "all_reduce_bucketed", &all_reduce_bucketed,
           "Fused all_reduce of many buffers of one element type (e.g. gradients), each in "
           "place, as one operation. Returns the sequence.",
           py::arg("buffers"), py::arg("op") = ReduceOp::sum);
  def_pair(cls, "all_reduce_sharded", &all_reduce_sharded,
           "all_reduce as reduce-scatter + all-gather: `shard` (optional) gets this rank's "
           "reduced block as soon as the first phase ends; with recv=None the all-gather is "
           "skipped (a pure reduce-scatter into shard). recv may be send (in place).",
           py::arg("send"), py::arg("recv") = none, py::arg("shard") = none,
           py::arg("op") = ReduceOp::sum);
  def_pair(cls, "all_reduce_compressed", &all_reduce_compressed,
           "Compressed all_reduce with error feedback, in place on data (float32/float64; op "
           "SUM or AVG), sending ceil(ratio * len) elements chosen by `state`.",
           py::arg("data"), py::arg("state"), py::arg("op") = ReduceOp::sum);

  cls.def(
      "barrier",
      [](PyComm& s, py::handle timeout) {
        nexar::CollectiveOptions o;
        o.timeout = to_ms(timeout, "barrier: timeout");
        py::gil_scoped_release r;
        s.c.barrier(o);
      },
      py::kw_only(), py::arg("timeout") = py::none(),
      "Returns once every rank has entered the barrier.");
  cls.def(
      "ibarrier",
      [](PyComm& s, py::handle timeout) {
        nexar::CollectiveOptions o;
        o.timeout = to_ms(timeout, "ibarrier: timeout");
        nexar::Request q;
        {
          py::gil_scoped_release r;
          q = s.c.ibarrier(o);
        }
        return PyRequest(std::move(q), nullptr, py::none(), PyRequest::Kind::value);
      },
      py::kw_only(), py::arg("timeout") = py::none(), "Non-blocking barrier.");
}

}  // namespace nexar_py
