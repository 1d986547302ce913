// Cluster tokens and the proofs of knowing one.
//
// The token itself never travels. After the TLS handshake each side of a seed connection
// sends HMAC-SHA256(token, role label || exporter secret), where the exporter secret is
// keying material of that very TLS session: a proof cannot be replayed on another
// connection, and an impostor seed learns nothing it could use to join (docs/SECURITY.md).
#pragma once

#include <string>
#include <string_view>

#include "wire/seed_message.hpp"

namespace nexar::cluster {

/// Label of the TLS exporter both sides derive the proof input from.
inline constexpr std::string_view exporter_label = "EXPORTER-nexar-seed-join";

enum class ProofRole { seed, joiner };

/// 256 random bits as 64 lowercase hex digits.
std::string random_token();

/// HMAC-SHA256(token, label(role) || secret). Throws nexar::Error(Errc::tls) on failure.
wire::Proof prove(std::string_view token, ProofRole role, const std::array<std::uint8_t, 32>& secret);

/// Compares two proofs in time independent of where they differ.
bool proofs_equal(const wire::Proof& a, const wire::Proof& b) noexcept;

}  // namespace nexar::cluster
