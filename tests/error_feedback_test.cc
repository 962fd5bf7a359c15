// Error feedback (kernels/cpu/error_feedback.h): onebit with error
// feedback delivers the true total, memory only for touched rows, the width
// fixed per table, and residuals kept exactly over many pages, checkpointed
// and restored as they were.
#include "kernels/cpu/error_feedback.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/codec.h"
#include "tests/codec_test_util.h"

namespace gridsync {
namespace {

using codec_testing::EncodeVec;
using codec_testing::Gaussian;
using codec_testing::Options;

TEST(ErrorFeedbackTest, OnebitCarriesTheResidual) {
  // 64 rows x 4 of fresh gradients each step, all rows touched. With error
  // feedback, sum(decoded) = sum(gradients) - final residual exactly (up to
  // float rounding), so the delivered total tracks the true total; without
  // it, onebit's error accumulates.
  const CodecOptions o = Options(Codec::kOnebit);
  const uint32_t width = 4;
  std::vector<uint32_t> rows(64);
  std::iota(rows.begin(), rows.end(), 100u);
  const size_t n = rows.size() * width;
  cpu::ErrorFeedback feedback;
  std::vector<double> sum_grad(n, 0), sum_ef(n, 0), sum_plain(n, 0);
  std::vector<float> decoded(n), plain(n);
  float worst_residual = 0.0f;
  for (int step = 0; step < 300; ++step) {
    const std::vector<float> grad = Gaussian(n, 7000 + step);
    std::vector<float> corrected = grad;
    feedback.AddResidual(3, rows.data(), rows.size(), width, corrected.data());
    std::vector<uint8_t> bytes = EncodeVec(o, corrected, step);
    ASSERT_TRUE(cpu::Decode(o, bytes.data(), bytes.size(), n, step, decoded.data()).ok());
    feedback.StoreResidual(3, rows.data(), rows.size(), width, corrected.data(), decoded.data());
    bytes = EncodeVec(o, grad, step);
    ASSERT_TRUE(cpu::Decode(o, bytes.data(), bytes.size(), n, step, plain.data()).ok());
    for (size_t i = 0; i < n; ++i) {
      sum_grad[i] += grad[i];
      sum_ef[i] += decoded[i];
      sum_plain[i] += plain[i];
    }
    for (uint32_t r : rows) {
      const float* residual = feedback.Residual(3, r);
      ASSERT_NE(residual, nullptr);
      for (uint32_t f = 0; f < width; ++f)
        worst_residual = std::max(worst_residual, std::fabs(residual[f]));
    }
  }
  double err_ef = 0, err_plain = 0, identity = 0;
  for (size_t i = 0; i < n; ++i) {
    const float residual = feedback.Residual(3, rows[i / width])[i % width];
    identity = std::max(identity, std::fabs(sum_ef[i] + residual - sum_grad[i]));
    err_ef = std::max(err_ef, std::fabs(sum_ef[i] - sum_grad[i]));
    err_plain = std::max(err_plain, std::fabs(sum_plain[i] - sum_grad[i]));
  }
  EXPECT_LT(identity, 1e-3);
  EXPECT_LT(worst_residual, 10.0f) << "the residual stays bounded";
  EXPECT_LT(err_ef, 10.0);
  EXPECT_GT(err_plain, 3 * err_ef) << "error feedback must beat plain onebit";
  EXPECT_EQ(feedback.Entries(), rows.size());
}

TEST(ErrorFeedbackTest, MemoryOnlyForTouchedRows) {
  const uint32_t width = 4;
  const CodecOptions o = Options(Codec::kOnebit);
  cpu::ErrorFeedback feedback;
  EXPECT_EQ(feedback.Entries(), 0u);
  EXPECT_EQ(feedback.ResidualBytes(), 0u);

  const std::vector<uint32_t> touched = {3, 10, 42};
  std::vector<float> grad = Gaussian(touched.size() * width, 1);
  std::vector<float> corrected = grad;
  // Nothing stored yet: adding changes nothing and creates nothing.
  feedback.AddResidual(7, touched.data(), touched.size(), width, corrected.data());
  EXPECT_EQ(corrected, grad);
  EXPECT_EQ(feedback.Entries(), 0u);

  std::vector<float> decoded(corrected.size());
  const std::vector<uint8_t> bytes = EncodeVec(o, corrected, 0);
  ASSERT_TRUE(cpu::Decode(o, bytes.data(), bytes.size(), decoded.size(), 0, decoded.data()).ok());
  feedback.StoreResidual(7, touched.data(), touched.size(), width, corrected.data(),
                         decoded.data());
  EXPECT_EQ(feedback.Entries(), 3u);
  EXPECT_EQ(feedback.Entries(7), 3u);
  EXPECT_EQ(feedback.Entries(8), 0u);
  for (uint32_t row = 0; row < 64; ++row) {
    const bool was_touched = std::find(touched.begin(), touched.end(), row) != touched.end();
    EXPECT_EQ(feedback.Residual(7, row) != nullptr, was_touched) << row;
  }
  EXPECT_EQ(feedback.Residual(8, 3), nullptr);
  for (size_t r = 0; r < touched.size(); ++r) {
    for (uint32_t f = 0; f < width; ++f) {
      EXPECT_EQ(feedback.Residual(7, touched[r])[f],
                corrected[r * width + f] - decoded[r * width + f]);
    }
  }
  EXPECT_GE(feedback.ResidualBytes(), 3u * width * sizeof(float));
  // The index: one page for rows 0..4095, not a slot per table row.
  EXPECT_LE(feedback.IndexBytes(), 4096u * sizeof(uint32_t) + 256u);
  EXPECT_EQ(feedback.Rows(7), touched);

  // Gathered for a pull's rows: every row's residual, -0.0f where a row has
  // none (so adding the buffer changes no bit there, a -0.0f included);
  // dense (rows from first_row) and listed rows alike.
  std::vector<float> gathered(64 * width, 1.0f);
  ASSERT_TRUE(feedback.GatherResiduals(7, nullptr, 0, 64, width, gathered.data()));
  const std::vector<uint32_t> listed = {0, 3, 10, 63};
  std::vector<float> gathered_listed(listed.size() * width, 1.0f);
  ASSERT_TRUE(
      feedback.GatherResiduals(7, listed.data(), 0, listed.size(), width, gathered_listed.data()));
  for (uint32_t row = 0; row < 64; ++row) {
    const float* residual = feedback.Residual(7, row);
    for (uint32_t f = 0; f < width; ++f) {
      const float got = gathered[row * width + f];
      if (residual != nullptr) {
        EXPECT_EQ(got, residual[f]) << row;
      } else {
        EXPECT_TRUE(got == 0.0f && std::signbit(got)) << row << ": " << got;
        EXPECT_TRUE(std::signbit(-0.0f + got)) << "adding it turned -0.0f into +0.0f";
      }
    }
  }
  for (size_t i = 0; i < listed.size(); ++i) {
    for (uint32_t f = 0; f < width; ++f)
      EXPECT_EQ(std::memcmp(&gathered_listed[i * width + f], &gathered[listed[i] * width + f], 4),
                0)
          << listed[i];
  }
  // A key with no entry writes nothing.
  EXPECT_FALSE(feedback.GatherResiduals(8, nullptr, 0, 64, width, gathered.data()));

  // A later step touching row 10 and a new row 99: row 10 gets its residual,
  // row 99 gets nothing, and no entry appears for it until it is stored.
  const std::vector<uint32_t> next = {10, 99};
  std::vector<float> values(next.size() * width, 1.0f);
  feedback.AddResidual(7, next.data(), next.size(), width, values.data());
  for (uint32_t f = 0; f < width; ++f) {
    EXPECT_EQ(values[f], 1.0f + feedback.Residual(7, 10)[f]);
    EXPECT_EQ(values[width + f], 1.0f);
  }
  EXPECT_EQ(feedback.Entries(), 3u);

  // A zero residual for a row without an entry stores nothing (lossless
  // codecs cost no memory); for a row with one it overwrites.
  const std::vector<float> same(next.size() * width, 2.0f);
  feedback.StoreResidual(7, next.data(), next.size(), width, same.data(), same.data());
  EXPECT_EQ(feedback.Entries(), 3u);
  EXPECT_EQ(feedback.Residual(7, 99), nullptr);
  for (uint32_t f = 0; f < width; ++f) EXPECT_EQ(feedback.Residual(7, 10)[f], 0.0f);

  // Tables are separate.
  feedback.StoreResidual(8, next.data(), 1, width, values.data(), same.data());
  EXPECT_EQ(feedback.Entries(8), 1u);
  EXPECT_EQ(feedback.Entries(), 4u);
  feedback.Clear();
  EXPECT_EQ(feedback.Entries(), 0u);
}

TEST(ErrorFeedbackDeathTest, WidthIsFixedPerTable) {
  cpu::ErrorFeedback feedback;
  const uint32_t row = 1;
  const std::vector<float> a(8, 1.0f), b(8, 0.0f);
  feedback.StoreResidual(0, &row, 1, 4, a.data(), b.data());
  EXPECT_DEATH(feedback.StoreResidual(0, &row, 1, 8, a.data(), b.data()), "t.width == width");
}

// Batches of random rows, some new, some seen, over many pages, against a
// map of what each row's residual must be; Rows() ascending; a restored
// copy, stored into alike, keeps equal to the original byte for byte.
TEST(ErrorFeedbackTest, ResidualsStayExactOverPagesAndThroughACheckpoint) {
  const uint32_t width = 2;
  cpu::ErrorFeedback feedback, restored;
  std::map<uint32_t, std::vector<float>> want;
  std::mt19937_64 rng(5);
  for (int step = 0; step < 60; ++step) {
    std::vector<uint32_t> rows;
    for (int i = 0; i < 500; ++i) rows.push_back(static_cast<uint32_t>(rng() % (1u << 16)));
    std::sort(rows.begin(), rows.end());
    rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
    const std::vector<float> corrected = Gaussian(rows.size() * width, 100 + step);
    const std::vector<float> decoded(rows.size() * width, 0.25f);
    feedback.StoreResidual(9, rows.data(), rows.size(), width, corrected.data(), decoded.data());
    for (size_t r = 0; r < rows.size(); ++r) {
      want[rows[r]] = {corrected[r * width] - 0.25f, corrected[r * width + 1] - 0.25f};
    }
    if (step == 20) {
      std::string state;
      feedback.AppendState(&state);
      std::string_view view(state);
      ASSERT_TRUE(restored.RestoreState(&view).ok());
      EXPECT_TRUE(view.empty());
    }
    if (step >= 20) {
      if (step > 20) {
        restored.StoreResidual(9, rows.data(), rows.size(), width, corrected.data(),
                               decoded.data());
      }
      std::string a, b;
      feedback.AppendState(&a);
      restored.AppendState(&b);
      ASSERT_EQ(a, b) << "step " << step;
    }
  }
  ASSERT_EQ(feedback.Entries(9), want.size());
  std::vector<uint32_t> rows;
  for (const auto& [row, values] : want) {
    rows.push_back(row);
    const float* residual = feedback.Residual(9, row);
    ASSERT_NE(residual, nullptr) << row;
    EXPECT_EQ(residual[0], values[0]) << row;
    EXPECT_EQ(residual[1], values[1]) << row;
  }
  EXPECT_EQ(feedback.Rows(9), rows);
  // AddResidual reads them where they now lie.
  std::vector<float> values(rows.size() * width, 1.0f);
  feedback.AddResidual(9, rows.data(), rows.size(), width, values.data());
  for (size_t r = 0; r < rows.size(); ++r) EXPECT_EQ(values[r * width], 1.0f + want[rows[r]][0]);
}

// A state of a few bytes that lists rows one per page, in a wide table,
// would make gigabytes of pages: refused, naming the bound.
TEST(ErrorFeedbackTest, AStateThatWouldMakeFarMoreMemoryThanItsSizeIsRefused) {
  const uint32_t width = 64;
  std::string state;
  auto append = [&](auto v) { state.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  append(uint64_t{1});         // keys
  append(uint64_t{7});         // key
  append(width);               // width
  const uint32_t rows = 2000;  // 2000 pages of 1 MiB from a 0.5 MiB state
  append(uint64_t{rows});
  for (uint32_t r = 0; r < rows; ++r) append(r * 4096u * 2u);
  for (uint32_t i = 0; i < rows * width; ++i) append(1.0f);
  cpu::ErrorFeedback feedback;
  std::string_view in(state);
  const Status status = feedback.RestoreState(&in);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("allowed"), std::string::npos) << status.ToString();
  EXPECT_EQ(feedback.Entries(), 0u);
}

// The bound holds over every table together, and counts the page index:
// 300 keys of one row each at row 2^32 - 1 (about 8 KB of state) made 16 MiB
// of index and a 16 KiB page per key, 4.8 GiB in all, when each table was
// checked on its own.
TEST(ErrorFeedbackTest, TheMemoryBoundHoldsOverAllTablesAndCountsTheIndex) {
  std::string state;
  auto append = [&](auto v) { state.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  const uint64_t keys = 300;
  append(keys);
  for (uint64_t k = 0; k < keys; ++k) {
    append(k << 32);      // key
    append(uint32_t{1});  // width
    append(uint64_t{1});  // rows
    append(UINT32_MAX);   // the row
    append(0.5f);         // its residual
  }
  cpu::ErrorFeedback feedback;
  std::string_view in(state);
  const Status status = feedback.RestoreState(&in);
  ASSERT_EQ(status.code(), StatusCode::kCorruption) << status.ToString();
  EXPECT_NE(status.message().find("over all its tables"), std::string::npos) << status.ToString();
  EXPECT_EQ(feedback.Entries(), 0u);
  EXPECT_EQ(feedback.IndexBytes() + feedback.ResidualBytes(), 0u);

  // The caller's admission runs before a table is allocated, and its error
  // is the state's.
  std::string_view again(state);
  std::vector<uint64_t> asked;
  const Status refused =
      feedback.RestoreState(&again, [&](uint64_t key, uint32_t width, uint32_t max_row) {
        asked.push_back(key);
        EXPECT_EQ(width, 1u);
        EXPECT_EQ(max_row, UINT32_MAX);
        return Status::InvalidArgument("row " + std::to_string(max_row) + " beyond the table");
      });
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument) << refused.ToString();
  EXPECT_EQ(asked, std::vector<uint64_t>{0});
  EXPECT_EQ(feedback.IndexBytes() + feedback.ResidualBytes(), 0u);
}

}  // namespace
}  // namespace gridsync
