#!/usr/bin/env bash
# Runs gridsync's GPU checks on a machine with a CUDA device, from what
# scripts/device_pack.sh put in .device/: every GPU test (they skip with a
# reason only where no device is present, so here each must pass), the CUDA
# tests again under compute-sanitizer's memcheck, gridsync-bench train on the
# device and on the CPU of that machine side by side (at three batch sizes),
# the codecs on the device, real multi-process clusters on the GPU (`gridsync
# launch`: ps, hybrid and the seed configs), and, with DEVICE_PROFILE=1, Nsight
# Compute's time per kernel. Logs go to $OUT (the device tool's folder, as one
# archive and summary.txt) or out/device/.
#
# Knobs (environment): DEVICE_STEP_TIMEOUT (s per check, 180), DEVICE_BUDGET
# (s, checks past it are skipped), DEVICE_SANITIZE, DEVICE_COMPRESS,
# DEVICE_CLUSTERS (0 skips), DEVICE_CLUSTER_SET, DEVICE_BATCHES,
# DEVICE_PROFILE, BENCH_THREADS. The first H200 run (note 53) took 70 s for
# the tests and benches and 190 s with the clusters and the profile.
#
# NCCL and cuBLAS come from the machine: CUDA's lib folders, or the
# nvidia-nccl / nvidia-cublas Python wheels of its python3.
set -uo pipefail
cd "$(dirname "$0")/.."
# The device tool brings back at most 8 files from $OUT: the logs are
# written to a scratch folder and travel as one archive beside summary.txt.
if [[ -n ${OUT:-} ]]; then
  logs=$(mktemp -d)
  trap 'tar -C "$logs" -czf "$OUT/device-logs.tar.gz" .; rm -rf "$logs"' EXIT
  summary=$OUT/summary.txt
else
  logs=out/device
  summary=$logs/summary.txt
fi
mkdir -p "$logs"
# device_pack.sh's archive, unpacked afresh on every run (about a second):
# binaries left from an older pack, or a half-finished unpack, never run.
if [[ -f .device/pack.tar.xz ]]; then
  rm -rf .device/bin .device/lib .device/.unpack
  mkdir -p .device/.unpack
  if ! tar -C .device/.unpack -xJf .device/pack.tar.xz ||
     ! mv .device/.unpack/bin .device/.unpack/lib .device/; then
    rm -rf .device/bin .device/lib .device/.unpack
    echo "device_run: cannot unpack .device/pack.tar.xz" >&2
    exit 1
  fi
  rm -rf .device/.unpack
fi
libs=$PWD/.device/lib
for dir in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/nvidia/lib64; do
  [[ -d $dir ]] && libs=$libs:$dir
done
if command -v python3 >/dev/null; then
  wheels=$(python3 - <<'PY' 2>/dev/null
import importlib, os
for name in ("nvidia.nccl", "nvidia.cublas", "nvidia.cuda_runtime", "nvidia.cu13"):
    try:
        module = importlib.import_module(name)
    except Exception:
        continue
    for path in getattr(module, "__path__", []):
        lib = os.path.join(path, "lib")
        if os.path.isdir(lib):
            print(lib)
PY
)
  for dir in $wheels; do libs=$libs:$dir; done
fi
export LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# The bench's image: matplotlib's sample, wherever this machine keeps it.
# device_pack.sh packs the one this build's configs name; else matplotlib's.
image=$PWD/.device/bin/grace_hopper.jpg
[[ -f $image ]] || image=$(python3 -c 'import matplotlib, os; print(os.path.join(matplotlib.get_data_path(), "sample_data", "grace_hopper.jpg"))' 2>/dev/null || true)
[[ -n $image && -f $image ]] || image=/usr/share/matplotlib/mpl-data/sample_data/grace_hopper.jpg

