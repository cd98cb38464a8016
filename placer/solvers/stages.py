"""Contiguous stages by dynamic programming: the best split of a topological order (no TensorFlow).

``contiguous_dp`` cuts the problem's topological order into at most ``k``
consecutive stages, stage ``m`` on device ``m`` (a device may get none),
minimising the pipelined max load of the throughput objective: a stage's
compute on its device, plus the time to receive each tensor that enters it
and to send each tensor that leaves it (Tarnawski et al., NeurIPS'20, on one
topological order). Stages respect each device's memory capacity and the
devices a node may use; colocation holds because the problem's nodes are
colocation groups already.

Transfers are priced at the mean off-diagonal link (exact when every link
is the same, as in the NeurIPS'20 workloads); the plan is then scored by
the caller's objective like every other solver's.

Cost: ``O(k n²)`` time and ``O(n²)`` memory in the problem's nodes, so it
declines problems above :data:`MAX_NODES` (``auto`` then relies on its
other heuristics).

Examples
--------
A chain of four 1 s nodes on two devices, tensors free: two stages of two.

>>> import numpy as np
>>> from cost_models import TensorEdge
>>> from placer.core.problem import PlacementProblem
>>> p = PlacementProblem.build(names=list("abcd"), compute_s=np.ones((4, 2)), memory_bytes=np.zeros(4),
...     capacity_bytes=np.full(2, np.inf), tensors=[TensorEdge(i, (i + 1,), 0.0) for i in range(3)],
...     bandwidth=np.full((2, 2), 1e9), latency=np.zeros((2, 2)))
>>> from placer.solvers.base import SolveOptions
>>> s = contiguous_dp(p, SolveOptions(objective="throughput"))
>>> s.assignment.tolist(), s.objective
([0, 0, 1, 1], 2.0)
"""

from __future__ import annotations

import time

import numpy as np

from ..core.problem import PlacementProblem
from .base import Solution, SolveOptions, finish
from .registry import solver

#: Largest problem (nodes) the DP takes: its cost matrices are ``(n + 1)²`` floats each.
MAX_NODES = 2500


def small_enough(problem: PlacementProblem) -> str | None:
    """Precondition: at most :data:`MAX_NODES` nodes (the DP is quadratic in them)."""
    return None if problem.n <= MAX_NODES else f"it is quadratic in nodes: {problem.n} > {MAX_NODES}"


def _transfer_s(problem: PlacementProblem) -> np.ndarray:
    """Per tensor edge: seconds to move it over the mean off-diagonal link."""
    k = problem.k
    off = ~np.eye(k, dtype=bool)
    if k == 1:
        return np.zeros(len(problem.tensors))
    lat = float(np.mean(np.asarray(problem.latency)[off]))
    inv_bw = float(np.mean(1.0 / np.asarray(problem.bandwidth, dtype=float)[off]))
    return np.array([0.0 if t.nbytes <= 0 else t.count * lat + t.nbytes * inv_bw for t in problem.tensors])


def boundary_costs(problem: PlacementProblem, pos: np.ndarray) -> np.ndarray:
    """``C[i, j]``: receive + send seconds of the stage holding order positions ``i … j-1`` (shape ``(n+1, n+1)``).

    A tensor is received once by a stage that holds one of its consumers
    but not its producer, and sent once by a stage that holds its producer
    and not all of its consumers. Built as a 2-D difference array: each
    tensor adds one rectangle of ``(i, j)`` per consumer and one for its producer.
    """
    n = problem.n
    tau = _transfer_s(problem)
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []

    def rect(r0: int, r1: int, c0: int, c1: int, v: float) -> None:  # rows [r0, r1) x cols [c0, c1)
        rows.extend((r0, r1, r0, r1))
        cols.extend((c0, c0, c1, c1))
        vals.extend((v, -v, -v, v))

    for t, cost in zip(problem.tensors, tau):
        if cost <= 0:
            continue
        s = int(pos[t.src])
        dsts = sorted(int(pos[d]) for d in t.dsts)
        prev = s
        for d in dsts:
            if d > prev:  # stages starting in (prev, d] receive t once j passes d
                rect(prev + 1, d + 1, d + 1, n + 1, cost)
                prev = d
        last = dsts[-1] if dsts else s
        if last > s:  # stages holding s that end before the last consumer send t
            rect(0, s + 1, s + 1, last + 1, cost)
    diff = np.zeros((n + 2, n + 2))
    if vals:
        np.add.at(diff, (np.asarray(rows), np.asarray(cols)), np.asarray(vals))
    return np.cumsum(np.cumsum(diff, axis=0), axis=1)[: n + 1, : n + 1]


@solver("contiguous_dp", requires=(small_enough,))
def contiguous_dp(problem: PlacementProblem, options: SolveOptions) -> Solution | None:
    """The best split of the topological order into contiguous stages on devices ``0 … k-1`` (max load)."""
    t0 = time.perf_counter()
    p = problem
    n, k = p.n, p.k
    order = np.asarray(p.order, dtype=int)
    pos = np.empty(n, dtype=int)
    pos[order] = np.arange(n)
    comm = boundary_costs(p, pos)
    upper = np.triu(np.ones((n + 1, n + 1), dtype=bool))  # i <= j: a stage (empty when i == j)
    mem = np.concatenate([[0.0], np.cumsum(np.asarray(p.memory_bytes, dtype=float)[order])])
    seg_mem = mem[None, :] - mem[:, None]
    best = np.full(n + 1, np.inf)
    best[0] = 0.0  # before any device, only the empty prefix
    choices = np.zeros((k, n + 1), dtype=int)
    for m in range(k):
        col = np.asarray(p.compute_s[order, m], dtype=float)
        bad = np.concatenate([[0], np.cumsum(~np.isfinite(col))])
        work = np.concatenate([[0.0], np.cumsum(np.where(np.isfinite(col), col, 0.0))])
        cost = work[None, :] - work[:, None] + comm
        ok = upper & (bad[None, :] == bad[:, None]) & (seg_mem <= p.capacity_bytes[m] * (1 + 1e-9))
        cost = np.where(ok, cost, np.inf)
        np.fill_diagonal(cost, 0.0)  # device m takes nothing
        total = np.maximum(best[:, None], cost)
        choices[m] = np.argmin(total, axis=0)
        best = total[choices[m], np.arange(n + 1)]
    if not np.isfinite(best[n]):
        return None
    a = np.zeros(n, dtype=int)
    j = n
    for m in range(k - 1, -1, -1):
        i = int(choices[m, j])
        a[order[i:j]] = m
        j = i
    return finish(p, a, "contiguous_dp", t0, options)
