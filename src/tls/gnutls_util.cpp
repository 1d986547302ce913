#include "tls/gnutls_util.hpp"

#include <nexar/error.hpp>

namespace nexar::tls::detail {

void fail(const std::string& msg) { throw Error(Errc::tls, msg); }

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
  check_rc(gnutls_x509_privkey_export2_pkcs8(key, GNUTLS_X509_FMT_PEM, nullptr,
                                             GNUTLS_PKCS_PLAIN, &out.d),
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

}  // namespace nexar::tls::detail
