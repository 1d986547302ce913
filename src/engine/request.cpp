// nexar::Request: thin waits on OpState.
#include <nexar/request.hpp>

#include "engine/op_state.hpp"
#include "engine/wait_meter.hpp"

namespace nexar {

using detail::OpState;

bool Request::test() const noexcept { return !state_ || state_->done(); }

static Status finish(const OpState& s) {
  if (s.code() != Errc::ok) {
    if (s.before_throw) s.before_throw(s.code());
    if (!s.failed_ranks().empty()) throw Error(s.code(), s.message(), s.failed_ranks());
    throw Error(s.code(), s.message());
  }
  return s.status();
}

Status Request::wait() const {
  if (!state_) return {};
  // Inside a collective, the time it blocks is the collective's waiting (wait_meter.hpp).
  detail::WaitMeter* meter = state_->done() ? nullptr : detail::WaitMeter::current();
  const auto from = meter ? OpState::Clock::now() : OpState::Clock::time_point{};
  struct Metered {
    detail::WaitMeter* meter;
    OpState::Clock::time_point from;
    ~Metered() {
      if (meter) meter->add(from, OpState::Clock::now());
    }
  } metered{meter, from};
  if (!state_->wait_until(state_->deadline(), state_->spin)) {
    // Deadline passed: ask the engine to give the operation up. It completes at once if
    // nothing moved yet, or soon (transfer finished or peer declared failed) otherwise.
    if (state_->canceller) state_->canceller(Errc::timeout);
    while (!state_->wait_until(OpState::Clock::now() + std::chrono::seconds(1), {})) {
    }
  }
  return finish(*state_);
}

bool Request::wait_for(std::chrono::nanoseconds d) const {
  if (!state_) return true;
  auto until = OpState::Clock::now() + d;
  if (!state_->wait_until(until, std::min(state_->spin, std::chrono::duration_cast<std::chrono::microseconds>(d)),
                          /*bounded=*/true)) {
    return false;
  }
  finish(*state_);
  return true;
}

std::error_code Request::error() const noexcept {
  if (!state_ || !state_->done() || state_->code() == Errc::ok) return {};
  return make_error_code(state_->code());
}

Status Request::status() const noexcept { return state_ ? state_->status() : Status{}; }

void Request::cancel() const {
  if (state_ && !state_->done() && state_->canceller) state_->canceller(Errc::cancelled);
}

}  // namespace nexar
