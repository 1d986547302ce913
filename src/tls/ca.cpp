#include "tls/tls_context.hpp"

#include <nexar/error.hpp>

#include <gnutls/abstract.h>
#include <gnutls/crypto.h>
#include <gnutls/x509-ext.h>
#include <gnutls/x509.h>

#include <array>
#include <cctype>
#include <ctime>
#include <exception>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace nexar::tls {
namespace {

constexpr std::string_view kCaCommonName = "nexar cluster CA";
constexpr time_t kDay = 24 * 60 * 60;
constexpr time_t kCaLifetime = 3653 * kDay;
constexpr time_t kLeafLifetime = 365 * kDay;
// Backdating absorbs clock skew between the signer and the peers that check the cert.
constexpr time_t kBackdate = 10 * 60;

template <auto Fn>
struct Deinit {
  template <typename T>
  void operator()(T* p) const noexcept {
    Fn(p);
  }
};
template <typename Handle, auto Fn>
using Owned = std::unique_ptr<std::remove_pointer_t<Handle>, Deinit<Fn>>;

using PrivKey = Owned<gnutls_x509_privkey_t, gnutls_x509_privkey_deinit>;
using Crq = Owned<gnutls_x509_crq_t, gnutls_x509_crq_deinit>;
using Crt = Owned<gnutls_x509_crt_t, gnutls_x509_crt_deinit>;
using PubKey = Owned<gnutls_pubkey_t, gnutls_pubkey_deinit>;
using Sans = Owned<gnutls_subject_alt_names_t, gnutls_subject_alt_names_deinit>;
using CertCred = Owned<gnutls_certificate_credentials_t, gnutls_certificate_free_credentials>;

// A datum whose buffer GnuTLS allocated.
struct Datum {
  gnutls_datum_t d{nullptr, 0};
  Datum() = default;
  Datum(const Datum&) = delete;
  Datum& operator=(const Datum&) = delete;
  ~Datum() {
    if (d.data != nullptr) gnutls_free(d.data);
  }
  std::string str() const { return {reinterpret_cast<const char*>(d.data), d.size}; }
};

[[noreturn]] void fail(const std::string& msg) { throw Error(Errc::tls, msg); }

void check_rc(int rc, const std::string& what) {
  if (rc < 0) fail(what + ": " + gnutls_strerror(rc));
}

gnutls_datum_t view(std::string_view s) {
  // GnuTLS takes input datums through non-const pointers but does not write to them.
  return {reinterpret_cast<unsigned char*>(const_cast<char*>(s.data())),
          static_cast<unsigned int>(s.size())};
}

void require_name(std::string_view value, const char* what) {
  if (value.empty()) fail(std::string(what) + " name must not be empty");
}

std::string node_uri(std::string_view cluster, std::string_view node) {
  std::string uri = "nexar://";
  uri.append(cluster).append("/").append(node);
  return uri;
}

PrivKey new_privkey() {
  gnutls_x509_privkey_t k = nullptr;
  check_rc(gnutls_x509_privkey_init(&k), "allocating private key");
  return PrivKey(k);
}

Crq new_crq() {
  gnutls_x509_crq_t c = nullptr;
  check_rc(gnutls_x509_crq_init(&c), "allocating certificate request");
  return Crq(c);
}

Crt new_crt() {
  gnutls_x509_crt_t c = nullptr;
  check_rc(gnutls_x509_crt_init(&c), "allocating certificate");
  return Crt(c);
}

PubKey new_pubkey() {
  gnutls_pubkey_t p = nullptr;
  check_rc(gnutls_pubkey_init(&p), "allocating public key");
  return PubKey(p);
}

PrivKey generate_p256() {
  PrivKey key = new_privkey();
  check_rc(gnutls_x509_privkey_generate(key.get(), GNUTLS_PK_ECDSA,
                                     GNUTLS_CURVE_TO_BITS(GNUTLS_ECC_CURVE_SECP256R1), 0),
        "generating ECDSA P-256 key");
  return key;
}

std::string export_pkcs8(gnutls_x509_privkey_t key) {
  Datum out;
  check_rc(gnutls_x509_privkey_export2_pkcs8(key, GNUTLS_X509_FMT_PEM, nullptr, GNUTLS_PKCS_PLAIN,
                                          &out.d),
        "exporting private key as PKCS#8 PEM");
  return out.str();
}

PrivKey import_privkey(std::string_view pem, const char* what) {
  PrivKey key = new_privkey();
  gnutls_datum_t in = view(pem);
  check_rc(gnutls_x509_privkey_import2(key.get(), &in, GNUTLS_X509_FMT_PEM, nullptr, 0),
        std::string("importing ") + what + " private key PEM");
  return key;
}

Crt import_crt(std::string_view pem, const char* what) {
  Crt crt = new_crt();
  gnutls_datum_t in = view(pem);
  check_rc(gnutls_x509_crt_import(crt.get(), &in, GNUTLS_X509_FMT_PEM),
        std::string("importing ") + what + " certificate PEM");
  return crt;
}

Crt import_crt_der(const gnutls_datum_t& der, const char* what) {
  Crt crt = new_crt();
  check_rc(gnutls_x509_crt_import(crt.get(), &der, GNUTLS_X509_FMT_DER),
        std::string("parsing ") + what + " certificate");
  return crt;
}

// The text of a DER-encoded DirectoryString. GnuTLS's non-raw getter escapes RFC 4514
// specials (",", "+", ...), which would make names containing them compare unequal.
std::string decode_dir_string(const std::vector<unsigned char>& der) {
  constexpr unsigned char kUtf8 = 12, kPrintable = 19, kTeletex = 20, kIa5 = 22;
  if (der.size() < 2) fail("malformed subject attribute: too short");
  const unsigned char tag = der[0];
  if (tag != kUtf8 && tag != kPrintable && tag != kTeletex && tag != kIa5)
    fail("unsupported subject attribute string type (ASN.1 tag " + std::to_string(tag) + ")");
  size_t pos = 2;
  size_t len = der[1];
  if (len & 0x80) {
    const size_t n = len & 0x7f;
    if (n == 0 || n > 2 || der.size() < 2 + n) fail("malformed subject attribute length");
    len = 0;
    for (size_t i = 0; i < n; ++i) len = (len << 8) | der[2 + i];
    pos += n;
  }
  if (der.size() - pos != len) fail("malformed subject attribute length");
  return {reinterpret_cast<const char*>(der.data() + pos), len};
}

// All values of one subject attribute; `get` is gnutls_x509_crt/crq_get_dn_by_oid.
template <typename Handle, typename Get>
std::vector<std::string> dn_values(Handle h, Get get, const char* oid) {
  std::vector<std::string> values;
  for (unsigned idx = 0;; ++idx) {
    size_t size = 0;
    int rc = get(h, oid, idx, 1, nullptr, &size);
    if (rc == GNUTLS_E_REQUESTED_DATA_NOT_AVAILABLE) break;
    if (rc != GNUTLS_E_SHORT_MEMORY_BUFFER) check_rc(rc, "reading subject attribute");
    std::vector<unsigned char> buf(size + 1);
    size = buf.size();
    check_rc(get(h, oid, idx, 1, buf.data(), &size), "reading subject attribute");
    buf.resize(size);
    values.push_back(decode_dir_string(buf));
  }
  return values;
}

// The single value of a subject attribute; more than one is treated as ambiguous.
template <typename Handle, typename Get>
std::string dn_single(Handle h, Get get, const char* oid, const char* label,
                      const char* where) {
  std::vector<std::string> v = dn_values(h, get, oid);
  if (v.empty()) fail(std::string(where) + " has no subject " + label);
  if (v.size() > 1) fail(std::string(where) + " has " + std::to_string(v.size()) +
                         " subject " + label + " attributes, expected exactly one");
  return std::move(v.front());
}

// URIs from a DER subjectAltName extension.
std::vector<std::string> san_uris(const gnutls_datum_t& ext, const char* where) {
  gnutls_subject_alt_names_t raw = nullptr;
  check_rc(gnutls_subject_alt_names_init(&raw), "allocating subjectAltName");
  Sans sans(raw);
  check_rc(gnutls_x509_ext_import_subject_alt_names(&ext, sans.get(), 0),
        std::string("parsing subjectAltName of ") + where);
  std::vector<std::string> uris;
  for (unsigned seq = 0;; ++seq) {
    unsigned type = 0;
    gnutls_datum_t san{nullptr, 0};
    gnutls_datum_t other{nullptr, 0};
    int rc = gnutls_subject_alt_names_get(sans.get(), seq, &type, &san, &other);
    if (rc == GNUTLS_E_REQUESTED_DATA_NOT_AVAILABLE) break;
    check_rc(rc, std::string("reading subjectAltName of ") + where);
    if (type == GNUTLS_SAN_URI)
      uris.emplace_back(reinterpret_cast<const char*>(san.data), san.size);
  }
  return uris;
}

template <typename Handle, typename GetExt>
std::vector<std::string> san_uris_of(Handle h, GetExt get_ext, const char* where) {
  std::vector<std::string> uris;
  for (unsigned idx = 0;; ++idx) {
    Datum ext;
    unsigned critical = 0;
    int rc = get_ext(h, GNUTLS_X509EXT_OID_SAN, idx, &ext.d, &critical);
    if (rc == GNUTLS_E_REQUESTED_DATA_NOT_AVAILABLE) break;
    check_rc(rc, std::string("reading subjectAltName of ") + where);
    for (auto& u : san_uris(ext.d, where)) uris.push_back(std::move(u));
  }
  return uris;
}

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
  check_rc(gnutls_x509_crt_export2(crt, GNUTLS_X509_FMT_PEM, &out.d), "exporting certificate PEM");
  return out.str();
}

