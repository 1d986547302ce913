// Internal to src/tls: the GnuTLS plumbing the CA, node keys, TLS contexts and peer checks
// share — owning handles, error conversion, PEM import/export, and reading the identity
// (subject O/CN, SAN URIs) out of certificates and CSRs. Not for use outside src/tls.
//
// Unless noted, every function throws nexar::Error(Errc::tls) naming what failed.
#pragma once

#include <gnutls/abstract.h>
#include <gnutls/gnutls.h>
#include <gnutls/x509-ext.h>
#include <gnutls/x509.h>

#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace nexar::tls::detail {

template <auto Fn>
struct Deinit {
  template <typename T>
  void operator()(T* p) const noexcept {
    Fn(p);
  }
};
/// A GnuTLS handle released with `Fn`.
template <typename Handle, auto Fn>
using Owned = std::unique_ptr<std::remove_pointer_t<Handle>, Deinit<Fn>>;

using PrivKey = Owned<gnutls_x509_privkey_t, gnutls_x509_privkey_deinit>;
using Crq = Owned<gnutls_x509_crq_t, gnutls_x509_crq_deinit>;
using Crt = Owned<gnutls_x509_crt_t, gnutls_x509_crt_deinit>;
using PubKey = Owned<gnutls_pubkey_t, gnutls_pubkey_deinit>;
using Sans = Owned<gnutls_subject_alt_names_t, gnutls_subject_alt_names_deinit>;
using CertCred = Owned<gnutls_certificate_credentials_t, gnutls_certificate_free_credentials>;

/// A datum whose buffer GnuTLS allocated (freed with gnutls_free).
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

/// Throws nexar::Error(Errc::tls, msg).
[[noreturn]] void fail(const std::string& msg);
/// Throws nexar::Error(Errc::tls, "<what>: <GnuTLS message>") when rc < 0.
void check_rc(int rc, const std::string& what);
/// An input datum over `s` (no copy; `s` must outlive it).
gnutls_datum_t view(std::string_view s);

/// Throws unless `value` is non-empty; `what` names it ("cluster", "node").
void require_name(std::string_view value, const char* what);
/// The SAN URI a node certificate carries: "nexar://<cluster>/<node>".
std::string node_uri(std::string_view cluster, std::string_view node);

/// Empty handles; throw if GnuTLS cannot allocate them.
PrivKey new_privkey();
Crq new_crq();
Crt new_crt();
PubKey new_pubkey();

/// A fresh ECDSA P-256 private key.
PrivKey generate_p256();
/// `key` as an unencrypted PKCS#8 PEM.
std::string export_pkcs8(gnutls_x509_privkey_t key);
/// Parses a PEM private key / certificate; `what` names it in the error ("CA", "node").
PrivKey import_privkey(std::string_view pem, const char* what);
Crt import_crt(std::string_view pem, const char* what);
/// Parses a DER certificate (as a handshake delivers it).
Crt import_crt_der(const gnutls_datum_t& der, const char* what);

/// The text of a DER-encoded DirectoryString (UTF8/Printable/Teletex/IA5String), taken
/// raw: GnuTLS's non-raw getter escapes RFC 4514 specials (",", "+", ...), which would
/// make names containing them compare unequal. Throws if malformed or of another type.
std::string decode_dir_string(const std::vector<unsigned char>& der);

/// All values of one subject attribute; `get` is gnutls_x509_crt/crq_get_dn_by_oid.
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

/// The single value of a subject attribute; none, or more than one (ambiguous), throws
/// naming `label` ("O", "CN") and `where` ("CSR", "peer certificate").
template <typename Handle, typename Get>
std::string dn_single(Handle h, Get get, const char* oid, const char* label,
                      const char* where) {
  std::vector<std::string> v = dn_values(h, get, oid);
  if (v.empty()) fail(std::string(where) + " has no subject " + label);
  if (v.size() > 1) fail(std::string(where) + " has " + std::to_string(v.size()) +
                         " subject " + label + " attributes, expected exactly one");
  return std::move(v.front());
}

/// The URIs of one DER subjectAltName extension.
std::vector<std::string> san_uris(const gnutls_datum_t& ext, const char* where);

/// The URIs of every subjectAltName extension; `get_ext` is
/// gnutls_x509_crt/crq_get_extension_by_oid2.
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

}  // namespace nexar::tls::detail
