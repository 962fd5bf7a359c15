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
* Rank r's contribution to element i is (r + 1) + (i % 7): small integers, so
  the sum over ranks is exact in float32 and known in advance.
* Each iteration (warmup or timed) is, exactly as on the gridsync side:
  reset the buffer to the rank's contribution (untimed), ``dist.barrier()``
  (untimed: it aligns the ranks, so a rank's time is the all-reduce's, not
  the skew left by the reset), then ``dist.all_reduce(buf)`` (SUM, in place,
  synchronous) timed with ``time.perf_counter()``.
* time = rank 0's median over the timed iterations, in microseconds.
  algbw = bytes / time, busbw = algbw * 2(n-1)/n (nccl-tests), GB/s = 1e9 B/s.
* #wrong: after the last iteration each rank counts the elements that differ
  from the exact sum; the number printed is the total over all ranks. The
  buffer is reset before every iteration, so an all-reduce that did nothing
  leaves the rank's own values, which differ from the sum everywhere.

Output (stdout, one JSON object per line, nothing else)
-------------------------------------------------------
* first: ``{"event": "start", "torch_version", "ranks", "port", "threads"}``
  once every rank has joined;
* then one line per size, in order: ``{"event": "size", "index", "size"
  (bytes), "count", "type": "float", "iters", "warmup", "time_us",
  "algbw_gbps", "busbw_gbps", "wrong"}``.
Progress and errors go to stderr.

Exit codes: 0 success (even with #wrong > 0: the caller reports it), 1 a
rank failed (its traceback is printed), 2 invalid arguments.
"""

import argparse
import json
import math
import multiprocessing as mp
import os
import queue
import socket
import statistics
import sys
import time
import traceback
from datetime import timedelta

# Only ranks import torch: the parent stays light, and a rank failing to
# import it reports that like any other failure.

ELEMENT_BYTES = 4  # float32
MAX_RANKS = 64


def log(msg):
    print("torch_allreduce.py: " + msg, file=sys.stderr, flush=True)


class ArgParser(argparse.ArgumentParser):
    def error(self, message):  # exit 2 with a clear message (argparse's default, made explicit)
        self.print_usage(sys.stderr)
        print("torch_allreduce.py: error: " + message, file=sys.stderr, flush=True)
        sys.exit(2)


def int_at_least(minimum):
    def parse(text):
        try:
            v = int(text, 10)
        except ValueError:
            raise argparse.ArgumentTypeError("expected an integer >= %d, got %r" % (minimum, text))
        if v < minimum:
            raise argparse.ArgumentTypeError("expected an integer >= %d, got %r" % (minimum, text))
        return v

    return parse


def int_list(minimum):
    one = int_at_least(minimum)

    def parse(text):
        parts = [p.strip() for p in text.split(",")]
        if not parts or any(not p for p in parts):
            raise argparse.ArgumentTypeError("expected a comma-separated list of integers, got %r" % text)
        return [one(p) for p in parts]

    return parse


def positive_float(text):
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("expected a positive number, got %r" % text)
    if not (math.isfinite(v) and v > 0):
        raise argparse.ArgumentTypeError("expected a positive finite number, got %r" % text)
    return v


def parse_args(argv):
    p = ArgParser(description="torch.distributed gloo all_reduce peer of gridsync-bench allreduce")
    p.add_argument("--ranks", type=int_at_least(2), default=2, help="processes (>= 2, <= %d)" % MAX_RANKS)
    p.add_argument("--counts", type=int_list(2), required=True, help="float32 elements per size, comma-separated")
    p.add_argument("--iters", type=int_list(1), default=[20], help="timed iterations: one value or one per size")
    p.add_argument("--warmup", type=int_list(0), default=[5], help="untimed iterations: one value or one per size")
    p.add_argument("--timeout", type=positive_float, default=120.0, help="seconds for rendezvous and each operation")
    p.add_argument("--port", type=int_at_least(0), default=0, help="rendezvous TCP port (0: pick a free one)")
    args = p.parse_args(argv)
    if args.ranks > MAX_RANKS:
        p.error("--ranks %d: allowed 2..%d" % (args.ranks, MAX_RANKS))
    if args.port > 65535:
        p.error("--port %d: allowed 0..65535" % args.port)
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


def rank_main(rank, args, port, results):
    """One rank; reports ("start"|"size"|"done"|"error", rank, ...) on `results`."""
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
            for it in range(args.warmup[k] + args.iters[k]):
                buf.copy_(pristine)
                dist.barrier()
                start = time.perf_counter()
                dist.all_reduce(buf)  # SUM, in place; returns when done
                elapsed = time.perf_counter() - start
                if it >= args.warmup[k]:
                    times_us.append(elapsed * 1e6)
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
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    port = args.port or free_port()
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, args, port, results), daemon=True) for r in range(args.ranks)]
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

    started = set()
    done = set()
    by_size = {}  # index -> {rank: (time_us, wrong)}
    next_index = 0
    torch_version = "?"
    while len(done) < args.ranks:
        try:
            msg = results.get(timeout=0.5)
        except queue.Empty:
            # A rank that died without a word (killed, or crashed in C++).
            for r, p in enumerate(procs):
                if p.exitcode is not None and p.exitcode != 0 and r not in done:
                    fail("rank %d exited with code %s" % (r, p.exitcode))
            continue
        kind, rank = msg[0], msg[1]
        if kind == "error":
            fail("rank %d failed:\n%s" % (rank, msg[2]))
        elif kind == "start":
            torch_version = msg[2]
            started.add(rank)
            if len(started) == args.ranks:
                emit({"event": "start", "torch_version": torch_version, "ranks": args.ranks, "port": port,
                      "threads": 1})
        elif kind == "size":
            by_size.setdefault(msg[2], {})[rank] = (msg[3], msg[4])
            while len(by_size.get(next_index, {})) == args.ranks:
                ranks = by_size.pop(next_index)
                count = args.counts[next_index]
                nbytes = count * ELEMENT_BYTES
                time_us = ranks[0][0]  # rank 0's timing, as on the gridsync side
                algbw, busbw = bandwidths(nbytes, time_us, args.ranks)
                emit({"event": "size", "index": next_index, "size": nbytes, "count": count, "type": "float",
                      "iters": args.iters[next_index], "warmup": args.warmup[next_index], "time_us": time_us,
                      "algbw_gbps": algbw, "busbw_gbps": busbw, "wrong": sum(w for _, w in ranks.values())})
                next_index += 1
        elif kind == "done":
            done.add(rank)
    for p in procs:
        p.join(30)
        if p.exitcode != 0:
            fail("a rank exited with code %s" % p.exitcode)
    if next_index != len(args.counts):
        fail("only %d of %d sizes reported" % (next_index, len(args.counts)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
