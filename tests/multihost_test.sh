#!/usr/bin/env bash
# Multi-host runs on emulated machines: two network namespaces joined by a
# 1 Gbit/s tbf-shaped link (tools/emulate/netns-cluster.sh), one
# `gridsync launch CONFIG --node NAME` per node from the same config file.
#
#  1. Every sync mode (ps, nccl over Gloo, hybrid) across the two nodes ends
#     where one process ends (gridsync-worker --standalone with
#     gradient_accumulation = world size): the same PSNR to the last digit
#     for ps and nccl (bit-identical models); within 0.01 dB for hybrid,
#     whose node reduce-scatter sums in another order. Under ps, the pull
#     replies of node b's shard cross the link in parts.
#  2. A worker that advertises an address the other node cannot reach makes
#     the rendezvous fail within distributed.timeout_s plus the stated slack
#     (5 s), naming the peer and its address.
#  3. Config checks: loopback hosts in a multi-host config are refused.
#  4. A shard whose link is cut (no FIN, no RST) leaves the coordinator's
#     cluster map within about distributed.timeout_s plus a ping interval
#     and 1 s (common/member_liveness.h).
#  5. `gridsync launch --resume --node` on each machine, each with a
#     checkpoint folder of its own (ps, and nccl whose workers hold the
#     parts): the launchers agree on the newest step every machine holds
#     intact (one machine's newest damaged) and the job ends bit for bit as
#     an uninterrupted run.
# The data plane runs under CURVE (security.mode auto on several machines),
# with keys from `gridsync keygen`.
#
# Needs root for namespaces: exits 77 (ctest: skipped) with the reason
# otherwise. Cleans up what it created, even on failure.
set -euo pipefail
BUILD=${1:?usage: multihost_test.sh BUILD_DIR SOURCE_DIR}
SRC=${2:?usage: multihost_test.sh BUILD_DIR SOURCE_DIR}
NET="$SRC/tools/emulate/netns-cluster.sh"
"$NET" can
NAME="gsmh$$"
WORK=$(mktemp -d)
cleanup() { "$NET" down "$NAME"; rm -rf "$WORK"; }
trap cleanup EXIT
"$NET" up "$NAME" 2 --rate 1gbit
A=$("$NET" addr 0)
B=$("$NET" addr 1)
GS="$BUILD/tools/gridsync"
# Two machines: the data plane is authenticated and encrypted (CURVE).
"$GS" keygen "$WORK/keys" > /dev/null
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

config() {  # mode extra-json [timeout_s] [encoding-json]
  local encoding=${4:-}
  if [ -z "$encoding" ]; then encoding='{"n_levels": 8, "log2_hashmap_size": 14}'; fi
  cat > "$WORK/$1.json" <<JSON
{
  "encoding": $encoding,
  "network": {"n_neurons": 32, "n_hidden_layers": 1},
  "distributed": {
    "enable": true, "world_size": 2, "master_addr": "$A", "master_port": 29700,
    "gradient_sync": "$1", "timeout_s": ${3:-30},
    "nodes": [{"name": "a", "host": "$A", "workers": 1}, {"name": "b", "host": "$B", "workers": 1}]
  },
  "training": {"batch_size": 4096, "steps": 20, "log_every": 0},
  "task": {"output": "$WORK/out-$1"},
  "security": {"keys_dir": "$WORK/keys"}${2:-}
}
JSON
}

summary_field() { grep -E '^\[worker-0\] \{' "$1" | tail -1 | sed 's/^\[worker-0\] //' |
  python3 -c "import json,sys; print(repr(json.load(sys.stdin)['$2']))"; }

