// Helpers shared by the tests of src/tls (ca_test.cpp, node_key_test.cpp,
// tls_context_test.cpp): parsing the certificates under test with GnuTLS directly, and
// expecting a nexar::Error(Errc::tls).
#pragma once

#include <nexar/error.hpp>

#include <gnutls/gnutls.h>
#include <gnutls/x509.h>

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>

namespace nexar::testing {

struct CrtDeleter {
  void operator()(gnutls_x509_crt_int* c) const { gnutls_x509_crt_deinit(c); }
};
using Crt = std::unique_ptr<gnutls_x509_crt_int, CrtDeleter>;

inline Crt parse_pem(const std::string& pem) {
  gnutls_x509_crt_t c = nullptr;
  EXPECT_EQ(gnutls_x509_crt_init(&c), 0);
  Crt crt(c);
  gnutls_datum_t d{reinterpret_cast<unsigned char*>(const_cast<char*>(pem.data())),
                   static_cast<unsigned>(pem.size())};
  EXPECT_EQ(gnutls_x509_crt_import(crt.get(), &d, GNUTLS_X509_FMT_PEM), 0);
  return crt;
}

inline std::string dn_attr(gnutls_x509_crt_t crt, const char* oid) {
  char buf[256];
  size_t size = sizeof buf;
  if (gnutls_x509_crt_get_dn_by_oid(crt, oid, 0, 0, buf, &size) < 0) return "<none>";
  return {buf, size};
}

// Runs `fn` and returns the nexar::Error it threw; fails the test if it threw nothing else.
inline Error expect_tls_error(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_TRUE(e.code() == Errc::tls) << static_cast<int>(e.code()) << ": " << e.what();
    return e;
  }
  ADD_FAILURE() << "expected nexar::Error(Errc::tls)";
  return Error(Errc::ok, "");
}

}  // namespace nexar::testing
