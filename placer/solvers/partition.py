"""Balanced k-way graph partition with METIS (via ``pymetis``), then repair.

Nodes are weighted by compute on their fastest device, edges by the bytes
they carry (a multi-consumer tensor is a star from its producer); METIS
cuts the least bytes subject to balanced compute, with each device's share
proportional to its speed. For the ``memory`` objective (the least bytes
across devices that fit) it also weighs nodes by their memory, each
device's share proportional to its capacity, once with METIS' default
imbalance and once with all the capacities allow, and keeps the best of
the three plans (ResNet50's training step on 4 devices of 1.25x an even
share: 278 MB across with the compute-balanced start, 49-71 MB with the
memory-balanced ones; on InceptionV3's training step on 2 devices the
compute-balanced one was better). Nodes then
leave devices they may not run on, and devices over capacity shed their
largest nodes to devices with room.
"""

from __future__ import annotations

import time

import numpy as np

from ..core.objectives import get_objective
from ..core.problem import PlacementProblem
from .base import Solution, SolveOptions, finish
from .registry import solver

_SCALE = 1_000_000  # METIS takes integer weights


def device_shares(problem: PlacementProblem) -> np.ndarray:
    """Fraction of the work each device should get: proportional to its speed.

    A device's speed is how much of the work it could do, relative to doing
    every node on its fastest device.

    Examples
    --------
    >>> from placer.core.problem import PlacementProblem
    >>> p = PlacementProblem.build(names=["a"], compute_s=np.array([[1.0, 3.0]]), memory_bytes=np.zeros(1),
    ...     capacity_bytes=np.full(2, np.inf), tensors=[], bandwidth=np.ones((2, 2)), latency=np.zeros((2, 2)))
    >>> device_shares(p).round(2).tolist()
    [0.75, 0.25]
    """
    c = problem.compute_s
    best = np.where(np.isfinite(c), c, np.inf).min(axis=1)
    speed = np.empty(problem.k)
    for d in range(problem.k):
        ok = np.isfinite(c[:, d])
        speed[d] = best[ok].sum() / c[ok, d].sum() if ok.any() and c[ok, d].sum() > 0 else float(ok.any())
    if speed.sum() <= 0:
        return np.full(problem.k, 1.0 / problem.k)
    return speed / speed.sum()


def repair(problem: PlacementProblem, assignment: np.ndarray) -> np.ndarray:
    """Move nodes off devices they may not use, then off devices over capacity.

    Deterministic; returns a new array (possibly still infeasible when the
    memory does not fit anywhere).
    """
    p = problem
    a = np.array(assignment, dtype=int)
    allowed = np.isfinite(p.compute_s)
    comp = np.where(allowed, p.compute_s, 0.0)
    load = np.bincount(a, weights=comp[np.arange(p.n), a], minlength=p.k)
    mem = np.bincount(a, weights=p.memory_bytes, minlength=p.k)

    def move(v: int, to: int) -> None:
        load[a[v]] -= comp[v, a[v]]
        mem[a[v]] -= p.memory_bytes[v]
        a[v] = to
        load[to] += comp[v, to]
        mem[to] += p.memory_bytes[v]

    for v in np.flatnonzero(~allowed[np.arange(p.n), a]):
        ok = np.flatnonzero(allowed[v] & (mem + p.memory_bytes[v] <= p.capacity_bytes))
        ok = ok if ok.size else np.flatnonzero(allowed[v])
        move(int(v), int(ok[np.argmin(load[ok] + comp[v, ok])]))
    for d in range(p.k):
        for v in sorted(np.flatnonzero(a == d), key=lambda v: (-p.memory_bytes[v], v)):
            if mem[d] <= p.capacity_bytes[d] * (1 + 1e-9):
                break
            ok = np.flatnonzero(allowed[v] & (mem + p.memory_bytes[v] <= p.capacity_bytes))
            ok = ok[ok != d]
            if ok.size:
                move(int(v), int(ok[np.argmin(load[ok] + comp[v, ok])]))
    return a


