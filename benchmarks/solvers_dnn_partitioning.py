"""Solver benchmark on the public NeurIPS'20 placement workloads (no TensorFlow).

Reads ``../shared/benchmarks/dnn-partitioning/throughput-inputs/*/*.json``
(Tarnawski et al., msr-fiddle/dnn-partitioning; never committed here) and, for
each workload, prints our max-load objective next to single-device,
round-robin and contiguous placements (ratios baseline / ours), the proven
lower bound and gap, and the solve time. Workloads are skipped with a message
when the folder is absent.

Mapping of the format: ``maxFPGAs`` accelerators (capacity ``maxSizePerFPGA``)
plus ``maxCPUs`` host devices (unlimited memory); a node's time is
``fpgaLatency`` on an accelerator and ``cpuLatency`` on a host, and nodes with
``supportedOnFpga == 0`` may only use hosts; nodes sharing ``colorClass`` are
merged (colocated); an edge's ``cost`` (the same for every edge leaving a node)
is the transfer time of that node's output, charged per the max-load model.

    python benchmarks/solvers_dnn_partitioning.py [--time-limit 10] [--kinds LayerGraphs]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time

import networkx as nx
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from cost_models import TensorEdge  # noqa: E402
from placer.errors import NoFeasiblePlanError  # noqa: E402
from placer.core.problem import PlacementProblem, Schedule, group_tensors  # noqa: E402
from placer.solvers import SolveOptions, solve_problem  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "benchmarks",
                    "dnn-partitioning", "throughput-inputs")


def load(path: str) -> PlacementProblem:
    data = json.load(open(path))
    nodes = {n["id"]: n for n in data["nodes"]}
    uf = nx.utils.UnionFind()
    by_color: dict[int, int] = {}
    for nid, n in nodes.items():
        uf[nid]
        if n.get("colorClass") is not None:
            uf.union(by_color.setdefault(n["colorClass"], nid), nid)
    groups = sorted((sorted(s) for s in uf.to_sets()), key=lambda s: s[0])
    gid = {nid: i for i, s in enumerate(groups) for nid in s}
    acc, cpus = int(data["maxFPGAs"]), int(data["maxCPUs"])
    k = acc + cpus
    compute = np.zeros((len(groups), k))
    memory = np.zeros(len(groups))
    for i, s in enumerate(groups):
        on_acc = all(nodes[n]["supportedOnFpga"] for n in s)
        compute[i, :acc] = sum(nodes[n]["fpgaLatency"] for n in s) if on_acc else np.inf
        compute[i, acc:] = sum(nodes[n]["cpuLatency"] for n in s)
        memory[i] = sum(nodes[n]["size"] for n in s)
    # The original nodes are the schedule (a DAG), so list schedulers and the
    # latency objective work even where colour classes close cycles between groups.
    ids = sorted(nodes)
    fine = {nid: i for i, nid in enumerate(ids)}
    durations = np.array([[nodes[n]["fpgaLatency"] if nodes[n]["supportedOnFpga"] else np.inf] * acc
                          + [nodes[n]["cpuLatency"]] * cpus for n in ids], dtype=float)
    cost: dict[int, float] = {}
    dsts: dict[int, set[int]] = {}
    for e in data["edges"]:
        cost[e["sourceId"]] = e["cost"]
        dsts.setdefault(e["sourceId"], set()).add(fine[e["destId"]])
    fine_tensors = [TensorEdge(fine[src], tuple(sorted(ds)), float(cost[src])) for src, ds in sorted(dsts.items())]
    group = np.array([gid[n] for n in ids])
    schedule = Schedule(durations, tuple(fine_tensors), (), group)
    tensors = group_tensors(fine_tensors, group)
    # Only accelerators have the memory cap; host memory is unlimited in this format.
    cap = np.array([float(data["maxSizePerFPGA"])] * acc + [np.inf] * cpus)
    return PlacementProblem.build(names=[str(s[0]) for s in groups], compute_s=compute, memory_bytes=memory,
                                  capacity_bytes=cap, tensors=tensors, bandwidth=np.ones((k, k)),
                                  latency=np.zeros((k, k)), order=_forward_order(nodes, data["edges"], gid),
                                  schedule=schedule)


def _forward_order(nodes, edges, gid):
    """Groups in a topological order of the forward graph, as the paper's DP orders them.

    A colour class holds a layer's forward and backward nodes, so the groups'
    own dependencies form cycles in training graphs. The order follows the
    edges between forward nodes; a group with backward nodes only sits where
    the mirror image of its backward edges puts it (Tarnawski et al.'s
    artificial forward nodes). Ties by the group's index (its smallest node id).
    """
    forward = {g for nid, g in gid.items() if not nodes[nid]["isBackwardNode"]}
    g = nx.DiGraph()
    g.add_nodes_from(set(gid.values()))
    for e in edges:
        u, v = gid[e["sourceId"]], gid[e["destId"]]
        if u == v:
            continue
        back = nodes[e["sourceId"]]["isBackwardNode"], nodes[e["destId"]]["isBackwardNode"]
        if not any(back):
            g.add_edge(u, v)
        elif all(back) and (u not in forward or v not in forward):
            g.add_edge(v, u)  # mirrored
    # Colour classes can close cycles in the forward graph too; the paper fuses those, here they
    # keep their place (the condensation's order, ties by smallest group) and the DP mirrors inside them.
    c = nx.condensation(g)
    first = {x: min(c.nodes[x]["members"]) for x in c}
    return [v for x in nx.lexicographical_topological_sort(c, key=first.__getitem__)
            for v in sorted(c.nodes[x]["members"])]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--kinds", nargs="+", default=["LayerGraphs", "OperatorGraphs"])
    args = ap.parse_args()
    if not os.path.isdir(ROOT):
        print(f"skipped: {ROOT} not found (the workloads live in ../shared, outside the repo)")
        return
    print("| workload | nodes (groups) | devices | ours (solver) | gap | solve s | "
          "single × | round-robin × | contiguous × | partition × | heft × |")
    print("|" + "---|" * 11)
    for kind in args.kinds:
        for path in sorted(glob.glob(os.path.join(ROOT, kind, "*.json"))):
            name = f"{kind}/{os.path.basename(path)[:-5]}"
            p = load(path)
            n_nodes = len(json.load(open(path))["nodes"])
            t = time.perf_counter()
            try:
                ours = solve_problem(p, "auto", SolveOptions(time_limit_s=args.time_limit, objective="throughput"))
            except NoFeasiblePlanError as e:
                print(f"| {name} | {n_nodes} ({p.n}) | {p.k} | infeasible: {str(e)[:80]} | | | | | |")
                continue
            wall = time.perf_counter() - t
            ratios = []
            for b in ("single", "round_robin", "contiguous", "partition", "heft"):
                try:
                    base = solve_problem(p, b, SolveOptions(objective="throughput"))
                    ratios.append(f"{base.objective / ours.objective:.2f}")
                except NoFeasiblePlanError:
                    ratios.append("infeasible")
            print(f"| {name} | {n_nodes} ({p.n}) | {p.k} | {ours.objective:.4g} ({ours.solver}) | "
                  f"{100 * ours.gap:.1f}% | {wall:.1f} | {' | '.join(ratios)} |", flush=True)


if __name__ == "__main__":
    main()
