"""Operator splitting on two TF gRPC workers: a wide MLP at small batch, split plans against what runs instead.

A chain of ``--layers`` dense layers of ``--width`` (ReLU; 4 × 8192 by default: 1 GiB of float32 weights)
reads its whole weights once per step: at batch 1-8 its time is the time to stream them from memory, and no
placement of whole ops can shorten a step (each layer waits for the one before). Two worker processes on
127.0.0.1, each pinned to one core with one thread (``placer.LocalCluster``). Per batch size, measured
interleaved in one run:

* ``one worker``: the model cloned onto worker 0 with its weights, one ``tf.function``;
* ``copy per worker (by hand)``: data parallelism, a clone with its weights on each worker, half the batch
  each (batch ≥ 2);
* ``autoplace splits='none'``: autoplace's best plan of whole ops (model parallelism, micro-batches or a
  copy per worker: ``replicas="auto"``), the tool's alternative without splitting;
* ``autoplace default``: ``placer.autoplace(model, devices, batch_size=b)`` (``splits="auto"``: each
  large product split by output columns into one part per worker, its weight sharded, where predicted
  faster).

Each step fetches its outputs. Medians of ``--repeats`` interleaved rounds, spread = half the IQR, the
predicted step of every autoplace row beside its measurement, and the split outputs' largest relative
difference from the model's. Runs itself inside a loopback-only network namespace.

    python benchmarks/splitting.py [--batches 1 4 8] [--width 8192] [--layers 4] [--repeats 7]
                                   [--out benchmarks/results/splitting.md]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from isolation import isolated  # noqa: E402
from markdown import MarkdownOut  # noqa: E402
from speedup import ROUNDS_TEXT, interleaved_times, median_spread  # noqa: E402


def wide_mlp(width: int, layers: int) -> "object":
    """``layers`` dense layers of ``width`` with ReLU on a ``width``-wide input."""
    import keras

    inp = keras.Input((width,), name="features")
    h = inp
    for i in range(layers):
        h = keras.layers.Dense(width, activation="relu", name=f"wide{i}")(h)
    return keras.Model(inp, h, name="wide_mlp")


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf

    import placer
    from placer.tf.measuring import copy_per_device

    out = MarkdownOut()
    keras.utils.set_random_seed(0)
    model = wide_mlp(args.width, args.layers)
    weight_mb = sum(int(np.prod(w.shape)) * 4 for w in model.weights) / 2**20
    with placer.LocalCluster(2, pin_cores=True, threads=1) as cluster:
        devices = placer.connect(cluster)
        out("## Operator splitting on 2 TF gRPC workers (one pinned core, one thread each)")
        out()
        out(f"{time.strftime('%Y-%m-%d')}; `python benchmarks/splitting.py --batches "
            f"{' '.join(map(str, args.batches))} --width {args.width} --layers {args.layers} --repeats "
            f"{args.repeats}`; a chain of {args.layers} dense layers of {args.width} (ReLU), {weight_mb:.0f} MiB "
            f"of float32 weights; {args.repeats} interleaved rounds after 2 warm-up calls ({ROUNDS_TEXT}); "
            "speedup = one worker's step / this step (the same batch); predicted = the plan's predicted step "
            "(simulated, plus its measured fixed cost per call). Every row fetches its outputs.")
        out()
        out("| batch | strategy | measured ms | ± | speedup over one worker | predicted ms | prediction error | "
            "max rel. diff from the model |")
        out("|---|---|---|---|---|---|---|---|")
        by_hand, (w0, _w1) = copy_per_device(model, devices)
        summary = []
        for batch in args.batches:
            x = np.random.default_rng(batch).standard_normal((batch, args.width)).astype("float32")
            xs = tf.constant(x)
            ref = model(xs, training=False).numpy()

            @tf.function(autograph=False)
            def one(v):
                with tf.device(devices[0]):
                    return w0(v, training=False)

            configs: list[tuple[str, object, float | None, object]] = [
                ("one worker", lambda f=one: f(xs).numpy(), None, None)]
            if batch >= 2:
                configs.append(("copy per worker (by hand)", lambda: by_hand(xs).numpy(), None, None))
            for label, options in (("autoplace splits='none'", dict(splits="none")), ("autoplace default", {})):
                t = time.perf_counter()
                p = placer.autoplace(model, devices, batch_size=batch, **options)
                plan = p.plan
                print(f"  batch {batch} {label}: placed in {time.perf_counter() - t:.1f} s: "
                      f"{len(plan.splits)} split ops, replicas {plan.replicas}, m {plan.microbatches}, "
                      f"{len(set(plan.assignment.values()))} worker(s)", file=sys.stderr, flush=True)
                configs.append((label, lambda p=p: p(xs).numpy(), plan.predicted_step_time_s, p))
            times = interleaved_times([step for _, step, _, _ in configs], args.repeats)
            medians = [median_spread(ts) for ts in times]
            base = medians[0][0]
            for (label, step, pred, p), (med, spread) in zip(configs, medians):
                detail, diff = "", ""
                if p is not None:
                    plan = p.plan
                    detail = (f" ({len(plan.splits)} ops split {max(plan.splits.values())} ways)" if plan.splits else
                              f" ({plan.replicas} copies)" if plan.replicas > 1 else
                              f" (whole ops, m={plan.microbatches}, {len(set(plan.assignment.values()))} worker(s))")
                    got = step()
                    diff = f"{float(np.max(np.abs(got - ref)) / max(np.max(np.abs(ref)), 1e-30)):.1e}"
                pred_s = f"{pred * 1e3:.1f}" if pred is not None else ""
                err = f"{100 * (pred - med) / med:+.1f}%" if pred is not None else ""
                out(f"| {batch} | {label}{detail} | {med * 1e3:.1f} | {spread * 1e3:.1f} | {base / med:.2f}× | "
                    f"{pred_s} | {err} | {diff} |")
            labels = [c[0] for c in configs]
            ia = labels.index("autoplace default")
            best_ms, best_label = min((medians[i][0], labels[i]) for i in range(len(labels)) if i != ia)
            auto = configs[ia][3].plan
            summary.append((batch, base / medians[ia][0], best_label, best_ms / medians[ia][0],
                            (auto.predicted_step_time_s - medians[ia][0]) / medians[ia][0], bool(auto.splits)))
        out()
        for batch, speedup, best_label, vs_best, err, split in summary:
            out(f"- batch {batch}: autoplace's default ({'split' if split else 'whole ops'}) {speedup:.2f}× one "
                f"worker, {vs_best:.2f}× the best alternative measured ({best_label}); its prediction "
                f"{100 * err:+.1f}% off its measurement")
    out.write(args.out)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 4, 8])
    ap.add_argument("--width", type=int, default=8192)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=7, help="interleaved measured rounds per strategy")
    ap.add_argument("--out", default=str(HERE / "results" / "splitting.md"))
    args = ap.parse_args()
    return isolated(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
