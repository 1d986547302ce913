// spdlog is used in its compiled form (libspdlog, built against the external fmt), the
// way Debian's spdlog::spdlog CMake target exports it; define the same macros here so the
// manual g++ build, without those target definitions, sees the same configuration.
#ifndef SPDLOG_FMT_EXTERNAL
#define SPDLOG_FMT_EXTERNAL
#endif
#ifndef SPDLOG_COMPILED_LIB
#define SPDLOG_COMPILED_LIB
#endif

#include "core/log.hpp"

#include "core/env_vars.hpp"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cctype>
#include <cstdlib>
#include <memory>

namespace nexar::log {
namespace {

spdlog::logger& logger() {
  // Not registered in spdlog's global registry, so an application's own use of spdlog
  // (drop_all, a logger of the same name, a global level) cannot disturb it. Leaked on
  // purpose: logging from static destructors and late threads stays valid at exit.
  static spdlog::logger* const instance = [] {
    auto sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
    auto* l = new spdlog::logger("nexar", std::move(sink));
    l->set_pattern("[%H:%M:%S.%e] [nexar] [%l] [t%t] %v");
    // Filtering happens in enabled(); the logger passes everything it is given.
    l->set_level(spdlog::level::trace);
    l->flush_on(spdlog::level::warn);
    return l;
  }();
  return *instance;
}

spdlog::level::level_enum to_spdlog(LogLevel lvl) noexcept {
  switch (lvl) {
    case LogLevel::off: return spdlog::level::off;
    case LogLevel::error: return spdlog::level::err;
    case LogLevel::warn: return spdlog::level::warn;
    case LogLevel::info: return spdlog::level::info;
    case LogLevel::debug: return spdlog::level::debug;
    case LogLevel::trace: return spdlog::level::trace;
  }
  return spdlog::level::off;
}

bool iequals(std::string_view a, std::string_view b) noexcept {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) != b[i]) return false;
  }
  return true;
}

}  // namespace

void set_level(LogLevel lvl) {
  detail::current_level.store(static_cast<int>(lvl), std::memory_order_relaxed);
}

LogLevel level() {
  int cur = detail::current_level.load(std::memory_order_relaxed);
  if (cur < 0) cur = detail::init_level();
  return static_cast<LogLevel>(cur);
}

const char* to_string(LogLevel lvl) noexcept {
  switch (lvl) {
    case LogLevel::off: return "off";
    case LogLevel::error: return "error";
    case LogLevel::warn: return "warn";
    case LogLevel::info: return "info";
    case LogLevel::debug: return "debug";
    case LogLevel::trace: return "trace";
  }
  return "unknown";
}

std::optional<LogLevel> parse_level(std::string_view text) noexcept {
  static constexpr LogLevel all[] = {LogLevel::off,  LogLevel::error, LogLevel::warn,
                                     LogLevel::info, LogLevel::debug, LogLevel::trace};
  for (LogLevel l : all) {
    if (iequals(text, to_string(l))) return l;
  }
  if (text.size() == 1 && text[0] >= '0' && text[0] <= '5') {
    return static_cast<LogLevel>(text[0] - '0');
  }
  return std::nullopt;
}

namespace detail {

int init_level() noexcept {
  LogLevel lvl = LogLevel::warn;
  // A malformed NEXAR_DEBUG is reported by Config::from_env(); logging itself never throws.
  if (const char* env = std::getenv(nexar::detail::EnvName("NEXAR_DEBUG").c_str())) {
    if (auto parsed = parse_level(env)) lvl = *parsed;
  }
  int expected = -1;
  // If set_level() won the race, keep its value.
  if (current_level.compare_exchange_strong(expected, static_cast<int>(lvl),
                                            std::memory_order_relaxed)) {
    return static_cast<int>(lvl);
  }
  return expected;
}

void write(LogLevel lvl, std::string_view msg) noexcept {
  try {
    logger().log(to_spdlog(lvl), spdlog::string_view_t(msg.data(), msg.size()));
  } catch (...) {
    // A failing log sink (closed stderr, out of memory) must not turn into a failure of
    // the operation that was merely reporting something.
  }
}

}  // namespace detail
}  // namespace nexar::log
