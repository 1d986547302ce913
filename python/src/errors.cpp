// nexar.Error and its subclasses, and the translation of nexar::Error into them.
#include <utility>

#include "common.hpp"

namespace nexar_py {

namespace {

// One Python class per nexar::Errc (indexed by its value), created once at import and kept
// for the life of the process (the translator may run until the interpreter ends).
PyObject* error_class[16] = {};
PyObject* error_base = nullptr;

PyObject* make_class(py::module_& m, const char* name, const char* doc, py::tuple bases) {
  const std::string full = std::string("nexar.") + name;
  PyObject* cls = PyErr_NewExceptionWithDoc(full.c_str(), doc, bases.ptr(), nullptr);
  if (cls == nullptr) throw py::error_already_set();
  m.add_object(name, py::reinterpret_borrow<py::object>(cls));
  return cls;  // the reference from PyErr_NewExceptionWithDoc is kept on purpose
}

py::handle h(PyObject* p) { return py::handle(p); }

PyObject* class_of(nexar::Errc code) {
  const auto i = static_cast<std::size_t>(code);
  return i < std::size(error_class) && error_class[i] != nullptr ? error_class[i] : error_base;
}

}  // namespace

py::object error_object(const nexar::Error& e) {
  py::object exc = py::reinterpret_borrow<py::object>(class_of(e.code()))(py::str(e.what()));
  exc.attr("code") = py::cast(e.code());
  exc.attr("message") = py::str(e.what());
  exc.attr("failed_ranks") = py::cast(e.failed_ranks());
  return exc;
}

void invalid(const std::string& message) {
  throw nexar::Error(nexar::Errc::invalid_argument, message);
}

std::string describe(py::error_already_set& e) {
  std::string type = "Exception";
  if (e.type()) type = py::str(e.type().attr("__name__")).cast<std::string>();
  std::string text = e.value() ? py::str(e.value()).cast<std::string>() : std::string();
  return text.empty() ? type : type + ": " + text;
}

bool python_alive() noexcept { return Py_IsInitialized() != 0 && _Py_IsFinalizing() == 0; }

std::shared_ptr<py::object> share(py::object o) {
  return std::shared_ptr<py::object>(new py::object(std::move(o)), [](py::object* p) {
    if (python_alive()) {
      py::gil_scoped_acquire g;
      delete p;
    } else {
      // Too late to touch Python: leak the reference rather than crash at exit.
      (void)p->release();
      delete p;
    }
  });
}

void register_errors(py::module_& m) {
  using nexar::Errc;
  py::enum_<Errc>(m, "ErrorCode", "What kind of failure a nexar.Error is (nexar::Errc).")
      .value("OK", Errc::ok)
      .value("INVALID_ARGUMENT", Errc::invalid_argument)
      .value("TRUNCATED", Errc::truncated)
      .value("TIMEOUT", Errc::timeout)
      .value("PEER_CLOSED", Errc::peer_closed)
      .value("PEER_FAILED", Errc::peer_failed)
      .value("PROTOCOL", Errc::protocol)
      .value("TLS", Errc::tls)
      .value("UNKNOWN_RPC", Errc::unknown_rpc)
      .value("RPC_FAILED", Errc::rpc_failed)
      .value("CLOSED", Errc::closed)
      .value("IO", Errc::io)
      .value("CANCELLED", Errc::cancelled)
      .value("REJECTED", Errc::rejected)
      .value("RANK_FAILED", Errc::rank_failed)
      .value("REVOKED", Errc::revoked);

  auto builtins = py::module_::import("builtins");
  error_base = make_class(
      m, "Error",
      "Base of every error nexar raises (a RuntimeError, as torch's errors are). Attributes: code (nexar.ErrorCode), message (str: "
      "names the operation, this rank, the peer and the elapsed time), failed_ranks (list of "
      "int: for RANK_FAILED, the failed members in the communicator's numbering).",
      py::make_tuple(builtins.attr("RuntimeError")));
  py::object base = py::reinterpret_borrow<py::object>(h(error_base));
  auto set = [&](Errc c, PyObject* cls) { error_class[static_cast<std::size_t>(c)] = cls; };

  set(Errc::invalid_argument,
      make_class(m, "InvalidArgumentError",
                 "A bad rank, size, tag, buffer (read-only, not contiguous) or setting.",
                 py::make_tuple(base, builtins.attr("ValueError"))));
  set(Errc::truncated, make_class(m, "TruncatedError",
                                  "A received message was larger than the buffer.",
                                  py::make_tuple(base)));
  set(Errc::timeout, make_class(m, "TimeoutError", "The operation's deadline passed.",
                                py::make_tuple(base, builtins.attr("TimeoutError"))));
  PyObject* peer = make_class(m, "PeerError", "A peer closed or failed.", py::make_tuple(base));
  auto peer_o = py::reinterpret_borrow<py::object>(h(peer));
  set(Errc::peer_closed, make_class(m, "PeerClosedError", "The peer closed its communicator.",
                                    py::make_tuple(peer_o)));
  set(Errc::peer_failed, make_class(m, "PeerFailedError", "The peer's connection broke.",
                                    py::make_tuple(peer_o)));
  set(Errc::protocol, make_class(m, "ProtocolError", "A peer violated the wire protocol.",
                                 py::make_tuple(base)));
  set(Errc::tls, make_class(m, "TlsError", "A TLS handshake or certificate check failed.",
                            py::make_tuple(base)));
  PyObject* rpc = make_class(m, "RpcError", "An RPC call failed.", py::make_tuple(base));
  auto rpc_o = py::reinterpret_borrow<py::object>(h(rpc));
  set(Errc::unknown_rpc, make_class(m, "UnknownRpcError",
                                    "The called rank has no handler for that function id.",
                                    py::make_tuple(rpc_o)));
  set(Errc::rpc_failed,
      make_class(m, "RpcFailedError",
                 "The remote handler raised; the message carries its exception type and text.",
                 py::make_tuple(rpc_o)));
  set(Errc::closed, make_class(m, "ClosedError", "The local communicator was closed.",
                               py::make_tuple(base)));
  set(Errc::io, make_class(m, "IoError", "A local socket or system call failed.",
                           py::make_tuple(base)));
  set(Errc::cancelled, make_class(m, "CancelledError", "The operation was cancelled.",
                                  py::make_tuple(base)));
  set(Errc::rejected, make_class(m, "RejectedError", "The seed refused to admit this node.",
                                 py::make_tuple(base)));
  set(Errc::rank_failed,
      make_class(m, "RankFailedError",
                 "A member of the communicator failed; failed_ranks names it (them).",
                 py::make_tuple(base)));
  set(Errc::revoked, make_class(m, "RevokedError", "The communicator was revoked.",
                                py::make_tuple(base)));

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const nexar::Error& e) {
      py::object exc = error_object(e);
      PyErr_SetObject(class_of(e.code()), exc.ptr());
    }
  });
}

}  // namespace nexar_py
