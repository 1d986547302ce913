// The peer check: what a node accepts from the other side of a handshake. A member accepts
// a certificate that chains to its cluster CA and names its cluster (the node name comes
// from it); a joiner accepts the seed by a pinned certificate fingerprint and/or the
// cluster CA, or leaves it to the token proof that follows the handshake. TlsContext
// (tls/tls_context.hpp) picks the rule by its role; these are the rules themselves.
#pragma once

#include <gnutls/gnutls.h>

#include <string>
#include <string_view>

namespace nexar::tls {

/// The node name of a seed's certificate.
inline constexpr std::string_view seed_node = "seed";

/// What a joiner checks about the seed during the handshake, besides the token proof that
/// follows it. Both empty: nothing (the token proof alone authenticates the seed).
struct SeedTrust {
  std::string fingerprint;  ///< "sha256:<hex>" of the seed certificate, or empty
  std::string ca_pem;       ///< the cluster CA the seed certificate must chain to, or empty
};

/// "sha256:<64 lowercase hex digits>" of a PEM certificate's DER encoding.
/// Throws nexar::Error(Errc::tls) if the PEM does not parse.
std::string fingerprint(std::string_view cert_pem);

/// Outcome of checking a peer's certificate.
struct PeerCheck {
  bool ok = false;
  std::string node;   ///< the peer's node name, when ok
  std::string error;  ///< why not, when !ok (e.g. "certificate is from cluster 'x'")
};

/// Checks the certificate the peer presented on `session`: it chains to the cluster CA
/// loaded in the session's credentials, is within its validity period, and names
/// `cluster` (subject O and a matching nexar:// SAN URI). Returns the node name it
/// carries. Call from the handshake's verify hook; never throws.
PeerCheck verify_peer(gnutls_session_t session, std::string_view cluster);

/// A joiner's check of the seed on `session`: if `pinned` ("sha256:<lowercase hex>") is
/// not empty, the seed certificate's fingerprint must equal it; if `have_ca`, the seed
/// must also pass verify_peer for `cluster` and name the node seed_node. With neither,
/// accepts any certificate. On success node is seed_node. Never throws.
PeerCheck verify_seed(gnutls_session_t session, std::string_view pinned, bool have_ca,
                      std::string_view cluster);

}  // namespace nexar::tls
