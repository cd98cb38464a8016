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
absolute times with the untraced step. ``--workload chain-train`` traces the
chain of ``benchmarks/pipeline_orders.py`` trained as one worker and split in
two stages by hand (``--microbatches``); ``--workload wide-train`` the strategy
benchmark's 105M-parameter MLP trained as one worker, as whole layers over both
workers and with its products split; the ``busy``/``both`` columns say how
much of the traced window each worker computed and both did at once (a
pipelined split that overlaps nothing reads ``both`` ≈ 0).

    python benchmarks/worker_trace.py [--workload mlp|towers|inception|chain-train|wide-train] [--microbatches 4]
                                      [--trace-ms 1500]
                                      [--out benchmarks/results/worker_trace.md]
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


def _host_planes(path: str | Path) -> list:
    """The ``/host:CPU`` planes of one worker's trace (an XSpace proto)."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    space.ParseFromString(Path(path).read_bytes())
    return [plane for plane in space.planes if plane.name == "/host:CPU"]


def trace_events(path: str | Path) -> list[tuple[str, float, float]]:
    """``(name, start µs, end µs)`` of every event on the ``/host:CPU`` plane of one worker's trace
    (absolute times: the line's start plus the event's offset)."""
    out = []
    for plane in _host_planes(path):
        names = plane.event_metadata
        for line in plane.lines:
            for e in line.events:
                start_ps = line.timestamp_ns * 1000 + e.offset_ps
                name = names[e.metadata_id].name if e.metadata_id in names else ""
                out.append((name, start_ps / 1e6, (start_ps + e.duration_ps) / 1e6))
    return out


def allocated_bytes(path: str | Path) -> np.ndarray:
    """The bytes in use after each allocation and deallocation on the ``/host:CPU`` plane of one worker's
    trace, in time order: the allocator's ``MemoryAllocation``/``MemoryDeallocation`` events, which a
    worker records when its CPU allocator keeps statistics (``TF_CPU_ALLOCATOR_USE_BFC=true`` in its
    environment) and the profiler runs. Empty without them."""
    out = []
    for plane in _host_planes(path):
        stat = next((k for k, m in plane.stat_metadata.items() if m.name == "bytes_allocated"), None)
        memory = {k for k, m in plane.event_metadata.items() if m.name in ("MemoryAllocation", "MemoryDeallocation")}
        for line in plane.lines:
            for e in line.events:
                if e.metadata_id in memory:
                    value = next((x for x in e.stats if x.metadata_id == stat), None)
                    if value is not None:
                        kind = value.WhichOneof("value")
                        out.append((line.timestamp_ns * 1000 + e.offset_ps, float(getattr(value, kind))))
    return np.array([b for _, b in sorted(out)])


def allocated_while(cluster, step, trace_ms: int) -> list[np.ndarray]:
    """Per worker of ``cluster`` (started with ``profiler=True``): :func:`allocated_bytes` of its trace while
    ``step`` ran in a loop for ``trace_ms`` (an empty array for a worker with no allocator events)."""
    with tempfile.TemporaryDirectory() as logdir:
        used = {task: allocated_bytes(path) for task, path in cluster.trace(step, logdir, trace_ms).items()}
    return [used.get(t, np.array([])) for t in range(cluster.workers)]


def allocator_peaks(cluster, step, trace_ms: int = 1500) -> list[float]:
    """Per worker: the most bytes its allocator had in use (its pool's chunks, what TensorFlow reports) while
    ``step`` ran in a loop for ``trace_ms`` under the workers' profilers (``nan``: no allocator events;
    :func:`allocated_while`)."""
    return [float(u.max()) if u.size else float("nan") for u in allocated_while(cluster, step, trace_ms)]


def process_memory(pid: int) -> dict[str, int]:
    """``VmRSS``, ``VmHWM`` (peak RSS) and ``VmData`` of process ``pid``, in bytes."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "VmData"):
            out[key] = int(value.split()[0]) << 10
    return out


#: Kernel types that move or name data rather than compute (not a step's "first compute kernel").
BOOKKEEPING = frozenset({"ReadVariableOp", "Const", "Identity", "NoOp", "_Send", "_Recv", "_HostSend", "_HostRecv",
                         "_Arg", "_Retval"})


