// A node's side of the shared-memory path (docs/ARCHITECTURE.md, "Shared memory"): its
// doorbell, the listener that hands out segments, and the attach attempts in flight. Of
// each pair of ranks, the lower one offers its memory when their connection is up; the
// higher one, if it finds the same host key in the offer, attaches on the hub's attach
// thread (one per node, attaches one after another: a rank of a full mesh on a host of
// hundreds of ranks must not hold a thread per peer) and both then move their message
// lanes over (Peer::attach_shm). Anything that fails
// before the segment changed hands leaves the pair on QUIC.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "core/job_thread.hpp"
#include "shm/attach.hpp"
#include "shm/doorbell.hpp"

namespace nexar::detail {

class Node;
class Peer;

class ShmHub {
 public:
  /// Throws nexar::Error(Errc::io) when the doorbell cannot be made.
  explicit ShmHub(Node& node);
  /// Stops the listener and the attach thread (after the engine stopped); attaches not
  /// begun are dropped.
  ~ShmHub();
  ShmHub(const ShmHub&) = delete;
  ShmHub& operator=(const ShmHub&) = delete;

  shm::Doorbell& doorbell() noexcept { return bell_; }
  /// `p`'s connection is up: offers our memory if we are the lower rank (engine thread).
  void offer(Peer& p);
  /// Sends `p` an empty shm_offer: from the lower rank, "none from me"; from the higher, "I
  /// decline yours" (engine thread). Settles `p`'s question on this side.
  static void say_no(Node& node, Peer& p);
  /// The higher rank `p` declined our offer: forget it (engine thread).
  void declined(Peer& p);
  /// `p` offered its memory (`payload` of its shm_offer frame): attaches on the attach
  /// thread if it runs on this host (engine thread).
  void on_offer(Peer& p, std::string_view payload);
  /// Attach requests refused so far (wrong user, unknown rank, bad proof).
  std::uint64_t refused() const noexcept { return listener_ ? listener_->refused() : 0; }

 private:
  std::optional<shm::Listener::Answer> serve(std::uint32_t rank, const shm::Proof& proof, int doorbell);

  /// Whether the next segment is populated at once (Segment::create): for this node's first
  /// kPopulated pairs only, so that a host with very many ranks does not commit six rings
  /// for every pair up front (pairs beyond that fault their pages in as they use them).
  bool populate_next() noexcept { return segments_.fetch_add(1, std::memory_order_relaxed) < kPopulated; }
  static constexpr int kPopulated = 16;

  Node& node_;
  std::atomic<int> segments_{0};
  shm::Doorbell bell_;
  const std::string host_key_;
  std::unique_ptr<shm::Listener> listener_;  // made at the first offer
  std::mutex mu_;                            // offered_, with the listener's thread
  std::map<std::uint32_t, shm::Proof> offered_;
  JobThread attacher_{"nexar-shm-join"};
};

}  // namespace nexar::detail
