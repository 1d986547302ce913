#include "tls/ca.hpp"
#include "tls/node_key.hpp"
#include "tls/peer_check.hpp"
#include "tls/tls_context.hpp"

#include <nexar/error.hpp>

#include <gnutls/gnutls.h>
#include <gnutls/x509.h>

#include <gtest/gtest.h>

#include "support.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

using nexar::Errc;
using nexar::Error;
using nexar::testing::contains;
using namespace nexar::tls;

struct CrtDeleter {
  void operator()(gnutls_x509_crt_int* c) const { gnutls_x509_crt_deinit(c); }
};
using Crt = std::unique_ptr<gnutls_x509_crt_int, CrtDeleter>;

Crt parse_pem(const std::string& pem) {
  gnutls_x509_crt_t c = nullptr;
  EXPECT_EQ(gnutls_x509_crt_init(&c), 0);
  Crt crt(c);
  gnutls_datum_t d{reinterpret_cast<unsigned char*>(const_cast<char*>(pem.data())),
                   static_cast<unsigned>(pem.size())};
  EXPECT_EQ(gnutls_x509_crt_import(crt.get(), &d, GNUTLS_X509_FMT_PEM), 0);
  return crt;
}

std::string dn_attr(gnutls_x509_crt_t crt, const char* oid) {
  char buf[256];
  size_t size = sizeof buf;
  if (gnutls_x509_crt_get_dn_by_oid(crt, oid, 0, 0, buf, &size) < 0) return "<none>";
  return {buf, size};
}

// Runs `fn` and returns the nexar::Error it threw; fails the test if it threw nothing else.
Error expect_tls_error(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_TRUE(e.code() == Errc::tls) << static_cast<int>(e.code()) << ": " << e.what();
    return e;
  }
  ADD_FAILURE() << "expected nexar::Error(Errc::tls)";
  return Error(Errc::ok, "");
}

// ---- PKI ------------------------------------------------------------------------------

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

// ---- TlsContext -----------------------------------------------------------------------

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

// ---- handshakes -----------------------------------------------------------------------

struct Side {
  Side(const TlsContext* c, std::string cluster, bool hook = false, std::string trust = {})
      : ctx(c), expect_cluster(std::move(cluster)), verify_in_hook(hook),
        trust_only_pem(std::move(trust)) {}
  const TlsContext* ctx;  // null: only `trust_only_pem` is loaded, no certificate
  std::string expect_cluster;
  bool verify_in_hook;  // reject in the handshake's verify callback
  std::string trust_only_pem;
};

struct SideResult {
  int handshake_rc = 1;
  PeerCheck check;
};

struct HookData {
  std::string cluster;
  PeerCheck check;
};

int verify_hook(gnutls_session_t session) {
  auto* data = static_cast<HookData*>(gnutls_session_get_ptr(session));
  data->check = verify_peer(session, data->cluster);
  return data->check.ok ? 0 : -1;
}

SideResult run_side(int fd, bool server, const Side& side, gnutls_certificate_request_t req) {
  SideResult r;
  gnutls_certificate_credentials_t empty = nullptr;
  gnutls_certificate_credentials_t cred = side.ctx ? side.ctx->get() : nullptr;
  if (cred == nullptr) {
    EXPECT_EQ(gnutls_certificate_allocate_credentials(&empty), 0);
    gnutls_datum_t ca{reinterpret_cast<unsigned char*>(const_cast<char*>(side.trust_only_pem.data())),
                      static_cast<unsigned>(side.trust_only_pem.size())};
    EXPECT_EQ(gnutls_certificate_set_x509_trust_mem(empty, &ca, GNUTLS_X509_FMT_PEM), 1);
    cred = empty;
  }
  gnutls_session_t s = nullptr;
  EXPECT_EQ(gnutls_init(&s, (server ? GNUTLS_SERVER : GNUTLS_CLIENT) | GNUTLS_NO_SIGNAL), 0);
  EXPECT_EQ(gnutls_priority_set_direct(s, "NORMAL:-VERS-ALL:+VERS-TLS1.3", nullptr), 0);
  EXPECT_EQ(gnutls_credentials_set(s, GNUTLS_CRD_CERTIFICATE, cred), 0);
  if (server) {
    gnutls_certificate_server_set_request(s, req);
    // Otherwise a client whose certificate comes from another CA sends none at all, and
    // the server could only report a missing certificate.
    gnutls_certificate_send_x509_rdn_sequence(s, 1);
  }
  HookData hook{side.expect_cluster, {}};
  if (side.verify_in_hook) {
    gnutls_session_set_ptr(s, &hook);
    gnutls_session_set_verify_function(s, verify_hook);
  }
  gnutls_transport_set_int(s, fd);
  gnutls_handshake_set_timeout(s, 20000);
  do {
    r.handshake_rc = gnutls_handshake(s);
  } while (r.handshake_rc < 0 && gnutls_error_is_fatal(r.handshake_rc) == 0);
  if (side.verify_in_hook)
    r.check = hook.check;
  else if (r.handshake_rc == 0)
    r.check = verify_peer(s, side.expect_cluster);
  // Unblocks the other side if this one gave up first.
  shutdown(fd, SHUT_RDWR);
  gnutls_deinit(s);
  if (empty != nullptr) gnutls_certificate_free_credentials(empty);
  return r;
}

struct Handshake {
  SideResult client;
  SideResult server;
};

Handshake handshake(const Side& client, const Side& server,
                    gnutls_certificate_request_t req = GNUTLS_CERT_REQUIRE) {
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) {
    ADD_FAILURE() << "socketpair failed";
    return {};
  }
  Handshake h;
  std::thread srv([&] { h.server = run_side(fds[1], true, server, req); });
  h.client = run_side(fds[0], false, client, req);
  srv.join();
  close(fds[0]);
  close(fds[1]);
  return h;
}

