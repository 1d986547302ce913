// What the transport hands to the membership module above it (src/membership): the agree
// and decided frames of the control lane, and each world rank declared failed. The module
// sends through Node::send_ballot, so the transport knows nothing of agreements.
#pragma once

#include <cstdint>
#include <string>

#include "wire/ballot.hpp"
#include "wire/frame.hpp"

namespace nexar::detail {

class MembershipLanes {
 public:
  /// An agree or decided frame from world rank `src` (`h` says which, with the communicator
  /// and the agreement's number). Engine lock held: never block.
  virtual void on_ballot(int src, const wire::FrameHeader& h, wire::Ballot b) = 0;
  /// World rank `r` was declared failed (here or by a peer). Engine lock held.
  virtual void on_rank_failed(int r) = 0;
  /// World rank `r`'s connection ended without it being declared failed (it closed, or said
  /// goodbye): it will contribute to no agreement any more. Engine lock held.
  virtual void on_rank_left(int r, const std::string& why) = 0;
  /// The other ranks declared this one failed. Engine lock held.
  virtual void on_expelled(const std::string& why) = 0;
  /// The node is closing: agreements still waiting fail with Errc::closed. Engine lock held.
  virtual void on_close() = 0;

 protected:
  ~MembershipLanes() = default;
};

}  // namespace nexar::detail
