#!/usr/bin/env bash
# gridsync against PyTorch DDP on emulated machines: two network namespaces
# (tools/emulate/netns-cluster.sh) joined by a tbf-shaped link, one worker per
# node, the seed-small grid, global batch 16384, grace_hopper.jpg.
#
#   bench-cluster.sh [--rate 1gbit] [--target 34] [--max-steps 400]
#                    [--modes "ps nccl hybrid ps:onebit"] [--no-ddp] [--out DIR]
#                    [--cpu-of I PCT] [--rate-of I R] [--set key=value]...
#
# Per run it reports the seconds to reach --target dB, samples/s, bytes per
# worker and step in each direction (the worker's own count) and on each
# node's link (interface counters, control traffic included), the share of
# step time spent in communication, and the speedup against DDP and against
# one node. Every run's PSNR against training time (evaluated every 10 steps,
# not timed) goes to curves.csv and, with gnuplot, curves.png.
#
# How time-to-target is measured: one process (gridsync-bench train, the
# same global batches) finds S, the first step (in tens) whose PSNR reaches
# the target. ps (bsp) and nccl end bit for bit where that process ends, so
# every gridsync run trains S steps (a codec run max(S, --max-steps / 2)).
# Worker 0 evaluates every 10 steps (under ps and hybrid after pulling the
# whole model), not timed, like DDP; the time to target is the training time
# of the first evaluation at or above it. DDP stops at the target.
#
# Needs root (namespaces). Traffic stays in the namespaces it creates.
set -euo pipefail
SRC=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${GRIDSYNC_BUILD_DIR:-$SRC/build}
NET="$SRC/tools/emulate/netns-cluster.sh"
RATE=1gbit; TARGET=34; MAX=400; MODES="ps nccl hybrid ps:onebit ps:topk"; DDP=1
OUT="$SRC/out/bench-cluster"; NETARGS=(); SETS=()
while [ $# -gt 0 ]; do
  case $1 in
    --rate) RATE=$2; shift 2 ;;
    --target) TARGET=$2; shift 2 ;;
    --max-steps) MAX=$2; shift 2 ;;
    --modes) MODES=$2; shift 2 ;;
    --no-ddp) DDP=0; shift ;;
    --out) OUT=$2; shift 2 ;;
    --cpu-of|--rate-of) NETARGS+=("$1" "$2" "$3"); shift 3 ;;
    --set) SETS+=(--set "$2"); shift 2 ;;
    *) sed -n '2,25p' "$0"; exit 2 ;;
  esac
done
"$NET" can
mkdir -p "$OUT"
NAME="gsbc$$"
cleanup() { "$NET" down "$NAME"; }
trap cleanup EXIT
# Each node gets one core (100% CPU quota) unless told otherwise: the two
# namespaces share this machine's cores.
"$NET" up "$NAME" 2 --rate "$RATE" --cpu-of 0 100 --cpu-of 1 100 "${NETARGS[@]}"
A=$("$NET" addr 0); B=$("$NET" addr 1)
GS="$BUILD/tools/gridsync"; BENCH="$BUILD/tools/gridsync-bench"

base_config() {  # file
  cat > "$1" <<JSON
{
  "encoding": {"n_levels": 16, "n_features_per_level": 2, "log2_hashmap_size": 19,
               "base_resolution": 16, "per_level_scale": 1.5},
  "network": {"n_neurons": 64, "n_hidden_layers": 2},
  "distributed": {
    "enable": true, "world_size": 2, "master_addr": "$A", "master_port": 29800,
    "gradient_sync": "ps", "timeout_s": 120,
    "nodes": [{"name": "a", "host": "$A", "workers": 1}, {"name": "b", "host": "$B", "workers": 1}]
  },
  "ps": {"shards": 2},
  "training": {"batch_size": 16384, "learning_rate": 0.01, "steps": $MAX, "log_every": 0, "threads": 1},
  "task": {"output": "$OUT/out"},
  "security": {"keys_dir": "$OUT/keys"}
}
JSON
}
base_config "$OUT/base.json"
rm -rf "$OUT/keys"; "$GS" keygen "$OUT/keys" > /dev/null  # CURVE on the data plane (auto: two machines)

# 1. One process: steps to the target (and the raw image for the peer).
evals=$(seq -s, 10 10 "$MAX")
"$BENCH" train -c "$OUT/base.json" --steps "$MAX" --eval-steps "$evals" --vs-torch --torch-steps 1 \
  --json "$OUT/single.json" "${SETS[@]}" --set compression.pull=false > "$OUT/single.txt" 2> "$OUT/single.err"
