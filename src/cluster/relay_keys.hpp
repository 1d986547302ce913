// Relay keys: the secret each pair of ranks shares, and nobody else, to authenticate the
// frames relayed between them (docs/SECURITY.md, "Relays"). The seed, the cluster's key
// distribution centre, holds one random master secret per job and derives every pair's
// key from it; each node gets only the keys of the pairs it is part of, over its TLS link to
// the seed. In-process clusters (plan_local) derive them the same way from a master of
// their own.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "transport/node.hpp"

namespace nexar::cluster {

/// A job's master secret: every relay key is derived from it.
using RelayMaster = std::array<std::uint8_t, 32>;

/// 256 random bits from GnuTLS's key generator. Throws nexar::Error(Errc::tls) on failure.
RelayMaster random_relay_master();

/// The key that world ranks `a` and `b` (a != b), with node names `name_a` and `name_b`,
/// share:
///
///     HMAC-SHA256(master, "nexar relay key v1" || u32 lo || u32 hi || name(lo) || 0x00 || name(hi))
///
/// where lo = min(a, b), hi = max(a, b), the u32s little-endian. Symmetric: relay_key(m, a,
/// na, b, nb) == relay_key(m, b, nb, a, na). Throws nexar::Error: invalid_argument for a == b
/// or a negative rank, tls if GnuTLS fails.
detail::RelayKey relay_key(const RelayMaster& master, int a, std::string_view name_a, int b,
                           std::string_view name_b);

/// The keys world rank `rank` shares with each rank of `names` (node names indexed by world
/// rank): relay_key() for every other rank, zero at `rank` itself. Throws as relay_key(), and
/// invalid_argument when `rank` is not an index of `names`.
std::vector<detail::RelayKey> relay_keys_of(const RelayMaster& master, int rank,
                                            const std::vector<std::string>& names);

}  // namespace nexar::cluster
