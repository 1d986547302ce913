#include "tls/mac.hpp"

#include <gnutls/crypto.h>

#include <cstring>

#include "tls/gnutls_util.hpp"

namespace nexar::tls {

Mac mac(std::span<const std::uint8_t, 32> key, std::initializer_list<std::span<const std::byte>> parts) {
  gnutls_hmac_hd_t h = nullptr;
  detail::check_rc(gnutls_hmac_init(&h, GNUTLS_MAC_SHA256, key.data(), key.size()), "gnutls_hmac_init");
  for (auto p : parts) {
    if (p.empty()) continue;
    if (int rc = gnutls_hmac(h, p.data(), p.size()); rc < 0) {
      gnutls_hmac_deinit(h, nullptr);
      detail::check_rc(rc, "gnutls_hmac");
    }
  }
  std::uint8_t full[32];
  gnutls_hmac_deinit(h, full);
  Mac out;
  std::memcpy(out.data(), full, out.size());
  return out;
}

bool mac_matches(std::span<const std::uint8_t, 32> key, std::initializer_list<std::span<const std::byte>> parts,
                 std::span<const std::byte, mac_size> tag) {
  const Mac want = mac(key, parts);
  return gnutls_memcmp(want.data(), tag.data(), mac_size) == 0;
}

void random_bytes(std::span<std::uint8_t> out) {
  detail::check_rc(gnutls_rnd(GNUTLS_RND_NONCE, out.data(), out.size()), "gnutls_rnd");
}

}  // namespace nexar::tls
