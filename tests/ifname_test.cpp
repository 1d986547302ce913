// Tests of choosing a network interface (src/cluster/ifname.*): NCCL_SOCKET_IFNAME-style
// filters, picking an address by family and preference, and the host's interface list.
#include <gtest/gtest.h>

#include "cluster/ifname.hpp"
#include "support.hpp"

#include <sys/socket.h>

#include <string>
#include <vector>

namespace {

using nexar::Errc;
using nexar::testing::contains;
using nexar::testing::expect_error;
using namespace nexar::cluster;

InterfaceAddress addr(std::string name, std::string ip, int family, bool loopback = false) {
  return InterfaceAddress{std::move(name), std::move(ip), family, loopback};
}

TEST(IfName, EmptySpecMatchesEverything) {
  for (const char* spec : {"", "   "}) {
    const InterfaceFilter f(spec);
    EXPECT_TRUE(f.empty());
    EXPECT_TRUE(f.matches("eth0"));
    EXPECT_TRUE(f.matches("lo"));
  }
  EXPECT_TRUE(InterfaceFilter().matches("anything"));
}

TEST(IfName, PrefixEntries) {
  const InterfaceFilter f("eth,ib");
  EXPECT_FALSE(f.exclude());
  EXPECT_FALSE(f.exact());
  EXPECT_EQ(f.entries(), (std::vector<std::string>{"eth", "ib"}));
  EXPECT_TRUE(f.matches("eth0"));
  EXPECT_TRUE(f.matches("eth"));
  EXPECT_TRUE(f.matches("ib1"));
  EXPECT_FALSE(f.matches("en0"));
  EXPECT_FALSE(f.matches("et"));
  EXPECT_FALSE(f.matches("lo"));
}

TEST(IfName, ExactEntries) {
  const InterfaceFilter f("=eth0,ib1");
  EXPECT_TRUE(f.exact());
  EXPECT_FALSE(f.exclude());
  EXPECT_TRUE(f.matches("eth0"));
  EXPECT_TRUE(f.matches("ib1"));
  EXPECT_FALSE(f.matches("eth01"));
  EXPECT_FALSE(f.matches("eth"));
}

TEST(IfName, ExcludePrefixes) {
  const InterfaceFilter f("^docker,lo");
  EXPECT_TRUE(f.exclude());
  EXPECT_FALSE(f.exact());
  EXPECT_FALSE(f.matches("docker0"));
  EXPECT_FALSE(f.matches("lo"));
  EXPECT_FALSE(f.matches("lo2"));
  EXPECT_TRUE(f.matches("eth0"));
}

TEST(IfName, ExcludeExact) {
  const InterfaceFilter f("^=eth0");
  EXPECT_TRUE(f.exclude());
  EXPECT_TRUE(f.exact());
  EXPECT_FALSE(f.matches("eth0"));
  EXPECT_TRUE(f.matches("eth01"));
  EXPECT_TRUE(f.matches("eth1"));
}

TEST(IfName, WhitespaceIgnored) {
  const InterfaceFilter f("  ^ = eth0 ,\tib1  ");
  EXPECT_TRUE(f.exclude());
  EXPECT_TRUE(f.exact());
  EXPECT_EQ(f.entries(), (std::vector<std::string>{"eth0", "ib1"}));
  EXPECT_FALSE(f.matches("ib1"));
  EXPECT_TRUE(f.matches("ib"));
}

TEST(IfName, MalformedSpecs) {
  for (const char* spec : {"eth,,lo", "eth,", ",eth", "^", "=", "^=", "eth, ,lo", "=^eth",
                           "eth,^lo", "eth,=lo", "et h", "averyveryverylongname"}) {
    SCOPED_TRACE(spec);
    const std::string msg = expect_error(Errc::invalid_argument, [&] { InterfaceFilter f(spec); });
    EXPECT_TRUE(contains(msg, "NEXAR_SOCKET_IFNAME")) << msg;
    EXPECT_TRUE(contains(msg, std::string("'") + spec + "'")) << msg;
  }
  const std::string msg =
      expect_error(Errc::invalid_argument, [] { InterfaceFilter f("eth,,lo"); });
  EXPECT_TRUE(contains(msg, "empty entry")) << msg;
}

std::vector<InterfaceAddress> sample() {
  return {
      addr("lo", "127.0.0.1", AF_INET, true), addr("lo", "::1", AF_INET6, true),
      addr("docker0", "172.17.0.1", AF_INET), addr("eth0", "fd00::2", AF_INET6),
      addr("eth0", "192.0.2.2", AF_INET),     addr("ib0", "fd01::5", AF_INET6),
      addr("eth1", "198.51.100.7", AF_INET),
  };
}

TEST(IfName, PickByFamily) {
  const auto all = sample();
  auto a = pick_interface("eth", AF_INET, all);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->name, "eth0");
  EXPECT_EQ(a->ip, "192.0.2.2");
  EXPECT_EQ(a->family, AF_INET);