def _metis(xadj: np.ndarray, adjncy: np.ndarray, ew: np.ndarray, vw: np.ndarray, shares: np.ndarray, seed: int,
           ufactor: int | None = None) -> np.ndarray:
    """METIS' k-way parts (``len(shares)`` of them, target weights ``shares``) of the graph in CSR form."""
    import pymetis

    opts = pymetis.Options(seed=seed) if ufactor is None else pymetis.Options(seed=seed, ufactor=ufactor)
    _, parts = pymetis.part_graph(int(shares.size), xadj=xadj, adjncy=adjncy, vweights=vw,
                                  eweights=ew if ew.size else None, tpwgts=list(shares / shares.sum()), options=opts)
    return np.asarray(parts, dtype=int)


@solver("partition")
def partition(problem: PlacementProblem, options: SolveOptions) -> Solution | None:
    """METIS k-way partition balancing compute (and, for the memory objective, memory) and cutting bytes,
    then :func:`repair`; the best plan."""
    t0 = time.perf_counter()
    p = problem
    if p.k == 1 or p.n <= 1:
        return finish(p, np.zeros(p.n, dtype=int), "partition", t0, options)
    best = np.where(np.isfinite(p.compute_s), p.compute_s, np.inf).min(axis=1)
    vw = np.maximum(1, np.round(best / max(best.sum(), 1e-300) * _SCALE)).astype(np.int64)
    pairs: dict[tuple[int, int], float] = {}
    for t in p.tensors:
        for w in set(t.dsts) - {t.src}:
            key = (min(t.src, w), max(t.src, w))
            pairs[key] = pairs.get(key, 0.0) + t.nbytes
    adj: list[list[int]] = [[] for _ in range(p.n)]
    wts: list[list[int]] = [[] for _ in range(p.n)]
    total = max(sum(pairs.values()), 1e-300)
    for (u, w), b in sorted(pairs.items()):
        iw = max(1, int(round(b / total * _SCALE)))
        adj[u].append(w)
        wts[u].append(iw)
        adj[w].append(u)
        wts[w].append(iw)
    xadj = np.concatenate([[0], np.cumsum([len(x) for x in adj])]).astype(np.int64)
    adjncy = np.array([w for x in adj for w in x], dtype=np.int64)
    ew = np.array([w for x in wts for w in x], dtype=np.int64)
    shares = device_shares(p)
    # METIS refuses a part with no target weight: a device that can run none of the ops gets no part
    usable = np.flatnonzero(shares > 0)
    if usable.size == 1:
        return finish(p, repair(p, np.full(p.n, usable[0], dtype=int)), "partition", t0, options)
    memory = np.asarray(p.memory_bytes, dtype=float)
    caps = np.asarray(p.capacity_bytes, dtype=float)[usable]
    plans = [finish(p, repair(p, usable[_metis(xadj, adjncy, ew, vw, shares[usable], int(options.seed))]),
                    "partition", t0, options)]
    if get_objective(options.objective).cpsat_model == "traffic" and np.isfinite(caps).all() and memory.sum() > 0:
        # the memory objective: balance memory in proportion to the capacities too, cut the least bytes
        mw = np.maximum(1, np.round(memory / memory.sum() * _SCALE)).astype(np.int64)
        slack = float(caps.sum() / memory.sum()) - 1.0  # a part may outgrow its target by this share and fit
        for ufactor in dict.fromkeys((None, int(np.clip(900 * slack, 1, 1000)))):  # default 1.03, what fits
            a = repair(p, usable[_metis(xadj, adjncy, ew, mw, caps, int(options.seed), ufactor)])
            plans.append(finish(p, a, "partition", t0, options))
    return min((sol for sol in plans if sol is not None), key=lambda sol: sol.objective, default=None)
