// nexar.Communicator: point-to-point, RPC, sub-communicators, failures and lifetime.
// (Collectives are in collectives.cpp.)
#include "common.hpp"

namespace nexar_py {

PyComm::~PyComm() {
  // Closing joins nexar's threads; one of them may be waiting for the GIL to run a handler.
  if (PyGILState_Check() != 0) {
    py::gil_scoped_release r;
    c = nexar::Communicator();
  }
}

py::object wrap(nexar::Communicator c) {
  if (!c.is_open()) return py::none();
  return py::cast(std::make_unique<PyComm>(std::move(c)));
}

namespace {

using nexar::Communicator;

// ---- point-to-point ------------------------------------------------------------------------

using SendFn = void (Communicator::*)(int, int, const void*, std::size_t);
using ISendFn = nexar::Request (Communicator::*)(int, int, const void*, std::size_t);
using RecvFn = nexar::Status (Communicator::*)(int, int, void*, std::size_t);
using IRecvFn = nexar::Request (Communicator::*)(int, int, void*, std::size_t);

template <SendFn F>
void send(PyComm& self, py::handle data, int dest, int tag, const char* op) {
  const BorrowedPtr b = borrow(data, Access::read, op, "data");
  py::gil_scoped_release r;
  (self.c.*F)(dest, tag, b->data(), b->bytes());
}

template <ISendFn F>
PyRequest isend(PyComm& self, py::handle data, int dest, int tag, const char* op) {
  auto hold = std::make_shared<Hold>();
  const Borrowed& b = hold->add(borrow(data, Access::read, op, "data"));
  nexar::Request q;
  {
    py::gil_scoped_release r;
    q = (self.c.*F)(dest, tag, b.data(), b.bytes());
  }
  return PyRequest(std::move(q), std::move(hold), py::none(), PyRequest::Kind::status);
}

template <RecvFn F>
nexar::Status recv(PyComm& self, py::handle data, int source, int tag, const char* op) {
  const BorrowedPtr b = borrow(data, Access::write, op, "data");
  nexar::Status st;
  {
    py::gil_scoped_release r;
    st = (self.c.*F)(source, tag, b->data(), b->bytes());
  }
  if (st.bytes % b->itemsize() != 0) {
    invalid(std::string(op) + ": the message from rank " + std::to_string(st.source) + " has " +
            std::to_string(st.bytes) + " bytes, not a whole number of " +
            std::to_string(b->itemsize()) + "-byte elements (" + b->type_name() + ")");
  }
  return st;
}

template <IRecvFn F>
PyRequest irecv(PyComm& self, py::handle data, int source, int tag, const char* op) {
  auto hold = std::make_shared<Hold>();
  const Borrowed& b = hold->add(borrow(data, Access::write, op, "data"));
  nexar::Request q;
  {
    py::gil_scoped_release r;
    q = (self.c.*F)(source, tag, b.data(), b.bytes());
  }
  return PyRequest(std::move(q), std::move(hold), py::none(), PyRequest::Kind::status);
}

std::vector<nexar::ConstBuffer> gather_parts(Hold& hold, const py::sequence& parts,
                                             const char* op) {
  std::vector<nexar::ConstBuffer> v;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const std::string arg = "parts[" + std::to_string(i) + "]";
    const Borrowed& b = hold.add(borrow(parts[i], Access::read, op, arg.c_str()));
    v.push_back({b.data(), b.bytes()});
  }
  return v;
}

// ---- RPC ---------------------------------------------------------------------------------

nexar::RpcHandler python_handler(py::function fn) {
  auto f = share(std::move(fn));
  return [f](int caller, std::span<const std::byte> args) -> std::vector<std::byte> {
    if (!python_alive()) throw std::runtime_error("the Python interpreter is shutting down");
    py::gil_scoped_acquire g;
    try {
      const py::object reply =
          (*f)(caller, py::bytes(reinterpret_cast<const char*>(args.data()), args.size()));
      if (reply.is_none()) return {};
      const BorrowedPtr b = borrow(reply, Access::read, "rpc handler", "its return value");
      return {b->data(), b->data() + b->bytes()};
    } catch (py::error_already_set& e) {
      // The caller gets Errc::rpc_failed with this text: the exception's type and message.
      throw std::runtime_error(describe(e));
    }
  };
}

py::bytes to_bytes(const std::vector<std::byte>& v) {
  return {reinterpret_cast<const char*>(v.data()), v.size()};
}

// rpc_async copies the arguments before it returns, so nothing stays borrowed.
class PyRpcCall {
 public:
  explicit PyRpcCall(nexar::RpcCall c) : call_(std::move(c)) {}
  bool test() const noexcept { return call_.test(); }
  py::bytes wait() const {
    const std::vector<std::byte>* reply = nullptr;
    {
      py::gil_scoped_release r;
      reply = &call_.wait();
    }
    return to_bytes(*reply);
  }
  bool wait_for(py::handle seconds) const {
    const auto d = to_ms(seconds, "wait_for: timeout").value_or(std::chrono::milliseconds(0));
    py::gil_scoped_release r;
    return call_.wait_for(d);
  }
  void cancel() const { call_.cancel(); }