std::string status_text(unsigned status) {
  Datum out;
  if (gnutls_certificate_verification_status_print(status, GNUTLS_CRT_X509, &out.d, 0) < 0)
    return "status " + std::to_string(status);
  return out.str();
}

PeerCheck reject(std::string why) {
  PeerCheck r;
  r.error = std::move(why);
  return r;
}

}  // namespace

// ---- NodeKey --------------------------------------------------------------------------

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

// ---- ClusterCa ------------------------------------------------------------------------

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

// ---- TlsContext -----------------------------------------------------------------------

// ---- fingerprints ---------------------------------------------------------------------

namespace {

std::string fingerprint_der(const gnutls_datum_t& der) {
  unsigned char digest[32];
  if (gnutls_hash_fast(GNUTLS_DIG_SHA256, der.data, der.size, digest) < 0)
    fail("hashing certificate");
  std::string out = "sha256:";
  for (unsigned char c : digest) {
    out += "0123456789abcdef"[c >> 4];
    out += "0123456789abcdef"[c & 15];
  }
  return out;
}

}  // namespace

std::string fingerprint(std::string_view cert_pem) {
  Crt crt = import_crt(cert_pem, "fingerprinted");
  Datum der;
  check_rc(gnutls_x509_crt_export2(crt.get(), GNUTLS_X509_FMT_DER, &der.d), "exporting certificate DER");
  return fingerprint_der(der.d);
}