def _is_kernel(name: str) -> bool:
    """An event of a kernel of the placed graph (``autoplace/...:<type>``; under ``StatefulPartitionedCall/``
    when Keras' training step calls the placed function)."""
    return ":" in name and (name.startswith("autoplace/") or "/autoplace/" in name)


def busy_together(first: list[tuple[str, float, float]], second: list[tuple[str, float, float]]) -> tuple[float, ...]:
    """Shares of the window from the first to the last compute kernel (not in :data:`BOOKKEEPING`) of either
    trace in which each worker ran one, and in which both did at once: ``(busy first, busy second, both)``.

    >>> busy_together([("autoplace/a:MatMul", 0.0, 2.0)], [("autoplace/b:MatMul", 1.0, 4.0)])
    (0.5, 0.75, 0.25)
    >>> busy_together([("autoplace/a:MatMul", 0.0, 2.0), ("autoplace/b:MatMul", 3.0, 4.0)], [])
    (0.75, 0.0, 0.0)
    """
    def intervals(events):
        return sorted((s, e) for name, s, e in events if _is_kernel(name) and name.rsplit(":", 1)[1] not in BOOKKEEPING)

    def union(iv):
        out: list[list[float]] = []
        for s, e in iv:
            if out and s <= out[-1][1]:
                out[-1][1] = max(out[-1][1], e)
            else:
                out.append([s, e])
        return out

    a, b = union(intervals(first)), union(intervals(second))
    if not a and not b:
        return 0.0, 0.0, 0.0
    lo, hi = min(iv[0][0] for iv in (a, b) if iv), max(iv[-1][1] for iv in (a, b) if iv)
    both, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        both += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        i, j = (i + 1, j) if a[i][1] < b[j][1] else (i, j + 1)
    span = hi - lo
    return (sum(e - s for s, e in a) / span, sum(e - s for s, e in b) / span, both / span)


def step_phases(events: list[tuple[str, float, float]]) -> np.ndarray:
    """Per step of one worker (rows): its part's start (``FunctionRun``) to its first compute kernel, to its
    last kernel's end, the kernels' summed time, and the time to the next step's start (µs). Kernels are the
    events named ``<op>:<type>`` of the placed graph (``autoplace/...``); compute kernels are those of a type
    not in :data:`BOOKKEEPING`."""
    starts = sorted(s for name, s, _ in events if name == "FunctionRun")
    kernels = sorted((s, e, name.rsplit(":", 1)[1]) for name, s, e in events if _is_kernel(name))
    rows = []
    for begin, nxt in zip(starts, starts[1:]):
        mine = [(s, e, kind) for s, e, kind in kernels if begin <= s < nxt]
        compute = [s for s, _, kind in mine if kind not in BOOKKEEPING]
        if compute:
            rows.append((compute[0] - begin, max(e for _, e, _ in mine) - begin, sum(e - s for s, e, _ in mine),
                         nxt - begin))
    return np.asarray(rows, dtype=float).reshape(-1, 4)


