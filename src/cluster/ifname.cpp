#include "cluster/ifname.hpp"

#include <nexar/error.hpp>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

#include "core/text.hpp"

namespace nexar::cluster {
namespace {

constexpr const char* kVar = "NEXAR_SOCKET_IFNAME";

using detail::is_space;
using detail::trim;

[[noreturn]] void bad_spec(std::string_view spec, std::string_view why) {
  throw Error(Errc::invalid_argument, fmt::format("{}='{}': {}", kVar, spec, why));
}

bool is_ipv6_link_local(const in6_addr& a) {
  return a.s6_addr[0] == 0xfe && (a.s6_addr[1] & 0xc0) == 0x80;
}

void check_family(int family) {
  if (family != AF_INET && family != AF_INET6 && family != AF_UNSPEC) {
    throw Error(Errc::invalid_argument,
                fmt::format("pick_interface: address family {} is not AF_INET, AF_INET6 or "
                            "AF_UNSPEC",
                            family));
  }
}

const char* family_text(int family) {
  switch (family) {
    case AF_INET:
      return "an IPv4 address";
    case AF_INET6:
      return "an IPv6 address";
    default:
      return "an IPv4 or IPv6 address";
  }
}

}  // namespace

std::vector<InterfaceAddress> list_interfaces() {
  ifaddrs* head = nullptr;
  if (::getifaddrs(&head) != 0) {
    const int err = errno;
    throw Error(Errc::io, fmt::format("getifaddrs: {}", std::strerror(err)));
  }
  const std::unique_ptr<ifaddrs, void (*)(ifaddrs*)> guard(head, &::freeifaddrs);
  std::vector<InterfaceAddress> out;
  for (const ifaddrs* i = head; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_name == nullptr) continue;
    if ((i->ifa_flags & static_cast<unsigned>(IFF_UP)) == 0) continue;
    char text[INET6_ADDRSTRLEN] = {};
    InterfaceAddress a;
    if (i->ifa_addr->sa_family == AF_INET) {
      sockaddr_in sin{};
      std::memcpy(&sin, i->ifa_addr, sizeof sin);
      if (::inet_ntop(AF_INET, &sin.sin_addr, text, sizeof text) == nullptr) continue;
      a.family = AF_INET;
    } else if (i->ifa_addr->sa_family == AF_INET6) {
      sockaddr_in6 sin6{};
      std::memcpy(&sin6, i->ifa_addr, sizeof sin6);
      if (is_ipv6_link_local(sin6.sin6_addr)) continue;
      if (::inet_ntop(AF_INET6, &sin6.sin6_addr, text, sizeof text) == nullptr) continue;
      a.family = AF_INET6;
    } else {
      continue;
    }
    a.name = i->ifa_name;
    a.ip = text;
    a.loopback = (i->ifa_flags & static_cast<unsigned>(IFF_LOOPBACK)) != 0;
    out.push_back(std::move(a));
  }
  return out;
}

InterfaceFilter::InterfaceFilter(std::string_view spec) {
  std::string_view s = trim(spec);
  if (s.empty()) return;
  if (s.front() == '^') {
    exclude_ = true;
    s = trim(s.substr(1));
  }
  if (!s.empty() && s.front() == '=') {
    exact_ = true;
    s = trim(s.substr(1));
  }
  if (s.empty()) bad_spec(spec, "no interface names after '^' / '='");
  for (;;) {
    const std::size_t comma = s.find(',');
    const std::string_view entry = trim(s.substr(0, comma));
    if (entry.empty()) {
      bad_spec(spec, "empty entry (expected comma-separated interface names or prefixes)");
    }
    if (entry.find_first_of("^=") != std::string_view::npos) {
      bad_spec(spec, fmt::format("entry '{}': '^' and '=' may only stand at the start of the "
                                 "whole list, '^' first (e.g. \"^=eth0,eth1\")",
                                 entry));
    }
    if (std::any_of(entry.begin(), entry.end(), is_space)) {
      bad_spec(spec, fmt::format("entry '{}' contains white space", entry));
    }
    if (entry.size() >= IFNAMSIZ) {
      bad_spec(spec, fmt::format("entry '{}' is longer than an interface name can be ({} "
                                 "characters)",
                                 entry, IFNAMSIZ - 1));
    }
    entries_.emplace_back(entry);
    if (comma == std::string_view::npos) break;
    s = s.substr(comma + 1);
  }
}

bool InterfaceFilter::matches(std::string_view name) const {
  if (entries_.empty()) return true;
  const bool listed = std::any_of(entries_.begin(), entries_.end(), [&](const std::string& e) {
    return exact_ ? name == e : name.starts_with(e);
  });
  return listed != exclude_;
}

std::optional<InterfaceAddress> pick_interface(std::string_view spec, int family,
                                               const std::vector<InterfaceAddress>& all) {
  check_family(family);
  const InterfaceFilter filter(spec);
  const int families[2] = {family == AF_UNSPEC ? AF_INET : family, AF_INET6};
  const std::size_t nfamilies = family == AF_UNSPEC ? 2 : 1;

  // The first matching address of the preferred family, restricted to `tier`.
  const auto pick = [&](auto&& tier) -> std::optional<InterfaceAddress> {
    for (std::size_t f = 0; f < nfamilies; ++f) {
      for (const InterfaceAddress& a : all) {
        if (a.family == families[f] && filter.matches(a.name) && tier(a)) return a;
      }
    }
    return std::nullopt;
  };

  if (!filter.empty()) {
    // An exclusion such as "^docker" still matches loopback: prefer what peers on other
    // hosts can reach, and use loopback only when it is all that matches (as with "lo").
    if (auto a = pick([](const InterfaceAddress& x) { return !x.loopback; })) return a;
    return pick([](const InterfaceAddress&) { return true; });
  }
  if (auto a = pick([](const InterfaceAddress& x) {
        return !x.loopback && !x.name.starts_with("docker") && !x.name.starts_with("lo");
      })) {
    return a;
  }
  if (auto a = pick([](const InterfaceAddress& x) { return !x.loopback; })) return a;
  return pick([](const InterfaceAddress& x) { return x.loopback; });
}

InterfaceAddress require_interface(std::string_view spec, int family,
                                   const std::vector<InterfaceAddress>& all) {
  if (auto a = pick_interface(spec, family, all)) return *std::move(a);
  std::vector<std::string_view> names;
  std::string have;
  for (const InterfaceAddress& a : all) {
    if (std::find(names.begin(), names.end(), a.name) != names.end()) continue;
    names.push_back(a.name);
    if (!have.empty()) have += ", ";
    have += a.name;
  }
  throw Error(Errc::invalid_argument,
              fmt::format("{}='{}' matches no up interface with {} (have: {})", kVar, spec,
                          family_text(family), have.empty() ? "none" : have));
}

InterfaceAddress require_interface(std::string_view spec, int family) {
  // Parse first, so a malformed spec is reported as such even on a host with no
  // interfaces, and before the system call.
  check_family(family);
  (void)InterfaceFilter(spec);
  return require_interface(spec, family, list_interfaces());
}

}  // namespace nexar::cluster
