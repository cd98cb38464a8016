"""Exact two-device placement by minimum s-t cut (Stone, 1977).

Minimises the *sum* of both devices' busy time: compute of every node on its
device plus, for every tensor crossing the cut, its send and receive time.
Tensors with several consumers are hyperedges, modelled exactly with Lawler's
two auxiliary nodes per tensor. Memory capacities are not part of a cut, so
a cut that overflows a device is rejected (``None``).

For identical devices the sum objective is minimised by putting everything on
one device; the cut is useful for heterogeneous devices (e.g. CPU + GPU, or
ops pinned by kernel availability) and as a warm start.
"""

from __future__ import annotations

import time

import networkx as nx
import numpy as np

from ..errors import SolverError
from ..core.problem import PlacementProblem
from .base import Solution, SolveOptions, finish
from .registry import two_devices, solver

_S, _T = ("terminal", 0), ("terminal", 1)


def min_cut_assignment(problem: PlacementProblem) -> np.ndarray:
    """Assignment (0/1 per node) minimising total compute + cut traffic.

    Raises
    ------
    SolverError
        If the problem does not have exactly two devices.

    Examples
    --------
    >>> import numpy as np
    >>> from cost_models import TensorEdge
    >>> p = PlacementProblem.build(names=["a", "b"], compute_s=np.array([[1.0, 5.0], [5.0, 1.0]]),
    ...     memory_bytes=np.zeros(2), capacity_bytes=np.full(2, np.inf), tensors=[TensorEdge(0, (1,), 1.0)],
    ...     bandwidth=np.full((2, 2), 1.0), latency=np.zeros((2, 2)))
    >>> min_cut_assignment(p).tolist()
    [0, 1]
    """
    p = problem
    if p.k != 2:
        raise SolverError(f"the min-cut solver places on exactly 2 devices, got {p.k}; use 'cpsat' or 'auto'")
    # Integer capacities: networkx finds the cut side by comparing flow ==
    # capacity, which float round-off breaks (a saturated edge looked open and
    # a node landed on a device it may not use). 1e12 steps over the total.
    finite = np.isfinite(p.compute_s)
    weights = [p.transfer_s(t, 0, 1) + p.transfer_s(t, 1, 0) for t in p.tensors]
    unit = max(float(p.compute_s[finite].sum() + sum(weights)), 1e-300) / 1e12

    def cap(x: float) -> dict:
        return {"capacity": int(round(x / unit))} if np.isfinite(x) else {}  # no attribute: infinite

    g = nx.DiGraph()
    for v in range(p.n):
        c0, c1 = p.compute_s[v]
        # Cutting S->v puts v on the sink side (device 1) and pays c1, and vice
        # versa; a device the node may not use gets an uncuttable edge.
        g.add_edge(_S, v, **cap(c1))
        g.add_edge(v, _T, **cap(c0))
    for i, t in enumerate(p.tensors):
        members = {t.src, *t.dsts}
        if len(members) < 2:
            continue
        # Send + receive time; exact for symmetric links, the mean otherwise.
        e_in, e_out = ("hyper_in", i), ("hyper_out", i)
        g.add_edge(e_in, e_out, **cap(weights[i]))
        for v in members:
            g.add_edge(v, e_in)  # no capacity attribute: infinite
            g.add_edge(e_out, v)
    _, (src_side, _) = nx.minimum_cut(g, _S, _T)
    return np.array([0 if v in src_side else 1 for v in range(p.n)], dtype=int)


@solver("mincut", requires=(two_devices,))
def mincut(problem: PlacementProblem, options: SolveOptions) -> Solution | None:
    """Registered wrapper of :func:`min_cut_assignment`, scored by ``options.objective``."""
    t0 = time.perf_counter()
    return finish(problem, min_cut_assignment(problem), "mincut", t0, options)
