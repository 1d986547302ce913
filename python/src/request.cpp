// nexar.Request: non-blocking operations, and the memory they borrowed.
#include "common.hpp"

namespace nexar_py {

namespace {

// Operations whose Request was dropped before they completed: their memory must stay
// borrowed until they end (nexar writes into it until then). Only touched with the GIL held;
// never destroyed, so that no Python object is released after the interpreter ends.
struct Orphan {
  nexar::Request request;
  std::shared_ptr<Hold> hold;
};
std::vector<Orphan>& orphans() {
  static auto* list = new std::vector<Orphan>();
  return *list;
}

}  // namespace

void sweep_orphans() {
  auto& list = orphans();
  std::erase_if(list, [](const Orphan& o) { return o.request.test(); });
}

PyRequest::PyRequest(nexar::Request r, std::shared_ptr<Hold> hold, py::object value, Kind kind)
    : request_(std::move(r)), hold_(std::move(hold)), value_(std::move(value)), kind_(kind) {
  sweep_orphans();
}

PyRequest::~PyRequest() {
  if (hold_ && !request_.test()) orphans().push_back({request_, std::move(hold_)});
}

bool PyRequest::test() const noexcept { return request_.test(); }

py::object PyRequest::wait() {
  try {
    py::gil_scoped_release r;
    request_.wait();
  } catch (...) {
    hold_.reset();  // finished (with a failure): nothing is written any more
    throw;
  }
  hold_.reset();
  if (kind_ == Kind::status) return py::cast(request_.status());
  return value_;
}

bool PyRequest::wait_for(py::handle seconds) {
  const auto d = to_ms(seconds, "wait_for: timeout").value_or(std::chrono::milliseconds(0));
  bool done = false;
  try {
    py::gil_scoped_release r;
    done = request_.wait_for(d);
  } catch (...) {
    hold_.reset();
    throw;
  }
  if (done) hold_.reset();
  return done;
}

nexar::Status PyRequest::status() const {
  if (!request_.test()) invalid("Request.status: the operation has not completed");
  return request_.status();
}

py::object PyRequest::exception() {
  if (!request_.test() || !request_.error()) return py::none();
  try {
    request_.wait();  // completed: returns at once, throwing its error
  } catch (const nexar::Error& e) {
    return error_object(e);
  }
  return py::none();
}

void register_requests(py::module_& m) {
  py::class_<nexar::Status>(m, "Status", "What a completed receive got.")
      .def_readonly("source", &nexar::Status::source, "Rank the message came from.")
      .def_readonly("tag", &nexar::Status::tag, "Tag it carried.")
      .def_readonly("bytes", &nexar::Status::bytes, "Payload size in bytes.")
      .def("__repr__", [](const nexar::Status& s) {
        return "Status(source=" + std::to_string(s.source) + ", tag=" + std::to_string(s.tag) +
               ", bytes=" + std::to_string(s.bytes) + ")";
      });

  py::class_<PyRequest>(m, "Request",
                        "Handle of a non-blocking operation (isend, irecv, the i-forms of "
                        "collectives). The buffers it uses stay borrowed until it completes, "
                        "even if the Request is dropped.")
      .def("test", &PyRequest::test, "True once the operation finished; never blocks.")
      .def("wait", &PyRequest::wait,
           "Blocks (without the GIL) until the operation finishes and returns its result: a "
           "Status for receives and sends, the output buffer for collectives (None for "
           "barrier). Raises nexar.Error if it failed.")
      .def("wait_for", &PyRequest::wait_for, py::arg("timeout"),
           "Waits at most `timeout` seconds; False if still running. Raises if it failed.")
      .def("cancel", &PyRequest::cancel,
           "Asks nexar to cancel the operation (a receive not yet matched, a send not yet "
           "started, a collective still queued behind earlier ones); it then fails with "
           "nexar.CancelledError.")
      .def_property_readonly("status", &PyRequest::status,
                             "Status of a completed receive (source, tag, bytes).")
      .def("exception", &PyRequest::exception,
           "The nexar.Error the finished operation failed with (not raised), else None.")
      .def("__repr__", [](const PyRequest& r) {
        return std::string("<nexar.Request ") + (r.test() ? "done" : "running") + ">";
      });
}

}  // namespace nexar_py
