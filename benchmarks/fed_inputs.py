"""Inputs the caller feeds, A/B: the same plans predicted with and without ``SimOptions.fed``, and measured.

The placed function's arguments are on the caller, which sends each to the devices that consume it when the
step starts; since 2026-12-07 the simulator models that (``Schedule.fed``: a receive op on each consuming
device, no send op on the device the input's placeholder is planned on). This places each workload on two
TF gRPC workers (one pinned core, one thread each) with autoplace, re-applies the same plan with the inputs
not marked fed (``placer.core.build._fed`` returning nothing: the simulation before the change), and
measures the placed model in ``--repeats`` interleaved rounds: measured step beside both predictions.
Runs itself inside a loopback-only network namespace.

    python benchmarks/fed_inputs.py [--repeats 9] [--out benchmarks/results/fed_inputs.md]
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

#: The mixed chain of ``splitting.py --workloads mixed``: the input width, then each dense layer's.
MIXED = [4096, 4096, 4096, 4096, 512, 512, 512, 512]


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf

    import placer
    import placer.core.build as build
    from splitting import chain_mlp
    from strategy import towers

    keras.utils.set_random_seed(0)
    cases = [("4-tower MLP (256), replicas=1", towers(), 256, dict(replicas=1)),
             ("4-tower MLP (256), default", towers(), 256, {}),
             ("mixed chain (8), default", chain_mlp(MIXED), 8, {}),
             ("mixed chain (4), splits='all'", chain_mlp(MIXED), 4, dict(splits="all"))]
    fed = build._fed
    out = MarkdownOut()
    out("## Inputs fed by the caller: predictions with and without, on the same plans (2 TF gRPC workers)")
    out()
    out(f"{time.strftime('%Y-%m-%d')}; `python benchmarks/fed_inputs.py --repeats {args.repeats}`; "
        f"{args.repeats} interleaved rounds ({ROUNDS_TEXT}); predicted = the plan's predicted step (simulated, "
        "plus its measured fixed cost per call); 'not fed' = the same plan re-applied with the simulation "
        "before `SimOptions.fed`.")
    out()
    out("| workload (batch), options | plan | measured ms | ± | predicted, fed | error | predicted, not fed | error |")
    out("|---|---|---|---|---|---|---|---|")
    with placer.LocalCluster(2, pin_cores=True, threads=1) as cluster:
        devices = placer.connect(cluster)
        rows = []
        for name, model, batch, opts in cases:
            x = tf.constant(np.random.default_rng(0).standard_normal((batch, model.input_shape[-1]))
                            .astype("float32"))
            p = placer.autoplace(model, devices, batch_size=batch, **opts)
            build._fed = lambda graph, nodes: ()
            try:
                q = placer.autoplace(model, devices, batch_size=batch, plan=p.plan, **opts)
            finally:
                build._fed = fed
            rows.append((name, p, q, x))
        times = interleaved_times([lambda p=p, x=x: p(x).numpy() for _, p, _, x in rows], args.repeats)
        for (name, p, q, x), ts in zip(rows, times):
            med, spread = median_spread(ts)
            plan = p.plan
            what = (f"{len(set(plan.assignment.values()))} worker(s), {plan.replicas} cop"
                    f"{'y' if plan.replicas == 1 else 'ies'}, {len(plan.splits)} ops split")
            a, b = plan.predicted_step_time_s, q.plan.predicted_step_time_s
            out(f"| {name} | {what} | {1e3 * med:.2f} | {1e3 * spread:.2f} | {1e3 * a:.2f} | "
                f"{100 * (a - med) / med:+.1f}% | {1e3 * b:.2f} | {100 * (b - med) / med:+.1f}% |")
    out.write(args.out)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=9, help="interleaved measured rounds")
    ap.add_argument("--out", default=str(HERE / "results" / "fed_inputs.md"))
    args = ap.parse_args()
    return isolated(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
