// nexar Python bindings — what the binding files share.
//
// Rules every binding follows:
//  * Buffers are borrowed from Python objects (buffer protocol, DLPack, __array_interface__)
//    without copies; a Borrowed keeps its exporter's view alive and is released with the GIL
//    held.
//  * Every call that can wait releases the GIL for the wait.
//  * Python code called from nexar's threads (RPC handlers, failure callbacks) takes the GIL
//    itself, and is not entered once the interpreter is finalizing.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <nexar/nexar.hpp>

namespace nexar_py {

namespace py = pybind11;

// ---- buffers (buffer.cpp) ------------------------------------------------------------------

/// Whether an operation reads a buffer or writes into it.
enum class Access { read, write };

/// Memory borrowed from a Python object for as long as this lives. Destroy with the GIL held.
class Borrowed {
 public:
  Borrowed() = default;
  Borrowed(const Borrowed&) = delete;
  Borrowed& operator=(const Borrowed&) = delete;
  ~Borrowed();

  std::byte* data() const noexcept { return data_; }
  std::size_t bytes() const noexcept { return bytes_; }
  /// Bytes per element of the exporter's element type (1 for untyped bytes).
  std::size_t itemsize() const noexcept { return itemsize_; }
  /// The nexar element type, when the exporter's type has one (int16 or complex do not).
  std::optional<nexar::DataType> dtype() const noexcept { return dtype_; }
  /// The exporter's element type in words, for messages ("float32", "int16", "format 'T{..}'").
  const std::string& type_name() const noexcept { return type_name_; }

 private:
  friend std::unique_ptr<Borrowed> borrow(py::handle, Access, const char*, const char*);
  std::byte* data_ = nullptr;
  std::size_t bytes_ = 0;
  std::size_t itemsize_ = 1;
  std::optional<nexar::DataType> dtype_;
  std::string type_name_ = "bytes";
  bool has_view_ = false;
  Py_buffer view_{};
  void* dlpack_ = nullptr;  ///< DLManagedTensor*, whose deleter we owe once done
  py::object keep_;         ///< the exporter, for __array_interface__ and DLPack
};
using BorrowedPtr = std::unique_ptr<Borrowed>;

/// Borrows the memory of `obj` for operation `op`, where it is argument `arg` ("send",
/// "recv", "data"). Accepts buffer-protocol objects (NumPy arrays, bytearray, bytes,
/// memoryview, array.array), objects with __dlpack__ (CPU torch tensors, without importing
/// torch) and objects with __array_interface__. Throws nexar::Error(invalid_argument) naming
/// `op` and `arg` for memory that is read-only while `access` is write, not C-contiguous, or
/// not in host memory; TypeError for objects that export no memory.
BorrowedPtr borrow(py::handle obj, Access access, const char* op, const char* arg);

/// The nexar DataType named by `spec`: a nexar.DataType, a name ("float32", "bf16", "half"),
/// a NumPy dtype or scalar type, or a torch dtype. None gives nullopt.
std::optional<nexar::DataType> parse_dtype(py::handle spec);

/// NumPy-style name of a DataType ("float32", "bfloat16").
const char* dtype_name(nexar::DataType t) noexcept;

/// Seconds (int or float) or a datetime.timedelta as milliseconds; None gives nullopt.
std::optional<std::chrono::milliseconds> to_ms(py::handle seconds, const char* what);

// ---- errors (errors.cpp) ------------------------------------------------------------------

/// Creates nexar.Error and its subclasses in `m` and translates nexar::Error into them.
void register_errors(py::module_& m);

/// The Python exception (an instance of the nexar.Error subclass of its code) for `e`.
py::object error_object(const nexar::Error& e);

/// Throws nexar::Error(invalid_argument, message).
[[noreturn]] void invalid(const std::string& message);

/// "TypeName: message" of the Python exception in flight (for errors crossing to C++).
std::string describe(py::error_already_set& e);

// ---- the interpreter -----------------------------------------------------------------------

/// False once the interpreter is finalizing: nexar's threads must not enter Python then.
bool python_alive() noexcept;

/// A Python object that nexar's threads may hold and drop: the last owner takes the GIL to
/// release it (or leaks it when the interpreter is gone).
std::shared_ptr<py::object> share(py::object o);

// ---- requests (request.cpp) ---------------------------------------------------------------

/// What an operation in flight borrowed; kept until it completes, released with the GIL.
struct Hold {
  std::vector<BorrowedPtr> buffers;
  std::vector<std::byte> scratch;  ///< temporary copies for in-place forms
  std::vector<std::size_t> counts[4];
  std::vector<nexar::MutableBuffer> parts;
  py::object ref;  ///< a Python object the operation uses (an ErrorFeedback state)

  Borrowed& add(BorrowedPtr b) {
    buffers.push_back(std::move(b));
    return *buffers.back();
  }
};

/// A non-blocking operation as Python sees it: nexar::Request plus what it borrowed. When
/// dropped before completion the borrowed memory is kept until the operation ends.
class PyRequest {
 public:
  enum class Kind { status, value };
  PyRequest(nexar::Request r, std::shared_ptr<Hold> hold, py::object value, Kind kind);
  PyRequest(PyRequest&&) = default;
  PyRequest& operator=(PyRequest&&) = delete;
  ~PyRequest();

  bool test() const noexcept;
  py::object wait();
  bool wait_for(py::handle seconds);
  void cancel() const { request_.cancel(); }
  nexar::Status status() const;
  py::object exception();
  const nexar::Request& request() const noexcept { return request_; }

 private:
  nexar::Request request_;
  std::shared_ptr<Hold> hold_;
  py::object value_;
  Kind kind_;
};

/// Drops what finished operations whose Requests were dropped had borrowed.
void sweep_orphans();

void register_requests(py::module_& m);

// ---- communicators (communicator.cpp, collectives.cpp, cluster.cpp) ------------------------

/// A nexar::Communicator owned by Python. Destroying the last handle of a world closes its
/// connections and joins nexar's threads, which may be waiting for the GIL (an RPC handler):
/// the GIL is released meanwhile.
struct PyComm {
  explicit PyComm(nexar::Communicator comm) : c(std::move(comm)) {}
  PyComm(const PyComm&) = delete;
  PyComm& operator=(const PyComm&) = delete;
  ~PyComm();
  nexar::Communicator c;
};

/// Wraps a communicator for Python (None for an empty one, as split() with a negative color).
py::object wrap(nexar::Communicator c);

using CommClass = py::class_<PyComm>;
void register_communicator(py::module_& m, CommClass& cls);
void register_collectives(py::module_& m, CommClass& cls);
void register_cluster(py::module_& m);

}  // namespace nexar_py