for mode in ps nccl hybrid; do
  extra=""
  if [ "$mode" != nccl ]; then extra=', "ps": {"shards": 2}'; fi
  # ps: levels enough that a shard's pull reply exceeds a part (256 KiB).
  encoding='{"n_levels": 8, "log2_hashmap_size": 14}'
  if [ "$mode" = ps ]; then encoding='{"n_levels": 16, "log2_hashmap_size": 14}'; fi
  config "$mode" "$extra" 30 "$encoding"
  start=$(date +%s.%N)
  "$NET" exec "$NAME" 0 "$GS" launch "$WORK/$mode.json" --node a > "$WORK/$mode-a.log" 2>&1 &
  pa=$!
  "$NET" exec "$NAME" 1 "$GS" launch "$WORK/$mode.json" --node b > "$WORK/$mode-b.log" 2>&1 &
  pb=$!
  ra=0; rb=0
  wait $pa || ra=$?
  wait $pb || rb=$?
  end=$(date +%s.%N)
  if [ $ra -ne 0 ] || [ $rb -ne 0 ]; then
    fail "$mode: launchers exited $ra (node a) and $rb (node b)"
    tail -30 "$WORK/$mode-a.log"; tail -30 "$WORK/$mode-b.log"
    continue
  fi
  grep -q "ps-1\]" "$WORK/$mode-b.log" || [ "$mode" = nccl ] || fail "$mode: shard 1 did not run on node b"
  if [ "$mode" = ps ]; then
    # The pull replies crossed the link in parts (more than 256 KiB of
    # values a shard), and the model below still ends bit for bit.
    parts=$(sed -n 's/.*\[ps-1\].*pulls (\([0-9]*\) answered in \([0-9]*\) parts).*/\1 \2/p' \
      "$WORK/$mode-b.log" | tail -1)
    if [ "${parts%% *}" -gt 0 ] 2>/dev/null; then
      echo "ok: ps: shard 1 on node b answered ${parts%% *} pulls in ${parts##* } parts"
    else
      fail "ps: shard 1 on node b answered no pull in parts (stop line: '${parts:-none}')"
    fi
  fi
  "$BUILD/worker/gridsync-worker" --standalone --config "$WORK/$mode.json" --set training.device=cpu \
    --set training.gradient_accumulation=2 --log-level warn > "$WORK/$mode-single.json"
  got=$(summary_field "$WORK/$mode-a.log" psnr_db)
  want=$(python3 -c "import json; print(repr(json.load(open('$WORK/$mode-single.json'))['psnr_db']))")
  tolerance=0
  if [ "$mode" = hybrid ]; then tolerance=0.01; fi
  if python3 -c "import sys; sys.exit(0 if abs($got - $want) <= $tolerance else 1)"; then
    echo "ok: $mode across 2 emulated nodes: PSNR $got dB, one process $want dB ($(python3 -c "print(round($end-$start,1))") s)"
  else
    fail "$mode: PSNR $got dB across two nodes, $want dB in one process; allowed difference $tolerance"
  fi
done

# 2. Unreachable advertised addresses: each node's worker advertises an
# address that exists only inside its own namespace, so no connection can
# come up in either direction (Gloo's own connect loop would retry for
# minutes).
ip netns exec "$NAME-n0" ip addr add 10.214.0.1/32 dev lo
ip netns exec "$NAME-n1" ip addr add 10.214.0.2/32 dev lo
config nccl "" 5
start=$(date +%s.%N)
GRIDSYNC_HOST=10.214.0.1 "$NET" exec "$NAME" 0 "$GS" launch "$WORK/nccl.json" --node a > "$WORK/unreach-a.log" 2>&1 &
pa=$!
GRIDSYNC_HOST=10.214.0.2 "$NET" exec "$NAME" 1 "$GS" launch "$WORK/nccl.json" --node b > "$WORK/unreach-b.log" 2>&1 &
pb=$!
ra=0; rb=0
wait $pa || ra=$?
wait $pb || rb=$?
end=$(date +%s.%N)
elapsed=$(python3 -c "print(round($end - $start, 1))")
if [ $ra -eq 0 ] || [ $rb -eq 0 ]; then fail "unreachable peers: a launcher succeeded ($ra, $rb)"; fi
# Startup and registration + timeout 5 s + 5 s slack + the launcher's stop.
if python3 -c "import sys; sys.exit(0 if $elapsed <= 5 + 5 + 5 else 1)"; then
  echo "ok: unreachable peers fail both nodes in $elapsed s (timeout 5 s + 5 s slack; allowed 15 s with startup and stop)"
else
  fail "unreachable peers: the launchers took $elapsed s; allowed: 15 s"
fi
if ! grep -q "rank 1 at 10.214.0.2" "$WORK/unreach-a.log" && ! grep -q "10.214.0.1" "$WORK/unreach-b.log"; then
  fail "neither node's error names the peer's address"; tail -5 "$WORK/unreach-a.log" "$WORK/unreach-b.log"
fi

# 3. check-config refuses loopback hosts in a multi-host config.
config ps ', "ps": {"shards": 2}'
if "$GS" check-config "$WORK/ps.json" --set 'distributed.nodes=[{"name":"a","host":"127.0.0.1","workers":1},{"name":"b","host":"'"$B"'","workers":1}]' > "$WORK/check.log" 2>&1; then
  fail "check-config accepted a loopback host in a multi-host config"
elif ! grep -q "loopback" "$WORK/check.log"; then
  fail "check-config's refusal does not say loopback: $(cat "$WORK/check.log")"
else
  echo "ok: check-config refuses a loopback node host in a multi-host config"
fi

