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
  [ -n "${KEEP_WORK:-}" ] || rm -rf "$WORK"
}
trap cleanup EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
# free_ports FIRST STEP COUNT WIDTH: the first of COUNT candidate bases
# (FIRST, FIRST+STEP, ...; starting at one picked by this shell's pid) whose
# WIDTH ports all bind now on 127.0.0.1, so a test never collides with a
# port another test still holds (a listener, or connections in TIME_WAIT).
free_ports() {
  python3 - "$1" "$2" "$3" "$4" "$$" <<'PY'
import socket, sys
first, step, count, width, pid = map(int, sys.argv[1:])
for k in range(count):
    base = first + ((pid + k) % count) * step
    socks = []
    try:
        for p in range(base, base + width):
            s = socket.socket()
            s.bind(("127.0.0.1", p))
            socks.append(s)
    except OSError:
        continue
    finally:
        for s in socks:
            s.close()
    print(base)
    sys.exit(0)
sys.exit("no free block of %d ports" % width)
PY
}
finish() {  # finish NAME
  if [ "$failures" -ne 0 ]; then
    for f in "$WORK"/*.log; do [ -e "$f" ] && { echo "== $f"; tail -5 "$f"; }; done
    echo "$1: $failures failure(s)"
    exit 1
  fi
  echo "$1: all passed"
}
