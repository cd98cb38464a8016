"""A/B of plans between two code trees on the same cached op graphs (no TensorFlow needed).

Run once per tree (e.g. a ``git worktree`` of the old commit and this checkout), one after the other,
then compare; plans are deterministic (budgets are estimated work), wall times are not:

    python benchmarks/solvers_ab.py run OLD_TREE old.json [OBJECTIVE]
    python benchmarks/solvers_ab.py run .        new.json [OBJECTIVE]
    python benchmarks/solvers_ab.py compare old.json new.json

Graphs: ``benchmarks/.cache`` as ``benchmarks/solvers.py`` and ``benchmarks/solvers_colocation.py`` left
them (run those first). ``OBJECTIVE`` is ``latency`` (the default), ``throughput`` or ``memory``. Suite
cases: 2, 4 and 8 devices, default links (for ``memory``, each device holding ``solvers.capacity``: 1.25x
an even share); colocation cases (``latency`` only): 4 devices, links of 100 µs + 250 bytes/µs,
``group_by`` op and layer. Values in ms, or MB crossing devices for ``memory``. Results of 2026-12-03:
``benchmarks/results/ab/solvers_descent_ab.md``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

CACHE = Path(__file__).resolve().parent / ".cache"
SUITE = ["resnet50", "inception_v3", "mobilenet_v2", "transformer", "lstm_seq2seq", "multi_tower_mlp"]
COLOCATION = ["lstm_seq2seq", "two_branch_cnn", "dense_cnn"]


def run(tree: str, out: str, objective: str = "latency") -> None:
    root = Path(tree).resolve()
    if not (root / "placer" / "__init__.py").is_file():
        raise SystemExit(f"{tree} has no placer/ package: give the root of a checkout (e.g. a git worktree)")
    sys.path[:0] = [str(root)]
    import placer
    if not Path(placer.__file__).resolve().is_relative_to(root):  # another placer was imported first
        raise SystemExit(f"imported {placer.__file__}, not {tree}'s placer: run this script in a fresh process")
    from placer import DeviceSpec
    from placer.core.devices import resolve_devices

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from solvers import capacity  # this checkout's benchmark, with the tree's placer

    links = [DeviceSpec(f"/CPU:{i}", latency_s=100e-6, bandwidth_bytes_per_s=250e6) for i in range(4)]
    cases = [(f"suite {name} {part} k={k}", CACHE / f"{name}_{part}.json", k, "op")
             for name in SUITE for part in ("fwd", "train") for k in (2, 4, 8)]
    if objective == "latency":
        cases += [(f"coloc {name} {part} {by}", CACHE / f"{name}_{part}.json", links, by)
                  for name in COLOCATION for part in ("fwd", "train") for by in ("op", "layer")]
    rows = []
    for label, path, devices, by in cases:
        if not path.exists():
            print(f"skipped {label}: {path} not built", file=sys.stderr)
            continue
        graph, _ = placer.load_graph(path)
        if isinstance(devices, int):
            cap = capacity(graph, devices) if objective == "memory" else None
            devices = [DeviceSpec(f"/CPU:{i}", memory_bytes=cap) for i in range(devices)]
        t = time.perf_counter()
        r = placer.solve(graph, resolve_devices(devices), objective=objective, baselines=(), group_by=by)
        rows.append(dict(case=label, value=r.value, lb=r.lower_bound, gap=r.gap, solver=r.solver,
                         wall=time.perf_counter() - t, scale=1e-6 if objective == "memory" else 1e3))
        print(json.dumps(rows[-1]), flush=True)
    Path(out).write_text(json.dumps(rows))


def compare(old_path: str, new_path: str) -> None:
    import numpy as np

    old = {r["case"]: r for r in json.loads(Path(old_path).read_text())}
    new = {r["case"]: r for r in json.loads(Path(new_path).read_text())}
    print("| case | old | new | change | old gap | new gap | old wall | new wall | new plan |")
    print("|---|---|---|---|---|---|---|---|---|")
    both = [c for c in old if c in new]
    for c in both:
        o, n = old[c], new[c]
        scale = n.get("scale", 1e3)
        change = 100 * (n["value"] / o["value"] - 1)
        print(f"| {c} | {o['value'] * scale:.4g} | {n['value'] * scale:.4g} | {change:+.1f}% | "
              f"{100 * o['gap']:.1f}% | {100 * n['gap']:.1f}% | {o['wall']:.1f} | {n['wall']:.1f} | {n['solver']} |")
    print()
    for prefix in ("suite", "coloc"):
        sel = [c for c in both if c.startswith(prefix)]
        if not sel:
            continue
        ratio = np.array([new[c]["value"] / old[c]["value"] for c in sel])
        gm = lambda xs: 100 * (np.exp(np.mean(np.log1p(xs))) - 1)  # noqa: E731
        print(f"* {prefix}: {len(sel)} cases, {int((ratio < 1 - 1e-9).sum())} better, {int((ratio > 1 + 1e-9).sum())} "
              f"worse; geometric-mean value ratio {np.exp(np.log(ratio).mean()):.4f} (min {ratio.min():.3f}); "
              f"geometric-mean gap {gm([old[c]['gap'] for c in sel]):.1f}% -> {gm([new[c]['gap'] for c in sel]):.1f}%; "
              f"max wall {max(old[c]['wall'] for c in sel):.1f} -> {max(new[c]['wall'] for c in sel):.1f} s")


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if sys.argv[1:2] == ["run"] and len(sys.argv) in (4, 5):
        run(*sys.argv[2:])
    elif sys.argv[1:2] == ["compare"] and len(sys.argv) == 4:
        compare(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
