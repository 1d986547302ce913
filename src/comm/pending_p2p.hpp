// The point-to-point operations of one communicator still in flight on this rank, for the
// stall watchdog: a receive waiting for its message, or a send waiting for its receiver
// (a rendezvous send; an eager one is done when it returns). Adding one costs a lock and a
// push; finished ones are dropped as the list grows and whenever the watchdog looks.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/op_state.hpp"

namespace nexar::detail {

class PendingP2p {
 public:
  using Clock = std::chrono::steady_clock;

  struct Op {
    std::shared_ptr<OpState> state;  // posted at state->start()
    bool sending;
    int peer;  // in the communicator; any_source (-1) for a receive from anyone
    int tag;   // any_tag (-1) for a receive of any tag
    std::uint64_t bytes;  // sent, or room to receive
    bool reported = false;
  };

  /// Tracks `op` until it completes.
  void add(Op op);
  /// The operations open for `age` or longer and not reported yet, now marked reported.
  std::vector<Op> stalled(Clock::time_point now, Clock::duration age);
  /// The oldest open operation, if any.
  std::optional<Op> oldest();
  /// Every open operation, oldest first.
  std::vector<Op> open();

 private:
  void drop_finished();  // mu_ held

  std::mutex mu_;
  std::deque<Op> ops_;
  std::size_t prune_at_ = 64;
};

/// "recv from rank 3 (tag 5, up to 4096 bytes)", "send to rank 1 (tag 0, 1048576 bytes)".
std::string describe(const PendingP2p::Op& op);

}  // namespace nexar::detail
