"""What a planned execution order is worth: each device's ops in critical-path order against the executor's.

TensorFlow's executor (and the simulator's ``"fifo"``) runs a device's ready
ops in the order they became ready. ``cp_heft`` (``placer/solvers/listsched.py``)
schedules by critical path and keeps each device's order as control edges
(``Plan.op_order``, ``placer/core/order.py``). For each cached op graph of the
solver suite (``benchmarks/.cache``, built by ``benchmarks/solvers.py``) and 2,
4, 8 devices (the suite's default links; training steps also on 4 devices with
free links, 1e15 bytes/s and no latency), all **predicted** (the simulator):

* ``bound``: the latency lower bound;
* ``cp_heft ordered``: cp_heft's plan in its own order (what it emits);
* ``cp_heft ready order``: the same assignment run in the executor's order;
* ``cp_etf ordered`` and ``cp_etf ready order``: the same for ``cp_etf``;
* ``etf``: ETF's plan (its list schedule follows the ready order);
* ``auto (executor)``: ``auto`` with ``execution_order="executor"`` (the
  search before planned orders existed) and ``auto``: the default, which
  keeps the better kind.

No TensorFlow is imported (the graphs are cached); about 5 minutes (1 with ``--no-auto``).

    python benchmarks/execution_order.py [--out benchmarks/results/execution_order.md] [--no-auto]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import placer  # noqa: E402
from placer import DeviceSpec  # noqa: E402
from placer.core.build import build_problem  # noqa: E402
from placer.core.graph_io import as_device_set  # noqa: E402
from placer.planner import PlanOptions, plan_problem  # noqa: E402

CACHE = HERE / ".cache"
SUITE = ["resnet50", "inception_v3", "mobilenet_v2", "transformer", "lstm_seq2seq", "multi_tower_mlp"]


def row(graph, devices, with_auto: bool) -> dict[str, float]:
    """The predicted steps of one case (seconds)."""
    built = build_problem(graph, as_device_set(devices), group_by="op")
    out: dict[str, float] = {}
    for name in ("cp_heft", "cp_etf"):
        plan = plan_problem(built, PlanOptions(algorithm=name, baselines=()))
        out["bound"] = plan.lower_bound
        out[f"{name} ordered"] = plan.value
        # the same assignment without its order: the executor's
        out[f"{name} ready order"] = plan_problem(built, PlanOptions(baselines=()), given=plan.assignment).value
    out["etf"] = plan_problem(built, PlanOptions(algorithm="etf", baselines=())).value
    if with_auto:
        out["auto (executor)"] = placer.solve(graph, devices, baselines=(), execution_order="executor").value
        plan = placer.solve(graph, devices, baselines=())
        out["auto"] = plan.value
        out["auto plan"] = plan.solver
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(HERE / "results" / "execution_order.md"))
    parser.add_argument("--no-auto", action="store_true", help="skip the two auto columns (1 minute instead of 4)")
    args = parser.parse_args()
    cases = []
    for name in SUITE:
        for part in ("fwd", "train"):
            path = CACHE / f"{name}_{part}.json"
            if not path.exists():
                print(f"skipped {name} {part}: {path} not built (run benchmarks/solvers.py first)", file=sys.stderr)
                continue
            for k in (2, 4, 8):
                cases.append((f"{name} {part}", f"{k}", path, [DeviceSpec(f"/CPU:{i}") for i in range(k)]))
            if part == "train":
                free = [DeviceSpec(f"/CPU:{i}", bandwidth_bytes_per_s=1e15, latency_s=0.0) for i in range(4)]
                cases.append((f"{name} {part}", "4, free links", path, free))
    columns = ["bound", "cp_heft ordered", "cp_heft ready order", "cp_etf ordered", "cp_etf ready order", "etf"]
    columns += [] if args.no_auto else ["auto (executor)", "auto"]
    lines = ["## Planned execution order (predicted: simulated steps in ms)", "",
             f"`python benchmarks/execution_order.py` ({time.strftime('%Y-%m-%d')}). Gaps to the lower bound in "
             "parentheses.", "",
             "| graph | devices | " + " | ".join(columns) + (" | auto's plan |" if not args.no_auto else ""),
             "|---|---|" + "---|" * (len(columns) + (0 if args.no_auto else 1))]
    for label, k, path, devices in cases:
        graph, _ = placer.load_graph(path)
        t = time.perf_counter()
        r = row(graph, devices, not args.no_auto)
        cells = [f"{1e3 * r['bound']:.4g}"] + [f"{1e3 * r[c]:.4g} ({100 * (1 - r['bound'] / r[c]):.1f}%)"
                                               for c in columns[1:]]
        lines.append(f"| {label} | {k} | " + " | ".join(cells) + (f" | {r['auto plan']} |" if not args.no_auto
                                                                    else " |"))
        print(lines[-1], f"[{time.perf_counter() - t:.1f} s]", flush=True)
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
