#!/usr/bin/env bash
# One command for a fresh Debian 12 machine: install what is missing, build,
# and run the demo: fit grace_hopper.jpg with the configs/local.json model and
# write the reconstruction to out/local/reconstruction.png.
# Until the parameter server lands, the demo trains in one process.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
BUILD_DIR="${GRIDSYNC_BUILD_DIR:-build}"
"$BUILD_DIR/tools/gridsync" check-config configs/local.json --standalone > /dev/null
"$BUILD_DIR/worker/gridsync-worker" --config configs/local.json --standalone "$@"
