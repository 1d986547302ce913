// Making communicators: nexar.Config, bootstrap_local, join_from_env, join, nexar.Seed.
#include <pybind11/chrono.h>

#include "common.hpp"

namespace nexar_py {

namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;

nexar::Config config_or_env(const std::optional<nexar::Config>& c) {
  return c ? *c : nexar::Config::from_env();
}

template <milliseconds nexar::Config::*F>
void def_ms(py::class_<nexar::Config>& cls, const char* name, const char* doc) {
  cls.def_property(
      name, [](const nexar::Config& c) { return c.*F; },
      [name](nexar::Config& c, py::handle v) {
        const auto ms = to_ms(v, name);
        if (!ms) throw py::type_error(std::string(name) + " cannot be None");
        c.*F = *ms;
      },
      doc);
}

// T(**kwargs): the defaults, then each keyword set as an attribute, so that every field's
// own setter (and its checks) applies.
template <class T>
T with_fields(const py::kwargs& kw) {
  T value;
  py::object self = py::cast(value);
  for (auto [k, v] : kw) self.attr(k) = v;
  return self.cast<T>();
}

// A nexar::Seed owned by Python; stopping it joins its thread, so without the GIL.
struct PySeed {
  std::unique_ptr<nexar::Seed> seed;
  ~PySeed() {
    if (PyGILState_Check() != 0) {
      py::gil_scoped_release r;
      seed.reset();
    }
  }
  nexar::Seed& get() const {
    if (!seed) throw nexar::Error(nexar::Errc::closed, "Seed: stopped");
    return *seed;
  }
};

}  // namespace

