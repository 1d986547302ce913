// The subcommands of nexar-bench. Each lives in its own .cpp and registers itself on the
// top-level CLI11 app; main() runs the one that was parsed.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <vector>

namespace nexar::bench {

struct Subcommand {
  CLI::App* app = nullptr;    ///< the CLI11 subcommand (owned by the parent app)
  std::function<int()> run;   ///< runs the benchmark after parsing; returns the exit code
};

/// Adds an option taking a byte size with K/M/G suffixes (parse_size) written to `*dst`.
void add_size_option(CLI::App* app, const char* flags, std::uint64_t* dst, const char* help);

/// `nexar-bench p2p`: latency and bandwidth between two processes, nexar vs TCP.
Subcommand add_p2p(CLI::App& parent);

/// `nexar-bench all_reduce`, `broadcast`, `reduce`, `all_gather`, `reduce_scatter`,
/// `all_to_all`, `gather`, `scatter`, `scan`, `barrier`: nccl-tests-style sweeps of the
/// collectives, ranks as threads of one process (collective.cpp).
std::vector<Subcommand> add_collectives(CLI::App& parent);

}  // namespace nexar::bench