def _placements(args: argparse.Namespace, devices):
    """``(title, [(label, placed model, step)])`` of the workload: the MLP's forward pass as one worker and
    autoplace's plan, or the chain of ``benchmarks/pipeline_orders.py`` trained as one worker and split in
    two stages by hand, at ``--microbatches``."""
    import keras
    import tensorflow as tf

    import placer
    import workloads

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    if args.workload in ("mlp", "towers", "inception"):
        if args.workload == "mlp":
            model, batch, title = workloads.multi_tower_mlp(towers=8, width=512, depth=4), 64, "8-tower MLP"
            x = rng.standard_normal((64, 512)).astype("float32")
            mine = dict(objective="throughput", microbatches=1)
        elif args.workload == "inception":  # benchmarks/strategy.py's InceptionV3, its one-copy plan (-12..-21% there)
            from speedup import build_model

            model, batch = build_model("inception_v3_inference"), 16
            title = "InceptionV3 inference, 96 px (strategy.py)"
            x = rng.standard_normal((16, 96, 96, 3)).astype("float32")
            mine = dict(replicas=1)
        else:  # benchmarks/strategy.py's 4-tower MLP, its one-copy plan (predicted 9-24% too fast there)
            from strategy import towers

            model, batch, title = towers(), 256, "4-tower MLP (strategy.py)"
            x = rng.standard_normal((256, 256)).astype("float32")
            mine = dict(replicas=1)
        out = []
        for label, options in (("single", dict(algorithm="single", calibrate_links=False)), ("autoplace", mine)):
            placed = placer.autoplace(model, devices, batch_size=batch, profile_cache=False,
                                      time_limit_s=args.time_limit, **options)
            out.append((label, placed, lambda p=placed: [t.numpy() for t in tf.nest.flatten(p(x))]))
        return f"{title}, batch {batch}", out
    if args.workload == "towers-copies":  # the 4-tower MLP's copies (predicted 13-30% fast in strategy.py)
        from strategy import towers

        model = towers()
        x = rng.standard_normal((256, 256)).astype("float32")
        out = []
        for label, batch, options in (("one worker, half batch", 128, dict(algorithm="single", calibrate_links=False)),
                                      ("a copy per worker", 256, dict(replicas=2))):
            placed = placer.autoplace(model, devices, batch_size=batch, profile_cache=False,
                                      time_limit_s=args.time_limit, **options)
            out.append((label, placed, lambda p=placed, xb=x[:batch]: [t.numpy() for t in tf.nest.flatten(p(xb))]))
        return "4-tower MLP (strategy.py): one worker at the copies' half batch, and a copy per worker at 256", out
    if args.workload == "wide-train":  # benchmarks/strategy.py's 105M MLP, one SGD step (whole layers: -10..-14%)
        from strategy import wide

        model = wide()
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
        x = rng.standard_normal((32, 1024)).astype("float32")
        y = rng.standard_normal((32, 16)).astype("float32")
        out = []
        for label, options in (("one worker", dict(algorithm="single", calibrate_links=False, splits="none")),
                               ("whole layers", dict(replicas=1, splits="none")),
                               ("products split", dict(replicas=1, splits="all"))):
            placed = placer.autoplace(model, devices, training=True, batch_size=32, profile_cache=False,
                                      time_limit_s=args.time_limit, sends=args.sends, **options)
            out.append((label, placed, lambda p=placed: p.train_on_batch(x, y)))
        return "105M-parameter MLP (strategy.py), one SGD step, batch 32", out
    from pipeline_orders import chain, hand_split

    model = chain(1024, 8)
    model.compile(optimizer="sgd", loss="mse")
    x = rng.standard_normal((128, 1024)).astype("float32")
    y = rng.standard_normal((128, 16)).astype("float32")
    _, split, one = hand_split(model, devices, 128, args.microbatches, 8)
    out = []
    for label, plan in (("one worker", one), ("split", split)):
        placed = placer.autoplace(model, devices, training=True, batch_size=128, microbatches=args.microbatches,
                                  plan=plan, profile_cache=False)
        out.append((label, placed, lambda p=placed: p.train_on_batch(x, y)))
    return f"chain of 8 dense layers trained, batch 128, {args.microbatches} micro-batch(es)", out


