# Shared by the real-fault suites (tests/fault_test.sh, all of them;
# tests/fault_rejoin_smoke.sh, the live rejoins that scripts/sanitize.sh runs
# under ASan/UBSan in the test command): the helpers, the cluster they run,
# the variants and one live rejoin checked bit for bit.
#
# Sourced, not run, by a script that sets BUILD (the build tree) and
# PORT_BASE (its ports: PORT_BASE + 4 x (pid mod 1000), master_port then
# one a shard). Sets GS (the gridsync binary), WORK (a scratch folder) and
# PORT; on exit kills what runs on WORK's cluster and removes WORK.

GS="$BUILD/tools/gridsync"
WORK=$(mktemp -d)
PORT=$((PORT_BASE + ($$ % 1000) * 4))
cleanup() { pkill -KILL -f "$WORK/cluster.json" 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT

failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
# Waits (at most 120 s) until FILE has a line matching PATTERN, or until
# process PID (optional) is gone.
wait_for_line() {
  for _ in $(seq 1 1200); do
    grep -q "$2" "$1" && return 0
    if [ -n "${3:-}" ] && ! kill -0 "$3" 2>/dev/null; then grep -q "$2" "$1"; return; fi
    sleep 0.1
  done
  return 1
}

# bsp, 2 workers, 2 shards, a checkpoint every 50 of 300 steps.
write_fault_cluster() {
  cat > "$WORK/cluster.json" <<JSON
{
  "encoding": {"n_levels": 12, "log2_hashmap_size": 16},
  "network": {"n_neurons": 32, "n_hidden_layers": 1},
  "distributed": {"enable": true, "world_size": 2, "master_port": $PORT, "gradient_sync": "ps",
                  "timeout_s": 20},
  "ps": {"shards": 2, "threads": 1},
  "training": {"batch_size": 4096, "steps": 300, "log_every": 0},
  "task": {"output": "$WORK/out"},
  "checkpoint": {"every_steps": 50, "dir": "$WORK/ckpt"}
}
JSON
}

# The variants: onebit (Adam and error feedback on the workers, whose state
# is in the checkpoints too); hybrid (both workers on one node, so a
# restarted worker is one of the node's collective); compression.pull (the
# shards answer pulls with deltas against a replica of each worker's
# parameters, and both ends checkpoint theirs).
codec_set=(--set compression.codec=onebit --set compression.min_bytes=0)
hybrid_set=(--set distributed.gradient_sync=hybrid)
pull_set=("${codec_set[@]}" --set compression.pull=true)

# An uninterrupted run of the variant's flags (its own checkpoint folder,
# emptied first: it must hold no other run's), its final parameters to OUT.
clean_run() {  # clean_run OUT LABEL [FLAGS...]
  local out=$1 label=$2
  shift 2
  rm -rf "$WORK/ckpt-clean"
  "$GS" launch "$WORK/cluster.json" "$@" --set checkpoint.dir="$WORK/ckpt-clean" \
    --rank0-arg=--dump-params --rank0-arg="$out" > "${out%.bin}.log" 2>&1 ||
    { fail "the uninterrupted $label run failed"; tail -20 "${out%.bin}.log"; }
}

# Live rejoin: SIGKILL of shard 1 (or worker 1, or both workers) after the
# checkpoint of step 150, and the launcher restarts it (--max-restarts, as
# systemd's Restart=on-failure would). It rejoins from the newest step every
# part holds, the job rolls back to it without stopping, and it ends bit for
# bit where the variant's uninterrupted run ends ($WORK/clean*.bin, made
# first). RUN is VARIANT:VICTIM: plain, onebit, pull, hybrid or
# hybrid-onebit; ps-1, worker-1 or workers.
live_rejoin() {  # live_rejoin RUN
  local run=$1 victim variant tag extra clean pattern log start launcher rc others said step
  victim=${run#*:}; variant=${run%:*}; tag="$variant-$victim"
  extra=(); clean="$WORK/clean.bin"
  if [ "$variant" = onebit ]; then extra=("${codec_set[@]}"); clean="$WORK/clean-codec.bin"; fi
  if [ "$variant" = pull ]; then extra=("${pull_set[@]}"); clean="$WORK/clean-pull.bin"; fi
  if [ "$variant" = hybrid ]; then extra=("${hybrid_set[@]}"); clean="$WORK/clean-hybrid.bin"; fi
  if [ "$variant" = hybrid-onebit ]; then
    extra=("${hybrid_set[@]}" "${codec_set[@]}"); clean="$WORK/clean-hybrid-codec.bin"
  fi
  pattern="gridsync-ps --shard 1 --config $WORK/cluster.json"
  [ "$victim" = worker-1 ] && pattern="gridsync-worker --rank 1 --config $WORK/cluster.json"
  # Both at once: the coordinator drops the collective's keys with the last
  # worker, the outcome of the backend vote (collective auto) included.
  [ "$victim" = workers ] && pattern="gridsync-worker --rank [01] --config $WORK/cluster.json"
  log="$WORK/rejoin-$tag.log"
  rm -rf "$WORK/ckpt"
  start=$(date +%s)
  "$GS" launch "$WORK/cluster.json" "${extra[@]}" --max-restarts 1 --rank0-arg=--dump-params \
    --rank0-arg="$WORK/rejoined-$tag.bin" > "$log" 2>&1 &
  launcher=$!
  wait_for_line "$log" "\[ps-1\].*checkpoint at step 150 written" || true
  pkill -KILL -f "$pattern" || fail "$tag: $victim was not running after the checkpoint of step 150"
  rc=0; wait $launcher || rc=$?
  # Every process that lived through it says it rolled back.
  others=2; [ "$victim" = worker-1 ] && others=1
  said=$victim
  if [ "$victim" = workers ]; then
    # Whichever rejoins first may see the other's rejoin as a rollback and
    # carry on from there: 0 or 1 of them says so.
    said=worker-1; others=$(grep -c "\[worker-[01]\].*carries on from there" "$log" || true)
  fi
  if [ $rc -ne 0 ]; then
    fail "$tag: the run did not survive the restart of $victim (exit $rc)"
    grep -v "step [0-9]*/" "$log" | tail -15
  elif ! grep -q "\[$said\].*\(rejoining it\|rejoined job\)" "$log" ||
       ! grep -q "\[ps-0\].*rolled back to step" "$log" ||
       [ "$(grep -c "\[worker-[01]\].*carries on from there" "$log")" -ne $others ]; then
    fail "$tag: the restarted $victim, shard 0 and the other workers did not all say they rolled back"
    grep -v "step [0-9]*/" "$log" | tail -15
  elif ! cmp -s "$clean" "$WORK/rejoined-$tag.bin"; then
    fail "$tag: after the live rejoin the final parameters differ from the uninterrupted run's"
  else
    step=$(grep -o "rolled back to step [0-9]*" "$log" | head -1 | grep -o "[0-9]*$")
    echo "ok: $tag: SIGKILL of $victim, restarted by the launcher, rejoined from step $step; the job rolled back and ended bit for bit as the uninterrupted run ($(( $(date +%s) - start )) s in all)"
  fi
}
