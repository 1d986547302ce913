// The mailbox path: all_reduce, reduce_scatter, all_gather, broadcast and barrier on a
// communicator whose ranks share one host, through the mailboxes of the port
// (CollectivePort::mailboxes), in one or two exchanges instead of log2(n) or 2(n-1)
// dependent steps. A blocking call runs in the calling thread, with no collective thread,
// operation state or matching queue in the way; a non-blocking one runs as a collective of
// the port. Each of the five writes its mailbox form in its own file, next to its other
// algorithms, from the pieces here.
#pragma once

#include <nexar/collective.hpp>
#include <nexar/dtype.hpp>
#include <nexar/request.hpp>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>

#include "collective/port.hpp"

namespace nexar::detail::coll {

// Where one round would make a rank post more than kFanOutBytes in all (every other rank
// a copy), all_reduce takes the two rounds that post each rank one block, and broadcast
// its chunks.
constexpr std::size_t kFanOutBytes = std::size_t{128} << 10;

// Two ranks take the chunked exchanges up to kTwoRanksMostBytes only: above it the
// ordinary ring through the shared-memory rings was faster (2 processes on this project's
// 2-core machine, busbw in 3 alternating runs: 128 KiB 4.25-4.62 GB/s in chunks against
// 3.91-4.34; 256 KiB 4.20-4.26 against 5.22-6.06; 16 MiB 3.22-3.49 against 3.37-3.93).
// With more ranks the chunks were faster at every size measured, up to 64 MiB
// (docs/PERFORMANCE.md, "Collectives through mailboxes").
constexpr std::size_t kTwoRanksMostBytes = std::size_t{128} << 10;

/// Whether a vector of `bytes` per rank may go through the mailboxes in chunks.
inline bool chunks_fit(const CollectivePort& p, std::size_t bytes) {
  return p.size() > 2 || bytes <= kTwoRanksMostBytes;
}

/// After the arguments were checked: a Ticket if the call goes through the port's
/// mailboxes, nothing if it takes the ordinary algorithms. It asks the port once, if
/// `fits` (the call's messages fit the mailboxes), the algorithm is automatic and there is
/// more than one rank. The Ticket carries `check`, the call's fingerprint
/// (core/call_check.hpp), and its shape for the recorder.
std::optional<CollectivePort::Ticket> mailbox_path(CollectivePort& p, const char* op, std::size_t bytes,
                                                   const CollectiveOptions& o, bool blocking, bool fits,
                                                   std::uint16_t check, CallShape shape);

/// Runs `body` here (blocking: the caller waits anyway, so no collective thread, operation
/// state or Request is needed) or as a collective of the port. The Request is empty when
/// blocking.
template <class Body>
Request mailbox_run(CollectivePort& p, const CollectivePort::Ticket& tk, bool blocking, const CollectiveOptions& o,
                    DataType t, ReduceOp op, Body body) {
  if (blocking && !tk.queued) {
    struct Ran {
      CollectivePort& p;
      const CollectivePort::Ticket& tk;
      int unwinding = std::uncaught_exceptions();
      ~Ran() { p.ran(tk, std::uncaught_exceptions() == unwinding); }
    } ran{p, tk};
    body();
    return {};
  }
  return p.start(tk.op, o, t, op, tk.shape, [&p, tk, blocking, body](const Coll&) {
    struct Finished {
      CollectivePort& p;
      const CollectivePort::Ticket& tk;
      bool counted;
      ~Finished() {
        if (counted) p.finished(tk);
      }
    } f{p, tk, !blocking};
    body();
  });
}

/// Throws Errc::invalid_argument naming both ranks and sizes when the size rank `from`
/// announced (`theirs`) is not this rank's (`ours`).
void check_sizes_agree(const CollectivePort::Ticket& t, int me, int from, std::uint64_t theirs, std::uint64_t ours);

/// What exchange_in_chunks moves: a vector cut into one block per rank (block_of).
struct Chunked {
  std::size_t count;        // elements of the whole vector, in blocks (block_of)
  const std::byte* parts;   // first round: the vector whose block b goes to rank b; null: none
  std::byte* result;        // first round: where this rank's reduced block goes
  const std::byte* own;     // second round: this rank's block, sent to every rank; null: none
  std::byte* whole;         // second round: block b from rank b lands at its offset here
};

/// The two rounds when a block outgrows one message (all_reduce), or one of them
/// (reduce_scatter: the first; all_gather: the second). Each rank sends every other rank
/// the vector's size (8 bytes: ranks that disagree fail at once, naming both sizes); in
/// the first round, its part of that rank's block in chunks of at most kMailboxBytes,
/// which the owner reduces; in the second, its own block (reduced, for all_reduce) in
/// chunks. One loop posts and takes whatever it can, so a rank never waits on one mailbox
/// while another could move. The owner reduces chunk c once every rank's chunk c has come,
/// straight from the mailboxes in rank order, and frees them. Only then (a reader frees
/// its key's messages numbered below the one it takes) does it take the second round's
/// chunks, which meanwhile wait in the mailboxes. The slots (8 per communicator and
/// direction) are all that is in flight.
void exchange_in_chunks(CollectivePort& p, const CollectivePort::Ticket& t, const Chunked& x, DataType dt,
                        ReduceOp op);

}  // namespace nexar::detail::coll
