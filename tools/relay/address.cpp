#include "address.hpp"

#include <arpa/inet.h>

#include <cstring>
#include <functional>
#include <stdexcept>

namespace nexar_relay {

std::uint16_t Address::port() const {
  if (family() == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&storage)->sin_port);
  if (family() == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_port);
  return 0;
}

std::string Address::text() const {
  char ip[INET6_ADDRSTRLEN] = {};
  std::string out;
  if (family() == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr, ip, sizeof ip);
    out.append(ip);
  } else if (family() == AF_INET6) {
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_addr, ip, sizeof ip);
    // Appended piece by piece: "[" + std::string sets off a false -Wrestrict in GCC 12.
    out.push_back('[');
    out.append(ip);
    out.push_back(']');
  } else {
    return "?";
  }
  out.push_back(':');
  out.append(std::to_string(port()));
  return out;
}

Address Address::parse(std::string_view s, bool port_zero_ok) {
  std::string host;
  std::string_view port_text;
  if (!s.empty() && s.front() == '[') {
    const auto close = s.find(']');
    if (close == std::string_view::npos || close + 1 >= s.size() || s[close + 1] != ':')
      throw std::invalid_argument("'" + std::string(s) + "' is not [IPV6]:PORT");
    host = std::string(s.substr(1, close - 1));
    port_text = s.substr(close + 2);
  } else {
    const auto colon = s.rfind(':');
    if (colon == std::string_view::npos)
      throw std::invalid_argument("'" + std::string(s) + "' has no port (want IP:PORT)");
    host = std::string(s.substr(0, colon));
    if (host.find(':') != std::string::npos)
      throw std::invalid_argument("'" + std::string(s) + "': an IPv6 address goes in brackets, [IPV6]:PORT");
    port_text = s.substr(colon + 1);
  }
  unsigned long port = 0;
  if (port_text.empty() || port_text.size() > 5) port = 1 << 20;  // rejected below
  for (char c : port_text) {
    if (c < '0' || c > '9') {
      port = 1 << 20;
      break;
    }
    port = port * 10 + static_cast<unsigned long>(c - '0');
  }
  if (port > 65535) throw std::invalid_argument("'" + std::string(s) + "': bad port (want 0..65535)");
  if (port == 0 && !port_zero_ok) throw std::invalid_argument("'" + std::string(s) + "': port 0 cannot be dialled");

  Address a;
  if (auto* v4 = reinterpret_cast<sockaddr_in*>(&a.storage); ::inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<std::uint16_t>(port));
    a.len = sizeof(sockaddr_in);
    return a;
  }
  if (auto* v6 = reinterpret_cast<sockaddr_in6*>(&a.storage); ::inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<std::uint16_t>(port));
    a.len = sizeof(sockaddr_in6);
    return a;
  }
  throw std::invalid_argument("'" + std::string(s) + "': '" + host + "' is not an IPv4 or IPv6 address");
}

Address Address::local_of(int fd) {
  Address a;
  a.len = sizeof a.storage;
  ::getsockname(fd, a.sa(), &a.len);
  return a;
}

AddressKey::AddressKey(const sockaddr_storage& a) {
  bytes[0] = static_cast<std::uint8_t>(a.ss_family);
  if (a.ss_family == AF_INET) {
    const auto& v4 = reinterpret_cast<const sockaddr_in&>(a);
    std::memcpy(&bytes[2], &v4.sin_port, sizeof v4.sin_port);
    std::memcpy(&bytes[4], &v4.sin_addr, sizeof v4.sin_addr);
  } else if (a.ss_family == AF_INET6) {
    const auto& v6 = reinterpret_cast<const sockaddr_in6&>(a);
    std::memcpy(&bytes[2], &v6.sin6_port, sizeof v6.sin6_port);
    std::memcpy(&bytes[4], &v6.sin6_addr, sizeof v6.sin6_addr);
    std::memcpy(&bytes[20], &v6.sin6_scope_id, sizeof v6.sin6_scope_id);
  }
}

std::size_t AddressKeyHash::operator()(const AddressKey& k) const {
  return std::hash<std::string_view>{}(
      std::string_view(reinterpret_cast<const char*>(k.bytes.data()), k.bytes.size()));
}

}  // namespace nexar_relay
