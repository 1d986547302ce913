// nexar-bench: benchmarks of the nexar runtime, one subcommand per benchmark.
//
//   nexar-bench --help          lists the subcommands
//   nexar-bench p2p --help      options of one subcommand
//   nexar-bench all_reduce ...  collective sweeps in nccl-tests format (collective.cpp)
#include <CLI/CLI.hpp>

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "subcommands.hpp"
#include "table.hpp"

namespace nexar::bench {

void add_size_option(CLI::App* app, const char* flags, std::uint64_t* dst, const char* help) {
  app->add_option_function<std::string>(
         flags,
         [dst](const std::string& s) {
           try {
             *dst = parse_size(s);
           } catch (const std::invalid_argument& e) {
             throw CLI::ValidationError(e.what());
           }
         },
         help)
      ->type_name("SIZE");
}

}  // namespace nexar::bench

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
