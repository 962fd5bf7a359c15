// Runs the project's built binaries as an operator would, for the tests of
// their command-line contract (exit codes and what they print).
// Thread safety: each call runs its own process; safe from any thread.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace binary_runner {

struct ProcessResult {
  int exit_code;
  std::string output;  // stdout and stderr
};

// `binary` relative to the build folder (GRIDSYNC_BUILD_DIR, else "build").
inline ProcessResult Execute(const std::string& binary, const std::string& args) {
  const char* build = std::getenv("GRIDSYNC_BUILD_DIR");
  const std::string dir = build ? build : "build";
  const std::string cmd = dir + "/" + binary + " " + args + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) return {-1, "popen failed"};
  std::string out;
  std::array<char, 4096> buf;
  while (std::fgets(buf.data(), buf.size(), pipe)) out += buf.data();
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// The binary exits 2 (a config it refuses) and says `words`.
inline void ExpectRefused(const std::string& binary, const std::string& args,
                          const std::string& words) {
  const ProcessResult run = Execute(binary, args);
  EXPECT_EQ(run.exit_code, 2) << binary << " " << args << ": " << run.output;
  EXPECT_NE(run.output.find(words), std::string::npos)
      << binary << " " << args << ": " << run.output;
}

}  // namespace binary_runner
