// The Chrome trace of --timeline (ops/timeline.h): a file cut short by a
// failed write is reported, not closed as if whole.
#include "ops/timeline.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace gridsync {
namespace {

TEST(TimelineTest, WholeFileIsAJsonArrayOfItsEvents) {
  const std::string path =
      (std::filesystem::temp_directory_path() / "gridsync-timeline-test.json").string();
  auto writer = TimelineWriter::Open(path, "worker 0", 7);
  ASSERT_TRUE(writer.ok()) << writer.status().ToString();
  (*writer)->Span("compute", std::chrono::steady_clock::now(), 0.5);
  (*writer)->Counter("loss", std::chrono::steady_clock::now(), 0.25);
  ASSERT_TRUE((*writer)->Close().ok());
  EXPECT_TRUE((*writer)->Close().ok());  // once is enough
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  std::filesystem::remove(path);
  const auto events = nlohmann::json::parse(text.str());
  ASSERT_EQ(events.size(), 3u) << text.str();
  EXPECT_EQ(events[1]["name"], "compute");
  EXPECT_EQ(events[2]["args"]["loss"], 0.25);
}

// /dev/full takes the open and refuses every write (ENOSPC), as a full
// disk does: Close says so, naming the file. It returned nothing before,
// and the worker exited 0.
TEST(TimelineTest, FailedWritesAreReportedAtClose) {
  auto writer = TimelineWriter::Open("/dev/full", "worker 0", 0);
  ASSERT_TRUE(writer.ok()) << writer.status().ToString();
  for (int i = 0; i < 2000; ++i) (*writer)->Span("step", std::chrono::steady_clock::now(), 0.001);
  const Status closed = (*writer)->Close();
  ASSERT_FALSE(closed.ok());
  EXPECT_NE(closed.message().find("--timeline /dev/full"), std::string::npos) << closed.ToString();
  EXPECT_NE(closed.message().find(std::strerror(ENOSPC)), std::string::npos) << closed.ToString();
  // The observer that closes it at the end of training drops the status;
  // the worker's own call must still see it.
  EXPECT_EQ((*writer)->Close().message(), closed.message());
}

}  // namespace
}  // namespace gridsync
