"""Per-op traces of placed steps on two gRPC workers: the phases of a step on each worker, next to the prediction.

A diagnostic of the cost model. The speedup benchmark's 8-tower MLP is placed
on a ``placer.LocalCluster(2, profiler=True)`` (two workers, one pinned core
and one thread each, TF's profiler server in each) as one worker
(``single``) and as autoplace's plan (``objective="throughput"``, one
micro-batch). Each placement is timed untraced (``--steps`` calls), then run
in a loop while both workers are recorded for ``--trace-ms``
(:meth:`placer.LocalCluster.trace`). From each worker's trace (XSpace protos, plane
``/host:CPU``), per step (a ``FunctionRun`` event starts each worker's part of
a step): when that worker's part started, its first and last kernel, and its
kernels' summed time. The table beside them: the plan's prediction (measured
call cost + simulated step) and the simulated makespan. The profiler slows a
step by 11-25% (measured 2026-12-03), so compare phases within a run, not
absolute times with the untraced step.

    python benchmarks/worker_trace.py [--trace-ms 1500] [--out benchmarks/results/worker_trace.md]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from isolation import isolated  # noqa: E402
from markdown import MarkdownOut  # noqa: E402


def trace_events(path: str | Path) -> list[tuple[str, float, float]]:
    """``(name, start µs, end µs)`` of every event on the ``/host:CPU`` plane of one worker's trace
    (absolute times: the line's start plus the event's offset)."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    space.ParseFromString(Path(path).read_bytes())
    out = []
    for plane in space.planes:
        if plane.name != "/host:CPU":
            continue
        names = plane.event_metadata
        for line in plane.lines:
            for e in line.events:
                start_ps = line.timestamp_ns * 1000 + e.offset_ps
                name = names[e.metadata_id].name if e.metadata_id in names else ""
                out.append((name, start_ps / 1e6, (start_ps + e.duration_ps) / 1e6))
    return out


#: Kernel types that move or name data rather than compute (not a step's "first compute kernel").
BOOKKEEPING = frozenset({"ReadVariableOp", "Const", "Identity", "NoOp", "_Send", "_Recv", "_HostSend", "_HostRecv",
                         "_Arg", "_Retval"})


def step_phases(events: list[tuple[str, float, float]]) -> np.ndarray:
    """Per step of one worker (rows): its part's start (``FunctionRun``) to its first compute kernel, to its
    last kernel's end, the kernels' summed time, and the time to the next step's start (µs). Kernels are the
    events named ``<op>:<type>`` of the placed graph (``autoplace/...``); compute kernels are those of a type
    not in :data:`BOOKKEEPING`."""
    starts = sorted(s for name, s, _ in events if name == "FunctionRun")
    kernels = sorted((s, e, name.rsplit(":", 1)[1]) for name, s, e in events
                     if name.startswith("autoplace/") and ":" in name)
    rows = []
    for begin, nxt in zip(starts, starts[1:]):
        mine = [(s, e, kind) for s, e, kind in kernels if begin <= s < nxt]
        compute = [s for s, _, kind in mine if kind not in BOOKKEEPING]
        if compute:
            rows.append((compute[0] - begin, max(e for _, e, _ in mine) - begin, sum(e - s for s, e, _ in mine),
                         nxt - begin))
    return np.asarray(rows, dtype=float).reshape(-1, 4)


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf

    import placer
    import workloads

    out = MarkdownOut()
    with placer.LocalCluster(2, pin_cores=True, threads=1, profiler=True) as cluster:
        devices = placer.connect(cluster)
        keras.utils.set_random_seed(0)
        model = workloads.multi_tower_mlp(towers=8, width=512, depth=4)
        x = np.random.default_rng(0).standard_normal((64, 512)).astype("float32")
        out("## Phases of a placed step on each of 2 gRPC workers (8-tower MLP, batch 64; profiler traces)")
        out()
        out(f"{time.strftime('%Y-%m-%d')}; medians over the traced steps, µs from the start of that worker's "
            "part of the step (`FunctionRun`); period = to its next step's start (traced, so slower than the "
            "untraced step). predicted = call cost + simulated step; makespan = the simulated step alone.")
        out()
        out("| placement | measured step ms (untraced) | predicted ms | simulated makespan ms | worker | steps | "
            "first compute kernel | last kernel end | kernels' sum | period |")
        out("|---|---|---|---|---|---|---|---|---|---|")
        for label, options in (("single", dict(algorithm="single", calibrate_links=False)),
                               ("autoplace", dict(objective="throughput", microbatches=1))):
            placed = placer.autoplace(model, devices, batch_size=64, profile_cache=False,
                                      time_limit_s=args.time_limit, **options)

            def step(p=placed) -> None:
                for t in tf.nest.flatten(p(x)):
                    t.numpy()

            for _ in range(20):
                step()
            times = []
            for _ in range(args.steps):
                t = time.perf_counter()
                step()
                times.append(time.perf_counter() - t)
            plan = placed.plan
            makespan = plan.predicted_step_time_s - plan.call_overhead_s
            with tempfile.TemporaryDirectory() as logdir:
                for task, path in cluster.trace(step, logdir, args.trace_ms).items():
                    phases = step_phases(trace_events(path))
                    if not len(phases):
                        continue  # a worker this placement does not use
                    first, last, busy, period = np.median(phases, axis=0)
                    out(f"| {label} | {1e3 * float(np.median(times)):.2f} | {1e3 * plan.predicted_step_time_s:.2f} | "
                        f"{1e3 * makespan:.2f} | task {task} | {len(phases)} | {first:.0f} | {last:.0f} | "
                        f"{busy:.0f} | {period:.0f} |")
    out.write(args.out)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=30, help="untraced steps timed per placement")
    ap.add_argument("--trace-ms", type=int, default=1500, help="how long each placement is traced")
    ap.add_argument("--time-limit", type=float, default=5.0, help="solver time limit per placement (s)")
    ap.add_argument("--out", default=str(HERE / "results" / "worker_trace.md"))
    args = ap.parse_args()
    return isolated(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
