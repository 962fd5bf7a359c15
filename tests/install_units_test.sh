#!/usr/bin/env bash
# The install and the systemd units as shipped:
#  1. `cmake --install` into a DESTDIR lays out binaries, units, the example
#     cluster config, node.env's template and the docs where the units expect
#     them;
#  2. `systemd-analyze verify` is clean on the installed units (and fails when
#     a binary they name is missing: the check can fail), and `systemd-analyze
#     security` rates the coordinator and the shards at 2.0 or below;
#  3. a cluster started from the installed units' own ExecStart=, Environment=
#     and EnvironmentFile= lines (tests/unit_exec.py expands them as systemd
#     does) trains to the end: coordinator, gridsync-ps@0, @1, gridsync-worker@0,
#     @1, in the state directory the units name; then a second job on the
#     same coordinator and shards ends exactly where the first one ended
#     (long-running shards start afresh for a new job).
# Steps 2 skips, saying why, where systemd-analyze is missing.
set -euo pipefail
BUILD=${1:?usage: install_units_test.sh BUILD_DIR SOURCE_DIR}
SRC=${2:?usage: install_units_test.sh BUILD_DIR SOURCE_DIR}
source "$SRC/tests/test_lib.sh"
DEST="$WORK/root"
PORT=$((25400 + ($$ % 500) * 2))

# 1. The layout.
DESTDIR="$DEST" cmake --install "$BUILD" > "$WORK/install.log" 2>&1 ||
  { cat "$WORK/install.log"; echo "FAIL: cmake --install"; exit 1; }
prefix=$(sed -n 's/^CMAKE_INSTALL_PREFIX:PATH=//p' "$BUILD/CMakeCache.txt")
units="$DEST$prefix/lib/systemd/system"
for f in bin/gridsync bin/gridsync-coordinator bin/gridsync-ps bin/gridsync-worker \
  bin/gridsync-bench lib/systemd/system/gridsync-coordinator.service \
  lib/systemd/system/gridsync-ps@.service lib/systemd/system/gridsync-worker@.service \
  lib/systemd/system/gridsync.target share/doc/gridsync/README.md \
  share/doc/gridsync/design.md share/doc/gridsync/configs/local.json; do
  [ -e "$DEST$prefix/$f" ] || fail "not installed: $prefix/$f"
done
for f in /etc/gridsync/cluster.json /etc/gridsync/node.env.example; do
  [ -e "$DEST$f" ] || fail "not installed: $f"
done
for u in "$units"/*.service; do
  bin=$(sed -n 's/^ExecStart=\([^ ]*\).*/\1/p' "$u")
  [ -x "$DEST$bin" ] || fail "$(basename "$u") runs $bin, which the install does not provide"
done
"$DEST$prefix/bin/gridsync" check-config "$DEST/etc/gridsync/cluster.json" > /dev/null 2>&1 ||
  fail "the installed example config does not pass check-config"

# 2. systemd-analyze on the installed tree.
if command -v systemd-analyze > /dev/null; then
  # verify --root needs the system's own units (sysinit.target, ...) there.
  mkdir -p "$DEST/usr/lib/systemd"
  cp -a /usr/lib/systemd/system "$DEST/usr/lib/systemd/" 2>/dev/null ||
    cp -a /lib/systemd/system "$DEST/usr/lib/systemd/"
  rel=${units#"$DEST"/}
  to_verify=("$rel/gridsync-coordinator.service" "$rel/gridsync-ps@0.service"
    "$rel/gridsync-worker@0.service" "$rel/gridsync.target")
  if ! (cd "$DEST" && systemd-analyze verify --root="$DEST" "${to_verify[@]}") \
    > "$WORK/verify.log" 2>&1 || [ -s "$WORK/verify.log" ]; then
    cat "$WORK/verify.log"
    fail "systemd-analyze verify is not clean on the installed units"
  fi
  mv "$DEST$prefix/bin/gridsync-ps" "$WORK/gridsync-ps.moved"
  if (cd "$DEST" && systemd-analyze verify --root="$DEST" "$rel/gridsync-ps@0.service") \
    > /dev/null 2>&1; then
    fail "systemd-analyze verify passed a unit whose binary is missing (the check cannot fail)"
  fi
  mv "$WORK/gridsync-ps.moved" "$DEST$prefix/bin/gridsync-ps"
  for u in gridsync-coordinator.service gridsync-ps@0.service gridsync-worker@0.service; do
    line=$(cd "$DEST" && systemd-analyze security --offline=yes --root="$DEST" "$rel/$u" 2>&1 |
      grep "Overall exposure level" || true)
    score=$(echo "$line" | sed -n 's/.*: \([0-9.]*\) .*/\1/p')
    echo "systemd-analyze security $u: ${score:-?}"
    if [ -z "$score" ]; then
      fail "systemd-analyze security gave no figure for $u"
    elif [ "$u" != gridsync-worker@0.service ] && awk "BEGIN{exit !($score > 2.0)}"; then
      fail "$u is rated $score by systemd-analyze security; allowed: 2.0 or below"
    fi
  done
else
  echo "SKIP: systemd-analyze is not installed; verify and security not checked"
fi

# 3. A cluster from the units' own command lines. node.env is the per-machine
# file the units read; here it sets the port and a short run for every role.
sets="--set distributed.master_port=$PORT --set training.steps=20 --set training.batch_size=4096"
sets+=" --set encoding.log2_hashmap_size=14 --set distributed.timeout_s=20"
cat > "$DEST/etc/gridsync/node.env" <<ENV
# written by install_units_test.sh
GRIDSYNC_CONFIG=$DEST/etc/gridsync/cluster.json
GRIDSYNC_COORDINATOR_ARGS=$sets
GRIDSYNC_PS_ARGS=$sets
GRIDSYNC_WORKER_ARGS=$sets
ENV
state="$WORK/state"  # stands for the unit's WorkingDirectory (/var/lib/gridsync)
mkdir -p "$state"
start_unit() {  # start_unit UNIT INSTANCE LOG
  local spec
  spec=$(python3 "$SRC/tests/unit_exec.py" "$units/$1" --instance "$2" --root "$DEST")
  local cwd
  cwd=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["cwd"] or "")' <<< "$spec")
  [ "$cwd" = /var/lib/gridsync ] || fail "$1 works in '$cwd', not /var/lib/gridsync"
  python3 - "$spec" "$state" "$3" <<'PY' &
import json, os, sys
spec, state, log = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
env = dict(os.environ)
env.update(spec["env"])
os.chdir(state)
fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
os.dup2(fd, 1)
os.dup2(fd, 2)
os.execve(spec["argv"][0], spec["argv"], env)
PY
  track $!
}
# Any order: a worker whose coordinator is not up yet (its machine boots
# later) exits with a code on which its unit, as installed, restarts it. It
# exited 1 before, which Restart=on-abnormal leaves down for good.
spec=$(python3 "$SRC/tests/unit_exec.py" "$units/gridsync-worker@.service" --instance 0 \
  --root "$DEST")
