// CURVE key files and configs for the tests of security.curve: each role's
// pair written as `gridsync keygen` writes it (common/wire/curve.h).
//
// Thread safety: free functions; each test uses folders of its own.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <initializer_list>
#include <string>

#include "common/config.h"
#include "common/wire/curve.h"

namespace gridsync::testing {

inline constexpr std::initializer_list<const char*> kAllRoles = {"coordinator", "shard", "worker",
                                                                 "observer"};

// Writes a fresh key pair for each of `roles` into `dir` (made if missing).
inline void WriteTestKeys(const std::string& dir,
                          std::initializer_list<const char*> roles = kAllRoles) {
  for (const char* role : roles) {
    auto pair = wire::GenerateCurveKeyPair();
    ASSERT_TRUE(pair.ok()) << pair.status().ToString();
    ASSERT_TRUE(wire::WriteCurveKeyPair(dir, role, *pair).ok()) << role;
  }
}

// A fresh folder of every role's keys under the temporary folder, named
// after `name` and this process.
inline std::string MakeKeys(const std::string& name = "keys") {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("gridsync-" + name + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  WriteTestKeys(dir.string());
  return dir.string();
}

// CURVE on, with the keys in dir, for a cluster with shards (under nccl the
// coordinator reads no shard.pub).
inline Config SecureConfig(const std::string& dir) {
  Config config;
  config.distributed.gradient_sync = GradientSyncMode::kPs;
  config.security.curve = true;
  config.security.keys_dir = dir;
  return config;
}

}  // namespace gridsync::testing
