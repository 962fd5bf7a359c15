#!/usr/bin/env bash
# Case 7 of fault_test.sh (sourced by it after case 6, in its shell: its
# cluster config, clean runs, helpers and failure count): live rejoin after
# SIGKILL, damaged or foreign files of the rejoin's step, frozen processes
# killed by the watchdog, and a process killed before the first complete
# checkpoint.

# 7. Live rejoin (fault_lib.sh's live_rejoin): SIGKILL of shard 1 (or
# worker 1) after the checkpoint of step 150; restarted by the launcher, it
# rejoins and the job ends bit for bit where the uninterrupted run ends:
# plain, onebit, compression.pull, hybrid and hybrid with onebit.
clean_run "$WORK/clean-hybrid.bin" hybrid "${hybrid_set[@]}"
clean_run "$WORK/clean-hybrid-codec.bin" "hybrid onebit" "${hybrid_set[@]}" "${codec_set[@]}"
clean_run "$WORK/clean-pull.bin" "onebit with delta pulls" "${pull_set[@]}"
for run in plain:ps-1 onebit:ps-1 onebit:worker-1 pull:ps-1 pull:worker-1 hybrid:worker-1 \
  hybrid:ps-1 hybrid-onebit:worker-1 hybrid:workers; do
  live_rejoin "$run"
done

