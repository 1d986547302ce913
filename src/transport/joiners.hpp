// The joiners of an elastic world, as one node sees them: the nodes announced after
// formation that wait for a grow to admit them, and (on a joiner) the welcome that admits
// it into a communicator.
//
// World ranks are handed out by the membership service, once each and in order, so every
// node numbers every other the same way and failure notices (which name world ranks) mean
// the same everywhere. A joiner's own table starts with every rank the service had handed
// out before it; the ranks announced after it are appended as they come (Node::add_peer).
// Each member of a grow sends every joiner it admitted a welcome naming the new
// communicator; the first one counts.
//
// It reaches its node through its peer table alone (transport/peer_table.hpp, three calls),
// and reads the failed ranks from the node's Failures. Thread-safe: its own lock guards what
// it holds; members that read the peers take the engine lock (or say "engine lock held").
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <vector>

#include "transport/peer_table.hpp"

namespace nexar::detail {

class Engine;
class Failures;
class Peer;

class Joiners {
 public:
  /// What Joiners asks of its node: its peer table, no more.
  using Owner = PeerTable;

  /// What a welcome said.
  struct Welcome {
    std::uint64_t comm = 0;
    std::vector<int> members;  // world ranks, in rank order
  };

  /// This node is world rank `rank` of the `world` ranks it starts with; `late`: it joined a
  /// running job and waits for its welcome. `waiting`: the ranks of its starting table
  /// named as joiners still waiting for admission (others than its own).
  Joiners(Owner& owner, int rank, int world, bool late, const std::vector<int>& waiting, Engine& engine,
          const Failures& failures);
  Joiners(const Joiners&) = delete;
  Joiners& operator=(const Joiners&) = delete;

  // ---- on the members ----
  /// World rank `id` was announced as a joiner (ids only grow). Any thread.
  void add(int id);
  /// Joiners waiting for admission: announced, not admitted, not failed, not gone away.
  /// Any thread.
  std::vector<int> waiting() const;
  /// Waiting joiners this node is connected to, ascending: those a grow may admit. Any
  /// thread.
  std::vector<int> ready();
  /// Waiting joiners whose connection to this node is still being set up. Any thread.
  int connecting();
  /// `ids` were admitted by a grow (or are members of the communicator we were welcomed
  /// into): they wait no more. Any thread.
  void admitted(const std::vector<int>& ids);
  /// The connection to world rank `r` ended: a joiner that went away before a grow took it
  /// in never will be (one that comes back joins anew, as another world rank). Any thread.
  void left(int r);

  // ---- on a joiner ----
  /// A welcome into communicator `comm` of `members` arrived from `from`. Engine lock held.
  void on_welcome(int from, std::uint64_t comm, const std::vector<std::uint32_t>& members);
  /// Blocks until the first welcome arrived, and every member it names is known and
  /// connected, or `until`. Throws nexar::Error: timeout (naming what is missing), closed,
  /// or a member's departure (a member that failed is no reason to give up: the
  /// communicator is revoked and shrunk around it).
  Welcome wait_welcome(std::chrono::steady_clock::time_point until);
  /// The node is closing: a wait_welcome gives up. Any thread.
  void closing();

 private:
  Owner& owner_;
  const int rank_;
  const bool late_;
  Engine& engine_;
  const Failures& failures_;
  mutable std::mutex mu_;
  std::vector<int> waiting_;  // announced joiners not yet admitted, ascending
  std::optional<Welcome> welcome_;
  std::condition_variable welcome_cv_;
};

}  // namespace nexar::detail
