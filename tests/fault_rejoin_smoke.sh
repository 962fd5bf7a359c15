#!/usr/bin/env bash
# The live rejoins of the real-fault suite that touch the most state, short
# enough to run under ASan/UBSan in the test command (scripts/sanitize.sh
# with GRIDSYNC_SANITIZE_FAULTS=smoke, ctest's sanitize_smoke): a onebit run
# whose shard 1 is SIGKILLed after the checkpoint of step 150 (the shards'
# parameters, the workers' Adam state and error-feedback residuals rolled
# back), and one with compression.pull whose worker 1 is (its replica
# and the shards' copies of it restored at both ends). Each restarted process
# rejoins, the job rolls back without stopping, and the final parameters
# equal the uninterrupted run's bit for bit. tests/fault_test.sh is the whole
# suite (tests/fault_lib.sh holds what both run).
#   tests/fault_rejoin_smoke.sh BUILD_DIR
set -euo pipefail
BUILD=${1:?usage: fault_rejoin_smoke.sh BUILD_DIR}
# Below the ephemeral range, clear of the other tests' ports (20000 and up).
PORT_BASE=16000
. "$(dirname "$0")/fault_lib.sh"
write_fault_cluster

clean_run "$WORK/clean-codec.bin" onebit "${codec_set[@]}"
clean_run "$WORK/clean-pull.bin" "onebit with delta pulls" "${pull_set[@]}"
live_rejoin onebit:ps-1
live_rejoin pull:worker-1
if [ $failures -ne 0 ]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "fault_rejoin_smoke: all checks passed"