  a = pick_interface("eth", AF_INET6, all);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->ip, "fd00::2");

  // AF_UNSPEC prefers IPv4 even when an IPv6 address comes first in the list.
  a = pick_interface("eth", AF_UNSPEC, all);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->ip, "192.0.2.2");

  // ... and takes IPv6 when the interface has nothing else.
  a = pick_interface("ib", AF_UNSPEC, all);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->ip, "fd01::5");
  EXPECT_EQ(a->family, AF_INET6);

  a = pick_interface("=eth1", AF_INET, all);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->ip, "198.51.100.7");

  a = pick_interface("^eth,lo", AF_INET, all);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->name, "docker0");

  // An exclusion that still matches loopback prefers an interface other hosts can reach,
  // even when loopback comes first in the system's order.
  a = pick_interface("^docker", AF_INET, all);
  ASSERT_TRUE(a);
  EXPECT_FALSE(a->loopback) << a->name;

  // An explicit spec may pick loopback.
  a = pick_interface("lo", AF_INET6, all);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->ip, "::1");
}

TEST(IfName, PickNoMatch) {
  const auto all = sample();
  EXPECT_FALSE(pick_interface("wlan", AF_UNSPEC, all));
  EXPECT_FALSE(pick_interface("=eth", AF_INET, all));
  EXPECT_FALSE(pick_interface("ib", AF_INET, all));
  EXPECT_FALSE(pick_interface("", AF_INET, {}));
}

TEST(IfName, DefaultSpecPreference) {
  // Non-loopback, not docker*, not lo*: eth0 wins although docker0 and lo come first.
  auto a = pick_interface("", AF_INET, sample());
  ASSERT_TRUE(a);
  EXPECT_EQ(a->name, "eth0");
  a = pick_interface("", AF_UNSPEC, sample());
  ASSERT_TRUE(a);
  EXPECT_EQ(a->ip, "192.0.2.2");

  // A regular interface with only IPv6 beats docker and loopback IPv4 under AF_UNSPEC.
  const std::vector<InterfaceAddress> v6only = {addr("lo", "127.0.0.1", AF_INET, true),
                                                addr("docker0", "172.17.0.1", AF_INET),
                                                addr("ens5", "fd00::9", AF_INET6)};
  a = pick_interface("", AF_UNSPEC, v6only);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->name, "ens5");

  // Only docker and loopback: docker before loopback.
  const std::vector<InterfaceAddress> docker = {addr("lo", "127.0.0.1", AF_INET, true),
                                                addr("docker0", "172.17.0.1", AF_INET)};
  a = pick_interface("", AF_INET, docker);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->name, "docker0");
}

TEST(IfName, DefaultSpecFallsBackToLoopback) {
  const std::vector<InterfaceAddress> lo_only = {addr("lo", "127.0.0.1", AF_INET, true),
                                                 addr("lo", "::1", AF_INET6, true)};
  auto a = pick_interface("", AF_UNSPEC, lo_only);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->ip, "127.0.0.1");
  a = pick_interface("", AF_INET6, lo_only);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->ip, "::1");
}

TEST(IfName, BadFamily) {
  const std::string msg =
      expect_error(Errc::invalid_argument, [] { (void)pick_interface("", 12345, sample()); });
  EXPECT_TRUE(contains(msg, "12345")) << msg;
}

TEST(IfName, RequireInterface) {
  const auto all = sample();
  EXPECT_EQ(require_interface("eth1", AF_INET, all).ip, "198.51.100.7");
  std::string msg =
      expect_error(Errc::invalid_argument, [&] { (void)require_interface("wlan", AF_INET, all); });
  EXPECT_TRUE(contains(msg, "NEXAR_SOCKET_IFNAME='wlan'")) << msg;
  EXPECT_TRUE(contains(msg, "IPv4")) << msg;
  EXPECT_TRUE(contains(msg, "(have: lo, docker0, eth0, ib0, eth1)")) << msg;
  msg = expect_error(Errc::invalid_argument, [&] { (void)require_interface("ib", AF_INET, all); });
  EXPECT_TRUE(contains(msg, "IPv4")) << msg;
  msg = expect_error(Errc::invalid_argument, [&] { (void)require_interface("x", AF_INET6, {}); });
  EXPECT_TRUE(contains(msg, "IPv6")) << msg;
  EXPECT_TRUE(contains(msg, "have: none")) << msg;
  // A malformed spec is reported as such.
  msg = expect_error(Errc::invalid_argument, [] { (void)require_interface("a,,b", AF_INET); });
  EXPECT_TRUE(contains(msg, "empty entry")) << msg;
}

TEST(IfName, ListInterfacesHasLoopback) {
  const auto all = list_interfaces();
  bool found = false;
  for (const auto& a : all) {
    EXPECT_FALSE(a.name.empty());
    EXPECT_TRUE(a.family == AF_INET || a.family == AF_INET6);
    EXPECT_FALSE(a.ip.empty());
    EXPECT_EQ(a.ip.find('['), std::string::npos) << a.ip;
    EXPECT_EQ(a.ip.find('%'), std::string::npos) << a.ip;
    if (a.family == AF_INET6) {
      EXPECT_FALSE(a.ip.starts_with("fe8") || a.ip.starts_with("fe9") || a.ip.starts_with("fea") ||
                   a.ip.starts_with("feb"))
          << "link-local address listed: " << a.ip;
    }
    if (a.name == "lo" && a.ip == "127.0.0.1") {
      found = true;
      EXPECT_TRUE(a.loopback);
      EXPECT_EQ(a.family, AF_INET);
    }
  }
  EXPECT_TRUE(found) << "no lo / 127.0.0.1 among " << all.size() << " addresses";
  EXPECT_EQ(require_interface("=lo", AF_INET).ip, "127.0.0.1");
}

}  // namespace
