#include "tls/node_key.hpp"

#include "tls/ca.hpp"
#include "tls/tls_context.hpp"

#include <gnutls/gnutls.h>
#include <gnutls/x509.h>

#include <gtest/gtest.h>

#include "tls_support.hpp"

#include <ctime>
#include <string>
#include <vector>

namespace {

using nexar::testing::Crt;
using nexar::testing::dn_attr;
using nexar::testing::parse_pem;
using namespace nexar::tls;

TEST(NodeKey, GeneratesPkcs8PemAndDistinctKeys) {
  NodeKey a = NodeKey::generate();
  NodeKey b = NodeKey::generate();
  EXPECT_TRUE(a.key_pem().starts_with("-----BEGIN PRIVATE KEY-----")) << a.key_pem();
  EXPECT_NE(a.key_pem(), b.key_pem());
  std::string csr = a.make_csr("alpha", "n1");
  EXPECT_TRUE(csr.starts_with("-----BEGIN NEW CERTIFICATE REQUEST-----") ||
              csr.starts_with("-----BEGIN CERTIFICATE REQUEST-----"))
      << csr;
}

TEST(IssueLocal, CertificateChainsToCaAndNamesNode) {
  ClusterCa ca = ClusterCa::create("alpha");
  NodeCredentials c = issue_local(ca, "node-7");
  EXPECT_EQ(c.cluster, "alpha");
  EXPECT_EQ(c.node, "node-7");
  EXPECT_EQ(c.ca_pem, ca.cert_pem());
  EXPECT_TRUE(c.key_pem.starts_with("-----BEGIN PRIVATE KEY-----"));

  Crt leaf = parse_pem(c.cert_pem);
  Crt root = parse_pem(ca.cert_pem());
  gnutls_x509_crt_t chain[] = {leaf.get()};
  gnutls_x509_crt_t anchors[] = {root.get()};
  unsigned status = ~0u;
  ASSERT_EQ(gnutls_x509_crt_list_verify(chain, 1, anchors, 1, nullptr, 0, 0, &status), 0);
  EXPECT_EQ(status, 0u);

  EXPECT_EQ(dn_attr(leaf.get(), GNUTLS_OID_X520_ORGANIZATION_NAME), "alpha");
  EXPECT_EQ(dn_attr(leaf.get(), GNUTLS_OID_X520_COMMON_NAME), "node-7");

  char san[256];
  size_t san_size = sizeof san;
  EXPECT_EQ(gnutls_x509_crt_get_subject_alt_name(leaf.get(), 0, san, &san_size, nullptr),
            GNUTLS_SAN_URI);
  EXPECT_EQ(std::string(san, san_size), "nexar://alpha/node-7");

  unsigned critical = 0;
  EXPECT_EQ(gnutls_x509_crt_get_basic_constraints(leaf.get(), &critical, nullptr, nullptr), 0);
  unsigned usage = 0;
  ASSERT_GE(gnutls_x509_crt_get_key_usage(leaf.get(), &usage, &critical), 0);
  EXPECT_TRUE(usage & GNUTLS_KEY_DIGITAL_SIGNATURE);
  EXPECT_FALSE(usage & GNUTLS_KEY_KEY_CERT_SIGN);
  std::vector<std::string> purposes;
  for (unsigned i = 0;; ++i) {
    char oid[128];
    size_t size = sizeof oid;
    if (gnutls_x509_crt_get_key_purpose_oid(leaf.get(), i, oid, &size, nullptr) < 0) break;
    purposes.emplace_back(oid);
  }
  EXPECT_EQ(purposes, (std::vector<std::string>{GNUTLS_KP_TLS_WWW_SERVER,
                                                 GNUTLS_KP_TLS_WWW_CLIENT}));

  const time_t now = time(nullptr);
  EXPECT_LT(gnutls_x509_crt_get_activation_time(leaf.get()), now);
  EXPECT_GT(gnutls_x509_crt_get_expiration_time(leaf.get()), now + 364L * 86400);
  EXPECT_LT(gnutls_x509_crt_get_expiration_time(leaf.get()), now + 367L * 86400);
}

TEST(IssueLocal, NamesWithDnSpecialCharactersRoundTrip) {
  ClusterCa ca = ClusterCa::create("acme, inc+1");
  NodeCredentials c = issue_local(ca, "n=1;\\x");
  Crt leaf = parse_pem(c.cert_pem);
  Crt root = parse_pem(ca.cert_pem());
  gnutls_x509_crt_t chain[] = {leaf.get()};
  gnutls_x509_crt_t anchors[] = {root.get()};
  unsigned status = ~0u;
  ASSERT_EQ(gnutls_x509_crt_list_verify(chain, 1, anchors, 1, nullptr, 0, 0, &status), 0);
  EXPECT_EQ(status, 0u);
  TlsContext ctx(c);
  EXPECT_EQ(ctx.node(), "n=1;\\x");
}

}  // namespace
