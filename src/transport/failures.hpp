// Which ranks failed and which communicators are revoked, for one node: the liveness of
// each peer, declaring a rank failed and spreading the news, and revoking the communicators
// that contain it.
//
// Once the mesh is up, each peer's liveness is judged by what arrives from it; a peer
// silent for Config::failure_timeout, or whose connection broke, is declared failed. The
// declaration is sent to every other neighbour (each forwards it once), so every live rank
// learns it; each communicator containing the failed rank is then revoked here: its
// pending operations fail naming the rank in the communicator's numbering, and later ones
// fail at once. Failed ranks stay failed: their connections are closed and nothing from
// them is taken any more.
//
// It reaches its node through Failures::Owner (its peer table, transport/peer_table.hpp, and
// two calls more), the node's matching for the receives a revocation fails, and its routing
// for relayed bytes that stall. Engine thread only, except where a member says "any thread".
#pragma once

#include <asio/steady_timer.hpp>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nexar/config.hpp>
#include <nexar/error.hpp>

#include "engine/op_state.hpp"
#include "transport/peer_table.hpp"
#include "wire/frame.hpp"

namespace nexar::quic {
class Endpoint;
}

namespace nexar::detail {

class Engine;
class Matching;
class MembershipLanes;
class Peer;
class Routing;

/// What an operation's error says about member `local` of its communicator (world rank
/// `world`) failing for `why`: "rank 2 failed: why", or "rank 2 (world rank 5) failed: why".
std::string describe_failure(int local, int world, const std::string& why);

class Failures {
 public:
  /// What Failures asks of its node, besides its peer table (nothing is declared once the
  /// node began to close).
  class Owner : public virtual PeerTable {
   public:
    /// The node's QUIC endpoint (liveness reads the socket before judging anyone); null
    /// before the node started.
    virtual quic::Endpoint* endpoint() noexcept = 0;
    /// Where failures are told to the membership module; null when none is attached.
    virtual MembershipLanes* membership() const noexcept = 0;

   protected:
    ~Owner() = default;
  };

  /// Failure events of one communicator, delivered with the engine lock held: world rank
  /// `failed` was declared failed, or (`failed` < 0, Errc::revoked) the communicator was
  /// revoked by the application. Must not block.
  using CommListener = std::function<void(int failed, Errc code, const std::string& why)>;

  /// This node is world rank `rank` of a world formed with `world` ranks. `cfg` (the failure
  /// timeout), `engine`, `matching` and `routing` outlive this.
  Failures(Owner& owner, int rank, int world, const Config& cfg, Engine& engine, Matching& matching,
           Routing& routing);
  Failures(const Failures&) = delete;
  Failures& operator=(const Failures&) = delete;

  // ---- ranks ----
  /// Whether world rank `r` was declared failed (known here). Any thread.
  bool is_failed(int r) const;
  /// Whether the other ranks declared this one failed. Any thread.
  bool expelled() const noexcept { return expelled_.load(std::memory_order_acquire); }
  /// Elastic: the next world rank was announced (not failed).
  void add_rank();
  /// Declares world rank `r` failed for `why` (idempotent): revokes the communicators that
  /// contain it, cuts its peer off and tells every neighbour.
  void declare_failed(int r, const std::string& why);
  /// Neighbour `from` told us that world rank `r` failed (`why`); about this rank: the others
  /// gave up on it, and every communicator here is revoked.
  void on_failed_notice(int from, int r, const std::string& why);
  /// Tells `p`, just connected, of every rank failed here but `p` (a failure flood reaches
  /// only the ranks connected at the time).
  void tell_failed(Peer& p);

  // ---- liveness ----
  /// Judges the peers from now on (once the mesh is up): arms the periodic check.
  void start_liveness();
  /// The node is closing: no more checks.
  void stop_liveness();
  /// Whether failures are being judged: start_liveness ran (the mesh is up) and the node is
  /// not closing. A member whose connection breaks meanwhile is declared failed.
  bool judging() const noexcept { return judging_ && owner_.is_open(); }

  // ---- communicators ----
  /// Watches communicator `id` of world ranks `members` (ours is `rank` in it). If one of
  /// them is already failed, or the id was revoked already, it is revoked at once.
  void watch(std::uint64_t id, std::vector<int> members, int rank, CommListener on_event);
  /// Forgets communicator `id`. Any thread.
  void unwatch(std::uint64_t id);
  /// Whether communicator `comm` is revoked here.
  bool revoked(std::uint64_t comm) const { return !revoked_.empty() && revoked_.count(comm) != 0; }
  /// Fails `op` as the revocation of `comm` failed its others, if it is revoked; returns
  /// whether it did. For operations submitted before the revocation and run after it.
  bool fail_if_revoked(std::uint64_t comm, const std::shared_ptr<OpState>& op);
  /// Revokes `id` here and tells its members, with `why` if given (then its operations fail
  /// with Errc::invalid_argument and `why`, else with Errc::revoked).
  void revoke_everywhere(std::uint64_t id, const std::string& why);
  /// Communicator `comm` was revoked by `from`: by the application (Errc::revoked, `why`
  /// empty), or because two members called different collectives (invalid_argument, `why`).
  void on_revoke_notice(int from, std::uint64_t comm, Errc code, const std::string& why);

 private:
  struct Watch {
    std::vector<int> members;  // world ranks
    int rank = 0;
    CommListener on_event;
  };
  struct Revoked {
    Errc code = Errc::revoked;
    int failed_world = -1;
    std::string why;
  };
  /// What the operations of a revoked communicator fail with: built once per revocation,
  /// formatted per operation.
  struct RevokeError {
    Errc code = Errc::revoked;
    int rank = -1;           // ours in the communicator
    int peer = -1;           // the failed member, in the communicator's numbering
    std::string addr;        // its address
    std::string detail;
    std::vector<int> failed;  // every failed member, in the communicator's numbering
    void fail(const std::shared_ptr<OpState>& op) const;
  };

  void liveness_tick();
  /// Revokes communicator `id` here: pending operations fail with `code` naming world rank
  /// `failed_world` (or none), later ones at once.
  void revoke_local(std::uint64_t id, Errc code, int failed_world, const std::string& why);
  RevokeError revoke_error(const Watch& w, Errc code, int failed_world, const std::string& why);
  /// The header of a `failed` frame from this rank naming world rank `r`.
  wire::FrameHeader failed_header(int r) const;
  /// Sends a small control frame to every live neighbour but `except`.
  void flood(const wire::FrameHeader& h, std::string_view payload, int except);

  Owner& owner_;
  const int rank_;
  const Config& cfg_;
  Engine& engine_;
  Matching& matching_;
  Routing& routing_;
  // failed_ and comms_ are read from user threads: guarded by mu_ (and written on the
  // engine thread). revoked_ is engine-only.
  mutable std::mutex mu_;
  std::vector<char> failed_;
  std::map<std::uint64_t, Watch> comms_;
  std::unordered_map<std::uint64_t, Revoked> revoked_;
  std::atomic<bool> expelled_{false};
  bool judging_ = false;
  std::unique_ptr<asio::steady_timer> liveness_timer_;
  std::uint64_t last_tick_ = 0;
};

}  // namespace nexar::detail
