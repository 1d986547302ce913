// The warning for NEXAR_* variables nexar does not read (env_vars.hpp).
#include "core/env_vars.hpp"

#include <unistd.h>  // environ

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "core/log.hpp"

namespace nexar::detail {
namespace {

constexpr std::string_view kPrefix = "NEXAR_";

std::string_view without_prefix(std::string_view name) {
  if (name.substr(0, kPrefix.size()) == kPrefix) name.remove_prefix(kPrefix.size());
  return name;
}

// Optimal string alignment distance: Levenshtein plus the transposition of two adjacent
// characters as one edit ("TIEMOUT").
std::size_t edit_distance(std::string_view a, std::string_view b) {
  const std::size_t n = a.size();
  const std::size_t m = b.size();
  std::vector<std::size_t> prev2(m + 1), prev(m + 1), cur(m + 1);
  for (std::size_t j = 0; j <= m; ++j) prev[j] = j;
  for (std::size_t i = 1; i <= n; ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= m; ++j) {
      const std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        cur[j] = std::min(cur[j], prev2[j - 2] + 1);
      }
    }
    prev2.swap(prev);
    prev.swap(cur);
  }
  return prev[m];
}

// `longer` is `shorter` followed by '_' and more ("EAGER_LIMIT_BYTES", "EAGER_LIMIT").
bool extends(std::string_view longer, std::string_view shorter) {
  return !shorter.empty() && longer.size() > shorter.size() + 1 &&
         longer.substr(0, shorter.size()) == shorter && longer[shorter.size()] == '_';
}

}  // namespace

void env_name_missing_from_kEnvVars() {}

std::string_view closest_env_var(std::string_view name) {
  // Compared in upper case, so that "NEXAR_relay_hops" finds its variable too.
  std::string upper(without_prefix(name));
  for (char& c : upper) {
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  }
  const std::string_view typed = upper;
  std::string_view best;
  std::size_t best_distance = 0;
  for (const EnvVar& v : kEnvVars) {
    const std::string_view known = without_prefix(v.name);
    const std::size_t d = edit_distance(typed, known);
    // A likely typo: at most a third of the longer name differs, or one is the other
    // with a word more ("EAGER_LIMIT" for "EAGER_LIMIT_BYTES").
    if (d * 3 > std::max(typed.size(), known.size()) && !extends(known, typed) &&
        !extends(typed, known)) {
      continue;
    }
    if (best.empty() || d < best_distance) {
      best = v.name;
      best_distance = d;
    }
  }
  return best;
}

std::string unknown_env_message(std::string_view name) {
  const std::string_view closest = closest_env_var(name);
  if (closest.empty()) {
    return fmt::format("{} is not a nexar setting (docs/CONFIG.md lists them)", name);
  }
  return fmt::format("{} is not a nexar setting (did you mean {}?)", name, closest);
}

std::vector<std::string> unknown_env_vars(const char* const* environment) {
  std::vector<std::string> out;
  if (environment == nullptr) return out;
  for (const char* const* e = environment; *e != nullptr; ++e) {
    const std::string_view entry(*e);
    if (entry.substr(0, kPrefix.size()) != kPrefix) continue;
    const std::string_view name = entry.substr(0, entry.find('='));
    if (find_env_var(name) == nullptr) out.emplace_back(name);
  }
  return out;
}

void warn_unknown_env() {
  static std::mutex mutex;
  static std::set<std::string, std::less<>> reported;
  std::vector<std::string> fresh;
  {
    const std::lock_guard<std::mutex> lock(mutex);
    for (std::string& name : unknown_env_vars(environ)) {
      if (reported.insert(name).second) fresh.push_back(std::move(name));
    }
  }
  for (const std::string& name : fresh) log::warn("{}", unknown_env_message(name));
}

}  // namespace nexar::detail
