// The stall watchdog of one node: the communicators of the node register their flight
// recorders and their pending sends and receives here. A thread looks at them every quarter
// of Config::stall_warn, clamped to between 10 ms and 1 s (so every second at the default
// 10 s). A collective that has waited longer than stall_warn is reported once: the watchdog
// asks every other member of its communicator, over RPC, how far it has got (kStallQuery),
// waits at most a second for the answers, and logs one line at warn level naming the
// members that have not called the collective, with their last completed number and what
// each is doing. The recorder keeps the line, so the collective's timeout error carries it
// too. A send or receive that has waited as long is reported the same way, asking its peer
// (every member, for a receive from any rank), and its timeout error carries the line.
// Collectives are found through the recorder: with Config::recorder_ops 0 only sends and
// receives are reported. The same object answers the members' questions about this node
// (answer()). With stall_warn 0 no thread runs, and the node still answers.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "comm/pending_p2p.hpp"
#include "comm/recorder.hpp"

namespace nexar::detail {

class Rpc;

/// The RPC function a stall query calls: beyond RpcId's 32 bits, so no application handler
/// can take it (docs/PROTOCOL.md, "Stall queries").
inline constexpr std::uint64_t kStallQuery = std::uint64_t{1} << 32;

class Watchdog {
 public:
  using Clock = std::chrono::steady_clock;

  /// A communicator as the watchdog sees it.
  struct Comm {
    std::uint64_t id;
    int rank;                   // ours, in the communicator
    std::vector<int> members;   // world ranks, by communicator rank
    std::shared_ptr<Recorder> recorder;
    std::shared_ptr<PendingP2p> p2p;
    /// Revokes the communicator with `why` on every member (members in the same stalled
    /// collective called it differently).
    std::function<void(const std::string& why)> revoke;
  };

  /// Watches for `rpc`'s node; no thread when `stall_warn` is 0.
  Watchdog(std::chrono::milliseconds stall_warn, std::weak_ptr<Rpc> rpc);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  void add(std::shared_ptr<const Comm> c);
  void remove(std::uint64_t id);

  /// The reply to a stall query about `r`'s communicator with arguments `args`: how far
  /// this rank has got there, the fingerprint of its call of the collective the asker
  /// names (8 bytes of `args`), and what this node is doing (docs/PROTOCOL.md, "Stall
  /// queries").
  std::vector<std::byte> answer(const Recorder& r, std::span<const std::byte> args) const;
  /// This node's part of a dump (comm/dump_signal.hpp): its world rank, what it is doing,
  /// and each communicator's recorder (Recorder::json) with its pending sends and receives.
  std::string dump() const;
  /// What this node is doing: its oldest collective, send or receive in flight ("in
  /// all_reduce #5 (f32, 8 elements, sum) of communicator 0x0 for 3.1 s"), or "in no
  /// operation".
  std::string doing(Clock::time_point now) const;

  /// One member's reply, or why there is none.
  struct Answer {
    bool ok = false;
    std::uint64_t called = 0, completed = 0;
    std::string doing;  // or, when !ok, why no answer came
    std::uint16_t check = 0;  // its call of the collective asked about; 0: none recorded
  };
  static Answer decode(std::span<const std::byte> reply);
  /// The report line about collective `op` (ours, open) of `c`, from the members' answers
  /// (by communicator rank; ours is ignored).
  static std::string report(const Comm& c, const OpRecord& op, Clock::time_point now,
                            const std::vector<std::optional<Answer>>& answers);
  /// The report line about send or receive `op` of `c`, from the answers of the ranks
  /// asked (the peer, or every member for a receive from any rank; the others' are empty).
  static std::string report(const Comm& c, const PendingP2p::Op& op, Clock::time_point now,
                            const std::vector<std::optional<Answer>>& answers);

 private:
  /// The communicators registered now.
  std::vector<std::shared_ptr<const Comm>> registered() const;
  void run();
  /// Reports the collectives that waited longer than stall_warn_ (the watchdog's thread).
  void look(Clock::time_point now);

  const std::chrono::milliseconds stall_warn_;
  const std::weak_ptr<Rpc> rpc_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::map<std::uint64_t, std::shared_ptr<const Comm>> comms_;
  std::thread thread_;
};

/// "all_reduce #5 (f32, 1000 elements, sum)": a recorded call as reports name it.
std::string describe(const OpRecord& r);

}  // namespace nexar::detail
