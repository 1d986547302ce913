// The TLS context: the GnuTLS certificate credentials a QUIC endpoint hands to every
// session, together with the role that decides how peers are checked. One per endpoint;
// the QUIC layer (quic::Endpoint, quic::Connection) sees TLS only through it.
#pragma once

#include "tls/node_key.hpp"
#include "tls/peer_check.hpp"

#include <gnutls/gnutls.h>

#include <string>

namespace nexar::tls {

/// GnuTLS certificate credentials and the rule for checking peers, for one of three roles:
///  * member: our chain and key, the cluster CA as the only trust anchor, and mutual
///    authentication (a server requires the client's certificate);
///  * seed: our chain and key; clients (joiners) have no certificate yet and present none;
///  * joiner: no certificate of our own; the seed is checked against a SeedTrust.
class TlsContext {
 public:
  enum class Role { member, seed, joiner };

  /// A member or seed context. Throws nexar::Error(Errc::tls) if role is joiner, the PEMs
  /// do not load (the CA PEM must hold exactly one certificate), the key does not match the
  /// certificate, or the certificate does not name creds.cluster and creds.node.
  explicit TlsContext(const NodeCredentials& creds, Role role = Role::member);
  /// A joiner context. Throws nexar::Error(Errc::tls) if trust.ca_pem does not load.
  explicit TlsContext(const SeedTrust& trust);
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  gnutls_certificate_credentials_t get() const noexcept { return cred_; }
  Role role() const noexcept { return role_; }
  /// Whether a server asks its clients for a certificate (members only).
  bool wants_client_cert() const noexcept { return role_ == Role::member; }
  /// The cluster name; for a joiner, the CA's cluster when a CA was given, else empty.
  const std::string& cluster() const noexcept { return cluster_; }
  const std::string& node() const noexcept { return node_; }

  /// Checks the certificate the peer presented on `session` by this context's rule
  /// (verify_peer for members and seeds, verify_seed for a joiner).
  /// Call from the handshake's verify hook; never throws.
  PeerCheck check(gnutls_session_t session) const;

 private:
  gnutls_certificate_credentials_t cred_ = nullptr;
  Role role_ = Role::member;
  std::string cluster_;
  std::string node_;
  std::string fingerprint_;  // joiner: the pinned seed fingerprint
  bool have_ca_ = false;     // joiner: a CA was given
};

}  // namespace nexar::tls
