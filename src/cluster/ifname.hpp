// Choosing the network interface a worker binds to, with the syntax of NCCL_SOCKET_IFNAME
// (used by NEXAR_SOCKET_IFNAME and JoinOptions::ifname).
//
// Spec syntax: a comma-separated list of interface names.
//   "eth,ib"       interfaces whose name starts with "eth" or "ib"
//   "^docker,lo"   every interface except those starting with "docker" or "lo"
//   "=ens5"        exactly the interface "ens5" (not "ens50")
//   "^=eth0"       every interface except exactly "eth0"
//   ""             every interface (see pick_interface for the preference order)
// '^' and '=' apply to the whole list and may only stand at its start, '^' first. White
// space around the spec and around entries is ignored; an empty entry ("eth,,lo", "eth,")
// is an error.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace nexar::cluster {

/// One address of one network interface.
struct InterfaceAddress {
  std::string name;       ///< interface name, e.g. "eth0"
  std::string ip;         ///< numeric address without port; IPv6 without brackets
  int family = 0;         ///< AF_INET or AF_INET6
  bool loopback = false;  ///< IFF_LOOPBACK
};

/// Addresses of the interfaces that are up, in the order getifaddrs() reports them. Entries
/// without an address, of other families (AF_PACKET) and IPv6 link-local addresses
/// (fe80::/10, unusable without a scope id) are left out. Throws nexar::Error(io) when
/// getifaddrs() fails.
std::vector<InterfaceAddress> list_interfaces();

/// A parsed interface spec (syntax above).
class InterfaceFilter {
 public:
  /// Matches every interface.
  InterfaceFilter() = default;
  /// Parses `spec`. Throws nexar::Error(invalid_argument) naming NEXAR_SOCKET_IFNAME and
  /// the spec for an empty entry, a misplaced '^' or '=', white space inside an entry, or
  /// an entry longer than an interface name can be.
  explicit InterfaceFilter(std::string_view spec);

  /// Whether interface `name` is selected.
  bool matches(std::string_view name) const;

  /// True for the empty spec (every interface matches).
  bool empty() const { return entries_.empty(); }
  bool exclude() const { return exclude_; }
  bool exact() const { return exact_; }
  const std::vector<std::string>& entries() const { return entries_; }

 private:
  std::vector<std::string> entries_;
  bool exclude_ = false;
  bool exact_ = false;
};

/// The first address in `all` (list order) whose interface matches `spec` and whose family
/// fits `family` (AF_INET, AF_INET6, or AF_UNSPEC: an IPv4 address if any matches, else an
/// IPv6 one). With an empty spec, interfaces are tried in three tiers, like NCCL's default:
/// non-loopback interfaces whose name starts with neither "docker" nor "lo", then any other
/// non-loopback interface, then loopback; the family preference applies within a tier.
/// Returns nullopt when nothing fits. Throws nexar::Error(invalid_argument) for a bad spec
/// or family.
std::optional<InterfaceAddress> pick_interface(std::string_view spec, int family,
                                               const std::vector<InterfaceAddress>& all);

/// pick_interface() over `all`, throwing nexar::Error(invalid_argument) when nothing fits:
///   NEXAR_SOCKET_IFNAME='ib' matches no up interface with an IPv4 address (have: lo, eth0)
InterfaceAddress require_interface(std::string_view spec, int family,
                                   const std::vector<InterfaceAddress>& all);

/// require_interface() over list_interfaces().
InterfaceAddress require_interface(std::string_view spec, int family);

}  // namespace nexar::cluster
