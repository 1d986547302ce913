// Joiners (joiners.hpp): the joiners waiting for admission, and the welcome that admits
// one.
#include "transport/joiners.hpp"

#include <algorithm>
#include <thread>

#include "core/error_format.hpp"
#include "core/log.hpp"
#include "engine/engine.hpp"
#include "transport/failures.hpp"
#include "transport/peer.hpp"

namespace nexar::detail {

Joiners::Joiners(Owner& owner, int rank, int world, bool late, const std::vector<int>& waiting, Engine& engine,
                 const Failures& failures)
    : owner_(owner), rank_(rank), late_(late), engine_(engine), failures_(failures) {
  for (int j : waiting)
    if (j != rank_ && j >= 0 && j < world) waiting_.push_back(j);
  std::sort(waiting_.begin(), waiting_.end());
}

void Joiners::add(int id) {
  std::lock_guard lk(mu_);
  waiting_.push_back(id);  // ids only grow: stays ascending
}

std::vector<int> Joiners::waiting() const {
  std::vector<int> v;
  {
    std::lock_guard lk(mu_);
    v = waiting_;
  }
  std::erase_if(v, [this](int j) { return failures_.is_failed(j); });
  return v;
}

std::vector<int> Joiners::ready() {
  std::vector<int> waiting_now = waiting();
  std::vector<int> out;
  std::lock_guard lk(engine_.lock());
  for (int j : waiting_now) {
    Peer* p = owner_.peer_locked(j);
    if (p && p->up() && p->hello_seen()) out.push_back(j);
  }
  return out;
}

int Joiners::connecting() {
  std::vector<int> waiting_now = waiting();
  int n = 0;
  std::lock_guard lk(engine_.lock());
  for (int j : waiting_now) {
    // Only a handshake under way is worth waiting for: a joiner this node never dialled (an
    // earlier joiner the table we joined with flags, long gone) never gets ready.
    Peer* p = owner_.peer_locked(j);
    if (p && p->connection() && !p->gone() && !(p->up() && p->hello_seen())) ++n;
  }
  return n;
}

void Joiners::admitted(const std::vector<int>& ids) {
  std::lock_guard lk(mu_);
  std::erase_if(waiting_, [&](int j) { return std::find(ids.begin(), ids.end(), j) != ids.end(); });
}

void Joiners::left(int r) {
  std::lock_guard lk(mu_);
  std::erase(waiting_, r);
}

void Joiners::closing() {
  std::lock_guard lk(mu_);
  welcome_cv_.notify_all();
}

void Joiners::on_welcome(int from, std::uint64_t comm, const std::vector<std::uint32_t>& members) {
  std::lock_guard lk(mu_);
  if (!late_ || welcome_) return;  // every member of the grow sends one: the first counts
  auto names = [&](int r) {
    return std::find(members.begin(), members.end(), static_cast<std::uint32_t>(r)) != members.end();
  };
  if (!names(rank_) || !names(from)) {
    log::warn("rank {}: a welcome from rank {} does not name this rank and its sender: ignored", rank_, from);
    return;
  }
  Welcome w;
  w.comm = comm;
  w.members.assign(members.begin(), members.end());
  welcome_ = std::move(w);
  welcome_cv_.notify_all();
}

Joiners::Welcome Joiners::wait_welcome(std::chrono::steady_clock::time_point until) {
  Welcome w;
  {
    std::unique_lock lk(mu_);
    welcome_cv_.wait_until(lk, until, [&] { return welcome_.has_value() || !owner_.is_open(); });
    if (!owner_.is_open()) throw make_error(Errc::closed, ErrorContext{"join", rank_, -1, {}, {}}, "communicator closed");
    if (!welcome_) {
      throw make_error(Errc::timeout, ErrorContext{"join", rank_, -1, {}, {}},
                       "admitted by the membership service, but no grow of the members took this rank in "
                       "before the join timeout");
    }
    w = *welcome_;
  }
  admitted(w.members);
  // Every member of the grow was connected to us when it contributed; the other joiners of
  // the same grow dial us (or we them) as the service announces them. Wait until all are.
  for (;;) {
    int missing = -1;
    std::string why;
    Errc code = Errc::peer_closed;
    {
      std::lock_guard lk(engine_.lock());
      if (!owner_.is_open()) throw make_error(Errc::closed, ErrorContext{"join", rank_, -1, {}, {}}, "communicator closed");
      for (int m : w.members) {
        if (m == rank_) continue;
        // A member that failed since the decision is no reason to give up: the communicator
        // is revoked as soon as it is made, like any with a failed member, and a shrink of
        // everyone, this rank included, removes it. Leaving instead would hold the
        // members' shrink up until their op_timeout, waiting for this rank.
        if (failures_.is_failed(m)) continue;
        Peer* p = owner_.peer_locked(m);
        if (p && p->gone()) {
          missing = m;
          code = p->gone_code();
          why = p->gone_why().empty() ? "gone" : p->gone_why();
          break;
        }
        if (!p || !p->up() || !p->hello_seen()) {
          missing = m;
          break;
        }
      }
    }
    if (missing < 0) return w;
    ErrorContext ctx{"join", rank_, missing, {}, {}};
    if (!why.empty()) throw make_error(code, ctx, "a member of the communicator we were welcomed into: " + why);
    if (std::chrono::steady_clock::now() > until)
      throw make_error(Errc::timeout, ctx,
                       missing < owner_.size() ? "welcomed, but this member never connected"
                                        : "welcomed, but the membership service never announced this member here");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace nexar::detail
