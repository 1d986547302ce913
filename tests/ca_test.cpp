#include "tls/ca.hpp"

#include "tls/node_key.hpp"

#include <nexar/error.hpp>

#include <gnutls/gnutls.h>
#include <gnutls/x509.h>

#include <gtest/gtest.h>

#include "support.hpp"
#include "tls_support.hpp"

#include <string>

namespace {

using nexar::Error;
using nexar::testing::contains;
using nexar::testing::Crt;
using nexar::testing::dn_attr;
using nexar::testing::expect_tls_error;
using nexar::testing::parse_pem;
using namespace nexar::tls;

TEST(ClusterCa, CreatesSelfSignedCa) {
  ClusterCa ca = ClusterCa::create("alpha");
  EXPECT_EQ(ca.cluster(), "alpha");
  ASSERT_TRUE(ca.cert_pem().starts_with("-----BEGIN CERTIFICATE-----")) << ca.cert_pem();

  Crt crt = parse_pem(ca.cert_pem());
  EXPECT_EQ(dn_attr(crt.get(), GNUTLS_OID_X520_ORGANIZATION_NAME), "alpha");
  EXPECT_EQ(dn_attr(crt.get(), GNUTLS_OID_X520_COMMON_NAME), "nexar cluster CA");
  unsigned critical = 0;
  EXPECT_EQ(gnutls_x509_crt_get_basic_constraints(crt.get(), &critical, nullptr, nullptr), 1);
  unsigned usage = 0;
  ASSERT_GE(gnutls_x509_crt_get_key_usage(crt.get(), &usage, &critical), 0);
  EXPECT_TRUE(usage & GNUTLS_KEY_KEY_CERT_SIGN);

  gnutls_x509_crt_t list[] = {crt.get()};
  unsigned status = ~0u;
  ASSERT_EQ(gnutls_x509_crt_list_verify(list, 1, list, 1, nullptr, 0, 0, &status), 0);
  EXPECT_EQ(status, 0u);
  const time_t lifetime =
      gnutls_x509_crt_get_expiration_time(crt.get()) - gnutls_x509_crt_get_activation_time(crt.get());
  EXPECT_GT(lifetime, 3650L * 86400);
}

TEST(ClusterCa, EachCaHasItsOwnKeyAndSerial) {
  ClusterCa a = ClusterCa::create("alpha");
  ClusterCa b = ClusterCa::create("alpha");
  EXPECT_NE(a.cert_pem(), b.cert_pem());
}

TEST(ClusterCa, RejectsEmptyClusterName) {
  Error e = expect_tls_error([] { (void)ClusterCa::create(""); });
  EXPECT_TRUE(contains(e.what(), "cluster")) << e.what();
}

TEST(ClusterCa, SignRejectsCsrForAnotherCluster) {
  ClusterCa ca = ClusterCa::create("alpha");
  std::string csr = NodeKey::generate().make_csr("beta", "n1");
  Error e = expect_tls_error([&] { (void)ca.sign(csr, "n1"); });
  EXPECT_TRUE(contains(e.what(), "'beta'")) << e.what();
  EXPECT_TRUE(contains(e.what(), "'alpha'")) << e.what();
}

TEST(ClusterCa, SignRejectsCsrForAnotherNode) {
  ClusterCa ca = ClusterCa::create("alpha");
  std::string csr = NodeKey::generate().make_csr("alpha", "n1");
  Error e = expect_tls_error([&] { (void)ca.sign(csr, "n2"); });
  EXPECT_TRUE(contains(e.what(), "'n1'")) << e.what();
  EXPECT_TRUE(contains(e.what(), "'n2'")) << e.what();
}

TEST(ClusterCa, SignRejectsGarbage) {
  ClusterCa ca = ClusterCa::create("alpha");
  for (const std::string& bad :
       {std::string(), std::string("not a csr"),
        std::string("-----BEGIN NEW CERTIFICATE REQUEST-----\nAAAA!!!!\n"
                    "-----END NEW CERTIFICATE REQUEST-----\n"),
        ca.cert_pem()}) {
    Error e = expect_tls_error([&] { (void)ca.sign(bad, "n1"); });
    EXPECT_TRUE(contains(e.what(), "CSR")) << e.what();
  }
}

TEST(ClusterCa, SignRejectsCsrWithBrokenSignature) {
  ClusterCa ca = ClusterCa::create("alpha");
  std::string pem = NodeKey::generate().make_csr("alpha", "nodeA");

  gnutls_datum_t in{reinterpret_cast<unsigned char*>(pem.data()),
                    static_cast<unsigned>(pem.size())};
  gnutls_datum_t der{nullptr, 0};
  ASSERT_EQ(gnutls_pem_base64_decode2("NEW CERTIFICATE REQUEST", &in, &der), 0);
  std::string bytes(reinterpret_cast<char*>(der.data), der.size);
  gnutls_free(der.data);
  // Rename the subject in the signed part, then ask for the new name: only the
  // self-signature can catch this.
  const auto at = bytes.find("nodeA");
  ASSERT_NE(at, std::string::npos);
  bytes[at + 4] = 'B';
  gnutls_datum_t raw{reinterpret_cast<unsigned char*>(bytes.data()),
                     static_cast<unsigned>(bytes.size())};
  gnutls_datum_t out{nullptr, 0};
  ASSERT_EQ(gnutls_pem_base64_encode2("NEW CERTIFICATE REQUEST", &raw, &out), 0);
  std::string tampered(reinterpret_cast<char*>(out.data), out.size);
  gnutls_free(out.data);

  Error e = expect_tls_error([&] { (void)ca.sign(tampered, "nodeB"); });
  EXPECT_TRUE(contains(e.what(), "self-signature")) << e.what();
}

}  // namespace
