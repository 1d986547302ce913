#include "tls/tls_context.hpp"

#include "tls/gnutls_util.hpp"

#include <gnutls/gnutls.h>
#include <gnutls/x509.h>

#include <cctype>
#include <string>

namespace nexar::tls {
using namespace detail;

namespace {

CertCred new_cred() {
  gnutls_certificate_credentials_t raw = nullptr;
  check_rc(gnutls_certificate_allocate_credentials(&raw), "allocating certificate credentials");
  return CertCred(raw);
}

void add_trust(gnutls_certificate_credentials_t cred, std::string_view ca_pem) {
  gnutls_datum_t ca = view(ca_pem);
  const int n = gnutls_certificate_set_x509_trust_mem(cred, &ca, GNUTLS_X509_FMT_PEM);
  check_rc(n, "loading cluster CA certificate PEM");
  if (n != 1)
    fail("cluster CA PEM holds " + std::to_string(n) + " certificates, expected exactly 1");
}

}  // namespace

TlsContext::TlsContext(const NodeCredentials& creds, Role role)
    : role_(role), cluster_(creds.cluster), node_(creds.node) {
  if (role == Role::joiner) fail("a joiner context is made from a SeedTrust");
  // Our own certificate must carry the identity we claim, or every peer would reject us
  // with a far less obvious error.
  {
    Crt own = import_crt(creds.cert_pem, "node");
    const std::string org = dn_single(own.get(), gnutls_x509_crt_get_dn_by_oid,
                                      GNUTLS_OID_X520_ORGANIZATION_NAME, "O", "node certificate");
    if (org != cluster_)
      fail("node certificate is from cluster '" + org + "', expected '" + cluster_ + "'");
    const std::string cn = dn_single(own.get(), gnutls_x509_crt_get_dn_by_oid,
                                     GNUTLS_OID_X520_COMMON_NAME, "CN", "node certificate");
    if (cn != node_)
      fail("node certificate is for node '" + cn + "', expected '" + node_ + "'");
  }
  CertCred cred = new_cred();
  gnutls_datum_t cert = view(creds.cert_pem);
  gnutls_datum_t key = view(creds.key_pem);
  check_rc(gnutls_certificate_set_x509_key_mem2(cred.get(), &cert, &key, GNUTLS_X509_FMT_PEM,
                                                nullptr, 0),
           "loading node certificate and private key");
  add_trust(cred.get(), creds.ca_pem);
  cred_ = cred.release();
}

TlsContext::TlsContext(const SeedTrust& trust) : role_(Role::joiner), node_("joiner") {
  CertCred cred = new_cred();
  if (!trust.ca_pem.empty()) {
    Crt ca = import_crt(trust.ca_pem, "seed CA");
    cluster_ = dn_single(ca.get(), gnutls_x509_crt_get_dn_by_oid,
                         GNUTLS_OID_X520_ORGANIZATION_NAME, "O", "seed CA certificate");
    add_trust(cred.get(), trust.ca_pem);
    have_ca_ = true;
  }
  fingerprint_ = trust.fingerprint;
  for (char& c : fingerprint_) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  cred_ = cred.release();
}

TlsContext::~TlsContext() {
  if (cred_ != nullptr) gnutls_certificate_free_credentials(cred_);
}

PeerCheck TlsContext::check(gnutls_session_t session) const {
  return role_ == Role::joiner ? verify_seed(session, fingerprint_, have_ca_, cluster_)
                               : verify_peer(session, cluster_);
}

}  // namespace nexar::tls
