#!/usr/bin/env bash
# Prometheus metrics and `gridsync monitor` against a live cluster (a
# coordinator, 2 shards, 2 workers as separate processes, metrics.port set):
#  1. while the workers train, `gridsync monitor --once --json` finds every
#     process through the coordinator and shows their figures;
#  2. after training (the workers hold their endpoints a few seconds), each
#     worker's scraped figures equal its JSON summary (steps, samples, loss,
#     PSNR, bytes each way);
#  3. each shard's pushes, pulls and version equal what it logs when
#     stopped; the coordinator reports the members, the job and barriers;
#  4. a config whose metrics ports overlap the cluster's is refused; garbage,
#     oversized requests and 50 connections that never finish their request
#     do not stop the coordinator's endpoint from answering a scrape;
#  5. --timeline: worker 0's Chrome trace has every step with its prepare,
#     compute and apply spans, shard 0's every applied step (valid JSON).
set -euo pipefail
BUILD=${1:?usage: metrics_monitor_test.sh BUILD_DIR}
source "$(dirname "$0")/test_lib.sh"
# The cluster's ports and the metrics ports (coordinator, 2 shards, 2
# workers), each block checked free first.
PORT=$(free_ports 23000 4 400 4)
MPORT=$(free_ports 25000 8 200 5)
scrape() {  # scrape HOST:PORT -> the metrics text on stdout
  python3 -c 'import sys,urllib.request; print(urllib.request.urlopen("http://"+sys.argv[1]+"/metrics", timeout=5).read().decode())' "$1"
}
metric() {  # metric FILE NAME [LABEL_FILTER]: the first matching sample's value
  grep -E "^$2(\{[^}]*${3:-}[^}]*\})? " "$1" | head -1 | awk '{print $NF}'
}
json_field() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }
same() { python3 -c 'import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); sys.exit(0 if abs(a-b)<=1e-6*max(1,abs(b)) else 1)' "$1" "$2"; }

cat > "$WORK/cluster.json" <<JSON
{
  "encoding": {"n_levels": 12, "log2_hashmap_size": 15},
  "network": {"n_neurons": 32, "n_hidden_layers": 1},
  "distributed": {"enable": true, "world_size": 2, "master_port": $PORT, "gradient_sync": "ps",
                  "timeout_s": 20},
  "ps": {"shards": 2, "threads": 1},
  "training": {"batch_size": 16384, "steps": 150, "log_every": 0},
  "task": {"output": "$WORK/out"},
  "metrics": {"port": $MPORT}
}
JSON
# 4. Refused: metrics ports over the cluster's own.
if "$BUILD/tools/gridsync" check-config "$WORK/cluster.json" --set metrics.port=$((PORT - 1)) \
  > /dev/null 2> "$WORK/overlap.err"; then
  fail "check-config accepted metrics ports overlapping the cluster's"
fi
grep -q "metrics.port" "$WORK/overlap.err" || fail "the refusal does not name metrics.port: $(cat "$WORK/overlap.err")"

"$BUILD/server/gridsync-coordinator" --config "$WORK/cluster.json" > "$WORK/coordinator.log" 2>&1 &
track $!
for s in 0 1; do
  "$BUILD/server/gridsync-ps" --config "$WORK/cluster.json" --shard $s \
    --timeline "$WORK/shard$s.trace.json" > "$WORK/ps$s.log" 2>&1 &
  track $!
done
shard_pids=("${pids[1]}" "${pids[2]}")
for r in 0 1; do
  "$BUILD/worker/gridsync-worker" --config "$WORK/cluster.json" --rank $r --metrics-hold 60 \
    --timeline "$WORK/worker$r.trace.json" > "$WORK/worker$r.log" 2>&1 &
  track $!
done
w0=${pids[3]}
w1=${pids[4]}

# 1. The monitor while training runs. Batches of 16384 make the run last
# seconds: at 4096 its 150 steps took 1.6 s, and a monitor slowed by a busy
# machine saw the workers only after the job ended (they leave the map).
seen=0
for _ in $(seq 1 100); do
  if "$BUILD/tools/gridsync" monitor "$WORK/cluster.json" --once --json > "$WORK/monitor.json" \
    2> "$WORK/monitor.err"; then
    if python3 - "$WORK/monitor.json" <<'PY'
