"""Fetching a function's output from a gRPC worker: after the call (TensorFlow's eager fetch) or inside it.

A ``tf.function`` whose ops run on worker 0 returns an output made there. Timed per call (the output fetched
to this process as NumPy), interleaved, for each number of variables the function captures on worker 0, each
output size, and two ways of returning the output: as it is (the runtime fetches it after the call) and
received on the caller inside the function (``placer.measure.links.on_caller``: an identity on this
process's CPU, what placed functions, their stand-ins and the benchmarks' one-worker baselines do). At each
link rate (the loopback shaped inside the namespace, ``placer.measure.cluster.shape_loopback``). Runs itself
inside a loopback-only network namespace.

    python benchmarks/fetch_to_caller.py [--links none 1gbit] [--repeats 9] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from isolation import isolated  # noqa: E402
from markdown import MarkdownOut  # noqa: E402
from speedup import ROUNDS_TEXT, interleaved_times, median_spread  # noqa: E402

#: Output shapes timed: a classifier's logits at batch 8, and a language model's at batch 32 (16 MB).
SHAPES = ((8, 10), (32, 64, 2000))
#: Variables the function captures on the worker.
CAPTURES = (0, 1, 2, 10)


def run(args: argparse.Namespace) -> int:
    import tensorflow as tf

    import placer
    from placer.measure.cluster import shape_loopback
    from placer.measure.links import CLIENT_DEVICE, on_caller

    out = MarkdownOut()
    out("## Fetching a worker's output: after the call or inside it")
    out()
    out(f"{datetime.date.today()}; `python benchmarks/fetch_to_caller.py --links {' '.join(args.links)} "
        f"--repeats {args.repeats}`; two TF gRPC workers (one pinned core, one thread each), the function's ops "
        f"on worker 0; medians of {args.repeats} interleaved rounds after 2 warm-up calls ({ROUNDS_TEXT}), "
        "spread = half the IQR. "
        "'after the call': the output returned as made on the worker; 'inside': received on the caller inside "
        "the function (`placer.measure.links.on_caller`).")
    out()
    out("| link | output | captured variables | after the call ms | ± | inside ms | ± | after / inside |")
    out("|---|---|---|---|---|---|---|---|")
    with placer.LocalCluster(2, pin_cores=True, threads=1) as cluster:
        worker = placer.connect(cluster)[0]
        with tf.device(CLIENT_DEVICE):
            x = tf.zeros([4], tf.float32)

        def make(shape: tuple[int, ...], captures: int, inside: bool):
            with tf.device(worker):
                variables = [tf.Variable(0.0) for _ in range(captures)]

            @tf.function(autograph=False)
            def f(v: tf.Tensor) -> tf.Tensor:
                with tf.device(worker):
                    y = tf.fill(shape, tf.add_n([v[0] + 1.0, *[w.read_value() for w in variables]]))
                return on_caller(y) if inside else y

            return lambda: f(x)

        for link in args.links:
            shape_loopback(link)
            cases = [(shape, n) for shape in SHAPES for n in CAPTURES]
            fns = [make(shape, n, inside) for shape, n in cases for inside in (False, True)]
            stats = [median_spread(np.asarray(ts) * 1e3) for ts in interleaved_times(fns, args.repeats)]
            for c, (shape, n) in enumerate(cases):
                (after, after_spread), (inside, inside_spread) = stats[2 * c], stats[2 * c + 1]
                mb = np.prod(shape) * 4 / 1e6
                out(f"| {link} | {'×'.join(map(str, shape))} float32 ({mb:.3g} MB) | {n} | {after:.2f} | "
                    f"{after_spread:.2f} | {inside:.2f} | {inside_spread:.2f} | {after / inside:.2f}× |")
        shape_loopback("none")
    out.write(args.out)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--links", nargs="+", default=["none", "1gbit"])
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--out", default=str(HERE / "results" / "fetch_to_caller.md"))
    args = ap.parse_args()
    return isolated(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
