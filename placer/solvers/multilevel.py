"""Coarsening a placement problem for scale: heavy-edge matching (no TensorFlow).

Large graphs (a ~20k-op training step) are shrunk before the search solvers
see them, as multilevel partitioners do (METIS, KaHIP): repeatedly merge
pairs of nodes joined by the heaviest tensors, heaviest first, while

* the merged node may still run somewhere (its allowed devices intersect),
* its compute stays under ``2 × total work / target`` (no giant node), and
* its memory stays under an eighth of the smallest finite capacity,

until at most ``target`` nodes remain or a pass merges (almost) nothing.
Optional *keys* (e.g. Keras layer scopes) are merged first under the same
limits, or with ``whole_keys`` each key whole (no work cap: a layer view). The coarse problem keeps the fine dataflow graph as its
:class:`~placer.core.problem.Schedule`, and merged tensors keep their byte and
tensor counts, so every objective of a coarse assignment equals the
objective of its projection: coarse plans are scored exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Sequence

import numpy as np

from ..core.problem import PlacementProblem, group_tensors


@dataclass(frozen=True)
class Contraction:
    """A coarse problem and the coarse node of every original node."""

    coarse: PlacementProblem
    coarse_of: np.ndarray
    #: ``(n, k)`` compute seconds of the original nodes (``inf`` = not allowed), the default weights of
    #: :meth:`restrict`.
    original_compute: np.ndarray

    def expand(self, coarse_assignment: np.ndarray) -> np.ndarray:
        """Assignment of the original nodes from one of the coarse nodes."""
        return np.asarray(coarse_assignment, dtype=int)[self.coarse_of]

    def restrict(self, assignment: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
        """Coarse assignment from an original one: each coarse node goes where most of its weight was
        (default: each original node's largest compute time on a device it may use).

        Ties go to the lower device index. The result may be infeasible
        (memory); it is meant as a search hint.
        """
        if weights is None:
            weights = np.where(np.isfinite(self.original_compute), self.original_compute, 0.0).max(axis=1)
        k = self.coarse.k
        votes = np.zeros((self.coarse.n, k))
        np.add.at(votes, (self.coarse_of, np.asarray(assignment, dtype=int)), np.asarray(weights, dtype=float) + 1e-12)
        votes[~np.isfinite(self.coarse.compute_s)] = -1.0
        return votes.argmax(axis=1)


def coarsen_problem(problem: PlacementProblem, target: int, keys: Sequence[Hashable] | None = None,
                    seed: int = 0, whole_keys: bool = False) -> Contraction:
    """Merge nodes of ``problem`` until about ``target`` remain.

    Examples
    --------
    A chain of 6 equal nodes with 2 devices, shrunk to 3 nodes:

    >>> from cost_models import TensorEdge
    >>> p = PlacementProblem.build(names=[f"n{i}" for i in range(6)], compute_s=np.ones((6, 2)),
    ...     memory_bytes=np.zeros(6), capacity_bytes=np.full(2, np.inf),
    ...     tensors=[TensorEdge(i, (i + 1,), 10.0 * (i + 1)) for i in range(5)], bandwidth=np.full((2, 2), 1e3),
    ...     latency=np.zeros((2, 2)))
    >>> c = coarsen_problem(p, 3)
    >>> c.coarse.n, c.coarse_of.tolist()
    (3, [0, 0, 1, 1, 2, 2])
    """
    p = problem
    n, k = p.n, p.k
    rng = np.random.default_rng(seed)
    allowed_mask = (np.isfinite(p.compute_s) * (1 << np.arange(k))).sum(axis=1).astype(np.int64)
    best = np.where(np.isfinite(p.compute_s), p.compute_s, np.inf).min(axis=1)
    work_cap = 2.0 * best.sum() / max(target, 1)
    finite_caps = p.capacity_bytes[np.isfinite(p.capacity_bytes)]
    mem_cap = finite_caps.min() / 8 if finite_caps.size else np.inf

    label = np.arange(n)
    work = best.copy()
    mem = p.memory_bytes.copy()
    mask = allowed_mask.copy()

    # An array union-find rather than networkx's: a merge is refused unless the merged node may still run
    # somewhere and stays under the work and memory caps (kept per root below), and the representative is
    # always the lowest index, because the matching below orders candidate pairs by their roots: another
    # representative would break ties differently and change the plans.
    def find(v: int) -> int:
        while label[v] != v:
            label[v] = label[label[v]]
            v = label[v]
        return v

    def try_union(u: int, w: int, cap: float = work_cap) -> bool:
        ru, rw = find(u), find(w)
        if ru == rw:
            return False
        if not (mask[ru] & mask[rw]) or work[ru] + work[rw] > cap or mem[ru] + mem[rw] > mem_cap:
            return False
        ru, rw = min(ru, rw), max(ru, rw)
        label[rw] = ru
        work[ru] += work[rw]
        mem[ru] += mem[rw]
        mask[ru] &= mask[rw]
        return True

    count = n
    if keys is not None:
        first: dict[Hashable, int] = {}
        for v in range(n):
            if keys[v] is not None:
                count -= try_union(first.setdefault(keys[v], v), v, np.inf if whole_keys else work_cap)
    src = np.array([t.src for t in p.tensors for w in set(t.dsts) - {t.src}], dtype=int)
    dst = np.array([w for t in p.tensors for w in sorted(set(t.dsts) - {t.src})], dtype=int)
    byt = np.array([t.nbytes for t in p.tensors for _ in set(t.dsts) - {t.src}], dtype=float)
    while count > target and src.size:
        roots = np.array([find(v) for v in range(n)])
        cu, cw = roots[src], roots[dst]
        keep = cu != cw
        if not keep.any():
            break
        lo, hi = np.minimum(cu[keep], cw[keep]), np.maximum(cu[keep], cw[keep])
        pair, inv = np.unique(lo * n + hi, return_inverse=True)
        weight = np.bincount(inv, weights=byt[keep])
        tiebreak = rng.random(pair.size)
        matched = np.zeros(n, dtype=bool)
        merged = 0
        for e in np.lexsort((tiebreak, -weight)):
            u, w = divmod(int(pair[e]), n)
            if matched[u] or matched[w]:
                continue
            if try_union(u, w):
                matched[u] = matched[w] = True
                merged += 1
                if count - merged <= target:
                    break
        count -= merged
        if merged < 0.02 * count:
            break
    roots = np.array([find(v) for v in range(n)])
    return _contract(p, roots)


def _contract(p: PlacementProblem, roots: np.ndarray) -> Contraction:
    # Coarse nodes numbered by their first original node in topological order.
    rank = np.empty(p.n, dtype=int)
    rank[list(p.order)] = np.arange(p.n)
    first = {}
    for v in p.order:
        first.setdefault(int(roots[v]), len(first))
    coarse_of = np.array([first[int(r)] for r in roots], dtype=int)
    m = len(first)
    compute = np.zeros((m, p.k))
    np.add.at(compute, coarse_of, p.compute_s)
    memory = np.bincount(coarse_of, weights=p.memory_bytes, minlength=m)
    tensors = group_tensors(p.tensors, coarse_of)
    names = [""] * m
    sizes = np.bincount(coarse_of, minlength=m)
    for v in p.order:
        c = coarse_of[v]
        if not names[c]:
            names[c] = p.names[v] if sizes[c] == 1 else f"{p.names[v]}+{sizes[c] - 1}"
    coarse = PlacementProblem.build(names=names, compute_s=compute, memory_bytes=memory,
                                    capacity_bytes=p.capacity_bytes, tensors=tensors, bandwidth=p.bandwidth,
                                    latency=p.latency, order=range(m), schedule=p.schedule_view().regroup(coarse_of),
                                    shared=p.shared, transfer_cpu=p.transfer_cpu, ready_order=p.ready_order,
                                    measured_links=p.measured_links)
    return Contraction(coarse, coarse_of, p.compute_s)
