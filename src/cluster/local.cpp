#include "cluster/local.hpp"

#include <nexar/cluster.hpp>

#include <gnutls/crypto.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <exception>
#include <future>
#include <thread>

#include "cluster/relay_keys.hpp"
#include "core/access.hpp"
#include "core/log.hpp"
#include "quic/udp_socket.hpp"
#include "tls/ca.hpp"
#include "tls/node_key.hpp"
#include "comm/communicator_impl.hpp"
#include "transport/node.hpp"

namespace nexar::cluster {
namespace {

// The node name of rank `r` of a local cluster (its certificate's, and its relay keys').
std::string node_name(int r) { return "rank-" + std::to_string(r); }

}  // namespace

std::vector<NodePlan> plan_local(int n, const Config& config) {
  if (n < 1) throw Error(Errc::invalid_argument, "bootstrap_local: world size " + std::to_string(n) + " must be >= 1");
  config.validate();
  std::vector<NodePlan> plans(static_cast<std::size_t>(n));
  // A fresh random cluster name keeps two local clusters on one host from ever trusting
  // each other's certificates.
  unsigned char rnd[8];
  gnutls_rnd(GNUTLS_RND_NONCE, rnd, sizeof rnd);
  std::string cluster = "local-";
  for (unsigned char c : rnd) cluster += "0123456789abcdef"[c >> 4], cluster += "0123456789abcdef"[c & 15];
  auto ca = tls::ClusterCa::create(cluster);
  // The relay keys, as a seed derives them: each pair's once, into both rows.
  std::vector<std::string> names;
  for (int r = 0; r < n; ++r) names.push_back(node_name(r));
  const RelayMaster master = random_relay_master();
  for (auto& p : plans) p.relay_keys.resize(static_cast<std::size_t>(n));
  for (std::size_t a = 0; a < plans.size(); ++a) {
    for (std::size_t b = a + 1; b < plans.size(); ++b) {
      const detail::RelayKey k = relay_key(master, static_cast<int>(a), names[a], static_cast<int>(b), names[b]);
      plans[a].relay_keys[b] = k;
      plans[b].relay_keys[a] = k;
    }
  }
  std::vector<std::string> addrs;
  try {
    for (int r = 0; r < n; ++r) {
      auto& p = plans[static_cast<std::size_t>(r)];
      p.rank = r;
      p.world = n;
      p.creds = tls::issue_local(ca, node_name(r));
      p.udp_fd = quic::UdpSocket::open_bound(quic::Address::parse("127.0.0.1:0"));
      quic::Address a;
      a.len = sizeof a.storage;
      ::getsockname(p.udp_fd, a.sa(), &a.len);
      addrs.push_back(a.to_string());
    }
  } catch (...) {
    for (auto& p : plans)
      if (p.udp_fd >= 0) ::close(p.udp_fd);
    throw;
  }
  for (auto& p : plans) p.addrs = addrs;
  return plans;
}

void discard(std::vector<NodePlan>& plans, int keep_rank) {
  for (auto& p : plans) {
    if (p.rank != keep_rank && p.udp_fd >= 0) {
      ::close(p.udp_fd);
      p.udp_fd = -1;
    }
  }
}

void wait_politely(Config& config) {
  config.yield_when_idle = true;
  config.spin = std::chrono::milliseconds(1);
}

bool oversubscribed(int local_ranks, int local_cpus) {
  cpu_set_t set;
  int cores = 0;
  if (sched_getaffinity(0, sizeof set, &set) == 0) cores = CPU_COUNT(&set);
  if (cores <= 0) cores = static_cast<int>(std::thread::hardware_concurrency());
  return local_ranks > std::max({1, cores, local_cpus});
}

Communicator start_member(detail::NodeOptions o, const Config& config, const NodeStarted& started) {
  log::set_level(config.log_level);
  const int rank = o.rank;
  auto impl = std::make_shared<detail::Node>(std::move(o), config);
  if (rank == 0) log::info("effective config:\n{}", config.describe());
  auto comm = detail::CommunicatorImpl::world(impl);
  impl->start();
  if (started) started(*impl);
  return detail::Access::make_communicator(std::move(comm));
}

Communicator start_joiner(detail::NodeOptions o, const Config& config, const NodeStarted& started,
                          std::chrono::steady_clock::time_point until) {
  log::set_level(config.log_level);
  const int world_rank = o.rank;
  auto node = std::make_shared<detail::Node>(std::move(o), config);
  auto services = detail::CommunicatorImpl::attach(*node);
  node->start();
  if (started) started(*node);
  detail::Joiners::Welcome w;
  try {
    w = node->joiners().wait_welcome(until);
  } catch (...) {
    node->close();
    throw;
  }
  const auto at = std::find(w.members.begin(), w.members.end(), world_rank);
  const int rank = static_cast<int>(at - w.members.begin());
  log::info("join: world rank {} admitted as rank {} of {} (communicator {:#x})", world_rank, rank,
            w.members.size(), w.comm);
  auto comm = detail::CommunicatorImpl::make(node, services, w.comm, std::move(w.members), rank);
  comm->set_joined_by_grow();
  return detail::Access::make_communicator(std::move(comm));
}

detail::NodeOptions node_options(NodePlan plan) {
  detail::NodeOptions o;
  o.rank = plan.rank;
  o.world = plan.world;
  for (int r = 0; r < plan.world; ++r) o.names.push_back(node_name(r));
  for (auto& a : plan.addrs) o.addrs.push_back(quic::Address::parse(a));
  o.creds = std::move(plan.creds);
  o.udp_fd = plan.udp_fd;
  o.relay_keys = std::move(plan.relay_keys);
  return o;
}

Communicator start_node(NodePlan plan, const Config& config) {
  return start_member(node_options(std::move(plan)), config);
}

}  // namespace nexar::cluster

namespace nexar {

std::vector<Communicator> bootstrap_local(int n, const Config& given) {
  Config config = given;
  // More ranks than cores in one process: waiters that spin without yielding take the
  // cores from the threads they wait for.
  if (cluster::oversubscribed(n)) cluster::wait_politely(config);
  auto plans = cluster::plan_local(n, config);
  std::vector<std::future<Communicator>> started;
  for (auto& p : plans) {
    started.push_back(std::async(std::launch::async, [&config, plan = std::move(p)]() mutable {
      return cluster::start_node(std::move(plan), config);
    }));
  }
  std::vector<Communicator> comms;
  std::exception_ptr first;
  for (auto& f : started) {
    try {
      comms.push_back(f.get());
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) {
    for (auto& c : comms) c.close();
    std::rethrow_exception(first);
  }
  return comms;
}

}  // namespace nexar
