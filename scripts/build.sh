#!/usr/bin/env bash
# Configures (once) and builds gridsync into ./build. Incremental: only what
# changed is rebuilt; ccache is used when present. Extra arguments go to
# cmake's configure step, e.g. -DGRIDSYNC_CUDA_ARCHITECTURES=90.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${GRIDSYNC_BUILD_DIR:-build}"
# ccache: paths relative to the checkout, so a fresh clone elsewhere (CI)
# reuses what an earlier build compiled.
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ] || [ $# -gt 0 ]; then
  cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release "$@"
fi
cmake --build "$BUILD_DIR" -j "$(nproc)"
