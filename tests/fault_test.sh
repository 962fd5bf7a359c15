#!/usr/bin/env bash
# Real faults on a real multi-process cluster (gridsync launch, bsp, 2 workers,
# 2 shards, checkpoints every 50 steps):
#  1. SIGKILL shard 1 once it wrote the checkpoint of step 150 (of 300); the
#     launcher fails naming it; `gridsync launch --resume` continues from the
#     newest complete checkpoint, and the job ends with exactly the parameters
#     of an uninterrupted run.
#     A fresh start into that folder is refused and leaves it intact.
#     1c. A resume of a step whose parts two runs wrote is refused.
#  2. A crash in the middle of writing a checkpoint (a .tmp file, no manifest)
#     leaves the previous checkpoint in use.
#  3. A corrupted newest checkpoint is passed over by --resume, naming the
#     file and the checksum; with none intact the resume is refused (exit 3).
#  4. SIGKILL of the coordinator: the run fails within timeout_s and the
#     checkpoints stay intact (a resume again ends bit for bit). 4b. With
#     --max-restarts, the launcher restarts it; it serves the job it kept
#     (checkpoint.dir/coordinator-state.json), the shards and workers that
#     failed without it are restarted and rejoin, and the job ends bit for
#     bit as the uninterrupted run. 4c. Under systemd's rules by hand: the
#     shards exit 1, the workers 4 (the code their unit restarts on); all
#     started again, they rejoin and the job ends bit for bit.
#  5. Async: SIGKILL of a worker makes the other fail within 5 s, naming it.
#  6. With a codec (onebit: Adam and error feedback on the workers), the
#     workers' own state is in the checkpoints too: SIGKILL of worker 1 after
#     step 150, and --resume ends bit for bit where the uninterrupted run
#     ends.
#  7. Live rejoin: SIGKILL of shard 1 or worker 1 after step 150; the
#     launcher restarts it, it rejoins from the checkpoint, the job rolls back
#     without stopping and ends bit for bit as the uninterrupted run (plain
#     and onebit, and onebit with compression.pull, whose delta pulls'
#     replicas both ends checkpoint; ps, and hybrid, whose node collective is formed again with
#     the restarted worker, plain and onebit; and hybrid with both workers
#     killed at once, whose restarted workers vote on the backend again).
#     7e. A restarted shard or worker whose newest step fails its checksum
#     rejoins from the older step every part holds; the job ends bit for bit
#     (ps, onebit, hybrid with onebit, compression.pull; and a live shard
#     whose files fail in the rollback). 7f. A live shard whose files of the
#     rollback's step are another run's exits 3 and is not restarted.
#     7b. A frozen shard (SIGSTOP) is killed by the launcher's watchdog and
#     restarted into the same rejoin; 7c. so is a frozen worker. 7d. One
#     killed before the first complete checkpoint is refused once restarted
#     (exit 5), and the launcher stops instead of spending its restarts.
#  8. A shard that lost its coordinator (SIGKILL, or SIGSTOP so that calls
#     time out) exits failed within seconds, naming it, for its supervisor to
#     restart it into the rejoin of 7. 8c. A closed terminal (SIGHUP to the
#     launcher's process group) stops the cluster: exit 129, no child dies of
#     SIGHUP, none is left; so does a SIGHUP before anything started.
#  9. gradient_sync nccl (no shards: every worker checkpoints its model and
#     Adam state): SIGKILL of worker 1 after its checkpoint of step 150; the
#     launcher fails naming it, and --resume ends bit for bit where the
#     uninterrupted run ends. 9a. A resume whose workers' files are not one
#     replica (one from another step) is refused, naming the worker. 9b. No
#     live rejoin: --max-restarts restarts
#     the whole job from the newest complete checkpoint (bit for bit again),
#     and a worker restarted afresh into the running job is refused.
set -euo pipefail
BUILD=${1:?usage: fault_test.sh BUILD_DIR}
# Below the ephemeral range (32768 and up), clear of ps_test and allreduce_test.
PORT_BASE=28000
. "$(dirname "$0")/fault_lib.sh"
write_fault_cluster

# The uninterrupted run (its own checkpoint folder).
"$GS" launch "$WORK/cluster.json" --set checkpoint.dir="$WORK/ckpt-clean" \
  --rank0-arg=--dump-params --rank0-arg="$WORK/clean.bin" > "$WORK/clean.log" 2>&1 ||
  { fail "the uninterrupted run failed"; tail -20 "$WORK/clean.log"; exit 1; }

# 1. Kill shard 1 after its checkpoint of step 150.
"$GS" launch "$WORK/cluster.json" > "$WORK/faulty.log" 2>&1 &
launcher=$!
wait_for_line "$WORK/faulty.log" "\[ps-1\].*checkpoint at step 150 written" || true
if ! pkill -KILL -f "gridsync-ps --shard 1 --config $WORK/cluster.json"; then
  fail "shard 1 was not running when its checkpoint of step 150 was written"
fi
rc=0; wait $launcher || rc=$?
if [ $rc -eq 0 ]; then
  fail "the run with a killed shard exited 0 (it finished before the kill?)"
elif ! grep -q "ps-1 (pid [0-9]*) failed: killed by signal" "$WORK/faulty.log"; then
  fail "the launcher did not name the killed shard"; tail -5 "$WORK/faulty.log"
