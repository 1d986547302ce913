// Which ranks of a communicator share a host, and a view of a subset of its ranks as a
// communicator of their own, for the hierarchical algorithms: work inside each host first
// (through shared memory), then among one leader per host (over the network).
#pragma once

#include <cstdint>
#include <vector>

#include "collective/context.hpp"

namespace nexar::detail::coll {

struct Hierarchy {
  std::vector<int> leaders;  ///< the lowest rank of each host, ascending
  std::vector<int> locals;   ///< the ranks of this rank's host, ascending (locals[0] leads)
  std::size_t total = 0;     ///< ranks in the communicator
  /// Several hosts, and some host with several ranks: the hierarchy saves network traffic.
  bool useful() const noexcept;
};

/// The hosts of `c`'s communicator. The first call on a communicator learns them: an
/// all_gather of every rank's host id within `c` (so every rank must make it in the
/// same collective, as automatic choices do); later calls answer from the port's memory.
Hierarchy hierarchy(const Coll& c);

/// The ranks `members` (ascending, this rank among them) of a communicator as a
/// communicator of their own: rank i is members[i]; messages keep the parent's tag.
class SubPort final : public CollectivePort {
 public:
  SubPort(CollectivePort& parent, std::vector<int> members);
  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return static_cast<int>(members_.size()); }
  const Config& config() const noexcept override { return parent_.config(); }
  Request isend(const char* op, std::int64_t tag, Clock::time_point deadline, int to, const void* data,
                std::size_t bytes) override;
  Request irecv(const char* op, std::int64_t tag, Clock::time_point deadline, int from, void* data,
                std::size_t bytes) override;
  std::byte* scratch(int slot, std::size_t bytes) override { return parent_.scratch(slot, bytes); }
  std::uint64_t host_id() const noexcept override { return parent_.host_id(); }
  const std::vector<std::uint64_t>* hosts() const noexcept override { return nullptr; }
  bool tracing() const noexcept override { return parent_.tracing(); }
  void step(const char* name, Clock::time_point from, Clock::time_point to) noexcept override {
    parent_.step(name, from, to);
  }
  void set_hosts(std::vector<std::uint64_t>) override {}
  Request start(const char* name, const CollectiveOptions& o, DataType t, ReduceOp op, CallShape shape,
                std::function<void(const Coll&)> body) override;

 private:
  CollectivePort& parent_;
  std::vector<int> members_;
  int rank_ = -1;
};

}  // namespace nexar::detail::coll
