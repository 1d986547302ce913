#include "collective/hierarchy.hpp"

#include <algorithm>
#include <map>
#include <stdexcept>

#include <nexar/error.hpp>

namespace nexar::detail::coll {

bool Hierarchy::useful() const noexcept {
  // Some host has several ranks exactly when there are fewer hosts than ranks; the
  // caller's host is one of them, but any will do: every rank decides the same.
  return leaders.size() > 1 && leaders.size() < total;
}

Hierarchy hierarchy(const Coll& c) {
  CollectivePort& p = c.port;
  if (!p.hosts()) {
    // Learn every rank's host once: each sends its id to every other (n - 1 messages of
    // 8 bytes each way, once per communicator).
    const int n = c.size(), r = c.rank();
    std::vector<std::uint64_t> ids(static_cast<std::size_t>(n));
    ids[static_cast<std::size_t>(r)] = p.host_id();
    Requests reqs;
    for (int q = 0; q < n; ++q) {
      if (q == r) continue;
      reqs.push_back(c.irecv(q, &ids[static_cast<std::size_t>(q)], sizeof(std::uint64_t)));
      reqs.push_back(c.isend(q, &ids[static_cast<std::size_t>(r)], sizeof(std::uint64_t)));
    }
    Coll::wait_all(reqs);
    p.set_hosts(std::move(ids));
  }
  const std::vector<std::uint64_t>& ids = *p.hosts();
  Hierarchy h;
  h.total = ids.size();
  std::map<std::uint64_t, int> leader_of;
  for (std::size_t q = 0; q < ids.size(); ++q) {
    auto [it, fresh] = leader_of.emplace(ids[q], static_cast<int>(q));
    if (fresh) h.leaders.push_back(static_cast<int>(q));
    if (ids[q] == ids[static_cast<std::size_t>(c.rank())]) h.locals.push_back(static_cast<int>(q));
  }
  return h;
}

SubPort::SubPort(CollectivePort& parent, std::vector<int> members) : parent_(parent), members_(std::move(members)) {
  const auto it = std::find(members_.begin(), members_.end(), parent.rank());
  if (it == members_.end()) throw std::logic_error("SubPort without the calling rank");
  rank_ = static_cast<int>(it - members_.begin());
}

Request SubPort::isend(const char* op, std::int64_t tag, Clock::time_point deadline, int to, const void* data,
                       std::size_t bytes) {
  return parent_.isend(op, tag, deadline, members_[static_cast<std::size_t>(to)], data, bytes);
}

Request SubPort::irecv(const char* op, std::int64_t tag, Clock::time_point deadline, int from, void* data,
                       std::size_t bytes) {
  return parent_.irecv(op, tag, deadline, members_[static_cast<std::size_t>(from)], data, bytes);
}

Request SubPort::start(const char*, const CollectiveOptions&, DataType, ReduceOp, std::function<void(const Coll&)>) {
  // A view for steps of a running collective, never a communicator of its own.
  throw std::logic_error("SubPort::start");
}

}  // namespace nexar::detail::coll
