// Every Config setting, declared once (src/core/config.cpp, kSettings): its field, its
// NEXAR_* variable, its kind, its range, one line of doc and its tier. Config::describe()
// prints from the table and Config::validate() takes the plain range checks from it;
// tests/settings_test.cpp checks it against kEnvVars and docs/CONFIG.md, so a setting added
// in one place and not the others fails a test.
//
// The fields and their defaults stay in include/nexar/config.hpp; the table reaches them
// through accessors.
#pragma once

#include <nexar/config.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace nexar::detail {

/// How a setting's variable is written and its value shown.
enum class SettingKind {
  duration_ms,  ///< milliseconds; describe() prints "N ms"
  spin_us,      ///< microseconds; describe() prints "N us"
  bytes,        ///< byte size (K/M/G suffixes); printed as "2 GiB", "1000 bytes"
  count,        ///< whole number
  boolean,      ///< 0/1/true/false/on/off; printed on / off
  enumeration,  ///< one of a few names (FailurePolicy, Congestion, LogLevel)
  text,         ///< free text (NEXAR_IMPAIR)
  topology,     ///< Topology::parse()
};

/// Who is expected to touch a setting (docs/CONFIG.md lists it in each settings table).
enum class SettingTier {
  user,    ///< what a job commonly sets: deadlines, failure policy, topology, logging
  tuning,  ///< performance knobs; the defaults are measured (docs/CONFIG.md)
  debug,   ///< for tests and benchmarks
};

/// "user", "tuning" or "debug".
constexpr std::string_view to_string(SettingTier t) noexcept {
  switch (t) {
    case SettingTier::user: return "user";
    case SettingTier::tuning: return "tuning";
    case SettingTier::debug: return "debug";
  }
  return "unknown";
}

struct Setting {
  std::string_view field;  ///< the member of Config (describe()'s name)
  const char* var;         ///< its NEXAR_* variable (listed in kEnvVars, reader config)
  SettingKind kind;
  SettingTier tier;
  /// Plain range checked by validate() when `value` is set: min .. max inclusive, in the
  /// unit of the kind (ms, us, bytes, count). Settings with a range that depends on other
  /// settings or on more than bounds keep their check written out in validate().
  std::int64_t min;
  std::int64_t max;
  /// Extra text after the allowed range in validate()'s message (e.g. " (365 days)").
  std::string_view range_note;
  std::string_view doc;  ///< one line
  /// The value as a number, for the range check; nullptr: no plain range.
  std::int64_t (*value)(const Config&);
  /// The value as describe() prints it after "field = ".
  std::string (*show)(const Config&);
  /// The plain value as docs/CONFIG.md's default column starts with it: "300000", "2 GiB",
  /// "0", "on", "full_mesh", "empty".
  std::string (*plain)(const Config&);
  /// Sets the field from the variable's text `text` (Config::from_env()); throws
  /// nexar::Error(Errc::invalid_argument) naming `var` and the text when it is malformed.
  void (*parse)(Config&, const char* var, std::string_view text);
};

/// Every setting, in the order describe() prints them.
std::span<const Setting> settings() noexcept;

}  // namespace nexar::detail