# 7e. The restarted process's own files of the newest common step do not
# load (a byte of its .bin flipped before the kill, step 150 or later):
# every restart failed on the checksum until the restarts ran out, and the
# run was lost. It sets them aside, rejoins from the older step every part
# holds, the job rolls back there, and it ends bit for bit: a shard, and a
# worker holding state (onebit: its Adam state and residuals).
# The third: the killed shard's files are intact, but the live shard 0's
# fail in the rollback its rejoin brings; shard 0 refused every request
# until the workers timed out. It sets them aside and exits, and restarted
# it rejoins from the older step. Then the same for a worker of hybrid
# with onebit (its node's collective is formed again too), and for a shard
# under compression.pull (its part holds every worker's replica as well).
for run in plain:ps-1:shard-1 onebit:worker-1:worker-1 plain:ps-1:shard-0 \
  hybrid-onebit:worker-1:worker-1 pull:ps-1:shard-1; do
  variant=${run%%:*}; rest=${run#*:}; victim=${rest%%:*}; damaged=${rest#*:}
  tag="corrupt-$variant-$victim-$damaged"; file=$damaged.bin
  extra=(); clean="$WORK/clean.bin"; pattern="gridsync-ps --shard 1"
  case $variant in
    onebit) extra=("${codec_set[@]}"); clean="$WORK/clean-codec.bin" ;;
    hybrid-onebit) extra=("${hybrid_set[@]}" "${codec_set[@]}"); clean="$WORK/clean-hybrid-codec.bin" ;;
    pull) extra=("${pull_set[@]}"); clean="$WORK/clean-pull.bin" ;;
  esac
  [ "$victim" = worker-1 ] && pattern="gridsync-worker --rank 1"
  log="$WORK/rejoin-$tag.log"
  rm -rf "$WORK/ckpt"
  "$GS" launch "$WORK/cluster.json" "${extra[@]}" --max-restarts 1 --rank0-arg=--dump-params \
    --rank0-arg="$WORK/rejoined-$tag.bin" > "$log" 2>&1 &
  launcher=$!
  # Every part logs its step 150 once it has published it: then the step
  # is the job's newest common one in the coordinator's store too (a part
  # frozen between writing and publishing left the job at 100, and the
  # damaged file was never read).
  # (Workers hold state of their own with a codec: every variant but plain.)
  procs=(ps-0 ps-1); [ "$variant" != plain ] && procs+=(worker-0 worker-1)
  for proc in "${procs[@]}"; do
    wait_for_line "$log" "\[$proc\].*checkpoint at step 150 written" || true
  done
  # Everything frozen at once (the launcher too, for a moment), so that the
  # newest step every part holds stays put while a file of it is damaged.
  pkill -STOP -f "$WORK/cluster.json" || true
  parts=(shard-0 shard-1); [ "$variant" != plain ] && parts+=(worker-0 worker-1)
  common=0; previous=0
  for step_dir in $(ls -d "$WORK"/ckpt/step-* | sort -t- -k2 -n); do
    whole=1
    for part in "${parts[@]}"; do [ -f "$step_dir/$part.json" ] || whole=0; done
    [ $whole -eq 1 ] && { previous=$common; common=${step_dir##*step-}; }
  done
  [ "$previous" -gt 0 ] || fail "7e $tag: fewer than two complete steps (newest $common)"
  printf '\xff' | dd of="$WORK/ckpt/step-$common/$file" bs=1 seek=100 conv=notrunc status=none
  pkill -KILL -f "$pattern --config $WORK/cluster.json" ||
    fail "7e $tag: $victim was not running after the checkpoint of step 150"
  pkill -CONT -f "$WORK/cluster.json" || true
  rc=0; wait $launcher || rc=$?
  # Who says it went back: the restarted victim, or the live shard 0 (it
  # exits, and restarted rejoins where its part's steps now end).
  if [ "$damaged" = shard-0 ]; then
    said="\[ps-0\].*checkpoint of step $common failed its checks in a rollback.*set aside"
    other="\[ps-1\].*rolled back to step $previous"
  else
    said="\[$victim\].*checksum.*set aside.*rejoining from the older checkpoint of step $previous"
    other="\[ps-0\].*rolled back to step $previous"
  fi
  if [ $rc -ne 0 ]; then
    fail "7e $tag: a corrupted newest checkpoint lost the run (exit $rc)"
    grep -v "step [0-9]*/" "$log" | tail -12
  elif ! grep -q "$said" "$log"; then
    fail "7e $tag: no line says $file of step $common failed and the job went back to $previous"
    grep -v "step [0-9]*/" "$log" | grep -i "check\|rejoin\|roll" | tail -8
  elif ! grep -q "$other" "$log"; then
    fail "7e $tag: the job did not roll back to step $previous"
  elif [ ! -f "$WORK/ckpt/step-$common/$file.damaged" ]; then
    fail "7e $tag: the damaged $file of step $common was not set aside"
  elif ! cmp -s "$clean" "$WORK/rejoined-$tag.bin"; then
    fail "7e $tag: after the rejoin from the older step the final parameters differ"
  else
    echo "ok: 7e $tag: $file of step $common failed its checksum; it was set aside, the job rolled back to step $previous and ended bit for bit"
  fi
done

# 7f. The live shard 0's files of the rollback's step are another run's
# (copied in, checksums intact): shard 0 refused every request until the
# workers timed out. It exits 3 at once, naming the step, the launcher
# restarts nothing into the same files, and the folder keeps them as they
# were (none set aside: they are intact, only not this run's).
# Checkpoints at 150 and 300 only, so the rollback's step is 150, the step
# the other run's files are of.
"$GS" launch "$WORK/cluster.json" --set checkpoint.dir="$WORK/ckpt-other7" \
  --set training.steps=150 > "$WORK/other7.log" 2>&1 || fail "7f: the other run failed"
log="$WORK/foreign-rollback.log"
rm -rf "$WORK/ckpt"
"$GS" launch "$WORK/cluster.json" --set checkpoint.every_steps=150 --max-restarts 1 > "$log" 2>&1 &
launcher=$!
for proc in ps-0 ps-1; do
  wait_for_line "$log" "\[$proc\].*checkpoint at step 150 written" || true
done
pkill -STOP -f "$WORK/cluster.json" || true
cp "$WORK/ckpt-other7/step-150/shard-0.bin" "$WORK/ckpt-other7/step-150/shard-0.json" \
  "$WORK/ckpt/step-150/" || fail "7f: no step 150 to copy the other run's files into"
pkill -KILL -f "gridsync-ps --shard 1 --config $WORK/cluster.json" ||
  fail "7f: shard 1 was not running after the checkpoint of step 150"
pkill -CONT -f "$WORK/cluster.json" || true
rc=0; wait $launcher || rc=$?
if [ $rc -eq 0 ]; then
  fail "7f: the job ended 0 though shard 0's files of step 150 are another run's"
elif ! grep -q "\[ps-0\].*its checkpoint of step 150 is another run's.*exiting 3" "$log"; then
  fail "7f: shard 0 did not exit 3 naming step 150 (exit $rc)"
  grep -v "step [0-9]*/" "$log" | grep -i "run\|roll\|exit\|launch" | tail -8
elif grep -q "ps-0 (pid [0-9]*) .*restarting\|restarting ps-0" "$log"; then
  fail "7f: the launcher restarted shard 0 into the same files"
elif ! cmp -s "$WORK/ckpt-other7/step-150/shard-0.bin" "$WORK/ckpt/step-150/shard-0.bin" ||
     [ -e "$WORK/ckpt/step-150/shard-0.bin.damaged" ]; then
  fail "7f: shard 0's files of step 150 were changed or set aside"
else
  echo "ok: 7f: the live shard 0's rollback met another run's files of step 150: it exited 3 naming the step (launch exit $rc), nothing restarted it, the files are as they were"
fi
rm -rf "$WORK/ckpt-other7"

# 7b. A frozen shard (SIGSTOP: its serving loop stops turning, its
# connections stay up) under --max-restarts: the launcher's watchdog, as
# systemd's WatchdogSec would, kills it for want of pings within 1.5 x
# timeout_s (4 s here); it is restarted, rejoins, and the job ends bit for
# bit. Before, the launcher restarted the workers instead until it ran out.
# 7c. A frozen worker: a worker pings from a thread of its own while it
# runs, so the launcher kills it within timeout_s / 2 (at least 3 s; 6 s
# here), before the other worker's wait on it times out; restarted, it
# rejoins and the job ends bit for bit. Before, the launcher restarted
# worker 0, which had only reported it, until --max-restarts ran out.
# frozen NAME PROCESS_PATTERN TIMEOUT_S KILLED_AFTER_S
frozen() {
  local log="$WORK/frozen-$1.log" start rc=0
  rm -rf "$WORK/ckpt"
  start=$(date +%s)
  "$GS" launch "$WORK/cluster.json" --set distributed.timeout_s=$3 --max-restarts 1 \
    --rank0-arg=--dump-params --rank0-arg="$WORK/frozen-$1.bin" > "$log" 2>&1 &
  local launcher=$!
  wait_for_line "$log" "\[ps-1\].*checkpoint at step 150 written" || true
  pkill -STOP -f "$2 --config $WORK/cluster.json" ||
    fail "frozen $1: it was not running after the checkpoint of step 150"
  wait $launcher || rc=$?
  if [ $rc -ne 0 ]; then
    fail "frozen $1: the run did not survive (exit $rc)"; grep -v "step [0-9]*/" "$log" | tail -12
  elif ! grep -q "$1 (pid [0-9]*) sent no watchdog ping for $4 s" "$log"; then
    fail "frozen $1: the launcher did not name the process whose pings stopped"
    grep "gridsync launch" "$log" | tail -5
  elif [ "$1" = worker-1 ] && grep -q "worker-0 (pid [0-9]*) failed" "$log"; then
    fail "frozen $1: worker 0 failed too (the watchdog came after its wait timed out)"
  elif ! cmp -s "$WORK/clean.bin" "$WORK/frozen-$1.bin"; then
    fail "frozen $1: the final parameters differ from the uninterrupted run's"
  else
    echo "ok: SIGSTOP of $1: the launcher's watchdog killed it after $4 s without a ping, it rejoined and the job ended bit for bit ($(( $(date +%s) - start )) s in all)"
  fi
}
frozen ps-1 "gridsync-ps --shard 1" 4 6
frozen worker-1 "gridsync-worker --rank 1" 6 3

# 7d. A shard or worker killed after training started but before the first
# complete checkpoint cannot rejoin: restarted once, it is refused
# (FailedPrecondition) and exits 5, and the launcher stops the job naming
# why, instead of restarting it into the same refusal until --max-restarts
# ran out (3 restarts spent in under a second before).
for victim in ps-1 worker-1; do
  log="$WORK/early-$victim.log"
  pattern="gridsync-ps --shard 1 --config $WORK/cluster.json"
  [ "$victim" = worker-1 ] && pattern="gridsync-worker --rank 1 --config $WORK/cluster.json"
  rm -rf "$WORK/ckpt"
  rc=0
  "$GS" launch "$WORK/cluster.json" --set checkpoint.every_steps=100000 --set training.steps=100000 \
    --set training.log_every=10 --max-restarts 3 > "$log" 2>&1 &
  launcher=$!
  wait_for_line "$log" "\[worker-0\].*step 10/" $launcher || true
  pkill -KILL -f "$pattern" || fail "early $victim: it was not running once training started"
  wait $launcher || rc=$?
  if [ $rc -ne 1 ]; then
    fail "early $victim: exit $rc, not 1"; grep "gridsync launch" "$log" | tail -5
  elif [ "$(grep -c "$victim (pid [0-9]*) failed: .*restarting it" "$log")" -ne 1 ] ||
       ! grep -q "restarting it (1 of 3): no complete checkpoint yet" "$log" ||
       ! grep -q "$victim (pid [0-9]*) failed: exit status 5; it cannot rejoin" "$log"; then
    fail "early $victim: not restarted once and then stopped as unable to rejoin"
    grep "gridsync launch" "$log" | tail -5
  else
    echo "ok: early $victim: killed before the first checkpoint, restarted once, refused (exit 5), and the launcher stopped the job saying it cannot rejoin"
  fi
done
