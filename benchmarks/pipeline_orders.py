"""GPipe against 1F1B for a pipelined training step on two TF gRPC workers: measured and predicted.

Two worker processes on 127.0.0.1, each pinned to one core with one intra- and
one inter-op thread (``placer.LocalCluster``). A chain of dense layers is
compiled for training and split in two stages by hand (the first half of the
layers on worker 0, the rest and the loss on worker 1: a split made by
layers, so that the comparison does not depend on what the solver picks),
then placed by ``placer.autoplace(..., plan=...)`` at each micro-batch count,
once per pipeline order and ``--sends`` value (acknowledged transfers or TensorFlow's order,
:mod:`placer.tf.rewrites.sends`). Each placement's ``train_on_batch`` is timed,
interleaved with the others, and set beside the plan's predicted step (ops
profiled on the workers, the link calibrated) and the simulated peak memory
of the busiest device, which is what 1F1B is for. Runs itself inside a
loopback-only network namespace (``unshare -rn``; TF's servers listen on all
interfaces) and exits with a message where that is not possible.

With ``--memory`` the workers keep allocator statistics
(``TF_CPU_ALLOCATOR_USE_BFC=true``) and run TensorFlow's profiler; after
the timed rounds each placement's steps are traced on both workers for
``--trace-ms``, and each worker's step memory is read from its allocator's
events: the most bytes in use during the window less the least (between
steps: what stays, the weights). Beside it, the simulated peak of that
device less its resident bytes. The profiler slows steps, so that run's
times are not comparable with a run without ``--memory``.

    python benchmarks/pipeline_orders.py [--microbatches 4 8] [--repeats 9] [--sends prompt executor] [--memory]
                                         [--trace-ms 1000]
                                         [--out benchmarks/results/pipeline_orders.md]
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


def chain(width: int, depth: int):
    import keras

    inp = keras.Input((width,), name="x")
    h = inp
    for i in range(depth):
        h = keras.layers.Dense(width, activation="relu", name=f"d{i}")(h)
    return keras.Model(inp, keras.layers.Dense(16, name="head")(h), name="chain")


def hand_split(model, devices, batch: int, m: int, depth: int):
    """The chain's two-stage split by layers (the first half of the layers on the first device, the rest and
    the loss on the second) and its reference: ``(op graph, the split plan, every op on the first device)``."""
    import placer

    first = placer.autoplace(model, devices, training=True, batch_size=batch, microbatches=m,
                             algorithm="contiguous", pipeline="gpipe", profile_cache=False)
    graph = first.placement.op_graph.graph
    late = tuple(f"/d{i}" for i in range(depth // 2, depth)) + ("/head", "compile_loss")
    stage0, stage1 = first.plan.devices
    split = {op: stage1 if any(k in str(graph.nodes[op].get("layer", op)) for k in late) else stage0
             for op in first.plan.assignment}
    return (graph, replace(first.plan, assignment=split, op_order={}),  # an order belongs to its own assignment
            replace(first.plan, assignment=dict.fromkeys(split, stage0), op_order={}))


def simulated_live(built, groups: np.ndarray, sim) -> list[float]:
    """Per device of ``built``: the simulated peak less the device's resident bytes (weights, slots)."""
    fine = np.asarray(groups)[built.schedule.group]
    peak = np.asarray(sim.peak_memory_bytes, dtype=float)
    resident = np.zeros(len(peak))
    if built.memory.resident_bytes is not None:
        resident = np.bincount(fine, weights=np.asarray(built.memory.resident_bytes, dtype=float),
                               minlength=len(peak))
    return (peak - resident).tolist()


