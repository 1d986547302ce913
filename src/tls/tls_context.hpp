// Cluster PKI: a per-cluster CA, node keys generated where they are used, CSRs, signing,
// and the peer-certificate check run during every QUIC handshake.
//
// Identity: a node certificate has subject "O=<cluster>,CN=<node>" and a SAN URI
// "nexar://<cluster>/<node>". Keys are ECDSA P-256. Private keys never leave the object
// (or process) that generated them; only CSRs and certificates travel.
#pragma once

#include <gnutls/gnutls.h>

#include <memory>
#include <string>
#include <string_view>

namespace nexar::tls {

/// A node's private key, generated locally.
class NodeKey {
 public:
  /// Generates a fresh ECDSA P-256 key. Throws nexar::Error(Errc::tls) on failure.
  static NodeKey generate();
  /// A PEM certificate signing request naming `cluster` and `node`, signed by this key.
  std::string make_csr(std::string_view cluster, std::string_view node) const;
  /// The private key, PEM (PKCS#8). Stays in this process.
  const std::string& key_pem() const noexcept { return key_pem_; }

 private:
  std::string key_pem_;
};

/// The certificate authority of one cluster.
class ClusterCa {
 public:
  /// Creates a CA for `cluster` with a fresh key (self-signed, 10 years).
  static ClusterCa create(std::string cluster);
  const std::string& cluster() const noexcept { return cluster_; }
  const std::string& cert_pem() const noexcept { return cert_pem_; }
  /// Checks the CSR's self-signature and that it names this cluster and `node`, then
  /// issues a certificate (1 year) for it. Throws nexar::Error(Errc::tls) naming the
  /// problem otherwise.
  std::string sign(std::string_view csr_pem, std::string_view node) const;

 private:
  std::string cluster_;
  std::string cert_pem_;
  std::string key_pem_;
};

/// What a node presents and trusts.
struct NodeCredentials {
  std::string cluster;
  std::string node;
  std::string ca_pem;    ///< the cluster CA certificate (trust anchor)
  std::string cert_pem;  ///< this node's certificate, signed by the CA
  std::string key_pem;   ///< this node's private key
};

/// Generates a key for `node`, makes a CSR and has `ca` sign it (in-process clusters).
NodeCredentials issue_local(const ClusterCa& ca, std::string node);

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

/// GnuTLS certificate credentials and the rule for checking peers, for one of three roles:
///  * member: our chain and key, the cluster CA as the only trust anchor, and mutual
///    authentication (a server requires the client's certificate);
///  * seed: our chain and key; clients (joiners) have no certificate yet and present none;
///  * joiner: no certificate of our own; the seed is checked against a SeedTrust.
class TlsContext {
 public:
  enum class Role { member, seed, joiner };

  /// A member or seed context. Throws nexar::Error(Errc::tls) if the PEMs do not load or
  /// the certificate does not name creds.cluster and creds.node.
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

  /// Checks the certificate the peer presented on `session` by this context's rule.
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

/// Checks the certificate the peer presented on `session`: it chains to the cluster CA
/// loaded in the session's credentials, is within its validity period, and names
/// `cluster`. Returns the node name it carries. Call from the handshake's verify hook.
PeerCheck verify_peer(gnutls_session_t session, std::string_view cluster);

}  // namespace nexar::tls
