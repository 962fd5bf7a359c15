#!/usr/bin/env bash
# Runs the network-facing tests and the real-fault suite under
# AddressSanitizer and UBSan. Builds the tests and the binaries with clang-14
# into build-asan (RelWithDebInfo, no CUDA), runs the chosen unit tests there,
# then tests/fault_test.sh against the sanitized gridsync, gridsync-ps,
# gridsync-worker and gridsync-coordinator (SIGKILLed shards, workers and
# coordinators, resumes, rejoins, corrupted checkpoints).
#
# Every sanitizer report of every process, the launched children included, is
# written to build-asan/sanitizer-logs. The script fails when any report was
# written, printing the first lines of each, even where the test passed: a
# child that died of a report may be one the test expected to fail, and a
# report in a process whose exit nobody reads would pass unseen.
#
# The test command (ctest's sanitize_smoke, GRIDSYNC_SANITIZE_FAULTS=smoke)
# runs the default unit tests and tests/fault_rejoin_smoke.sh this way: two
# live rejoins of the fault suite (a SIGKILLed shard of a onebit run, a
# SIGKILLed worker of one with compression.pull), each ending bit for bit.
# The whole fault_test under the sanitizers takes some 16-22 minutes on 2
# cores, so it is run by hand.
#   scripts/sanitize.sh                        # the default tests, then fault_test
#   scripts/sanitize.sh ps_test multihost_test # these ctest tests, then fault_test
#   GRIDSYNC_SANITIZE_FAULTS=smoke scripts/sanitize.sh  # ... then the two rejoins
#   GRIDSYNC_SANITIZE_FAULTS=0 scripts/sanitize.sh ps_test   # without fault_test
set -euo pipefail
cd "$(dirname "$0")/.."
# Which fault suite, checked before anything is installed or built.
faults=${GRIDSYNC_SANITIZE_FAULTS:-1}
case $faults in
  0) fault_suite= ;;
  1) fault_suite=tests/fault_test.sh ;;
  smoke) fault_suite=tests/fault_rejoin_smoke.sh ;;
  *)
    echo "sanitize: GRIDSYNC_SANITIZE_FAULTS=$faults; allowed: 0 (none), 1 (tests/fault_test.sh) or smoke (tests/fault_rejoin_smoke.sh)" >&2
    exit 2
    ;;
esac
scripts/install-deps.sh
BUILD=${GRIDSYNC_SANITIZE_BUILD_DIR:-build-asan}
. scripts/clang_tree.sh
configure_clang_tree "$BUILD" -DGRIDSYNC_BUILD_TESTS=ON -DGRIDSYNC_BUILD_TOOLS=ON
tests=("$@")
if [ ${#tests[@]} -eq 0 ]; then
  # The decode boundaries and the processes that serve the network.
  tests=(wire_decode_test wire_rows_test codec_malformed_test error_feedback_test
    coordinator_input_test security_test ps_test ps_shard_test shard_connections_test
    ps_client_parts_test pending_updates_test checkpoint_test restart_files_test)
fi
# A unit test is a target of its own; fault_test and the other scripted
# suites (multihost_test, seed_modes_test, ...) run the binaries.
targets=()
binaries=0
[ -n "$fault_suite" ] && binaries=1
for t in "${tests[@]}"; do
  if grep -q "^gridsync_add_test($t " tests/CMakeLists.txt; then
    targets+=("$t")
  else
    binaries=1
  fi
done
if [ "$binaries" = 1 ]; then
  targets+=(gridsync gridsync-ps gridsync-worker gridsync-coordinator)
fi
cmake --build "$BUILD" --target "${targets[@]}" -j "$(nproc)"

case $BUILD in
  /*) LOGS="$BUILD/sanitizer-logs" ;;
  *) LOGS="$PWD/$BUILD/sanitizer-logs" ;;
esac
rm -rf "$LOGS"
mkdir -p "$LOGS"
# log_path: one file per process (name.pid), children included, since the
# variables are inherited. Leaks are reported at a normal exit; a SIGKILLed
# process reports nothing, which is what the fault suite does to them.
export ASAN_OPTIONS="log_path=$LOGS/asan:detect_leaks=1:abort_on_error=0"
export UBSAN_OPTIONS="log_path=$LOGS/ubsan:print_stacktrace=1:halt_on_error=1"
failed=0
pattern="^($(
  IFS='|'
  echo "${tests[*]}"
))\$"
if ! (cd "$BUILD" && ctest --output-on-failure --no-tests=error -R "$pattern"); then
  echo "sanitize: ctest failed under the sanitizers (a test failed, or none matched: ${tests[*]})"
  failed=1
fi
if [ -n "$fault_suite" ]; then
  if ! "$fault_suite" "$BUILD"; then
    echo "sanitize: $fault_suite failed under the sanitizers"
    failed=1
  fi
fi
count=$(find "$LOGS" -type f | wc -l)
if [ "$count" -gt 0 ]; then
  echo "sanitize: $count sanitizer report(s) in $LOGS:"
  find "$LOGS" -type f | sort | while IFS= read -r f; do
    echo "== $f"
    head -20 "$f"
  done
  failed=1
else
  echo "sanitize: no sanitizer report (tests: ${tests[*]}; fault suite: ${fault_suite:-none})"
fi
exit $failed