void register_cluster(py::module_& m) {
  py::class_<nexar::Tuning>(
      m, "Tuning",
      "Config.tuning: algorithm thresholds and fault injection (include/nexar/tuning.hpp). "
      "Not part of the stable API: fields may change in any release; NEXAR_* variables set "
      "them too (docs/CONFIG.md).")
      .def(py::init(&with_fields<nexar::Tuning>), "Tuning(**fields): the defaults, with the given fields set.")
      .def_readwrite("segment_bytes", &nexar::Tuning::segment_bytes, "Pipelining segment.")
      .def_readwrite("allreduce_ring_bytes", &nexar::Tuning::allreduce_ring_bytes,
                     "all_reduce ring threshold.")
      .def_readwrite("allreduce_doubling_bytes", &nexar::Tuning::allreduce_doubling_bytes,
                     "all_reduce recursive-doubling threshold.")
      .def_readwrite("broadcast_chain_bytes", &nexar::Tuning::broadcast_chain_bytes,
                     "broadcast chain threshold.")
      .def_readwrite("collective_eager_bytes", &nexar::Tuning::collective_eager_bytes,
                     "Collective eager limit.")
      .def_readwrite("impair", &nexar::Tuning::impair, "Fault injection (tests only).")
      .def("__repr__", [](const nexar::Tuning& t) {
        return "<nexar.Tuning segment_bytes=" + std::to_string(t.segment_bytes) +
               " allreduce_ring_bytes=" + std::to_string(t.allreduce_ring_bytes) +
               " allreduce_doubling_bytes=" + std::to_string(t.allreduce_doubling_bytes) +
               " broadcast_chain_bytes=" + std::to_string(t.broadcast_chain_bytes) +
               " collective_eager_bytes=" + std::to_string(t.collective_eager_bytes) + " impair='" +
               t.impair + "'>";
      });
  py::class_<nexar::Config> cfg(
      m, "Config",
      "Every nexar setting (docs/CONFIG.md). Config() has the defaults, Config.from_env() "
      "applies the NEXAR_* environment; keyword arguments set fields. Durations read as "
      "datetime.timedelta and accept seconds or a timedelta; topology is NEXAR_TOPOLOGY's "
      "text.");
  cfg.def(py::init(&with_fields<nexar::Config>), "Config(**fields): the defaults, with the given fields set.")
      .def_static("from_env", &nexar::Config::from_env,
                  "The defaults overridden by NEXAR_* variables (errors name a bad one).")
      .def("validate", &nexar::Config::validate, "Raises nexar.InvalidArgumentError if a value "
                                                 "is out of range.")
      .def("describe", py::overload_cast<bool>(&nexar::Config::describe, py::const_),
           py::arg("all") = true,
           "One line per setting, 'name = value'; all=False: only the settings that differ "
           "from the defaults.")
      .def("__repr__", [](const nexar::Config& c) { return "<nexar.Config\n" + c.describe() + ">"; })
      .def_readwrite("on_failure", &nexar::Config::on_failure, "nexar.FailurePolicy")
      .def_readwrite("rpc_threads", &nexar::Config::rpc_threads, "Most RPC handlers at once.")
      .def_readwrite("recorder_ops", &nexar::Config::recorder_ops,
                     "Collectives each communicator's flight recorder keeps.")
      .def_readwrite("trace", &nexar::Config::trace,
                     "Directory for each rank's Chrome trace (tools/trace/nexar-trace merges them); '' none.")
      .def_readwrite("max_frame_bytes", &nexar::Config::max_frame_bytes, "Largest frame.")
      .def_readwrite("eager_limit", &nexar::Config::eager_limit, "Eager message limit, bytes.")
      .def_readwrite("unexpected_limit", &nexar::Config::unexpected_limit,
                     "Unexpected-message buffer per peer and lane, bytes.")
      .def_readwrite("stream_window", &nexar::Config::stream_window, "QUIC stream window.")
      .def_readwrite("udp_payload", &nexar::Config::udp_payload, "UDP payload (0: automatic).")
      .def_readwrite("udp_gso", &nexar::Config::udp_gso, "Use UDP GSO/GRO.")
      .def_readwrite("bulk_scavenger", &nexar::Config::bulk_scavenger,
                     "Bulk lane under a delay-based window (yields to the other lanes).")
      .def_readwrite("congestion", &nexar::Config::congestion, "nexar.Congestion")
      .def_readwrite("link", &nexar::Config::link, "nexar.LinkKind")
      .def_readwrite("tcp_cipher", &nexar::Config::tcp_cipher, "nexar.TcpCipher")
      .def_readwrite("connections_per_peer", &nexar::Config::connections_per_peer,
                     "QUIC connections between two ranks of different hosts (collectives take turns).")
      .def_readwrite("engine_threads", &nexar::Config::engine_threads,
                     "Threads that encrypt and move packets (extra connections spread over them).")
      .def_readwrite("shm", &nexar::Config::shm, "Shared memory between ranks of one host.")
      .def_readwrite("shm_ring_bytes", &nexar::Config::shm_ring_bytes,
                     "Bytes of each shared-memory ring (a power of two).")
      .def_readwrite("shm_collective_bytes", &nexar::Config::shm_collective_bytes,
                     "Collectives up to this many bytes per rank go through shared-memory "
                     "mailboxes (0: never).")
      .def_readwrite("lazy_connect", &nexar::Config::lazy_connect,
                     "Open a full mesh's connections on first use instead of at start.")
      .def_readwrite("relay_hop_limit", &nexar::Config::relay_hop_limit,
                     "Most hops a relayed message may take (0: the topology's diameter + 4).")
      .def_readwrite("relay_window", &nexar::Config::relay_window,
                     "Bytes in flight to one relayed rank per lane.")
      .def_readwrite("yield_when_idle", &nexar::Config::yield_when_idle,
                     "Yield the core while spinning (oversubscribed hosts).")
      .def_readwrite("tuning", &nexar::Config::tuning,
                     "nexar.Tuning: algorithm thresholds and fault injection, outside the stable "
                     "API; cfg.tuning.segment_bytes = ... changes this Config's.")
      .def_readwrite("log_level", &nexar::Config::log_level, "nexar.LogLevel");
  def_ms<&nexar::Config::op_timeout>(cfg, "op_timeout", "Deadline of blocking calls.");
  def_ms<&nexar::Config::connect_timeout>(cfg, "connect_timeout", "Connection set-up deadline.");
  def_ms<&nexar::Config::idle_timeout>(cfg, "idle_timeout", "QUIC idle timeout.");
  def_ms<&nexar::Config::failure_timeout>(cfg, "failure_timeout",
                                          "Silence after which a peer is declared failed.");
  def_ms<&nexar::Config::rpc_timeout>(cfg, "rpc_timeout", "Default RPC deadline.");
  def_ms<&nexar::Config::stall_warn>(cfg, "stall_warn",
                                     "Wait after which a collective is reported as stalled; 0: off.");
  // The text NEXAR_TOPOLOGY takes: parse() errors name the setting and the text.
  cfg.def_property(
      "topology", [](const nexar::Config& c) { return c.topology.to_string(); },
      [](nexar::Config& c, const std::string& text) { c.topology = nexar::Topology::parse(text); },
      "Which ranks connect directly: 'full_mesh', 'k_regular:K' or 'hypercube'.");
  cfg.def_property(
      "spin", [](const nexar::Config& c) { return c.spin; },
      [](nexar::Config& c, py::handle v) {
        const double seconds = py::hasattr(v, "total_seconds") ? v.attr("total_seconds")().cast<double>()
                                                         : v.cast<double>();
        if (!(seconds >= 0) || seconds > 10.0) invalid("spin must be between 0 and 10 s");
        c.spin = microseconds(static_cast<std::int64_t>(seconds * 1e6 + 0.5));
      },
      "How long a waiting thread spins before sleeping.");

  m.def(
      "bootstrap_local",
      [](int n, std::optional<nexar::Config> config) {
        const nexar::Config c = config_or_env(config);
        std::vector<nexar::Communicator> comms;
        {
          py::gil_scoped_release r;
          comms = nexar::bootstrap_local(n, c);
        }
        py::list out;
        for (auto& comm : comms) out.append(wrap(std::move(comm)));
        return out;
      },
      py::arg("n"), py::arg("config") = py::none(),
      "Creates n communicators in this process (ranks 0..n-1), connected over real QUIC on "
      "127.0.0.1: for tests and single-process programs. Run each rank on a thread of its "
      "own: collectives need every rank to call them.");

  m.def(
      "join_from_env",
      [](std::optional<nexar::Config> config) {
        const nexar::Config c = config_or_env(config);
        nexar::Communicator comm;
        {
          py::gil_scoped_release r;
          comm = nexar::join_from_env(c);
        }
        return wrap(std::move(comm));
      },
      py::arg("config") = py::none(),
      "Joins the cluster the environment describes (nexar-run, torchrun, mpirun, srun; "
      "docs/CONFIG.md) and returns this process's world communicator.");

  m.def(
      "join",
      [](const std::string& seed, const std::string& token, int rank, int world,
         const std::string& fingerprint, const std::string& ca_pem, const std::string& bind,
         const std::string& advertise, const std::string& ifname, py::handle join_timeout,
         std::optional<nexar::Config> config) {
        nexar::JoinOptions o;
        o.seed = seed;
        o.token = token;
        o.rank = rank;
        o.world = world;
        o.seed_fingerprint = fingerprint;
        o.seed_ca_pem = ca_pem;
        o.bind = bind;
        o.advertise = advertise;
        o.ifname = ifname;
        if (auto t = to_ms(join_timeout, "join_timeout")) o.join_timeout = *t;
        const nexar::Config c = config_or_env(config);
        nexar::Communicator comm;
        {
          py::gil_scoped_release r;
          comm = nexar::join(o, c);
        }
        return wrap(std::move(comm));
      },
      py::arg("seed"), py::arg("token"), py::kw_only(), py::arg("rank") = -1,
      py::arg("world") = 0, py::arg("seed_fingerprint") = "", py::arg("seed_ca_pem") = "",
      py::arg("bind") = "", py::arg("advertise") = "", py::arg("ifname") = "",
      py::arg("join_timeout") = py::none(), py::arg("config") = py::none(),
      "Joins a cluster through its seed ('host:port') with the cluster token; rank -1 takes "
      "the lowest free one, world 0 accepts any size (nexar::JoinOptions).");

  m.def("launched_from_env", &nexar::launched_from_env,
        "True when the environment describes one rank of a launched cluster.");
  m.def("token_from_env", &nexar::token_from_env,
        "The cluster token from NEXAR_CLUSTER_TOKEN or NEXAR_CLUSTER_TOKEN_FILE, or ''.");
  m.def("read_token_file", &nexar::read_token_file, py::arg("path"),
        "The cluster token in a file (trailing white space stripped).");

  py::class_<PySeed>(m, "Seed",
                     "A seed node (the library form of nexar-seed): admits workers, signs "
                     "their certificates and hands out ranks, then leaves the data path.")
      .def(py::init([](const std::string& listen, int world, int min_world,
                       py::handle formation_timeout, const std::string& token,
                       const std::string& cluster, bool elastic,
                       std::optional<nexar::Config> config) {
             nexar::SeedOptions o;
             o.listen = listen;
             o.world = world;
             o.min_world = min_world;
             if (auto t = to_ms(formation_timeout, "formation_timeout")) o.formation_timeout = *t;
             o.token = token;
             o.cluster = cluster;
             o.elastic = elastic;
             const nexar::Config c = config_or_env(config);
             auto s = std::make_unique<PySeed>();
             {
               py::gil_scoped_release r;
               s->seed = std::make_unique<nexar::Seed>(o, c);
             }
             return s;
           }),
           py::arg("listen") = "0.0.0.0:29400", py::arg("world") = 0, py::kw_only(),
           py::arg("min_world") = 0, py::arg("formation_timeout") = py::none(),
           py::arg("token") = "", py::arg("cluster") = "", py::arg("elastic") = false,
           py::arg("config") = py::none())
      .def_property_readonly("address", [](const PySeed& s) { return s.get().address(); },
                             "The address actually bound, 'ip:port'.")
      .def_property_readonly("token", [](const PySeed& s) { return s.get().token(); },
                             "The cluster token.")
      .def_property_readonly("fingerprint", [](const PySeed& s) { return s.get().fingerprint(); },
                             "'sha256:...' of the seed's certificate.")
      .def_property_readonly("ca_pem", [](const PySeed& s) { return s.get().ca_pem(); },
                             "The cluster CA certificate (PEM).")
      .def_property_readonly("cluster", [](const PySeed& s) { return s.get().cluster(); },
                             "The cluster name.")
      .def(
          "wait",
          [](const PySeed& s, py::handle timeout) {
            const auto t = to_ms(timeout, "Seed.wait: timeout").value_or(milliseconds::max());
            py::gil_scoped_release r;
            return s.get().wait(t);
          },
          py::arg("timeout") = py::none(),
          "Blocks until the cluster formed; returns the world size.")
      .def(
          "stop",
          [](PySeed& s) {
            py::gil_scoped_release r;
            s.seed.reset();
          },
          "Stops the seed (idempotent).")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PySeed& s, py::args) {
        py::gil_scoped_release r;
        s.seed.reset();
      });
}

}  // namespace nexar_py
