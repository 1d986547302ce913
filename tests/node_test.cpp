// transport/node.*: Nodes as the layers above see them, with no communicator on top: three
// nodes of one process over real QUIC on loopback (planned by cluster::plan_local), driven
// through Node's own calls. What Peer, Matching, Routing, Failures and Joiners do alone is
// tested without a network (memory_node.hpp); this is what the Node joins them into.
//
// Checked: start() returns with every neighbour connected; a message crosses every ordered
// pair whole, eager and by rendezvous, zero bytes included; a revocation reaches the
// listeners of every member node; what was sent before close() arrives; a closed peer fails
// the sends to it, naming it, and its departure is recorded; a closed node refuses calls.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cluster/local.hpp"
#include "transport/node.hpp"

using namespace nexar;
using detail::Node;

namespace {

using Clock = std::chrono::steady_clock;

// `k` nodes of one process, started together (start() returns once the mesh is up), closed
// together at the end.
struct Nodes {
  Config cfg;
  std::vector<std::shared_ptr<Node>> n;
  std::shared_ptr<const std::vector<int>> identity;

  explicit Nodes(int k, Config c = {}) : cfg(std::move(c)) {
    auto plans = cluster::plan_local(k, cfg);
    for (auto& p : plans) n.push_back(std::make_shared<Node>(cluster::node_options(std::move(p)), cfg));
    std::vector<std::future<void>> started;
    for (auto& node : n) started.push_back(std::async(std::launch::async, [node] { node->start(); }));
    for (auto& f : started) f.get();
    auto id = std::make_shared<std::vector<int>>();
    for (int r = 0; r < k; ++r) id->push_back(r);
    identity = std::move(id);
  }
  ~Nodes() {
    std::vector<std::future<void>> closed;
    for (auto& node : n) closed.push_back(std::async(std::launch::async, [node] { node->close(); }));
    for (auto& f : closed) f.get();
  }

