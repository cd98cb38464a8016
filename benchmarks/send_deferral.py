"""When does a busy gRPC worker send a tensor? Two workers, a tensor produced early on one and needed by the other.

Worker 1 computes ``first = x @ w1`` and then a chain of ``--chain`` more
matmuls on it; worker 0 runs its own chain of ``--chain`` matmuls starting
from ``first`` (``early``: it needs worker 1's *first* result), from the
input (``independent``: no transfer) or from worker 1's *last* result
(``last``: the two chains in series). If the tensor left worker 1 when it was
computed, ``early`` would take about as long as ``independent``; if it
leaves only when worker 1's executor runs out of work, as long as ``last``.
``acknowledged`` is ``early`` with worker 1's chain waiting until worker 0
has the tensor (an ``Identity`` there, what ``placer.tf.rewrites.sends`` adds to a
placed graph): the send is then the only op worker 1 can run.
Run with the workers pinned to one core each (``LocalCluster``'s default, the
setting of every two-worker benchmark here) and unpinned. Each configuration
is timed in interleaved rounds after warm-up calls; medians and spread.

Found while tracing a two-stage training split (``benchmarks/pipeline_orders.py``):
TF's executor runs one ready successor of a finished op inline and queues
the others, ``_Send`` among them; on a one-thread worker the queued send runs
when the inline chain ends. Runs itself inside a loopback-only network
namespace (``unshare -rn``).

    python benchmarks/send_deferral.py [--chain 10] [--repeats 15] [--out benchmarks/results/send_deferral.md]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from isolation import isolated  # noqa: E402
from markdown import MarkdownOut  # noqa: E402
from speedup import ROUNDS_TEXT, interleaved_times, median_spread  # noqa: E402

MODES = ("independent", "early", "last", "acknowledged")


def _functions(cluster, chain: int, width: int):
    import tensorflow as tf

    w0, w1 = cluster.device(0), cluster.device(1)
    with tf.device(w0):
        v0 = tf.Variable(tf.random.stateless_normal((width, width), seed=(0, 0)) / width ** 0.5)
    with tf.device(w1):
        v1 = tf.Variable(tf.random.stateless_normal((width, width), seed=(0, 1)) / width ** 0.5)

    def make(mode: str):
        @tf.function
        def step(x):
            with tf.device(w1):
                first = tf.matmul(x, v1)
            got = first
            if mode == "acknowledged":  # placer.tf.rewrites.sends: worker 1 goes on once worker 0 has the tensor
                with tf.device(w0):
                    got = tf.identity(first)
                with tf.device(w1), tf.control_dependencies([got]):
                    first = tf.identity(first)
            with tf.device(w1):
                h = first
                for _ in range(chain):
                    h = tf.matmul(h, v1)
            with tf.device(w0):
                g = {"independent": x, "early": first, "last": h, "acknowledged": got}[mode]
                for _ in range(chain):
                    g = tf.matmul(g, v0)
            return h, g
        return step

    return {mode: make(mode) for mode in MODES}


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf

    import placer

    x = tf.constant(np.random.default_rng(0).standard_normal((args.batch, args.width)).astype("float32"))
    rows = []
    for pinned in (True, False):
        with placer.LocalCluster(2, pin_cores=pinned, threads=1) as cluster:
            placer.connect(cluster)
            fns = _functions(cluster, args.chain, args.width)
            calls = [(lambda f=fns[mode]: [t.numpy() for t in f(x)]) for mode in MODES]
            times = interleaved_times(calls, args.repeats)
            rows.append((pinned, [median_spread(ts) for ts in times]))
            print(f"  pinned={pinned}: done", file=sys.stderr, flush=True)
    out = MarkdownOut()
    out("## When a busy gRPC worker sends a tensor (2 workers, one thread each)")
    out()
    out(f"{time.strftime('%Y-%m-%d')}; worker 1: `first = x @ w1`, then {args.chain} more matmuls; worker 0: "
        f"{args.chain} matmuls from the input (independent), from `first` (early) or from worker 1's last result "
        f"(last), or from `first` with worker 1's chain waiting until worker 0 has it (acknowledged, what "
        f"`placer.tf.rewrites.sends` adds); batch {args.batch}, width {args.width}; {args.repeats} interleaved rounds ({ROUNDS_TEXT}); "
        "median ± half the interquartile range. early ≈ independent: the tensor left when it was computed; early ≈ last: it "
        "left when worker 1 had nothing else to run.")
    out()
    out("| workers | independent ms | early ms | last ms | acknowledged ms | early's wait (share of worker 1's "
        "chain) | acknowledged's wait |")
    out("|---|---|---|---|---|---|---|")
    for pinned, stats in rows:
        (ind, ind_s), (early, early_s), (last, last_s), (ack, ack_s) = stats
        span = max(last - ind, 1e-9)
        out(f"| {'pinned to one core each' if pinned else 'not pinned'} | {1e3 * ind:.1f} ± {1e3 * ind_s:.1f} | "
            f"{1e3 * early:.1f} ± {1e3 * early_s:.1f} | {1e3 * last:.1f} ± {1e3 * last_s:.1f} | "
            f"{1e3 * ack:.1f} ± {1e3 * ack_s:.1f} | {100 * (early - ind) / span:.0f}% | "
            f"{100 * (ack - ind) / span:.0f}% |")
    out.write(args.out)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--chain", type=int, default=10, help="matmuls after the sent one, on each worker")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=15, help="interleaved rounds per configuration")
    ap.add_argument("--out", default=str(HERE / "results" / "send_deferral.md"))
    args = ap.parse_args()
    return isolated(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
