#include "cluster/relay_keys.hpp"

#include <gnutls/crypto.h>

#include <nexar/error.hpp>

#include <algorithm>
#include <type_traits>

#include "wire/seed_message.hpp"

namespace nexar::cluster {

// The seed protocol carries the keys as they are handed to the node.
static_assert(std::is_same_v<detail::RelayKey, wire::RelayKey>);

namespace {

constexpr std::string_view kLabel = "nexar relay key v1";

void put_u32(std::string& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xffu));
}

}  // namespace

RelayMaster random_relay_master() {
  RelayMaster m{};
  if (gnutls_rnd(GNUTLS_RND_KEY, m.data(), m.size()) != 0)
    throw Error(Errc::tls, "cannot generate the relay master secret");
  return m;
}

detail::RelayKey relay_key(const RelayMaster& master, int a, std::string_view name_a, int b,
                           std::string_view name_b) {
  if (a < 0 || b < 0 || a == b)
    throw Error(Errc::invalid_argument,
                "relay key of ranks " + std::to_string(a) + " and " + std::to_string(b) + ": not a pair");
  if (b < a) {
    std::swap(a, b);
    std::swap(name_a, name_b);
  }
  // Node names never contain NUL (the seed allows [A-Za-z0-9._-] only), so the separator
  // keeps (name_a, name_b) pairs apart; the ranks and the label have fixed lengths.
  std::string msg(kLabel);
  msg.reserve(kLabel.size() + 8 + name_a.size() + 1 + name_b.size());
  put_u32(msg, static_cast<std::uint32_t>(a));
  put_u32(msg, static_cast<std::uint32_t>(b));
  msg.append(name_a);
  msg.push_back('\0');
  msg.append(name_b);
  detail::RelayKey key{};
  if (gnutls_hmac_fast(GNUTLS_MAC_SHA256, master.data(), master.size(), msg.data(), msg.size(), key.data()) != 0)
    throw Error(Errc::tls, "HMAC-SHA256 failed deriving a relay key");
  return key;
}

std::vector<detail::RelayKey> relay_keys_of(const RelayMaster& master, int rank,
                                            const std::vector<std::string>& names) {
  if (rank < 0 || static_cast<std::size_t>(rank) >= names.size())
    throw Error(Errc::invalid_argument,
                "relay keys of rank " + std::to_string(rank) + " among " + std::to_string(names.size()) + " ranks");
  std::vector<detail::RelayKey> keys(names.size());
  for (std::size_t r = 0; r < names.size(); ++r) {
    const int other = static_cast<int>(r);
    if (other != rank) keys[r] = relay_key(master, rank, names[static_cast<std::size_t>(rank)], other, names[r]);
  }
  return keys;
}

}  // namespace nexar::cluster
