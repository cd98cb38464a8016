"""Contiguous stages by dynamic programming: the best split into pipeline stages (no TensorFlow).

``contiguous_dp`` cuts the problem's nodes into at most ``k`` contiguous
stages, stage ``m`` on device ``m`` (a device may get none): each stage is
the difference of two ideals (sets closed under predecessors), over every
ideal when there are few (Tarnawski et al.'s exact DP), else over the
prefixes of one topological order. It minimises
the pipelined max load of the throughput objective: a stage's
compute on its device, plus the time to receive each tensor that enters it
and to send each tensor that leaves it (Tarnawski et al., NeurIPS'20). Stages respect each device's memory capacity and the
devices a node may use; colocation holds because the problem's nodes are
colocation groups already.

Transfers are priced at the mean off-diagonal link (exact when every link
is the same, as in the NeurIPS'20 workloads); the plan is then scored by
the caller's objective like every other solver's.

Cost: ``O(k N²)`` time and ``O(N²)`` memory in the ideals used (``N ≤ n + 1``
for one order), so it declines problems above :data:`MAX_NODES` nodes
(``auto`` then relies on its other heuristics).

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

from ..core.problem import PlacementProblem, dependencies
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


#: Largest ``ideals² × (nodes + tensors)`` the exact DP over every ideal takes (its cost matrices are
#: ``ideals²``); above it the DP runs over the prefixes of ``problem.order`` only. At the cap it takes
#: ~0.13 s on the 2-core reference machine (2.5 ns per unit), more than ``auto`` charges it (the one-order
#: estimate), which stays within its time-limit slack.
MAX_IDEAL_WORK = 5e7


def ideals(problem: PlacementProblem, limit: int) -> np.ndarray | None:
    """Every ideal (set of nodes closed under predecessors) as rows of an ``(N, n)`` bool matrix.

    ``None`` when there are more than ``limit``, or when the nodes' dependencies
    have a cycle (groups of a training graph that depend on each other both
    ways: no split of them is contiguous). Found breadth-first from the
    empty set, adding one node whose predecessors are all in; rows come in
    order of size, then of discovery (deterministic).
    """
    n = problem.n
    preds = [sum({1 << u for _, u in edges}) for edges in dependencies(n, problem.tensors, problem.control)[0]]
    found = [0]
    seen = {0}
    frontier = [0]
    while frontier:
        nxt = []
        for ideal in frontier:
            for v in range(n):
                if not (ideal >> v) & 1 and not preds[v] & ~ideal:
                    grown = ideal | (1 << v)
                    if grown not in seen:
                        if len(found) >= limit:
                            return None
                        seen.add(grown)
                        found.append(grown)
                        nxt.append(grown)
        frontier = nxt
    if found[-1] != (1 << n) - 1:
        return None  # a cycle: some nodes never become addable
    bits = np.array([[(i >> v) & 1 for v in range(n)] for i in found], dtype=bool)
    return bits.reshape(len(found), n)


def ideal_costs(problem: PlacementProblem, member: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(comm, subset)`` over pairs of ideals ``(a, b)``: the stage ``b \\ a``'s receive + send seconds,
    and whether ``a ⊆ b`` (only those pairs are stages).

    With ideals, a tensor from ``s`` is received by the stage iff ``s ∈ a`` and
    a consumer is in ``b`` but not ``a``, and sent iff ``s ∈ b \\ a`` and a
    consumer is outside ``b`` (the same rule as :func:`boundary_costs`).
    """
    tau = _transfer_s(problem)
    keep = [i for i, c in enumerate(tau) if c > 0]
    N, n = member.shape
    f = member.astype(np.float64)
    subset = (f @ (~member).T.astype(np.float64)) == 0
    comm = np.zeros((N, N))
    if keep:
        tensors = [problem.tensors[i] for i in keep]
        cost = tau[keep]
        src = np.array([t.src for t in tensors])
        consumers = np.zeros((n, len(tensors)))
        for j, t in enumerate(tensors):
            consumers[list(set(t.dsts)), j] = 1.0
        has_src = member[:, src]  # (N, T)
        count = f @ consumers  # consumers of each tensor inside each ideal
        all_in = count >= consumers.sum(axis=0)[None, :] - 0.5
        # sent: s in b, s not in a, some consumer outside b
        out_b = has_src & ~all_in
        comm += ((out_b * cost).sum(axis=1))[None, :] - (has_src * cost) @ out_b.T.astype(np.float64)
        for a in range(N):  # received: s in a and b holds a consumer a lacks
            w = has_src[a] * cost
            if w.any():
                comm[a] += (count > count[a] + 0.5) @ w
    return comm, subset


