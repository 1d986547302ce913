#include "quic/address.hpp"

#include <arpa/inet.h>
#include <netdb.h>

#include <cstring>

#include <nexar/error.hpp>

namespace nexar::quic {

std::uint16_t Address::port() const noexcept {
  if (family() == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&storage)->sin_port);
  if (family() == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_port);
  return 0;
}

bool Address::is_loopback() const noexcept {
  if (family() == AF_INET) {
    auto a = ntohl(reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr.s_addr);
    return (a >> 24) == 127;
  }
  if (family() == AF_INET6) {
    return IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_addr);
  }
  return false;
}

std::string Address::to_string() const {
  char buf[INET6_ADDRSTRLEN] = {};
  if (family() == AF_INET) {
    auto* in = reinterpret_cast<const sockaddr_in*>(&storage);
    inet_ntop(AF_INET, &in->sin_addr, buf, sizeof buf);
    std::string out(buf);
    out.append(":").append(std::to_string(port()));
    return out;
  }
  if (family() == AF_INET6) {
    auto* in6 = reinterpret_cast<const sockaddr_in6*>(&storage);
    inet_ntop(AF_INET6, &in6->sin6_addr, buf, sizeof buf);
    std::string out("[");
    out.append(buf).append("]:").append(std::to_string(port()));
    return out;
  }
  return "?";
}

namespace {

struct HostPort {
  std::string host;
  std::uint16_t port = 0;
};

// Splits "host:port" / "[ip6]:port"; the host is not interpreted.
HostPort split_host_port(std::string_view text) {
  auto fail = [&](const char* why) {
    return Error(Errc::invalid_argument,
                 "address '" + std::string(text) + "': " + why + " (expected ip:port or [ip6]:port)");
  };
  HostPort hp;
  std::string_view port_text;
  if (!text.empty() && text.front() == '[') {
    auto close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':')
      throw fail("unbalanced brackets");
    hp.host = std::string(text.substr(1, close - 1));
    port_text = text.substr(close + 2);
  } else {
    auto colon = text.rfind(':');
    if (colon == std::string_view::npos) throw fail("missing port");
    hp.host = std::string(text.substr(0, colon));
    if (hp.host.find(':') != std::string::npos) throw fail("IPv6 addresses need brackets");
    port_text = text.substr(colon + 1);
  }
  if (hp.host.empty()) throw fail("missing host");
  if (port_text.empty() || port_text.size() > 5) throw fail("bad port");
  unsigned port = 0;
  for (char c : port_text) {
    if (c < '0' || c > '9') throw fail("bad port");
    port = port * 10 + unsigned(c - '0');
  }
  if (port > 65535) throw fail("port out of range");
  hp.port = static_cast<std::uint16_t>(port);
  return hp;
}

bool numeric(const std::string& host, std::uint16_t port, Address& a) {
  a = Address{};
  auto* in = reinterpret_cast<sockaddr_in*>(&a.storage);
  auto* in6 = reinterpret_cast<sockaddr_in6*>(&a.storage);
  if (inet_pton(AF_INET, host.c_str(), &in->sin_addr) == 1) {
    in->sin_family = AF_INET;
    in->sin_port = htons(port);
    a.len = sizeof(sockaddr_in);
    return true;
  }
  if (inet_pton(AF_INET6, host.c_str(), &in6->sin6_addr) == 1) {
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(port);
    a.len = sizeof(sockaddr_in6);
    return true;
  }
  return false;
}

}  // namespace

Address Address::parse(std::string_view text) {
  HostPort hp = split_host_port(text);
  Address a;
  if (!numeric(hp.host, hp.port, a))
    throw Error(Errc::invalid_argument, "address '" + std::string(text) +
                                            "': not a numeric IPv4 or IPv6 address "
                                            "(expected ip:port or [ip6]:port)");
  return a;
}

Address Address::resolve(std::string_view text) {
  HostPort hp = split_host_port(text);
  Address a;
  if (numeric(hp.host, hp.port, a)) return a;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(hp.host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr)
    throw Error(Errc::invalid_argument, "address '" + std::string(text) + "': cannot resolve '" +
                                            hp.host + "': " + gai_strerror(rc));
  // Prefer IPv4, as most launchers' host names are meant for it.
  const addrinfo* pick = res;
  for (const addrinfo* p = res; p != nullptr; p = p->ai_next)
    if (p->ai_family == AF_INET) {
      pick = p;
      break;
    }
  std::memcpy(&a.storage, pick->ai_addr, pick->ai_addrlen);
  a.len = static_cast<socklen_t>(pick->ai_addrlen);
  ::freeaddrinfo(res);
  a.set_port(hp.port);
  return a;
}

void Address::set_port(std::uint16_t p) noexcept {
  if (family() == AF_INET) reinterpret_cast<sockaddr_in*>(&storage)->sin_port = htons(p);
  if (family() == AF_INET6) reinterpret_cast<sockaddr_in6*>(&storage)->sin6_port = htons(p);
}

std::string Address::host() const {
  char buf[INET6_ADDRSTRLEN] = {};
  if (family() == AF_INET)
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr, buf, sizeof buf);
  else if (family() == AF_INET6)
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_addr, buf, sizeof buf);
  return buf;
}

bool Address::is_wildcard() const noexcept {
  if (family() == AF_INET)
    return reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr.s_addr == htonl(INADDR_ANY);
  if (family() == AF_INET6)
    return IN6_IS_ADDR_UNSPECIFIED(&reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_addr);
  return false;
}

Address Address::with_host(std::string_view host, std::uint16_t port) {
  Address a;
  if (!numeric(std::string(host), port, a))
    throw Error(Errc::invalid_argument,
                "'" + std::string(host) + "' is not a numeric IPv4 or IPv6 address");
  return a;
}

bool operator==(const Address& a, const Address& b) noexcept {
  return a.len == b.len && std::memcmp(&a.storage, &b.storage, a.len) == 0;
}

}  // namespace nexar::quic
