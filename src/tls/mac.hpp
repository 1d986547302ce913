// Message authentication with a key two ranks share (HMAC-SHA256, truncated): what lets
// the destination of a relayed frame know that its origin wrote it (docs/SECURITY.md,
// "Relays"; docs/PROTOCOL.md, "Relay").
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>

namespace nexar::tls {

inline constexpr std::size_t mac_size = 16;
using Mac = std::array<std::uint8_t, mac_size>;

/// HMAC-SHA256 under `key` of the concatenation of `parts`, its first 16 bytes. Throws
/// nexar::Error(Errc::tls) if GnuTLS fails.
Mac mac(std::span<const std::uint8_t, 32> key, std::initializer_list<std::span<const std::byte>> parts);

/// Whether `tag` is the mac() of `parts`; takes the same time wherever they differ.
bool mac_matches(std::span<const std::uint8_t, 32> key, std::initializer_list<std::span<const std::byte>> parts,
                 std::span<const std::byte, mac_size> tag);

/// Fills `out` with fresh random bytes (nonces). Throws nexar::Error(Errc::tls) if GnuTLS
/// fails.
void random_bytes(std::span<std::uint8_t> out);

}  // namespace nexar::tls
