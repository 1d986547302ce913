// Dumps on demand (comm/dump_signal.*): the dump of a process holds each of its ranks, what
// each is doing and every communicator's recorder with its pending sends and receives; and
// SIGUSR1 makes the process write it, whole, to NEXAR_DUMP_DIR. nexar-run --dump, which
// signals every rank and merges their files, is tested across processes in
// tests/python/test_multiprocess.py.
#include <nexar/nexar.hpp>

#include <gtest/gtest.h>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "comm/dump_signal.hpp"
#include "support.hpp"

namespace {

using namespace std::chrono_literals;
using nexar::testing::contains;

TEST(DumpSignal, AProcessDumpHoldsEachRankItsCommunicatorsAndPendingOperations) {
  auto comms = nexar::bootstrap_local(2, nexar::testing::test_config());
  nexar::testing::on_every_rank(comms, [&](int r) { comms[static_cast<std::size_t>(r)].barrier(); });
  char buf[16];
  auto pending = comms[0].irecv(1, 3, buf, sizeof buf);  // never sent: open in the dump
  const std::string d = nexar::detail::process_dump();
  EXPECT_TRUE(contains(d, R"("pid":)" + std::to_string(::getpid()))) << d;
  EXPECT_TRUE(contains(d, R"("world_rank":0,"doing":"in recv from rank 1 (tag 3, up to 16 bytes) on communicator 0x0 for )"))
      << d;
  EXPECT_TRUE(contains(d, R"("world_rank":1,"doing":"in no operation")")) << d;
  EXPECT_TRUE(contains(d, R"("pending":["recv from rank 1 (tag 3, up to 16 bytes) for )")) << d;
  EXPECT_TRUE(contains(d, R"("op":"barrier")")) << d;
  pending.cancel();
}

TEST(DumpSignal, SigusrOneWritesTheDumpToTheDumpDirectory) {
  namespace fs = std::filesystem;
  auto comms = nexar::bootstrap_local(2, nexar::testing::test_config());
  const fs::path dir = fs::temp_directory_path() / ("nexar-dump-test-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  nexar::testing::ScopedEnv env("NEXAR_DUMP_DIR", dir.string());
  const fs::path file = dir / ("nexar-dump-" + std::to_string(::getpid()) + ".json");
  ASSERT_EQ(::raise(SIGUSR1), 0);
  const auto until = std::chrono::steady_clock::now() + 5s;
  while (!fs::exists(file) && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(10ms);
  ASSERT_TRUE(fs::exists(file));
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_TRUE(contains(text.str(), R"("world_rank":0)")) << text.str();
  EXPECT_TRUE(contains(text.str(), R"("world_rank":1)")) << text.str();
  fs::remove_all(dir);
}

}  // namespace
