// A node's side of the shared-memory path (docs/ARCHITECTURE.md, "Shared memory"): its
// doorbell, the listener that hands out segments, and the attach attempts in flight. Of
// each pair of ranks, the lower one offers its memory when their connection is up; the
// higher one, if it finds the same host key in the offer, attaches on a thread of its own
// and both then move their message lanes over (Peer::attach_shm). Anything that fails
// before the segment changed hands leaves the pair on QUIC.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "shm/attach.hpp"
#include "shm/doorbell.hpp"

namespace nexar::detail {

class Node;
class Peer;

class ShmHub {
 public:
  /// Throws nexar::Error(Errc::io) when the doorbell cannot be made.
  explicit ShmHub(Node& node);
  /// Stops the listener and joins the attach threads (after the engine stopped).
  ~ShmHub();
  ShmHub(const ShmHub&) = delete;
  ShmHub& operator=(const ShmHub&) = delete;

  shm::Doorbell& doorbell() noexcept { return bell_; }
  /// `p`'s connection is up: offers our memory if we are the lower rank (engine thread).
  void offer(Peer& p);
  /// `p` offered its memory (`payload` of its shm_offer frame): attaches on a thread if
  /// it runs on this host (engine thread).
  void on_offer(Peer& p, std::string_view payload);
  /// Attach requests refused so far (wrong user, unknown rank, bad proof).
  std::uint64_t refused() const noexcept { return listener_ ? listener_->refused() : 0; }

 private:
  std::optional<shm::Listener::Answer> serve(std::uint32_t rank, const shm::Proof& proof, int doorbell);

  Node& node_;
  shm::Doorbell bell_;
  const std::string host_key_;
  std::unique_ptr<shm::Listener> listener_;  // made at the first offer
  std::mutex mu_;                            // offered_, with the listener's thread
  std::map<std::uint32_t, shm::Proof> offered_;
  std::vector<std::thread> threads_;
};

}  // namespace nexar::detail