# 4. A member whose host becomes unreachable (the link cut: no FIN, no RST)
# leaves the coordinator's cluster map within about distributed.timeout_s
# plus a ping interval and 1 s (TCP keepalive and TCP_USER_TIMEOUT: 6 s
# for timeout_s 4), so that its rank frees for a
# restarted process; it used to hold the rank forever.
config ps ', "ps": {"shards": 2}' 4
"$NET" exec "$NAME" 0 "$BUILD/server/gridsync-coordinator" --config "$WORK/ps.json" \
  > "$WORK/dead-coord.log" 2>&1 &
pc=$!
"$NET" exec "$NAME" 1 "$BUILD/server/gridsync-ps" --config "$WORK/ps.json" --shard 1 \
  > "$WORK/dead-ps.log" 2>&1 &
pp=$!
for _ in $(seq 1 100); do grep -q "registered as shard 1" "$WORK/dead-ps.log" && break; sleep 0.1; done
if ! grep -q "registered as shard 1" "$WORK/dead-ps.log"; then
  fail "dead peer: shard 1 did not register"; tail -5 "$WORK/dead-ps.log" "$WORK/dead-coord.log"
else
  ip netns exec "$NAME-hub" ip link set p1 down
  start=$(date +%s.%N)
  for _ in $(seq 1 300); do grep -q "shard 1 left" "$WORK/dead-coord.log" && break; sleep 0.1; done
  end=$(date +%s.%N)
  ip netns exec "$NAME-hub" ip link set p1 up
  elapsed=$(python3 -c "print(round($end - $start, 1))")
  # timeout_s 4: probes after 2 s idle, every 1 s; TCP_USER_TIMEOUT 4 s.
  if ! grep -q "shard 1 left" "$WORK/dead-coord.log"; then
    fail "dead peer: the coordinator still holds shard 1 after $elapsed s with its link cut"
  elif python3 -c "import sys; sys.exit(0 if $elapsed <= 4 * 2 + 2 else 1)"; then
    echo "ok: a shard whose link was cut left the cluster map after $elapsed s (timeout_s 4; allowed 10 s)"
  else
    fail "dead peer: shard 1 left only after $elapsed s; allowed 10 s (timeout_s 4)"
  fi
fi
kill "$pp" "$pc" 2> /dev/null || true
wait "$pp" 2> /dev/null || true
wait "$pc" 2> /dev/null || true

