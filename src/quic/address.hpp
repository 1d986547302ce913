// Socket addresses: parsing "ip:port" / "[ip6]:port", printing, comparing.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>
#include <string>
#include <string_view>

namespace nexar::quic {

struct Address {
  sockaddr_storage storage{};
  socklen_t len = 0;

  const sockaddr* sa() const noexcept { return reinterpret_cast<const sockaddr*>(&storage); }
  sockaddr* sa() noexcept { return reinterpret_cast<sockaddr*>(&storage); }
  int family() const noexcept { return storage.ss_family; }
  std::uint16_t port() const noexcept;
  bool is_loopback() const noexcept;

  /// "127.0.0.1:4000" or "[::1]:4000".
  std::string to_string() const;

  /// Parses "ip:port" or "[ip6]:port" (numeric only). Throws nexar::Error(invalid_argument).
  static Address parse(std::string_view text);

  /// Like parse(), but the host may also be a name, resolved with getaddrinfo (IPv4
  /// preferred). Throws nexar::Error(invalid_argument) naming the text when it fails.
  static Address resolve(std::string_view text);

  /// The numeric address `host` (IPv4 or IPv6, no brackets) with `port`.
  /// Throws nexar::Error(invalid_argument).
  static Address with_host(std::string_view host, std::uint16_t port);

  /// The IP without port or brackets, e.g. "10.0.0.1" or "fd00::1".
  std::string host() const;
  void set_port(std::uint16_t port) noexcept;
  /// 0.0.0.0 or ::.
  bool is_wildcard() const noexcept;

  friend bool operator==(const Address& a, const Address& b) noexcept;
};

}  // namespace nexar::quic
