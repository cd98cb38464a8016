"""Summing one gradient across two TF gRPC workers: TF's collective all-reduce against parameter-server sums.

What a data-parallel training step's gradient sum costs, three ways, each leaving the sum on both workers
(each worker holds its own gradient, a float32 vector of ``--mib`` MiB, as a variable):

* ``parameter server, one home``: worker 1 sends its gradient to worker 0, which adds and sends the sum
  back (what autoplace's ``replicas=2`` training does: the variables live on the first copy's device, the
  other copy sends its gradients there and reads the updated weights from there next step);
* ``parameter server, homes split``: each worker is home to half the vector: each sends the other half to
  the other, adds the half it receives, and sends its half-sum back (a ring all-reduce of two, by hand);
* ``collective all-reduce``: ``tf.raw_ops.CollectiveReduce`` (TF's collective ops, ``merge_op="Add"``) on
  each worker, one instance per size, run from this one client (``CollectiveReduceV2`` timed out waiting
  for the group here; the V1 op forms its group from its attributes).

Each call fetches one scalar per worker (the sum's first element) on the caller. Medians of ``--repeats``
interleaved rounds, spread = half the IQR, at each ``--links`` rate (``placer.measure.cluster.shape_loopback``:
one token bucket for both directions, so the exchange both ways at once gets no full-duplex gain on a shaped
link). Runs itself inside a loopback-only network namespace.

    python benchmarks/allreduce.py [--mib 1 16 64] [--links none 10gbit 1gbit] [--repeats 7]
                                   [--out benchmarks/results/allreduce.md]
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

from placer.measure.cluster import LINK_RATES, shape_loopback  # noqa: E402


def sums(devices: list[str], elements: int, instance_key: int) -> dict[str, object]:
    """label → a call that sums the two workers' gradients (``elements`` float32 each) and fetches a scalar of
    the sum from each worker."""
    import tensorflow as tf

    from placer.measure.links import on_caller

    w0, w1 = devices
    grads = []
    for i, d in enumerate(devices):
        with tf.device(d):
            grads.append(tf.Variable(tf.fill([elements], float(i + 1))))
    g0, g1 = grads
    half = elements // 2

    @tf.function(autograph=False)
    def one_home():
        with tf.device(w0):
            s0 = g0.read_value() + g1.read_value()  # g1 crosses to worker 0
            first0 = s0[0]
        with tf.device(w1):
            first1 = tf.identity(s0)[0]  # and the sum back
        return on_caller(first0), on_caller(first1)

    @tf.function(autograph=False)
    def homes_split():
        with tf.device(w0):
            g0_b = g0[half:]  # sliced where they live: only the half crosses
        with tf.device(w1):
            g1_a = g1[:half]
        with tf.device(w0):
            a0 = g0[:half] + g1_a
        with tf.device(w1):
            b1 = g0_b + g1[half:]
        with tf.device(w0):
            first0 = tf.concat([a0, b1], 0)[0]
        with tf.device(w1):
            last1 = tf.concat([a0, b1], 0)[-1]
        return on_caller(first0), on_caller(last1)  # (each scalar cut on its worker: only it comes here)

    @tf.function(autograph=False)
    def collective():
        outs = []
        for d, g in zip(devices, grads):
            with tf.device(d):
                s = tf.raw_ops.CollectiveReduce(input=g.read_value(), group_size=2, group_key=1,
                                                instance_key=instance_key, merge_op="Add", final_op="Id",
                                                subdiv_offsets=[0], timeout_seconds=120)
                outs.append(on_caller(s[0]))
        return outs

    return {"parameter server, one home": one_home, "parameter server, homes split": homes_split,
            "collective all-reduce (CollectiveReduce)": collective}


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import placer

    out = MarkdownOut()
    with placer.LocalCluster(2, pin_cores=True, threads=1) as cluster:
        devices = placer.connect(cluster)
        out("## Summing a gradient across 2 TF gRPC workers (one pinned core, one thread each)")
        out()
        out(f"{time.strftime('%Y-%m-%d')}; `python benchmarks/allreduce.py --mib {' '.join(map(str, args.mib))} "
            f"--links {' '.join(args.links)} --repeats {args.repeats}`; {args.repeats} interleaved rounds after 2 "
            f"warm-up calls ({ROUNDS_TEXT}); every way leaves the sum on both workers and fetches one scalar "
            "from each; ratio = the one-home parameter server's time / this one (the same size and link).")
        out()
        out("| link | MiB | way | measured ms | ± | ratio | effective GB/s (the vector's bytes / time) |")
        out("|---|---|---|---|---|---|---|")
        key = 1
        for link in args.links:
            shape_loopback(link)
            for mib in args.mib:
                elements = mib * 2**20 // 4
                ways = sums(devices, elements, key)
                key += 1
                expect = 3.0
                for label, fn in ways.items():  # every way gives 1 + 2 on both workers
                    got = [float(t) for t in fn()]
                    if got != [expect, expect]:
                        raise AssertionError(f"{label}: {got}, not [{expect}, {expect}]")
                times = interleaved_times([lambda f=f: [t.numpy() for t in f()] for f in ways.values()],
                                          args.repeats)
                medians = [median_spread(ts) for ts in times]
                base = medians[0][0]
                for label, (med, spread) in zip(ways, medians):
                    out(f"| {link} | {mib} | {label} | {med * 1e3:.1f} | {spread * 1e3:.1f} | {base / med:.2f}× | "
                        f"{mib * 2**20 / med / 1e9:.2f} |")
                print(f"  {link} {mib} MiB done", file=sys.stderr, flush=True)
        shape_loopback("none")
    out.write(args.out)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", nargs="+", type=int, default=[1, 16, 64])
    ap.add_argument("--links", nargs="+", default=["none", "10gbit", "1gbit"], choices=["none", *LINK_RATES])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", default=str(HERE / "results" / "allreduce.md"))
    args = ap.parse_args()
    return isolated(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
