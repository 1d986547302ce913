#include "table.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>
#include <stdexcept>

namespace nexar::bench {

double quantile(std::vector<double> samples, double q) {
  if (samples.empty()) return 0.0;
  q = std::clamp(q, 0.0, 1.0);
  // Nearest rank: the smallest sample with at least q * n samples at or below it.
  auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(samples.size())));
  std::size_t idx = rank == 0 ? 0 : rank - 1;
  std::nth_element(samples.begin(), samples.begin() + static_cast<std::ptrdiff_t>(idx), samples.end());
  return samples[idx];
}

double median_midpoint(std::vector<double> samples) {
  if (samples.empty()) return 0.0;
  std::sort(samples.begin(), samples.end());
  const std::size_t n = samples.size();
  return n % 2 ? samples[n / 2] : 0.5 * (samples[n / 2 - 1] + samples[n / 2]);
}

std::uint64_t parse_size(std::string_view text) {
  auto bad = [&](const char* why) {
    return std::invalid_argument(fmt::format("'{}' is not a byte size ({}; examples: 65536, 64K, 1M, 1G)", text, why));
  };
  if (text.empty()) throw bad("empty");
  std::uint64_t mult = 1;
  std::string_view digits = text;
  switch (std::tolower(static_cast<unsigned char>(text.back()))) {
    case 'k': mult = 1ull << 10; digits.remove_suffix(1); break;
    case 'm': mult = 1ull << 20; digits.remove_suffix(1); break;
    case 'g': mult = 1ull << 30; digits.remove_suffix(1); break;
    default: break;
  }
  if (digits.empty()) throw bad("no digits");
  std::uint64_t v = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') throw bad("not a decimal integer");
    if (v > (std::numeric_limits<std::uint64_t>::max() - 9) / 10) throw bad("too large");
    v = v * 10 + static_cast<std::uint64_t>(c - '0');
  }
  if (v == 0) throw bad("must be > 0");
  if (v > std::numeric_limits<std::uint64_t>::max() / mult) throw bad("too large");
  return v * mult;
}

std::string human_size(std::uint64_t bytes) {
  static constexpr const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) v /= 1024.0, ++u;
  if (u == 0) return fmt::format("{} B", bytes);
  if (v == std::floor(v)) return fmt::format("{:.0f} {}", v, units[u]);
  return fmt::format("{:.1f} {}", v, units[u]);
}

Table& Table::column(std::string title, int width, std::string unit) {
  width = std::max({width, static_cast<int>(title.size()), static_cast<int>(unit.size())});
  cols_.push_back({std::move(title), width, std::move(unit)});
  return *this;
}

std::string Table::header_line(std::string Column::*text) const {
  std::string line = "#";
  for (std::size_t i = 0; i < cols_.size(); ++i) {
    // The '#' takes the place of one leading space of the first column.
    int w = cols_[i].width + (i == 0 ? 0 : 2);
    line += fmt::format("{:>{}}", cols_[i].*text, w);
  }
  while (line.size() > 1 && line.back() == ' ') line.pop_back();
  return line;
}

void Table::header() const {
  std::puts(header_line(&Column::title).c_str());
  if (std::any_of(cols_.begin(), cols_.end(), [](const Column& c) { return !c.unit.empty(); }))
    std::puts(header_line(&Column::unit).c_str());
  std::fflush(stdout);
}

void Table::row(const std::vector<std::string>& cells) const {
  std::string line;
  for (std::size_t i = 0; i < cols_.size(); ++i) {
    int w = cols_[i].width + (i == 0 ? 1 : 2);
    line += fmt::format("{:>{}}", i < cells.size() ? cells[i] : std::string(), w);
  }
  std::puts(line.c_str());
  std::fflush(stdout);
}

std::string nccl_time(double us) {
  if (us >= 10000.0) return fmt::format("{:7.0f}", us);
  if (us >= 100.0) return fmt::format("{:7.1f}", us);
  return fmt::format("{:7.2f}", us);
}

CollectiveReport::CollectiveReport() {
  table_.column("size", 11, "(B)")
      .column("count", 12, "(elements)")
      .column("type", 8)
      .column("redop", 6)
      .column("root", 6)
      .column("time", 7, "(us)")
      .column("algbw", 6, "(GB/s)")
      .column("busbw", 6, "(GB/s)")
      .column("#wrong", 6);
}

void CollectiveReport::header() const {
  std::puts("#");
  std::puts("#                                                        out-of-place");
  table_.header();
}

void CollectiveReport::row(std::uint64_t bytes, std::uint64_t count, std::string_view type, std::string_view redop,
                           int root, double time_us, double algbw_gbs, double busbw_gbs,
                           std::optional<long> wrong) const {
  table_.row({std::to_string(bytes), std::to_string(count), std::string(type), std::string(redop),
              std::to_string(root), nccl_time(time_us), fmt::format("{:.2f}", algbw_gbs),
              fmt::format("{:.2f}", busbw_gbs), wrong ? std::to_string(*wrong) : std::string("N/A")});
}

void CollectiveReport::footer(long wrong, double avg_busbw_gbs, bool checked) {
  if (checked) std::printf("# Out of bounds values : %ld %s\n", wrong, wrong ? "FAILED" : "OK");
  std::printf("# Avg bus bandwidth    : %g\n", avg_busbw_gbs);
  std::printf("#\n");
  std::fflush(stdout);
}

}  // namespace nexar::bench
