#include "tls/tls_context.hpp"

#include "tls/ca.hpp"
#include "tls/node_key.hpp"

#include <nexar/error.hpp>

#include <gtest/gtest.h>

#include "support.hpp"
#include "tls_support.hpp"

#include <string>

namespace {

using nexar::Error;
using nexar::testing::contains;
using nexar::testing::expect_tls_error;
using namespace nexar::tls;

TEST(TlsContext, Loads) {
  ClusterCa ca = ClusterCa::create("alpha");
  TlsContext ctx(issue_local(ca, "n1"));
  EXPECT_NE(ctx.get(), nullptr);
  EXPECT_EQ(ctx.cluster(), "alpha");
  EXPECT_EQ(ctx.node(), "n1");
}

TEST(TlsContext, RejectsKeyThatDoesNotMatchCertificate) {
  ClusterCa ca = ClusterCa::create("alpha");
  NodeCredentials c = issue_local(ca, "n1");
  c.key_pem = NodeKey::generate().key_pem();
  Error e = expect_tls_error([&] { TlsContext ctx(c); });
  EXPECT_TRUE(contains(e.what(), "private key")) << e.what();
}

TEST(TlsContext, RejectsBadPems) {
  ClusterCa ca = ClusterCa::create("alpha");
  const NodeCredentials good = issue_local(ca, "n1");

  NodeCredentials c = good;
  c.cert_pem = "garbage";
  expect_tls_error([&] { TlsContext ctx(c); });

  c = good;
  c.key_pem = "garbage";
  expect_tls_error([&] { TlsContext ctx(c); });

  c = good;
  c.ca_pem = "garbage";
  Error e = expect_tls_error([&] { TlsContext ctx(c); });
  EXPECT_TRUE(contains(e.what(), "CA")) << e.what();

  c = good;
  c.ca_pem = ca.cert_pem() + ClusterCa::create("alpha").cert_pem();
  e = expect_tls_error([&] { TlsContext ctx(c); });
  EXPECT_TRUE(contains(e.what(), "exactly 1")) << e.what();
}

TEST(TlsContext, RejectsCertificateNamingAnotherIdentity) {
  ClusterCa ca = ClusterCa::create("alpha");
  NodeCredentials c = issue_local(ca, "n1");
  c.node = "n2";
  Error e = expect_tls_error([&] { TlsContext ctx(c); });
  EXPECT_TRUE(contains(e.what(), "'n1'")) << e.what();

  c = issue_local(ca, "n1");
  c.cluster = "beta";
  e = expect_tls_error([&] { TlsContext ctx(c); });
  EXPECT_TRUE(contains(e.what(), "'alpha'")) << e.what();
}

}  // namespace
