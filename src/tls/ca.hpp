// The cluster CA: the trust root of one cluster. Each cluster (a bootstrap_local world, or
// the world a Seed admits) creates its own CA; a node certificate it signs is what makes a
// peer a member, so mutual TLS inside a cluster needs no outside PKI.
//
// Identity: a node certificate has subject "O=<cluster>,CN=<node>" and a SAN URI
// "nexar://<cluster>/<node>". Keys are ECDSA P-256. The CA key never leaves the object
// that created it; nodes send it CSRs, not keys (see tls/node_key.hpp).
#pragma once

#include <string>
#include <string_view>

namespace nexar::tls {

/// The certificate authority of one cluster.
class ClusterCa {
 public:
  /// Creates a CA for `cluster` with a fresh key (self-signed, 10 years). Throws
  /// nexar::Error(Errc::tls) if `cluster` is empty or GnuTLS fails.
  static ClusterCa create(std::string cluster);
  const std::string& cluster() const noexcept { return cluster_; }
  /// The CA certificate, PEM: the trust anchor every member loads.
  const std::string& cert_pem() const noexcept { return cert_pem_; }
  /// Checks the CSR's self-signature, that it names this cluster and `node`, and that its
  /// key is ECDSA P-256, then issues a certificate (1 year) for it. Throws nexar::Error(Errc::tls) naming the
  /// problem otherwise.
  std::string sign(std::string_view csr_pem, std::string_view node) const;

 private:
  std::string cluster_;
  std::string cert_pem_;
  std::string key_pem_;
};

}  // namespace nexar::tls
