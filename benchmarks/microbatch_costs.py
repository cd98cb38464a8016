"""Micro-batch costs: one worker's step at m = 1, 2, 4, 8 micro-batches, measured against autoplace's prediction.

The pipeline decision (``microbatches="auto"``, and the copies' step) reads op
times at a micro-batch's rows: a second profile at the smallest micro-batch,
interpolated (``placer.core.microbatch.SmallBatchCosts``), plus one gate per
micro-batch and device. Here that model meets a run with nothing to overlap:
each workload placed on worker 0 alone (``algorithm="single"``) at each ``m``,
every placement timed interleaved with the others (``--repeats`` rounds,
medians, half the IQR), predicted beside measured. Issue 42 asks for every ``m``
within 10%. Two gRPC workers are started (one pinned core each); only worker 0
runs.

    python benchmarks/microbatch_costs.py [--models decoder towers transformer_training wide_training]
                                          [--microbatches 1 2 4 8] [--repeats 7]
                                          [--out benchmarks/results/microbatch_costs.md]
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
from strategy import CASES  # noqa: E402


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf

    import placer
    from placer.tf.measuring import fit_step

    out = MarkdownOut()
    errors: list[float] = []
    with placer.LocalCluster(2, pin_cores=True, threads=1) as cluster:
        devices = placer.connect(cluster)
        out("## Micro-batch costs on one TF gRPC worker (one pinned core, one thread)")
        out()
        out(f"{time.strftime('%Y-%m-%d')}; `python benchmarks/microbatch_costs.py --models {' '.join(args.models)} "
            f"--microbatches {' '.join(map(str, args.microbatches))} --repeats {args.repeats}`; each workload "
            "(`benchmarks/strategy.py`'s) placed on worker 0 alone (`algorithm=\"single\"`) at each micro-batch "
            f"count, {args.repeats} interleaved rounds ({ROUNDS_TEXT}); predicted = the plan's predicted step "
            "(simulated pipelined step plus its measured fixed cost per call). Inference rows fetch the outputs; "
            "training rows run one Keras step as `fit` does (`placer.tf.measuring.fit_step`; SGD, MSE).")
        out()
        out("| workload (batch) | m | measured ms | ± | ÷ m=1 measured | predicted ms | ÷ m=1 predicted | "
            "prediction error |")
        out("|---|---|---|---|---|---|---|---|")
        for case in args.models:
            builder, batch, make_x, training = CASES[case]
            keras.utils.set_random_seed(0)
            model = builder()
            x = make_x(np.random.default_rng(0), batch)
            y = None
            if training:
                model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
                y = np.random.default_rng(1).standard_normal((batch, *model.outputs[0].shape[1:])).astype("float32")
            xs = tf.constant(x)
            placed, steps = [], []
            for m in args.microbatches:
                if batch % m:
                    continue
                t = time.perf_counter()
                p = placer.autoplace(model, devices[:1], batch_size=batch, training=training, algorithm="single",
                                     microbatches=m, calibrate_links=False, profile_cache=False)
                print(f"  {case} m={m}: placed in {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
                placed.append((m, p))
                steps.append((lambda p=p: fit_step(p, x, y)) if training else
                             (lambda p=p: [v.numpy() for v in tf.nest.flatten(p(xs))]))
            times = interleaved_times(steps, args.repeats)
            first_med = first_pred = None
            for (m, p), ts in zip(placed, times):
                med, spread = median_spread(ts)
                pred = p.plan.predicted_step_time_s
                first_med = first_med or med
                first_pred = first_pred or pred
                errors.append((pred - med) / med)
                out(f"| {case} ({batch}) | {m} | {med * 1e3:.1f} | {spread * 1e3:.1f} | {med / first_med:.2f} | "
                    f"{pred * 1e3:.1f} | {pred / first_pred:.2f} | {100 * (pred - med) / med:+.1f}% |")
        out()
        within = sum(abs(e) <= 0.10 for e in errors)
        out(f"- {within} of {len(errors)} placements predicted within 10%; median |error| "
            f"{100 * float(np.median(np.abs(errors))):.1f}%, worst {100 * float(np.max(np.abs(errors))):.1f}%")
    out.write(args.out)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=["decoder", "towers", "transformer_training", "wide_training"],
                    choices=list(CASES))
    ap.add_argument("--microbatches", nargs="+", type=int, default=[1, 2, 4, 8])
    ap.add_argument("--repeats", type=int, default=7, help="interleaved measured rounds per placement")
    ap.add_argument("--out", default=str(HERE / "results" / "microbatch_costs.md"))
    args = ap.parse_args()
    return isolated(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
