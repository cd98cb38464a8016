"""An embedding table trained with sparse updates: Keras' own step against autoplace's, on TF gRPC workers.

Keras' ``Embedding`` reads its whole table and gathers rows from the read. Once
SGD has updated the table by rows (``ResourceScatterSub``) TensorFlow keeps the
variable in copy-on-read mode, and every whole read copies it: each
``model.fit`` step copies the table. autoplace's placed step gathers the rows
from the variable (``placer.tf.rewrites.gathers``). Per table size, the
recommender of ``benchmarks/splitting.py`` (a user's 8 item ids → the table
averaged → Dense(64) → Dense(1), SGD, MSE) at batch 256, on two workers pinned
to one core each:

* ``autoplace on one worker`` (``algorithm="single"``), ``autoplace default``
  (both workers) and data parallelism (``replicas=2``: a copy of the step per
  worker, half the batch each, the table's gradients summed as sparse rows), each
  measured by ``placed.measure`` against Keras' own training step (as ``fit``
  runs it) of a copy of the model on worker 0 (interleaved, ``--repeats``
  samples; medians and half the IQR), with the plan's predicted step (and the
  fixed cost of a call in it) beside the placed one.

    python benchmarks/sparse_tables.py [--rows 40000 400000 1600000] [--repeats 15]
                                       [--out benchmarks/results/sparse_tables.md]
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
from speedup import median_spread  # noqa: E402
from splitting import recommender  # noqa: E402

DIM, HISTORY, BATCH = 64, 8, 256


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import placer

    out = MarkdownOut()
    with placer.LocalCluster(2, pin_cores=True, threads=1) as cluster:
        devices = placer.connect(cluster)
        out("## Embedding tables trained with sparse updates (SGD) on 2 TF gRPC workers (one pinned core each)")
        out()
        out(f"{time.strftime('%Y-%m-%d')}; `python benchmarks/sparse_tables.py --rows {' '.join(map(str, args.rows))} "
            f"--repeats {args.repeats}`; the recommender of `benchmarks/splitting.py` (ids → table of rows × {DIM} "
            f"averaged over {HISTORY} ids → Dense(64) → Dense(1)), SGD, MSE, batch {BATCH}. Each autoplace row is "
            f"`placed.measure` ({args.repeats} interleaved samples): the placed training step against Keras' own "
            "of a copy of the model on worker 0 (its variables there), both as `fit` runs them. ± = half the IQR; "
            "predicted = the plan's fixed cost of a call (measured at planning) + its simulated step; ids profiled "
            "uniform over the table's rows (`placer.tf.trace.index_bounds`).")
        out()
        out("| table | strategy | Keras' own step on one worker, ms | ± | placed step, ms | ± | speedup over Keras' "
            "own | placed predicted, ms | of which the call, ms | prediction error | gathers rewritten |")
        out("|---|---|---|---|---|---|---|---|---|---|---|")
        rng = np.random.default_rng(0)
        for rows in args.rows:
            model = recommender(rows, DIM, HISTORY)
            x = rng.integers(0, rows, (BATCH, HISTORY)).astype("int32")
            y = rng.standard_normal((BATCH, 1)).astype("float32")
            mib = rows * DIM * 4 / 2**20
            for label, devs, options in (("autoplace on one worker", devices[:1],
                                          dict(algorithm="single", calibrate_links=False)),
                                         ("autoplace default (2 workers)", devices, {}),
                                         ("data parallel (replicas=2)", devices, dict(replicas=2))):
                t = time.perf_counter()
                placed = placer.autoplace(model, devs, batch_size=BATCH, training=True, profile_cache=False,
                                          **options)
                print(f"  {rows} rows, {label}: placed in {time.perf_counter() - t:.1f} s", file=sys.stderr,
                      flush=True)
                m = placed.measure(x, y, repeats=args.repeats, warmup=3, min_time_s=0)
                (orig, o_spread), (mine, p_spread) = median_spread(m.original_s), median_spread(m.placed_s)
                pred = m.predicted_step_s
                record = placed.emitted.record("gathers")
                out(f"| {rows:,} × {DIM} ({mib:.0f} MiB) | {label} | {orig * 1e3:.2f} | {o_spread * 1e3:.2f} | "
                    f"{mine * 1e3:.2f} | {p_spread * 1e3:.2f} | {orig / mine:.2f}× | "
                    f"{'' if pred is None else f'{pred * 1e3:.2f}'} | {placed.plan.call_overhead_s * 1e3:.2f} | "
                    f"{'' if pred is None else f'{100 * (pred - mine) / mine:+.1f}%'} | "
                    f"{0 if record is None else record.changes} |")
    out.write(args.out)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", nargs="+", type=int, default=[40_000, 400_000, 1_600_000])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--out", default=str(HERE / "results" / "sparse_tables.md"))
    args = ap.parse_args()
    return isolated(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