else
  echo "ok: SIGKILL of shard 1 after step 150: the launcher failed naming it (exit $rc)"
fi
ls "$WORK/ckpt" | grep "^step-" > "$WORK/steps.txt"

# 1b. A fresh start (no --resume) into that folder would delete the killed
# run's checkpoints with its first one: refused (exit 3) before anything
# starts, naming the folder and the steps; the files stay. A shard started
# by hand against a new coordinator that forgot the job (--fresh) refuses
# the same way; against one restarted with the job it kept, it rejoins.
find "$WORK/ckpt" -type f | sort > "$WORK/files.txt"
# (A copy as the killed run left it, for the restarted coordinator below:
# --fresh rewrites the coordinator's state file.)
cp -r "$WORK/ckpt" "$WORK/ckpt-kept"
rc=0; "$GS" launch "$WORK/cluster.json" > "$WORK/fresh.log" 2>&1 || rc=$?
if [ $rc -ne 3 ] || ! grep -q "holds checkpoints this job did not write" "$WORK/fresh.log"; then
  fail "a fresh launch into a folder with another run's checkpoints: exit $rc"; tail -3 "$WORK/fresh.log"
elif ! diff -q <(find "$WORK/ckpt" -type f | sort) "$WORK/files.txt" > /dev/null; then
  fail "the refused fresh launch changed the checkpoint folder: $(ls "$WORK/ckpt" | tr '\n' ' ')"
else
  "$BUILD/server/gridsync-coordinator" --fresh --config "$WORK/cluster.json" > "$WORK/fresh-coord.log" 2>&1 &
  coord=$!
  rc=0; timeout 60 "$BUILD/server/gridsync-ps" --shard 1 --config "$WORK/cluster.json" \
    > "$WORK/fresh-ps.log" 2>&1 || rc=$?
  kill -KILL $coord 2>/dev/null || true; wait $coord 2>/dev/null || true
  if [ $rc -ne 3 ] || ! grep -q "shard 1 (coordinator .*): shard-1: the coordinator knows no job of these checkpoints" "$WORK/fresh-ps.log"; then
    fail "a fresh shard into that folder: exit $rc"; tail -3 "$WORK/fresh-ps.log"
  elif ! diff -q <(find "$WORK/ckpt" -type f | sort) "$WORK/files.txt" > /dev/null; then
    fail "the refused fresh shard changed the checkpoint folder"
  else
    echo "ok: a fresh start into the killed run's folder is refused (launch and shard, exit 3), its checkpoints intact: $(grep -o 'shard-0 (step [0-9, ]*)' "$WORK/fresh.log")"
  fi
fi
# The coordinator that served the killed run kept its job: restarted
# (without --fresh), a shard started afresh rejoins it from the newest step
# every part holds. On the copy: rejoining removes the shard's later steps.
kept=(--set checkpoint.dir="$WORK/ckpt-kept")
"$BUILD/server/gridsync-coordinator" --config "$WORK/cluster.json" "${kept[@]}" > "$WORK/kept-coord.log" 2>&1 &
coord=$!
"$BUILD/server/gridsync-ps" --shard 1 --config "$WORK/cluster.json" "${kept[@]}" > "$WORK/kept-ps.log" 2>&1 &
shard=$!
if wait_for_line "$WORK/kept-ps.log" "rejoining it from the checkpoint of step" $shard &&
   grep -q "restored job 1 (epoch 0) from $WORK/ckpt-kept/coordinator-state.json" "$WORK/kept-coord.log"; then
  echo "ok: a restarted coordinator serves the job it kept: $(grep -o 'rejoining it from the checkpoint of step [0-9]*' "$WORK/kept-ps.log")"
else
  fail "a shard did not rejoin the job a restarted coordinator kept"
  tail -n 3 "$WORK/kept-coord.log" "$WORK/kept-ps.log"
fi
kill -KILL $shard $coord 2>/dev/null || true; wait $shard $coord 2>/dev/null || true
rm -rf "$WORK/ckpt-kept"

# 1c. A step whose parts belong to different runs: shard 1's files of step
# 150 taken from another run (checksums intact). The launcher reads the
# runs the manifests name (common/checkpoint_run.h; every part compares
# them again through the coordinator, across machines): refused with exit 3
# before anything starts, naming the part and both runs; it resumed with
# exit 0 and mixed two runs before.
"$GS" launch "$WORK/cluster.json" --set checkpoint.dir="$WORK/ckpt-other" \
  --set training.steps=150 > "$WORK/other.log" 2>&1 || fail "the other run failed"
cp -r "$WORK/ckpt" "$WORK/ckpt-mixed"
cp "$WORK/ckpt-other/step-150/shard-1.bin" "$WORK/ckpt-other/step-150/shard-1.json" \
  "$WORK/ckpt-mixed/step-150/"
rc=0; "$GS" launch "$WORK/cluster.json" --set checkpoint.dir="$WORK/ckpt-mixed" --resume \
  > "$WORK/mixed.log" 2>&1 || rc=$?
if [ $rc -eq 3 ] && grep -q "the files of shard-1 (run [0-9a-f]*) in $WORK/ckpt-mixed/step-150 belong to another run than those of shard-0 (run" \
    "$WORK/mixed.log"; then
  echo "ok: --resume with shard 1's files of another run: refused (exit $rc), naming shard-1"
