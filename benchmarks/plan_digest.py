"""Digest of ``placer.solve``'s plans on the solver benchmark's graphs, to check that a change keeps them.

For each workload graph (cached by ``benchmarks/solvers.py`` under
``benchmarks/.cache/``; built there when missing), 2 and 4 devices and each
objective: the plan's value, bound, solver and a hash of its assignment.
Plans are deterministic, so two versions of the code that build and solve
the same problem give identical digests on the same cached graphs.

    python benchmarks/plan_digest.py OUT.json [--models transformer resnet50 ...] [--compare BEFORE.json]

``--compare`` prints each case that differs from an earlier digest and exits
1 when any does.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import placer  # noqa: E402
from placer import DeviceSpec  # noqa: E402
from solvers import MODELS, OBJECTIVES, build_graph, capacity  # noqa: E402


def digest(models: list[str], devices: list[int]) -> dict[str, dict]:
    out = {}
    for name in models:
        for training in (False, True):
            graph, _ = placer.load_graph(build_graph(name, training, None))
            for k in devices:
                for objective in OBJECTIVES:
                    cap = capacity(graph, k) if objective == "memory" else None
                    specs = [DeviceSpec(f"/CPU:{i}", memory_bytes=cap) for i in range(k)]
                    t = time.perf_counter()
                    p = placer.solve(graph, specs, objective=objective, baselines=())
                    pairs = sorted((str(a), b) for a, b in p.assignment.items())
                    key = f"{name}/{'train' if training else 'fwd'}/{k}/{objective}"
                    out[key] = {"value": p.value, "lower_bound": p.lower_bound, "solver": p.solver,
                                "assignment": hashlib.sha256(json.dumps(pairs).encode()).hexdigest()[:16]}
                    print(key, out[key], f"{time.perf_counter() - t:.1f} s", flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--models", nargs="+", default=MODELS, choices=MODELS)
    ap.add_argument("--devices", nargs="+", type=int, default=[2, 4])
    ap.add_argument("--compare", default=None, help="an earlier digest to compare with")
    args = ap.parse_args()
    out = digest(args.models, args.devices)
    Path(args.out).write_text(json.dumps(out, indent=1))
    if args.compare is None:
        return 0
    before = json.loads(Path(args.compare).read_text())
    common = sorted(set(before) & set(out))
    differ = [k for k in common if before[k] != out[k]]
    for k in differ:
        print(f"DIFFERS {k}: before {before[k]}, now {out[k]}")
    print(f"{len(common) - len(differ)} of {len(common)} plans identical to {args.compare}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
