// nexar-bench: benchmarks of the nexar runtime, one subcommand per benchmark.
//
//   nexar-bench --help          lists the subcommands
//   nexar-bench p2p --help      options of one subcommand
//   nexar-bench all_reduce ...  collective sweeps in nccl-tests format (collective.cpp)
#include <CLI/CLI.hpp>

#include <utility>
#include <vector>

#include "subcommands.hpp"

int main(int argc, char** argv) {
  CLI::App app{"nexar-bench: benchmarks of the nexar communication runtime over QUIC"};
  app.require_subcommand(1);

  std::vector<nexar::bench::Subcommand> commands;
  commands.push_back(nexar::bench::add_p2p(app));
  for (auto& c : nexar::bench::add_collectives(app)) commands.push_back(std::move(c));

  CLI11_PARSE(app, argc, argv);
  for (auto& c : commands)
    if (c.app->parsed()) return c.run();
  return 2;
}
