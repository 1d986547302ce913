// nexar._core: the compiled half of the `nexar` package (python/nexar/__init__.py is the
// other). It binds the public C++ API only (include/nexar/).
#include "common.hpp"

namespace nexar_py {
namespace {

void register_types(py::module_& m) {
  using nexar::DataType;
  py::enum_<DataType>(m, "DataType", "Element type of a collective's buffers.")
      .value("FLOAT32", DataType::f32)
      .value("FLOAT64", DataType::f64)
      .value("FLOAT16", DataType::f16)
      .value("BFLOAT16", DataType::bf16)
      .value("INT8", DataType::i8)
      .value("UINT8", DataType::u8)
      .value("INT32", DataType::i32)
      .value("UINT32", DataType::u32)
      .value("INT64", DataType::i64)
      .value("UINT64", DataType::u64);

  using nexar::ReduceOp;
  py::enum_<ReduceOp>(m, "ReduceOp",
                      "Reduction operator. AVG (the sum divided by the number of ranks) is for "
                      "floating types only.")
      .value("SUM", ReduceOp::sum)
      .value("PROD", ReduceOp::prod)
      .value("MIN", ReduceOp::min)
      .value("MAX", ReduceOp::max)
      .value("AVG", ReduceOp::avg);

  using nexar::Algorithm;
  py::enum_<Algorithm>(m, "Algorithm",
                       "How a collective moves its data; AUTOMATIC picks by size and world.")
      .value("AUTOMATIC", Algorithm::automatic)
      .value("RING", Algorithm::ring)
      .value("HALVING_DOUBLING", Algorithm::halving_doubling)
      .value("TREE", Algorithm::tree)
      .value("LINEAR", Algorithm::linear)
      .value("PAIRWISE", Algorithm::pairwise)
      .value("DISSEMINATION", Algorithm::dissemination)
      .value("RECURSIVE_DOUBLING", Algorithm::recursive_doubling);

  using nexar::FailurePolicy;
  py::enum_<FailurePolicy>(m, "FailurePolicy", "What a communicator does when a member fails.")
      .value("ABORT", FailurePolicy::abort)
      .value("MANUAL", FailurePolicy::manual)
      .value("AUTOMATIC", FailurePolicy::automatic);

  using nexar::Congestion;
  py::enum_<Congestion>(m, "Congestion", "Congestion controller of the QUIC connections (NEXAR_CONGESTION).")
      .value("CUBIC", Congestion::cubic)
      .value("BBR", Congestion::bbr);

  using nexar::LinkKind;
  py::enum_<LinkKind>(m, "LinkKind", "What carries the data lanes between hosts (NEXAR_LINK).")
      .value("QUIC", LinkKind::quic)
      .value("TCP", LinkKind::tcp);

  using nexar::TcpCipher;
  py::enum_<TcpCipher>(m, "TcpCipher", "The TCP link's protection (NEXAR_TCP_CIPHER).")
      .value("TLS", TcpCipher::tls)
      .value("NONE", TcpCipher::none);

  using nexar::LogLevel;
  py::enum_<LogLevel>(m, "LogLevel", "Log verbosity (NEXAR_DEBUG).")
      .value("OFF", LogLevel::off)
      .value("ERROR", LogLevel::error)
      .value("WARN", LogLevel::warn)
      .value("INFO", LogLevel::info)
      .value("DEBUG", LogLevel::debug)
      .value("TRACE", LogLevel::trace);

  m.attr("ANY_SOURCE") = nexar::any_source;
  m.attr("ANY_TAG") = nexar::any_tag;
  m.attr("MAX_TAG") = nexar::max_tag;

  m.def("size_of", &nexar::size_of, py::arg("dtype"), "Bytes per element of a DataType.");
  m.def(
      "block_of",
      [](std::size_t count, int n, int r) {
        if (n < 1 || r < 0 || r >= n) invalid("block_of: need 0 <= r < n");
        return nexar::block_of(count, n, r);
      },
      py::arg("count"), py::arg("n"), py::arg("r"),
      "(offset, length) in elements of rank r's block of `count` elements split over n ranks "
      "(reduce_scatter's layout: the first count % n blocks one larger).");
  m.def(
      "dtype_of",
      [](py::handle obj) -> py::object {
        const BorrowedPtr b = borrow(obj, Access::read, "dtype_of", "obj");
        if (!b->dtype()) return py::none();
        return py::cast(*b->dtype());
      },
      py::arg("obj"),
      "The nexar.DataType collectives would use for `obj`'s elements (None when nexar has "
      "none, e.g. int16).");
  m.def("parse_dtype", [](py::handle spec) { return parse_dtype(spec); }, py::arg("spec"),
        "The nexar.DataType named by a string, a NumPy dtype or a torch dtype.");
}

}  // namespace
}  // namespace nexar_py

PYBIND11_MODULE(_core, m) {
  using namespace nexar_py;
  m.doc() = "nexar's compiled bindings; use the `nexar` package.";
  register_types(m);
  register_errors(m);
  register_requests(m);
  CommClass cls(m, "Communicator",
                "A group of ranks connected over QUIC. Every method may be called from any "
                "thread; blocking calls release the GIL while they wait. Made by "
                "nexar.init(), nexar.bootstrap_local(), nexar.join() and split(). Closing: "
                "close(), or use it as a context manager.");
  register_communicator(m, cls);
  register_collectives(m, cls);
  register_cluster(m);

  // For nexar._torch: a capsule holding a new handle (a copy) of this communicator. Both
  // modules link the same libnexar.so, so the handle is valid there.
  cls.def("_capsule", [](const PyComm& s) {
    auto* copy = new nexar::Communicator(s.c);
    return py::capsule(copy, "nexar.Communicator", [](PyObject* cap) {
      delete static_cast<nexar::Communicator*>(PyCapsule_GetPointer(cap, "nexar.Communicator"));
    });
  });
}
