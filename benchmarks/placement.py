"""Placement benchmark: ResNet50 and InceptionV3 forward graphs on 2 and 4 devices.

Prints, per model and device count: op count, coarse groups, profiling time,
solve time, and the plan's max-load objective and simulated step time next to
single-device, round-robin and contiguous placements, as ratios
(baseline / ours; > 1 means ours is better). All placements are scored with
the same measured op costs and the same link model in one run.

Devices are logical CPU devices; links use the planning defaults
(8 GB/s, 20 µs), which are assumptions, not calibrated measurements.

    python benchmarks/placement.py [--batch 8] [--time-limit 10] [--models resnet50 inception_v3]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 4)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import keras  # noqa: E402

from placer.coarsen import coarsen  # noqa: E402
from placer.costs import compute_costs  # noqa: E402
from placer.devices import resolve_devices  # noqa: E402
from placer.opgraph import build_op_graph  # noqa: E402
from placer.planning import build_problem, project, simulate_ops  # noqa: E402
from placer.solvers import SolveOptions, solve_problem  # noqa: E402
from placer.trace import trace_model  # noqa: E402

MODELS = {
    "resnet50": lambda: keras.applications.ResNet50(weights=None),
    "inception_v3": lambda: keras.applications.InceptionV3(weights=None),
}
BASELINES = ("single", "round_robin", "contiguous")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    args = ap.parse_args()
    rows = []
    for name in args.models:
        model = MODELS[name]()
        t = time.perf_counter()
        traced = trace_model(model, batch_size=args.batch)
        trace_s = time.perf_counter() - t
        t = time.perf_counter()
        compute = compute_costs(traced, ["CPU"], repeats=args.repeats, seed=0).us
        profile_s = time.perf_counter() - t
        op_graph = build_op_graph(traced, compute)
        coarse = coarsen(op_graph)
        for k in (2, 4):
            devset = resolve_devices([f"/CPU:{i}" for i in range(k)])
            problem = build_problem(coarse, devset)
            t = time.perf_counter()
            ours = solve_problem(problem, "auto", SolveOptions(time_limit_s=args.time_limit))
            solve_s = time.perf_counter() - t
            ours_step = simulate_ops(op_graph, devset, project(coarse, ours.assignment, devset)).step_time_s
            row = {"model": name, "k": k, "ops": op_graph.graph.number_of_nodes(), "groups": problem.n,
                   "trace_s": trace_s, "profile_s": profile_s, "solve_s": solve_s, "load_ms": ours.objective * 1e3,
                   "gap": ours.gap, "step_ms": ours_step * 1e3, "solver": ours.solver}
            for b in BASELINES:
                s = solve_problem(problem, b)
                step = simulate_ops(op_graph, devset, project(coarse, s.assignment, devset)).step_time_s
                row[f"{b}_load_x"] = s.objective / ours.objective
                row[f"{b}_step_x"] = step / ours_step
            rows.append(row)
            print(f"{name} k={k} done: load {row['load_ms']:.2f} ms, gap {100 * ours.gap:.1f}%", file=sys.stderr)
    head = ("| model | devices | ops | groups | profile s | solve s | max load ms (gap) | step ms | "
            "load ×: single / round-robin / contiguous | step ×: single / round-robin / contiguous |")
    print(head)
    print("|" + "---|" * 10)
    for r in rows:
        print(f"| {r['model']} | {r['k']} | {r['ops']} | {r['groups']} | {r['profile_s']:.1f} | {r['solve_s']:.1f} | "
              f"{r['load_ms']:.1f} ({100 * r['gap']:.1f}%) | {r['step_ms']:.1f} | "
              f"{r['single_load_x']:.2f} / {r['round_robin_load_x']:.2f} / {r['contiguous_load_x']:.2f} | "
              f"{r['single_step_x']:.2f} / {r['round_robin_step_x']:.2f} / {r['contiguous_step_x']:.2f} |")


if __name__ == "__main__":
    main()
