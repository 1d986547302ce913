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
#include <vector>

namespace nexar::detail {

struct Coll;

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
  /// thread (or on a thread waiting for it) with a Coll describing the call. The Request
  /// completes when `body` returns, or fails with the nexar::Error it throws. Throws
  /// Errc::closed when the communicator is closed.
  virtual Request start(const char* name, const CollectiveOptions& o, DataType t, ReduceOp op,
                        std::function<void(const Coll&)> body) = 0;

 protected:
  ~CollectivePort() = default;
};

}  // namespace nexar::detail
