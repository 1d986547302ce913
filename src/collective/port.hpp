// What a collective sees of its communicator, and nothing more: its rank and size, the
// settings, point-to-point messages on the collective lane, scratch memory, and a way to
// start a collective on the communicator's collective thread. The facade (src/comm)
// implements it; so no file of src/collective compiles against the transport, QUIC, TLS or
// Asio, and the algorithms can be read (and tested) as plain sequential code.
#pragma once

#include <nexar/collective.hpp>
#include <nexar/config.hpp>
#include <nexar/dtype.hpp>
#include <nexar/request.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

namespace nexar::detail {

struct Coll;

/// What the flight recorder notes of a call besides its name, type and operator: the
/// call's count (a v-form's: the elements this rank sends, or receives for scatter_v), its
/// root (-1: none), and the path when the options do not say it ("mailbox").
struct CallShape {
  std::uint64_t count = 0;
  int root = -1;
  const char* algorithm = nullptr;
};

class CollectivePort {
 public:
  using Clock = std::chrono::steady_clock;

  /// This rank and the number of ranks, in the communicator.
  virtual int rank() const noexcept = 0;
  virtual int size() const noexcept = 0;
  virtual const Config& config() const noexcept = 0;

  /// Sends `bytes` at `data` to communicator rank `to` as a message of the collective with
  /// tag `tag` (`op` names it in errors). Large messages may go straight from `data`, which
  /// must stay valid until the Request completes; fails at `deadline`.
  virtual Request isend(const char* op, std::int64_t tag, Clock::time_point deadline, int to,
                        const void* data, std::size_t bytes) = 0;
  /// Receives exactly `bytes` from communicator rank `from` for collective `tag` into
  /// `data`; a message of another size fails the Request (the ranks disagree on counts or
  /// types).
  virtual Request irecv(const char* op, std::int64_t tag, Clock::time_point deadline, int from,
                        void* data, std::size_t bytes) = 0;
  /// Uninitialised scratch memory (slot 0, 1 or 2) valid until the running collective
  /// returns. The ring algorithms use slot 0; the fused forms keep their packed buffer in
  /// slot 1; the hierarchical algorithm keeps what it receives inside a host in slot 2.
  virtual std::byte* scratch(int slot, std::size_t bytes) = 0;

  /// A number naming this rank's host: equal on ranks that share memory (same kernel,
  /// network namespace and user), different elsewhere but for a 2^-64 chance.
  virtual std::uint64_t host_id() const noexcept = 0;
  /// The host ids of every rank, once a collective learned them (collective thread only);
  /// null before. Collectives learn them together (coll::hierarchy), so every rank holds
  /// the same list.
  virtual const std::vector<std::uint64_t>* hosts() const noexcept = 0;
  virtual void set_hosts(std::vector<std::uint64_t> ids) = 0;

  /// Starts collective `name` (arguments already validated): it gets the next collective
  /// tag, its deadline from `o` or Config::op_timeout, and `body` runs on the collective
  /// thread (or on a thread waiting for it) with a Coll describing the call; the flight
  /// recorder notes `shape` beside the name, type and operator. The Request
  /// completes when `body` returns, or fails with the nexar::Error it throws. Throws
  /// Errc::closed when the communicator is closed.
  virtual Request start(const char* name, const CollectiveOptions& o, DataType t, ReduceOp op, CallShape shape,
                        std::function<void(const Coll&)> body) = 0;

  /// Whether the running collective's steps are traced (Config::trace): only then does an
  /// algorithm read the clock for them (coll::Step).
  virtual bool tracing() const noexcept { return false; }
  /// The running collective spent [from, to) in step `name` (static text, "reduce-scatter
  /// (ring)"): the trace draws it inside the collective's span.
  virtual void step(const char* /*name*/, Clock::time_point /*from*/, Clock::time_point /*to*/) noexcept {}

