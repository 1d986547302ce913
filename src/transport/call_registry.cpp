#include "transport/call_registry.hpp"

#include <algorithm>

#include "core/call_check.hpp"

namespace nexar::detail {

void CallRegistry::watch(std::uint64_t comm, std::vector<int> members, int me) {
  std::lock_guard lk(mu_);
  Comm& c = comms_[comm];
  c.members = std::move(members);
  c.me = me;
}

void CallRegistry::forget(std::uint64_t comm) {
  std::lock_guard lk(mu_);
  comms_.erase(comm);
}

int CallRegistry::local(const Comm& c, int world) const {
  const auto it = std::find(c.members.begin(), c.members.end(), world);
  return it == c.members.end() ? world : static_cast<int>(it - c.members.begin());
}

std::string CallRegistry::reason(std::uint64_t comm, const Comm& c, std::uint64_t n, std::uint16_t mine, int them,
                                 std::uint16_t theirs) const {
  const int world = c.members.empty() ? kRootsExact : static_cast<int>(c.members.size());
  return call_unwanted("collective #" + std::to_string(n), comm, c.me, mine, local(c, them), theirs, world);
}

std::string CallRegistry::started(std::uint64_t comm, std::uint64_t n, std::uint16_t check) {
  std::lock_guard lk(mu_);
  Comm& c = comms_[comm];
  Call& call = c.calls[n];
  call.running = true;
  call.mine = check;
  if (call.waiting > 0 && check != 0 && call.theirs != check) return reason(comm, c, n, check, call.from, call.theirs);
  return {};
}

std::string CallRegistry::ended(std::uint64_t comm, std::uint64_t n, bool ok) {
  std::lock_guard lk(mu_);
  auto cit = comms_.find(comm);
  if (cit == comms_.end()) return {};
  Comm& c = cit->second;
  auto it = c.calls.find(n);
  // Given up before it started (never running here): only its late messages are to be
  // ignored, and those that came early are forgotten.
  const Call call = it == c.calls.end() ? Call{} : it->second;
  if (it != c.calls.end()) c.calls.erase(it);
  // A failed one is kept with no fingerprint: its late messages are not judged (they wait
  // as unexpected messages, as any message nobody receives).
  c.done[n % c.done.size()] = Done{n, ok ? call.mine : std::uint16_t{0}};
  if (!ok) return {};
  if (call.waiting > 0 && call.mine != 0) return reason(comm, c, n, call.mine, call.from, call.theirs);
  return {};
}

std::string CallRegistry::unawaited(std::uint64_t comm, std::uint64_t n, int source, std::uint16_t theirs) {
  std::lock_guard lk(mu_);
  Comm& c = comms_[comm];
  auto it = c.calls.find(n);
  if (it == c.calls.end()) {
    const Done& d = c.done[n % c.done.size()];
    if (d.n == n) return d.check != 0 ? reason(comm, c, n, d.check, source, theirs) : std::string();
    it = c.calls.emplace(n, Call{}).first;
  }
  Call& call = it->second;
  if (call.running && call.mine != 0 && call.mine != theirs) return reason(comm, c, n, call.mine, source, theirs);
  if (call.waiting++ == 0) {
    call.theirs = theirs;
    call.from = source;
  }
  return {};
}

void CallRegistry::matched(std::uint64_t comm, std::uint64_t n) {
  std::lock_guard lk(mu_);
  auto cit = comms_.find(comm);
  if (cit == comms_.end()) return;
  auto it = cit->second.calls.find(n);
  if (it != cit->second.calls.end() && it->second.waiting > 0) --it->second.waiting;
}

}  // namespace nexar::detail
