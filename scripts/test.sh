#!/usr/bin/env bash
# One command for a fresh Debian 12 machine: install what is missing, build,
# and run every test under ctest. GPU tests skip, saying why, without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
BUILD_DIR="${GRIDSYNC_BUILD_DIR:-build}"
cd "$BUILD_DIR"
# Serially: several suites check that failures surface within a timeout, and
# on a 2-core machine parallel suites would starve each other's timers.
ctest --output-on-failure "$@"
