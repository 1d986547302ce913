#include "tls/peer_check.hpp"

#include "tls/gnutls_util.hpp"

#include <gnutls/crypto.h>
#include <gnutls/gnutls.h>
#include <gnutls/x509.h>

#include <exception>
#include <string>
#include <utility>
#include <vector>

namespace nexar::tls {
using namespace detail;

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
PeerCheck check_seed(gnutls_session_t session, std::string_view pinned, bool have_ca,
                     std::string_view cluster) {
  unsigned count = 0;
  const gnutls_datum_t* chain = gnutls_certificate_get_peers(session, &count);
  if (chain == nullptr || count == 0) return reject("seed sent no certificate");
  if (!pinned.empty()) {
    const std::string got = fingerprint_der(chain[0]);
    if (got != pinned)
      return reject("seed certificate fingerprint is " + got + ", expected " +
                    std::string(pinned));
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

std::string fingerprint(std::string_view cert_pem) {
  Crt crt = import_crt(cert_pem, "fingerprinted");
  Datum der;
  check_rc(gnutls_x509_crt_export2(crt.get(), GNUTLS_X509_FMT_DER, &der.d),
           "exporting certificate DER");
  return fingerprint_der(der.d);
}

PeerCheck verify_peer(gnutls_session_t session, std::string_view cluster) {
  return no_throw([&] { return check_peer(session, cluster); });
}

PeerCheck verify_seed(gnutls_session_t session, std::string_view pinned, bool have_ca,
                      std::string_view cluster) {
  return no_throw([&] { return check_seed(session, pinned, have_ca, cluster); });
}

}  // namespace nexar::tls
