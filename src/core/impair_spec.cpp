#include "core/impair_spec.hpp"

#include <nexar/error.hpp>

#include <fmt/format.h>

#include <charconv>
#include <cmath>

namespace nexar::detail {
namespace {

[[noreturn]] void bad(std::string_view entry, std::string_view why) {
  throw Error(Errc::invalid_argument, fmt::format("impairment '{}': {}", entry, why));
}

double number(std::string_view entry, std::string_view v) {
  double d = 0;
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), d);
  if (ec != std::errc{} || end != v.data() + v.size() || !std::isfinite(d)) bad(entry, "not a number");
  return d;
}

double probability(std::string_view entry, std::string_view v) {
  const double p = number(entry, v);
  if (p < 0 || p >= 1) bad(entry, "a probability in [0, 1) is expected");
  return p;
}

std::uint64_t millis(std::string_view entry, std::string_view v) {
  const double ms = number(entry, v);
  if (ms < 0 || ms > 10'000) bad(entry, "milliseconds in [0, 10000] are expected");
  return static_cast<std::uint64_t>(std::llround(ms * 1e6));
}

}  // namespace

ImpairSpec ImpairSpec::parse(std::string_view text) {
  ImpairSpec s;
  while (!text.empty()) {
    const auto comma = text.find(',');
    const std::string_view entry = text.substr(0, comma);
    text = comma == std::string_view::npos ? std::string_view{} : text.substr(comma + 1);
    const auto eq = entry.find('=');
    if (eq == std::string_view::npos) bad(entry, "key=value expected");
    const std::string_view key = entry.substr(0, eq), value = entry.substr(eq + 1);
    if (key == "drop") {
      s.drop = probability(entry, value);
    } else if (key == "reorder") {
      s.reorder = probability(entry, value);
    } else if (key == "reorder_ms") {
      s.reorder_ns = millis(entry, value);
    } else if (key == "delay_ms") {
      s.delay_ns = millis(entry, value);
    } else if (key == "jitter_ms") {
      s.jitter_ns = millis(entry, value);
    } else if (key == "seed") {
      std::uint64_t seed = 0;
      auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), seed);
      if (ec != std::errc{} || end != value.data() + value.size()) bad(entry, "an unsigned integer is expected");
      s.seed = seed;
    } else {
      bad(entry, "unknown key (drop, reorder, reorder_ms, delay_ms, jitter_ms, seed)");
    }
  }
  return s;
}

std::string ImpairSpec::to_string() const {
  if (!active()) return {};
  return fmt::format("drop={},reorder={},reorder_ms={},delay_ms={},jitter_ms={},seed={}", drop, reorder,
                     static_cast<double>(reorder_ns) / 1e6, static_cast<double>(delay_ns) / 1e6,
                     static_cast<double>(jitter_ns) / 1e6, seed);
}

}  // namespace nexar::detail
