// What an Agreement reaches of the node it runs on: who this rank is, which ranks failed,
// and a way to send a ballot. The node's side is a thin adapter (Agreement::over); the unit
// tests (tests/agreement_test.cpp) implement it over an in-memory exchange of ballots, so
// the algorithm runs with no node, engine or socket.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "engine/op_state.hpp"
#include "wire/ballot.hpp"
#include "wire/frame.hpp"

namespace nexar::detail {

class Engine;

class AgreementOwner {
 public:
  /// This node's world rank.
  virtual int rank() const noexcept = 0;
  /// Whether the others declared this rank failed (it takes part in nothing any more).
  virtual bool expelled() const noexcept = 0;
  /// False once the node was closed.
  virtual bool is_open() const noexcept = 0;
  /// Whether world rank `r` was declared failed, as known here.
  virtual bool is_failed(int r) const = 0;
  /// Whether world rank `r`'s connection ended without `r` being declared failed.
  virtual bool peer_left(int r) = 0;
  /// Declares world rank `r` failed: every member learns it, and on_rank_failed follows.
  virtual void declare_failed(int r, const std::string& why) = 0;
  /// Sends an agree or decided ballot to world rank `dest` (nothing if it is failed or gone).
  virtual void send_ballot(int dest, wire::FrameType type, std::uint64_t comm, std::uint64_t seq,
                           const wire::Ballot& b) = 0;

  // ---- for Agreement::run only (the blocking entry from a user thread) ----
  /// The thread the agreement's state lives on.
  virtual Engine& engine() noexcept = 0;
  /// A new operation named `op` that times out after `timeout`, waited on as the node's are.
  virtual std::shared_ptr<OpState> new_op(const char* op, std::chrono::milliseconds timeout) = 0;

 protected:
  ~AgreementOwner() = default;
};

}  // namespace nexar::detail