else
  fail "--resume with parts of two runs: exit $rc"; grep -v "step [0-9]*/" "$WORK/mixed.log" | tail -5
fi
rm -rf "$WORK/ckpt-other" "$WORK/ckpt-mixed"

# 2. A checkpoint whose writing crashed: data half written, no manifests.
mkdir -p "$WORK/ckpt/step-999"
head -c 1000 /dev/urandom > "$WORK/ckpt/step-999/shard-0.bin.tmp"

if "$GS" launch "$WORK/cluster.json" --resume --rank0-arg=--dump-params \
    --rank0-arg="$WORK/resumed.bin" > "$WORK/resumed.log" 2>&1; then
  step=$(grep -o "resuming from the checkpoint of step [0-9]*" "$WORK/resumed.log" | grep -o "[0-9]*$")
  if [ -z "$step" ] || [ "$step" -lt 150 ] || [ "$step" -eq 999 ]; then
    fail "resumed from step '${step}'; expected 150 or later, never the incomplete 999"
  elif cmp -s "$WORK/clean.bin" "$WORK/resumed.bin"; then
    echo "ok: resumed from step $step (checkpoints: $(tr '\n' ' ' < "$WORK/steps.txt")); the final parameters equal the uninterrupted run's, bit for bit"
  else
    fail "the resumed run's final parameters differ from the uninterrupted run's"
  fi
else
  fail "gridsync launch --resume failed"; tail -20 "$WORK/resumed.log"
fi

