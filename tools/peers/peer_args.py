"""Argument parsing shared by the PyTorch peers of gridsync-bench
(torch_allreduce.py, torch_hashgrid.py): a bad argument exits 2 naming what
was given and what is allowed, as the C++ side's CLI11 parsing does.

The peers run as scripts, so their own folder is first on sys.path and
`import peer_args` finds this file beside them.
"""

import argparse
import math
import sys


class ArgParser(argparse.ArgumentParser):
    """Exits 2 with "<script>: error: <message>" after the usage line
    (argparse's default status, made explicit)."""

    def error(self, message):
        self.print_usage(sys.stderr)
        print("%s: error: %s" % (self.prog, message), file=sys.stderr, flush=True)
        sys.exit(2)


def int_at_least(minimum):
    """A type for integers >= minimum."""

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
    """A type for comma-separated integers, each >= minimum."""
    one = int_at_least(minimum)

    def parse(text):
        parts = [p.strip() for p in text.split(",")]
        if not parts or any(not p for p in parts):
            raise argparse.ArgumentTypeError("expected a comma-separated list of integers, got %r" % text)
        return [one(p) for p in parts]

    return parse


def positive_float(text):
    """A type for finite numbers above 0."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("expected a positive number, got %r" % text)
    if not (math.isfinite(v) and v > 0):
        raise argparse.ArgumentTypeError("expected a positive finite number, got %r" % text)
    return v
