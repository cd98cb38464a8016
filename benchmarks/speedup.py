"""Measured speedups on two TF gRPC workers: autoplace's plan against the best single-worker configuration.

Two worker processes on 127.0.0.1, each pinned to one core with one intra-
and one inter-op thread (``placer.LocalCluster``), connected with
``placer.connect``. Per workload, these placements are made with
``placer.autoplace`` (op times profiled *on worker 0*, the link between the
workers calibrated) and measured, interleaved, on the same batch:

* ``single/m=M``: every op on worker 0, the batch run as M micro-batches
  (micro-batching alone is faster on one core, cache effects: the fair
  baseline is the best of these);
* ``autoplace``: ``objective="throughput"``, ``microbatches="auto"``;
* ``round_robin`` and ``contiguous`` at autoplace's micro-batch count;
* with ``--contiguous-microbatches 2 4``, ``contiguous`` at those counts too
  (pipelined splits, whose predictions are checked even where autoplace
  keeps one worker);
* with ``--sends-ab``, each split plan again with ``sends="executor"``
  (TensorFlow's own send order; the others use the default, prompt sends on
  these one-thread workers, :mod:`placer.tf.rewrites.sends`).

Each measured step fetches its outputs (inference) or runs one Keras step
as ``fit`` does (training, :func:`placer.tf.measuring.fit_step`; until
2026-12-06 ``train_on_batch``, which adds a metric reset per call). Prints and writes a table: measured
medians and spread (half the interquartile range), measured throughput
speedup over the best single-worker configuration, the simulator's
predicted speedup beside it, the predicted step's error against the
measurement, and the share of the predicted step that the busiest link
spends moving bytes. Runs itself inside a loopback-only network namespace
(``unshare -rn``; TF's servers listen on all interfaces) and exits with a
message where that is not possible.

    python benchmarks/speedup.py [--models resnet50 ...] [--repeats 7] [--sends-ab]
                                 [--out benchmarks/results/speedup.md]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from isolation import isolated  # noqa: E402
from markdown import MarkdownOut  # noqa: E402
from placer.measure.steps import SETTLE_S, TIMED_PER_ROUND  # noqa: E402
from placer.measure.steps import interleaved_times as library_interleaved_times  # noqa: E402

#: name -> (builder kwargs, batch, training, compile settings)
CASES = {
    "resnet50_inference": ("resnet50", dict(size=96), 16, False),
    "resnet50_training": ("resnet50", dict(size=64), 8, True),
    "transformer_training": ("transformer", dict(seq=64, dim=128, heads=4, layers=4), 16, True),
    "inception_v3_inference": ("inception_v3", dict(size=96), 16, False),
    "multi_tower_mlp_inference": ("multi_tower_mlp", dict(towers=8, width=512, depth=4), 64, False),
}
SINGLE_MICROBATCHES = (1, 2, 4, 8)


def build_model(case: str) -> "object":
    """The Keras model of :data:`CASES` ``[case]`` (``benchmarks/workloads.py``'s builder with its arguments; seed
    Keras first for the same weights)."""
    import workloads

    builder_name, kwargs, _, _ = CASES[case]
    builder = getattr(workloads, {"resnet50": "resnet50", "inception_v3": "inception_v3",
                                  "transformer": "transformer_encoder",
                                  "multi_tower_mlp": "multi_tower_mlp"}[builder_name])
    return builder(**kwargs)


def median_spread(xs) -> tuple[float, float]:
    q1, q2, q3 = np.percentile(np.asarray(xs, float), [25, 50, 75])
    return float(q2), float((q3 - q1) / 2)


#: How the benchmarks' headers say it (:func:`placer.measure.steps.interleaved_times`).
ROUNDS_TEXT = (f"each round runs each placement untimed for {SETTLE_S * 1e3:.0f} ms (at least one call) then "
               f"{TIMED_PER_ROUND} timed calls (a call right after another placement's runs slower), rounds in "
               "alternating order")


def interleaved_times(steps, repeats: int, warmup: int = 2) -> list[list[float]]:
    """Seconds of each of ``steps`` (callables) over ``repeats`` rounds (:data:`ROUNDS_TEXT`), after
    ``warmup`` calls of each: :func:`placer.measure.steps.interleaved_times`.

    >>> [len(ts) for ts in interleaved_times([lambda: None, lambda: None], 3)]
    [6, 6]
    """
    return library_interleaved_times(steps, repeats=repeats * TIMED_PER_ROUND, warmup=warmup)


def pipeline_ceiling(single_steps: dict[int, float], stages: int = 2) -> tuple[float, int]:
    """``(speedup, m)``: the best a chain cut into ``stages`` equal stages can do in a GPipe pipeline.

    ``single_steps``: measured steps of the whole model on one worker at ``m`` micro-batches. With
    perfect balance and free transfers each stage takes ``single(m) / (m * stages)`` per
    micro-batch, and the pipeline's step is ``(m + stages - 1)`` of those (training: the same for
    its forward and its backward phase). The speedup is over the best single-worker step.

    >>> pipeline_ceiling({1: 100.0, 2: 100.0, 4: 100.0})
    (1.6, 4)
    >>> pipeline_ceiling({1: 100.0})
    (1.0, 1)
    """
    best = min(single_steps.values())
    steps = {m: (m + stages - 1) * t / (m * stages) for m, t in single_steps.items()}
    m = min(steps, key=lambda k: (steps[k], k))
    return round(best / steps[m], 3), m


def worker_memory_gb(pid: int) -> tuple[float, float]:
    """``(resident now, peak resident so far)`` of process ``pid`` in GB (``VmRSS``, ``VmHWM`` of /proc)."""
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                fields[name] = int(value.split()[0]) * 1024 / 1e9  # kB
    return fields.get("VmRSS", float("nan")), fields.get("VmHWM", float("nan"))


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import placer

    out = MarkdownOut()

    with placer.LocalCluster(2, pin_cores=True, threads=1) as cluster:
        devices = placer.connect(cluster)
        order = repr(args.ready_order)
        if args.ready_order == "detect":
            from placer.core.devices import resolve_devices
            from placer.measure.hosts import executor_ready_order

            order = f"'detect' ({executor_ready_order(resolve_devices(devices))[0]})"
        out("## Measured speedups: 2 TF gRPC workers, one pinned core and one thread each")
        out()
        out(f"{time.strftime('%Y-%m-%d')}; {args.repeats} interleaved rounds per placement after 2 warm-up calls ({ROUNDS_TEXT}); "
            "speedup = best single-worker step / step (throughput at the same batch); predicted = the plan's "
            "predicted step (simulated with ops profiled on worker 0, the calibrated link and its transfer CPU "
            "cost, plus the plan's measured fixed cost per call); predicted speedup = the best single-worker "
            "configuration's predicted step / this one's; link share = the busiest link's bytes / bandwidth "
            f"over the predicted step; plans made and predicted with ready_order={order}.")
        out()
        out("| workload | placement | measured ms | ± | measured speedup | predicted ms | predicted speedup | "
            "prediction error | link share |")
        out("|---|---|---|---|---|---|---|---|---|")
        summary = []
        failed: list[str] = []
        memory = []
        for case in args.models:
            try:
                _run_case(case, args, out, summary, devices)
            except Exception as e:  # recorded in the table and reported by the exit status, then the next case
                failed.append(case)
                traceback.print_exc()
                out(f"| {case} | failed: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''} "
                    "| | | | | | | |")
            time.sleep(2.0)  # idle: the workers' heap trim (1 s without work) runs before the readout
            memory.append((case, [worker_memory_gb(proc.pid) for proc in cluster.procs]))
        out()
        out("Worker memory after each workload and 2 s idle (GB resident now / peak so far, from /proc; the "
            "workers hand freed heap back when idle): " + "; ".join(
                f"{case} " + ", ".join(f"w{i} {now:.2f} / {peak:.2f}" for i, (now, peak) in enumerate(ws))
                for case, ws in memory))
        out()
        out("autoplace against the best single-worker configuration (measured; predicted; prediction error; m): "
            + "; ".join(f"{c} {s:.2f}x ({p:.2f}x predicted, {100 * e:+.1f}%, m={m})" for c, s, p, e, m in summary))
        if summary:
            out(f"Median absolute prediction error of autoplace's step: "
                f"{100 * float(np.median([abs(e) for _, _, _, e, _ in summary])):.1f}%")
    out.write(args.out)
    return 1 if failed else 0


def _run_case(case: str, args: argparse.Namespace, out, summary: list, devices: list[str]) -> None:
    """Place and measure one workload (a block of table rows)."""
    import keras
    import tensorflow as tf

    import placer
    from placer.tf.measuring import fit_step

    _, _, batch, training = CASES[case]
    keras.utils.set_random_seed(0)
    model = build_model(case)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, *model.inputs[0].shape[1:])).astype("float32")
    y = None
    extra = {}
    if training:
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
        y = rng.standard_normal((batch, *model.outputs[0].shape[1:])).astype("float32")
        extra = dict(training=True)
    configs = []

    def place(label, **options):
        t = time.perf_counter()
        try:
            p = placer.autoplace(model, devices, batch_size=batch, profile_cache=False,
                                 time_limit_s=args.time_limit, ready_order=args.ready_order, **extra, **options)
        except placer.AutoplaceError as e:
            out(f"| {case} | {label} | refused: {str(e).splitlines()[0][:160]} | | | | | | |")
            return None
        print(f"  {case} {label}: placed in {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
        return p

    for m in SINGLE_MICROBATCHES:
        if batch % m == 0:
            p = place(f"single/m={m}", algorithm="single", microbatches=m, calibrate_links=False)
            if p is not None:
                configs.append((f"single/m={m}", p))
    auto = place("autoplace", objective="throughput", microbatches="auto")
    if auto is not None:
        configs.append(("autoplace", auto))
        m = auto.plan.microbatches
        for alg in ("round_robin", "contiguous"):
            p = place(alg, algorithm=alg, objective="throughput", microbatches=m, calibrate_links=False)
            if p is not None:
                configs.append((f"{alg}/m={m}", p))
    for m in args.contiguous_microbatches:  # pipelined splits whatever autoplace chose: their predictions checked
        if batch % m == 0 and (auto is None or m != auto.plan.microbatches):
            p = place(f"contiguous/m={m}", algorithm="contiguous", objective="throughput", microbatches=m,
                      calibrate_links=False)
            if p is not None:
                configs.append((f"contiguous/m={m}", p))

    if args.sends_ab:  # the same plans with TensorFlow's own send order, beside those with prompt sends
        for label, p in list(configs):
            if not label.startswith("single/"):
                q = place(f"{label} (executor sends)", plan=p.plan, sends="executor", calibrate_links=False)
                if q is not None:
                    configs.append((f"{label} (executor sends)", q))

    def step_of(p):
        if training:
            return lambda: fit_step(p, x, y)
        return lambda: [t.numpy() for t in tf.nest.flatten(p(x))]

    times = interleaved_times([step_of(p) for _, p in configs], args.repeats)
    medians = [median_spread(ts) for ts in times]
    singles = [i for i, (label, _) in enumerate(configs) if label.startswith("single/")]
    best = min(singles, key=lambda i: medians[i][0])
    predicted_single = configs[best][1].plan.predicted_step_time_s
    for i, (label, p) in enumerate(configs):
        med, spread = medians[i]
        pred = p.plan.predicted_step_time_s
        share = ""
        if not label.startswith("single/"):
            share = f"{100 * _link_share(p):.0f}%"
        out(f"| {case} | {label}{' (best single)' if i == best else ''} | {med * 1e3:.1f} | "
            f"{spread * 1e3:.1f} | {medians[best][0] / med:.2f}x | {pred * 1e3:.1f} | "
            f"{predicted_single / pred:.2f}x | {100 * (pred - med) / med:+.1f}% | {share} |")
    if auto is not None:
        ia = [label for label, _ in configs].index("autoplace")
        ceiling, cm = pipeline_ceiling({int(configs[i][0].split("=")[1]): medians[i][0] for i in singles})
        out(f"\n{case}: a perfect two-stage cut of the chain (balanced, transfers free) could reach at most "
            f"{ceiling:.2f}x the best single worker, at m={cm} (from the measured single-worker steps above)\n")
        summary.append((case, medians[best][0] / medians[ia][0],
                        predicted_single / configs[ia][1].plan.predicted_step_time_s,
                        (configs[ia][1].plan.predicted_step_time_s - medians[ia][0]) / medians[ia][0],
                        configs[ia][1].plan.microbatches))


def _link_share(placed) -> float:
    """The busiest link's occupancy (bytes / calibrated bandwidth) over the predicted step, from the report."""
    data = placed.report_data
    names = data["traffic_bytes"]["devices"]
    bw = {(link["src"], link["dst"]): link["bandwidth_bytes_per_s"] for link in data["links"]}
    busy = [b / bw[(names[i], names[j])] for i, row in enumerate(data["traffic_bytes"]["matrix"])
            for j, b in enumerate(row) if i != j and b > 0]
    step = data["plan"]["predicted_step_time_s"]
    return max(busy, default=0.0) / step if step else 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--repeats", type=int, default=7, help="interleaved measured rounds per placement")
    ap.add_argument("--time-limit", type=float, default=5.0, help="solver time limit per placement (s)")
    ap.add_argument("--ready-order", default="detect", choices=["detect", "fifo", "lifo"],
                    help="the order the solvers' simulator runs a device's ready ops (autoplace's ready_order): "
                    "these workers have one inter-op thread, which runs depth first, and 'detect' finds 'lifo'")
    ap.add_argument("--contiguous-microbatches", type=int, nargs="*", default=[],
                    help="also run the contiguous split at these micro-batch counts (pipelined splits' predictions)")
    ap.add_argument("--sends-ab", action="store_true",
                    help="also measure each split plan with sends='executor' (placer.tf.rewrites.sends)")
    ap.add_argument("--out", default=str(HERE / "results" / "speedup.md"))
    args = ap.parse_args()
    return isolated(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
