#include "collective/hierarchy.hpp"

#include <algorithm>
#include <map>
#include <stdexcept>

#include <nexar/error.hpp>

#include "collective/algorithms.hpp"

namespace nexar::detail::coll {

bool Hierarchy::useful() const noexcept {
  // Some host has several ranks exactly when there are fewer hosts than ranks; the
  // caller's host is one of them, but any will do: every rank decides the same.
  return leaders.size() > 1 && leaders.size() < total;
}

Hierarchy hierarchy(const Coll& c) {
  CollectivePort& p = c.port;
  if (!p.hosts()) {
    // Learn every rank's host once per communicator: an all_gather of the 8-byte ids.
    std::vector<std::uint64_t> ids(static_cast<std::size_t>(c.size()));
    const std::uint64_t mine = p.host_id();
    Coll g = c;
    g.dtype = DataType::u64;
    g.algorithm = Algorithm::automatic;
    all_gather(g, &mine, ids.data(), 1);
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

Request SubPort::start(const char*, const CollectiveOptions&, DataType, ReduceOp, CallShape,
                       std::function<void(const Coll&)>) {
  // A view for steps of a running collective, never a communicator of its own.
  throw std::logic_error("SubPort::start");
}

}  // namespace nexar::detail::coll
