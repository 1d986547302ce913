#include "tls/node_key.hpp"

#include "tls/ca.hpp"
#include "tls/gnutls_util.hpp"

#include <gnutls/gnutls.h>
#include <gnutls/x509.h>

#include <string>
#include <utility>

namespace nexar::tls {
using namespace detail;

NodeKey NodeKey::generate() {
  PrivKey key = generate_p256();
  NodeKey nk;
  nk.key_pem_ = export_pkcs8(key.get());
  return nk;
}

std::string NodeKey::make_csr(std::string_view cluster, std::string_view node) const {
  require_name(cluster, "cluster");
  require_name(node, "node");
  PrivKey key = import_privkey(key_pem_, "node");
  Crq crq = new_crq();
  check_rc(gnutls_x509_crq_set_version(crq.get(), 1), "setting CSR version");
  check_rc(gnutls_x509_crq_set_dn_by_oid(crq.get(), GNUTLS_OID_X520_ORGANIZATION_NAME, 0,
                                         cluster.data(), static_cast<unsigned>(cluster.size())),
           "setting CSR subject O");
  check_rc(gnutls_x509_crq_set_dn_by_oid(crq.get(), GNUTLS_OID_X520_COMMON_NAME, 0, node.data(),
                                         static_cast<unsigned>(node.size())),
           "setting CSR subject CN");
  const std::string uri = node_uri(cluster, node);
  check_rc(gnutls_x509_crq_set_subject_alt_name(crq.get(), GNUTLS_SAN_URI, uri.data(),
                                                static_cast<unsigned>(uri.size()), GNUTLS_FSAN_SET),
           "setting CSR subjectAltName URI");
  check_rc(gnutls_x509_crq_set_key(crq.get(), key.get()), "setting CSR public key");
  check_rc(gnutls_x509_crq_sign2(crq.get(), key.get(), GNUTLS_DIG_SHA256, 0), "signing CSR");
  Datum out;
  check_rc(gnutls_x509_crq_export2(crq.get(), GNUTLS_X509_FMT_PEM, &out.d), "exporting CSR PEM");
  return out.str();
}

NodeCredentials issue_local(const ClusterCa& ca, std::string node) {
  NodeKey key = NodeKey::generate();
  const std::string csr = key.make_csr(ca.cluster(), node);
  NodeCredentials creds;
  creds.cert_pem = ca.sign(csr, node);
  creds.cluster = ca.cluster();
  creds.node = std::move(node);
  creds.ca_pem = ca.cert_pem();
  creds.key_pem = key.key_pem();
  return creds;
}

}  // namespace nexar::tls