def step_memory(cluster, step, trace_ms: int) -> list[float]:
    """Per worker: the most bytes its allocator had in use while ``step`` ran in a loop for ``trace_ms``, less
    the least (:func:`worker_trace.allocated_while`); ``nan`` for a worker with no allocator events."""
    from worker_trace import allocated_while

    return [float(u.max() - u.min()) if u.size else float("nan") for u in allocated_while(cluster, step, trace_ms)]


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras

    import placer
    from cost_models import SimOptions
    from placer.core.build import build_problem
    from placer.core.microbatch import simulate_pipeline

    out = MarkdownOut()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.batch, args.width)).astype("float32")
    y = rng.standard_normal((args.batch, 16)).astype("float32")
    env = {"TF_CPU_ALLOCATOR_USE_BFC": "true"} if args.memory else None
    with placer.LocalCluster(2, pin_cores=True, threads=1, profiler=args.memory, env=env) as cluster:
        devices = placer.connect(cluster)
        keras.utils.set_random_seed(0)
        model = chain(args.width, args.depth)
        model.compile(optimizer="sgd", loss="mse")
        configs = []
        for m in args.microbatches:
            graph, plan, one_worker = hand_split(model, devices, args.batch, m, args.depth)
            if args.single and m == args.microbatches[0]:  # the reference: every op on worker 0
                one = placer.autoplace(model, devices, training=True, batch_size=args.batch, microbatches=m,
                                       plan=one_worker, profile_cache=False)
                built = build_problem(graph, one.placement.devices, group_by=one.plan.group_by)
                groups = built.group_assignment(one.plan.assignment)
                sim = simulate_pipeline(built, groups, m, SimOptions())
                configs.append((m, "one worker", one, float(np.max(sim.peak_memory_bytes)),
                                simulated_live(built, groups, sim)))
            for order in ("gpipe", "1f1b"):
                for sends in args.sends:
                    p = placer.autoplace(model, devices, training=True, batch_size=args.batch, microbatches=m,
                                         pipeline=order, plan=plan, profile_cache=False, sends=sends)
                    built = build_problem(graph, p.placement.devices, group_by=p.plan.group_by)
                    groups = built.group_assignment(p.plan.assignment)
                    sim = simulate_pipeline(built, groups, m, SimOptions(), order=order)
                    configs.append((m, f"{order} / {sends}", p, float(np.max(sim.peak_memory_bytes)),
                                    simulated_live(built, groups, sim)))
                    print(f"  m={m} {order}, {sends} sends: placed", file=sys.stderr, flush=True)
        times = interleaved_times([(lambda p=p: p.train_on_batch(x, y)) for _, _, p, _, _ in configs], args.repeats)
        memory = [step_memory(cluster, lambda p=p: p.train_on_batch(x, y), args.trace_ms) if args.memory else None
                  for _, _, p, _, _ in configs]
    out("## Pipeline orders on 2 TF gRPC workers (one pinned core and one thread each)")
    out()
    out(f"{time.strftime('%Y-%m-%d')}; a chain of {args.depth} dense layers of width {args.width} (+ a 16-wide head, "
        f"SGD, MSE), batch {args.batch}, split by hand after layer {args.depth // 2 - 1}; {args.repeats} "
        f"interleaved rounds of `train_on_batch` after 2 warm-up calls ({ROUNDS_TEXT}); predicted = the plan's predicted step; "
        "peak = the busiest device's simulated peak memory" + (
            f"; step memory per worker (0 / 1): measured = the most bytes its allocator had in use while the "
            f"step ran in a loop for {args.trace_ms} ms less the least (`--memory`: allocator statistics on, "
            "profiler running, so these times are slower than without), simulated = the device's peak less "
            "its resident bytes." if args.memory else " (`--memory` measures the workers' step memory)."))
    out()
    head = "| micro-batches | order / sends | measured ms | ± | predicted ms | prediction error | simulated peak MiB |"
    extra = " step memory measured MiB | step memory simulated MiB |" if args.memory else ""
    out(head + extra)
    out("|" + "---|" * ((head + extra).count("|") - 1))
    for (m, order, p, peak, live), ts, mem in zip(configs, times, memory):
        med, spread = median_spread(ts)
        pred = p.plan.predicted_step_time_s
        row = (f"| {m} | {order} | {med * 1e3:.1f} | {spread * 1e3:.1f} | {pred * 1e3:.1f} | "
               f"{100 * (pred - med) / med:+.1f}% | {peak / 2**20:.1f} |")
        if mem is not None:
            row += (" " + " / ".join("—" if np.isnan(b) else f"{b / 2**20:.1f}" for b in mem) + " | "
                    + " / ".join(f"{b / 2**20:.1f}" for b in live) + " |")
        out(row)
    out.write(args.out)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--microbatches", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--single", action="store_true",
                    help="also every op on worker 0, at the first micro-batch count (the split's reference)")
    ap.add_argument("--repeats", type=int, default=9, help="interleaved measured rounds per placement")
    ap.add_argument("--sends", nargs="+", default=["prompt", "executor"], choices=["prompt", "executor", "auto"],
                    help="placer.autoplace(sends=...) values placed side by side (placer.tf.rewrites.sends)")
    ap.add_argument("--memory", action="store_true",
                    help="also measure each worker's step memory from its allocator (profiler on: slower steps)")
    ap.add_argument("--trace-ms", type=int, default=1000, help="with --memory: how long each placement is traced")
    ap.add_argument("--out", default=str(HERE / "results" / "pipeline_orders.md"))
    args = ap.parse_args()
    return isolated(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
