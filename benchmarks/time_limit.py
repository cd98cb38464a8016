"""Does ``time_limit_s`` hold on adversarial graph shapes? (no TensorFlow)

For each shape — a star (one node feeding every other, one broadcast
tensor), a fan (one node, a separate tensor to each leaf), a long chain, a
dense random DAG and a fan-in (every leaf into one sink) — build the graph,
then time ``placer.solve`` on 4 identical devices (planning-default links)
with ``--time-limit`` seconds, ``repeats`` times. Reported per shape: the
validation + problem build time, the solve stage's wall time (median and
spread over the repeats), its ratio to the limit, and the plan's value
against its lower bound. The target (issue 16) is solve ≤ 2 × limit, with
validation on top.

    python benchmarks/time_limit.py [--time-limit 2] [--repeats 3] [--nodes 50000] [--out benchmarks/results/time_limit.md]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import networkx as nx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from placer.core.build import build_problem  # noqa: E402
from placer.core.devices import resolve_devices  # noqa: E402
from placer.planner import PlanOptions, plan_problem  # noqa: E402


def hub(n: int, *, inward: bool = False, broadcast: bool = False) -> nx.DiGraph:
    """One hub and ``n`` leaves: edges hub → leaf (``inward``: leaf → hub); ``broadcast``: one tensor to all."""
    g = nx.DiGraph()
    g.add_node("hub", compute_us=10.0)
    for i in range(n):
        g.add_node(i, compute_us=5.0)
        g.add_edge(*((i, "hub") if inward else ("hub", i)), bytes=1024, **({"tensor": "hub:0"} if broadcast else {}))
    return g


def chain(n: int) -> nx.DiGraph:
    g = nx.DiGraph()
    for i in range(n):
        g.add_node(i, compute_us=float(1 + i % 7))
        if i:
            g.add_edge(i - 1, i, bytes=4096)
    return g


def dense(n: int, seed: int = 0) -> nx.DiGraph:
    """``n`` nodes, each reading up to 20 random earlier nodes (~10 n edges)."""
    rng = np.random.default_rng(seed)
    g = nx.DiGraph()
    for i in range(n):
        g.add_node(i, compute_us=float(rng.uniform(1, 50)))
        for j in set(rng.integers(0, i, size=min(i, 20)).tolist()) if i else ():
            g.add_edge(j, i, bytes=float(rng.integers(64, 1 << 16)))
    return g


SHAPES = {"star": lambda n: hub(n, broadcast=True), "fan": hub, "fan_in": lambda n: hub(n, inward=True), "chain": chain, "dense": lambda n: dense(max(n // 10, 10))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--time-limit", type=float, default=2.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--nodes", type=int, default=50_000)
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES))
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    devices = resolve_devices([f"/CPU:{i}" for i in range(4)])
    rows = []
    for name in args.shapes:
        g = SHAPES[name](args.nodes)
        t = time.perf_counter()
        built = build_problem(g, devices, group_by="op")
        build_s = time.perf_counter() - t
        walls, plan = [], None
        for _ in range(args.repeats):
            t = time.perf_counter()
            plan = plan_problem(built, PlanOptions(time_limit_s=args.time_limit))
            walls.append(time.perf_counter() - t)
        med = statistics.median(walls)
        rows.append(f"| {name} | {g.number_of_nodes()} | {g.number_of_edges()} | {build_s:.2f} | {med:.2f} "
                    f"({min(walls):.2f}–{max(walls):.2f}) | {med / args.time_limit:.2f} | {plan.value:.6g} | "
                    f"{plan.lower_bound:.6g} | {plan.solver} |")
        print(rows[-1], flush=True)
    text = "\n".join([
        f"# time_limit_s on adversarial shapes (limit {args.time_limit:g} s, 4 devices, {args.repeats} repeats)",
        "",
        "`python benchmarks/time_limit.py` — measured on this machine (2 cores); solve = `plan_problem` wall time "
        "(search, final simulation, baselines), validation + build not included.",
        "",
        "| shape | nodes | edges | validate + build s | solve s median (min–max) | solve / limit | value | "
        "lower bound | solver |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows, ""])
    if args.out:
        Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
