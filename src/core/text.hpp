// ASCII white space, as the launcher's parsers understand it (cluster/launch_env.cpp,
// cluster/ifname.cpp). Not std::isspace: that one depends on the C locale, and a variable
// must read the same everywhere.
#pragma once
#include <string_view>

namespace nexar::detail {

/// Space, tab, newline, carriage return, form feed or vertical tab.
constexpr bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

/// `s` without leading and trailing white space.
constexpr std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

}  // namespace nexar::detail
