#!/usr/bin/python3
"""PyTorch peer for ``gridsync-bench allreduce``.

``gridsync-bench allreduce`` runs this script (through popen) to measure
``torch.distributed.all_reduce`` with the gloo backend on exactly the sizes,
iterations and correctness check that it uses for its own Gloo collective,
so the two columns of its table compare like with like. It is meant for
Debian's ``/usr/bin/python3`` with ``python3-torch`` (1.13); nothing else is
needed.

What it does
------------
* Spawns ``--ranks`` processes (multiprocessing, "spawn" start method: a
  fresh interpreter per rank, so no torch thread state is inherited through
  fork). Each calls ``torch.set_num_threads(1)`` and joins
  ``init_process_group("gloo", init_method="tcp://127.0.0.1:PORT")``, PORT
  being a free port picked here (or ``--port``). GLOO_SOCKET_IFNAME defaults
  to ``lo`` so that, like gridsync's ranks (which listen on 127.0.0.1), the
  ranks talk over loopback whatever the host name resolves to.
* Sizes: ``--counts c1,c2,...`` float32 elements, with ``--iters`` and
  ``--warmup`` as lists of the same length (per size) or one value for all.
* Rounds: each size's timed iterations are split into ``--rounds`` rounds
  (fewer when there are fewer iterations): round j gets iters // R
  iterations, plus one for j < iters % R. Round 0 starts with the size's
  warmup iterations, every later round with one (zero if the warmup is 0),
  untimed, to re-warm after the pause. The time is the median over the
  timed iterations of all rounds.
* Pacing: with ``--control-fd FD`` (how gridsync-bench runs it) the ranks
  start a round only after a line arrives on FD, so the bench can alternate
  rounds of its own ranks and these (its side, this side, its side, ...).
  On a shared host, background load that comes and goes then hits both
  sides alike, and the sides never compete with each other for the cores
  (the waiting ranks block in a read). EOF on FD before the last round
  aborts the run (exit 1). Without --control-fd rounds run back to back.
* Rank r's contribution to element i is (r + 1) + (i % 7): small integers, so
  the sum over ranks is exact in float32 and known in advance.
* Each iteration (warmup or timed) is, exactly as on the gridsync side:
  reset the buffer to the rank's contribution (untimed), ``dist.barrier()``
  (untimed: it aligns the ranks, so a rank's time is the all-reduce's, not
  the skew left by the reset), then ``dist.all_reduce(buf)`` (SUM, in place,
  synchronous) timed with ``time.perf_counter()``.
* time = rank 0's median over the timed iterations of all rounds, in us.
  algbw = bytes / time, busbw = algbw * 2(n-1)/n (nccl-tests), GB/s = 1e9 B/s.
* #wrong: after the last iteration each rank counts the elements that differ
  from the exact sum; the number printed is the total over all ranks. The
  buffer is reset before every iteration, so an all-reduce that did nothing
  leaves the rank's own values, which differ from the sum everywhere.

Output (stdout, one JSON object per line, nothing else)
-------------------------------------------------------
* first: ``{"event": "start", "torch_version", "ranks", "port", "threads"}``
  once every rank has joined;
* then, in order, for each size and each round but its last:
  ``{"event": "round", "index", "round"}``, and after the last round one
  ``{"event": "size", "index", "size" (bytes), "count", "type": "float",
  "iters", "warmup", "rounds", "time_us", "algbw_gbps", "busbw_gbps",
  "wrong"}``.
Errors go to stderr.

Exit codes: 0 success (even with #wrong > 0: the caller reports it), 1 a
rank failed (its traceback is printed), 2 invalid arguments.
"""

import json
import multiprocessing as mp
import os
import queue
import socket
import statistics
import sys
import time
import traceback
from datetime import timedelta

from peer_args import ArgParser, int_at_least, int_list, positive_float

# Only ranks import torch: the parent stays light, and a rank failing to
# import it reports that like any other failure.

ELEMENT_BYTES = 4  # float32
MAX_RANKS = 64


def log(msg):
    print("torch_allreduce.py: " + msg, file=sys.stderr, flush=True)


