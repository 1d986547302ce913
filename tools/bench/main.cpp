// nexar-bench: benchmarks of the nexar runtime, one subcommand per benchmark.
//
//   nexar-bench --help          lists the subcommands
//   nexar-bench p2p --help      options of one subcommand
#include <CLI/CLI.hpp>

#include <vector>

#include "subcommands.hpp"

int main(int argc, char** argv) {
  CLI::App app{"nexar-bench: benchmarks of the nexar communication runtime over QUIC"};
  app.require_subcommand(1);

  std::vector<nexar::bench::Subcommand> commands;
  commands.push_back(nexar::bench::add_p2p(app));

  CLI11_PARSE(app, argc, argv);
  for (auto& c : commands)
    if (c.app->parsed()) return c.run();
  return 2;
}
