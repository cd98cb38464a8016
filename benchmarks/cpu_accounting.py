"""Where a placed step's time goes on two gRPC workers: CPU seconds per step of this process and of each worker.

A diagnostic of the cost model, not a speedup figure. One workload (default:
the speedup benchmark's 8-tower MLP) is placed on two worker processes of a
``placer.LocalCluster`` (each pinned to one core, one thread) three ways:
every op on worker 0 (``single``), autoplace's plan (``objective="throughput"``,
one micro-batch) and ``contiguous``. Each placement and the stand-in of its
call (:func:`placer.measure.links.stand_in`: the same inputs, outputs,
captures and devices, next to no compute) are run in blocks of ``--steps``
calls, interleaved over ``--rounds`` rounds. Per block: the wall time per
call, and the CPU time per call of this process and of each worker
(``/proc/PID/stat``, user + system; the kernel counts in ticks of 10 ms, so
blocks are long), and the time each process's threads were runnable but
waiting for a core (``/proc/PID/task/*/schedstat``): on a 2-core machine
the client is a third process beside two pinned workers. The table puts beside them the plan's prediction (the
measured call cost + the simulated step) and the simulator's busy time per
device. A second table re-simulates each plan with the link latency swept,
to show how much of a gap latency could explain.

What it showed (2026-12-03, 2-core VM): the one-worker plan's prediction was
within 0-12% of its measurement and its worker's CPU matched the simulated
busy time; the split plans were predicted 13-27% fast, their workers' CPU
matched the simulated busy time plus the modelled transfer CPU, yet both
workers were idle ~3.5 ms of a ~10 ms compute phase where the simulator
expects ~1 ms; the client burned ~30% of a core while it waited; raising the
link latency from 0.115 to 1 ms added only 0.7 ms to the prediction. See
README "Known limitations".

    python benchmarks/cpu_accounting.py [--rounds 6] [--steps 20] [--out benchmarks/results/cpu_accounting.md]
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

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
LATENCIES_S = (0.1e-3, 0.25e-3, 0.5e-3, 1e-3)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux ``/proc``)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * TICK_S


def schedstats(pid: int) -> dict[str, tuple[float, float]]:
    """Thread id → (seconds on a core, seconds runnable but waiting for one) of process ``pid``'s threads
    (Linux ``/proc/PID/task/*/schedstat``, ns)."""
    out = {}
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                on_cpu, waiting = f.read().split()[:2]
        except FileNotFoundError:  # the thread ended between the listing and the read
            continue
        out[task] = (int(on_cpu) * 1e-9, int(waiting) * 1e-9)
    return out


def waits(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]) -> tuple[float, float]:
    """Seconds waiting for a core between two :func:`schedstats`: all threads, and the thread that ran most
    (a worker's compute thread)."""
    delta = {t: (a[0] - before.get(t, (0.0, 0.0))[0], a[1] - before.get(t, (0.0, 0.0))[1]) for t, a in after.items()}
    busiest = max(delta.values(), key=lambda d: d[0], default=(0.0, 0.0))
    return sum(d[1] for d in delta.values()), busiest[1]


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf

    import placer
    import workloads
    from cost_models.comm import Link
    from placer.core.build import build_problem
    from placer.measure.links import stand_in
    from placer.tf.graphdef import complete_assignment, layer_devices_of
    from placer.tf.timing import call_interface
    from placer.tf.trace import trace_model

    out = MarkdownOut()

    with placer.LocalCluster(2, pin_cores=True, threads=1) as cluster:
        devices = placer.connect(cluster)
        keras.utils.set_random_seed(0)
        model = workloads.multi_tower_mlp(towers=8, width=512, depth=4)
        batch = 64
        x = np.random.default_rng(0).standard_normal((batch, 512)).astype("float32")
        placed = {}
        for label, opts in (("single", dict(algorithm="single", calibrate_links=False)),
                            ("autoplace", dict(objective="throughput", microbatches=1)),
                            ("contiguous", dict(algorithm="contiguous", objective="throughput", microbatches=1))):
            placed[label] = placer.autoplace(model, devices, batch_size=batch, profile_cache=False,
                                             time_limit_s=args.time_limit, **opts)
        traced = trace_model(model, batch_size=batch)
        calls = {}
        for label, p in placed.items():
            op_devices = complete_assignment(traced.fixed.graph, p.plan.assignment,
                                             layer_devices_of(p.plan.assignment))
            calls[label] = stand_in(call_interface(traced, op_devices))
        steps = {label: (lambda p=p: [t.numpy() for t in tf.nest.flatten(p(x))]) for label, p in placed.items()}
        steps.update({f"{label} (call stand-in)": (lambda f=f: [t.numpy() for t in f()])
                      for label, f in calls.items()})
        pids = [os.getpid()] + [proc.pid for proc in cluster.procs]
        for step in steps.values():
            for _ in range(5):
                step()
        rows: dict[str, list[list[float]]] = {label: [] for label in steps}
        for r in range(args.rounds):
            for label in (list(steps) if r % 2 == 0 else list(steps)[::-1]):
                before, sched = [cpu_seconds(pid) for pid in pids], [schedstats(pid) for pid in pids]
                t = time.perf_counter()
                for _ in range(args.steps):
                    steps[label]()
                wall = (time.perf_counter() - t) / args.steps
                after = [cpu_seconds(pid) for pid in pids]
                waited = [w for pid, s0 in zip(pids, sched) for w in waits(s0, schedstats(pid))]
                rows[label].append([wall] + [(b - a) / args.steps for a, b in zip(before, after)]
                                   + [w / args.steps for w in waited])

        out("## Where a placed step's time goes: CPU per step on 2 gRPC workers (8-tower MLP, batch 64)")
        out()
        out(f"{time.strftime('%Y-%m-%d')}; {args.rounds} interleaved rounds of {args.steps} calls; medians over "
            f"rounds, ms per call (CPU from /proc, {TICK_S * 1e3:.0f} ms ticks). predicted = the plan's measured "
            "call cost + its simulated step; busy = the simulator's busy time per device (transfer CPU not "
            "included).")
        out()
        out("| placement | predicted | measured | error | client CPU | worker 0 CPU | worker 1 CPU | "
            "waiting for a core: client / w0 / w1 (their compute threads) | simulated busy w0 / w1 | "
            "cut tensors (MB) | shared capacity |")
        out("|---|---|---|---|---|---|---|---|---|---|---|")
        for label, samples in rows.items():
            wall, client, w0, w1, qc, _, q0, t0, q1, t1 = np.median(np.asarray(samples), axis=0) * 1e3
            waiting = f"{qc:.2f} / {q0:.2f} ({t0:.2f}) / {q1:.2f} ({t1:.2f})"
            p = placed.get(label)
            if p is None:
                out(f"| {label} | | {wall:.2f} | | {client:.2f} | {w0:.2f} | {w1:.2f} | {waiting} | | | |")
                continue
            data = p.report_data
            predicted = p.plan.predicted_step_time_s * 1e3
            busy = " / ".join(f"{d.get('predicted_busy_s', 0.0) * 1e3:.2f}" for d in data["devices"])
            cut = [e["bytes"] for e in data["edges"] if e["cut"]]
            shared = ", ".join(f"{s['capacity']:.2f}" for s in data.get("shared_processors", []))
            out(f"| {label} | {predicted:.2f} | {wall:.2f} | {100 * (predicted - wall) / wall:+.1f}% | "
                f"{client:.2f} | {w0:.2f} | {w1:.2f} | {waiting} | {busy} | {len(cut)} ({sum(cut) / 1e6:.2f}) | "
                f"{shared} |")
        out()
        out("Predicted step (ms) with the link latency swept (each plan re-simulated with its own devices, "
            "bandwidth and transfer CPU; calibrated latency in the first table's plans):")
        out()
        out("| latency ms | " + " | ".join(placed) + " |")
        out("|---|" + "---|" * len(placed))
        for latency in LATENCIES_S:
            cells = []
            for p in placed.values():
                ps = p.placement
                links = {ij: Link(link.bandwidth_bytes_per_s, latency, link.cpu_s) for ij, link in ps.devices.links.items()}
                devset = replace(ps.devices, links=links)
                built = build_problem(ps.op_graph.graph, devset, group_by=p.plan.group_by)
                sim = built.simulate(built.group_assignment(p.plan.assignment))
                cells.append(f"{(sim.step_time_s + p.plan.call_overhead_s) * 1e3:.2f}")
            out(f"| {latency * 1e3:.3g} | " + " | ".join(cells) + " |")
    out.write(args.out)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=6, help="interleaved rounds (each placement once a round)")
    ap.add_argument("--steps", type=int, default=20, help="calls per timed block")
    ap.add_argument("--time-limit", type=float, default=5.0, help="solver time limit per placement (s)")
    ap.add_argument("--out", default=str(HERE / "results" / "cpu_accounting.md"))
    args = ap.parse_args()
    return isolated(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
