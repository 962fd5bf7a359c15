#!/usr/bin/env bash
# Progress as a person sees it (`script` gives the commands a terminal):
#  1. a standalone worker on a terminal redraws one progress line (step/total,
#     percentage, samples/s, loss, PSNR, ETA) and prints no periodic step lines;
#  2. without a terminal it prints plain periodic step lines, no escape codes;
#  3. gridsync launch on a terminal draws worker 0's progress line and never
#     shows the "@progress" lines the workers send it.
set -euo pipefail
BUILD=${1:?usage: progress_test.sh BUILD_DIR}
source "$(dirname "$0")/test_lib.sh"
PORT=$((22000 + ($$ % 400) * 2))
if ! command -v script > /dev/null; then
  echo "SKIP: script (bsdutils) is not installed; no terminal to test on"
  exit 0
fi
# The default image of configs/local.json, from the source tree.
cd "$(dirname "$0")/.."
small="--set training.steps=40 --set training.batch_size=4096 --set encoding.log2_hashmap_size=14"
small+=" --set training.log_every=10 --set task.output=$WORK/out"

# 1. A terminal.
script -qec "$BUILD/worker/gridsync-worker --standalone $small --eval-every 20" "$WORK/tty.log" \
  > /dev/null 2>&1 || fail "the standalone worker failed on a terminal: $(tail -3 "$WORK/tty.log")"
grep -q $'\r\033\[K\[#' "$WORK/tty.log" || fail "no progress line redrawn in place"
grep -q '40/40 100%' "$WORK/tty.log" || fail "the progress line never reached 40/40 100%"
grep -q 'PSNR 18\|PSNR 2' "$WORK/tty.log" || fail "the progress line shows no PSNR after an evaluation"
grep -q 'ETA' "$WORK/tty.log" || fail "the progress line shows no ETA"
if grep -q 'standalone step 10/40' "$WORK/tty.log"; then
  fail "periodic step lines printed although a progress line is drawn"
fi

# 2. No terminal.
"$BUILD/worker/gridsync-worker" --standalone $small > "$WORK/plain.log" 2>&1 ||
  fail "the standalone worker failed without a terminal"
grep -q 'step 40/40 (100%)' "$WORK/plain.log" || fail "no plain periodic step lines without a terminal"
if grep -q $'\033\[K' "$WORK/plain.log"; then fail "escape codes written to a file"; fi

# 3. gridsync launch on a terminal.
cat > "$WORK/cluster.json" <<JSON
{"encoding": {"log2_hashmap_size": 14},
 "distributed": {"enable": true, "world_size": 2, "master_port": $PORT, "gradient_sync": "ps"},
 "ps": {"shards": 1},
 "training": {"batch_size": 4096, "steps": 40, "log_every": 0},
 "task": {"output": "$WORK/launch-out"}}
JSON
script -qec "$BUILD/tools/gridsync launch $WORK/cluster.json" "$WORK/launch.log" > /dev/null 2>&1 ||
  fail "gridsync launch failed on a terminal: $(tail -5 "$WORK/launch.log")"
grep -q $'\r\033\[K\[#' "$WORK/launch.log" || fail "gridsync launch drew no progress line"
grep -q '40/40 100%' "$WORK/launch.log" || fail "gridsync launch's progress line never reached 40/40"
if grep -q '@progress' "$WORK/launch.log"; then fail "gridsync launch printed its workers' @progress lines"; fi
grep -q '== gridsync launch' "$WORK/launch.log" || fail "gridsync launch printed no summary"

finish progress_test
