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

/// GnuTLS certificate credentials loaded from NodeCredentials: our chain and key, and the
/// cluster CA as the only trust anchor.
class TlsContext {
 public:
  /// Throws nexar::Error(Errc::tls) if the PEMs do not load.
  explicit TlsContext(const NodeCredentials& creds);
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  gnutls_certificate_credentials_t get() const noexcept { return cred_; }
  const std::string& cluster() const noexcept { return cluster_; }
  const std::string& node() const noexcept { return node_; }

 private:
  gnutls_certificate_credentials_t cred_ = nullptr;
  std::string cluster_;
  std::string node_;
};

/// Outcome of checking a peer's certificate.
struct PeerCheck {
  bool ok = false;
  std::string node;   ///< the peer's node name, when ok
  std::string error;  ///< why not, when !ok (e.g. "certificate is from cluster 'x'")
};

/// Checks the certificate the peer presented on `session`: it chains to the cluster CA
/// loaded in the session's credentials, is within its validity period, and names
/// `cluster`. Returns the node name it carries. Call from the handshake's verify hook.
PeerCheck verify_peer(gnutls_session_t session, std::string_view cluster);

}  // namespace nexar::tls
