// nexar-relay's event loop: a bidirectional UDP proxy that holds every datagram for a delay
// (plus jitter) before passing it on.
//
// Clients send to the listening socket. For each distinct client address the relay opens
// a socket of its own connected to the target, so the target's replies arrive on that socket
// and tell which client they are for; they go back to the client from the listening socket,
// the address the client sent to (a QUIC endpoint drops packets from any other). Both
// directions are delayed. Nothing is fragmented on the way out: a datagram larger than the
// outgoing MTU is dropped, as a router drops a don't-fragment packet.
//
// One thread: epoll over the sockets, a timerfd armed (CLOCK_MONOTONIC, absolute) at the
// earliest release time, and a signalfd for SIGINT/SIGTERM. Datagrams are read and written in
// batches (recvmmsg/sendmmsg) and copied once, into a DelayLine per direction.
#pragma once

#include <sys/socket.h>
#include <sys/uio.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <unordered_map>
#include <vector>

#include "address.hpp"
#include "delay_line.hpp"

namespace nexar_relay {

struct RelayOptions {
  Address listen;
  Address target;
  std::int64_t delay_ns = 0;   // each direction
  std::int64_t jitter_ns = 0;  // uniform extra 0..jitter_ns per datagram
  /// false: a datagram of one direction of one client is never released before the one
  /// that arrived before it (jitter delays, never reorders); true: each has its own time.
  bool reorder = false;
  double loss = 0;                       // fraction dropped at random, each direction
  std::size_t queue_bytes = 8u << 20;    // ring of each direction
  std::uint64_t seed = 1;
  std::int64_t idle_timeout_ns = 60'000'000'000;  // forget idle clients; 0: never
};

/// What one direction did.
struct DirectionStats {
  std::uint64_t datagrams = 0;  // forwarded
  std::uint64_t bytes = 0;
  std::uint64_t dropped_queue = 0;  // the ring was full
  std::uint64_t dropped_loss = 0;   // --loss
  std::uint64_t dropped_error = 0;  // the send failed (the target is not listening yet, or
                                    // the datagram is larger than the MTU of the way out)
};

class Relay {
 public:
  /// Binds the listening socket and sets up the loop. Throws std::system_error.
  explicit Relay(const RelayOptions& options);
  ~Relay();
  Relay(const Relay&) = delete;
  Relay& operator=(const Relay&) = delete;

  /// The listening socket's address (its port when --listen gave port 0).
  const Address& listening() const { return listening_; }

  /// Relays until SIGINT or SIGTERM arrives (the caller blocks both first); returns it.
  int run();

  static constexpr std::size_t kToTarget = 0;
  static constexpr std::size_t kToClient = 1;
  const DirectionStats& stats(std::size_t direction) const { return stats_[direction]; }
  std::uint64_t clients_seen() const { return clients_seen_; }

 private:
  struct Client {
    int fd = -1;  // connected to the target
    Address addr;
    std::int64_t last_active_ns = 0;
    std::array<std::int64_t, 2> last_due_ns{};  // per direction, for in-order release
    std::uint32_t held = 0;                      // datagrams of it in either DelayLine
  };
  static constexpr std::size_t kBatch = 32;
  static constexpr std::size_t kMaxDatagram = 65536;

  void receive_from_clients();
  void receive_from_target(std::uint32_t client);
  void hold(std::size_t direction, std::uint32_t client, const std::uint8_t* data, std::size_t len, std::int64_t now);
  void release_due(std::size_t direction, std::int64_t now);
  void block(std::size_t direction, int fd, std::uint64_t epoll_tag);
  void unblock(int fd);
  std::uint32_t client_for(const sockaddr_storage& from, socklen_t len, std::int64_t now);
  void forget_idle(std::int64_t now);
  void arm_timer(std::int64_t now);

  RelayOptions options_;
  Address listening_;
  int listen_fd_ = -1;
  int epoll_fd_ = -1;
  int timer_fd_ = -1;
  int signal_fd_ = -1;
  std::int64_t armed_ns_ = DelayLine::kNever;
  std::int64_t next_sweep_ns_ = 0;

  std::array<DelayLine, 2> lines_;
  std::array<DirectionStats, 2> stats_{};
  // A direction whose socket's send buffer was full waits for EPOLLOUT on blocked_fd_.
  std::array<int, 2> blocked_fd_{-1, -1};
  std::array<std::uint64_t, 2> blocked_tag_{};

  std::vector<Client> clients_;  // slots; fd < 0: free
  std::vector<std::uint32_t> free_slots_;
  std::unordered_map<AddressKey, std::uint32_t, AddressKeyHash> by_address_;
  std::uint64_t clients_seen_ = 0;

  std::mt19937_64 rng_;

  // Receive batch: kBatch buffers of kMaxDatagram bytes, reused for every read.
  std::unique_ptr<std::uint8_t[]> rx_buf_;
  std::array<mmsghdr, kBatch> rx_msgs_{};
  std::array<iovec, kBatch> rx_iov_{};
  std::array<sockaddr_storage, kBatch> rx_from_{};
  // Send batch: pointers into a DelayLine's ring.
  std::array<mmsghdr, kBatch> tx_msgs_{};
  std::array<iovec, kBatch> tx_iov_{};
  std::array<DelayLine::Held, kBatch> tx_held_{};
};

}  // namespace nexar_relay
