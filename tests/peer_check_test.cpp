#include "tls/peer_check.hpp"

#include "tls/ca.hpp"
#include "tls/node_key.hpp"
#include "tls/tls_context.hpp"

#include <gnutls/gnutls.h>

#include <gtest/gtest.h>

#include "support.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <utility>

namespace {

using nexar::testing::contains;
using namespace nexar::tls;

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
