// Helpers shared by the test files: error expectations, a test configuration, random
// bytes, running code on an engine's thread or on a thread per rank, and environment
// variables set for a scope.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <future>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <nexar/config.hpp>
#include <nexar/error.hpp>

namespace nexar::testing {

/// Whether this build runs under AddressSanitizer (GCC defines the macro; clang answers
/// __has_feature). Tests that repeat one thing thousands of times repeat it fewer times
/// there: the sanitizer checks each pass the same way, at several times the cost.
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif
#else
inline constexpr bool kSanitized = false;
#endif

/// Runs body(rank) for every rank of `comms` (communicators of one process), each on a
/// thread of its own, and returns when all have returned.
template <class Comms, class F>
void on_every_rank(Comms& comms, F body) {
  std::vector<std::thread> threads;
  for (int r = 0; r < static_cast<int>(comms.size()); ++r) threads.emplace_back([&, r] { body(r); });
  for (auto& t : threads) t.join();
}

inline bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

/// Expects `f` to throw nexar::Error with `code`; returns its what() for further checks.
template <class F>
std::string expect_error(Errc code, F&& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << "got " << nexar::to_string(e.code()) << ": " << e.what();
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected nexar::Error(" << nexar::to_string(code) << "), got " << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected nexar::Error(" << nexar::to_string(code) << "), nothing thrown";
  return {};
}

/// A configuration for multi-rank tests: defaults independent of the environment, with
/// deadlines long enough that a correct operation never hits them on a loaded 2-core
/// machine and short enough that a hang fails the test, not CI. Tests that provoke errors
/// on purpose pass LogLevel::off to keep quiet.
inline Config test_config(LogLevel log_level = LogLevel::error) {
  using namespace std::chrono_literals;
  Config c;
  c.op_timeout = 30s;
  c.connect_timeout = 15s;
  c.idle_timeout = 15s;
  c.rpc_timeout = 30s;
  c.log_level = log_level;
  return c;
}

/// `n` bytes from a generator seeded with `seed`: the same seed gives the same bytes.
inline std::vector<std::byte> random_bytes(std::size_t n, std::uint64_t seed) {
  std::vector<std::byte> v(n);
  std::mt19937_64 rng(seed);
  for (auto& b : v) b = static_cast<std::byte>(rng());
  return v;
}

/// Runs `fn` on the thread of `engine` (anything whose post(task) runs the task there, such
/// as nexar::detail::Engine) and returns its result once it has run.
template <class Engine, class F>
auto on_engine(Engine& engine, F fn) {
  using R = decltype(fn());
  std::promise<R> p;
  auto fut = p.get_future();
  engine.post([&] {
    if constexpr (std::is_void_v<R>) {
      fn();
      p.set_value();
    } else {
      p.set_value(fn());
    }
  });
  return fut.get();
}

/// An environment variable set for the scope of a test, restored afterwards.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace nexar::testing