verdict=$(python3 - "$spec" "$state" "$units/gridsync-worker@.service" "$WORK/early-worker.log" \
  <<'PY'
import json, os, subprocess, sys
spec, state, unit, log = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
keys = {}
for line in open(unit):
    if "=" in line and not line.lstrip().startswith("#"):
        k, _, v = line.strip().partition("=")
        keys[k] = v
env = dict(os.environ)
env.update(spec["env"])
with open(log, "w") as out:
    # A short wait: nothing listens on the port yet.
    rc = subprocess.call(spec["argv"] + ["--set", "distributed.timeout_s=2"], cwd=state, env=env,
                         stdout=out, stderr=subprocess.STDOUT, timeout=60)
restart = keys.get("Restart", "no")
forced = keys.get("RestartForceExitStatus", "").split()
# systemd.service(5): on-failure and always restart on any unclean exit
# code; on-abnormal only on signals and timeouts, or a forced code.
restarts = rc != 0 and (restart in ("on-failure", "always") or str(rc) in forced)
print(f"exit {rc}; Restart={restart} RestartForceExitStatus={' '.join(forced)}; "
      f"{'restarted' if restarts else 'left down'}")
PY
)
echo "a worker before its coordinator: $verdict"
case "$verdict" in
  *"; restarted") ;;
  *) fail "a worker started before its coordinator: $verdict: $(tail -2 "$WORK/early-worker.log")" ;;
esac
grep -q "no coordinator before the first step" "$WORK/early-worker.log" ||
  fail "the early worker did not say why it exited: $(tail -2 "$WORK/early-worker.log")"
start_unit gridsync-coordinator.service "" "$WORK/coordinator.log"
start_unit gridsync-ps@.service 0 "$WORK/ps0.log"
start_unit gridsync-ps@.service 1 "$WORK/ps1.log"
run_job() {  # run_job NAME: both workers' units, to the end
  start_unit gridsync-worker@.service 0 "$WORK/$1-worker0.log"
  local w0=${pids[-1]}
  start_unit gridsync-worker@.service 1 "$WORK/$1-worker1.log"
  local w1=${pids[-1]}
  for w in "$w0" "$w1"; do
    timeout 120 tail --pid="$w" -f /dev/null || fail "$1: a worker did not finish in 120 s"
  done
  wait "$w0" || fail "$1: gridsync-worker@0 exited $?: $(tail -3 "$WORK/$1-worker0.log")"
  wait "$w1" || fail "$1: gridsync-worker@1 exited $?: $(tail -3 "$WORK/$1-worker1.log")"
  grep -q '"psnr_db"' "$WORK/$1-worker0.log" || fail "$1: worker 0 printed no summary"
  grep -q 'worker 0 on node' "$WORK/$1-worker0.log" || fail "$1: gridsync-worker@0 is not rank 0"
  grep -q 'worker 1 on node' "$WORK/$1-worker1.log" || fail "$1: gridsync-worker@1 is not rank 1"
}
run_job job1
ls "$state"/out/local/*.png > /dev/null 2>&1 ||
  fail "no reconstruction under the state directory ($state/out/local)"
# The same coordinator and shards serve a second job (long-running units):
# the shards start afresh, so it ends exactly where the first one ended.
run_job job2
loss() { sed -n 's/.*"final_loss":\([0-9.e-]*\).*/\1/p' "$WORK/$1-worker0.log"; }
[ -n "$(loss job1)" ] && [ "$(loss job1)" = "$(loss job2)" ] ||
  fail "the second job on the same shards ended at loss '$(loss job2)', the first at '$(loss job1)'"
grep -q "job 2 begins" "$WORK/ps0.log" || fail "shard 0 did not log the start of job 2"
finish install_units_test
