#!/usr/bin/env bash
# Runs gridsync's GPU checks on a machine with a CUDA device, from what
# scripts/device_pack.sh put in .device/: every GPU test (they skip with a
# reason only where no device is present, so here each must pass), then
# gridsync-bench train on the device and on the CPU of that machine, side by
# side. Logs go to $OUT (the device tool's folder) or out/device/.
#
# NCCL and cuBLAS come from the machine: CUDA's lib folders, or the
# nvidia-nccl / nvidia-cublas Python wheels of its python3.
set -uo pipefail
cd "$(dirname "$0")/.."
logs=${OUT:-out/device}
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
image=$(python3 -c 'import matplotlib, os; print(os.path.join(matplotlib.get_data_path(), "sample_data", "grace_hopper.jpg"))' 2>/dev/null || true)
[[ -n $image && -f $image ]] || image=/usr/share/matplotlib/mpl-data/sample_data/grace_hopper.jpg

status=0
run() {  # name, command...
  local name=$1
  shift
  echo "== $name: $*" | tee -a "$logs/summary.txt"
  "$@" >"$logs/$name.log" 2>&1
  local rc=$?
  tail -n 25 "$logs/$name.log"
  echo "== $name: exit $rc" | tee -a "$logs/summary.txt"
  [[ $rc -eq 0 ]] || status=1
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$logs/gpu.txt" 2>&1 || true
bin=.device/bin
run device_trainer_test "$bin/device_trainer_test"
run device_push_test "$bin/device_push_test"
run cuda_kernels_test "$bin/cuda_kernels_test"
run cuda_codec_test "$bin/cuda_codec_test"
run backbone_gpu "$bin/backbone_test" --gtest_filter='*Gpu*:*Twin*'
run allreduce_gpu "$bin/allreduce_test" --gtest_filter='*Gpu*:*Staged*'
# A test that skipped here skipped for a reason that should not exist on a
# GPU machine: count it as a failure.
if grep -l "SKIPPED \]" "$logs"/*test*.log "$logs"/*_gpu.log 2>/dev/null | grep -q .; then
  echo "== some GPU tests skipped on a GPU machine:" | tee -a "$logs/summary.txt"
  grep -h "SKIPPED \]" "$logs"/*.log | sort -u | tee -a "$logs/summary.txt"
  status=1
fi
if [[ -n $image && -f $image ]]; then
  # configs/local.json names the image where Debian keeps it.
  for device in cuda cpu; do
    run "bench_train_$device" "$bin/gridsync-bench" train --device "$device" --steps 300 \
      --threads "${BENCH_THREADS:-16}" --set "task.image=$image" --json "$logs/bench_train_$device.json"
  done
  # ps with codecs on the GPU: the grid's pushes encoded on the device
  # before the copy, with Adam on the workers (auto) and on the shards.
  for optimizer in auto shard; do
    run "bench_compress_cuda_$optimizer" "$bin/gridsync-bench" compress --train \
      --codecs none,onebit,topk --steps 300 --workers 2 --shards 1 \
      --set training.device=cuda --set "ps.optimizer=$optimizer" --set "task.image=$image"
  done
fi
echo "== device_run: exit $status" | tee -a "$logs/summary.txt"
exit $status