# 3. A corrupted checkpoint: --resume passes the newest step over, naming
# the file and its checksum, and resumes from the older complete step (it
# was refused, and the run lost, though an intact older step was there);
# with no intact step left it is refused before anything starts (exit 3).
steps=$(ls -d "$WORK"/ckpt/step-* | grep -v step-999 | sort -t- -k2 -n)
latest=$(echo "$steps" | tail -1)
older=$(echo "$steps" | tail -2 | head -1); older=${older##*step-}
cp -r "$WORK/ckpt" "$WORK/ckpt-bad"
printf '\xff' | dd of="$latest/shard-0.bin" bs=1 seek=100 conv=notrunc status=none
# (The newest step is the run's last: more steps, so that the resume loads
# it rather than being refused for having nothing left to train.)
rc=0
"$GS" launch "$WORK/cluster.json" --resume --set training.steps=400 > "$WORK/corrupt.log" 2>&1 || rc=$?
if [ $rc -ne 0 ]; then
  fail "a corrupted newest checkpoint was not passed over (exit $rc)"; tail -5 "$WORK/corrupt.log"
elif ! grep -q "shard-0.bin: checksum [0-9a-f]*; the manifest says [0-9a-f]*.*passed over" "$WORK/corrupt.log" ||
     ! grep -q "resuming from the older complete step $older instead" "$WORK/corrupt.log"; then
  fail "the resume past a corrupted checkpoint did not name its checksum and the older step"
  grep "gridsync launch" "$WORK/corrupt.log" | tail -5
elif [ ! -f "$latest/shard-0.bin.damaged" ]; then
  # The resumed processes remove the steps after the one they load: the
  # damaged file went with them, leaving nothing to look at. (The resumed
  # run may write that step again beside it.)
  fail "the corrupted shard-0.bin of ${latest##*/} was not kept as shard-0.bin.damaged"
  ls "$latest" 2>&1 | head -5
else
  echo "ok: a corrupted newest checkpoint is passed over, naming its checksum; resumed from step $older"
fi
for step_dir in $(ls -d "$WORK"/ckpt-bad/step-* | grep -v step-999); do
  printf '\xff' | dd of="$step_dir/shard-0.bin" bs=1 seek=100 conv=notrunc status=none
done
rc=0
"$GS" launch "$WORK/cluster.json" --resume --set training.steps=400 \
  --set checkpoint.dir="$WORK/ckpt-bad" > "$WORK/corrupt-all.log" 2>&1 || rc=$?
if [ $rc -ne 3 ]; then
  fail "a folder of corrupted checkpoints only: exit $rc, not 3"; tail -5 "$WORK/corrupt-all.log"
elif ! grep -q "checksum.*no older complete step to resume from" "$WORK/corrupt-all.log"; then
  fail "the refusal of corrupted checkpoints does not name the checksum"; tail -5 "$WORK/corrupt-all.log"
elif grep -q "starting" "$WORK/corrupt-all.log"; then
  fail "the refusal of corrupted checkpoints came after processes started"
else
  echo "ok: corrupted checkpoints only: refused before anything starts (exit 3), naming the checksum"
fi
rm -rf "$WORK/ckpt-bad"

# 4. Kill the coordinator once a checkpoint exists.
rm -rf "$WORK/ckpt"
start=$(date +%s)
"$GS" launch "$WORK/cluster.json" > "$WORK/coord.log" 2>&1 &
launcher=$!
wait_for_line "$WORK/coord.log" "checkpoint at step 100 written" || true
pkill -KILL -f "gridsync-coordinator --fresh --config $WORK/cluster.json" || fail "no coordinator to kill"
rc=0; wait $launcher || rc=$?
elapsed=$(( $(date +%s) - start ))
if [ $rc -eq 0 ]; then
  fail "the run went on without its coordinator"
elif [ $elapsed -gt 60 ]; then
  fail "the run took ${elapsed} s to fail without its coordinator; allowed: timeout_s 20 plus startup"
elif "$GS" launch "$WORK/cluster.json" --resume --rank0-arg=--dump-params \
    --rank0-arg="$WORK/resumed2.bin" > "$WORK/resumed2.log" 2>&1 && cmp -s "$WORK/clean.bin" "$WORK/resumed2.bin"; then
  echo "ok: SIGKILL of the coordinator fails the run (exit $rc, ${elapsed} s in all); its checkpoints resume bit for bit"
else
  fail "resuming after the coordinator's death failed or differs"; tail -5 "$WORK/resumed2.log"
fi

# 4b. The same kill under --max-restarts (as systemd's Restart=on-failure
# would): the coordinator comes back with the job it kept; the shards and
# workers, which fail without it, are restarted and rejoin from the newest
# complete checkpoint; the job ends bit for bit as the uninterrupted run.
rm -rf "$WORK/ckpt"
start=$(date +%s)
"$GS" launch "$WORK/cluster.json" --max-restarts 2 --rank0-arg=--dump-params \
  --rank0-arg="$WORK/coord-restarted.bin" > "$WORK/coord-restart.log" 2>&1 &
launcher=$!
wait_for_line "$WORK/coord-restart.log" "\[ps-1\].*checkpoint at step 150 written" || true
pkill -KILL -f "gridsync-coordinator --fresh --config $WORK/cluster.json" || fail "4b: no coordinator to kill"
rc=0; wait $launcher || rc=$?
if [ $rc -ne 0 ]; then
  fail "4b: the run did not survive the coordinator's restart (exit $rc)"
  grep -v "step [0-9]*/" "$WORK/coord-restart.log" | tail -15
elif ! grep -q "\[coordinator\].*restored job 1 (epoch 0)" "$WORK/coord-restart.log" ||
     [ "$(grep -c "\[ps-[01]\].*rejoining it from the checkpoint" "$WORK/coord-restart.log")" -ne 2 ]; then
  fail "4b: the restarted coordinator did not restore the job, or the shards did not rejoin it"
  grep -v "step [0-9]*/" "$WORK/coord-restart.log" | tail -15
elif ! cmp -s "$WORK/clean.bin" "$WORK/coord-restarted.bin"; then
  fail "4b: after the coordinator's restart the final parameters differ from the uninterrupted run's"
else
  step=$(grep -o "rolled back to step [0-9]*" "$WORK/coord-restart.log" | head -1 | grep -o "[0-9]*$")
  # 150 once its every part published it before the kill, else 100.
  [ "$step" = 150 ] || [ "$step" = 100 ] || fail "4b: rolled back to step '$step'; expected 100 or 150"
  echo "ok: SIGKILL of the coordinator under --max-restarts: it came back with its job, every process rejoined from step $step, and the job ended bit for bit as the uninterrupted run ($(( $(date +%s) - start )) s in all)"
fi

# 4c. The same under systemd's rules, processes started by hand: without
# their coordinator the shards exit 1 and the workers exit 4
# (kCoordinatorLostExitCode, on which the worker unit restarts them,
# RestartForceExitStatus=4); started again (the coordinator without
# --fresh), every process rejoins and the job ends bit for bit as the
# uninterrupted run.
rm -rf "$WORK/ckpt"
start_units() {  # start_units TAG: coordinator, 2 shards, 2 workers
  "$BUILD/server/gridsync-coordinator" --config "$WORK/cluster.json" > "$WORK/u-coord-$1.log" 2>&1 &
  coord=$!
  pids=()
  for s in 0 1; do
    "$BUILD/server/gridsync-ps" --shard $s --config "$WORK/cluster.json" > "$WORK/u-ps$s-$1.log" 2>&1 &
    pids+=($!)
  done
  for r in 0 1; do
    # Only rank 0 holds the final model (another rank refuses --dump-params).
    dump=()
    [ $r = 0 ] && dump=(--dump-params "$WORK/units-$1-0.bin")
    "$BUILD/worker/gridsync-worker" --rank $r --config "$WORK/cluster.json" "${dump[@]}" \
      > "$WORK/u-w$r-$1.log" 2>&1 &
    pids+=($!)
  done
}
start_units first
wait_for_line "$WORK/u-ps1-first.log" "checkpoint at step 150 written" || true
kill -KILL $coord
codes=()
for pid in "${pids[@]}"; do
  rc=0; timeout 60 tail --pid=$pid -f /dev/null || true; wait $pid || rc=$?; codes+=($rc)
done
if [ "${codes[*]}" != "1 1 4 4" ]; then
  fail "4c: without their coordinator shards and workers exited ${codes[*]}; expected 1 1 4 4"
  tail -n 2 "$WORK/u-w0-first.log" "$WORK/u-ps0-first.log"
else
  start_units again
  rc=0
  for pid in "${pids[@]:2}"; do wait $pid || rc=$?; done
  kill -TERM $coord "${pids[@]:0:2}" 2>/dev/null || true
  wait $coord "${pids[@]:0:2}" 2>/dev/null || true
  if [ $rc -ne 0 ]; then
    fail "4c: the restarted processes did not finish the job (exit $rc)"
    tail -n 3 "$WORK/u-coord-again.log" "$WORK/u-w0-again.log"
  elif ! grep -q "restored job 1" "$WORK/u-coord-again.log" ||
       ! grep -q "rejoining it from the checkpoint of step" "$WORK/u-ps0-again.log"; then
    fail "4c: the coordinator did not restore its job, or shard 0 did not rejoin it"
  elif ! cmp -s "$WORK/clean.bin" "$WORK/units-again-0.bin"; then
    fail "4c: after the units' restarts the final parameters differ from the uninterrupted run's"
  else
    echo "ok: the coordinator SIGKILLed under systemd's rules: shards exited 1, workers 4 ($(grep -o 'the coordinator is gone' "$WORK/u-w1-first.log" | head -1)); started again they rejoined and the job ended bit for bit as the uninterrupted run"
  fi
fi
pkill -KILL -f "$WORK/cluster.json" 2>/dev/null || true

# 5. Async: a dead worker is noticed by the others between steps (the
# coordinator's map), within seconds, not at the end of training. The
# processes are started by hand: gridsync launch would stop everyone itself.
async_set=(--set ps.consistency=async --set ps.shards=1 --set training.steps=1000000
           --set checkpoint.every_steps=0 --set training.log_every=50)
"$BUILD/server/gridsync-coordinator" --config "$WORK/cluster.json" "${async_set[@]}" > "$WORK/a-coord.log" 2>&1 &
"$BUILD/server/gridsync-ps" --shard 0 --config "$WORK/cluster.json" "${async_set[@]}" > "$WORK/a-ps.log" 2>&1 &
"$BUILD/worker/gridsync-worker" --rank 0 --config "$WORK/cluster.json" "${async_set[@]}" > "$WORK/a-w0.log" 2>&1 &
w0=$!
"$BUILD/worker/gridsync-worker" --rank 1 --config "$WORK/cluster.json" "${async_set[@]}" > "$WORK/a-w1.log" 2>&1 &
w1=$!
wait_for_line "$WORK/a-w0.log" "step 100/" || true
sleep 1
kill -KILL $w1
killed=$(date +%s%N)
rc=0; timeout 60 tail --pid=$w0 -f /dev/null || true; wait $w0 || rc=$?
noticed_ms=$(( ($(date +%s%N) - killed) / 1000000 ))
if [ $rc -eq 0 ]; then
  fail "async worker 0 went on without worker 1"
elif ! grep -q "lost worker-1" "$WORK/a-w0.log"; then
  fail "async worker 0 failed without naming worker-1"; tail -3 "$WORK/a-w0.log"
elif [ $noticed_ms -gt 5000 ]; then
  fail "async worker 0 noticed worker 1's death after ${noticed_ms} ms; allowed: 5000"
else
  echo "ok: async worker 0 noticed worker 1's death in ${noticed_ms} ms: $(grep -o 'lost worker-1[^;]*' "$WORK/a-w0.log" | head -1)"
fi
pkill -KILL -f "$WORK/cluster.json" 2>/dev/null || true

# 6. A codec run: the workers' residuals and Adam state are checkpointed.
rm -rf "$WORK/ckpt"
clean_run "$WORK/clean-codec.bin" codec "${codec_set[@]}"
"$GS" launch "$WORK/cluster.json" "${codec_set[@]}" > "$WORK/faulty-codec.log" 2>&1 &
launcher=$!
wait_for_line "$WORK/faulty-codec.log" "\[ps-1\].*checkpoint at step 150 written" || true
sleep 0.2
pkill -KILL -f "gridsync-worker --rank 1 --config $WORK/cluster.json" ||
  fail "worker 1 was not running after the checkpoint of step 150"
rc=0; wait $launcher || rc=$?
workers_files=$(ls "$WORK"/ckpt/step-*/worker-*.json 2>/dev/null | wc -l)
# 6a. A worker holding state started afresh by hand, against a coordinator
# that knows no job of those files (--fresh), refuses as a shard does (1b):
# exit 3, which neither its unit nor gridsync launch restarts into the same
# refusal (it exited 1 before, like any failed worker); the files stay.
if [ "$workers_files" -gt 0 ]; then
  find "$WORK/ckpt" -type f ! -name 'coordinator-state*' | sort > "$WORK/files-codec.txt"
  "$BUILD/server/gridsync-coordinator" --fresh --config "$WORK/cluster.json" "${codec_set[@]}" \
    > "$WORK/fresh-codec-coord.log" 2>&1 &
  coord=$!
  rc6=0; timeout 60 "$BUILD/worker/gridsync-worker" --rank 1 --config "$WORK/cluster.json" \
    "${codec_set[@]}" > "$WORK/fresh-codec-w1.log" 2>&1 || rc6=$?
  kill -KILL $coord 2>/dev/null || true; wait $coord 2>/dev/null || true
  if [ $rc6 -ne 3 ] || ! grep -q "worker-1: the coordinator knows no job of these checkpoints" \
      "$WORK/fresh-codec-w1.log"; then
    fail "a fresh worker holding state into another run's folder: exit $rc6 (want 3)"
    tail -3 "$WORK/fresh-codec-w1.log"
  elif ! diff -q <(find "$WORK/ckpt" -type f ! -name 'coordinator-state*' | sort) \
      "$WORK/files-codec.txt" > /dev/null; then
    fail "the refused fresh worker changed the checkpoint folder"
  else
    echo "ok: a fresh worker holding state into another run's folder: refused (exit 3), naming worker-1"
  fi
fi
if [ $rc -eq 0 ]; then
  fail "the codec run with a killed worker exited 0"
elif [ "$workers_files" -eq 0 ]; then
  fail "the codec run wrote no worker checkpoints"
elif "$GS" launch "$WORK/cluster.json" "${codec_set[@]}" --resume --rank0-arg=--dump-params \
    --rank0-arg="$WORK/resumed-codec.bin" > "$WORK/resumed-codec.log" 2>&1 &&
    cmp -s "$WORK/clean-codec.bin" "$WORK/resumed-codec.bin"; then
  step=$(grep -o "resuming from the checkpoint of step [0-9]*" "$WORK/resumed-codec.log" | grep -o "[0-9]*$")
  echo "ok: onebit run (worker-side Adam and residuals): SIGKILL of worker 1, resumed from step $step; the final parameters equal the uninterrupted run's, bit for bit"
else
  fail "resuming the codec run failed or differs"; tail -5 "$WORK/resumed-codec.log"
fi

# 7. Live rejoin, 7b-7f: fault_rejoin_cases.sh.
. "$(dirname "$0")/fault_rejoin_cases.sh"

# 8. A shard whose coordinator is gone (killed, or frozen so that its calls
# time out) no longer serves unregistered: it exits failed within seconds,
# naming the coordinator, for its supervisor to restart it into the rejoin
# path above. Started by hand, with no workers: the shard serves once it is
# registered.
for how in KILL STOP; do
  lone=(--set ps.shards=1 --set checkpoint.every_steps=0)
  "$BUILD/server/gridsync-coordinator" --config "$WORK/cluster.json" "${lone[@]}" > "$WORK/l-coord.log" 2>&1 &
  coord=$!
  "$BUILD/server/gridsync-ps" --shard 0 --config "$WORK/cluster.json" "${lone[@]}" > "$WORK/l-ps.log" 2>&1 &
  shard=$!
  wait_for_line "$WORK/l-ps.log" "registered as shard 0" || fail "$how: shard 0 never registered"
  kill -$how $coord
  lost=$(date +%s%N)
  rc=0; timeout 60 tail --pid=$shard -f /dev/null || true
  kill -0 $shard 2>/dev/null && { fail "$how: shard 0 still serves 60 s after losing its coordinator"; kill -KILL $shard; }
  wait $shard || rc=$?
  exited_ms=$(( ($(date +%s%N) - lost) / 1000000 ))
  kill -KILL $coord 2>/dev/null || true; wait $coord 2>/dev/null || true
  # KILL: noticed at the next ask (at most 5 s); STOP: that ask times out
  # (10 s) first.
  limit_ms=8000; [ $how = STOP ] && limit_ms=18000
  if [ $rc -ne 1 ]; then
    fail "$how: shard 0 exited $rc after losing its coordinator; expected 1 (failed, not crashed)"
  elif ! grep -q "lost the coordinator at 127.0.0.1:$PORT" "$WORK/l-ps.log"; then
    fail "$how: shard 0 did not say it lost the coordinator"; tail -3 "$WORK/l-ps.log"
  elif [ $exited_ms -gt $limit_ms ]; then
    fail "$how: shard 0 took ${exited_ms} ms to leave; allowed ${limit_ms} ms"
  else
    echo "ok: SIG$how of the coordinator: shard 0 exited $rc after ${exited_ms} ms, naming it"
  fi
done
# And a shard stopped while its coordinator lives stops cleanly (exit 0).
"$BUILD/server/gridsync-coordinator" --config "$WORK/cluster.json" "${lone[@]}" > "$WORK/l-coord.log" 2>&1 &
coord=$!
"$BUILD/server/gridsync-ps" --shard 0 --config "$WORK/cluster.json" "${lone[@]}" > "$WORK/l-ps.log" 2>&1 &
shard=$!
wait_for_line "$WORK/l-ps.log" "registered as shard 0" || fail "TERM: shard 0 never registered"
# SIGHUP first: nothing to reload, so the shard serves on (it used to die).
kill -HUP $shard
sleep 0.3
if kill -0 $shard 2>/dev/null; then
  echo "ok: SIGHUP to a shard: still serving"
else
  fail "SIGHUP ended shard 0"
fi
kill -TERM $shard
rc=0; wait $shard || rc=$?
kill -KILL $coord 2>/dev/null || true; wait $coord 2>/dev/null || true
if [ $rc -ne 0 ] || grep -q "lost the coordinator" "$WORK/l-ps.log"; then
  fail "SIGTERM to a shard with a live coordinator: exit $rc"; tail -3 "$WORK/l-ps.log"
else
  echo "ok: SIGTERM to shard 0 with its coordinator alive: exit 0"
fi

# 8c. A closed terminal: SIGHUP to the launcher's whole process group
# mid-run. The launcher stops the cluster and exits 129 naming the signal;
# its children, started with SIGHUP blocked, log it and stop on the
# launcher's SIGTERM (none dies of SIGHUP); none is left. And a SIGHUP at
# once, before anything started, is the same exit, not a silent death.
setsid "$GS" launch "$WORK/cluster.json" --set checkpoint.every_steps=0 \
  --set training.steps=100000 > "$WORK/hup.log" 2>&1 &
launcher=$!
wait_for_line "$WORK/hup.log" "worker-0: cluster of" $launcher || fail "HUP: the cluster never trained"
kill -HUP -- -$launcher 2>/dev/null || kill -HUP $launcher
rc=0; wait $launcher || rc=$?
sleep 0.5
if [ $rc -ne 129 ] || ! grep -q "interrupted (Hangup)" "$WORK/hup.log"; then
  fail "SIGHUP to the launcher's group: exit $rc (allowed 129)"; tail -5 "$WORK/hup.log"
elif grep -q "killed by signal 1\b\|signal Hangup" "$WORK/hup.log"; then
  fail "SIGHUP to the launcher's group: a child died of SIGHUP"; grep "signal" "$WORK/hup.log" | head -3
elif pgrep -f "$WORK/cluster.json" > /dev/null; then
  fail "SIGHUP to the launcher's group left processes behind: $(pgrep -af "$WORK/cluster.json")"
else
  echo "ok: SIGHUP to the launcher's process group: exit 129, the cluster stopped, nothing left"
fi
"$GS" launch "$WORK/cluster.json" --set checkpoint.every_steps=0 > "$WORK/hup0.log" 2>&1 &
launcher=$!
# Sent once the launcher catches SIGHUP (SigCgt bit 0), its first act: a
# signal before its main runs kills any program.
for _ in $(seq 1 2000); do
  cgt=$(awk '/^SigCgt:/ {print $2}' /proc/$launcher/status 2>/dev/null || true)
  [ -n "$cgt" ] && [ $((0x$cgt & 1)) -eq 1 ] && break
  sleep 0.001
done
kill -HUP $launcher
rc=0; wait $launcher || rc=$?
if [ $rc -ne 129 ] || ! grep -q "interrupted (Hangup)" "$WORK/hup0.log"; then
  fail "SIGHUP to a launcher just started: exit $rc (allowed 129)"; tail -3 "$WORK/hup0.log"
else
  echo "ok: SIGHUP to a launcher just started: exit 129, $(grep -o 'interrupted.*' "$WORK/hup0.log")"
fi

# 9. gradient_sync nccl: the workers' parts are the whole training state.
nccl_set=(--set distributed.gradient_sync=nccl --set training.device=cpu)
rm -rf "$WORK/ckpt" "$WORK/ckpt-clean"
"$GS" launch "$WORK/cluster.json" "${nccl_set[@]}" --set checkpoint.dir="$WORK/ckpt-clean" \
  --rank0-arg=--dump-params --rank0-arg="$WORK/clean-nccl.bin" > "$WORK/clean-nccl.log" 2>&1 ||
  { fail "the uninterrupted nccl run failed"; tail -20 "$WORK/clean-nccl.log"; }
"$GS" launch "$WORK/cluster.json" "${nccl_set[@]}" > "$WORK/faulty-nccl.log" 2>&1 &
launcher=$!
wait_for_line "$WORK/faulty-nccl.log" "\[worker-1\].*checkpoint at step 150 written" $launcher || true
pkill -KILL -f "gridsync-worker --rank 1 --config $WORK/cluster.json" ||
  fail "nccl: worker 1 was not running after its checkpoint of step 150"
rc=0; wait $launcher || rc=$?
if [ $rc -eq 0 ]; then
  fail "the nccl run with a killed worker exited 0 (it finished before the kill?)"
elif ! grep -q "worker-1 (pid [0-9]*) failed: killed by signal" "$WORK/faulty-nccl.log"; then
  fail "nccl: the launcher did not name the killed worker"; tail -5 "$WORK/faulty-nccl.log"
elif "$GS" launch "$WORK/cluster.json" "${nccl_set[@]}" --resume --rank0-arg=--dump-params \
    --rank0-arg="$WORK/resumed-nccl.bin" > "$WORK/resumed-nccl.log" 2>&1 &&
    cmp -s "$WORK/clean-nccl.bin" "$WORK/resumed-nccl.bin"; then
  step=$(grep -o "resuming from the checkpoint of step [0-9]*" "$WORK/resumed-nccl.log" | grep -o "[0-9]*$")
  echo "ok: nccl run: SIGKILL of worker 1, resumed from step $step; the final parameters equal the uninterrupted run's, bit for bit"
else
  fail "resuming the nccl run failed or differs"; tail -5 "$WORK/resumed-nccl.log"
fi

# 9a. Replicas that would resume apart: worker 1's file of the clean run's
# step 300 replaced by its step 250 (checksum intact, manifest step set to
# 300). Every worker compares its restored parameters with worker 0's and
# refuses, naming worker 1; it resumed with exit 0 and diverged before.
held=$(ls "$WORK/ckpt-clean" | grep -c '^step-' || true)
if [ -f "$WORK/ckpt-clean/step-250/worker-1.bin" ] && [ -f "$WORK/ckpt-clean/step-300/worker-1.json" ]; then
  cp "$WORK/ckpt-clean/step-250/worker-1.bin" "$WORK/ckpt-clean/step-300/worker-1.bin"
  sed 's/"step":250/"step":300/' "$WORK/ckpt-clean/step-250/worker-1.json" \
    > "$WORK/ckpt-clean/step-300/worker-1.json"
  rc=0; "$GS" launch "$WORK/cluster.json" "${nccl_set[@]}" --set checkpoint.dir="$WORK/ckpt-clean" \
    --set training.steps=400 --resume > "$WORK/apart-nccl.log" 2>&1 || rc=$?
  if [ $rc -ne 0 ] && grep -q "the parameters restored by workers \[1\] differ from worker 0's" \
      "$WORK/apart-nccl.log"; then
    echo "ok: nccl --resume with worker 1's file of another step: refused (exit $rc), naming worker 1"
  else
    fail "nccl --resume with replicas apart: exit $rc"; grep -v "step [0-9]*/" "$WORK/apart-nccl.log" | tail -5
  fi
else
  fail "nccl: the uninterrupted run did not keep steps 250 and 300 ($held step folders)"
fi

# 9b. A restarted nccl worker cannot rejoin its peers: with --max-restarts
# the launcher restarts the whole job from the newest complete checkpoint,
# and it ends bit for bit where the uninterrupted run ends; a worker started
# afresh into the running job (as a unit's restart would) is refused by the
# coordinator, leaving the job's checkpoints alone.
rc=0; "$GS" launch "$WORK/cluster.json" "${nccl_set[@]}" --set checkpoint.every_steps=0 \
  --max-restarts 1 > "$WORK/restarts-off.log" 2>&1 || rc=$?
if [ $rc -ne 2 ] || ! grep -q "no checkpoint to rejoin from" "$WORK/restarts-off.log"; then
  fail "--max-restarts without checkpoints: exit $rc"; tail -3 "$WORK/restarts-off.log"
else
  echo "ok: --max-restarts without checkpoints is refused (exit 2): nothing to restart from"
fi
rm -rf "$WORK/ckpt"
"$GS" launch "$WORK/cluster.json" "${nccl_set[@]}" --max-restarts 1 --rank0-arg=--dump-params \
  --rank0-arg="$WORK/restarted-nccl.bin" > "$WORK/restarted-nccl.log" 2>&1 &
launcher=$!
wait_for_line "$WORK/restarted-nccl.log" "\[worker-1\].*checkpoint at step 150 written" $launcher || true
pkill -KILL -f "gridsync-worker --rank 1 --config $WORK/cluster.json" ||
  fail "nccl --max-restarts: worker 1 was not running after its checkpoint of step 150"
rc=0; wait $launcher || rc=$?
if [ $rc -ne 0 ] || ! grep -q "restarting the whole job (1 of 1) from the checkpoint of step" "$WORK/restarted-nccl.log"; then
  fail "nccl --max-restarts: exit $rc"; grep "gridsync launch:" "$WORK/restarted-nccl.log" | tail -5
elif ! cmp -s "$WORK/clean-nccl.bin" "$WORK/restarted-nccl.bin"; then
  fail "nccl --max-restarts: the restarted job's parameters differ from the uninterrupted run's"
else
  step=$(grep -o "restarting the whole job (1 of 1) from the checkpoint of step [0-9]*" "$WORK/restarted-nccl.log" | grep -o "[0-9]*$")
  echo "ok: nccl --max-restarts: SIGKILL of worker 1, the whole job restarted from step $step and ended bit for bit as the uninterrupted run"
fi
rm -rf "$WORK/ckpt"
"$BUILD/server/gridsync-coordinator" --config "$WORK/cluster.json" "${nccl_set[@]}" > "$WORK/n-coord.log" 2>&1 &
coord=$!
"$BUILD/worker/gridsync-worker" --rank 0 --config "$WORK/cluster.json" "${nccl_set[@]}" > "$WORK/n-w0.log" 2>&1 &
w0=$!
"$BUILD/worker/gridsync-worker" --rank 1 --config "$WORK/cluster.json" "${nccl_set[@]}" > "$WORK/n-w1.log" 2>&1 &
w1=$!
wait_for_line "$WORK/n-w1.log" "checkpoint at step 100 written" $w1 || true
kill -KILL $w1 2>/dev/null || true; wait $w1 2>/dev/null || true
rc=0; "$BUILD/worker/gridsync-worker" --rank 1 --config "$WORK/cluster.json" "${nccl_set[@]}" > "$WORK/n-w1b.log" 2>&1 || rc=$?
wait $w0 2>/dev/null || true
kill -KILL $coord 2>/dev/null || true; wait $coord 2>/dev/null || true
if [ $rc -eq 0 ] || ! grep -q "joined after training started.*nccl workers do not rejoin a running job" "$WORK/n-w1b.log"; then
  fail "nccl: a worker started afresh into the running job: exit $rc"; tail -3 "$WORK/n-w1b.log"
elif [ ! -f "$WORK/ckpt/step-100/worker-1.json" ]; then
  fail "nccl: the refused fresh worker left the job's checkpoint of step 100 missing"
else
  echo "ok: nccl: a worker started afresh into the running job is refused (exit $rc); the checkpoints stay"
fi

if [ $failures -ne 0 ]; then echo "$failures failure(s)"; exit 1; fi
echo "fault: all checks passed"
