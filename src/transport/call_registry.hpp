// The collectives each communicator runs on this rank, for the messages no receive awaits.
// The fingerprint check at a receive (Matching::calls_agree) sees only messages that some
// receive matches; ranks that disagree on a call's root or algorithm send messages that
// nobody ever receives: in a broadcast where two ranks each believe they are the root, both
// send and both complete. So a collective message that arrives unawaited is judged here:
//   * its collective runs here with another fingerprint: the ranks disagree;
//   * its collective has not started here: it is counted, and compared when it starts;
//   * its collective ended here: nobody will take it, so the ranks disagree;
// and a collective that ends while a message counted for it is still unawaited means the
// same. Each verdict is the reason the communicator is revoked with (Node), naming both
// ranks and both calls. Messages of a collective that failed here are ignored.
//
// Any thread (the engine thread judges arrivals, collective threads start and end calls);
// one lock, held for a map lookup.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace nexar::detail {

class CallRegistry {
 public:
  /// Communicator `comm` has world ranks `members` (communicator rank i is members[i]) and
  /// this rank is `me` in it: the reasons name communicator ranks from now on.
  void watch(std::uint64_t comm, std::vector<int> members, int me);
  /// Forgets communicator `comm`.
  void forget(std::uint64_t comm);

  /// Collective number `n` (transport/match_queue.hpp, collective_number) of `comm` starts
  /// here with fingerprint `check`. Returns why the ranks disagree when a message that
  /// arrived for it carries another fingerprint; empty otherwise.
  std::string started(std::uint64_t comm, std::uint64_t n, std::uint16_t check);
  /// Collective `n` of `comm` ended here, completed (`ok`) or not. Returns why the ranks
  /// disagree when it completed with a message for it still unawaited; empty otherwise.
  std::string ended(std::uint64_t comm, std::uint64_t n, bool ok);
  /// A message of collective `n` of `comm` from world rank `source`, with fingerprint
  /// `theirs` (not 0), arrived and no receive awaits it. Returns why the ranks disagree, or
  /// empty: then it is counted until matched() or its collective ends (a message of one
  /// that failed here is not counted).
  std::string unawaited(std::uint64_t comm, std::uint64_t n, int source, std::uint16_t theirs);
  /// A message that unawaited() counted was matched to a receive.
  void matched(std::uint64_t comm, std::uint64_t n);

 private:
  struct Call {
    bool running = false;
    std::uint16_t mine = 0;     // its fingerprint here, once running
    std::uint32_t waiting = 0;  // messages for it that arrived unawaited, not yet matched
    std::uint16_t theirs = 0;   // the first such message's fingerprint and sender
    int from = -1;
  };
  struct Done {
    std::uint64_t n = ~std::uint64_t{0};
    std::uint16_t check = 0;
  };
  struct Comm {
    std::vector<int> members;  // empty until watched
    int me = -1;
    std::map<std::uint64_t, Call> calls;
    std::array<Done, 64> done{};  // the last collectives completed here, by n % 64
  };
  int local(const Comm& c, int world) const;  // communicator rank, or the world rank
  // Why the ranks disagree: calls_differ's words when the fingerprints differ, else
  // call_unwanted's (core/call_check.hpp).
  std::string reason(std::uint64_t comm, const Comm& c, std::uint64_t n, std::uint16_t mine, int them,
                     std::uint16_t theirs) const;

  std::mutex mu_;
  std::unordered_map<std::uint64_t, Comm> comms_;
};

}  // namespace nexar::detail
