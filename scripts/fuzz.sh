#!/usr/bin/env bash
# Fuzzes every decode boundary: builds the libFuzzer targets of fuzz/ with
# clang-14, AddressSanitizer and UBSan into build-fuzz, then runs each for
# SECONDS (default 60) from its seed corpus (fuzz/corpus/<target>); inputs
# that reach new code are kept in build-fuzz/corpus/<target>. Exits non-zero,
# naming the target and the crashing input, when any target crashes, leaks,
# hits undefined behaviour or times out.
#   scripts/fuzz.sh            # 60 s per target
#   scripts/fuzz.sh 600        # a longer campaign
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER=${1:-60}
scripts/install-deps.sh
BUILD=${GRIDSYNC_FUZZ_BUILD_DIR:-build-fuzz}
. scripts/clang_tree.sh
configure_clang_tree "$BUILD" -DGRIDSYNC_FUZZ=ON -DGRIDSYNC_BUILD_TESTS=OFF -DGRIDSYNC_BUILD_TOOLS=OFF
cmake --build "$BUILD" --target fuzz_all make_seeds -j "$(nproc)"
failed=0
for target in wire_decode_fuzz codec_decode_fuzz coord_request_fuzz config_fuzz coord_state_fuzz \
    image_decode_fuzz shard_checkpoint_fuzz worker_checkpoint_fuzz params_file_fuzz allreduce_checkpoint_fuzz \
    pull_reply_fuzz resume_steps_fuzz shard_request_fuzz coordinator_session_fuzz; do
  mkdir -p "$BUILD/corpus/$target" "$BUILD/artifacts"
  log="$BUILD/$target.log"
  if "$BUILD/fuzz/$target" -max_total_time="$SECONDS_PER" -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="$BUILD/artifacts/$target-" \
      "$BUILD/corpus/$target" "fuzz/corpus/$target" > "$log" 2>&1; then
    runs=$(grep -E '^stat::number_of_executed_units' "$log" | awk '{print $2}')
    echo "fuzz: $target: $runs executions in ${SECONDS_PER} s, no crash (corpus $(ls "$BUILD/corpus/$target" | wc -l) inputs)"
  else
    echo "fuzz: $target: FAILED; log $log"; grep -E 'ERROR|SUMMARY|Test unit written' "$log" | head -5
    failed=1
  fi
done
exit $failed
