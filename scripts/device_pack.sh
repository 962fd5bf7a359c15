#!/usr/bin/env bash
# Packs what a GPU machine needs to run gridsync's GPU checks, for a machine
# that can install nothing (the workplace's device machine): the GPU test
# binaries and gridsync-bench, stripped, and the shared libraries they load
# that such a machine lacks, into .device/ (ignored by git), with
# scripts/device_run.sh to run there (as .device/pack.tar.xz, under the
# device tool's 64 MiB). NCCL, cuBLAS and the CUDA runtime are
# not packed (hundreds of MB): device_run.sh finds them in the machine's
# CUDA or Python (nvidia-* wheels) installation.
#
# Usage (here, after building build/):
#   scripts/device_pack.sh [BUILD_DIR]
# then, on the device machine, in the repository root:
#   bash scripts/device_run.sh          (writes its logs under $OUT or out/)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=.device
grep -qx '/.device/' .git/info/exclude 2>/dev/null || echo '/.device/' >>.git/info/exclude

targets=(device_trainer_test device_push_test backbone_test allreduce_test cuda_kernels_test cuda_codec_test gridsync-bench
  gridsync gridsync-coordinator gridsync-ps gridsync-worker)
cmake --build "$build" -j"$(nproc)" --target "${targets[@]}"

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
for t in "${targets[@]}"; do
  bin=$(find "$build" -type f -name "$t" -perm -u+x | head -1)
  [[ -n $bin ]] || { echo "device_pack: $t not built in $build" >&2; exit 1; }
  strip -o "$out/bin/$t" "$bin"
done
# The bench's image, for a machine whose Python has no matplotlib data.
image=/usr/share/matplotlib/mpl-data/sample_data/grace_hopper.jpg
[[ -f $image ]] && cp "$image" "$out/bin/"
# The seed configs, for device_run.sh's multi-process runs on the GPU.
[[ -d ../shared/seed-configs ]] && cp -r ../shared/seed-configs "$out/bin/"
# The libraries the binaries load, except the C library's own, the
# compiler's runtime, and what the GPU machine provides (CUDA, NCCL, cuBLAS).
for bin in "${targets[@]/#/$out/bin/}"; do
  ldd "$bin" | awk '/=> \// {print $3}'
done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|ld-linux*|libgcc_s.so.*) continue ;;
    libnccl.so*|libcublas*|libcudart*|libcuda.so*) continue ;;
  esac
  cp -L "$lib" "$out/lib/"
done
# The device tool carries at most 64 MiB: binaries and libraries (oneDNN
# alone is 40 MB) travel as one xz archive that device_run.sh unpacks.
tar -C "$out" -cJf "$out/pack.tar.xz" bin lib
rm -rf "$out/bin" "$out/lib"
du -sh "$out"
echo "device_pack: $out ready; on the device machine run: bash scripts/device_run.sh"
