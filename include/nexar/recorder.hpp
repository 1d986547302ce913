// nexar — the flight recorder: what a communicator's recent collectives were, on this rank.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include <nexar/dtype.hpp>

namespace nexar {

/// One collective in a communicator's flight recorder (Communicator::recorder()). Every
/// rank numbers the collectives of a communicator alike, so entry `number` of two ranks'
/// recorders is the same call if they agree.
struct OpRecord {
  enum class State : std::uint8_t {
    queued,   ///< called, waiting behind an earlier collective of the communicator
    running,  ///< moving data
    done,     ///< completed
    failed,   ///< ended with an error (timeout, a failed peer, a revoked communicator, ...)
  };
  /// The collective's number in its communicator, from 0: the number error messages and
  /// stall reports use ("all_reduce #12").
  std::uint64_t number = 0;
  /// "all_reduce", "broadcast", ... as the errors name it.
  std::string op;
  DataType dtype = DataType::u8;
  /// Meaningful only for the collectives that reduce (all_reduce, reduce, reduce_scatter,
  /// scan, ...); sum for the others.
  ReduceOp reduce_op = ReduceOp::sum;
  /// Elements this rank passed (a v-form's total), and their bytes.
  std::uint64_t count = 0;
  std::uint64_t bytes = 0;
  /// The root of a rooted collective (broadcast, reduce, gather, scatter), -1 otherwise.
  int root = -1;
  /// The algorithm asked for ("automatic" unless the call forced one), or "mailbox" for a
  /// collective that ran through the shared-memory mailboxes.
  std::string algorithm;
  /// When it was called, began to move data, and ended (steady clock). `started` and
  /// `ended` are the clock's epoch until then. A collective through the mailboxes that
  /// never had to wait reads the clock once: its three times are equal.
  std::chrono::steady_clock::time_point posted{}, started{}, ended{};
  State state = State::queued;
};

/// "queued", "running", "done", "failed".
const char* to_string(OpRecord::State s) noexcept;

}  // namespace nexar
