#include "quic/scavenger.hpp"

#include <algorithm>
#include <limits>

namespace nexar::quic {

Scavenger::Scavenger(std::uint64_t mss) noexcept : mss_(mss), window_(initial_packets * mss) {
  rtt_.fill(std::numeric_limits<std::uint64_t>::max());
  base_.fill(std::numeric_limits<std::uint64_t>::max());
}

std::uint64_t Scavenger::target_ns(std::uint64_t base_rtt_ns) noexcept {
  return std::max(min_target_ns, base_rtt_ns / 4);
}

void Scavenger::set_mss(std::uint64_t mss) noexcept {
  mss_ = mss;
  window_ = std::max(window_, min_packets * mss_);
}

void Scavenger::on_ack(std::uint64_t acked, std::uint64_t rtt_ns, std::uint64_t now_ns) noexcept {
  if (rtt_ns == 0) return;
  if (now_ns >= period_end_) {
    base_[0] = base_[1];
    base_[1] = std::numeric_limits<std::uint64_t>::max();
    period_end_ = now_ns + base_period_ns;
  }
  base_[1] = std::min(base_[1], rtt_ns);
  const std::uint64_t min_rtt_ns = base_rtt();
  rtt_[next_] = rtt_ns;
  next_ = (next_ + 1) % samples;
  acked_in_round_ += acked;
  // Move once per window of acknowledged bytes: about once a round trip.
  if (acked_in_round_ < window_) return;
  acked_in_round_ = 0;
  const std::uint64_t current = *std::min_element(rtt_.begin(), rtt_.end());
  const std::uint64_t queueing = current > min_rtt_ns ? current - min_rtt_ns : 0;
  const std::uint64_t target = target_ns(min_rtt_ns);
  // window x (base + target) / (base + queueing), at most max_growth times larger.
  const double factor = static_cast<double>(min_rtt_ns + target) / static_cast<double>(min_rtt_ns + queueing);
  std::uint64_t next = static_cast<std::uint64_t>(static_cast<double>(window_) * factor);
  next = std::min(next, window_ * max_growth);
  if (!limited_) next = std::min(next, window_);
  limited_ = false;
  window_ = std::max(next, min_packets * mss_);
}

}  // namespace nexar::quic
