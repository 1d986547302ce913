#include "transport/shm_presence.hpp"

#include <algorithm>

#include "transport/shm_link.hpp"

namespace nexar::detail {

void ShmPresence::add(ShmLink& link) {
  std::lock_guard lk(mu_);
  links_.push_back(&link);
  link.set_asleep(!watched_.load(std::memory_order_relaxed));
}

void ShmPresence::remove(ShmLink& link) {
  std::lock_guard lk(mu_);
  links_.erase(std::remove(links_.begin(), links_.end(), &link), links_.end());
}

void ShmPresence::watched() {
  std::lock_guard lk(mu_);
  watched_.store(true, std::memory_order_seq_cst);
  for (ShmLink* l : links_) l->set_asleep(false);
}

bool ShmPresence::unwatched() {
  std::lock_guard lk(mu_);
  watched_.store(false, std::memory_order_seq_cst);
  // Every word first, then every ring: a writer that read a word before it was set
  // published its bytes before that, so they show in the look that follows.
  for (ShmLink* l : links_) l->set_asleep(true);
  return std::any_of(links_.begin(), links_.end(), [](const ShmLink* l) { return l->has_work(); });
}

void ShmPresence::ring() {
  std::lock_guard lk(mu_);
  // One doorbell for the whole node: any link's "self" is it.
  if (!links_.empty()) links_.front()->ring_self();
}

}  // namespace nexar::detail
