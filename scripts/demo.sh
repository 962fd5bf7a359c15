#!/usr/bin/env bash
# One command for a fresh Debian 12 machine: install what is missing, build,
# and run the demo: a ps-mode cluster on this machine (coordinator, 2 PS
# shards, 2 workers; configs/local.json) fitting grace_hopper.jpg. It ends
# with the PSNR, the reconstruction PNG, bytes pushed and pulled per step and
# the time spent in communication. Extra arguments go to `gridsync launch`
# (e.g. --set training.steps=200).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
BUILD_DIR="${GRIDSYNC_BUILD_DIR:-build}"
"$BUILD_DIR/tools/gridsync" check-config configs/local.json > /dev/null
exec "$BUILD_DIR/tools/gridsync" launch configs/local.json "$@"
