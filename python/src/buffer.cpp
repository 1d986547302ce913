// Borrowing memory from Python objects, without copies and without importing NumPy or torch.
#include <cstdint>
#include <cstring>
#include <string>

#include "common.hpp"

namespace nexar_py {

namespace {

// The DLPack ABI (data interchange between array libraries), as far as reading a CPU tensor
// needs it. The layout is fixed by the DLPack standard, which every exporter follows.
struct DLDevice {
  std::int32_t device_type;  // 1 = CPU, 2 = CUDA, 3 = CUDA host (pinned) memory, ...
  std::int32_t device_id;
};
struct DLDataType {
  std::uint8_t code;  // 0 int, 1 uint, 2 float, 4 bfloat, 5 complex, 6 bool
  std::uint8_t bits;
  std::uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  std::int32_t ndim;
  DLDataType dtype;
  std::int64_t* shape;
  std::int64_t* strides;  // in elements; null means compact row-major
  std::uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};

constexpr int kDLCPU = 1;
constexpr int kDLCUDAHost = 3;

struct TypeInfo {
  std::optional<nexar::DataType> dtype;
  std::string name;
};

TypeInfo numeric(char kind, std::size_t size) {
  using nexar::DataType;
  const std::string bits = std::to_string(size * 8);
  switch (kind) {
    case 'f':
      if (size == 2) return {DataType::f16, "float16"};
      if (size == 4) return {DataType::f32, "float32"};
      if (size == 8) return {DataType::f64, "float64"};
      return {std::nullopt, "float" + bits};
    case 'i':
      if (size == 1) return {DataType::i8, "int8"};
      if (size == 4) return {DataType::i32, "int32"};
      if (size == 8) return {DataType::i64, "int64"};
      return {std::nullopt, "int" + bits};
    case 'u':
      if (size == 1) return {DataType::u8, "uint8"};
      if (size == 4) return {DataType::u32, "uint32"};
      if (size == 8) return {DataType::u64, "uint64"};
      return {std::nullopt, "uint" + bits};
    case 'b':
      return {std::nullopt, "bool"};
    case 'c':
      return {std::nullopt, "complex" + bits};
    default:
      return {std::nullopt, "an element type of " + bits + " bits"};
  }
}

// The element type of a buffer-protocol format string (struct module syntax, one item).
TypeInfo from_format(const char* format, std::size_t itemsize) {
  if (format == nullptr) return numeric('u', 1);  // no format means unsigned bytes
  std::string f = format;
  bool big_endian = false;
  if (!f.empty() && (f[0] == '@' || f[0] == '=' || f[0] == '<' || f[0] == '>' || f[0] == '!')) {
    big_endian = f[0] == '>' || f[0] == '!';
    f.erase(0, 1);
  }
  TypeInfo t{std::nullopt, "format '" + std::string(format) + "'"};
  if (f.size() == 1) {
    switch (f[0]) {
      case 'f': case 'd': case 'e': t = numeric('f', itemsize); break;
      case 'b': case 'h': case 'i': case 'l': case 'q': case 'n': t = numeric('i', itemsize); break;
      case 'B': case 'H': case 'I': case 'L': case 'Q': case 'N': case 'c':
        t = numeric('u', itemsize);
        break;
      case '?': t = numeric('b', itemsize); break;
      default: break;
    }
  } else if (f.size() == 2 && f[0] == 'Z') {
    t = numeric('c', itemsize);
  }
  if (big_endian && itemsize > 1) return {std::nullopt, "big-endian " + t.name};
  return t;
}

// The element type of an __array_interface__ typestr such as "<f4"; `obj` names bfloat16
// (ml_dtypes) whose typestr is only "<V2".
TypeInfo from_typestr(const std::string& ts, py::handle obj) {
  if (ts.size() < 3) return {std::nullopt, "typestr '" + ts + "'"};
  const std::size_t size = std::stoul(ts.substr(2));
  if (ts[1] == 'V' && size == 2 && py::hasattr(obj, "dtype")) {
    const std::string n = py::str(obj.attr("dtype"));
    if (n == "bfloat16") return {nexar::DataType::bf16, "bfloat16"};
  }
  TypeInfo t = numeric(ts[1], size);
  if (ts[0] == '>' && size > 1) return {std::nullopt, "big-endian " + t.name};
  return t;
}

TypeInfo from_dlpack(const DLDataType& d) {
  const std::size_t size = d.bits / 8;
  if (d.lanes != 1) return {std::nullopt, "a vector element type"};
  switch (d.code) {
    case 0: return numeric('i', size);
    case 1: return numeric('u', size);
    case 2: return numeric('f', size);
    case 4:
      if (d.bits == 16) return {nexar::DataType::bf16, "bfloat16"};
      return {std::nullopt, "bfloat" + std::to_string(d.bits)};
    case 5: return numeric('c', size);
    case 6: return numeric('b', size);
    default: return {std::nullopt, "DLPack type code " + std::to_string(d.code)};
  }
}

std::string where(const char* op, const char* arg) { return std::string(op) + ": " + arg; }

[[noreturn]] void not_contiguous(const char* op, const char* arg) {
  invalid(where(op, arg) +
          " is not contiguous; nexar reads and writes one C-contiguous block of memory "
          "(use numpy.ascontiguousarray(x) or tensor.contiguous(), and copy results back)");
}

[[noreturn]] void read_only(const char* op, const char* arg) {
  invalid(where(op, arg) +
          " is read-only, but the operation writes its result there (pass a writable array, "
          "e.g. a copy)");
}

}  // namespace

Borrowed::~Borrowed() {
  if (has_view_) PyBuffer_Release(&view_);
  if (dlpack_ != nullptr) {
    auto* t = static_cast<DLManagedTensor*>(dlpack_);
    if (t->deleter != nullptr) t->deleter(t);
  }
}

BorrowedPtr borrow(py::handle obj, Access access, const char* op, const char* arg) {
  if (obj.is_none()) {
    throw py::type_error(where(op, arg) + " is None; a buffer (NumPy array, bytearray, "
                         "memoryview, CPU torch tensor) is needed");
  }
  auto b = std::make_unique<Borrowed>();
  bool buffer_refused = false;

  // 1. The buffer protocol (NumPy, bytearray, bytes, memoryview, array.array). Strides are
  // asked for so that a non-contiguous array gives our message rather than the exporter's,
  // and writability is checked here for the same reason.
  if (PyObject_CheckBuffer(obj.ptr()) != 0) {
    if (PyObject_GetBuffer(obj.ptr(), &b->view_, PyBUF_STRIDES | PyBUF_FORMAT) == 0) {
      b->has_view_ = true;
      if (access == Access::write && b->view_.readonly != 0) read_only(op, arg);
      if (PyBuffer_IsContiguous(&b->view_, 'C') == 0) not_contiguous(op, arg);
      const auto itemsize = static_cast<std::size_t>(b->view_.itemsize);
      const TypeInfo t = from_format(b->view_.format, itemsize);
      b->data_ = static_cast<std::byte*>(b->view_.buf);
      b->bytes_ = static_cast<std::size_t>(b->view_.len);
      b->itemsize_ = itemsize == 0 ? 1 : itemsize;
      b->dtype_ = t.dtype;
      b->type_name_ = t.name;
      return b;
    }
    // NumPy refuses to export some element types (ml_dtypes' bfloat16) through the buffer
    // protocol; those still have __array_interface__, tried below.
    py::error_already_set e;
    if (!py::hasattr(obj, "__array_interface__")) {
      invalid(where(op, arg) + ": its buffer cannot be used: " + describe(e));
    }
    buffer_refused = true;
  }

  // 2. DLPack: CPU torch tensors (and any other array library), zero-copy, torch not imported.
  if (!buffer_refused && py::hasattr(obj, "__dlpack__")) {
    py::object capsule;
    try {
      capsule = obj.attr("__dlpack__")();
    } catch (py::error_already_set& e) {
      // torch refuses to export a tensor that requires grad; its detached view shares the
      // memory (what `tensor.data` gives).
      if (!py::hasattr(obj, "detach")) {
        invalid(where(op, arg) + ": __dlpack__ failed: " + describe(e));
      }
      try {
        capsule = obj.attr("detach")().attr("__dlpack__")();
      } catch (py::error_already_set& e2) {
        invalid(where(op, arg) + ": __dlpack__ failed: " + describe(e2));
      }
    }
    auto* t = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
    if (t == nullptr) {
      py::error_already_set e;
      invalid(where(op, arg) + ": __dlpack__ returned no usable capsule: " + describe(e));
    }
    // From here we own the tensor: mark the capsule used so that it does not free it too.
    PyCapsule_SetName(capsule.ptr(), "used_dltensor");
    b->dlpack_ = t;
    b->keep_ = py::reinterpret_borrow<py::object>(obj);
    const DLTensor& d = t->dl_tensor;
    if (d.device.device_type != kDLCPU && d.device.device_type != kDLCUDAHost) {
      invalid(where(op, arg) + " is in device memory (DLPack device type " +
              std::to_string(d.device.device_type) +
              "); nexar works on CPU memory only for now: move it with .cpu()");
    }
    const TypeInfo ti = from_dlpack(d.dtype);
    const std::size_t itemsize = (std::size_t{d.dtype.bits} * d.dtype.lanes + 7) / 8;
    std::size_t n = 1;
    bool contiguous = true;
    std::int64_t expected = 1;
    for (int i = d.ndim - 1; i >= 0; --i) {
      const std::int64_t extent = d.shape[i];
      n *= static_cast<std::size_t>(extent);
      if (d.strides != nullptr && extent != 1 && d.strides[i] != expected) contiguous = false;
      expected *= extent;
    }
    if (!contiguous && n > 0) not_contiguous(op, arg);
    b->data_ = static_cast<std::byte*>(d.data) + d.byte_offset;
    b->bytes_ = n * itemsize;
    b->itemsize_ = itemsize == 0 ? 1 : itemsize;
    b->dtype_ = ti.dtype;
    b->type_name_ = ti.name;
    return b;
  }

  // 3. __array_interface__ (NumPy's older protocol; also NumPy arrays of ml_dtypes types).
  if (py::hasattr(obj, "__array_interface__")) {
    const py::dict ai = obj.attr("__array_interface__");
    const py::object data = ai["data"];
    if (!py::isinstance<py::tuple>(data)) {
      invalid(where(op, arg) + ": its __array_interface__ has no data pointer");
    }
    const auto ptr = data.cast<py::tuple>()[0].cast<std::uintptr_t>();
    const bool ro = data.cast<py::tuple>()[1].cast<bool>();
    const TypeInfo t = from_typestr(ai["typestr"].cast<std::string>(), obj);
    const std::size_t itemsize = std::stoul(ai["typestr"].cast<std::string>().substr(2));
    const auto shape = ai["shape"].cast<std::vector<std::int64_t>>();
    std::size_t n = 1;
    for (auto s : shape) n *= static_cast<std::size_t>(s);
    if (ai.contains("strides") && !ai["strides"].is_none() && n > 0) {
      const auto strides = ai["strides"].cast<std::vector<std::int64_t>>();
      auto expected = static_cast<std::int64_t>(itemsize);
      for (std::size_t i = shape.size(); i-- > 0;) {
        if (shape[i] != 1 && strides[i] != expected) not_contiguous(op, arg);
        expected *= shape[i];
      }
    }
    if (access == Access::write && ro) read_only(op, arg);
    b->keep_ = py::reinterpret_borrow<py::object>(obj);
    b->data_ = reinterpret_cast<std::byte*>(ptr);
    b->bytes_ = n * itemsize;
    b->itemsize_ = itemsize == 0 ? 1 : itemsize;
    b->dtype_ = t.dtype;
    b->type_name_ = t.name;
    return b;
  }

  throw py::type_error(where(op, arg) + " must be a buffer (NumPy array, bytearray, bytes, "
                       "memoryview) or a CPU torch tensor, not " +
                       std::string(py::str(obj.get_type().attr("__name__"))));
}

const char* dtype_name(nexar::DataType t) noexcept {
  using nexar::DataType;
  switch (t) {
    case DataType::f32: return "float32";
    case DataType::f64: return "float64";
    case DataType::f16: return "float16";
    case DataType::bf16: return "bfloat16";
    case DataType::i8: return "int8";
    case DataType::u8: return "uint8";
    case DataType::i32: return "int32";
    case DataType::u32: return "uint32";
    case DataType::i64: return "int64";
    case DataType::u64: return "uint64";
  }
  return "?";
}

std::optional<nexar::DataType> parse_dtype(py::handle spec) {
  using nexar::DataType;
  if (spec.is_none()) return std::nullopt;
  if (py::isinstance<DataType>(spec)) return spec.cast<DataType>();
  std::string name;
  if (py::isinstance<py::str>(spec)) {
    name = spec.cast<std::string>();
  } else if (py::hasattr(spec, "name") && py::isinstance<py::str>(spec.attr("name"))) {
    name = spec.attr("name").cast<std::string>();  // numpy.dtype
  } else if (py::hasattr(spec, "__name__")) {
    name = spec.attr("__name__").cast<std::string>();  // numpy.float32 and other type objects
  } else {
    name = py::str(spec).cast<std::string>();  // torch.float32 prints as "torch.float32"
  }
  if (name.rfind("torch.", 0) == 0) name.erase(0, 6);
  static const std::pair<const char*, DataType> names[] = {
      {"float32", DataType::f32}, {"f32", DataType::f32},   {"float", DataType::f32},
      {"float64", DataType::f64}, {"f64", DataType::f64},   {"double", DataType::f64},
      {"float16", DataType::f16}, {"f16", DataType::f16},   {"half", DataType::f16},
      {"bfloat16", DataType::bf16}, {"bf16", DataType::bf16}, {"int8", DataType::i8},
      {"i8", DataType::i8},       {"uint8", DataType::u8},  {"u8", DataType::u8},
      {"int32", DataType::i32},   {"i32", DataType::i32},   {"int", DataType::i32},
      {"uint32", DataType::u32},  {"u32", DataType::u32},   {"int64", DataType::i64},
      {"i64", DataType::i64},     {"long", DataType::i64},  {"uint64", DataType::u64},
      {"u64", DataType::u64},
  };
  for (const auto& [n, t] : names) {
    if (name == n) return t;
  }
  invalid("unknown dtype '" + name + "' (nexar has float32, float64, float16, bfloat16, int8, "
          "uint8, int32, uint32, int64, uint64)");
}

std::optional<std::chrono::milliseconds> to_ms(py::handle v, const char* what) {
  if (v.is_none()) return std::nullopt;
  double seconds = 0;
  if (py::hasattr(v, "total_seconds")) {
    seconds = v.attr("total_seconds")().cast<double>();
  } else if (py::isinstance<py::int_>(v) || py::isinstance<py::float_>(v)) {
    seconds = v.cast<double>();
  } else {
    throw py::type_error(std::string(what) + " must be a number of seconds or a "
                         "datetime.timedelta");
  }
  if (!(seconds >= 0) || seconds > 365.0 * 24 * 3600) {
    invalid(std::string(what) + " must be between 0 and 365 days, not " +
            std::to_string(seconds) + " s");
  }
  return std::chrono::milliseconds(static_cast<std::int64_t>(seconds * 1000.0 + 0.5));
}

}  // namespace nexar_py