def _best_stages(p: PlacementProblem, member: np.ndarray, comm: np.ndarray, subset: np.ndarray) -> np.ndarray | None:
    """Devices ``0 … k-1`` in turn each take the stage ``b \\ a`` between two ideals (possibly empty),
    minimising the max load; the assignment, or ``None`` when no split fits."""
    N = member.shape[0]
    k = p.k
    f = member.astype(np.float64)
    mem = f @ np.asarray(p.memory_bytes, dtype=float)
    seg_mem = mem[None, :] - mem[:, None]
    best = np.full(N, np.inf)
    best[0] = 0.0  # ideal 0 is the empty set: before any device, nothing is placed
    choices = np.zeros((k, N), dtype=int)
    for m in range(k):
        col = np.asarray(p.compute_s[:, m], dtype=float)
        bad = f @ (~np.isfinite(col)).astype(np.float64)
        work = f @ np.where(np.isfinite(col), col, 0.0)
        cost = work[None, :] - work[:, None] + comm
        ok = subset & (np.abs(bad[None, :] - bad[:, None]) < 0.5) & (seg_mem <= p.capacity_bytes[m] * (1 + 1e-9))
        cost = np.where(ok, cost, np.inf)
        np.fill_diagonal(cost, 0.0)  # device m takes nothing
        total = np.maximum(best[:, None], cost)
        choices[m] = np.argmin(total, axis=0)
        best = total[choices[m], np.arange(N)]
    full = N - 1  # the last ideal is every node
    if not np.isfinite(best[full]):
        return None
    a = np.zeros(p.n, dtype=int)
    j = full
    for m in range(k - 1, -1, -1):
        i = int(choices[m, j])
        a[member[j] & ~member[i]] = m
        j = i
    return a


@solver("contiguous_dp", requires=(small_enough,))
def contiguous_dp(problem: PlacementProblem, options: SolveOptions) -> Solution | None:
    """The best split into contiguous stages on devices ``0 … k-1`` (max load), by dynamic programming.

    Over every ideal of the nodes' dependency order when there are few
    enough (``ideals² × (nodes + tensors)`` at most :data:`MAX_IDEAL_WORK`:
    Tarnawski et al.'s DP, exact over all contiguous splits), else over the
    prefixes of ``problem.order`` (one topological order).
    """
    t0 = time.perf_counter()
    p = problem
    n = p.n
    limit = int(np.sqrt(MAX_IDEAL_WORK / max(1, n + len(p.tensors))))
    member = ideals(p, limit) if limit > n + 1 else None
    if member is not None:
        comm, subset = ideal_costs(p, member)
    else:
        order = np.asarray(p.order, dtype=int)
        pos = np.empty(n, dtype=int)
        pos[order] = np.arange(n)
        member = np.zeros((n + 1, n), dtype=bool)  # prefix i of the order: its first i nodes
        member[:, order] = np.tri(n + 1, n, -1, dtype=bool)
        comm = boundary_costs(p, pos)
        subset = np.triu(np.ones((n + 1, n + 1), dtype=bool))
    a = _best_stages(p, member, comm, subset)
    return None if a is None else finish(p, a, "contiguous_dp", t0, options)
