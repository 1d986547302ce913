// What a collective algorithm works with: its communicator (through CollectivePort), its
// tag, its deadline, the element type and reduction, and point-to-point helpers in
// communicator ranks. Algorithms run on the communicator's collective thread; a failed step
// throws nexar::Error, which fails the collective's Request.
#pragma once

#include <nexar/collective.hpp>
#include <nexar/dtype.hpp>
#include <nexar/request.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "collective/port.hpp"

namespace nexar::detail {

/// Requests of an algorithm in flight. If the algorithm leaves early (an exception), the
/// destructor withdraws what it can and waits for the rest, so no transfer is still
/// writing into a buffer that is going away. Declare buffers before their Requests.
class Requests : public std::vector<Request> {
 public:
  Requests() = default;
  Requests(Requests&&) = default;
  Requests& operator=(Requests&&) = default;
  ~Requests();
};

struct Coll {
  CollectivePort& port;
  const char* name;  ///< the collective, e.g. "all_reduce"; names every error
  std::int64_t tag;
  std::chrono::steady_clock::time_point deadline;
  std::size_t segment_bytes;
  Algorithm algorithm;
  DataType dtype = DataType::u8;
  ReduceOp op = ReduceOp::sum;

  int rank() const noexcept { return port.rank(); }
  int size() const noexcept { return port.size(); }
  const Config& config() const noexcept { return port.config(); }
  std::size_t elem() const noexcept { return size_of(dtype); }
  /// Elements per pipelining segment (at least 1).
  std::size_t segment_elems() const noexcept;

  Request isend(int to, const void* data, std::size_t bytes) const;
  Request irecv(int from, void* data, std::size_t bytes) const;
  /// Waits for every request; the first failure is thrown after all have finished.
  static void wait_all(Requests& reqs);
  void send(int to, const void* data, std::size_t bytes) const { isend(to, data, bytes).wait(); }
  void recv(int from, void* data, std::size_t bytes) const { irecv(from, data, bytes).wait(); }
  /// Sends to `to` and receives from `from` at the same time (no deadlock in rings).
  void sendrecv(int to, const void* sdata, std::size_t sbytes, int from, void* rdata,
                std::size_t rbytes) const;

  /// dst[i] = op(dst[i], src[i]) for n elements of dtype.
  void accumulate(void* dst, const void* src, std::size_t n) const;
  /// dst[i] = op(a[i], b[i]) for n elements of dtype (dst may be a).
  void combine(void* dst, const void* a, const void* b, std::size_t n) const;
  /// Uninitialised scratch memory (slot 0, 1 or 2; see CollectivePort::scratch), valid
  /// until the collective returns.
  std::byte* scratch(int slot, std::size_t bytes) const { return port.scratch(slot, bytes); }
  /// The final step of avg over size() ranks (no-op for other ops).
  void finish(void* data, std::size_t n) const { finish_over(data, n, size()); }
  /// The final step of avg over `ranks` contributions (no-op for other ops).
  void finish_over(void* data, std::size_t n, int ranks) const;

  /// Byte offset of element i.
  std::size_t bytes(std::size_t n) const noexcept { return n * elem(); }
};

/// A step of an algorithm (a phase: "reduce-scatter (ring)") for the trace: its span, from
/// construction to destruction, when the port traces; nothing (no clock read) otherwise.
class Step {
 public:
  Step(const Coll& c, const char* name) noexcept
      : port_(c.port.tracing() ? &c.port : nullptr),
        name_(name),
        from_(port_ ? CollectivePort::Clock::now() : CollectivePort::Clock::time_point{}) {}
  ~Step() {
    if (port_) port_->step(name_, from_, CollectivePort::Clock::now());
  }
  Step(const Step&) = delete;
  Step& operator=(const Step&) = delete;

 private:
  CollectivePort* port_;
  const char* name_;
  CollectivePort::Clock::time_point from_;
};

inline std::byte* at(void* base, std::size_t byte_offset) noexcept {
  return static_cast<std::byte*>(base) + byte_offset;
}
inline const std::byte* at(const void* base, std::size_t byte_offset) noexcept {
  return static_cast<const std::byte*>(base) + byte_offset;
}

}  // namespace nexar::detail
