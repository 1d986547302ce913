// MPI-style message matching for one matching space (data, bulk or collective) of a node:
// receives posted before their message arrived, and messages (or rendezvous announcements)
// that arrived before their receive was posted. Both lists keep arrival/post order, so the
// first match is always the oldest one: this is what makes (comm, source, tag) delivery
// non-overtaking.
// Engine thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <vector>

#include <nexar/request.hpp>

#include "engine/op_state.hpp"
#include "wire/frame.hpp"

namespace nexar::detail {

/// Message tags as matched: application tags are 0..max_tag; collectives use tags at or
/// above internal_tag_base, which any_tag never matches (docs/PROTOCOL.md, "Communicator
/// ids and collective tags").
using Tag = std::int64_t;
inline constexpr Tag internal_tag_base = Tag{1} << 62;

/// The tag of the n-th collective started on a communicator: n (mod 2^30) in bits 32..61.
constexpr Tag collective_tag(std::uint64_t n) noexcept {
  return internal_tag_base | static_cast<Tag>((n & ((std::uint64_t{1} << 30) - 1)) << 32);
}
/// The n (mod 2^30) of collective_tag(n) in a collective's tag or one of its messages' tags.
constexpr std::uint64_t collective_number(Tag tag) noexcept {
  return (static_cast<std::uint64_t>(tag) >> 32) & ((std::uint64_t{1} << 30) - 1);
}
/// The tag of the m-th message of collective `tag` between one rank and another: m (mod
/// 2^32) in the low 32 bits. Sender and receiver count the same messages in the same order
/// (the m-th send of an operation to a neighbour is matched by the neighbour's m-th receive
/// from it), so they agree on every message's tag, and no two messages in flight share
/// one: the transport may carry each on any connection of the pair
/// (Config::connections_per_peer) without reordering anything matching relies on.
constexpr Tag collective_message_tag(Tag tag, std::uint64_t m) noexcept {
  return tag | static_cast<Tag>(m & 0xffffffffu);
}

/// Which matching space a point-to-point operation uses; each has its own message lane
/// (lane_of below), so a message of one never waits behind another's.
enum class Domain { data = 0, bulk = 1, collective = 2 };
inline constexpr int domain_count = 3;

/// The lane that carries a matching space's messages, and back; only message lanes
/// (data, bulk, collective) have a matching space.
constexpr wire::Lane lane_of(Domain d) noexcept {
  switch (d) {
    case Domain::bulk: return wire::Lane::bulk;
    case Domain::collective: return wire::Lane::collective;
    case Domain::data: break;
  }
  return wire::Lane::data;
}
constexpr Domain domain_of(wire::Lane lane) noexcept {
  switch (lane) {
    case wire::Lane::bulk: return Domain::bulk;
    case wire::Lane::collective: return Domain::collective;
    default: return Domain::data;
  }
}

/// A receive posted by the application (or by a collective).
struct RecvOp {
  std::shared_ptr<OpState> op;
  std::uint64_t comm = 0;
  int source = any_source;  // world rank, or any_source
  Tag tag = any_tag;        // or any_tag
  std::byte* buf = nullptr;
  std::size_t cap = 0;
  /// World rank -> rank in the receiving communicator (null: the world itself).
  std::shared_ptr<const std::vector<int>> local_of;
  /// A collective's receive: anything but exactly `cap` bytes is an error.
  bool exact = false;
  /// A collective's receive: its call's fingerprint (core/call_check.hpp); 0 = none.
  std::uint16_t check = 0;

  bool matches(std::uint64_t c, int src, Tag t) const noexcept {
    return comm == c && (source == any_source || source == src) &&
           (tag == t || (tag == any_tag && t <= max_tag));
  }
  /// The Status the application sees: the source as a rank of its communicator.
  Status status(int world_src, Tag t, std::size_t bytes) const noexcept {
    return Status{local(world_src), t <= max_tag ? static_cast<int>(t) : -1, bytes};
  }
  /// World rank `world` as a rank of the receiving communicator, -1 if it is none of its
  /// members (a rank added to an elastic world after the communicator was made).
  int local(int world) const noexcept {
    if (!local_of) return world;
    const auto w = static_cast<std::size_t>(world);
    return w < local_of->size() ? (*local_of)[w] : -1;
  }
};

/// A message that arrived with no receive posted for it.
struct Unexpected {
  std::uint64_t comm = 0;
  int source = 0;
  Tag tag = 0;
  bool rendezvous = false;      // only announced (rts); the data waits for a cts
  std::uint64_t seq = 0;        // rendezvous id
  std::uint64_t size = 0;       // message size
  std::uint16_t check = 0;      // its collective call's fingerprint, 0 = none
  std::vector<std::byte> data;  // eager payload, filled as it arrives
  bool complete = false;        // eager payload fully arrived
  std::shared_ptr<RecvOp> waiter;  // receive matched while the payload was still arriving
};

class MatchQueue {
 public:
  /// Removes and returns the oldest posted receive matching an arrived message.
  std::shared_ptr<RecvOp> take_posted(std::uint64_t comm, int source, Tag tag);
  /// Finds the oldest unexpected message matching a new receive (not removed).
  std::list<std::shared_ptr<Unexpected>>::iterator find_unexpected(const RecvOp& r);

  void post(std::shared_ptr<RecvOp> r) { posted_.push_back(std::move(r)); }
  /// Re-posts a receive ahead of every other one (it was posted before all of them).
  void post_first(std::shared_ptr<RecvOp> r) { posted_.push_front(std::move(r)); }
  /// Removes a posted receive (cancellation); false if it was matched already.
  bool remove_posted(const OpState* op);
  /// Whether `op` is the receive an unexpected message still arriving was matched with
  /// (its bytes land in that receive's buffer as they come).
  bool awaits_arrival(const OpState* op) const;

  std::shared_ptr<Unexpected> add_unexpected(Unexpected u);
  void erase(std::list<std::shared_ptr<Unexpected>>::iterator it) { unexpected_.erase(it); }
  /// Removes an unexpected entry by identity.
  void erase(const Unexpected* u);
  std::list<std::shared_ptr<Unexpected>>::iterator end() { return unexpected_.end(); }

  std::list<std::shared_ptr<RecvOp>>& posted() noexcept { return posted_; }
  std::list<std::shared_ptr<Unexpected>>& unexpected() noexcept { return unexpected_; }

 private:
  std::list<std::shared_ptr<RecvOp>> posted_;
  std::list<std::shared_ptr<Unexpected>> unexpected_;
};

}  // namespace nexar::detail
