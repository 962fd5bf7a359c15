// The launcher's reading of a worker's "@progress {json}" lines
// (ops/progress_line.h): any line, of any types, is taken or refused, never
// thrown on (json::value threw on the null loss ToJson writes for NaN, and
// the launcher ended in terminate: a hostile probe), and the line drawn
// from it stays sane for figures at their limits.
#include "ops/progress_line.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

namespace gridsync {
namespace {

TEST(ProgressLineTest, WhatToJsonWritesIsReadBackNaNIncluded) {
  ProgressState state;
  state.step = 230;
  state.steps = 500;
  state.samples_per_second = 131000;
  state.loss = NAN;  // written as null
  state.elapsed_seconds = 12;
  ProgressState read;
  ASSERT_TRUE(ProgressState::FromJson(state.ToJson(), &read)) << state.ToJson();
  EXPECT_EQ(read.step, 230u);
  EXPECT_EQ(read.steps, 500u);
  EXPECT_TRUE(std::isnan(read.loss));
  EXPECT_TRUE(std::isnan(read.psnr));
  EXPECT_NE(FormatProgress(read, 100).find("230/500"), std::string::npos);
}

TEST(ProgressLineTest, FieldsOfAnotherTypeRefuseTheLine) {
  for (const std::string line :
       {R"({"step":"abc"})", R"({"step":true})", R"({"step":-5})", R"({"step":1.5})",
        R"({"steps":1e300})", R"({"loss":"x"})", R"({"elapsed_seconds":[1]})", R"({"psnr":{}})",
        R"([1,2])", "not json", ""}) {
    ProgressState read;
    read.step = 7;
    EXPECT_FALSE(ProgressState::FromJson(line, &read)) << line;
    EXPECT_EQ(read.step, 7u) << line << ": a refused line changes nothing";
  }
}

TEST(ProgressLineTest, FiguresAtTheirLimitsDrawASaneLine) {
  ProgressState state;
  state.step = 1;
  state.steps = UINT64_MAX;
  state.elapsed_seconds = 1e10;
  const std::string line = FormatProgress(state, 120);
  EXPECT_NE(line.find("ETA ?"), std::string::npos) << line;
  EXPECT_EQ(line.find("-9223372036854775808"), std::string::npos) << line;
  state.elapsed_seconds = INFINITY;
  EXPECT_NE(FormatProgress(state, 120).find("ETA ?"), std::string::npos);
}

}  // namespace
}  // namespace gridsync
