// The trace (comm/tracer.*, Config::trace): 4 real ranks write one Chrome trace-event file
// each when their communicators close; each parses as JSON and holds every collective of
// every communicator as a span with its number and call, its algorithm's steps and its
// waits nested in its span, and the sends and receives as spans naming their peers. A rank
// made again in the same process writes a second file. The merge and the lateness score
// over real files are checked in tests/python/test_trace.py.
#include <nexar/nexar.hpp>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "support.hpp"

namespace {

using namespace std::chrono_literals;
using nexar::Communicator;
using nexar::DataType;
using nexar::ReduceOp;
namespace fs = std::filesystem;

fs::path fresh_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("nexar-trace-test-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d;
}

void run_job(const nexar::Config& cfg) {
  auto comms = nexar::bootstrap_local(4, cfg);
  nexar::testing::on_every_rank(comms, [&](int r) {
    Communicator& c = comms[static_cast<std::size_t>(r)];
    std::vector<float> x(3000, 1.0f);
    for (int i = 0; i < 3; ++i) {
      if (r == 3) std::this_thread::sleep_for(20ms);  // the others wait for it
      c.all_reduce(x, ReduceOp::sum);
    }
    Communicator half = c.split(r % 2, r);
    std::vector<std::int32_t> y(5, r);
    half.broadcast(y, 0);
    std::vector<std::byte> m(100000);
    if (r == 0) c.send(1, 9, m);
    if (r == 1) c.recv(0, 9, m);
    c.barrier();
  });
}

TEST(Tracer, EachRankWritesItsCollectivesWaitsAndMessages) {
  const fs::path dir = fresh_dir("on");
  nexar::Config cfg = nexar::testing::test_config();
  cfg.shm = false;
  cfg.trace = dir.string();
  run_job(cfg);
  std::map<int, nlohmann::json> traces;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    ASSERT_EQ(name.rfind("nexar-trace-", 0), 0u) << name;
    std::ifstream f(e.path());
    nlohmann::json j = nlohmann::json::parse(f);  // throws on a malformed file
    ASSERT_EQ(j["otherData"]["nexar_trace"], 1);
    EXPECT_EQ(j["otherData"]["world"], 4);
    EXPECT_EQ(j["otherData"]["pid"], ::getpid());
    const int rank = j["otherData"]["rank"].get<int>();
    traces[rank] = std::move(j);
  }
  ASSERT_EQ(traces.size(), 4u);
  for (const auto& [rank, j] : traces) {
    std::set<std::string> collectives;
    std::set<std::string> comms;
    std::vector<nlohmann::json> spans, waits;  // waits: the waits and the algorithms' steps
    int steps = 0;
    std::set<std::string> p2p;
    for (const auto& ev : j["traceEvents"]) {
      if (ev["ph"] == "M") continue;
      EXPECT_EQ(ev["ph"], "X");
      EXPECT_EQ(ev["pid"], rank);
      EXPECT_GE(ev["dur"].get<double>(), 0.0);
      if (ev["cat"] == "collective") {
        collectives.insert(ev["name"].get<std::string>());
        comms.insert(ev["args"]["comm"].get<std::string>());
        EXPECT_EQ(ev["args"]["state"], "done");
        EXPECT_EQ(ev["name"], ev["args"]["op"].get<std::string>() + " #" + std::to_string(ev["args"]["seq"].get<int>()));
        EXPECT_LE(ev["args"]["waiting_us"].get<double>(), ev["dur"].get<double>() + 0.01);
        spans.push_back(ev);
      } else if (ev["cat"] == "wait" || ev["cat"] == "step") {
        waits.push_back(ev);
        steps += ev["cat"] == "step";
      } else if (ev["cat"] == "p2p") {
        p2p.insert(ev["name"].get<std::string>());
        EXPECT_EQ(ev["args"]["bytes"], 100000);
      }
    }
    // The world's collectives: the three all_reduces, the split and the barrier (and the
    // members' vote on the mailboxes, whatever number it took); the half's broadcast.
    for (const char* want : {"split", "barrier"}) {
      bool seen = false;
      for (const auto& n : collectives) seen = seen || n.rfind(want, 0) == 0;
      EXPECT_TRUE(seen) << "rank " << rank << " lacks " << want;
    }
    int all_reduces = 0;
    for (const auto& s : spans) all_reduces += s["args"]["op"] == "all_reduce" && s["args"]["count"] == 3000;
    EXPECT_EQ(all_reduces, 3) << "rank " << rank;
    EXPECT_EQ(comms.size(), 2u) << "the world and the half";
    EXPECT_GT(steps, 0) << "rank " << rank << ": the all_reduces' algorithm steps";
    // Every wait and step lies inside a collective of its track.
    for (const auto& w : waits) {
      const double a = w["ts"], b = a + w["dur"].get<double>();
      bool inside = false;
      for (const auto& s : spans) {
        const double sa = s["ts"], sb = sa + s["dur"].get<double>();
        inside = inside || (s["tid"] == w["tid"] && sa <= a + 0.01 && b <= sb + 0.01);
      }
      EXPECT_TRUE(inside) << "rank " << rank << ": a " << w["cat"] << " outside every collective";
    }
    if (rank != 3) {
      EXPECT_FALSE(waits.empty()) << "rank " << rank << " waited for rank 3";
    }
    if (rank == 0) {
      EXPECT_TRUE(p2p.count("send to rank 1")) << "rank 0's send";
    }
    if (rank == 1) {
      EXPECT_TRUE(p2p.count("recv from rank 0")) << "rank 1's receive";
    }
  }
  fs::remove_all(dir);
}

TEST(Tracer, ARankMadeAgainInTheSameProcessKeepsTheFirstFile) {
  const fs::path dir = fresh_dir("twice");
  nexar::Config cfg = nexar::testing::test_config();
  cfg.trace = dir.string();
  run_job(cfg);
  run_job(cfg);
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  const std::string pid = std::to_string(::getpid());
  EXPECT_EQ(names.size(), 8u);
  EXPECT_TRUE(names.count("nexar-trace-2-" + pid + ".json"));
  EXPECT_TRUE(names.count("nexar-trace-2-" + pid + "-2.json"));
  fs::remove_all(dir);
}

}  // namespace
