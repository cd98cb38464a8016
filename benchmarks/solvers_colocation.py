"""Solver benchmark on graphs with large colocation groups: ``auto`` against every simple algorithm.

Measured op graphs of real Keras models where many ops must share a device
with a weight they read:

* ``lstm_seq2seq``: an unrolled LSTM encoder-decoder (each weight is read at
  every time step, so its group spans the sequence);
* ``two_branch_cnn``: two convolutional branches joined before the head;
* ``dense_cnn``: densely connected blocks (every layer reads all before it);

forward pass and full training step (Adam: gradients and updates are
colocated with their variable), on 4 devices with links of 100 µs +
250 bytes/µs, ``objective="latency"``. Each row: ``auto`` (default 5 s
budget), the proven lower bound and gap, and single / round-robin /
contiguous / op-level HEFT / ETF / contracted-group HEFT (``group_heft``) /
the contiguous DP, all scored by the same simulator. ``ok``: ``auto`` at
most every other column.

Op costs are measured on this machine's CPU once per graph and cached under
``benchmarks/.cache/`` (built in a TensorFlow child process by
``benchmarks/solvers.py``'s ``build_graph``).

    python benchmarks/solvers_colocation.py [--models lstm_seq2seq ...] [--out benchmarks/results/solvers_colocation.md]
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402

import placer  # noqa: E402
from placer import DeviceSpec  # noqa: E402
from placer.core.build import build_problem  # noqa: E402
from placer.core.devices import resolve_devices  # noqa: E402
from placer.errors import AutoplaceError  # noqa: E402
from placer.solvers import SolveOptions, solve_problem  # noqa: E402
from solvers import build_graph, fmt, markdown_lines  # noqa: E402

MODELS = ["lstm_seq2seq", "two_branch_cnn", "dense_cnn"]
ALGORITHMS = ["single", "round_robin", "contiguous", "heft", "etf", "group_heft", "contiguous_dp"]
#: 4 devices, links of 100 µs + 250 bytes/µs (the issue's setting)
DEVICES = [DeviceSpec(f"/CPU:{i}", latency_s=100e-6, bandwidth_bytes_per_s=250e6) for i in range(4)]


def group_sizes(problem) -> list[int]:
    """Ops per problem node (groups of two or more), largest first."""
    count = np.bincount(problem.schedule_view().group, minlength=problem.n)
    return sorted((int(c) for c in count if c > 1), reverse=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=MODELS)
    ap.add_argument("--group-by", nargs="+", default=["op", "layer"],
                    help="groupings: op (colocation only, placer.solve's default), layer (autoplace's)")
    ap.add_argument("--time-limit", type=float, default=5.0, help="auto's budget in seconds (default 5)")
    ap.add_argument("--out", default=str(HERE / "results" / "solvers_colocation.md"))
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    lines, emit = markdown_lines()
    emit("## Solver benchmark: large colocation groups (4 devices, links 100 µs + 250 bytes/µs, latency)")
    emit()
    emit("Simulated step in ms. `grouped`: ops in groups of 2+ ops (largest group), under `group_by` `op` "
         "(colocation only) or `layer` (autoplace's grouping). `ok` = auto <= every other column.")
    emit()
    header = "| graph | group_by | ops | grouped | auto | lower bound | gap | solve s | " + " | ".join(ALGORITHMS) + " | ok |"
    emit(header)
    emit("|" + "---|" * (header.count("|") - 1))
    rows = []
    devset = resolve_devices(DEVICES)
    for name in args.models:
        for training, group_by in itertools.product((False, True), args.group_by):
            graph, _ = placer.load_graph(build_graph(name, training, None))
            t = time.perf_counter()
            ours = placer.solve(graph, devset, objective="latency", time_limit_s=args.time_limit, baselines=(),
                                group_by=group_by)
            wall = time.perf_counter() - t
            problem = build_problem(graph, devset, group_by=group_by).problem
            sizes = group_sizes(problem)
            vals = {}
            for a in ALGORITHMS:
                try:
                    vals[a] = solve_problem(problem, a, SolveOptions(objective="latency")).objective
                except AutoplaceError:
                    vals[a] = float("inf")  # no feasible plan (or its preconditions do not hold)
            ok = all(not np.isfinite(v) or ours.value <= v * (1 + 1e-9) for v in vals.values())
            label = f"{name} {'train' if training else 'fwd'}"
            rows.append(dict(graph=label, group_by=group_by, ops=graph.number_of_nodes(), grouped=sum(sizes),
                             largest=sizes[0] if sizes else 1, auto=ours.value, lb=ours.lower_bound, gap=ours.gap,
                             wall_s=wall, solver=ours.solver, ok=ok, **vals))
            emit(f"| {label} | {group_by} | {graph.number_of_nodes()} | {sum(sizes)} ({sizes[0] if sizes else 1}) | "
                 f"{fmt(ours.value * 1e3)} | {fmt(ours.lower_bound * 1e3)} | {100 * ours.gap:.1f}% | {wall:.1f} | "
                 + " | ".join(fmt(vals[a] * 1e3) for a in ALGORITHMS) + f" | {'ok' if ok else 'NO'} |")
    gaps = np.array([r["gap"] for r in rows])
    emit()
    emit(f"auto <= every algorithm on {sum(r['ok'] for r in rows)}/{len(rows)} graphs; geometric-mean gap to the "
         f"lower bound {100 * (np.exp(np.mean(np.log1p(gaps))) - 1):.1f}% (target 5%); auto's plans: "
         + ", ".join(f"{r['graph']} ({r['group_by']}): {r['solver']}" for r in rows) + ".")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1, default=float))
    print(f"written: {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