def parse_args(argv):
    p = ArgParser(description="torch.distributed gloo all_reduce peer of gridsync-bench allreduce")
    p.add_argument("--ranks", type=int_at_least(2), default=2, help="processes (>= 2, <= %d)" % MAX_RANKS)
    p.add_argument("--counts", type=int_list(2), required=True, help="float32 elements per size, comma-separated")
    p.add_argument("--iters", type=int_list(1), default=[20], help="timed iterations: one value or one per size")
    p.add_argument("--warmup", type=int_list(0), default=[5], help="untimed iterations: one value or one per size")
    p.add_argument("--rounds", type=int_at_least(1), default=1,
                   help="rounds per size (alternated with the bench through --control-fd)")
    p.add_argument("--timeout", type=positive_float, default=120.0, help="seconds for rendezvous and each operation")
    p.add_argument("--port", type=int_at_least(0), default=0, help="rendezvous TCP port (0: pick a free one)")
    p.add_argument("--control-fd", type=int_at_least(0), default=None,
                   help="read one line from this inherited file descriptor before each size")
    args = p.parse_args(argv)
    if args.ranks > MAX_RANKS:
        p.error("--ranks %d: allowed 2..%d" % (args.ranks, MAX_RANKS))
    if args.port > 65535:
        p.error("--port %d: allowed 0..65535" % args.port)
    if args.control_fd is not None:
        try:
            os.fstat(args.control_fd)
        except OSError as e:
            p.error("--control-fd %d: %s" % (args.control_fd, e.strerror))
    n = len(args.counts)
    for name in ("iters", "warmup"):
        values = getattr(args, name)
        if len(values) == 1:
            setattr(args, name, values * n)
        elif len(values) != n:
            p.error("--%s has %d values; allowed: 1 or one per size (%d)" % (name, len(values), n))
    return args


def free_port():
    # Bound and released here, then bound by rank 0's TCPStore: another
    # process could take it in between, which init_process_group reports.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bandwidths(nbytes, time_us, ranks):
    algbw = nbytes / (time_us * 1e-6) / 1e9 if time_us > 0 else 0.0
    return algbw, algbw * 2.0 * (ranks - 1) / ranks


def rounds_for(iters, rounds):
    return min(rounds, iters)


def round_iters(iters, rounds, j):
    """Timed iterations in round j (as gridsync-bench splits them)."""
    return iters // rounds + (1 if j < iters % rounds else 0)


def round_warmup(warmup, j):
    return warmup if j == 0 else min(1, warmup)


def wait_for_go(go, step, parent_pid):
    """Blocks until the parent releases `step` (size, round); exits if the parent is gone."""
    while True:
        try:
            got = go.get(timeout=1.0)
        except queue.Empty:
            if os.getppid() != parent_pid:  # orphaned: nobody will release us
                sys.exit(1)
            continue
        if got != step:
            raise RuntimeError("released for %r while waiting for (size, round) %r" % (got, step))
        return


