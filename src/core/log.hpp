// Internal logging facade: one spdlog logger named "nexar" writing to stderr.
//
// The level starts from NEXAR_DEBUG (default warn) on first use and can be switched at
// run time with set_level() from any thread. Call sites cost one relaxed atomic load when
// the level is disabled: arguments are not formatted and spdlog is not touched.
// spdlog itself is only included by log.cpp, so other modules compile without it.
#pragma once

#include <nexar/config.hpp>

#include <fmt/format.h>

#include <atomic>
#include <optional>
#include <string_view>
#include <utility>

namespace nexar::log {

/// Switches the level at run time (thread-safe). LogLevel::off silences everything.
void set_level(LogLevel lvl);

/// The current level (read from NEXAR_DEBUG on first use).
LogLevel level();

/// "off", "error", "warn", "info", "debug", "trace".
const char* to_string(LogLevel lvl) noexcept;

/// Parses NEXAR_DEBUG syntax: off|error|warn|info|debug|trace (any case) or 0-5.
/// Returns nullopt on anything else.
std::optional<LogLevel> parse_level(std::string_view text) noexcept;

namespace detail {
/// Current level as an int; -1 until first initialised from NEXAR_DEBUG.
inline std::atomic<int> current_level{-1};
/// Reads NEXAR_DEBUG once and publishes the level unless set_level() got there first.
int init_level() noexcept;
/// Writes one already formatted line at `lvl` (no level check).
void write(LogLevel lvl, std::string_view msg) noexcept;
}  // namespace detail

/// Whether a message at `lvl` would be written.
inline bool enabled(LogLevel lvl) {
  int cur = detail::current_level.load(std::memory_order_relaxed);
  if (cur < 0) cur = detail::init_level();
  return lvl != LogLevel::off && static_cast<int>(lvl) <= cur;
}

namespace detail {
template <class... A>
void emit(LogLevel lvl, fmt::format_string<A...> f, A&&... args) {
  if (!enabled(lvl)) return;
  write(lvl, fmt::format(f, std::forward<A>(args)...));
}
}  // namespace detail

template <class... A>
void error(fmt::format_string<A...> f, A&&... args) {
  detail::emit<A...>(LogLevel::error, f, std::forward<A>(args)...);
}
template <class... A>
void warn(fmt::format_string<A...> f, A&&... args) {
  detail::emit<A...>(LogLevel::warn, f, std::forward<A>(args)...);
}
template <class... A>
void info(fmt::format_string<A...> f, A&&... args) {
  detail::emit<A...>(LogLevel::info, f, std::forward<A>(args)...);
}
template <class... A>
void debug(fmt::format_string<A...> f, A&&... args) {
  detail::emit<A...>(LogLevel::debug, f, std::forward<A>(args)...);
}
template <class... A>
void trace(fmt::format_string<A...> f, A&&... args) {
  detail::emit<A...>(LogLevel::trace, f, std::forward<A>(args)...);
}

}  // namespace nexar::log
