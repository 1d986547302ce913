// The fingerprint of a collective call: the part of a call every member must pass alike and
// that a message's size cannot betray. Two ranks that run collective #k of a communicator
// as all_reduce(f32, sum) and all_reduce(f32, max), or as all_reduce and reduce_scatter of
// the same bytes, exchange messages of matching sizes and would end with silently wrong
// results. Each collective message carries its call's fingerprint in the frame header
// (docs/PROTOCOL.md, "check"), and a receiver whose own call differs fails the operation
// instead, naming both calls.
#pragma once

#include <nexar/dtype.hpp>

#include <cstdint>
#include <iterator>
#include <string>
#include <string_view>

namespace nexar::detail {

/// The collectives a fingerprint names, by number; 0 stands for any other. Append only: a
/// collective's place is its number on the wire (docs/PROTOCOL.md).
struct CallName {
  std::string_view name;
  bool reduces;  // takes a reduction operator (describe_call shows it)
};
inline constexpr CallName kCallNames[] = {
    {"another collective", false}, {"barrier", false},        {"all_reduce", true},
    {"all_reduce_bucketed", true}, {"all_reduce_compressed", true}, {"all_reduce_sharded", true},
    {"broadcast", false},          {"reduce", true},          {"all_gather", false},
    {"all_gather_v", false},       {"reduce_scatter", true},  {"all_to_all", false},
    {"all_to_all_v", false},       {"gather", false},         {"gather_v", false},
    {"scatter", false},            {"scatter_v", false},      {"scan", true},
    {"exclusive_scan", true},      {"split", false}};
static_assert(std::size(kCallNames) <= 32, "five bits name the collective");

/// Collective `name`'s number in a fingerprint, 0 for a name not in the list. Constant when
/// `name` is: `constexpr unsigned k = call_kind("all_reduce");`.
constexpr unsigned call_kind(std::string_view name) noexcept {
  for (unsigned i = 1; i < std::size(kCallNames); ++i)
    if (kCallNames[i].name == name) return i;
  return 0;
}

/// The fingerprint of collective number `kind` (call_kind) on elements of type `t` reduced
/// by `op` (collectives that reduce nothing pass ReduceOp::sum), with root `root` (-1 for
/// collectives without one). 16 bits:
///   bit 15      always 1 (0 means: no fingerprint, compare nothing)
///   bits 10..14 the collective (kCallNames)
///   bits 6..9   the element type (DataType's value)
///   bits 3..5   the reduction operator (ReduceOp's value)
///   bits 0..2   the root modulo 8 (0 without one): roots that differ by a multiple of 8
///               look alike here, and are caught only when a message goes unawaited
///               (transport/call_registry.hpp)
/// Every field decodes, so the error can say what the other rank called.
constexpr std::uint16_t call_check(unsigned kind, DataType t, ReduceOp op, int root = -1) noexcept {
  return static_cast<std::uint16_t>(0x8000u | (kind & 0x1fu) << 10 | (static_cast<unsigned>(t) & 0xfu) << 6 |
                                    (static_cast<unsigned>(op) & 0x7u) << 3 |
                                    (root > 0 ? static_cast<unsigned>(root) & 0x7u : 0u));
}
/// The same by the collective's name (as Coll::name spells it): a scan of the names, which
/// shows where a call costs 0.2 us (8 B through the mailboxes): there, take call_kind once.
constexpr std::uint16_t call_check(std::string_view name, DataType t, ReduceOp op, int root = -1) noexcept {
  return call_check(call_kind(name), t, op, root);
}

/// The element type and the reduction operator a fingerprint holds (u8 and sum for one
/// this build cannot read).
constexpr DataType check_type(std::uint16_t check) noexcept {
  const unsigned t = check >> 6 & 0xfu;
  return t <= static_cast<unsigned>(DataType::u64) ? static_cast<DataType>(t) : DataType::u8;
}
constexpr ReduceOp check_op(std::uint16_t check) noexcept {
  const unsigned op = check >> 3 & 0x7u;
  return op <= static_cast<unsigned>(ReduceOp::avg) ? static_cast<ReduceOp>(op) : ReduceOp::sum;
}

/// Whether collective number `kind` has a root (broadcast, reduce, gather, scatter and their
/// v-forms): its fingerprint then holds the root modulo 8.
constexpr bool call_rooted(unsigned kind) noexcept {
  const std::string_view n = kind < std::size(kCallNames) ? kCallNames[kind].name : std::string_view();
  return n == "broadcast" || n == "reduce" || n == "gather" || n == "gather_v" || n == "scatter" || n == "scatter_v";
}

/// Ranks up to which a fingerprint's root (modulo 8) is the root itself.
inline constexpr int kRootsExact = 8;

/// The call a fingerprint describes, as a reader would write it: "all_reduce(f32, max)",
/// "all_gather(u64)" for a collective that reduces nothing, "broadcast(f32, root 2)" for
/// one with a root. `world`: the ranks there are; from 9 on, a root is shown modulo 8
/// ("root 2 mod 8"), as the fingerprint holds it.
std::string describe_call(std::uint16_t check, int world = kRootsExact);

/// The words every rank's error carries when two members' calls differ: "ranks called
/// different collectives as <which> of communicator 0x..: rank <me> called <mine> but rank
/// <them> called <theirs>". `which` names the call ("collective #12"); ranks are the
/// communicator's.
std::string calls_differ(std::string_view which, std::uint64_t comm, int me, std::uint16_t mine, int them,
                         std::uint16_t theirs, int world = kRootsExact);
/// The words every rank's error carries when a member's message of a collective has
/// another size than the receiver's call expects: "ranks called different collectives as
/// <which> of communicator 0x..: rank <them> sent rank <me> <sent> bytes where rank <me>
/// expects <expected> (they disagree on its count or element type)".
std::string sizes_differ(std::string_view which, std::uint64_t comm, int me, std::uint64_t expected, int them,
                         std::uint64_t sent);
/// The words for a message nobody took: rank <them> sent rank <me> a message of its call
/// `theirs` that <me>'s call `mine` (0: unknown) completed without. calls_differ's words
/// when the fingerprints differ; otherwise the calls differ in what a fingerprint does not
/// hold (a root beyond modulo 8, the counts, a forced algorithm), which the words say.
std::string call_unwanted(std::string_view which, std::uint64_t comm, int me, std::uint16_t mine, int them,
                          std::uint16_t theirs, int world = kRootsExact);

}  // namespace nexar::detail
