// What a worker checks before it trains, beyond the config itself: that its
// model, optimizer state and largest micro-batch fit in this machine's
// memory (task.output's folder: CheckWritableFolder). One place for gridsync-worker,
// gridsync-bench train and `gridsync check-config`, so that the three refuse the same runs in the
// same words (a hostile probe found check-config saying OK to a grid of 1.4 TiB that the worker
// refused and the bench died on with std::bad_alloc).
//
// Thread safety: free functions.
#pragma once

#include <cstdint>
#include <string>

#include "common/config.h"
#include "common/status.h"
#include "spec/run_spec.h"
#include "worker/image_task.h"

namespace gridsync {

// Bytes of the worker's model and its optimizer state: master parameters,
// Adam's m and v, the gradient buffer and an fp16 copy. Independent of the
// batch.
uint64_t EstimateModelBytes(const RunSpec& spec);

// Bytes a worker holds for `spec` with micro-batches of `samples`, roughly
// (the model's bytes and per-sample scratch: positions, lookups, features,
// activations and their gradients).
uint64_t EstimateWorkerBytes(const RunSpec& spec, uint64_t samples);

// The most samples any worker of the run computes at once: its share of
// the batch in a distributed run (the whole batch under adaptive
// splitting, which may move it all to one worker; the whole batch in one
// process) over training.gradient_accumulation.
uint64_t LargestMicroBatch(const Config& config, bool distributed);

// OK when a worker of `spec` training on `image` fits in the memory this
// machine has available; `distributed` as for LargestMicroBatch,
// `writes_png` counts the reconstruction it writes at the end (rank 0 or a
// run in one process). Otherwise InvalidArgument naming what does not fit
// and what would: the model alone (the encoding's keys) or the batch.
Status CheckWorkerMemory(const RunSpec& spec, const ImageTask& image, bool distributed,
                         bool writes_png);

// OK when the processes one machine runs of a cluster fit its available
// memory together: `workers` workers (each as CheckWorkerMemory counts it,
// distributed; the reconstruction by one of them when `writes_png`) and
// `shards` shards (each as large as the run's largest: spec/shard_memory.h). CheckWorkerMemory
// holds one process against the machine; `gridsync launch` starts them all on it (a hostile probe:
// the large seed on loopback passed, 0.9 GiB a worker for 32 workers against 21 GiB).
// InvalidArgument naming the counts and what would fit.
Status CheckMachineMemory(const RunSpec& spec, const ImageTask& image, int workers, int shards,
                          bool writes_png);

// OK unless training.device is "cuda", or (in a cluster run, not
// `standalone`) distributed.collective is "nccl" under nccl or hybrid, and
// this machine has no usable CUDA device: then InvalidArgument naming the
// key, why, and what runs here ("auto" trains on the CPU where no GPU is).
// The worker found it only when training began, and exited 1 after
// check-config said OK.
Status CheckTrainingDevice(const Config& config, bool standalone = false);

}  // namespace gridsync
