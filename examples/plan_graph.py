"""Plan a cost-annotated graph without TensorFlow: three objectives, heterogeneous devices, a JSON file.

    python examples/plan_graph.py [OUT_DIR]

Builds a synthetic training-step graph (40 layers, 1,000 ops), places it on
one host CPU and two GPUs (20x faster, 64 MB each) under each objective,
prints the plans and writes the graph file that ``autoplace plan-graph``
reads.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import placer  # noqa: E402
from placer import DeviceSpec  # noqa: E402
from placer.core.synthetic import training_graph  # noqa: E402


def main(out_dir: str = "out") -> dict[str, placer.Plan]:
    g = training_graph(layers=40, ops_per_layer=11, seed=0)
    for v in g:  # GPUs run every op 20x faster; variable reads of the first layer only have a CPU kernel
        us = g.nodes[v]["compute_us"]
        g.nodes[v]["compute_us"] = {"CPU": us, "GPU": us / 20}
    g.nodes["layer0/read"]["allowed_kinds"] = ["CPU"]
    devices = [DeviceSpec("/CPU:0"), DeviceSpec("/GPU:0", memory_bytes=64 << 20),
               DeviceSpec("/GPU:1", memory_bytes=64 << 20)]
    plans = {}
    for objective in ("latency", "throughput", "memory"):
        p = placer.solve(g, devices, objective=objective, time_limit_s=2, seed=0)
        plans[objective] = p
        per_device = {d.rsplit("/device:", 1)[1]: sum(1 for x in p.assignment.values() if x == d) for d in p.devices}
        print(f"{objective:>10}: {p.value:.6g} {p.unit} predicted (bound {p.lower_bound:.6g}, gap {100 * p.gap:.1f}%) "
              f"by {p.solver} in {p.solve_time_s:.1f} s; ops per device {per_device}")
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "training_graph.json")
    placer.save_graph(path, g, devices)
    print(f"graph file: {path}  (try: autoplace plan-graph {path} --objective throughput)")
    return plans


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "out")
