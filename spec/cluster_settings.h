// The settings every process of a cluster must share, as the coordinator
// compares them when a shard or worker registers.
//
// Why: the coordinator refused a worker whose tables differed from the
// cluster's, but nothing else. A hostile probe started one worker with
// another training.batch_size (the two took overlapping slices of the
// batch and scaled their gradients differently), training.seed or
// task.image (two images fitted into one model): every run ended with exit
// 0. Another ps.consistency failed 14 steps in with a version error that
// never named the key. Each process now sends what it runs with, and the
// first to register defines it for the rest, who are refused naming every
// key that differs with both values.
//
// Two lists, because shards outlive jobs (systemd units that stay up serve
// job after job): `shared` holds what the shards act on too (the sync mode,
// worker count, consistency, optimizer placement, learning rate, codec,
// checkpoint cadence) and holds while any shard or worker is registered;
// `job` holds what only the workers of one job must agree on (the batch,
// its splitting, the steps, the seed, the image, precision) and is defined
// afresh by each job's first worker. Per-host keys are left out of both:
// threads, the device, ports, paths (checkpoint.dir, task.output,
// security.keys_dir), the log cadence and the timeouts. The image is
// compared by its pixels, not its path, which may differ between hosts.
//
// Thread safety: pure functions.
#pragma once

#include <string>
#include <vector>

#include "common/cluster_map.h"
#include "spec/run_spec.h"

namespace gridsync {

// The settings of `spec` shards and workers share.
std::vector<Setting> SharedSettings(const RunSpec& spec);

// The settings the workers of one job share; `image_digest`: the image's
// size and checksum (ImageTask::Digest).
std::vector<Setting> JobSettings(const RunSpec& spec, const std::string& image_digest);

}  // namespace gridsync
