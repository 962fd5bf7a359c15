// The one training loop, for every gradient_sync mode and standalone runs:
// sampling (through the sync's Prepare), the forward and backward pass in
// gradient_accumulation micro-batches, dynamic loss scaling under mixed
// precision, adaptive re-splitting of the global batch, progress lines, the
// liveness check of peers between steps, evaluation, the reconstruction PNG
// and --dump-params. What differs per mode sits behind GradientSync
// (gradient_sync.h).
//
// Thread safety: reentrant; one call per worker.
#pragma once

#include <memory>

#include "common/status.h"
#include "common/thread_pool.h"
#include "spec/run_spec.h"
#include "worker/image_task.h"
#include "worker/model.h"
#include "worker/sync/gradient_sync.h"
#include "worker/sync/train_report.h"

namespace gridsync {

Result<TrainReport> RunTrainLoop(const RunSpec& spec, const ImageTask& image,
                                 std::shared_ptr<HashGridModel> model, GradientSync& sync,
                                 SplitSchedule& split, ThreadPool& pool,
                                 const WorkerOptions& options);

// Fills report->psnr from the model's prediction at every pixel centre (with
// the levels active after `steps`) and, when write_png, writes it to
// task.output/reconstruction.png (report->png_path).
// PSNR of `model` at every pixel centre of `image`, predicted in pieces of
// bounded memory, bit for bit what one Predict over every centre gives; with
// `png`, the reconstruction's bytes too (H x W x 3).
double EvalPsnr(HashGridModel& model, const ImageTask& image, uint32_t active_levels,
                ThreadPool* pool, std::vector<uint8_t>* png);

Status EvaluateAndSave(HashGridModel& model, const ImageTask& image, const Config& config,
                       uint64_t steps, bool write_png, ThreadPool* pool, TrainReport* report);

}  // namespace gridsync
