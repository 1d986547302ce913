// Tests of reading a launcher's environment (src/cluster/launch_env.*): the NEXAR_*,
// torchrun, Open MPI, PMI and Slurm conventions, their precedence and errors, and the token
// readers that follow the same rules.
#include <gtest/gtest.h>

#include <nexar/cluster.hpp>
#include <nexar/error.hpp>

#include "cluster/launch_env.hpp"
#include "core/env_vars.hpp"
#include "support.hpp"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using nexar::Errc;
using nexar::testing::contains;
using nexar::testing::expect_error;
using nexar::testing::ScopedEnv;
using namespace nexar::cluster;

using Vars = std::map<std::string, std::string>;

EnvLookup map_env(Vars vars) {
  return [vars = std::move(vars)](const char* name) -> std::optional<std::string> {
    const auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

LaunchEnv resolve(const Vars& vars) { return resolve_launch_env(map_env(vars)); }

// Expects resolve(vars) to fail with invalid_argument whose message contains every one of
// `parts`; returns the message.
std::string resolve_error(const Vars& vars, const std::vector<std::string>& parts) {
  const std::string msg = expect_error(Errc::invalid_argument, [&] { (void)resolve(vars); });
  EXPECT_TRUE(contains(msg, "join_from_env")) << msg;
  for (const auto& p : parts) EXPECT_TRUE(contains(msg, p)) << "missing '" << p << "' in: " << msg;
  return msg;
}

class TempDir {
 public:
  TempDir() {
    std::string tmpl =
        (std::filesystem::temp_directory_path() / "nexar-cluster-test-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string write(const std::string& name, const std::string& contents) const {
    const auto p = path_ / name;
    std::ofstream(p, std::ios::binary) << contents;
    return p.string();
  }
  std::string path(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

TEST(LaunchEnv, NexarConvention) {
  const auto e = resolve({{"NEXAR_RANK", "2"},
                          {"NEXAR_WORLD_SIZE", "8"},
                          {"NEXAR_LOCAL_RANK", "0"},
                          {"NEXAR_LOCAL_WORLD_SIZE", "2"},
                          {"NEXAR_SEED_ADDR", "seed.example:4000"},
                          {"NEXAR_CLUSTER_TOKEN", "s3cret"}});
  EXPECT_EQ(e.source, "nexar");
  EXPECT_EQ(e.rank, 2);
  EXPECT_EQ(e.world, 8);
  EXPECT_EQ(e.local_rank, 0);
  EXPECT_EQ(e.local_world, 2);
  EXPECT_EQ(e.seed, "seed.example:4000");
  EXPECT_FALSE(e.embed_seed);
  EXPECT_TRUE(e.seed_listen.empty());
  EXPECT_EQ(e.token, "s3cret");
  EXPECT_FALSE(e.token_derived);
  EXPECT_EQ(e.join_timeout, std::chrono::minutes(3));
  EXPECT_EQ(e.formation_timeout, std::chrono::minutes(2));
  EXPECT_TRUE(e.bind.empty());
  EXPECT_TRUE(e.advertise.empty());
  EXPECT_TRUE(e.ifname.empty());
  EXPECT_TRUE(e.seed_fingerprint.empty());
  EXPECT_TRUE(e.seed_ca_pem.empty());
}

TEST(LaunchEnv, SeedAddrOnlyLeavesRankToSeed) {
  auto e = resolve({{"NEXAR_SEED_ADDR", "10.0.0.1:29400"}, {"NEXAR_CLUSTER_TOKEN", "t"}});
  EXPECT_EQ(e.source, "");
  EXPECT_EQ(e.rank, -1);
  EXPECT_EQ(e.world, 0);
  EXPECT_EQ(e.local_rank, -1);
  EXPECT_EQ(e.local_world, 0);
  EXPECT_EQ(e.seed, "10.0.0.1:29400");
  EXPECT_FALSE(e.embed_seed);

  e = resolve({{"NEXAR_SEED_ADDR", "10.0.0.1:29400"},
               {"NEXAR_WORLD_SIZE", "4"},
               {"NEXAR_CLUSTER_TOKEN", "t"}});
  EXPECT_EQ(e.rank, -1);
  EXPECT_EQ(e.world, 4);
}

TEST(LaunchEnv, Torchrun) {
  Vars v = {{"RANK", "0"},
            {"WORLD_SIZE", "4"},
            {"LOCAL_RANK", "0"},
            {"LOCAL_WORLD_SIZE", "2"},
            {"MASTER_ADDR", "10.1.2.3"},
            {"MASTER_PORT", "1234"},
            {"TORCHELASTIC_RUN_ID", "abc123"}};
  auto e = resolve(v);
  EXPECT_EQ(e.source, "torchrun");
  EXPECT_EQ(e.rank, 0);
  EXPECT_EQ(e.world, 4);
  EXPECT_EQ(e.local_rank, 0);
  EXPECT_EQ(e.local_world, 2);
  EXPECT_EQ(e.seed, "10.1.2.3:1234");
  EXPECT_TRUE(e.embed_seed);
  EXPECT_EQ(e.seed_listen, "0.0.0.0:1234");
  EXPECT_EQ(e.token, "derived:torchrun:abc123");
  EXPECT_TRUE(e.token_derived);

  // Other ranks dial the same seed but do not run it.
  v["RANK"] = "3";
  v["LOCAL_RANK"] = "1";
  e = resolve(v);
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.seed, "10.1.2.3:1234");
  EXPECT_FALSE(e.embed_seed);
  EXPECT_TRUE(e.seed_listen.empty());
}

TEST(LaunchEnv, MasterPortDefaultAndOverride) {
  Vars v = {
      {"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "head"}, {"NEXAR_CLUSTER_TOKEN", "t"}};
  auto e = resolve(v);
  EXPECT_EQ(e.seed, "head:29500");
  EXPECT_EQ(e.seed_listen, "0.0.0.0:29500");
  v["MASTER_PORT"] = "1111";
  v["NEXAR_SEED_PORT"] = "2222";
  e = resolve(v);
  EXPECT_EQ(e.seed, "head:2222");
  EXPECT_EQ(e.seed_listen, "0.0.0.0:2222");
}

TEST(LaunchEnv, OpenMpi) {
  const Vars v = {{"OMPI_COMM_WORLD_RANK", "1"},
                  {"OMPI_COMM_WORLD_SIZE", "4"},
                  {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                  {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                  {"NEXAR_SEED_ADDR", "seed:1"},
                  {"OMPI_MCA_orte_hnp_uri", "42.0;tcp://x:1"},
                  {"PMIX_NAMESPACE", "ns"}};
  const auto e = resolve(v);
  EXPECT_EQ(e.source, "openmpi");
  EXPECT_EQ(e.rank, 1);
  EXPECT_EQ(e.world, 4);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world, 2);
  EXPECT_EQ(e.seed, "seed:1");
  EXPECT_EQ(e.token, "derived:openmpi:42.0;tcp://x:1");
  EXPECT_TRUE(e.token_derived);
}

TEST(LaunchEnv, OpenMpiDerivedTokenFallbacks) {
  Vars v = {{"OMPI_COMM_WORLD_RANK", "0"},
            {"OMPI_COMM_WORLD_SIZE", "1"},
            {"NEXAR_SEED_ADDR", "seed:1"},
            {"PMIX_NAMESPACE", "prterun-host-123@1"},
            {"OMPI_MCA_ess_base_jobid", "99"}};
  EXPECT_EQ(resolve(v).token, "derived:openmpi:prterun-host-123@1");
  v.erase("PMIX_NAMESPACE");
  EXPECT_EQ(resolve(v).token, "derived:openmpi:99");
}

TEST(LaunchEnv, Pmi) {
  Vars v = {{"PMI_RANK", "3"},       {"PMI_SIZE", "6"},        {"PMI_LOCAL_RANK", "1"},
            {"PMI_LOCAL_SIZE", "3"}, {"MASTER_ADDR", "node7"}, {"PMI_KVSNAME", "kvs_77"}};
  auto e = resolve(v);
  EXPECT_EQ(e.source, "pmi");
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world, 6);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world, 3);
  EXPECT_EQ(e.seed, "node7:29500");
  EXPECT_FALSE(e.embed_seed);
  EXPECT_EQ(e.token, "derived:pmi:kvs_77");

  // PMIx rank and the MPICH/Hydra local variables; PMIX_NAMESPACE before PMI_KVSNAME.
  v = {{"PMIX_RANK", "0"},
       {"PMI_SIZE", "2"},
       {"MPI_LOCALRANKID", "0"},
       {"MPI_LOCALNRANKS", "1"},
       {"MASTER_ADDR", "node7"},
       {"PMI_KVSNAME", "kvs_77"},
       {"PMIX_NAMESPACE", "slurm.pmix.5.0"}};
  e = resolve(v);
  EXPECT_EQ(e.source, "pmi");
  EXPECT_EQ(e.rank, 0);
  EXPECT_EQ(e.world, 2);
  EXPECT_EQ(e.local_rank, 0);
  EXPECT_EQ(e.local_world, 1);
  EXPECT_TRUE(e.embed_seed);
  EXPECT_EQ(e.token, "derived:pmi:slurm.pmix.5.0");

  // PMI_RANK is taken before PMIX_RANK.
  v["PMI_RANK"] = "1";
  EXPECT_EQ(resolve(v).rank, 1);
}

TEST(LaunchEnv, Slurm) {
  Vars v = {{"SLURM_PROCID", "0"},
            {"SLURM_NTASKS", "8"},
            {"SLURM_LOCALID", "0"},
            {"SLURM_NTASKS_PER_NODE", "4"},
            {"SLURM_STEP_NODELIST", "gpu[03-04,09],cpu1"},
            {"SLURM_JOB_NODELIST", "other[1-9]"},
            {"SLURM_JOB_ID", "12345"},
            {"SLURM_STEP_ID", "2"}};
  auto e = resolve(v);
  EXPECT_EQ(e.source, "slurm");
  EXPECT_EQ(e.rank, 0);
  EXPECT_EQ(e.world, 8);
  EXPECT_EQ(e.local_rank, 0);
  EXPECT_EQ(e.local_world, 4);
  EXPECT_EQ(e.seed, "gpu03:29400");
  EXPECT_TRUE(e.embed_seed);
  EXPECT_EQ(e.seed_listen, "0.0.0.0:29400");
  EXPECT_EQ(e.token, "derived:slurm:12345.2");
  EXPECT_TRUE(e.token_derived);

  // Non-integer tasks per node ("2(x3),1") is ignored; SLURM_NPROCS; job node list.
  v.erase("SLURM_NTASKS");
  v.erase("SLURM_STEP_NODELIST");
  v.erase("SLURM_STEP_ID");
  v["SLURM_NPROCS"] = "7";
  v["SLURM_NTASKS_PER_NODE"] = "2(x3),1";
  v["SLURM_PROCID"] = "5";
  v["SLURM_LOCALID"] = "1";
  v["NEXAR_SEED_PORT"] = "5000";
  e = resolve(v);
  EXPECT_EQ(e.world, 7);
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.local_world, 0);
  EXPECT_EQ(e.seed, "other1:5000");
  EXPECT_FALSE(e.embed_seed);
  EXPECT_TRUE(e.seed_listen.empty());
  EXPECT_EQ(e.token, "derived:slurm:12345");
}

TEST(LaunchEnv, SlurmUsesMasterAddrWhenSet) {
  const auto e = resolve({{"SLURM_PROCID", "0"},
                          {"SLURM_NTASKS", "2"},
                          {"SLURM_STEP_NODELIST", "n[1-2]"},
                          {"MASTER_ADDR", "head"},
                          {"SLURM_JOB_ID", "1"}});
  EXPECT_EQ(e.seed, "head:29500");
  EXPECT_TRUE(e.embed_seed);
}

TEST(LaunchEnv, Precedence) {
  const Vars nexar = {{"NEXAR_RANK", "1"}, {"NEXAR_WORLD_SIZE", "10"}};
  const Vars torch = {{"RANK", "2"}, {"WORLD_SIZE", "20"}};
  const Vars ompi = {{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "30"}};
  const Vars pmi = {{"PMI_RANK", "4"}, {"PMI_SIZE", "40"}};
  const Vars slurm = {{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "50"}};
  const std::vector<std::pair<std::string, const Vars*>> order = {{"nexar", &nexar},
                                                                  {"torchrun", &torch},
                                                                  {"openmpi", &ompi},
                                                                  {"pmi", &pmi},
                                                                  {"slurm", &slurm}};
  // With conventions i..4 all present, convention i wins.
  for (std::size_t i = 0; i < order.size(); ++i) {
    Vars v = {{"NEXAR_SEED_ADDR", "s:1"}, {"NEXAR_CLUSTER_TOKEN", "t"}};
    for (std::size_t j = i; j < order.size(); ++j)
      v.insert(order[j].second->begin(), order[j].second->end());
    const auto e = resolve(v);
    SCOPED_TRACE(order[i].first);
    EXPECT_EQ(e.source, order[i].first);
    EXPECT_EQ(e.rank, static_cast<int>(i) + 1);
    EXPECT_EQ(e.world, 10 * (static_cast<int>(i) + 1));
  }
}

TEST(LaunchEnv, NexarOverridesSingleFields) {
  const auto e = resolve({{"OMPI_COMM_WORLD_RANK", "1"},
                          {"OMPI_COMM_WORLD_SIZE", "4"},
                          {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                          {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                          {"NEXAR_WORLD_SIZE", "8"},
                          {"NEXAR_LOCAL_RANK", "0"},
                          {"NEXAR_LOCAL_WORLD_SIZE", "2"},
                          {"NEXAR_SEED_ADDR", "s:1"},
                          {"NEXAR_CLUSTER_TOKEN", "t"}});
  EXPECT_EQ(e.source, "openmpi");
  EXPECT_EQ(e.rank, 1);
  EXPECT_EQ(e.world, 8);
  EXPECT_EQ(e.local_rank, 0);
  EXPECT_EQ(e.local_world, 2);
}

TEST(LaunchEnv, NexarWorldSizeFillsMissingWorld) {
  const auto e = resolve({{"PMIX_RANK", "2"},
                          {"NEXAR_WORLD_SIZE", "3"},
                          {"NEXAR_SEED_ADDR", "s:1"},
                          {"NEXAR_CLUSTER_TOKEN", "t"}});
  EXPECT_EQ(e.source, "pmi");
  EXPECT_EQ(e.rank, 2);
  EXPECT_EQ(e.world, 3);
}

TEST(LaunchEnv, GroupsDoNotMix) {
  // Open MPI's rank with Slurm's world size: Open MPI has no world size, and Slurm's is not
  // borrowed.
  resolve_error({{"OMPI_COMM_WORLD_RANK", "1"},
                 {"SLURM_NTASKS", "4"},
                 {"SLURM_PROCID", "0"},
                 {"NEXAR_SEED_ADDR", "s:1"},
                 {"NEXAR_CLUSTER_TOKEN", "t"}},
                {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"});
  // Local values come from the chosen convention only.
  const auto e = resolve({{"RANK", "1"},
                          {"WORLD_SIZE", "4"},
                          {"SLURM_LOCALID", "3"},
                          {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                          {"NEXAR_SEED_ADDR", "s:1"},
                          {"NEXAR_CLUSTER_TOKEN", "t"}});
  EXPECT_EQ(e.source, "torchrun");
  EXPECT_EQ(e.local_rank, -1);
  EXPECT_EQ(e.local_world, 0);
  // NEXAR_RANK selects the nexar convention: torchrun's WORLD_SIZE is not used.
  resolve_error({{"NEXAR_RANK", "1"}, {"WORLD_SIZE", "4"}, {"NEXAR_SEED_ADDR", "s:1"}},
                {"NEXAR_RANK", "NEXAR_WORLD_SIZE"});
}

TEST(LaunchEnv, MissingWorldSizeErrors) {
  const Vars base = {{"NEXAR_SEED_ADDR", "s:1"}, {"NEXAR_CLUSTER_TOKEN", "t"}};
  const std::vector<std::pair<Vars, std::vector<std::string>>> cases = {
      {{{"RANK", "0"}}, {"RANK", "WORLD_SIZE"}},
      {{{"OMPI_COMM_WORLD_RANK", "0"}}, {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"}},
      {{{"PMI_RANK", "0"}}, {"PMI_RANK", "PMI_SIZE"}},
      {{{"PMIX_RANK", "0"}}, {"PMIX_RANK", "PMI_SIZE"}},
      {{{"SLURM_PROCID", "0"}}, {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_NPROCS"}},
      {{{"NEXAR_RANK", "0"}}, {"NEXAR_RANK", "NEXAR_WORLD_SIZE"}},
  };
  for (const auto& [vars, parts] : cases) {
    Vars v = base;
    v.insert(vars.begin(), vars.end());
    SCOPED_TRACE(parts[0]);
    resolve_error(v, parts);
  }
}

TEST(LaunchEnv, IntegerAndRangeErrors) {
  const Vars base = {{"NEXAR_SEED_ADDR", "s:1"}, {"NEXAR_CLUSTER_TOKEN", "t"}};
  const auto check = [&](Vars extra, std::vector<std::string> parts) {
    Vars v = base;
    v.insert(extra.begin(), extra.end());
    resolve_error(v, parts);
  };
  check({{"NEXAR_RANK", "x"}, {"NEXAR_WORLD_SIZE", "4"}}, {"NEXAR_RANK='x' is not an integer"});
  check({{"NEXAR_RANK", "1 "}, {"NEXAR_WORLD_SIZE", "4"}}, {"NEXAR_RANK='1 '"});
  check({{"NEXAR_RANK", "+1"}, {"NEXAR_WORLD_SIZE", "4"}}, {"NEXAR_RANK='+1'"});
  check({{"NEXAR_RANK", "99999999999"}, {"NEXAR_WORLD_SIZE", "4"}}, {"NEXAR_RANK='99999999999'"});
  check({{"RANK", "0"}, {"WORLD_SIZE", "four"}}, {"WORLD_SIZE='four'"});
  check({{"RANK", "0"}, {"WORLD_SIZE", "0"}}, {"WORLD_SIZE=0", "at least 1"});
  check({{"NEXAR_WORLD_SIZE", "-3"}}, {"NEXAR_WORLD_SIZE=-3"});
  check({{"RANK", "-1"}, {"WORLD_SIZE", "4"}}, {"RANK=-1", "negative"});
  check({{"OMPI_COMM_WORLD_RANK", "5"}, {"OMPI_COMM_WORLD_SIZE", "4"}},
        {"rank 5 >= world size 4 (from OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE)"});
  check({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"NEXAR_WORLD_SIZE", "2"}},
        {"rank 3 >= world size 2 (from OMPI_COMM_WORLD_RANK / NEXAR_WORLD_SIZE)"});
  check({{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "-2"}}, {"LOCAL_RANK=-2", "negative"});
  check({{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "a"}}, {"LOCAL_RANK='a'"});
  check({{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_WORLD_SIZE", "0"}}, {"LOCAL_WORLD_SIZE=0"});
  check({{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}},
        {"local rank 2 >= local world size 2 (from LOCAL_RANK / LOCAL_WORLD_SIZE)"});
  check({{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_WORLD_SIZE", "8"}},
        {"local world size 8 > world size 4 (from LOCAL_WORLD_SIZE / WORLD_SIZE)"});
  check({{"PMI_RANK", "0"}, {"PMI_SIZE", "4"}, {"MPI_LOCALRANKID", "x"}}, {"MPI_LOCALRANKID='x'"});
  check({{"SLURM_PROCID", "0"}, {"SLURM_NPROCS", "z"}}, {"SLURM_NPROCS='z'"});
}

TEST(LaunchEnv, NothingFound) {
  const std::string msg =
      resolve_error({}, {"NEXAR_SEED_ADDR", "MASTER_ADDR", "NEXAR_RANK", "RANK",
                         "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"});
  EXPECT_TRUE(contains(msg, "found no launcher")) << msg;
  // A world size and token alone are not enough either.
  resolve_error({{"NEXAR_WORLD_SIZE", "2"}, {"NEXAR_CLUSTER_TOKEN", "t"}}, {"NEXAR_SEED_ADDR"});
}

TEST(LaunchEnv, NoSeedAddressErrors) {
  std::string msg = resolve_error(
      {{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"NEXAR_CLUSTER_TOKEN", "t"}},
      {"no seed address for Open MPI ranks", "NEXAR_SEED_ADDR", "MASTER_ADDR/MASTER_PORT"});
  msg = resolve_error({{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}, {"NEXAR_CLUSTER_TOKEN", "t"}},
                      {"no seed address for PMI ranks", "NEXAR_SEED_ADDR", "MASTER_ADDR"});
  resolve_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"NEXAR_CLUSTER_TOKEN", "t"}},
                {"no seed address for torchrun ranks", "NEXAR_SEED_ADDR", "MASTER_ADDR"});
  resolve_error({{"NEXAR_RANK", "0"}, {"NEXAR_WORLD_SIZE", "2"}, {"NEXAR_CLUSTER_TOKEN", "t"}},
                {"no seed address", "NEXAR_SEED_ADDR", "MASTER_ADDR"});
  resolve_error({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_ID", "1"}},
                {"no seed address for Slurm ranks", "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"});
}

TEST(LaunchEnv, EmbeddedSeedNeedsRank) {
  resolve_error({{"MASTER_ADDR", "head"}, {"NEXAR_CLUSTER_TOKEN", "t"}},
                {"MASTER_ADDR", "rank", "NEXAR_SEED_ADDR"});
  resolve_error({{"MASTER_ADDR", "head"}, {"NEXAR_WORLD_SIZE", "4"}, {"NEXAR_CLUSTER_TOKEN", "t"}},
                {"MASTER_ADDR", "rank"});
}

TEST(LaunchEnv, SeedAddrForms) {
  const Vars base = {{"NEXAR_CLUSTER_TOKEN", "t"}};
  const auto seed = [&](Vars extra) {
    Vars v = base;
    v.insert(extra.begin(), extra.end());
    return resolve(v);
  };
  EXPECT_EQ(seed({{"NEXAR_SEED_ADDR", "[::1]:29500"}}).seed, "[::1]:29500");
  EXPECT_EQ(seed({{"NEXAR_SEED_ADDR", "[fd00::1]"}}).seed, "[fd00::1]:29400");
  EXPECT_EQ(seed({{"NEXAR_SEED_ADDR", "host"}}).seed, "host:29400");
  EXPECT_EQ(seed({{"NEXAR_SEED_ADDR", "host"}, {"NEXAR_SEED_PORT", "7"}}).seed, "host:7");
  EXPECT_EQ(seed({{"NEXAR_SEED_ADDR", "host:7"}, {"NEXAR_SEED_PORT", "7"}}).seed, "host:7");
  // NEXAR_SEED_ADDR wins over MASTER_ADDR, and nobody embeds the seed.
  const auto e = seed(
      {{"NEXAR_SEED_ADDR", "ext:9"}, {"MASTER_ADDR", "head"}, {"RANK", "0"}, {"WORLD_SIZE", "2"}});
  EXPECT_EQ(e.seed, "ext:9");
  EXPECT_FALSE(e.embed_seed);
  EXPECT_TRUE(e.seed_listen.empty());
}

TEST(LaunchEnv, SeedAddrErrors) {
  const auto bad = [](Vars v, std::vector<std::string> parts) {
    v["NEXAR_CLUSTER_TOKEN"] = "tok";  // a 1-char literal trips GCC 12 -O3 -Wrestrict
    resolve_error(v, parts);
  };
  bad({{"NEXAR_SEED_ADDR", "fd00::1:29400"}}, {"NEXAR_SEED_ADDR='fd00::1:29400'", "brackets"});
  bad({{"NEXAR_SEED_ADDR", "host:"}}, {"NEXAR_SEED_ADDR='host:'"});
  bad({{"NEXAR_SEED_ADDR", ":80"}}, {"NEXAR_SEED_ADDR=':80'"});
  bad({{"NEXAR_SEED_ADDR", "host:http"}}, {"NEXAR_SEED_ADDR='host:http'", "port"});
  bad({{"NEXAR_SEED_ADDR", "host:0"}}, {"NEXAR_SEED_ADDR='host:0'"});
  bad({{"NEXAR_SEED_ADDR", "host:65536"}}, {"NEXAR_SEED_ADDR='host:65536'"});
  bad({{"NEXAR_SEED_ADDR", "[::1"}}, {"NEXAR_SEED_ADDR='[::1'"});
  bad({{"NEXAR_SEED_ADDR", "[nothex]:1"}}, {"NEXAR_SEED_ADDR='[nothex]:1'", "IPv6"});
  bad({{"NEXAR_SEED_ADDR", "[::1]x"}}, {"NEXAR_SEED_ADDR='[::1]x'"});
  bad({{"NEXAR_SEED_ADDR", "a b:1"}}, {"NEXAR_SEED_ADDR='a b:1'"});
  bad({{"NEXAR_SEED_ADDR", "h:1"}, {"NEXAR_SEED_PORT", "2"}},
      {"NEXAR_SEED_ADDR='h:1'", "NEXAR_SEED_PORT=2"});
  bad({{"NEXAR_SEED_ADDR", "h"}, {"NEXAR_SEED_PORT", "x"}}, {"NEXAR_SEED_PORT='x'"});
  const Vars torch = {{"RANK", "0"}, {"WORLD_SIZE", "2"}};
  auto with = [&](Vars extra) {
    Vars v = torch;
    v.insert(extra.begin(), extra.end());
    return v;
  };
  bad(with({{"MASTER_ADDR", "head"}, {"MASTER_PORT", "99999"}}), {"MASTER_PORT='99999'"});
  bad(with({{"MASTER_ADDR", "head:29500"}}), {"MASTER_ADDR='head:29500'", "MASTER_PORT"});
  bad(with({{"MASTER_ADDR", "[::1]:5"}}), {"MASTER_ADDR='[::1]:5'", "MASTER_PORT"});
  bad(with({{"MASTER_ADDR", "bad host"}}), {"MASTER_ADDR='bad host'"});
}

TEST(LaunchEnv, Ipv6MasterAddr) {
  Vars v = {
      {"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "fd00::1"}, {"NEXAR_CLUSTER_TOKEN", "t"}};
  auto e = resolve(v);
  EXPECT_EQ(e.seed, "[fd00::1]:29500");
  EXPECT_EQ(e.seed_listen, "[::]:29500");
  v["MASTER_ADDR"] = "::1";
  v["MASTER_PORT"] = "4444";
  e = resolve(v);
  EXPECT_EQ(e.seed, "[::1]:4444");
  EXPECT_EQ(e.seed_listen, "[::]:4444");
  v["MASTER_ADDR"] = "[::1]";
  EXPECT_EQ(resolve(v).seed, "[::1]:4444");
  v["MASTER_ADDR"] = "127.0.0.1";
  e = resolve(v);
  EXPECT_EQ(e.seed, "127.0.0.1:4444");
  EXPECT_EQ(e.seed_listen, "0.0.0.0:4444");
}

TEST(LaunchEnv, SlurmFirstHost) {
  EXPECT_EQ(slurm_first_host("node[01-04,07],gpu5", "L"), "node01");
  EXPECT_EQ(slurm_first_host("a,b", "L"), "a");
  EXPECT_EQ(slurm_first_host("n[3]", "L"), "n3");
  EXPECT_EQ(slurm_first_host("single", "L"), "single");
  EXPECT_EQ(slurm_first_host("n[7,2-3]", "L"), "n7");
  EXPECT_EQ(slurm_first_host("gpu-[10-12]-x", "L"), "gpu-10-x");
  EXPECT_EQ(slurm_first_host("rack[1-2]-n[003-004]", "L"), "rack1-n003");
  EXPECT_EQ(slurm_first_host("host.example.org,x[1-2]", "L"), "host.example.org");
  for (const char* bad :
       {"", ",a", "n[", "n[1-2", "n]", "n[]", "n[a-b]", "n[1-x]", "n[[1]]", "a b", "[-1]"}) {
    SCOPED_TRACE(bad);
    const std::string msg = expect_error(
        Errc::invalid_argument, [&] { (void)slurm_first_host(bad, "SLURM_STEP_NODELIST"); });
    EXPECT_TRUE(contains(msg, "SLURM_STEP_NODELIST='" + std::string(bad) + "'")) << msg;
  }
  // Through resolve: the variable name appears.
  resolve_error({{"SLURM_PROCID", "0"},
                 {"SLURM_NTASKS", "2"},
                 {"SLURM_JOB_NODELIST", "n[1-"},
                 {"SLURM_JOB_ID", "1"}},
                {"SLURM_JOB_NODELIST='n[1-'"});
}

TEST(LaunchEnv, TokenFile) {
  const TempDir dir;
  const Vars base = {{"NEXAR_SEED_ADDR", "s:1"}};
  const auto with_file = [&](const std::string& path) {
    Vars v = base;
    v["NEXAR_CLUSTER_TOKEN_FILE"] = path;
    return v;
  };
  auto e = resolve(with_file(dir.write("tok", "  abc def \n\r\n\t ")));
  EXPECT_EQ(e.token, "  abc def");
  EXPECT_FALSE(e.token_derived);
  EXPECT_EQ(resolve(with_file(dir.write("tok2", "xyz"))).token, "xyz");

  const std::string empty = dir.write("empty", "");
  resolve_error(with_file(empty), {"NEXAR_CLUSTER_TOKEN_FILE", empty});
  const std::string blank = dir.write("blank", " \n\n");
  resolve_error(with_file(blank), {"NEXAR_CLUSTER_TOKEN_FILE", blank});
  const std::string missing = dir.path("missing");
  resolve_error(with_file(missing), {"NEXAR_CLUSTER_TOKEN_FILE", missing});
  const std::string directory = dir.path("");
  resolve_error(with_file(directory), {"NEXAR_CLUSTER_TOKEN_FILE", directory});
  const std::string big = dir.write("big", std::string((1 << 20) + 10, 'x'));
  resolve_error(with_file(big), {"NEXAR_CLUSTER_TOKEN_FILE", big});

  // Token and token file together are ambiguous.
  Vars v = with_file(dir.path("tok"));
  v["NEXAR_CLUSTER_TOKEN"] = "tok";  // a 1-char literal trips GCC 12 -O3 -Wrestrict
  resolve_error(v, {"NEXAR_CLUSTER_TOKEN", "NEXAR_CLUSTER_TOKEN_FILE"});
}

TEST(LaunchEnv, TokenPrecedenceAndDerivation) {
  Vars v = {
      {"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"TORCHELASTIC_RUN_ID", "r1"}};
  EXPECT_EQ(resolve(v).token, "derived:torchrun:r1");
  v["NEXAR_CLUSTER_TOKEN"] = "explicit";
  auto e = resolve(v);
  EXPECT_EQ(e.token, "explicit");
  EXPECT_FALSE(e.token_derived);

  // No job identity for this source: error.
  v = {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"SLURM_JOB_ID", "5"}};
  resolve_error(v, {"no cluster token", "NEXAR_CLUSTER_TOKEN", "NEXAR_CLUSTER_TOKEN_FILE"});
  resolve_error({{"NEXAR_RANK", "0"},
                 {"NEXAR_WORLD_SIZE", "1"},
                 {"NEXAR_SEED_ADDR", "s:1"},
                 {"TORCHELASTIC_RUN_ID", "r"}},
                {"NEXAR_CLUSTER_TOKEN"});
  resolve_error({{"NEXAR_SEED_ADDR", "s:1"}}, {"NEXAR_CLUSTER_TOKEN"});
  resolve_error(
      {{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "1"}, {"NEXAR_SEED_ADDR", "s:1"}},
      {"NEXAR_CLUSTER_TOKEN"});
  resolve_error({{"PMI_RANK", "0"}, {"PMI_SIZE", "1"}, {"NEXAR_SEED_ADDR", "s:1"}},
                {"NEXAR_CLUSTER_TOKEN"});
}

TEST(LaunchEnv, ElasticNeedsARealToken) {
  // Elastic with a token derived from a launcher's job id: refused, naming the reason and
  // the variables that fix it, for every launcher that derives one.
  const Vars derived[] = {
      {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"TORCHELASTIC_RUN_ID", "r1"}},
      {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}},  // torchrun's id: none set
      {{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"NEXAR_SEED_ADDR", "s:1"},
       {"PMIX_NAMESPACE", "ns"}},
      {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"NEXAR_SEED_ADDR", "s:1"}, {"SLURM_JOB_ID", "7"}},
  };
  for (Vars v : derived) {
    SCOPED_TRACE(v.begin()->first);
    if (!v.count("TORCHELASTIC_RUN_ID") && v.count("RANK")) {
      // Without a run id torchrun derives nothing: that is the "no cluster token" error,
      // elastic or not.
      v["NEXAR_ELASTIC"] = "1";
      resolve_error(v, {"no cluster token"});
      continue;
    }
    const LaunchEnv plain = resolve(v);
    EXPECT_TRUE(plain.token_derived);  // not elastic: a derived token is fine
    EXPECT_FALSE(plain.elastic);
    v["NEXAR_ELASTIC"] = "1";
    resolve_error(v, {"NEXAR_ELASTIC", "secret", "NEXAR_CLUSTER_TOKEN", "NEXAR_CLUSTER_TOKEN_FILE",
                      "derived from the " + plain.source + " job id", "refused"});
    // With an explicit token (either way of giving it) the same job may be elastic.
    v["NEXAR_CLUSTER_TOKEN"] = "a-real-secret";
    const LaunchEnv e = resolve(v);
    EXPECT_TRUE(e.elastic);
    EXPECT_FALSE(e.token_derived);
    EXPECT_EQ(e.token, "a-real-secret");
  }
  const TempDir dir;
  const std::string file = dir.write("token", "file-secret\n");
  const LaunchEnv f = resolve({{"RANK", "0"},
                               {"WORLD_SIZE", "2"},
                               {"MASTER_ADDR", "h"},
                               {"TORCHELASTIC_RUN_ID", "r1"},
                               {"NEXAR_CLUSTER_TOKEN_FILE", file},
                               {"NEXAR_ELASTIC", "true"}});
  EXPECT_TRUE(f.elastic);
  EXPECT_EQ(f.token, "file-secret");
}

TEST(LaunchEnv, ElasticValues) {
  const Vars base = {{"NEXAR_SEED_ADDR", "s:1"}, {"NEXAR_CLUSTER_TOKEN", "t"}};
  EXPECT_FALSE(resolve(base).elastic);  // default off
  for (const char* on : {"1", "true", "on"}) {
    Vars v = base;
    v["NEXAR_ELASTIC"] = on;
    EXPECT_TRUE(resolve(v).elastic) << on;
  }
  for (const char* off : {"0", "false", "off", ""}) {
    Vars v = base;
    v["NEXAR_ELASTIC"] = off;
    EXPECT_FALSE(resolve(v).elastic) << off;
  }
  for (const char* bad : {"2", "yes", "TRUE", "1 ", "elastic", "-1"}) {
    Vars v = base;
    v["NEXAR_ELASTIC"] = bad;
    resolve_error(v, {"NEXAR_ELASTIC", std::string("'") + bad + "'"});
  }
}

TEST(LaunchEnv, EmptyValuesAreUnset) {
  const auto e = resolve({{"RANK", ""},
                          {"NEXAR_RANK", ""},
                          {"NEXAR_SEED_ADDR", "s:1"},
                          {"NEXAR_CLUSTER_TOKEN", "t"},
                          {"NEXAR_SOCKET_IFNAME", ""},
                          {"NEXAR_JOIN_TIMEOUT_MS", ""}});
  EXPECT_EQ(e.source, "");
  EXPECT_EQ(e.rank, -1);
  EXPECT_TRUE(e.ifname.empty());
  EXPECT_EQ(e.join_timeout, std::chrono::minutes(3));
  EXPECT_FALSE(launched(map_env({{"RANK", ""}, {"NEXAR_SEED_ADDR", ""}})));
}

TEST(LaunchEnv, OtherSettings) {
  const TempDir dir;
  const std::string pem = "-----BEGIN CERTIFICATE-----\nMIIBdummy\n-----END CERTIFICATE-----\n";
  const std::string ca = dir.write("ca.pem", pem);
  const auto e =
      resolve({{"NEXAR_SEED_ADDR", "s:1"},
               {"NEXAR_CLUSTER_TOKEN", "t"},
               {"NEXAR_SEED_FINGERPRINT", "SHA256:" + std::string(32, 'A') + std::string(32, 'f')},
               {"NEXAR_SEED_CA", ca},
               {"NEXAR_BIND_ADDR", "10.0.0.5:0"},
               {"NEXAR_ADVERTISE_ADDR", "node5.example"},
               {"NEXAR_SOCKET_IFNAME", "^docker,lo"},
               {"NEXAR_JOIN_TIMEOUT_MS", "1500"},
               {"NEXAR_FORMATION_TIMEOUT_MS", "60000"},
               {"NEXAR_LOCAL_CPUS", "6"}});
  EXPECT_EQ(e.seed_fingerprint, "sha256:" + std::string(32, 'a') + std::string(32, 'f'));
  EXPECT_EQ(e.seed_ca_pem, pem);
  EXPECT_EQ(e.bind, "10.0.0.5:0");
  EXPECT_EQ(e.advertise, "node5.example");
  EXPECT_EQ(e.ifname, "^docker,lo");
  EXPECT_EQ(e.join_timeout, std::chrono::milliseconds(1500));
  EXPECT_EQ(e.formation_timeout, std::chrono::milliseconds(60000));
  EXPECT_EQ(e.local_cpus, 6);
  EXPECT_EQ(resolve({{"NEXAR_SEED_ADDR", "s:1"}, {"NEXAR_CLUSTER_TOKEN", "t"}}).local_cpus, 0);
}

TEST(LaunchEnv, OtherSettingErrors) {
  const TempDir dir;
  const auto bad = [](const std::string& var, const std::string& value,
                      std::vector<std::string> parts) {
    SCOPED_TRACE(var + "=" + value);
    parts.push_back(var);
    resolve_error({{"NEXAR_SEED_ADDR", "s:1"}, {"NEXAR_CLUSTER_TOKEN", "t"}, {var, value}}, parts);
  };
  for (const std::string& fp :
       {std::string("abc"), std::string(64, 'a'), "sha256:" + std::string(63, 'a'),
        "sha256:" + std::string(65, 'a'), "sha256:" + std::string(63, 'a') + "g",
        "sha1:" + std::string(64, 'a')}) {
    bad("NEXAR_SEED_FINGERPRINT", fp, {"'" + fp + "'"});
  }
  const std::string missing = dir.path("nope.pem");
  bad("NEXAR_SEED_CA", missing, {missing});
  const std::string not_pem = dir.write("x.pem", "hello");
  bad("NEXAR_SEED_CA", not_pem, {not_pem, "PEM"});
  const std::string empty = dir.write("e.pem", "");
  bad("NEXAR_SEED_CA", empty, {empty});
  bad("NEXAR_SOCKET_IFNAME", "eth,,lo", {"'eth,,lo'", "empty entry"});
  for (const char* t : {"0", "-5", "abc", "1.5", "15s", "99999999999999999999", "31536000001"}) {
    bad("NEXAR_JOIN_TIMEOUT_MS", t, {std::string("'") + t + "'"});
    bad("NEXAR_FORMATION_TIMEOUT_MS", t, {std::string("'") + t + "'"});
  }
  bad("NEXAR_LOCAL_CPUS", "0", {"at least 1"});
  bad("NEXAR_LOCAL_CPUS", "-2", {"at least 1"});
  bad("NEXAR_LOCAL_CPUS", "two", {"'two'"});
}

TEST(LaunchEnv, Launched) {
  EXPECT_FALSE(launched(map_env({})));
  EXPECT_FALSE(
      launched(map_env({{"NEXAR_WORLD_SIZE", "4"}, {"MASTER_ADDR", "h"}, {"WORLD_SIZE", "2"}})));
  for (const char* var : {"NEXAR_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK",
                          "SLURM_PROCID", "NEXAR_SEED_ADDR"}) {
    SCOPED_TRACE(var);
    EXPECT_TRUE(launched(map_env({{var, "0"}})));
  }
}

TEST(LaunchEnv, ProcessEnv) {
  const char* name = "NEXAR_CLUSTER_TEST_PROCESS_ENV";
  ::unsetenv(name);
  const EnvLookup env = process_env();
  EXPECT_FALSE(env(name));
  ::setenv(name, "", 1);
  EXPECT_FALSE(env(name));
  ::setenv(name, "v1", 1);
  EXPECT_EQ(env(name), std::optional<std::string>("v1"));
  ::unsetenv(name);
}

// The public token readers the tools use: the same rules as join_from_env.
TEST(LaunchEnv, TokenReaders) {
  const TempDir dir;
  EXPECT_EQ(nexar::read_token_file(dir.write("t", "s3cret \n\t\n")), "s3cret");
  const std::string empty = dir.write("empty", " \n");
  try {
    nexar::read_token_file(empty);
    ADD_FAILURE() << "an empty token file was accepted";
  } catch (const nexar::Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
    EXPECT_TRUE(contains(e.what(), empty)) << e.what();
    EXPECT_TRUE(contains(e.what(), "read_token_file")) << e.what();
  }
  EXPECT_THROW(nexar::read_token_file(dir.path("missing")), nexar::Error);
  {
    ScopedEnv t("NEXAR_CLUSTER_TOKEN", "from-env");
    EXPECT_EQ(nexar::token_from_env(), "from-env");
    ScopedEnv f("NEXAR_CLUSTER_TOKEN_FILE", dir.write("t2", "from-file\n"));
    EXPECT_THROW(nexar::token_from_env(), nexar::Error);  // both set
  }
  {
    ScopedEnv f("NEXAR_CLUSTER_TOKEN_FILE", dir.path("t2"));
    EXPECT_EQ(nexar::token_from_env(), "from-file");
  }
}

}  // namespace

// The table of NEXAR_* variables (core/env_vars.hpp), which keeps Config::from_env() from
// warning about them, lists exactly what resolve_launch_env() asks for.
TEST(LaunchEnv, EveryNexarVariableReadIsListed) {
  std::set<std::string> asked;
  const auto recording = [&asked](Vars vars) -> EnvLookup {
    return [&asked, vars = std::move(vars)](const char* name) -> std::optional<std::string> {
      asked.insert(name);
      const auto it = vars.find(name);
      if (it == vars.end()) return std::nullopt;
      return it->second;
    };
  };
  const std::vector<Vars> environments = {
      {{"NEXAR_RANK", "0"}, {"NEXAR_WORLD_SIZE", "2"}, {"NEXAR_SEED_ADDR", "h:1"},
       {"NEXAR_CLUSTER_TOKEN", "t"}},
      {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"NEXAR_CLUSTER_TOKEN", "t"},
       {"NEXAR_ELASTIC", "1"}},
      {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_NODELIST", "n1"},
       {"SLURM_JOB_ID", "7"}},
  };
  for (const Vars& vars : environments) {
    (void)launched(recording(vars));
    (void)resolve_launch_env(recording(vars));
  }
  std::set<std::string> nexar_asked;
  for (const auto& name : asked) {
    if (name.rfind("NEXAR_", 0) != 0) continue;
    nexar_asked.insert(name);
    const auto* v = nexar::detail::find_env_var(name);
    EXPECT_TRUE(v != nullptr && v->reader == nexar::detail::EnvReader::launcher)
        << name << " is read by resolve_launch_env() but not listed as a launcher variable "
        << "in src/core/env_vars.hpp";
  }
  for (const auto& v : nexar::detail::kEnvVars) {
    if (v.reader != nexar::detail::EnvReader::launcher) continue;
    EXPECT_TRUE(nexar_asked.count(std::string(v.name)) != 0)
        << v.name << " is listed as a launcher variable but resolve_launch_env() never reads it";
  }
}