 private:
  nexar::RpcCall call_;
};

}  // namespace

void register_communicator(py::module_& m, CommClass& cls) {
  py::class_<PyRpcCall>(m, "RpcCall", "A non-blocking RPC call (Communicator.rpc_async).")
      .def("test", &PyRpcCall::test, "True once the call finished; never blocks.")
      .def("wait", &PyRpcCall::wait,
           "Blocks (without the GIL) until the reply arrives and returns it as bytes. Raises "
           "as Communicator.rpc does.")
      .def("wait_for", &PyRpcCall::wait_for, py::arg("timeout"),
           "Waits at most `timeout` seconds; False if the call is still running.")
      .def("cancel", &PyRpcCall::cancel, "Gives the call up (nexar.CancelledError).");

  py::class_<Communicator::Agreement>(m, "Agreement", "What Communicator.agree() decided.")
      .def_readonly("value", &Communicator::Agreement::value,
                    "Bitwise AND of the values passed by the members that did not fail.")
      .def_readonly("failed", &Communicator::Agreement::failed,
                    "The members every survivor agrees have failed (ascending).")
      .def("__repr__", [](const Communicator::Agreement& a) {
        return "Agreement(value=" + std::to_string(a.value) + ", failed=" +
               py::repr(py::cast(a.failed)).cast<std::string>() + ")";
      });

  cls.def_property_readonly("rank", [](const PyComm& s) { return s.c.rank(); },
                            "This process's rank, 0 <= rank < size.")
      .def_property_readonly("size", [](const PyComm& s) { return s.c.size(); },
                             "Number of ranks.")
      .def_property_readonly("id", [](const PyComm& s) { return s.c.id(); },
                             "Identifier carried by this communicator's frames (0: world).")
      .def_property_readonly("config", [](const PyComm& s) { return s.c.config(); },
                             "A copy of the configuration this communicator runs with.")
      .def_property_readonly("is_open", [](const PyComm& s) { return s.c.is_open(); },
                             "True until close().")
      .def("__repr__",
           [](const PyComm& s) {
             if (!s.c.is_open()) return std::string("<nexar.Communicator closed>");
             return "<nexar.Communicator rank " + std::to_string(s.c.rank()) + " of " +
                    std::to_string(s.c.size()) + ", id " + std::to_string(s.c.id()) + ">";
           })

      // point-to-point
      .def("send",
           [](PyComm& s, py::handle d, int dest, int tag) {
             send<&Communicator::send>(s, d, dest, tag, "send");
           },
           py::arg("data"), py::arg("dest"), py::arg("tag") = 0,
           "Sends the bytes of `data` (any buffer or CPU tensor) to rank `dest` with `tag` "
           "(0 .. nexar.MAX_TAG). Returns when `data` may be reused.")
      .def("isend",
           [](PyComm& s, py::handle d, int dest, int tag) {
             return isend<&Communicator::isend>(s, d, dest, tag, "isend");
           },
           py::arg("data"), py::arg("dest"), py::arg("tag") = 0,
           "Non-blocking send; `data` stays borrowed until the Request completes.")
      .def("recv",
           [](PyComm& s, py::handle d, int source, int tag) {
             return recv<&Communicator::recv>(s, d, source, tag, "recv");
           },
           py::arg("data"), py::arg("source") = nexar::any_source,
           py::arg("tag") = nexar::any_tag,
           "Receives one message from `source` (or nexar.ANY_SOURCE) with `tag` (or "
           "nexar.ANY_TAG) into the writable buffer `data`, in place. Returns a Status. "
           "Raises nexar.TruncatedError if the message is larger than `data`.")
      .def("irecv",
           [](PyComm& s, py::handle d, int source, int tag) {
             return irecv<&Communicator::irecv>(s, d, source, tag, "irecv");
           },
           py::arg("data"), py::arg("source") = nexar::any_source,
           py::arg("tag") = nexar::any_tag,
           "Non-blocking recv; wait() returns the Status.")
      .def("bulk_send",
           [](PyComm& s, py::handle d, int dest, int tag) {
             send<&Communicator::bulk_send>(s, d, dest, tag, "bulk_send");
           },
           py::arg("data"), py::arg("dest"), py::arg("tag") = 0,
           "send() on the bulk lane: large messages that never delay other traffic. Bulk "
           "messages match bulk receives only.")
      .def("ibulk_send",
           [](PyComm& s, py::handle d, int dest, int tag) {
             return isend<&Communicator::ibulk_send>(s, d, dest, tag, "ibulk_send");
           },
           py::arg("data"), py::arg("dest"), py::arg("tag") = 0, "Non-blocking bulk_send.")
      .def("bulk_recv",
           [](PyComm& s, py::handle d, int source, int tag) {
             return recv<&Communicator::bulk_recv>(s, d, source, tag, "bulk_recv");
           },
           py::arg("data"), py::arg("source") = nexar::any_source,
           py::arg("tag") = nexar::any_tag, "recv() from the bulk lane.")
      .def("ibulk_recv",
           [](PyComm& s, py::handle d, int source, int tag) {
             return irecv<&Communicator::ibulk_recv>(s, d, source, tag, "ibulk_recv");
           },
           py::arg("data"), py::arg("source") = nexar::any_source,
           py::arg("tag") = nexar::any_tag, "Non-blocking bulk_recv.")
      .def("send_iov",
           [](PyComm& s, const py::sequence& parts, int dest, int tag) {
             Hold hold;
             const auto v = gather_parts(hold, parts, "send_iov");
             py::gil_scoped_release r;
             s.c.send_iov(dest, tag, v);
           },
           py::arg("parts"), py::arg("dest"), py::arg("tag") = 0,
           "Sends the concatenation of the buffers in `parts` as one message, without "
           "joining them first.")
      .def("isend_iov",
           [](PyComm& s, const py::sequence& parts, int dest, int tag) {
             auto hold = std::make_shared<Hold>();
             const auto v = gather_parts(*hold, parts, "isend_iov");
             nexar::Request q;
             {
               py::gil_scoped_release r;
               q = s.c.isend_iov(dest, tag, v);
             }
             return PyRequest(std::move(q), std::move(hold), py::none(),
                              PyRequest::Kind::status);
           },
           py::arg("parts"), py::arg("dest"), py::arg("tag") = 0, "Non-blocking send_iov.")

      // RPC
      .def("register_rpc",
           [](PyComm& s, nexar::RpcId id, py::function fn) {
             auto h = python_handler(std::move(fn));
             py::gil_scoped_release r;
             s.c.register_rpc(id, std::move(h));
           },
           py::arg("fn_id"), py::arg("handler"),
           "Registers `handler(caller: int, args: bytes) -> bytes-like | None` as function "
           "`fn_id` of this communicator. Handlers run on nexar's RPC threads, several at "
           "once, taking the GIL while they run. An exception raised by a handler reaches the "
           "caller as nexar.RpcFailedError carrying its type and message.")
      .def("unregister_rpc",
           [](PyComm& s, nexar::RpcId id) {
             py::gil_scoped_release r;
             s.c.unregister_rpc(id);
           },
           py::arg("fn_id"), "Removes the handler of `fn_id`.")
      .def("rpc",
           [](PyComm& s, int dest, nexar::RpcId id, py::handle args, py::handle timeout) {
             const auto t = to_ms(timeout, "rpc: timeout");
             BorrowedPtr a = args.is_none() ? nullptr : borrow(args, Access::read, "rpc", "args");
             std::vector<std::byte> reply;
             {
               py::gil_scoped_release r;
               std::span<const std::byte> span;
               if (a) span = {a->data(), a->bytes()};
               reply = s.c.rpc(dest, id, span, t);
             }
             return to_bytes(reply);
           },
           py::arg("dest"), py::arg("fn_id"), py::arg("args") = py::bytes(),
           py::arg("timeout") = py::none(),
           "Calls function `fn_id` on rank `dest` (which may be this rank) with the bytes of "
           "`args` and returns the reply as bytes. `timeout` in seconds (default: the "
           "configured rpc_timeout). Raises nexar.UnknownRpcError, nexar.RpcFailedError (the "
           "handler raised), nexar.TimeoutError, ...")
      .def("rpc_async",
           [](PyComm& s, int dest, nexar::RpcId id, py::handle args, py::handle timeout) {
             const auto t = to_ms(timeout, "rpc_async: timeout");
             BorrowedPtr a =
                 args.is_none() ? nullptr : borrow(args, Access::read, "rpc_async", "args");
             std::span<const std::byte> span;
             if (a) span = {a->data(), a->bytes()};
             py::gil_scoped_release r;
             return PyRpcCall(s.c.rpc_async(dest, id, span, t));
           },
           py::arg("dest"), py::arg("fn_id"), py::arg("args") = py::bytes(),
           py::arg("timeout") = py::none(),
           "Non-blocking rpc(): returns an RpcCall whose wait() returns the reply.")

      // communicators
      .def("split",
           [](PyComm& s, int color, std::optional<int> key) {
             Communicator sub;
             {
               py::gil_scoped_release r;
               sub = s.c.split(color, key.value_or(s.c.rank()));
             }
             return wrap(std::move(sub));
           },
           py::arg("color"), py::arg("key") = py::none(),
           "Collective: ranks passing the same color (>= 0) form a new communicator, ranked "
           "by (key, rank); key defaults to the rank. A negative color returns None.")

      .def("neighbours", [](const PyComm& s) { return s.c.neighbours(); },
           "Ranks (ascending) this rank holds a direct connection to under the topology; "
           "the others are reached through relays.")
      .def("connected_peers", [](const PyComm& s) { return s.c.connected_peers(); },
           "Ranks (ascending) this rank holds a working connection to now; under "
           "Config.lazy_connect only those it has exchanged messages with so far.")

      // diagnosis
      .def("recorder",
           [](const PyComm& s) {
             // Times as time.monotonic() reads them (both are CLOCK_MONOTONIC), None when
             // not reached yet.
             auto seconds = [](std::chrono::steady_clock::time_point t) -> py::object {
               if (t == std::chrono::steady_clock::time_point{}) return py::none();
               return py::float_(std::chrono::duration<double>(t.time_since_epoch()).count());
             };
             py::list out;
             for (const nexar::OpRecord& r : s.c.recorder()) {
               py::dict d;
               d["number"] = r.number;
               d["op"] = r.op;
               d["dtype"] = nexar::to_string(r.dtype);
               d["reduce_op"] = nexar::to_string(r.reduce_op);
               d["count"] = r.count;
               d["bytes"] = r.bytes;
               d["root"] = r.root;
               d["algorithm"] = r.algorithm;
               d["state"] = nexar::to_string(r.state);
               d["posted"] = seconds(r.posted);
               d["started"] = seconds(r.started);
               d["ended"] = seconds(r.ended);
               out.append(std::move(d));
             }
             return out;
           },
           "This rank's flight recorder of the communicator: its last Config.recorder_ops "
           "collectives, oldest first, each a dict (number, op, dtype, reduce_op, count, bytes, "
           "root, algorithm, state, and posted/started/ended in time.monotonic() seconds or None).")
      .def("dump", [](const PyComm& s) { return s.c.dump(); },
           "The recorder and this rank's progress as one JSON object (a str).")
      .def("stats",
           [](const PyComm& s) {
             const nexar::Stats st = s.c.stats();
             auto sec = [](std::chrono::nanoseconds d) { return std::chrono::duration<double>(d).count(); };
             py::dict ops;
             for (const nexar::OpStats& o : st.ops) {
               py::dict d;
               d["calls"] = o.calls;
               d["failed"] = o.failed;
               d["bytes"] = o.bytes;
               d["seconds"] = sec(o.total);
               d["waiting_seconds"] = sec(o.waiting);
               ops[py::str(o.op)] = std::move(d);
             }
             py::dict peers;
             for (const nexar::PeerStats& p : st.peers) {
               py::dict d;
               d["world_rank"] = p.world_rank;
               d["connected"] = p.connected;
               d["links"] = p.links;
               d["rtt_seconds"] = sec(p.rtt);
               d["min_rtt_seconds"] = sec(p.min_rtt);
               d["latest_rtt_seconds"] = sec(p.latest_rtt);
               d["rtt_var_seconds"] = sec(p.rtt_var);
               d["cwnd"] = p.cwnd;
               d["bytes_in_flight"] = p.bytes_in_flight;
               d["lost_packets"] = p.lost_packets;
               py::dict lanes;
               for (const nexar::LaneStats& l : p.lanes) lanes[py::str(l.lane)] = py::make_tuple(l.sent, l.received);
               d["lanes"] = std::move(lanes);
               peers[py::int_(p.rank)] = std::move(d);
             }
             py::dict out;
             out["ops"] = std::move(ops);
             out["peers"] = std::move(peers);
             out["receive_drops"] = st.receive_drops;
             out["send_drops"] = st.send_drops;
             return out;
           },
           "Counters of this communicator on this rank (nexar::Stats): {'ops': {name: {calls, failed, "
           "bytes, seconds, waiting_seconds}}, 'peers': {rank: {world_rank, connected, links, "
           "rtt_seconds, min_rtt_seconds, latest_rtt_seconds, rtt_var_seconds, cwnd, "
           "bytes_in_flight, lost_packets, lanes: {lane: (sent, received)}}}, 'receive_drops', "
           "'send_drops'}.")

      // failures
      .def("world_ranks", [](const PyComm& s) { return s.c.world_ranks(); },
           "World rank of each member.")
      .def("failed_ranks", [](const PyComm& s) { return s.c.failed_ranks(); },
           "Members known (locally) to have failed, ascending.")
      .def("is_revoked", [](const PyComm& s) { return s.c.is_revoked(); },
           "True once the communicator was revoked (a member failed, or revoke()).")
      .def("revoke",
           [](PyComm& s) {
             py::gil_scoped_release r;
             s.c.revoke();
           },
           "Revokes the communicator on every member: their operations fail with "
           "nexar.RevokedError until agree()/shrink().")
      .def("on_failure",
           [](PyComm& s, std::optional<py::function> fn) {
             std::function<void(const std::vector<int>&)> cb;
             if (fn) {
               auto f = share(std::move(*fn));
               cb = [f](const std::vector<int>& failed) {
                 if (!python_alive()) return;
                 py::gil_scoped_acquire g;
                 try {
                   (*f)(failed);
                 } catch (py::error_already_set& e) {
                   e.discard_as_unraisable("nexar on_failure callback");
                 }
               };
             }
             py::gil_scoped_release r;
             s.c.on_failure(std::move(cb));
           },
           py::arg("callback"),
           "Calls `callback(failed: list[int])` on a nexar thread (with the GIL) each time a "
           "member is newly found failed; None removes it.")
      .def("agree",
           [](PyComm& s, std::uint64_t value) {
             py::gil_scoped_release r;
             return s.c.agree(value);
           },
           py::arg("value") = ~std::uint64_t{0},
           "Fault-tolerant agreement over the live members; returns an Agreement.")
      .def("shrink",
           [](PyComm& s) {
             Communicator c;
             {
               py::gil_scoped_release r;
               c = s.c.shrink();
             }
             return wrap(std::move(c));
           },
           "Collective over the live members: a new communicator without the failed ones.")
      .def("grow",
           [](PyComm& s) {
             Communicator c;
             {
               py::gil_scoped_release r;
               c = s.c.grow();
             }
             return wrap(std::move(c));
           },
           "Collective: admits waiting joiners (elastic jobs) and drops leavers and failed "
           "members; returns the new communicator.")
      .def("leave",
           [](PyComm& s) {
             py::gil_scoped_release r;
             s.c.leave();
           },
           "This rank leaves, matching the others' grow().")
      .def("pending_joiners", [](const PyComm& s) { return s.c.pending_joiners(); },
           "Joiners waiting for admission that this rank is connected to.")
      .def("joined_by_grow", [](const PyComm& s) { return s.c.joined_by_grow(); },
           "True for the communicator a join into a running job returned.")

      // lifetime
      .def("close",
           [](PyComm& s) {
             py::gil_scoped_release r;
             s.c.close();
           },
           "Closes the communicator (on the world: every connection). Idempotent.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyComm& s, py::args) {
        py::gil_scoped_release r;
        s.c.close();
      });
}

}  // namespace nexar_py
