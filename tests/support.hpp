// Helpers shared by the multi-rank test files.
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <string>

#include <nexar/error.hpp>

namespace nexar::testing {

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

}  // namespace nexar::testing