read -r S SPS1 <<< "$(python3 - "$OUT/single.json" "$TARGET" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))["gridsync"]
at = sorted((int(k), v) for k, v in j["psnr_at"].items())
hit = [s for s, p in at if p >= float(sys.argv[2])]
print(hit[0] if hit else 0, j["samples_per_s"] if "samples_per_s" in j else j.get("samples_per_second", 0))
PY
)"
if [ "$S" = 0 ]; then echo "one process does not reach $TARGET dB within $MAX steps; raise --max-steps"; exit 1; fi
echo "# one process reaches $TARGET dB at step $S (evaluated every 10 steps), $SPS1 samples/s"

link_bytes() {  # node -> "tx rx"
  ip netns exec "$NAME-n$1" sh -c 'cat /sys/class/net/eth0/statistics/tx_bytes /sys/class/net/eth0/statistics/rx_bytes' | tr '\n' ' '
}

RESULTS="$OUT/results.csv"
echo "run,steps,psnr_db,seconds_to_target,samples_per_s,push_B_per_step,pull_B_per_step,link_a_tx_B_per_step,link_a_rx_B_per_step,comm_share" > "$RESULTS"
CURVES="$OUT/curves.csv"
echo "run,step,seconds,psnr_db" > "$CURVES"

run_gridsync() {  # mode[:codec]
  local mode=${1%%:*} codec=none
  [[ $1 == *:* ]] && codec=${1#*:}
  local steps=$S
  # A lossy codec may need more steps than the bit-exact modes.
  if [ "$codec" != none ] && [ $((MAX / 2)) -gt "$S" ]; then steps=$((MAX / 2)); fi
  local sets=(--set "distributed.gradient_sync=$mode" --set "training.steps=$steps" --set "compression.codec=$codec")
  read -r atx arx <<< "$(link_bytes 0)"
  local extra=()
  # compression.pull applies to codec runs only (refused with codec none).
  if [ "$codec" = none ]; then extra=(--set compression.pull=false); fi
  "$NET" exec "$NAME" 0 "$GS" launch "$OUT/base.json" --node a "${sets[@]}" "${SETS[@]}" "${extra[@]}" \
    --rank0-arg=--eval-every --rank0-arg=10 > "$OUT/$1-a.log" 2>&1 &
  local pa=$!
  "$NET" exec "$NAME" 1 "$GS" launch "$OUT/base.json" --node b "${sets[@]}" "${SETS[@]}" "${extra[@]}" > "$OUT/$1-b.log" 2>&1 &
  local pb=$! ra=0 rb=0
  wait $pa || ra=$?; wait $pb || rb=$?
  read -r btx brx <<< "$(link_bytes 0)"
  if [ $ra -ne 0 ] || [ $rb -ne 0 ]; then
    echo "$1: failed ($ra, $rb); logs in $OUT/$1-a.log, $OUT/$1-b.log"; return
  fi
  grep -E '^\[worker-0\] \{' "$OUT/$1-a.log" | tail -1 | sed 's/^\[worker-0\] //' > "$OUT/$1.json"
  python3 - "$OUT/$1.json" "$1" "$steps" "$TARGET" "$((btx - atx))" "$((brx - arx))" "$CURVES" >> "$RESULTS" <<'PY'
import json, sys
j = json.load(open(sys.argv[1])); run, steps, target = sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
tx, rx = int(sys.argv[5]), int(sys.argv[6])
t = j["train_seconds"]
curve = j.get("psnr_curve", [])
with open(sys.argv[7], "a") as f:
    for step, secs, psnr in curve:
        f.write(f"{run},{step},{secs:.3f},{psnr:.3f}\n")
hit = [secs for step, secs, psnr in curve if psnr >= target]
reached = hit[0] if hit else (t if j["psnr_db"] >= target else float("nan"))
print(f'{run},{steps},{j["psnr_db"]:.2f},{reached:.2f},{j["samples_per_second"]:.0f},'
      f'{j["bytes_pushed_per_step"]:.0f},{j["bytes_pulled_per_step"]:.0f},{tx/steps:.0f},{rx/steps:.0f},'
      f'{j["comm_seconds"]/t:.3f}')
PY
  tail -1 "$RESULTS"
}

for m in $MODES; do run_gridsync "$m"; done

if [ "$DDP" = 1 ]; then
  PEER="$SRC/tools/peers/torch_hashgrid.py"
  peer_args=(--image-raw /tmp/gridsync-bench/image.f32 --width 512 --height 600 --batch 16384
             --steps 5000 --lr 0.01 --threads 1 --log-every 0 --target-psnr "$TARGET" --eval-every 10
             --ddp-world 2 --ddp-master "$A:29900" --ddp-timeout 600)
  read -r atx arx <<< "$(link_bytes 0)"
  GLOO_SOCKET_IFNAME=eth0 "$NET" exec "$NAME" 0 /usr/bin/python3 "$PEER" "${peer_args[@]}" --ddp-rank 0 > "$OUT/ddp-a.json" 2> "$OUT/ddp-a.log" &
  pa=$!
  GLOO_SOCKET_IFNAME=eth0 "$NET" exec "$NAME" 1 /usr/bin/python3 "$PEER" "${peer_args[@]}" --ddp-rank 1 > "$OUT/ddp-b.json" 2> "$OUT/ddp-b.log" &
  pb=$!
  wait $pa || echo "DDP rank 0 failed: see $OUT/ddp-a.log"; wait $pb || echo "DDP rank 1 failed: see $OUT/ddp-b.log"
  read -r btx brx <<< "$(link_bytes 0)"
  python3 - "$OUT/ddp-a.json" "$((btx - atx))" "$((brx - arx))" "$CURVES" >> "$RESULTS" <<'PY'
import json, sys
j = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
steps = j["steps"]; tx, rx = int(sys.argv[2]), int(sys.argv[3])
with open(sys.argv[4], "a") as f:
    for step, secs, psnr in j.get("history", []):
        f.write(f"ddp-gloo,{step},{secs:.3f},{psnr:.3f}\n")
reached = j["seconds_to_target"] if j["seconds_to_target"] is not None else float("nan")
print(f'ddp-gloo,{steps},{j["psnr"]:.2f},{reached:.2f},{j["samples_per_s"]:.0f},'
      f'{j["grad_bytes_per_step"]},{j["grad_bytes_per_step"]},{tx/steps:.0f},{rx/steps:.0f},nan')
PY
  tail -1 "$RESULTS"
fi

python3 - "$RESULTS" "$S" "$SPS1" <<'PY'
import csv, math, sys
rows = list(csv.DictReader(open(sys.argv[1])))
S, sps1 = int(sys.argv[2]), float(sys.argv[3])
one_node = S * 16384 / sps1 if sps1 > 0 else float("nan")
ddp = next((float(r["seconds_to_target"]) for r in rows if r["run"] == "ddp-gloo"), float("nan"))
print(f"\n# time to target: one node (one process, one core) {one_node:.1f} s")
print(f"{'run':12} {'steps':>5} {'PSNR':>6} {'s->target':>9} {'vs DDP':>7} {'vs 1 node':>9} {'samples/s':>9} "
      f"{'push MB':>8} {'pull MB':>8} {'link tx MB':>10} {'link rx MB':>10} {'comm':>5}")
for r in rows:
    t = float(r["seconds_to_target"])
    print(f"{r['run']:12} {r['steps']:>5} {float(r['psnr_db']):6.2f} {t:9.1f} "
          f"{(ddp / t if t == t and ddp == ddp else float('nan')):6.1f}x {(one_node / t if t == t else float('nan')):8.2f}x "
          f"{float(r['samples_per_s']):9.0f} {float(r['push_B_per_step'])/1e6:8.3f} {float(r['pull_B_per_step'])/1e6:8.3f} "
          f"{float(r['link_a_tx_B_per_step'])/1e6:10.3f} {float(r['link_a_rx_B_per_step'])/1e6:10.3f} "
          f"{float(r['comm_share']):5.2f}")
PY
# PSNR against training time, one line per run.
if command -v gnuplot > /dev/null; then
  runs=$(tail -n +2 "$CURVES" | cut -d, -f1 | awk '!seen[$0]++')
  plot=""
  for r in $runs; do
    grep "^$r," "$CURVES" > "$OUT/curve-$r.csv"
    plot+="${plot:+, }'$OUT/curve-$r.csv' using 3:4 with linespoints title '$r'"
  done
  gnuplot <<GP || echo "# gnuplot failed; the curves are in $CURVES"
set terminal png size 1000,650
set output '$OUT/curves.png'
set datafile separator ','
set xlabel 'training time (s, evaluations excluded)'
set ylabel 'PSNR (dB)'
set title 'PSNR against time, 2 emulated nodes at $RATE'
set key bottom right
set grid
set arrow from graph 0, first $TARGET to graph 1, first $TARGET nohead dashtype 2
plot $plot
GP
  echo "# plot: $OUT/curves.png"
else
  echo "# gnuplot not installed: no plot (curves in $CURVES)"
fi
echo "# CSV: $RESULTS, curves: $CURVES"
