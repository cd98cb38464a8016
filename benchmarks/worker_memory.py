"""Workers' memory after placed models are dropped: one chain placed again and again on one cluster.

A user who places a model, uses it and drops it, then places it again (a notebook, a sweep) expects the
workers to give the first placement's memory back. This places a dense chain (``--layers`` layers of
``--width``, float32) on two TF gRPC workers (one pinned core, one thread each) ``--placements`` times; each
placed model is called (a watched call) and then dropped (``del`` and ``gc.collect()``). After each drop it
reads, per worker: its resident memory (``VmRSS``) and the bytes its allocator has in use while a probe step
allocates 4 MiB there (the allocator's own events: the workers run with ``TF_CPU_ALLOCATOR_USE_BFC=true`` and
their profiler servers, :func:`worker_trace.allocator_peaks`), and how many of the dropped model's variables
this process still holds. First, as a control, the same weights placed by hand (``tf.Variable`` objects, half the
layers on each worker, called through a ``tf.function``) and dropped. Runs itself inside a loopback-only
network namespace.

Until 2026-12-07 an idle call thread kept each dropped placed model's last call (and so its weights on the
workers) for a minute: a 256 MiB chain placed three times held 156, 284 and 412 MiB on worker 0.

    python benchmarks/worker_memory.py [--width 4096] [--layers 4] [--placements 3]
                                       [--out benchmarks/results/worker_memory.md]
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
import weakref
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from isolation import isolated  # noqa: E402
from markdown import MarkdownOut  # noqa: E402
from worker_trace import allocator_peaks, process_memory  # noqa: E402


def by_hand(model, devices: list[str], x) -> list[weakref.ref]:
    """What a user writes instead of placing ``model``: its layers' weights as variables, the first half of the
    layers on ``devices[0]``, the rest on ``devices[1]``, called once on ``x`` through a ``tf.function``; returns
    weak references to the variables (all dropped when this returns)."""
    import tensorflow as tf

    half = len(model.layers) // 2
    weights = []
    for i, layer in enumerate(model.layers):
        with tf.device(devices[0 if i < half else 1]):
            weights.append([tf.Variable(w) for w in layer.get_weights()])

    @tf.function
    def chain(h: tf.Tensor) -> tf.Tensor:
        for i, (kernel, bias) in enumerate(weights):
            with tf.device(devices[0 if i < half else 1]):
                h = tf.nn.relu(h @ kernel + bias)
        return h

    chain(tf.constant(x)).numpy()
    return [weakref.ref(v) for layer in weights for v in layer]


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import numpy as np
    import tensorflow as tf

    import placer

    out = MarkdownOut()
    weights_mib = args.layers * args.width * (args.width + 1) * 4 / 2**20
    out("## Workers' memory after placed models are dropped")
    out()
    out(f"{time.strftime('%Y-%m-%d')}; `python benchmarks/worker_memory.py --width {args.width} --layers "
        f"{args.layers} --placements {args.placements}`; a chain of {args.layers} dense layers of {args.width} "
        f"({weights_mib:.0f} MiB of float32 weights) placed by autoplace's defaults on 2 gRPC workers, called, "
        "then dropped (`del`, `gc.collect()`), each time on the same cluster, after the same weights placed by "
        "hand and dropped (the control); after each drop, per worker: its "
        "resident memory and the bytes its allocator has in use while a probe step allocates 4 MiB there (the "
        "allocator's own events), and the dropped model's variables this process still holds.")
    out()
    out("| after | worker 0 RSS MiB | worker 1 RSS MiB | worker 0 allocator in use, MiB (probe's 4 MiB included) | "
        "worker 1 allocator in use, MiB | variables still held here |")
    out("|---|---|---|---|---|---|")
    with placer.LocalCluster(2, profiler=True, env={"TF_CPU_ALLOCATOR_USE_BFC": "true"}) as cluster:
        devices = placer.connect(cluster)

        def probe() -> None:
            for d in devices:
                with tf.device(d):
                    tf.reduce_sum(tf.random.uniform((1024, 1024))).numpy()

        def row(label: str, held: str) -> None:
            gc.collect()
            time.sleep(2.5)  # past the workers' idle heap trim (one second)
            in_use = allocator_peaks(cluster, probe, 300)
            rss = [process_memory(p.pid)["VmRSS"] >> 20 for p in cluster.procs]
            peaks = [f"{b / 2**20:.1f}" if np.isfinite(b) else "no events" for b in in_use]
            out(f"| {label} | {rss[0]} | {rss[1]} | {peaks[0]} | {peaks[1]} | {held} |")

        row("start (nothing placed)", "—")
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((args.width,))] +
                                 [keras.layers.Dense(args.width, activation="relu") for _ in range(args.layers)])
        x = np.ones((args.batch, args.width), "float32")
        refs = by_hand(model, devices, x)
        gc.collect()
        row("the same weights by hand (`tf.Variable`s, half the layers on each worker, a `tf.function`), dropped",
            f"{sum(r() is not None for r in refs)} of {len(refs)}")
        for k in range(args.placements):
            placed = placer.autoplace(model, devices, batch_size=args.batch, time_limit_s=5)
            placed(x)
            refs = [weakref.ref(v) for v in placed.placement.variables.values()]
            del placed
            gc.collect()
            row(f"placement {k + 1} dropped", f"{sum(r() is not None for r in refs)} of {len(refs)}")
    out.write(args.out)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--placements", type=int, default=3)
    ap.add_argument("--out", default=str(HERE / "results" / "worker_memory.md"))
    args = ap.parse_args()
    return isolated(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
