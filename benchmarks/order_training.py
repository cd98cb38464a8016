"""Measured: a step over two one-thread workers run in the simulator's order against the executor's.

Workloads of the strategy benchmark (``--cases``, ``strategy.CASES``: its 105M-parameter MLP's, 4-tower
MLP's and Transformer's training steps, the 4-tower MLP's and InceptionV3's inference) are each placed on
``placer.LocalCluster(2, pin_cores=True, threads=1)`` as one copy over both workers (``replicas=1``,
``splits=--splits``, ``sends=--sends``). Traced (``benchmarks/worker_trace.py --workload wide-train
--timeline``), such a step ran each layer's weight gradient *before* its input gradient on the worker that
received the layer's output gradient, delaying the input-gradient chain the other worker waits for; the
simulator runs the input gradient first and predicts the step 20-30% faster than it measures. This benchmark
places the same plan again with the order of the plan's own simulation fixed on each device (``Plan.op_order``:
the ops of at least ``--min-us`` µs in their simulated start order, control edges in the placed graph) and
measures them interleaved: one worker, the plan in the executor's order (``execution_order="executor"``), the
plan in its simulated order, and autoplace's default (``execution_order="simulated"``: its order stage fixes
the order, or falls back to one worker where the ordered plan is not ``split_margin`` faster).

    python benchmarks/order_training.py [--cases wide_training ...] [--repeats 7] [--sends auto] [--min-us 50]
                                        [--splits none] [--out benchmarks/results/order_training.md]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from isolation import isolated  # noqa: E402
from markdown import MarkdownOut  # noqa: E402
from speedup import ROUNDS_TEXT, interleaved_times, median_spread  # noqa: E402


#: The workloads measured by default: the training steps and inference passes of ``benchmarks/strategy.py`` whose
#: one-copy plans spread over both workers.
DEFAULT_CASES = ("wide_training", "towers_training", "transformer_training", "towers", "inception_v3")


def simulated_order(placed, min_us: float) -> dict[str, tuple[str, ...]]:
    """Per device, the ops of ``placed``'s plan that ran at least ``min_us`` in the plan's emitted simulation,
    in their start order there (:func:`placer.core.order.timeline_order`, as the order stage takes it)."""
    from placer.core.order import timeline_order

    pl = placed.placement
    names = pl.devices.names
    order = timeline_order(pl.report.step_simulation.timeline, len(names), 1e-6 * min_us)
    return {names[d]: tuple(pl.report._op_name(v) for v in ops) for d, ops in enumerate(order) if ops}


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import placer

    out = MarkdownOut()
    out("## Steps over two one-thread gRPC workers in the simulated order against the executor's")
    out()
    out(f"{time.strftime('%Y-%m-%d')}; `python benchmarks/order_training.py --cases {' '.join(args.cases)} --repeats "
        f"{args.repeats} --sends {args.sends} --splits {args.splits} --min-us {args.min_us:g}`; workloads of "
        f"`benchmarks/strategy.py` at its batches; {args.repeats} interleaved rounds ({ROUNDS_TEXT}). Rows: one "
        "worker; the one-copy plan (`replicas=1`) in the executor's order (`execution_order=\"executor\"`); that "
        f"plan placed again with its simulated order of ops of {args.min_us:g} µs or more fixed; autoplace's "
        "default (`execution_order=\"simulated\"`, its order stage: the plan's own simulated order fixed, or one "
        "worker where the ordered plan is not `split_margin` faster).")
    with placer.LocalCluster(2, pin_cores=True, threads=1) as cluster:
        devices = placer.connect(cluster)
        for case in args.cases:
            _run_case(case, args, devices, out)
    out.write(args.out)
    return 0


def _run_case(case: str, args: argparse.Namespace, devices: list[str], out: MarkdownOut) -> None:
    import keras

    import placer
    from placer.tf.measuring import fit_step
    from strategy import CASES

    builder, batch, inputs, training = CASES[case]
    keras.utils.set_random_seed(0)
    model = builder()
    rng = np.random.default_rng(0)
    x = inputs(rng, batch)
    if training:
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
        y = rng.standard_normal((batch, *model.outputs[0].shape[1:])).astype("float32")
        step = lambda p: fit_step(p, x, y)  # noqa: E731
    else:
        step = lambda p: p(x).numpy()  # noqa: E731
    common = dict(training=training, batch_size=batch)
    placed = {"one worker": placer.autoplace(model, devices, algorithm="single", splits="none", **common)}
    plan = placer.autoplace(model, devices, replicas=1, splits=args.splits, sends=args.sends,
                            execution_order="executor", **common)
    placed["one copy, executor's order"] = plan
    order = simulated_order(plan, args.min_us)
    placed["one copy, simulated order"] = placer.autoplace(
        model, devices, plan=replace(plan.plan, op_order=order), sends=args.sends, **common)
    # autoplace's default (execution_order="simulated"): its own plan, ordered in the order stage
    placed["one copy, autoplace's default order"] = placer.autoplace(model, devices, replicas=1, splits=args.splits,
                                                                      sends=args.sends, **common)
    labels = list(placed)
    times = interleaved_times([lambda p=placed[k]: step(p) for k in labels], args.repeats)
    out()
    out(f"### {case}, batch {batch}")
    out()
    out("| placement | devices used | ordered ops | measured ms | ± | predicted ms | prediction error |")
    out("|---|---|---|---|---|---|---|")
    for label, ts in zip(labels, times):
        med, spread = median_spread(ts)
        p = placed[label].plan
        pred = p.predicted_step_time_s
        out(f"| {label} | {len(set(p.assignment.values()))} | {sum(map(len, p.op_order.values()))} | "
            f"{med * 1e3:.1f} | {spread * 1e3:.1f} | {pred * 1e3:.1f} | {100 * (pred - med) / med:+.1f}% |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", nargs="+", default=list(DEFAULT_CASES),
                    help="workloads of benchmarks/strategy.py (CASES)")
    ap.add_argument("--splits", default="none", choices=["none", "auto", "all"], help="splits= of the one-copy plan")
    ap.add_argument("--repeats", type=int, default=7, help="interleaved measured rounds per placement")
    ap.add_argument("--sends", default="auto", choices=["auto", "prompt", "executor"])
    ap.add_argument("--min-us", type=float, default=50.0, help="the shortest op the simulated order row fixes (µs)")
    ap.add_argument("--out", default=str(HERE / "results" / "order_training.md"))
    args = ap.parse_args()
    return isolated(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
