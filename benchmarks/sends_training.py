"""Prompt sends against the executor's own order on a training step spread over two one-thread workers.

The strategy benchmark's 105M-parameter MLP (``strategy.wide``: 7 dense layers of 4096, SGD, batch 32) is
placed twice on ``placer.LocalCluster(2, pin_cores=True, threads=1)``: as whole layers over both workers
(``splits="none"``, ``replicas=1``) and with every product split (``splits="all"``). Each plan is then placed
again from itself with ``sends="executor"`` (the same assignment, no acknowledgements), and the four steps are
measured interleaved (one Keras step as ``fit`` runs it), each beside its prediction.

Why: ``benchmarks/worker_trace.py --workload wide-train`` showed the whole-layer plan's workers computing at
once 8% of the step. Its timeline: each layer's weight gradient, a sibling of the input gradient sent to the
other worker, waits for that transfer's acknowledgement (``placer/tf/rewrites/sends.py``), and the
acknowledgement's reply leaves the receiving worker only after the inline chain the tensor started there, so
the weight gradients ran after the whole input-gradient chain instead of beside it.

    python benchmarks/sends_training.py [--repeats 7] [--out benchmarks/results/sends_training.md]
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


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras

    import placer
    from placer.tf.measuring import fit_step
    from strategy import wide

    keras.utils.set_random_seed(0)
    model = wide()
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 1024)).astype("float32")
    y = rng.standard_normal((32, 16)).astype("float32")
    out = MarkdownOut()
    with placer.LocalCluster(2, pin_cores=True, threads=1) as cluster:
        devices = placer.connect(cluster)
        placed = {}
        for label, options in (("whole layers", dict(splits="none")), ("products split", dict(splits="all"))):
            prompt = placer.autoplace(model, devices, training=True, batch_size=32, replicas=1, **options)
            placed[f"{label}, prompt sends"] = prompt
            placed[f"{label}, executor's order"] = placer.autoplace(model, devices, training=True, batch_size=32,
                                                                     plan=prompt.plan, sends="executor")
        labels = list(placed)
        times = interleaved_times([lambda p=placed[k]: fit_step(p, x, y) for k in labels], args.repeats)
        out("## Prompt sends on a training step over two one-thread gRPC workers")
        out()
        out(f"{time.strftime('%Y-%m-%d')}; `python benchmarks/sends_training.py --repeats {args.repeats}`; the "
            f"105M-parameter MLP (strategy.py), one SGD step at batch 32; {args.repeats} interleaved rounds "
            f"({ROUNDS_TEXT}); each executor row is the prompt row's plan placed again with `sends=\"executor\"`.")
        out()
        out("| placement | measured ms | ± | predicted ms | prediction error |")
        out("|---|---|---|---|---|")
        for label, ts in zip(labels, times):
            med, spread = median_spread(ts)
            pred = placed[label].plan.predicted_step_time_s
            out(f"| {label} | {med * 1e3:.1f} | {spread * 1e3:.1f} | {pred * 1e3:.1f} | "
                f"{100 * (pred - med) / med:+.1f}% |")
    out.write(args.out)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=7, help="interleaved measured rounds per placement")
    ap.add_argument("--out", default=str(HERE / "results" / "sends_training.md"))
    args = ap.parse_args()
    return isolated(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