TEST(VerifyPeer, SameClusterPeersVerifyEachOther) {
  ClusterCa ca = ClusterCa::create("alpha");
  TlsContext a(issue_local(ca, "node-a"));
  TlsContext b(issue_local(ca, "node-b"));
  Handshake h = handshake({&a, "alpha"}, {&b, "alpha"});
  ASSERT_EQ(h.client.handshake_rc, 0) << gnutls_strerror(h.client.handshake_rc);
  ASSERT_EQ(h.server.handshake_rc, 0) << gnutls_strerror(h.server.handshake_rc);
  EXPECT_TRUE(h.client.check.ok) << h.client.check.error;
  EXPECT_EQ(h.client.check.node, "node-b");
  EXPECT_TRUE(h.server.check.ok) << h.server.check.error;
  EXPECT_EQ(h.server.check.node, "node-a");
}

TEST(VerifyPeer, RejectsPeerFromAnotherCaWithTheSameClusterName) {
  ClusterCa ours = ClusterCa::create("alpha");
  ClusterCa impostor = ClusterCa::create("alpha");
  TlsContext a(issue_local(ours, "node-a"));
  TlsContext x(issue_local(impostor, "node-x"));
  Handshake h = handshake({&a, "alpha"}, {&x, "alpha"});
  ASSERT_EQ(h.client.handshake_rc, 0) << gnutls_strerror(h.client.handshake_rc);
  ASSERT_EQ(h.server.handshake_rc, 0) << gnutls_strerror(h.server.handshake_rc);
  EXPECT_FALSE(h.client.check.ok);
  EXPECT_TRUE(h.client.check.node.empty());
  EXPECT_TRUE(contains(h.client.check.error, "rejected")) << h.client.check.error;
  EXPECT_FALSE(h.server.check.ok);
  EXPECT_TRUE(contains(h.server.check.error, "rejected")) << h.server.check.error;
}

TEST(VerifyPeer, RejectsPeerFromAnotherCluster) {
  ClusterCa alpha = ClusterCa::create("alpha");
  ClusterCa beta = ClusterCa::create("beta");
  TlsContext a(issue_local(alpha, "node-a"));
  TlsContext b(issue_local(beta, "node-b"));
  Handshake h = handshake({&a, "alpha"}, {&b, "beta"});
  ASSERT_EQ(h.client.handshake_rc, 0) << gnutls_strerror(h.client.handshake_rc);
  ASSERT_EQ(h.server.handshake_rc, 0) << gnutls_strerror(h.server.handshake_rc);
  EXPECT_FALSE(h.client.check.ok);
  EXPECT_TRUE(contains(h.client.check.error, "issuer is unknown")) << h.client.check.error;
  EXPECT_FALSE(h.server.check.ok);
  EXPECT_TRUE(contains(h.server.check.error, "issuer is unknown")) << h.server.check.error;
}

TEST(VerifyPeer, NamesTheClusterWhenOnlyTheNameDiffers) {
  // A chain that verifies but names a cluster the caller did not ask for.
  ClusterCa beta = ClusterCa::create("beta");
  TlsContext a(issue_local(beta, "node-a"));
  TlsContext b(issue_local(beta, "node-b"));
  Handshake h = handshake({&a, "alpha"}, {&b, "alpha"});
  ASSERT_EQ(h.client.handshake_rc, 0) << gnutls_strerror(h.client.handshake_rc);
  EXPECT_FALSE(h.client.check.ok);
  EXPECT_EQ(h.client.check.error, "certificate is from cluster 'beta', expected 'alpha'");
  EXPECT_FALSE(h.server.check.ok);
  EXPECT_EQ(h.server.check.error, "certificate is from cluster 'beta', expected 'alpha'");
}

TEST(VerifyPeer, ReportsMissingClientCertificate) {
  ClusterCa ca = ClusterCa::create("alpha");
  TlsContext srv(issue_local(ca, "server"));
  Handshake h = handshake({nullptr, "alpha", false, ca.cert_pem()}, {&srv, "alpha"},
                          GNUTLS_CERT_REQUEST);
  ASSERT_EQ(h.server.handshake_rc, 0) << gnutls_strerror(h.server.handshake_rc);
  EXPECT_FALSE(h.server.check.ok);
  EXPECT_TRUE(contains(h.server.check.error, "no certificate")) << h.server.check.error;
  EXPECT_TRUE(h.client.check.ok) << h.client.check.error;
  EXPECT_EQ(h.client.check.node, "server");
}

TEST(VerifyPeer, WorksFromTheHandshakeVerifyHook) {
  ClusterCa ca = ClusterCa::create("alpha");
  ClusterCa impostor = ClusterCa::create("alpha");
  TlsContext a(issue_local(ca, "node-a"));
  TlsContext b(issue_local(ca, "node-b"));
  TlsContext x(issue_local(impostor, "node-x"));

  Handshake good = handshake({&a, "alpha", true}, {&b, "alpha", true});
  EXPECT_EQ(good.client.handshake_rc, 0) << gnutls_strerror(good.client.handshake_rc);
  EXPECT_EQ(good.server.handshake_rc, 0) << gnutls_strerror(good.server.handshake_rc);
  EXPECT_EQ(good.client.check.node, "node-b");
  EXPECT_EQ(good.server.check.node, "node-a");

  Handshake bad = handshake({&a, "alpha", true}, {&x, "alpha", true});
  EXPECT_LT(bad.client.handshake_rc, 0);
  EXPECT_LT(bad.server.handshake_rc, 0);
  EXPECT_FALSE(bad.client.check.ok);
  EXPECT_TRUE(contains(bad.client.check.error, "rejected")) << bad.client.check.error;
}

}  // namespace
