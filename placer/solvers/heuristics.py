"""Baseline placements: single device, round-robin, contiguous split.

All are memory-aware: they return ``None`` when they cannot fit the devices'
capacities, so a caller never receives an infeasible plan.
"""

from __future__ import annotations

import time

import numpy as np

from ..core.problem import PlacementProblem
from .base import Solution, SolveOptions, finish
from .registry import solver


@solver("single")
def single_device(problem: PlacementProblem, options: SolveOptions) -> Solution | None:
    """Everything on the one device where it runs fastest (and fits)."""
    t0 = time.perf_counter()
    best = None
    for d in range(1 if problem.symmetric else problem.k):
        s = finish(problem, np.full(problem.n, d), "single", t0, options)
        if s is not None and (best is None or s.objective < best.objective):
            best = s
    return best


@solver("round_robin")
def round_robin(problem: PlacementProblem, options: SolveOptions) -> Solution | None:
    """Node ``i`` (in topological order) on the ``i``-th allowed device, cyclically."""
    t0 = time.perf_counter()
    a = np.zeros(problem.n, dtype=int)
    nxt = 0
    for v in problem.order:
        allowed = np.flatnonzero(np.isfinite(problem.compute_s[v]))
        a[v] = allowed[nxt % len(allowed)]
        nxt += 1
    return finish(problem, a, "round_robin", t0, options)


@solver("contiguous")
def contiguous(problem: PlacementProblem, options: SolveOptions) -> Solution | None:
    """Topological order cut into ``k`` consecutive stages of equal compute.

    A stage closes early when the next node would overflow its memory; a node
    not allowed on the current stage's device goes to the next device that
    allows it (an honest, simple rule; the search solvers do better).
    """
    t0 = time.perf_counter()
    p = problem
    best = np.where(np.isfinite(p.compute_s), p.compute_s, np.nan)
    work = np.nanmin(best, axis=1)
    target = work.sum() / p.k
    a = np.zeros(p.n, dtype=int)
    d, acc, mem = 0, 0.0, 0.0
    for v in p.order:
        if d < p.k - 1 and (acc >= target or mem + p.memory_bytes[v] > p.capacity_bytes[d]):
            d, acc, mem = d + 1, 0.0, 0.0
        dv = d
        while not np.isfinite(p.compute_s[v, dv]) and dv < p.k - 1:
            dv += 1
        if not np.isfinite(p.compute_s[v, dv]):
            dv = int(np.flatnonzero(np.isfinite(p.compute_s[v]))[0])
        a[v] = dv
        if dv == d:
            acc += work[v]
            mem += p.memory_bytes[v]
    return finish(p, a, "contiguous", t0, options)
