// How two ranks of one host set up their shared memory, after each has proven who it is
// over their authenticated QUIC connection (docs/SECURITY.md, "Shared memory"):
//
//  1. The offering rank listens on an abstract Unix socket under a random name and sends
//     that name, with its host key, over the QUIC connection (a shm_offer frame).
//  2. The other rank, if its host key is the same, connects and sends its rank, a proof
//     (keying material exported from the TLS session of that QUIC connection, which only
//     the two ends hold) and its doorbell's descriptor.
//  3. The listener checks the connecting process's credentials (SO_PEERCRED: the same
//     user) and the proof, and answers with the segment's memfd and its own doorbell.
//  4. The attaching rank maps the segment and confirms with one byte. Only a confirmed
//     attach moves lanes, on either side: a segment that failed to map on one side never
//     carries a message.
//
// Both sides run these blocking steps on threads of their own, never on the engine.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <thread>

namespace nexar::shm {

/// Ranks with equal keys can share memory: the same kernel boot, the same network
/// namespace (abstract Unix sockets live there) and the same user.
std::string host_key();

using Proof = std::array<std::uint8_t, 32>;
/// Compares two proofs without an early exit, so timing does not tell how much of a
/// guess was right.
bool same_proof(const Proof& a, const Proof& b) noexcept;

/// Serves attach requests on an abstract Unix socket with a random name.
class Listener {
 public:
  /// An accepted request's answer: descriptors sent (duplicated; they stay the callee's),
  /// then `then(confirmed)` runs with whether the requester confirmed that it mapped them.
  struct Answer {
    int segment_fd = -1;
    int doorbell_fd = -1;
    std::function<void(bool confirmed)> then;
  };
  /// Decides one request (on the listener's thread): `rank` and `proof` as sent, `doorbell`
  /// the requester's (owned by the callee whatever it answers). An empty answer refuses.
  using Serve = std::function<std::optional<Answer>(std::uint32_t rank, const Proof& proof, int doorbell)>;
  /// Binds and starts serving. Throws nexar::Error(Errc::io).
  explicit Listener(Serve serve);
  /// Stops serving and joins the thread.
  ~Listener();
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  /// The socket's name (without the leading NUL of the abstract namespace).
  const std::string& name() const noexcept { return name_; }
  /// Requests refused so far (wrong user, bad proof, malformed), for tests and logs.
  std::uint64_t refused() const noexcept { return refused_.load(); }

 private:
  void run();
  void serve_one(int c);

  Serve serve_;
  std::string name_;
  int fd_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<std::uint64_t> refused_{0};
  std::thread thread_;
};

/// What an accepted request returns: the segment's memfd and the listener's doorbell (both
/// the caller's), and the connection, open until confirm() or the destructor.
struct Attached {
  int segment_fd = -1;
  int doorbell_fd = -1;
  Attached() = default;
  Attached(Attached&& o) noexcept;
  Attached& operator=(Attached&& o) noexcept;
  ~Attached();
  /// Tells the listener the segment is mapped (it then moves its lanes); after this
  /// returns, this side may move its own. Throws nexar::Error(Errc::io).
  void confirm();

 private:
  friend Attached attach(const std::string&, std::uint32_t, const Proof&, int, std::chrono::milliseconds);
  int socket_ = -1;
};

/// Connects to the listener `name` and asks for its segment. Blocking, at most `timeout`
/// per step. Throws nexar::Error: Errc::io (no such listener, I/O), Errc::protocol
/// (refused, or a malformed answer).
Attached attach(const std::string& name, std::uint32_t rank, const Proof& proof, int doorbell,
                std::chrono::milliseconds timeout);

/// Whether `fd` is an eventfd, made non-blocking here: a peer's doorbell must be one, or
/// ringing it could block (a pipe) or do anything else a descriptor can.
bool adopt_doorbell(int fd) noexcept;

}  // namespace nexar::shm