def timeline_rows(label: str, placed, events: dict[int, list[tuple[str, float, float]]], min_ms: float
                  ) -> list[str]:
    """Markdown rows comparing one traced step's kernels of at least ``min_ms`` (the middle step of the trace;
    times from the earliest ``FunctionRun`` of that step on either worker) with the simulated timeline of the
    same ops (the plan's emitted simulation, ``placed``'s report): op, type, worker, traced start and end, and
    simulated start and end (ms)."""
    starts = {task: sorted(s for name, s, _ in evs if name == "FunctionRun") for task, evs in events.items()}
    steps = min(len(v) for v in starts.values() if v)
    k = steps // 2
    t0 = min(v[k] for v in starts.values() if len(v) > k)
    report = placed.placement.report
    sim = {report._op_name(v): (s, e) for v, _, s, e in report.step_simulation.timeline}
    rows = []
    for task, evs in sorted(events.items()):
        hi = starts[task][k + 1] if len(starts[task]) > k + 1 else float("inf")
        for name, s, e in sorted(evs, key=lambda x: x[1]):
            if not _is_kernel(name) or not (t0 <= s < hi) or (e - s) < 1e3 * min_ms:
                continue
            op, kind = name.rsplit(":", 1)
            op = op.split("autoplace/", 1)[1]
            ss, se = sim.get(op, (float("nan"), float("nan")))
            rows.append(f"| {label} | {op} | {kind} | task {task} | {(s - t0) / 1e3:.1f} | {(e - t0) / 1e3:.1f} | "
                        f"{1e3 * ss:.1f} | {1e3 * se:.1f} |")
    return rows


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import placer

    out = MarkdownOut()
    with placer.LocalCluster(2, pin_cores=True, threads=1, profiler=True) as cluster:
        devices = placer.connect(cluster)
        title, placements = _placements(args, devices)
        out(f"## Phases of a placed step on each of 2 gRPC workers ({title}; profiler traces)")
        out()
        out(f"{time.strftime('%Y-%m-%d')}; medians over the traced steps, µs from the start of that worker's "
            "part of the step (`FunctionRun`); period = to its next step's start (traced, so slower than the "
            "untraced step). predicted = call cost + simulated step; makespan = the simulated step alone; "
            "busy = share of the traced window in which the worker ran a compute kernel, both = in which both "
            "workers did at once.")
        out()
        out("| placement | measured step ms (untraced) | predicted ms | simulated makespan ms | worker | steps | "
            "first compute kernel | last kernel end | kernels' sum | period | busy | both |")
        out("|---|---|---|---|---|---|---|---|---|---|---|---|")
        timelines: list[str] = []
        for label, placed, step in placements:
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
                events = {task: trace_events(path) for task, path in cluster.trace(step, logdir, args.trace_ms).items()}
            shares = busy_together(events.get(0, []), events.get(1, []))
            if args.timeline:
                timelines += timeline_rows(label, placed, events, args.timeline_min_ms)
            for task, evs in events.items():
                phases = step_phases(evs)
                if not len(phases):
                    continue  # a worker this placement does not use
                first, last, busy, period = np.median(phases, axis=0)
                out(f"| {label} | {1e3 * float(np.median(times)):.2f} | {1e3 * plan.predicted_step_time_s:.2f} | "
                    f"{1e3 * makespan:.2f} | task {task} | {len(phases)} | {first:.0f} | {last:.0f} | "
                    f"{busy:.0f} | {period:.0f} | {100 * shares[task]:.0f}% | {100 * shares[2]:.0f}% |")
        if timelines:
            out()
            out(f"### One traced step's kernels of {args.timeline_min_ms} ms or more beside the simulated timeline")
            out()
            out("Traced: ms from the step's first `FunctionRun` on either worker (the profiler slows kernels); "
                "simulated: the plan's emitted simulation (ms from its start).")
            out()
            out("| placement | op | type | runs on | traced start | traced end | simulated start | simulated end |")
            out("|---|---|---|---|---|---|---|---|")
            for row in timelines:
                out(row)
    out.write(args.out)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", choices=["mlp", "towers", "towers-copies", "inception", "chain-train", "wide-train"],
                    default="mlp",
                    help="the MLP's forward pass (default), or pipeline_orders.py's chain trained in two stages")
    ap.add_argument("--microbatches", type=int, default=1, help="micro-batches of the chain-train workload")
    ap.add_argument("--steps", type=int, default=30, help="untraced steps timed per placement")
    ap.add_argument("--trace-ms", type=int, default=1500, help="how long each placement is traced")
    ap.add_argument("--time-limit", type=float, default=5.0, help="solver time limit per placement (s)")
    ap.add_argument("--sends", default="auto", choices=["auto", "prompt", "executor"],
                    help="sends= of the wide-train placements")
    ap.add_argument("--timeline", action="store_true", help="also list one traced step's kernels beside the "
                    "simulated timeline")
    ap.add_argument("--timeline-min-ms", type=float, default=1.0, help="the shortest kernel --timeline lists")
    ap.add_argument("--out", default=str(HERE / "results" / "worker_trace.md"))
    args = ap.parse_args()
    return isolated(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
