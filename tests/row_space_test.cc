// RowSpace (worker/sync/row_space.h): TableOf by binary search and its
// ascending-walk Cursor name the table a plain scan over the tables names,
// for every row of a model with levels and MLP tables of several widths.
#include "worker/sync/row_space.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "spec/run_spec.h"
#include "tests/test_util.h"
#include "worker/model.h"

namespace gridsync {
namespace {

uint32_t ScanTableOf(const RowSpace& space, uint64_t global_row) {
  uint32_t t = 0;
  while (t + 1 < space.tables().size() && space.tables()[t + 1].first_row <= global_row) ++t;
  return t;
}

TEST(RowSpaceTest, TableOfAndItsCursorNameTheTableAScanNames) {
  Config config;
  testing::UseSmallModel(&config);
  auto spec = RunSpec::Resolve(config);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  auto model = HashGridModel::Create(spec->model);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const RowSpace space(**model);
  ASSERT_GT(space.tables().size(), 2u);
  RowSpace::Cursor ascending(space);
  // Past the last row too: both name the last table, as the scan does.
  for (uint64_t g = 0; g < space.rows() + 3; ++g) {
    const uint32_t expected = ScanTableOf(space, g);
    ASSERT_EQ(space.TableOf(g), expected) << "row " << g;
    ASSERT_EQ(ascending.TableOf(g), expected) << "row " << g;
  }
  // A cursor asked for a row below its last falls back to the search.
  RowSpace::Cursor jumping(space);
  const std::vector<uint64_t> rows = {
      space.rows() - 1, 0, space.tables()[1].first_row, space.tables()[1].first_row - 1,
      space.rows() / 2, 5};
  for (uint64_t g : rows) EXPECT_EQ(jumping.TableOf(g), ScanTableOf(space, g)) << "row " << g;
}

}  // namespace
}  // namespace gridsync
