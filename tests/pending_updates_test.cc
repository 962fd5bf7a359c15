// Worker Adam's pending updates (PsClient::GatherPendingUpdates): a push
// that takes its residuals from the last pull's gathered buffer sends the
// bits a push reading the residual table sends, with the table split over
// two shards, for pushed rows the pull did not ask for, and after the
// residuals were replaced between the pull and the push (the buffer is then
// stale, and a push that used it would differ); and a pulled row gets the
// residuals as they are when it lands, a push between included.
#include <cstring>
#include <random>

#include "tests/ps_test_util.h"

namespace gridsync {
namespace {

struct Rows {
  std::vector<std::vector<uint32_t>> pull, push;
  std::vector<std::vector<float>> values;
};

// Pulled rows: every third row (shifted by step); pushed rows: those and
// every eleventh row, so some pushed rows were never pulled.
Rows RowsOfStep(const HashGridLayout& layout, int step, std::mt19937* rng) {
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  Rows r;
  r.pull.resize(layout.n_levels());
  r.push.resize(layout.n_levels());
  r.values.resize(layout.n_levels());
  for (uint32_t l = 0; l < layout.n_levels(); ++l) {
    for (uint32_t row = 0; row < layout.level(l).rows; ++row) {
      const bool pulled = (row + static_cast<uint32_t>(step)) % 3 == 0;
      if (pulled) r.pull[l].push_back(row);
      if (pulled || row % 11 == 5) r.push[l].push_back(row);
    }
    for (size_t i = 0; i < r.push[l].size() * layout.features(); ++i)
      r.values[l].push_back(normal(*rng));
  }
  return r;
}

// The step's pulls into `model`'s grid, and its push.
std::vector<TablePullRef> PullsOf(const Rows& rows, HashGridModel& model) {
  const auto& layout = model.layout();
  std::vector<TablePullRef> pulls;
  for (uint32_t l = 0; l < layout.n_levels(); ++l) {
    pulls.push_back({l, false, rows.pull[l].data(), rows.pull[l].size(),
                     model.grid_params().data() + layout.level(l).row_offset * layout.features()});
  }
  return pulls;
}

std::vector<TableRowsRef> PushOf(const Rows& rows) {
  std::vector<TableRowsRef> push;
  for (uint32_t l = 0; l < rows.push.size(); ++l)
    push.push_back({l, false, rows.push[l].data(), rows.push[l].size(), rows.values[l].data()});
  return push;
}

// Onebit with Adam on the worker, two shards, every block compressed.
Config OnebitConfig() {
  Config config = SmallConfig(1, 2);
  config.compression.codec = "onebit";
  config.compression.min_bytes = 0;
  return config;
}

TEST(PendingUpdatesTest, PushesFromTheGatheredBufferSendTheResidualTablesBits) {
  OneWorker gathers = OneWorker::Join(OnebitConfig());
  OneWorker reads_table = OneWorker::Join(OnebitConfig());
  ASSERT_TRUE(gathers.session.ok()) << gathers.session.status().ToString();
  ASSERT_TRUE(reads_table.session.ok()) << reads_table.session.status().ToString();
  PsClient& a = *gathers.session->ps;
  PsClient& b = *reads_table.session->ps;
  ASSERT_TRUE(a.optimizer_on_worker() && a.adds_pending_updates());
  const auto& layout = (*gathers.model)->layout();
  std::mt19937 rng(11);
  std::string state_after_first;
  const int steps = 6;
  for (int step = 0; step < steps; ++step) {
    const Rows rows = RowsOfStep(layout, step, &rng);
    const auto pulls_a = PullsOf(rows, **gathers.model),
               pulls_b = PullsOf(rows, **reads_table.model);
    const auto push = PushOf(rows);
    const auto s = static_cast<uint64_t>(step);
    ASSERT_TRUE(a.SendPull(s, pulls_a).ok());
    a.GatherPendingUpdates();
    ASSERT_TRUE(a.ReceivePull().ok());
    ASSERT_TRUE(b.SendPull(s, pulls_b).ok());
    ASSERT_TRUE(b.ReceivePull().ok());
    if (step > 0) {
      // a's rows hold its pending updates, b's the shards' values.
      EXPECT_NE((*gathers.model)->grid_params(), (*reads_table.model)->grid_params()) << step;
    }
    if (step == 4) {
      // Both go back to their residuals (and Adam's state) after step 0:
      // a's gathered buffer no longer holds what its table does.
      ASSERT_TRUE(a.RestoreState(state_after_first, s).ok());
      ASSERT_TRUE(b.RestoreState(state_after_first, s).ok());
    }
    ASSERT_TRUE(a.Push(wire::Kind::kPush, s, push).ok());
    ASSERT_TRUE(b.Push(wire::Kind::kPush, s, push).ok());
    if (step == 0) {
      ASSERT_TRUE(a.AppendState(&state_after_first).ok());
    }
  }
  std::string state_a, state_b;
  ASSERT_TRUE(a.AppendState(&state_a).ok());
  ASSERT_TRUE(b.AppendState(&state_b).ok());
  EXPECT_GT(a.error_feedback().Entries(), 0u);
  EXPECT_TRUE(state_a == state_b) << "the residuals or Adam's state differ";
  ASSERT_TRUE(PullAllParams(a, **gathers.model, steps).ok());
  ASSERT_TRUE(PullAllParams(b, **reads_table.model, steps).ok());
  ExpectBitIdentical((*gathers.model)->grid_params(), (*reads_table.model)->grid_params());
  for (size_t i = 0; i < (*gathers.model)->mlp_weights().size(); ++i) {
    const auto& wa = (*gathers.model)->mlp_weights()[i];
    const auto& wb = (*reads_table.model)->mlp_weights()[i];
    EXPECT_EQ(std::memcmp(wa.data(), wb.data(), wa.size() * sizeof(float)), 0) << "MLP " << i;
  }
}

// A push between GatherPendingUpdates and ReceivePull stores residuals the
// gather did not see, first into a table that held none: the rows get the
// residuals as they are when they land, as a worker that adds them after
// the reply (the reference here, by hand) gets them.
TEST(PendingUpdatesTest, APushBetweenTheGatherAndTheReplyIsSeenAsTheRowsLand) {
  OneWorker gathers = OneWorker::Join(OnebitConfig());
  OneWorker by_hand = OneWorker::Join(OnebitConfig());
  ASSERT_TRUE(gathers.session.ok()) << gathers.session.status().ToString();
  ASSERT_TRUE(by_hand.session.ok()) << by_hand.session.status().ToString();
  PsClient& a = *gathers.session->ps;
  PsClient& b = *by_hand.session->ps;
  const auto& layout = (*gathers.model)->layout();
  const uint32_t F = layout.features();
  std::mt19937 rng(12);
  for (int step = 0; step < 3; ++step) {
    const Rows rows = RowsOfStep(layout, step, &rng);
    const auto pulls_a = PullsOf(rows, **gathers.model), pulls_b = PullsOf(rows, **by_hand.model);
    const auto push = PushOf(rows);
    const auto s = static_cast<uint64_t>(step);
    ASSERT_TRUE(a.SendPull(s, pulls_a).ok());
    a.GatherPendingUpdates();
    ASSERT_TRUE(a.Push(wire::Kind::kPush, s, push).ok());
    ASSERT_TRUE(a.ReceivePull().ok());
    ASSERT_TRUE(b.SendPull(s, pulls_b).ok());
    ASSERT_TRUE(b.Push(wire::Kind::kPush, s, push).ok());
    ASSERT_TRUE(b.ReceivePull().ok());
    // The pulled rows (the others keep an earlier step's view in a and the
    // shards' values in b).
    std::vector<float> got, expected;
    size_t with_residual = 0;
    for (uint32_t l = 0; l < layout.n_levels(); ++l) {
      for (uint32_t row : rows.pull[l]) {
        const size_t at = (layout.level(l).row_offset + row) * F;
        const float* residual = b.PendingUpdate(l, 0, row);
        with_residual += residual != nullptr;
        for (uint32_t f = 0; f < F; ++f) {
          got.push_back((*gathers.model)->grid_params()[at + f]);
          const float shards = (*by_hand.model)->grid_params()[at + f];
          expected.push_back(residual != nullptr ? shards + residual[f] : shards);
        }
      }
    }
    EXPECT_GT(with_residual, 0u) << step;
    ExpectBitIdentical(got, expected);
  }
  std::string state_a, state_b;
  ASSERT_TRUE(a.AppendState(&state_a).ok());
  ASSERT_TRUE(b.AppendState(&state_b).ok());
  EXPECT_TRUE(state_a == state_b) << "the residuals or Adam's state differ";
}

}  // namespace
}  // namespace gridsync
