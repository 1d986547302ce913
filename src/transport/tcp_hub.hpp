// A node's side of the TCP link (Config::link = tcp; docs/ARCHITECTURE.md, "The TCP
// link"): its listener, its standing offers, and the thread that dials. Of each pair that
// settled without shared memory, the higher rank offers its port on the control lane (a
// tcp_offer frame); the lower rank, if it wants the same link and cipher, dials one
// connection per message lane on the dial thread, and both then move those lanes over
// (Peer::attach_tcp). A pair whose ranks disagree stays on QUIC, and says why at info
// level. Anything that fails before a connection attached leaves its lane on QUIC.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "core/job_thread.hpp"
#include "transport/tcp_attach.hpp"

namespace nexar::detail {

class Node;
class Peer;

class TcpHub {
 public:
  explicit TcpHub(Node& node);
  /// Stops the listener and the dial thread (after the engine stopped).
  ~TcpHub();
  TcpHub(const TcpHub&) = delete;
  TcpHub& operator=(const TcpHub&) = delete;

  /// `p` settled without shared memory and we are the higher rank: offers our port
  /// (engine thread). A failure to listen leaves the pair on QUIC, logged.
  void offer(Peer& p);
  /// `p` answered with a tcp_offer frame (engine thread): `port` 0 declines ours; any
  /// other is its own offer, dialled if its `cipher` is ours.
  void on_offer(Peer& p, std::uint16_t port, std::uint64_t cipher);
  /// Reads what waits on every peer's TCP link (engine lock held): a user thread waiting
  /// for a reply polls here, as it polls QUIC's socket (Node::poll).
  void poll();
  /// Attach attempts refused by the listener (tests, logs).
  std::uint64_t refused() const noexcept { return listener_ ? listener_->refused() : 0; }
  /// The listener's port (0 before the first offer).
  std::uint16_t port() const noexcept { return listener_ ? listener_->port() : 0; }

 private:
  /// Sends `p` a tcp_offer for `port` (0: none).
  void send_offer(Peer& p, std::uint16_t port);
  /// Hands an attached connection to its peer, on the engine thread.
  void hand_over(TcpAttached a);
  TcpKeys keys_of(Peer& p) const;

  Node& node_;
  std::unique_ptr<TcpListener> listener_;  // made at the first offer
  std::mutex mu_;                          // offers_, with the listener's thread
  struct Offer {
    TcpKeys keys;
    unsigned taken = 0;  // bit i: lane index i attached
  };
  std::map<std::uint32_t, Offer> offers_;
  /// The offer to `rank` if it still stands for `lane` (not taken yet); mu_ held.
  Offer* standing(std::uint32_t rank, wire::Lane lane);
  std::vector<int> linked_;  // ranks with a TCP connection attached (engine thread)
  JobThread dialer_{"nexar-tcp-dial"};
};

}  // namespace nexar::detail
