// Formatting and statistics shared by the nexar-bench subcommands.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace nexar::bench {

// ---- statistics -------------------------------------------------------------------------

/// The q-quantile (0 <= q <= 1) of `samples` by the nearest-rank method; 0 when empty.
double quantile(std::vector<double> samples, double q);
inline double median(std::vector<double> samples) { return quantile(std::move(samples), 0.5); }

/// The median as nccl-tests and bench/peers/common.hpp take it: the middle sample, or the
/// mean of the two middle ones when the count is even; 0 when empty. (median() above is
/// the lower of the two middle ones; the collective reports use this one so that their
/// times mean the same as the peer benchmarks'.)
double median_midpoint(std::vector<double> samples);

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
  /// Adds a right-aligned column at least `width` characters wide; a non-empty `unit`
  /// ("(us)") is printed under the title on a second header line.
  Table& column(std::string title, int width, std::string unit = {});
  /// Prints the header line (and the unit line when some column has a unit).
  void header() const;
  /// Prints one row; `cells` has one entry per column.
  void row(const std::vector<std::string>& cells) const;

 private:
  struct Column {
    std::string title;
    int width;
    std::string unit;
  };
  std::string header_line(std::string Column::*text) const;
  std::vector<Column> cols_;
};

// ---- nccl-tests report of a collective sweep ----------------------------------------------

/// A time in microseconds in 7 characters as nccl-tests prints it: no decimals from 10 ms,
/// one from 100 us, two below.
std::string nccl_time(double us);

/// The out-of-place report of one collective sweep, character for character as nccl-tests
/// and the peer benchmarks (bench/peers/common.hpp) print it, so that bench/peers/compare.sh
/// reads every implementation's log the same way:
///
///   #
///   #                                                        out-of-place
///   #       size         count      type   redop    root     time   algbw   busbw  #wrong
///   #        (B)    (elements)                               (us)  (GB/s)  (GB/s)
///             8             2     float     sum      -1    31.52    0.00    0.00       0
///   # Out of bounds values : 0 OK
///   # Avg bus bandwidth    : 0.0123
///   #
class CollectiveReport {
 public:
  CollectiveReport();
  /// The four header lines.
  void header() const;
  /// One size. `root` is -1 for collectives without one; `wrong` is empty when unchecked
  /// (printed "N/A").
  void row(std::uint64_t bytes, std::uint64_t count, std::string_view type, std::string_view redop, int root,
           double time_us, double algbw_gbs, double busbw_gbs, std::optional<long> wrong) const;
  /// The closing lines; "Out of bounds values" only when results were checked.
  static void footer(long wrong, double avg_busbw_gbs, bool checked);

 private:
  Table table_;
};

}  // namespace nexar::bench