import json, sys
v = json.load(open(sys.argv[1]))
ok = (len(v["workers"]) == 2 and len(v["shards"]) == 2
      and all("error" not in m for m in v["workers"] + v["shards"] + [v["coordinator"]])
      and all(w["step"] > 0 for w in v["workers"]) and all(s["pushes"] > 0 for s in v["shards"]))
sys.exit(0 if ok else 1)
PY
    then seen=1; break; fi
  fi
  sleep 0.2
done
[ "$seen" = 1 ] || fail "gridsync monitor never showed both workers and shards training: $(cat "$WORK/monitor.json" "$WORK/monitor.err" 2>/dev/null | head -5)"
"$BUILD/tools/gridsync" monitor "$WORK/cluster.json" --once > "$WORK/monitor.txt" 2>&1 ||
  fail "gridsync monitor --once (table) failed: $(cat "$WORK/monitor.txt")"
grep -q "^worker" "$WORK/monitor.txt" && grep -q "^shard" "$WORK/monitor.txt" ||
  fail "the monitor's table lacks its worker or shard section"

# 2. Each worker's final figures against its JSON summary (the summary comes
# only after a successful run; the workers then hold their endpoints 60 s).
for r in 0 1; do
  for _ in $(seq 1 1200); do grep -q '^{' "$WORK/worker$r.log" && break; sleep 0.1; done
done
for r in 0 1; do
  summary=$(grep '^{' "$WORK/worker$r.log" | tail -1)
  [ -n "$summary" ] || { fail "worker $r printed no summary: $(tail -3 "$WORK/worker$r.log")"; continue; }
  scrape "127.0.0.1:$((MPORT + 3 + r))" > "$WORK/w$r.prom" || { fail "worker $r: no metrics"; continue; }
  steps=$(json_field "$summary" steps)
  same "$(metric "$WORK/w$r.prom" gridsync_worker_steps_total)" "$steps" ||
    fail "worker $r: steps_total $(metric "$WORK/w$r.prom" gridsync_worker_steps_total), summary $steps"
  same "$(metric "$WORK/w$r.prom" gridsync_worker_samples_total)" "$(json_field "$summary" my_samples)" ||
    fail "worker $r: samples_total differs from my_samples"
  same "$(metric "$WORK/w$r.prom" gridsync_worker_loss)" "$(json_field "$summary" final_loss)" ||
    fail "worker $r: loss differs from final_loss"
  sent=$(python3 -c "print($(json_field "$summary" bytes_pushed_per_step) * $steps)")
  same "$(metric "$WORK/w$r.prom" gridsync_worker_bytes_total 'direction="sent"')" "$sent" ||
    fail "worker $r: bytes sent $(metric "$WORK/w$r.prom" gridsync_worker_bytes_total 'direction="sent"'), summary $sent"
  received=$(python3 -c "print($(json_field "$summary" bytes_pulled_per_step) * $steps)")
  same "$(metric "$WORK/w$r.prom" gridsync_worker_bytes_total 'direction="received"')" "$received" ||
    fail "worker $r: bytes received differ from the summary"
  compute=$(metric "$WORK/w$r.prom" gridsync_worker_phase_seconds_total 'phase="compute"')
  python3 -c "import sys; sys.exit(0 if float('$compute') > 0 else 1)" ||
    fail "worker $r: no compute time"
  if [ "$r" = 0 ]; then
    same "$(metric "$WORK/w$r.prom" gridsync_worker_psnr_db)" "$(json_field "$summary" psnr_db)" ||
      fail "worker 0: psnr_db differs from the summary"
  fi
done
kill -TERM "$w0" "$w1" 2>/dev/null || true

# 3. Shards and the coordinator.
scrape "127.0.0.1:$MPORT" > "$WORK/coordinator.prom" || fail "coordinator: no metrics"
same "$(metric "$WORK/coordinator.prom" gridsync_coordinator_registrations_total)" 4 ||
  fail "coordinator: registrations_total $(metric "$WORK/coordinator.prom" gridsync_coordinator_registrations_total), expected 4"
same "$(metric "$WORK/coordinator.prom" gridsync_coordinator_job)" 2 ||
  fail "coordinator: job $(metric "$WORK/coordinator.prom" gridsync_coordinator_job) after the first job ended, expected 2"