  Node::P2p p2p(const char* op, detail::Tag tag) const {
    Node::P2p a;
    a.op = op;
    a.comm = 1;
    a.tag = tag;
    a.timeout = std::chrono::seconds(20);
    a.local_of = identity;
    return a;
  }
  Request send(int from, int to, detail::Tag tag, const std::vector<std::byte>& msg) {
    const ConstBuffer part{msg.data(), msg.size()};
    return n[static_cast<std::size_t>(from)]->isend(p2p("send", tag), to, std::span(&part, 1));
  }
  Request recv(int at, int from, detail::Tag tag, std::vector<std::byte>& out) {
    return n[static_cast<std::size_t>(at)]->irecv(p2p("recv", tag), from, out.data(), out.size());
  }
};

std::vector<std::byte> bytes_of(std::size_t size, std::uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<std::byte> v(size);
  for (auto& b : v) b = static_cast<std::byte>(g());
  return v;
}

TEST(Node, StartConnectsTheMeshAndMessagesCrossEveryPair) {
  Nodes w(3);
  for (int r = 0; r < 3; ++r) {
    std::vector<int> others;
    for (int o = 0; o < 3; ++o)
      if (o != r) others.push_back(o);
    EXPECT_EQ(w.n[static_cast<std::size_t>(r)]->connected_peers(), others) << r;
    EXPECT_EQ(w.n[static_cast<std::size_t>(r)]->routing().direct_peers(), others) << r;
  }
  // 0 and 1 bytes, odd sizes around the eager limit, and one far above it (rendezvous).
  const std::size_t sizes[] = {0, 1, 4093, w.cfg.eager_limit + 1, 3 * w.cfg.eager_limit + 17};
  for (std::size_t size : sizes) {
    std::vector<std::vector<std::byte>> msgs, outs;
    std::vector<Request> reqs;
    msgs.reserve(6);
    outs.reserve(6);
    for (int a = 0; a < 3; ++a) {
      for (int b = 0; b < 3; ++b) {
        if (a == b) continue;
        msgs.push_back(bytes_of(size, static_cast<std::uint64_t>(a * 10 + b) + size));
        outs.emplace_back(size);
        const auto tag = static_cast<detail::Tag>(a * 3 + b);
        reqs.push_back(w.recv(b, a, tag, outs.back()));
        reqs.push_back(w.send(a, b, tag, msgs.back()));
      }
    }
    for (auto& r : reqs) r.wait();
    for (std::size_t i = 0; i < msgs.size(); ++i) EXPECT_EQ(outs[i], msgs[i]) << size << " bytes, pair " << i;
  }
  const PeerStats s = w.n[0]->peer_stats(2);
  EXPECT_EQ(s.world_rank, 2);
}

TEST(Node, ARevocationReachesEveryMember) {
  Nodes w(3);
  std::mutex mu;
  std::vector<std::string> heard;
  for (int r = 0; r < 3; ++r) {
    w.n[static_cast<std::size_t>(r)]->watch_comm(9, {0, 1, 2}, r, [&, r](int failed, Errc code, const std::string&) {
      std::lock_guard lk(mu);
      heard.push_back(std::to_string(r) + ": " + std::to_string(failed) + " " + to_string(code));
    });
  }
  std::vector<std::byte> out(8);
  auto pending = w.n[2]->irecv(w.p2p("recv", 3), 0, out.data(), out.size());
  Node::P2p in9 = w.p2p("recv", 3);
  in9.comm = 9;
  auto revoked = w.n[2]->irecv(in9, 0, out.data(), out.size());
  w.n[1]->revoke_comm(9);
  const auto until = Clock::now() + std::chrono::seconds(10);
  for (;;) {
    {
      std::lock_guard lk(mu);
      if (heard.size() == 3 || Clock::now() > until) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::sort(heard.begin(), heard.end());
  EXPECT_EQ(heard, (std::vector<std::string>{"0: -1 revoked", "1: -1 revoked", "2: -1 revoked"}));
  try {
    revoked.wait();
    FAIL() << "a receive on a revoked communicator completed";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::revoked);
    EXPECT_NE(std::string(e.what()).find("communicator revoked by rank 1"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(pending.test()) << "another communicator's receive waits on";
  for (auto& node : w.n) node->unwatch_comm(9);
}

TEST(Node, WhatWasSentBeforeCloseArrivesAndAClosedPeerIsNamed) {
  Nodes w(3);
  const auto msg = bytes_of(3 * w.cfg.eager_limit + 5, 7);
  std::vector<std::byte> out(msg.size());
  auto r = w.recv(1, 2, 4, out);
  const ConstBuffer part{msg.data(), msg.size()};
  Node::P2p eager = w.p2p("send", 4);
  eager.eager_in_place = msg.size();  // completes when acknowledged: close() must deliver it
  auto s = w.n[2]->isend(eager, 1, std::span(&part, 1));
  w.n[2]->close();
  s.wait();
  r.wait();
  EXPECT_EQ(out, msg);

  // Rank 2 is gone: a send to it fails naming it; nothing is declared failed.
  const auto until = Clock::now() + std::chrono::seconds(10);
  while (!w.n[0]->departure(2) && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_TRUE(w.n[0]->departure(2).has_value());
  EXPECT_EQ(w.n[0]->departure(2)->first, Errc::peer_closed);
  try {
    w.send(0, 2, 5, msg).wait();
    FAIL() << "a send to a closed peer completed";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::peer_closed) << e.what();
    EXPECT_NE(std::string(e.what()).find("peer 2"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(w.n[0]->failures().is_failed(2)) << "an orderly close is no failure";
  EXPECT_EQ(w.n[0]->connected_peers(), (std::vector<int>{1}));

  // A closed node refuses calls, naming the operation.
  try {
    w.n[2]->check_open("send", 0);
    FAIL() << "a closed node took a call";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::closed);
    EXPECT_NE(std::string(e.what()).find("send"), std::string::npos) << e.what();
  }
}

}  // namespace
