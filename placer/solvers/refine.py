"""Local refinement of an assignment: greedy single-node moves (no TensorFlow).

Used after projecting a coarse plan back onto the finer problem (the
refinement step of multilevel partitioning, cf. Fiduccia–Mattheyses). A move
puts one node on another device it may use and that has memory for it; it
is kept when it lowers the objective's key:

* ``max_load`` (throughput, and as a proxy for latency): (maximum device
  load, sum of squared loads), so that moves which even out non-bottleneck
  devices are kept too;
* ``traffic`` (memory objective): bytes crossing devices.

Loads are updated incrementally from the tensors touching the moved node,
so a pass costs O(candidates × k × degree). Passes repeat until none
improves or the work budget is spent; the result is never worse than the input.

The budget counts tensor visits (per device tried, one per tensor touching a
node, times the tensor's receivers when it has several: a tensor read by 50k
ops costs 50k), not seconds, so the same input always gives the same output.
:data:`VISITS_PER_S` converts a time share into visits; it was measured on
the 2-core reference machine.
"""

from __future__ import annotations

import numpy as np

from ..core.objectives import get_objective
from ..core.problem import PlacementProblem

#: Tensor visits per second of refinement on the reference machine (see the module docstring).
VISITS_PER_S = 200_000


def refine(problem: PlacementProblem, assignment: np.ndarray, objective: str, work: int,
           max_passes: int = 20) -> np.ndarray:
    """Greedy improvement of a feasible ``assignment`` within ``work`` tensor visits.

    Deterministic: the budget is counted, never read from a clock.

    Examples
    --------
    >>> import numpy as np
    >>> from cost_models import TensorEdge
    >>> p = PlacementProblem.build(names=list("abcd"), compute_s=np.ones((4, 2)), memory_bytes=np.zeros(4),
    ...     capacity_bytes=np.full(2, np.inf), tensors=[TensorEdge(0, (1,), 1.0), TensorEdge(2, (3,), 1.0)],
    ...     bandwidth=np.full((2, 2), 1e3), latency=np.zeros((2, 2)))
    >>> refine(p, np.array([0, 1, 1, 1]), "throughput", work=10_000).tolist()
    [0, 0, 1, 1]
    """
    p = problem
    traffic = get_objective(objective).cpsat_model == "traffic"
    a = np.array(assignment, dtype=int)
    n, k = p.n, p.k
    if k < 2 or n == 0:
        return a
    allowed = np.isfinite(p.compute_s)
    comp = np.where(allowed, p.compute_s, 0.0)
    inc: list[list[int]] = [[] for _ in range(n)]
    for ti, t in enumerate(p.tensors):
        for v in {t.src, *t.dsts}:
            inc[v].append(ti)
    srcs = [t.src for t in p.tensors]
    dsts = [np.array(sorted(set(t.dsts) - {t.src}), dtype=int) for t in p.tensors]
    # a visit of tensor ti costs its receivers (one for most tensors): a tensor read by 50k ops costs 50k
    cost = [max(1, len(d)) for d in dsts]
    node_cost = [sum(cost[ti] for ti in inc[v]) for v in range(n)]
    nbytes = np.array([t.nbytes for t in p.tensors])
    counts = np.array([t.count for t in p.tensors])
    mem = np.bincount(a, weights=p.memory_bytes, minlength=k)
    cap = p.capacity_bytes * (1 + 1e-9)

    def contrib(ti: int, out: np.ndarray) -> None:
        s = a[srcs[ti]]
        recv = set(a[dsts[ti]].tolist()) - {s}
        if not recv or nbytes[ti] <= 0:
            return
        if traffic:
            out[s] += nbytes[ti] * len(recv)
            return
        worst = 0.0
        for r in recv:
            c = counts[ti] * p.latency[s, r] + nbytes[ti] / p.bandwidth[s, r]
            out[r] += c
            worst = max(worst, c)
        out[s] += worst

    loads = np.zeros(k) if traffic else np.bincount(a, weights=comp[np.arange(n), a], minlength=k)
    for ti in range(len(p.tensors)):
        contrib(ti, loads)

    def key(x: np.ndarray) -> tuple[float, float]:
        return (float(x.sum()), 0.0) if traffic else (float(x.max()), float((x * x).sum()))

    cur_key = key(loads)
    done = 0
    scan = sum(node_cost)  # visits to list a pass's candidates
    for _ in range(max_passes):
        improved = False
        if done + scan > work:
            return a
        done += scan
        # a pass's candidates: nodes touching a cut tensor (and, for max_load, every node on the hottest device)
        cut = [bool(len(d)) and bool((a[d] != a[srcs[ti]]).any()) for ti, d in enumerate(dsts)]
        touches_cut = [any(cut[ti] for ti in inc[v]) for v in range(n)]
        if traffic:
            cands = [v for v in range(n) if touches_cut[v]]
        else:
            hot = int(np.argmax(loads))
            cands = [v for v in range(n) if a[v] == hot] + [v for v in range(n) if a[v] != hot and touches_cut[v]]
        for v in cands:
            if done > work:
                return a
            done += node_cost[v] * (1 + int(allowed[v].sum()))
            cur = a[v]
            old = np.zeros(k)
            for ti in inc[v]:
                contrib(ti, old)
            best: tuple[tuple[float, float], int, np.ndarray] | None = None
            for d in np.flatnonzero(allowed[v]):
                if d == cur or mem[d] + p.memory_bytes[v] > cap[d]:
                    continue
                a[v] = d
                new = np.zeros(k)
                for ti in inc[v]:
                    contrib(ti, new)
                a[v] = cur
                cand = loads - old + new
                if not traffic:
                    cand[cur] -= comp[v, cur]
                    cand[d] += comp[v, d]
                ck = key(cand)
                if (best is None or ck < best[0]) and _better(ck, cur_key):
                    best = (ck, int(d), cand)
            if best is not None:
                cur_key, d, loads = best
                mem[cur] -= p.memory_bytes[v]
                mem[d] += p.memory_bytes[v]
                a[v] = d
                improved = True
        if not improved:
            break
    return a


def _better(new: tuple[float, float], old: tuple[float, float]) -> bool:
    tol = 1e-12 * max(1.0, abs(old[0]))
    return new[0] < old[0] - tol or (abs(new[0] - old[0]) <= tol and new[1] < old[1] * (1 - 1e-12))