same "$(metric "$WORK/coordinator.prom" gridsync_coordinator_members 'member_role="shard"')" 2 ||
  fail "coordinator: shard members"
for s in 0 1; do
  scrape "127.0.0.1:$((MPORT + 1 + s))" > "$WORK/s$s.prom" || { fail "shard $s: no metrics"; continue; }
  kill -TERM "${shard_pids[$s]}"
  for _ in $(seq 1 100); do grep -q "stopping:" "$WORK/ps$s.log" && break; sleep 0.1; done
  line=$(grep "stopping:" "$WORK/ps$s.log" || true)
  pushes=$(echo "$line" | sed -n 's/.*stopping: \([0-9]*\) pushes, \([0-9]*\) pulls.*/\1/p')
  pulls=$(echo "$line" | sed -n 's/.*stopping: \([0-9]*\) pushes, \([0-9]*\) pulls.*/\2/p')
  same "$(metric "$WORK/s$s.prom" gridsync_shard_pushes_total)" "${pushes:-x}" ||
    fail "shard $s: pushes_total $(metric "$WORK/s$s.prom" gridsync_shard_pushes_total), logged '$pushes'"
  same "$(metric "$WORK/s$s.prom" gridsync_shard_pulls_total)" "${pulls:-x}" ||
    fail "shard $s: pulls_total differs from the log"
  in_parts=$(echo "$line" | sed -n 's/.* pulls (\([0-9]*\) answered in \([0-9]*\) parts).*/\1/p')
  same "$(metric "$WORK/s$s.prom" gridsync_shard_pulls_in_parts_total)" "${in_parts:-x}" ||
    fail "shard $s: pulls_in_parts_total $(metric "$WORK/s$s.prom" gridsync_shard_pulls_in_parts_total), logged '$in_parts'"
  same "$(metric "$WORK/s$s.prom" gridsync_shard_version)" 150 ||
    fail "shard $s: version $(metric "$WORK/s$s.prom" gridsync_shard_version), expected 150"
  count=$(metric "$WORK/s$s.prom" gridsync_shard_apply_seconds_count)
  same "$count" 150 || fail "shard $s: apply_seconds_count $count, expected 150 steps"
done

# 4. A hostile client at the coordinator's metrics port.
python3 - "$MPORT" > "$WORK/hostile.check" 2>&1 <<'PY' ||
import os, socket, sys, urllib.request
port = int(sys.argv[1])
def blast(data):
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=2)
        s.sendall(data)
        try:
            s.recv(100)
        except OSError:
            pass
        s.close()
    except OSError:
        pass
blast(os.urandom(5000))
blast(b"GET /" + b"A" * 200000 + b" HTTP/1.1\r\n\r\n")
blast(b"GET /metrics HTTP/1.1\r\n" + b"X: y\r\n" * 20000 + b"\r\n")
blast(b"POST /metrics HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\nabc")
idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(50)]
for s in idle:
    s.send(b"GET /metr")
body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=20).read().decode()
assert "gridsync_coordinator_job" in body, "the scrape under attack lacks the coordinator's figures"
PY
  fail "the coordinator's metrics endpoint under hostile clients: $(tail -2 "$WORK/hostile.check")"

# 5. The timelines.
python3 - "$WORK/worker0.trace.json" "$WORK/shard0.trace.json" > "$WORK/trace.check" 2>&1 <<'PY' ||
import json, sys
worker = json.load(open(sys.argv[1]))
names = [e["name"] for e in worker if e.get("ph") == "X"]
steps = [n for n in names if n.startswith("step ")]
assert len(steps) == 150, f"{len(steps)} step spans in the worker's trace, expected 150"
for phase in ("prepare", "compute", "apply"):
    assert names.count(phase) == 150, f"{names.count(phase)} {phase} spans, expected 150"
assert all(e["dur"] >= 0 and e["ts"] > 0 for e in worker if e.get("ph") == "X")
shard = json.load(open(sys.argv[2]))
applies = [e for e in shard if e.get("ph") == "X" and e["name"] == "apply"]
assert len(applies) == 150, f"{len(applies)} apply spans in the shard's trace, expected 150"
PY
  fail "timeline: $(cat "$WORK/trace.check")"

finish metrics_monitor_test
