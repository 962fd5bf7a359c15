#!/bin/bash
# One worker and one PS shard as separate processes on loopback, each pinned
# to a core of its own, as on two machines whose worker waits are idle: the
# setting in which work moved into a worker's waits shows (the one-process
# `gridsync-bench compress --train` shares both cores between worker and
# shard, so no wait is idle there). Runs configs/local.json with one worker
# and one shard, alternating the given binary folders (A/B), for each codec
# (none: Adam on the shard; any other: error feedback and Adam on the
# worker), and prints each run's train_s and PSNR, then the medians.
#
#   scripts/bench_pinned_ps.sh [-r ROUNDS] [-s STEPS] [-c CODECS] DIR...
#   scripts/bench_pinned_ps.sh -c none,onebit build        # one build tree
#   scripts/bench_pinned_ps.sh -r 4 /tmp/bins-before build  # A/B
#
# A DIR is a build tree (tools/gridsync, server/gridsync-ps, ...) or a
# folder holding gridsync, gridsync-ps, gridsync-worker and
# gridsync-coordinator side by side. Needs 2 cores; traffic stays on
# 127.0.0.1.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=3
steps=400
codecs=onebit
while getopts "r:s:c:" opt; do
  case $opt in
    r) rounds=$OPTARG ;;
    s) steps=$OPTARG ;;
    c) codecs=$OPTARG ;;
    *) exit 2 ;;
  esac
done
shift $((OPTIND - 1))
if [ $# -eq 0 ]; then
  echo "usage: $0 [-r ROUNDS] [-s STEPS] [-c CODECS] BIN_DIR..." >&2
  exit 2
fi
if [ "$(nproc)" -lt 2 ]; then
  echo "bench_pinned_ps: needs 2 cores (one for the worker, one for the shard)" >&2
  exit 2
fi
work=$(mktemp -d /tmp/gridsync-pinned.XXXXXX)
launcher=
cleanup() {
  if [ -n "$launcher" ]; then
    kill "$launcher" 2>/dev/null || true
    wait "$launcher" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
# The binaries of each DIR side by side (gridsync launch --bin-dir).
bins=()
for dir in "$@"; do
  folder=$dir
  if [ -x "$dir/tools/gridsync" ]; then
    folder="$work/bins-${#bins[@]}"
    mkdir -p "$folder"
    cp "$dir/tools/gridsync" "$dir/server/gridsync-ps" "$dir/server/gridsync-coordinator" \
      "$dir/worker/gridsync-worker" "$folder/"
  fi
  for b in gridsync gridsync-ps gridsync-worker gridsync-coordinator; do
    [ -x "$folder/$b" ] || { echo "bench_pinned_ps: $dir: no $b" >&2; exit 2; }
  done
  bins+=("$folder")
done

# The pid of the child of $1 running the binary named $2, or nothing (from
# /proc: pgrep's procps is not in every image, util-linux's taskset is).
child_running() {
  local d
  for d in /proc/[0-9]*; do
    [ "$(awk '{print $4}' "$d/stat" 2>/dev/null)" = "$1" ] || continue
    [ "$(basename "$(readlink "$d/exe" 2>/dev/null)")" = "$2" ] && echo "${d#/proc/}" && return
  done
  return 0
}

# One run; prints "train_s psnr".
run_one() {
  local dir=$1 codec=$2 out="$work/run"
  rm -rf "$out" && mkdir -p "$out"
  local extra=()
  if [ "$codec" != none ]; then
    # Error feedback as the codec's default (on but for qsgd and randomk,
    # where it is refused: it diverges).
    extra=(--set "compression.codec=$codec" --set ps.optimizer=worker)
  fi
  "$dir/gridsync" launch configs/local.json --bin-dir "$dir" --set distributed.world_size=1 \
    --set ps.shards=1 --set "training.steps=$steps" --set training.batch_size=4096 \
    --set training.threads=1 --set "task.output=$out" "${extra[@]}" >"$out/log" 2>&1 &
  launcher=$!
  # Pin each process (all its threads) once it runs: the worker to core 0,
  # the shard to core 1. Every wait has its limit.
  local ps= worker= i
  for i in $(seq 1 100); do
    ps=$(child_running "$launcher" gridsync-ps)
    worker=$(child_running "$launcher" gridsync-worker)
    [ -n "$ps" ] && [ -n "$worker" ] && break
    sleep 0.1
  done
  if [ -z "$ps" ] || [ -z "$worker" ]; then
    echo "bench_pinned_ps: the shard or the worker did not start within 10 s; log:" >&2
    cat "$out/log" >&2
    exit 1
  fi
  taskset -a -p -c 1 "$ps" >/dev/null
  taskset -a -p -c 0 "$worker" >/dev/null
  local rc=0
  wait "$launcher" || rc=$?
  launcher=
  if [ $rc -ne 0 ]; then
    echo "bench_pinned_ps: the run failed (exit $rc); log:" >&2
    cat "$out/log" >&2
    exit 1
  fi
  grep -o '"psnr_db":[0-9.]*\|"train_seconds":[0-9.]*' "$out/log" | tail -2 |
    sed 's/.*://' | tr '\n' ' ' | awk '{print $2, $1}'
}

echo "# bench_pinned_ps: 1 worker (core 0) + 1 shard (core 1), loopback, $steps steps, batch 4096, $rounds rounds alternated"
echo "# codec  bin_dir  round  train_s  psnr_dB"
declare -A times
IFS=, read -r -a codec_list <<<"$codecs"
for codec in "${codec_list[@]}"; do
  for round in $(seq 1 "$rounds"); do
    for i in "${!bins[@]}"; do
      run_one "${bins[$i]}" "$codec" >"$work/result"  # not a subshell: its exit ends the script
      read -r t p <"$work/result"
      dir=${*:$((i + 1)):1}
      printf '%-7s %s %d %s %s\n' "$codec" "$dir" "$round" "$t" "$p"
      times["$codec $dir"]+="$t "
    done
  done
done
echo "# medians of train_s"
for codec in "${codec_list[@]}"; do
  for dir in "$@"; do
    median=$(echo ${times["$codec $dir"]} | tr ' ' '\n' | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}')
    printf '%-7s %s %s\n' "$codec" "$dir" "$median"
  done
done
