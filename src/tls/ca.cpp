#include "tls/ca.hpp"

#include "tls/gnutls_util.hpp"

#include <gnutls/abstract.h>
#include <gnutls/crypto.h>
#include <gnutls/gnutls.h>
#include <gnutls/x509.h>

#include <array>
#include <ctime>
#include <string>
#include <utility>

namespace nexar::tls {
using namespace detail;

namespace {

constexpr std::string_view kCaCommonName = "nexar cluster CA";
constexpr time_t kDay = 24 * 60 * 60;
constexpr time_t kCaLifetime = 3653 * kDay;
constexpr time_t kLeafLifetime = 365 * kDay;
// Backdating absorbs clock skew between the signer and the peers that check the cert.
constexpr time_t kBackdate = 10 * 60;

void set_subject(gnutls_x509_crt_t crt, std::string_view org, std::string_view cn) {
  check_rc(gnutls_x509_crt_set_dn_by_oid(crt, GNUTLS_OID_X520_ORGANIZATION_NAME, 0, org.data(),
                                         static_cast<unsigned>(org.size())),
           "setting certificate subject O");
  check_rc(gnutls_x509_crt_set_dn_by_oid(crt, GNUTLS_OID_X520_COMMON_NAME, 0, cn.data(),
                                         static_cast<unsigned>(cn.size())),
           "setting certificate subject CN");
}

void set_random_serial(gnutls_x509_crt_t crt) {
  std::array<unsigned char, 16> serial{};
  check_rc(gnutls_rnd(GNUTLS_RND_NONCE, serial.data(), serial.size()), "generating serial number");
  // DER integers are signed: keep the serial positive and its length fixed.
  serial[0] = static_cast<unsigned char>((serial[0] & 0x7f) | 0x40);
  check_rc(gnutls_x509_crt_set_serial(crt, serial.data(), serial.size()),
           "setting certificate serial number");
}

void set_validity(gnutls_x509_crt_t crt, time_t lifetime) {
  const time_t now = std::time(nullptr);
  check_rc(gnutls_x509_crt_set_activation_time(crt, now - kBackdate),
           "setting certificate notBefore");
  check_rc(gnutls_x509_crt_set_expiration_time(crt, now + lifetime),
           "setting certificate notAfter");
}

// Call after the certificate's public key is set.
void set_key_ids(gnutls_x509_crt_t crt, gnutls_x509_crt_t issuer) {
  std::array<unsigned char, 64> id{};
  size_t size = id.size();
  check_rc(gnutls_x509_crt_get_key_id(crt, GNUTLS_KEYID_USE_SHA1, id.data(), &size),
           "computing subject key identifier");
  check_rc(gnutls_x509_crt_set_subject_key_id(crt, id.data(), size),
           "setting subject key identifier");
  size = id.size();
  unsigned critical = 0;
  check_rc(gnutls_x509_crt_get_subject_key_id(issuer, id.data(), &size, &critical),
           "reading issuer subject key identifier");
  check_rc(gnutls_x509_crt_set_authority_key_id(crt, id.data(), size),
           "setting authority key identifier");
}

std::string export_crt(gnutls_x509_crt_t crt) {
  Datum out;
  check_rc(gnutls_x509_crt_export2(crt, GNUTLS_X509_FMT_PEM, &out.d),
           "exporting certificate PEM");
  return out.str();
}

}  // namespace

ClusterCa ClusterCa::create(std::string cluster) {
  require_name(cluster, "cluster");
  PrivKey key = generate_p256();
  Crt crt = new_crt();
  check_rc(gnutls_x509_crt_set_version(crt.get(), 3), "setting CA certificate version");
  set_random_serial(crt.get());
  set_validity(crt.get(), kCaLifetime);
  set_subject(crt.get(), cluster, kCaCommonName);
  check_rc(gnutls_x509_crt_set_key(crt.get(), key.get()), "setting CA public key");
  check_rc(gnutls_x509_crt_set_basic_constraints(crt.get(), 1, 0),
           "setting CA basicConstraints");
  check_rc(gnutls_x509_crt_set_key_usage(crt.get(), GNUTLS_KEY_KEY_CERT_SIGN | GNUTLS_KEY_CRL_SIGN),
           "setting CA keyUsage");
  set_key_ids(crt.get(), crt.get());
  check_rc(gnutls_x509_crt_sign2(crt.get(), crt.get(), key.get(), GNUTLS_DIG_SHA256, 0),
           "self-signing CA certificate");

  ClusterCa ca;
  ca.cluster_ = std::move(cluster);
  ca.cert_pem_ = export_crt(crt.get());
  ca.key_pem_ = export_pkcs8(key.get());
  return ca;
}

std::string ClusterCa::sign(std::string_view csr_pem, std::string_view node) const {
  require_name(node, "node");
  Crq crq = new_crq();
  gnutls_datum_t in = view(csr_pem);
  check_rc(gnutls_x509_crq_import(crq.get(), &in, GNUTLS_X509_FMT_PEM), "importing CSR PEM");
  check_rc(gnutls_x509_crq_verify(crq.get(), 0), "CSR self-signature does not verify");

  const std::string org =
      dn_single(crq.get(), gnutls_x509_crq_get_dn_by_oid, GNUTLS_OID_X520_ORGANIZATION_NAME,
                "O", "CSR");
  if (org != cluster_)
    fail("CSR is for cluster '" + org + "', expected '" + cluster_ + "'");
  const std::string cn =
      dn_single(crq.get(), gnutls_x509_crq_get_dn_by_oid, GNUTLS_OID_X520_COMMON_NAME, "CN",
                "CSR");
  if (cn != node) fail("CSR is for node '" + cn + "', expected '" + std::string(node) + "'");
  const std::string uri = node_uri(cluster_, node);
  for (const std::string& u : san_uris_of(crq.get(), gnutls_x509_crq_get_extension_by_oid2, "CSR"))
    if (u != uri) fail("CSR subjectAltName URI is '" + u + "', expected '" + uri + "'");

  PubKey pub = new_pubkey();
  check_rc(gnutls_pubkey_import_x509_crq(pub.get(), crq.get(), 0), "reading CSR public key");
  unsigned bits = 0;
  const int algo = gnutls_pubkey_get_pk_algorithm(pub.get(), &bits);
  if (algo != GNUTLS_PK_ECDSA) {
    const char* name = gnutls_pk_get_name(static_cast<gnutls_pk_algorithm_t>(algo));
    fail(std::string("CSR key algorithm is ") + (name ? name : "unknown") +
         ", expected ECDSA P-256");
  }
  gnutls_ecc_curve_t curve = GNUTLS_ECC_CURVE_INVALID;
  check_rc(gnutls_pubkey_export_ecc_raw(pub.get(), &curve, nullptr, nullptr),
           "reading CSR key curve");
  if (curve != GNUTLS_ECC_CURVE_SECP256R1) {
    const char* name = gnutls_ecc_curve_get_name(curve);
    fail(std::string("CSR key curve is ") + (name ? name : "unknown") + ", expected SECP256R1");
  }

  Crt ca_crt = import_crt(cert_pem_, "CA");
  PrivKey ca_key = import_privkey(key_pem_, "CA");
  Crt crt = new_crt();
  check_rc(gnutls_x509_crt_set_version(crt.get(), 3), "setting certificate version");
  set_random_serial(crt.get());
  set_validity(crt.get(), kLeafLifetime);
  set_subject(crt.get(), cluster_, node);
  check_rc(gnutls_x509_crt_set_pubkey(crt.get(), pub.get()), "setting certificate public key");
  check_rc(gnutls_x509_crt_set_subject_alt_name(crt.get(), GNUTLS_SAN_URI, uri.data(),
                                                static_cast<unsigned>(uri.size()), GNUTLS_FSAN_SET),
           "setting certificate subjectAltName URI");
  check_rc(gnutls_x509_crt_set_basic_constraints(crt.get(), 0, -1),
           "setting certificate basicConstraints");
  check_rc(gnutls_x509_crt_set_key_usage(crt.get(), GNUTLS_KEY_DIGITAL_SIGNATURE),
           "setting certificate keyUsage");
  check_rc(gnutls_x509_crt_set_key_purpose_oid(crt.get(), GNUTLS_KP_TLS_WWW_SERVER, 0),
           "setting certificate extendedKeyUsage");
  check_rc(gnutls_x509_crt_set_key_purpose_oid(crt.get(), GNUTLS_KP_TLS_WWW_CLIENT, 0),
           "setting certificate extendedKeyUsage");
  set_key_ids(crt.get(), ca_crt.get());
  check_rc(gnutls_x509_crt_sign2(crt.get(), ca_crt.get(), ca_key.get(), GNUTLS_DIG_SHA256, 0),
           "signing certificate with the CA key");
  return export_crt(crt.get());
}

}  // namespace nexar::tls
