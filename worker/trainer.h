// Standalone training of the image task in one process: the loop that the
// worker binary, the demo, the tests and `gridsync-bench train` share.
//
// Thread safety: TrainImage is reentrant; it owns all its state.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/status.h"
#include "worker/image_task.h"

namespace gridsync {

class HashGridModel;
class ThreadPool;

struct TrainOptions {
  std::vector<uint64_t> eval_steps;  // also evaluate PSNR after these steps (not timed)
  bool write_png = true;             // task.output/reconstruction.png
  bool quiet = false;                // no progress log lines
};

struct TrainReport {
  uint64_t steps = 0;
  uint64_t samples = 0;
  double train_seconds = 0;  // the loop only: sampling, forward, backward, optimizer
  double samples_per_second = 0;
  double final_loss = 0;     // mean squared error of the last step
  double psnr = 0;           // over the full image after the last step
  std::map<uint64_t, double> psnr_at;  // step -> PSNR for TrainOptions::eval_steps
  uint64_t skipped_steps = 0;          // mixed precision overflow skips
  float final_loss_scale = 1.0f;
  uint64_t n_params = 0;
  double grid_rows_per_step = 0;  // mean touched grid rows per applied step
  std::string png_path;
  std::shared_ptr<HashGridModel> model;  // the trained model

  // Distributed runs only (per worker).
  uint32_t rank = 0;
  double bytes_pushed_per_step = 0;
  double bytes_pulled_per_step = 0;
  double comm_seconds = 0;       // blocked in push acks and pull replies
  uint64_t max_staleness = 0;    // steps between the parameters read and the step computed
  // ps/hybrid: one more push after the last step delivered what error
  // feedback still held (PsClient::FlushResiduals); the shards applied steps + 1.
  bool flushed_residuals = false;
  std::vector<uint64_t> split_counts;  // samples per worker in the last step (all-reduce modes)
};

Result<TrainReport> TrainImage(const Config& config, const ImageTask& image,
                               const TrainOptions& options = {});

// Fills report->psnr from the model's prediction at every pixel centre (with
// the levels active after report->steps) and, when write_png, writes it to
// task.output/reconstruction.png (report->png_path). Shared by every trainer.
Status EvaluateAndSave(HashGridModel& model, const ImageTask& image, const Config& config,
                       bool write_png, ThreadPool* pool, TrainReport* report);

}  // namespace gridsync