status=0
# Every check runs under a limit (DEVICE_STEP_TIMEOUT seconds, 180 by
# default): a hung kernel or collective ends as exit 124, named, and the
# checks after it still run inside the device tool's lease.
# DEVICE_BUDGET seconds (none by default): checks that would start later
# are skipped, named, so that a lease's last minutes still bring the logs.
run() {  # name, command...
  local name=$1
  shift
  if [[ -n ${DEVICE_BUDGET:-} ]] && ((SECONDS > DEVICE_BUDGET)); then
    echo "== $name: skipped, past DEVICE_BUDGET=$DEVICE_BUDGET s" | tee -a "$summary"
    status=1
    return
  fi
  echo "== $name: $*" | tee -a "$summary"
  local start=$SECONDS
  timeout -k 5 "${DEVICE_STEP_TIMEOUT:-180}" "$@" >"$logs/$name.log" 2>&1
  local rc=$?
  echo "== $name: $((SECONDS - start)) s" >>"$summary"
  tail -n 25 "$logs/$name.log"
  echo "== $name: exit $rc" | tee -a "$summary"
  [[ $rc -eq 0 ]] || status=1
}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 | tee "$logs/gpu.txt" || true
bin=.device/bin
run device_trainer_test "$bin/device_trainer_test"
run device_push_test "$bin/device_push_test"
run cuda_kernels_test "$bin/cuda_kernels_test"
run cuda_codec_test "$bin/cuda_codec_test"
run backbone_gpu "$bin/backbone_test" --gtest_filter='*Gpu*:*Twin*'
run allreduce_gpu "$bin/allreduce_test" --gtest_filter='*Gpu*:*Staged*'
# A test that skipped here skipped for a reason that should not exist on a
# GPU machine: count it as a failure. The tests of the no-device path
# (named Without...Device) skip where a device is present, by design.
skipped=$(grep -h "SKIPPED \] [A-Za-z]" "$logs"/*test*.log "$logs"/*_gpu.log 2>/dev/null |
  grep -v ' ms)$' | grep -v -E 'Without(A)?Device' | sort -u)
if [[ -n $skipped ]]; then
  echo "== some GPU tests skipped on a GPU machine:" | tee -a "$summary"
  echo "$skipped" | tee -a "$summary"
  status=1
fi
# The CUDA tests again under compute-sanitizer's memcheck, where the
# machine has it: an out-of-bounds or misaligned access a test's numbers
# happened not to show.
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [[ -x $sanitizer && ${DEVICE_SANITIZE:-1} == 1 ]]; then
  for t in cuda_kernels_test cuda_codec_test device_trainer_test; do
    run "memcheck_$t" "$sanitizer" --tool memcheck --error-exitcode 9 "$bin/$t"
  done
fi
if [[ -n $image && -f $image ]]; then
  # configs/local.json names the image where Debian keeps it.
  for device in cuda cpu; do
    run "bench_train_$device" "$bin/gridsync-bench" train --device "$device" --steps 300 \
      --threads "${BENCH_THREADS:-16}" --set "task.image=$image" --json "$logs/bench_train_$device.json"
  done
  # Larger batches on both (the default 16384 keeps an H200 mostly idle).
  for batch in ${DEVICE_BATCHES:-65536 262144}; do
    for device in cuda cpu; do
      run "bench_train_${device}_b$batch" "$bin/gridsync-bench" train --device "$device" --steps 100 \
        --threads "${BENCH_THREADS:-16}" --set "task.image=$image" --set "training.batch_size=$batch"
    done
  done
  # ps with codecs on the GPU: the grid's pushes encoded on the device
  # before the copy, with Adam on the workers (auto) and on the shards.
  [[ ${DEVICE_COMPRESS:-1} == 1 ]] && for optimizer in auto shard; do
    run "bench_compress_cuda_$optimizer" "$bin/gridsync-bench" compress --train \
      --codecs none,onebit,topk --steps 300 --workers 2 --shards 1 \
      --set training.device=cuda --set "ps.optimizer=$optimizer" --set "task.image=$image"
  done
fi
# Real multi-process clusters on the GPU (`gridsync launch`: coordinator,
# shards and workers as processes, the workers sharing this machine's
# GPUs): the demo's ps config, hybrid, and the seed configs as they are,
# with only the coordinator's address moved to this machine and the image
# and step count set. DEVICE_CLUSTERS=0 skips them.
if [[ ${DEVICE_CLUSTERS:-1} == 1 && -n $image && -f $image ]]; then
  cluster() {  # name, config, --set overrides...
    local name=$1 config=$2
    shift 2
    [[ " ${DEVICE_CLUSTER_SET:-ps hybrid seed_small seed_medium} " == *" $name "* ]] || return 0
    run "cluster_$name" "$bin/gridsync" launch "$config" --bin-dir "$bin" \
      --set training.device=cuda --set "task.image=$image" --set "task.output=$logs/out_$name" "$@"
  }
  cluster ps configs/local.json --set training.steps=300
  cluster hybrid configs/local.json --set training.steps=300 --set distributed.gradient_sync=hybrid
  seeds=$bin/seed-configs
  if [[ -d $seeds ]]; then
    cluster seed_small "$seeds/distributed_small.json" --set distributed.master_addr=127.0.0.1 \
      --set training.steps=200
    cluster seed_medium "$seeds/distributed_medium.json" --set distributed.master_addr=127.0.0.1 \
      --set training.steps=50
  fi
fi
# Where the device trainer's step goes, kernel by kernel (Nsight Compute,
# clocks left alone), where the machine has it: DEVICE_PROFILE=1.
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [[ ${DEVICE_PROFILE:-0} == 1 && -n $ncu && -n $image && -f $image ]]; then
  # One metric (a single pass per kernel): a few steps' launches after the
  # warm-up, summed per kernel name.
  run profile_train_cuda "$ncu" --clock-control none --launch-skip 400 --launch-count 110 \
    --print-summary per-kernel --metrics gpu__time_duration.sum \
    "$bin/gridsync-bench" train --device cuda --steps 30 --threads 4 --set "task.image=$image"
fi
echo "== device_run: exit $status" | tee -a "$summary"
exit $status
