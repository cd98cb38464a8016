"""Measured: a plan's planned execution order against the executor's, on two TF gRPC workers.

Two worker processes on 127.0.0.1, each pinned to one core with one intra- and one inter-op thread
(``placer.LocalCluster``, as ``benchmarks/speedup.py``). Per workload, ``objective="latency"``, these
placements are made with ``placer.autoplace`` and measured, interleaved, on the same batch:

* ``auto (executor)``: autoplace's default ``execution_order="executor"`` (every plan in TensorFlow's order);
* ``auto``: ``execution_order="auto"``, which keeps a plan with a planned order where it is predicted faster;
* ``cp_etf ordered``: ``algorithm="cp_etf"`` (its list schedule's order, control edges in the graph);
* ``cp_etf, executor's order``: the same assignment re-applied without its order.

The last two isolate what the order itself does on one assignment. Prints and writes a table of
measured medians with spread (half the interquartile range) beside the predicted step (the simulator:
ops profiled on worker 0, calibrated link, one-thread workers' depth-first ready order). Runs itself in a
loopback-only network namespace (``unshare -rn``), or exits with a message.

    python benchmarks/order_measured.py [--models lstm_seq2seq ...] [--repeats 9]
                                        [--out benchmarks/results/order_measured.md]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from isolation import isolated  # noqa: E402
from markdown import MarkdownOut  # noqa: E402
from speedup import ROUNDS_TEXT, interleaved_times, median_spread  # noqa: E402

#: name -> (workloads builder, its kwargs, batch, training)
CASES = {
    "lstm_seq2seq_inference": ("lstm_seq2seq", dict(seq=16, features=32, units=128), 16, False),
    "transformer_training": ("transformer_encoder", dict(seq=32, dim=64, heads=4, layers=2), 8, True),
    "inception_v3_inference": ("inception_v3", dict(size=75), 4, False),
}


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import placer

    out = MarkdownOut()
    failed = []
    with placer.LocalCluster(2, pin_cores=True, threads=1) as cluster:
        devices = placer.connect(cluster)
        out("## Measured: planned execution order against the executor's (2 TF gRPC workers, one core each)")
        out()
        out(f"{time.strftime('%Y-%m-%d')}; objective latency; {args.repeats} interleaved rounds per placement after "
            f"2 warm-up calls ({ROUNDS_TEXT}); medians ± half the interquartile range; predicted = the plan's predicted step "
            "(simulated); error = (predicted - measured) / measured; `ordered ops`: ops the plan orders.")
        out()
        out("| workload | placement | plan | ordered ops | measured ms | ± | predicted ms | error |")
        out("|---|---|---|---|---|---|---|---|")
        for case in args.models:
            try:
                _run_case(case, args, out, devices)
            except Exception as e:  # recorded, reported by the exit status, then the next case
                failed.append(case)
                traceback.print_exc()
                out(f"| {case} | failed: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''} "
                    "| | | | | | |")
    out.write(args.out)
    return 1 if failed else 0


def _run_case(case: str, args: argparse.Namespace, out, devices: list[str]) -> None:
    import keras
    import tensorflow as tf
    import workloads

    import placer

    builder, kwargs, batch, training = CASES[case]
    keras.utils.set_random_seed(0)
    model = getattr(workloads, builder)(**kwargs)
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((batch, *t.shape[1:])).astype("float32") for t in model.inputs]
    x = xs[0] if len(xs) == 1 else xs
    extra = {}
    y = None
    if training:
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
        y = rng.standard_normal((batch, *model.outputs[0].shape[1:])).astype("float32")
        extra = dict(training=True)

    def place(label, **options):
        t = time.perf_counter()
        p = placer.autoplace(model, devices, batch_size=batch, objective="latency", time_limit_s=args.time_limit,
                             **extra, **options)
        print(f"  {case} {label}: placed in {time.perf_counter() - t:.1f} s ({p.plan.solver})", file=sys.stderr,
              flush=True)
        return p

    configs = [("auto (executor)", place("auto (executor)")),  # autoplace's default
               ("auto", place("auto", execution_order="auto"))]
    ordered = place("cp_etf", algorithm="cp_etf", execution_order="auto")
    configs.append(("cp_etf ordered", ordered))
    configs.append(("cp_etf, executor's order", place("cp_etf unordered", plan=replace(ordered.plan, op_order={}))))

    def step_of(p):
        if training:
            return lambda: p.train_on_batch(x, y)
        return lambda: [t.numpy() for t in tf.nest.flatten(p(x))]

    times = interleaved_times([step_of(p) for _, p in configs], args.repeats)
    for (label, p), ts in zip(configs, times):
        med, spread = median_spread(ts)
        pred = p.plan.predicted_step_time_s
        ops = sum(len(v) for v in p.plan.op_order.values())
        out(f"| {case} | {label} | {p.plan.solver} | {ops} | {med * 1e3:.2f} | {spread * 1e3:.2f} | "
            f"{pred * 1e3:.2f} | {100 * (pred - med) / med:+.1f}% |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--repeats", type=int, default=9, help="interleaved measured rounds per placement")
    ap.add_argument("--time-limit", type=float, default=5.0, help="solver time limit per placement (s)")
    ap.add_argument("--out", default=str(HERE / "results" / "order_measured.md"))
    args = ap.parse_args()
    return isolated(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
