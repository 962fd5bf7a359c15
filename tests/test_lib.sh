# Shared by the shell tests (source it after `set -euo pipefail`): a scratch
# folder removed on exit, the background processes started with `track`
# killed on exit (even on failure), and `fail` counting failures for
# `finish`, which prints the logs and sets the exit code.
WORK=$(mktemp -d)
pids=()
track() { pids+=("$1"); }
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
finish() {  # finish NAME
  if [ "$failures" -ne 0 ]; then
    for f in "$WORK"/*.log; do [ -e "$f" ] && { echo "== $f"; tail -5 "$f"; }; done
    echo "$1: $failures failure(s)"
    exit 1
  fi
  echo "$1: all passed"
}
