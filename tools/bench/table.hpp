// Formatting and statistics shared by the nexar-bench subcommands.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace nexar::bench {

// ---- statistics -------------------------------------------------------------------------

/// The q-quantile (0 <= q <= 1) of `samples` by the nearest-rank method; 0 when empty.
double quantile(std::vector<double> samples, double q);
inline double median(std::vector<double> samples) { return quantile(std::move(samples), 0.5); }

// ---- byte sizes ---------------------------------------------------------------------------

/// Parses "1048576", "64K", "1M", "1G" (suffixes of any case, powers of 1024).
/// Throws std::invalid_argument naming the text on anything else, or on 0 or overflow.
std::uint64_t parse_size(std::string_view text);

/// "1 MiB", "512 KiB", "1.5 GiB", "100 B".
std::string human_size(std::uint64_t bytes);

// ---- tables ----------------------------------------------------------------------------

/// A fixed-width text table printed row by row on stdout (so long runs show progress).
/// The header line starts with '#', like nccl-tests, so the output stays easy to parse.
class Table {
 public:
  /// Adds a right-aligned column at least `width` characters wide.
  Table& column(std::string title, int width);
  /// Prints the header line.
  void header() const;
  /// Prints one row; `cells` has one entry per column.
  void row(const std::vector<std::string>& cells) const;

 private:
  struct Column {
    std::string title;
    int width;
  };
  std::vector<Column> cols_;
};

}  // namespace nexar::bench