  // ---- mailboxes: collectives inside one host (collective/mailbox_path.*) ----
  /// Largest message a mailbox holds.
  static constexpr std::size_t kMailboxBytes = 8192;
  /// One collective that runs through the mailboxes.
  struct Ticket {
    const char* op;  ///< names every error
    std::uint64_t seq;
    Clock::time_point deadline;
    /// Non-blocking: it goes to the collective thread, and finished() must be called when it
    /// ends. Blocking: mailbox collectives of the communicator wait there before it, so it
    /// must go there too (start() and wait), keeping one reader per mailbox key and rank.
    bool queued = false;
    /// The call's fingerprint (core/call_check.hpp), which its messages carry and takes
    /// compare.
    std::uint16_t check = 0;
    /// What the flight recorder notes of the call.
    CallShape shape{};
    /// Blocking and not queued: the collective's number in the communicator (the port
    /// records it).
    std::uint64_t number = 0;
  };
  /// Collective `op` (arguments validated, algorithm automatic, `bytes` per rank) is about
  /// to start: a Ticket if its messages go through the mailboxes this rank shares with
  /// every other member (shared memory) and `bytes` is within the size the members agreed
  /// on (Config::shm_collective_bytes), nothing if it takes the ordinary path. Every member
  /// answers alike for the same sequence of calls, blocking or not (the communicator
  /// agrees on it with its members, through collectives it starts here and waits for at
  /// the next such call), so the ranks never disagree on the path.
  /// `blocking`: the caller runs it itself, without start(). The Ticket carries `check`
  /// and `shape`. Throws what start() throws. By default there are none (a port inside a
  /// running collective, coll::SubPort).
  virtual std::optional<Ticket> mailboxes(const char* /*op*/, std::size_t /*bytes*/, const CollectiveOptions&,
                                          bool /*blocking*/, std::uint16_t /*check*/, CallShape /*shape*/) {
    return std::nullopt;
  }
  /// A non-blocking `t` ended (on the collective thread), successfully or not.
  virtual void finished(const Ticket& /*t*/) noexcept {}
  /// A blocking `t` that its caller ran ended, successfully (`ok`) or with an exception.
  virtual void ran(const Ticket& /*t*/, bool /*ok*/) noexcept {}

  /// A message's number within its collective, below 2^20: `phase` 0 or 1 and the
  /// `chunk`'s index in that phase (below 2^19). A collective sends each rank its messages
  /// in increasing number, and takes each rank's in increasing number: a reader that waits
  /// for one frees the key's messages numbered below it as stale.
  static constexpr std::uint64_t part(int phase, std::size_t chunk = 0) noexcept {
    return (static_cast<std::uint64_t>(phase) << 19) | chunk;
  }
  static constexpr std::size_t kMaxChunks = std::size_t{1} << 19;
  /// Posts `len` bytes (at most kMailboxBytes) as `t`'s message `part` to rank `to` if the
  /// mailbox has a free slot; false if not (the peer has not taken enough earlier ones).
  /// (Only called with a Ticket this port gave.)
  virtual bool try_post(const Ticket& t, std::uint64_t part, int to, const void* data, std::size_t len);
  /// Takes `t`'s message `part` from rank `from` into `out` if it is there; false if not
  /// yet. It must be `len` bytes: Errc::invalid_argument naming both sizes otherwise.
  virtual bool try_take(const Ticket& t, std::uint64_t part, int from, void* out, std::size_t len);
  /// As try_take, but leaves the message in the mailbox: a pointer to its `len` bytes,
  /// valid until release(from, it), or null if it is not there yet. Throws as try_take.
  virtual const void* try_peek(const Ticket& t, std::uint64_t part, int from, std::size_t len);
  /// Frees the message at `data` that try_peek found in rank `from`'s mailbox.
  virtual void release(int from, const void* data);
  /// How a wait for mail stands between two attempts (idle()). Reset it after progress.
  struct MailWait {
    unsigned tries = 0;
    Clock::time_point spin_end{};
    bool asleep = false;
    bool armed = false;        // `seen` was read: one more attempt, then sleep on it
    bool last_chance = false;  // the peer closed: one more attempt, then its error
    std::uint32_t seen = 0;
    Clock::time_point read{};  // the wait's last clock reading (the port's waiting time)
  };
  /// Nothing could be posted or taken: waits a little for rank `peer` (to post, when
  /// `taking`, or to take) before the caller attempts again. Spins (or yields, when the
  /// host is oversubscribed) for Config::spin, then sleeps on the mailbox. Throws
  /// nexar::Error: the communicator revoked (a member failed) or closed, `peer` closed,
  /// or `t`'s deadline passed (naming `peer`).
  virtual void idle(const Ticket& t, MailWait& w, int peer, bool taking);
  /// try_post until it succeeds, idle between.
  void post(const Ticket& t, std::uint64_t part, int to, const void* data, std::size_t len) {
    for (MailWait w; !try_post(t, part, to, data, len);) idle(t, w, to, false);
  }
  /// try_take until it succeeds, idle between.
  void take(const Ticket& t, std::uint64_t part, int from, void* out, std::size_t len) {
    for (MailWait w; !try_take(t, part, from, out, len);) idle(t, w, from, true);
  }

 protected:
  ~CollectivePort() = default;
};

}  // namespace nexar::detail
