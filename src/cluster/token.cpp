#include "cluster/token.hpp"

#include <gnutls/crypto.h>

#include <nexar/error.hpp>

namespace nexar::cluster {

std::string random_token() {
  unsigned char rnd[32];
  if (gnutls_rnd(GNUTLS_RND_KEY, rnd, sizeof rnd) != 0)
    throw Error(Errc::tls, "cannot generate a random cluster token");
  std::string out;
  for (unsigned char c : rnd) {
    out += "0123456789abcdef"[c >> 4];
    out += "0123456789abcdef"[c & 15];
  }
  return out;
}

wire::Proof prove(std::string_view token, ProofRole role, const std::array<std::uint8_t, 32>& secret) {
  // Distinct labels: the seed's proof can never be reflected back as a joiner's.
  const std::string_view label = role == ProofRole::seed ? "nexar seed proof v1" : "nexar joiner proof v1";
  std::string msg(label);
  msg.push_back('\0');
  msg.append(reinterpret_cast<const char*>(secret.data()), secret.size());
  wire::Proof out{};
  if (gnutls_hmac_fast(GNUTLS_MAC_SHA256, token.data(), token.size(), msg.data(), msg.size(),
                       out.data()) != 0)
    throw Error(Errc::tls, "HMAC-SHA256 failed");
  return out;
}

bool proofs_equal(const wire::Proof& a, const wire::Proof& b) noexcept {
  unsigned diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace nexar::cluster