// ---- TlsContext -----------------------------------------------------------------------

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

// ---- peer check -----------------------------------------------------------------------

namespace {

PeerCheck check_peer(gnutls_session_t session, std::string_view cluster) {
  if (gnutls_certificate_type_get2(session, GNUTLS_CTYPE_PEERS) != GNUTLS_CRT_X509)
    return reject("peer did not present an X.509 certificate");
  unsigned count = 0;
  const gnutls_datum_t* chain = gnutls_certificate_get_peers(session, &count);
  if (chain == nullptr || count == 0) return reject("peer sent no certificate");

  unsigned status = 0;
  const int rc = gnutls_certificate_verify_peers3(session, nullptr, &status);
  if (rc < 0)
    return reject(std::string("peer certificate verification failed: ") + gnutls_strerror(rc));
  if (status != 0) return reject("peer certificate rejected: " + status_text(status));

  Crt crt = import_crt_der(chain[0], "peer");
  const std::string org = dn_single(crt.get(), gnutls_x509_crt_get_dn_by_oid,
                                    GNUTLS_OID_X520_ORGANIZATION_NAME, "O", "peer certificate");
  if (org != cluster)
    return reject("certificate is from cluster '" + org + "', expected '" +
                  std::string(cluster) + "'");
  std::string cn = dn_single(crt.get(), gnutls_x509_crt_get_dn_by_oid,
                             GNUTLS_OID_X520_COMMON_NAME, "CN", "peer certificate");
  const std::string uri = node_uri(cluster, cn);
  const std::vector<std::string> uris =
      san_uris_of(crt.get(), gnutls_x509_crt_get_extension_by_oid2, "peer certificate");
  if (uris.empty()) return reject("peer certificate has no nexar:// subjectAltName URI");
  for (const std::string& u : uris)
    if (u != uri)
      return reject("peer certificate subjectAltName URI is '" + u + "', expected '" + uri +
                    "'");
  PeerCheck ok;
  ok.ok = true;
  ok.node = std::move(cn);
  return ok;
}

// A joiner checks the seed: pinned fingerprint and/or chain to the given CA. With neither,
// the token proof after the handshake is what authenticates the seed.
PeerCheck check_seed(gnutls_session_t session, const std::string& pinned, bool have_ca,
                     std::string_view cluster) {
  unsigned count = 0;
  const gnutls_datum_t* chain = gnutls_certificate_get_peers(session, &count);
  if (chain == nullptr || count == 0) return reject("seed sent no certificate");
  if (!pinned.empty()) {
    const std::string got = fingerprint_der(chain[0]);
    if (got != pinned)
      return reject("seed certificate fingerprint is " + got + ", expected " + pinned);
  }
  if (have_ca) {
    PeerCheck c = check_peer(session, cluster);
    if (!c.ok) return c;
    if (c.node != seed_node) return reject("seed certificate names node '" + c.node + "', expected 'seed'");
  }
  PeerCheck ok;
  ok.ok = true;
  ok.node = std::string(seed_node);
  return ok;
}

// Checks run inside C handshake callbacks, where an exception must not propagate.
template <class F>
PeerCheck no_throw(F&& f) {
  try {
    return f();
  } catch (const std::exception& e) {
    return reject(e.what());
  } catch (...) {
    return reject("unexpected error while checking the peer certificate");
  }
}

}  // namespace

PeerCheck TlsContext::check(gnutls_session_t session) const {
  return no_throw([&] {
    return role_ == Role::joiner ? check_seed(session, fingerprint_, have_ca_, cluster_)
                                 : check_peer(session, cluster_);
  });
}

PeerCheck verify_peer(gnutls_session_t session, std::string_view cluster) {
  return no_throw([&] { return check_peer(session, cluster); });
}

}  // namespace nexar::tls