# 5. Resume across machines, each with a checkpoint folder of its own (no
# shared storage): SIGKILL of node b's part (ps: shard 1; nccl: worker 1,
# whose part is the whole model and its Adam state) after its checkpoint
# of step 100; node b's files of the newest step both nodes hold are then
# damaged (ps: a byte flipped, which the checksum finds) or forged (nccl:
# the older step's files copied in with the manifest's step edited, which
# only the MAC under CURVE finds: common/checkpoint_mac_key.h). `gridsync launch --resume --node` on each machine: the
# launchers agree through the coordinator on the newest step every node
# holds intact (node b sets its damaged files aside, naming them), and the
# job ends bit for bit as an uninterrupted run. Every such resume was
# refused before ("no complete checkpoint": each folder holds one part).
both() {  # MODE TAG ARGS...: both nodes' launchers, folders $WORK/MODE-TAG-a and -b
  local mode=$1 tag=$1-$2; shift 2
  "$NET" exec "$NAME" 0 "$GS" launch "$WORK/$mode.json" --node a --set training.steps=200 \
    --set checkpoint.dir="$WORK/$tag-a" "$@" --rank0-arg=--dump-params \
    --rank0-arg="$WORK/$tag.bin" > "$WORK/$tag-a.log" 2>&1 &
  pa=$!
  "$NET" exec "$NAME" 1 "$GS" launch "$WORK/$mode.json" --node b --set training.steps=200 \
    --set checkpoint.dir="$WORK/$tag-b" "$@" > "$WORK/$tag-b.log" 2>&1 &
  pb=$!
  ra=0; rb=0
}
for mode in ps nccl; do
  ckpt='"checkpoint": {"every_steps": 50, "dir": "'"$WORK"'/unused"}'
  if [ "$mode" = ps ]; then
    config ps ', "ps": {"shards": 2}, '"$ckpt" 5
    a_part=shard-0; b_part=shard-1; victim="gridsync-ps --shard 1"; proc=ps-1
  else
    # Checkpoints under nccl need the model on the CPU.
    config nccl ', '"$ckpt" 5
    sed -i 's/"log_every": 0}/"log_every": 0, "device": "cpu"}/' "$WORK/nccl.json"
    a_part=worker-0; b_part=worker-1; victim="gridsync-worker --rank 1"; proc=worker-1
  fi
  both $mode clean
  wait $pa || ra=$?; wait $pb || rb=$?
  [ $ra -eq 0 ] && [ $rb -eq 0 ] || fail "$mode resume: the uninterrupted run failed ($ra, $rb)"
  both $mode faulty
  for _ in $(seq 1 600); do
    grep -q "\[$proc\].*checkpoint at step 100 written" "$WORK/$mode-faulty-b.log" && break
    sleep 0.1
  done
  pkill -KILL -f "$victim --config $WORK/$mode.json" ||
    fail "$mode resume: $proc was not running after its checkpoint of step 100"
  wait $pa || ra=$?; wait $pb || rb=$?
  common=0
  for dir in "$WORK/$mode-faulty-b"/step-*; do
    step=${dir##*step-}
    [ -f "$dir/$b_part.json" ] && [ -f "$WORK/$mode-faulty-a/step-$step/$a_part.json" ] &&
      [ "$step" -gt "$common" ] && common=$step
  done
  if [ "$common" -lt 100 ]; then
    fail "$mode resume: no step of 100 or later that both nodes hold (newest $common)"
    ls "$WORK/$mode-faulty-a"/* "$WORK/$mode-faulty-b"/*
    grep -v "step [0-9]*/" "$WORK/$mode-faulty-a.log" | tail -20
    continue
  fi
  # The step to expect: the newest below it that both nodes hold.
  expected=0
  for dir in "$WORK/$mode-faulty-b"/step-*; do
    step=${dir##*step-}
    [ "$step" -lt "$common" ] && [ -f "$dir/$b_part.json" ] &&
      [ -f "$WORK/$mode-faulty-a/step-$step/$a_part.json" ] && [ "$step" -gt "$expected" ] &&
      expected=$step
  done
  bin="$WORK/$mode-faulty-b/step-$common/$b_part.bin"
  if [ "$mode" = ps ]; then
    # One byte of node b's file flipped (not overwritten: it may hold that value).
    byte=$(od -An -tu1 -j100 -N1 "$bin" | tr -d ' ')
    printf "\\$(printf '%03o' $(( byte ^ 255 )))" | dd of="$bin" bs=1 seek=100 conv=notrunc status=none
    why="$b_part.bin: checksum"
  else
    # Forged: node b's files of the older step copied over the newer one,
    # the manifest's step edited (checksum and run intact). CURVE is on
    # here, so each part's MAC (keyed by its role's secret) refuses it.
    older="$WORK/$mode-faulty-b/step-$expected/$b_part"
    cp "$older.bin" "$bin"
    sed 's/"step":[0-9]*/"step":'"$common"'/' "$older.json" > "${bin%.bin}.json"
    grep -q '"mac":' "${bin%.bin}.json" || fail "$mode resume: node b's manifest carries no mac under CURVE"
    why="$b_part.json: its mac does not match"
  fi
  for side in a b; do mv "$WORK/$mode-faulty-$side" "$WORK/$mode-resumed-$side"; done
  # A timeout of 30 s here: the launchers' exchange must not race a slow start.
  both $mode resumed --resume --set distributed.timeout_s=30
  wait $pa || ra=$?; wait $pb || rb=$?
  log_a="$WORK/$mode-resumed-a.log"; log_b="$WORK/$mode-resumed-b.log"
  agreed=$(grep -o "resuming from the checkpoint of step [0-9]*" "$log_a" | grep -o "[0-9]*$")
  if [ $ra -ne 0 ] || [ $rb -ne 0 ]; then
    fail "$mode resume across machines: launchers exited $ra (a) and $rb (b)"
    grep "gridsync launch" "$log_a" "$log_b" | tail -12
  elif [ "$expected" -eq 0 ] || [ "${agreed:-0}" -ne "$expected" ] ||
       ! grep -q "resuming from the checkpoint of step $agreed .*the newest step every node holds intact" "$log_b"; then
    fail "$mode resume across machines: the nodes did not both resume from step $expected, the newest intact below the damaged $common (a: '$agreed')"
    grep "gridsync launch" "$log_a" "$log_b" | tail -8
  elif ! grep -q "step $common: .*$why.*set aside as $b_part.bin.damaged" "$log_b"; then
    fail "$mode resume across machines: node b did not name its damaged file of step $common ($why)"
  elif ! cmp -s "$WORK/$mode-clean.bin" "$WORK/$mode-resumed.bin"; then
    fail "$mode resume across machines: the final parameters differ from the uninterrupted run's"
  else
    echo "ok: $mode resume across 2 machines with folders of their own: step $common damaged on node b ($why), both resumed from step $agreed and ended bit for bit"
  fi
done

if [ $failures -ne 0 ]; then echo "$failures failure(s)"; exit 1; fi
echo "multihost: all checks passed"
