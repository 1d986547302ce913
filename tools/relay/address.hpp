// nexar-relay's socket addresses: IP literals with a port, IPv4 or IPv6, parsed from the
// command line and used as hash keys for the relay's clients.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace nexar_relay {

struct Address {
  sockaddr_storage storage{};
  socklen_t len = 0;

  int family() const { return storage.ss_family; }
  std::uint16_t port() const;
  sockaddr* sa() { return reinterpret_cast<sockaddr*>(&storage); }
  const sockaddr* sa() const { return reinterpret_cast<const sockaddr*>(&storage); }
  /// "1.2.3.4:5" or "[::1]:5".
  std::string text() const;

  /// "ip:port" or "[ipv6]:port", IP literals only (a relay for benchmarks is given the
  /// addresses it must use, and a name that resolves differently later would silently
  /// relay elsewhere). Throws std::invalid_argument with the reason when `s` is not one, or
  /// when its port is 0 and `port_zero_ok` is false.
  static Address parse(std::string_view s, bool port_zero_ok);
  /// The address a socket is bound to.
  static Address local_of(int fd);
};

/// An address reduced to the bytes that tell two clients apart (family, port, IP, IPv6
/// scope), fixed size so it hashes and compares without allocating.
struct AddressKey {
  std::array<std::uint8_t, 24> bytes{};

  explicit AddressKey(const sockaddr_storage& a);
  bool operator==(const AddressKey&) const = default;
};

struct AddressKeyHash {
  std::size_t operator()(const AddressKey& k) const;
};

}  // namespace nexar_relay