def rank_main(rank, args, port, results, go, parent_pid):
    """One rank; reports ("start"|"size"|"done"|"error", rank, ...) on `results`.

    With `go` (a queue), each size waits for its index there first.
    """
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        n = args.ranks
        dist.init_process_group(
            "gloo",
            init_method="tcp://127.0.0.1:%d" % port,
            rank=rank,
            world_size=n,
            timeout=timedelta(seconds=args.timeout),
        )
        dist.barrier()  # every rank joined: the parent may announce the start
        results.put(("start", rank, torch.__version__))
        for k, count in enumerate(args.counts):
            pattern = torch.arange(count, dtype=torch.int32) % 7
            pristine = (pattern + (rank + 1)).to(torch.float32)
            # sum over r of (r + 1) + p = n(n+1)/2 + n p: exact in float32.
            expected = (pattern * n + n * (n + 1) // 2).to(torch.float32)
            del pattern
            buf = torch.empty_like(pristine)
            times_us = []
            rounds = rounds_for(args.iters[k], args.rounds)
            for j in range(rounds):
                if go is not None:
                    wait_for_go(go, (k, j), parent_pid)
                warmup = round_warmup(args.warmup[k], j)
                for it in range(warmup + round_iters(args.iters[k], rounds, j)):
                    buf.copy_(pristine)
                    dist.barrier()
                    start = time.perf_counter()
                    dist.all_reduce(buf)  # SUM, in place; returns when done
                    elapsed = time.perf_counter() - start
                    if it >= warmup:
                        times_us.append(elapsed * 1e6)
                if j + 1 < rounds:
                    results.put(("round", rank, k, j))
            wrong = int(torch.count_nonzero(buf != expected))
            results.put(("size", rank, k, statistics.median(times_us), wrong))
            del buf, pristine, expected
        dist.destroy_process_group()
        results.put(("done", rank))
    except BaseException:  # noqa: B902 - the parent must hear about any failure
        results.put(("error", rank, traceback.format_exc()))
        sys.exit(1)


def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    control = os.fdopen(args.control_fd, "r") if args.control_fd is not None else None
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    port = args.port or free_port()
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    gos = [ctx.Queue() if control is not None else None for _ in range(args.ranks)]
    procs = [ctx.Process(target=rank_main, args=(r, args, port, results, gos[r], os.getpid()), daemon=True)
             for r in range(args.ranks)]
    for p in procs:
        p.start()

    def fail(msg):
        log(msg)
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(5)
        sys.exit(1)

    done = set()

    def next_message():
        """The next ("start"|"size", ...) message; fails on an error or a dead rank."""
        while True:
            try:
                msg = results.get(timeout=0.5)
            except queue.Empty:
                # A rank that died without a word (killed, or crashed in C++).
                for r, p in enumerate(procs):
                    if p.exitcode is not None and p.exitcode != 0:
                        fail("rank %d exited with code %s" % (r, p.exitcode))
                continue
            if msg[0] == "error":
                fail("rank %d failed:\n%s" % (msg[1], msg[2]))
            if msg[0] == "done":
                done.add(msg[1])
                continue
            return msg

    started = set()
    torch_version = "?"
    while len(started) < args.ranks:
        msg = next_message()
        if msg[0] != "start":
            fail("unexpected message before the start: %r" % (msg,))
        started.add(msg[1])
        torch_version = msg[2]
    emit({"event": "start", "torch_version": torch_version, "ranks": args.ranks, "port": port, "threads": 1})

    # Rank r's messages arrive in its order; without --control-fd a rank may
    # run ahead of the others, so messages are kept by what they report.
    got = {}  # ("round", k, j) or ("size", k) -> {rank: payload}

    def wait_all(key):
        while len(got.get(key, {})) < args.ranks:
            msg = next_message()
            if msg[0] == "round":
                got.setdefault(("round", msg[2], msg[3]), {})[msg[1]] = None
            elif msg[0] == "size":
                got.setdefault(("size", msg[2]), {})[msg[1]] = (msg[3], msg[4])
            else:
                fail("unexpected message: %r" % (msg,))
        return got.pop(key)

    for k, count in enumerate(args.counts):
        rounds = rounds_for(args.iters[k], args.rounds)
        for j in range(rounds):
            if control is not None:
                if not control.readline():
                    fail("the control descriptor closed before round %d of size %d" % (j, k))
                for go in gos:
                    go.put((k, j))
            if j + 1 < rounds:
                wait_all(("round", k, j))
                emit({"event": "round", "index": k, "round": j})
        ranks = wait_all(("size", k))
        nbytes = count * ELEMENT_BYTES
        time_us = ranks[0][0]  # rank 0's timing, as on the gridsync side
        algbw, busbw = bandwidths(nbytes, time_us, args.ranks)
        emit({"event": "size", "index": k, "size": nbytes, "count": count, "type": "float",
              "iters": args.iters[k], "warmup": args.warmup[k], "rounds": rounds, "time_us": time_us,
              "algbw_gbps": algbw, "busbw_gbps": busbw, "wrong": sum(w for _, w in ranks.values())})

    for r, p in enumerate(procs):
        p.join(60)
        if p.exitcode != 0:
            fail("rank %d exited with code %s" % (r, p.exitcode))
    return 0


if __name__ == "__main__":
    sys.exit(main())
