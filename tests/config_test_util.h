// What the config tests share (config_test.cc, config_keys_test.cc): the
// source name, a substring check, and parsing that must fail or succeed.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common/config.h"

namespace gridsync {
namespace {

constexpr const char* kSource = "test.json";

inline ::testing::AssertionResult Contains(const std::string& haystack, std::string_view needle) {
  if (haystack.find(needle) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "expected to find [" << needle << "] in:\n" << haystack;
}

inline size_t CountLines(const std::string& text) {
  size_t lines = text.empty() ? 0 : 1;
  for (char c : text) lines += c == '\n' ? 1 : 0;
  return lines;
}

// Parses text that must fail validation and returns the message.
inline std::string ErrorOf(std::string_view text, const std::vector<std::string>& overrides = {}) {
  Result<Config> result = Config::Parse(text, kSource, overrides);
  EXPECT_FALSE(result.ok()) << "expected a validation error for: " << text;
  if (result.ok()) return "";
  EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument);
  return result.status().message();
}

inline Config ParseOk(std::string_view text, const std::vector<std::string>& overrides = {}) {
  Result<Config> result = Config::Parse(text, kSource, overrides);
  EXPECT_TRUE(result.ok()) << result.status().ToString();
  return result.ok() ? std::move(result).value() : Config{};
}

// --- Seed configs ---------------------------------------------------------------------------

}  // namespace
}  // namespace gridsync
