// A node's own key and what it presents: the key is generated where it is used and never
// leaves that process; the node sends only a CSR, and a cluster CA (tls/ca.hpp) turns it
// into a certificate. NodeCredentials bundles key, certificate and CA for a TlsContext.
#pragma once

#include <string>
#include <string_view>

namespace nexar::tls {

class ClusterCa;

/// A node's private key, generated locally.
class NodeKey {
 public:
  /// Generates a fresh ECDSA P-256 key. Throws nexar::Error(Errc::tls) on failure.
  static NodeKey generate();
  /// A PEM certificate signing request naming `cluster` and `node` (subject
  /// "O=<cluster>,CN=<node>", SAN URI "nexar://<cluster>/<node>"), signed by this key.
  /// Throws nexar::Error(Errc::tls) if a name is empty or GnuTLS fails.
  std::string make_csr(std::string_view cluster, std::string_view node) const;
  /// The private key, PEM (PKCS#8). Stays in this process.
  const std::string& key_pem() const noexcept { return key_pem_; }

 private:
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
/// Throws nexar::Error(Errc::tls) as NodeKey::make_csr and ClusterCa::sign do.
NodeCredentials issue_local(const ClusterCa& ca, std::string node);

}  // namespace nexar::tls
