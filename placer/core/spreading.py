"""A lower bound on the memory objective from a spreading-metric LP (no TensorFlow).

The memory objective is the least traffic (bytes crossing devices) of a plan
that keeps every device under its capacity ``C``. Read an assignment as a
distance: ``δ(u, v) = 1`` when ``u`` and ``v`` sit on different devices, 0
when they share one. Then for every node ``u`` the nodes beside it hold at
most ``C`` bytes, so the bytes *away* from it are at least ``M − C`` (``M``
all memory)::

    Σ_v m_v δ(u, v) ≥ M − C                       (spreading, one per node u)

and a tensor of ``b`` bytes whose producer ``s`` sits away from one of its
consumers ``d`` costs at least ``b``: with ``y_t = 1`` for such a tensor,
``|δ(u, d) − δ(u, s)| ≤ y_t`` for every source ``u``. Minimising ``Σ b_t y_t``
over ``0 ≤ δ, y ≤ 1`` with ``δ(u, u) = 0`` is a linear programme that every
plan satisfies, so its optimum is a lower bound (Even, Naor, Rao and
Schieber's spreading metrics for balanced partitioning, here with one
shared ``y`` per tensor, which counts a tensor with several consumers once,
as the objective does at least).

Any subset of the spreading constraints gives a valid bound, so the LP
takes a few sources spread along the node order by cumulative memory (up to
:data:`MAX_SOURCES`; adding the sources whose constraint the optimum
violates most, round by round, gave weaker bounds at equal size: they
cluster). The graph is reduced first without changing the optimum's bound: zero-byte
tensors dropped, and nodes that hold no memory removed when they are a leaf
(the plan puts them beside their neighbour for free) or replaced by one
edge of the lighter weight when they join two nodes by two one-consumer
tensors (series); each reduction leaves the LP's optimum as it was.

Cost is capped by the LP's size (:data:`MAX_NONZEROS`), never by the clock,
so the bound is the same on an idle and a loaded machine. OR-Tools' GLOP
solves it, in this process even when TensorFlow is loaded (unlike CP-SAT,
tested: ``tests/test_solvers.py``).

Examples
--------
A chain of four 1-byte nodes joined by 10-byte tensors, devices of 2 bytes:
one tensor must cross.

>>> import numpy as np
>>> from cost_models import TensorEdge
>>> from placer.core.problem import PlacementProblem
>>> p = PlacementProblem.build(names=list("abcd"), compute_s=np.ones((4, 2)), memory_bytes=np.ones(4),
...     capacity_bytes=np.full(2, 2.0), tensors=[TensorEdge(i, (i + 1,), 10.0) for i in range(3)],
...     bandwidth=np.full((2, 2), 1e9), latency=np.zeros((2, 2)))
>>> round(spreading_bound(p), 3)
10.0
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import SolverError
from .problem import PlacementProblem

#: The largest LP (nonzeros of its constraint matrix) the bound builds. GLOP's time grows faster than the LP:
#: on the 2-core reference machine 111k nonzeros (the Transformer's training step, 8 sources) took 2.2 s,
#: 222k (16 sources) 17 s, and one source of InceptionV3's training step (~120k) 6 s.
MAX_NONZEROS = 100_000
#: The fewest sources worth an LP (one source is a single device's cut, which the cut bounds see already).
MIN_SOURCES = 3
#: The most spreading sources the LP takes (its time grows faster than its size: on the Transformer's training
#: step 8 sources took 2.2 s and gave 4.32 MB, 16 took 17 s for 4.92 MB).
MAX_SOURCES = 16
#: The LP's optimum is scaled by ``1 − SAFETY`` so that GLOP's tolerances cannot lift it above the true bound.
SAFETY = 1e-6


@dataclass(frozen=True)
class CutGraph:
    """The problem's tensors as a reduced hypergraph: what the LP sees.

    ``memory[i]`` is the bytes of kept node ``i`` (``nodes[i]`` in the
    problem); each edge is ``(src, dsts, bytes)`` over kept indices, ``dsts``
    non-empty and without ``src``.
    """

    nodes: np.ndarray
    memory: np.ndarray
    edges: tuple[tuple[int, tuple[int, ...], float], ...]

    @property
    def nonzeros_per_source(self) -> int:
        """Constraint-matrix nonzeros one spreading source adds to the LP."""
        return 6 * sum(len(d) for _, d, _ in self.edges) + len(self.nodes)


def cut_graph(problem: PlacementProblem) -> CutGraph:
    """The problem's tensors reduced for the LP (see the module docstring); the optimum's bound is unchanged.

    >>> import numpy as np
    >>> from cost_models import TensorEdge
    >>> p = PlacementProblem.build(names=list("abc"), compute_s=np.ones((3, 1)), memory_bytes=np.array([1., 0, 1]),
    ...     capacity_bytes=np.full(1, 9.0), tensors=[TensorEdge(0, (1,), 5.0), TensorEdge(1, (2,), 3.0)],
    ...     bandwidth=np.ones((1, 1)), latency=np.zeros((1, 1)))
    >>> g = cut_graph(p)    # b holds nothing: a --3--> c
    >>> g.nodes.tolist(), g.edges
    ([0, 2], ((0, (1,), 3.0),))
    """
    memory = np.asarray(problem.memory_bytes, dtype=float)
    edges: dict[int, list] = {}
    incident: list[set[int]] = [set() for _ in range(problem.n)]
    for t in problem.tensors:
        dsts = set(t.dsts) - {t.src}
        if t.nbytes > 0 and dsts:
            e = len(edges)
            edges[e] = [t.src, dsts, float(t.nbytes)]
            for v in (t.src, *dsts):
                incident[v].add(e)

    def drop(e: int) -> None:
        src, dsts, _ = edges.pop(e)
        for v in (src, *dsts):
            incident[v].discard(e)

    next_id = len(edges)
    queue = [v for v in range(problem.n) if memory[v] <= 0]
    while queue:
        v = queue.pop()
        touched: list[int] = []
        inc = incident[v]
        if len(inc) == 1:
            (e,) = inc
            src, dsts, _ = edges[e]
            if src != v and len(dsts) > 1:  # one consumer of several: the tensor crosses no less without it
                dsts.discard(v)
                inc.clear()
                touched = [src, *dsts]
            elif len(dsts) == 1:  # a leaf: it sits beside its neighbour for free
                touched = [u for u in (src, *dsts) if u != v]
                drop(e)
        elif len(inc) == 2 and all(len(edges[e][1]) == 1 for e in inc):
            ends = [next(u for u in (edges[e][0], *edges[e][1]) if u != v) for e in inc]
            weight = min(edges[e][2] for e in inc)
            for e in list(inc):
                drop(e)
            if ends[0] != ends[1]:  # series: the plan cuts the lighter one where its ends part
                e = next_id
                next_id += 1
                edges[e] = [ends[0], {ends[1]}, weight]
                incident[ends[0]].add(e)
                incident[ends[1]].add(e)
            touched = ends
        queue.extend(u for u in touched if memory[u] <= 0)
    kept = np.array([v for v in range(problem.n) if incident[v] or memory[v] > 0], dtype=np.int64)
    index = {int(v): i for i, v in enumerate(kept)}
    merged: dict[tuple[int, tuple[int, ...]], float] = {}
    for e in sorted(edges):
        src, dsts, nbytes = edges[e]
        key = (index[src], tuple(sorted(index[d] for d in dsts)))
        if len(key[1]) == 1:  # parallel one-consumer tensors between the same two nodes add up
            key = (min(key[0], key[1][0]), (max(key[0], key[1][0]),))
        merged[key] = merged.get(key, 0.0) + nbytes
    return CutGraph(kept, memory[kept], tuple((s, d, b) for (s, d), b in merged.items()))


def _first_sources(problem: PlacementProblem, graph: CutGraph, count: int) -> list[int]:
    """``count`` kept nodes holding memory, spread along ``problem.order`` by cumulative memory."""
    index = {int(v): i for i, v in enumerate(graph.nodes)}
    ordered = [index[v] for v in problem.order if v in index and graph.memory[index[v]] > 0]
    if not ordered:
        return []
    cum = np.cumsum(graph.memory[ordered])
    picks = np.searchsorted(cum, (np.arange(count) + 0.5) / count * cum[-1])
    return sorted({ordered[min(int(i), len(ordered) - 1)] for i in picks})


def _solve_lp(graph: CutGraph, sources: list[int], spread: float) -> tuple[float, np.ndarray]:
    """The LP over ``sources``: ``(optimum in bytes, y per edge)``."""
    from ortools.linear_solver import linear_solver_pb2, pywraplp  # lazily: most solves never need it

    n, E = len(graph.nodes), len(graph.edges)
    scale = max(b for _, _, b in graph.edges)
    total = float(graph.memory.sum())
    model = linear_solver_pb2.MPModelProto()
    for _, _, nbytes in graph.edges:
        var = model.variable.add()
        var.lower_bound, var.upper_bound, var.objective_coefficient = 0.0, 1.0, nbytes / scale
    held = np.flatnonzero(graph.memory > 0)
    for k, u in enumerate(sources):
        base = E + k * n
        for v in range(n):
            var = model.variable.add()
            var.lower_bound, var.upper_bound = 0.0, 0.0 if v == u else 1.0
        for e, (src, dsts, _) in enumerate(graph.edges):
            for d in dsts:
                for a, b in ((d, src), (src, d)):  # |δ(u, d) − δ(u, src)| ≤ y_e
                    row = model.constraint.add()
                    row.lower_bound, row.upper_bound = -np.inf, 0.0
                    row.var_index.extend((base + a, base + b, e))
                    row.coefficient.extend((1.0, -1.0, -1.0))
        row = model.constraint.add()  # Σ_v m_v δ(u, v) ≥ M − C, in shares of M
        row.lower_bound, row.upper_bound = spread / total, np.inf
        row.var_index.extend((base + held).tolist())
        row.coefficient.extend((graph.memory[held] / total).tolist())
    solver = pywraplp.Solver.CreateSolver("GLOP")
    solver.LoadModelFromProto(model)
    status = solver.Solve()
    if status != pywraplp.Solver.OPTIMAL:
        raise SolverError(f"the memory objective's lower bound (its spreading LP) ended with GLOP status {status}, "
                          "not optimal; report this with the graph (placer.save_graph) and its devices")
    y = np.array([solver.variable(e).solution_value() for e in range(E)])
    return solver.Objective().Value() * scale, y


def spreading_bound(problem: PlacementProblem, max_nonzeros: int = MAX_NONZEROS) -> float:
    """The spreading-metric LP's lower bound on the memory objective's traffic (bytes); 0 when one device holds
    everything, when no tensor can cross, when a node outgrows every device, or when :data:`MIN_SOURCES` sources' LP is above ``max_nonzeros``.

    The LP takes as many sources as fit ``max_nonzeros`` (at most :data:`MAX_SOURCES`), spread along
    ``problem.order`` by cumulative memory. Deterministic.
    """
    capacity = float(np.max(problem.capacity_bytes)) if problem.k else 0.0
    total = float(np.sum(problem.memory_bytes))
    if not np.isfinite(capacity) or total <= capacity * (1 + 1e-9):
        return 0.0
    if np.max(problem.memory_bytes) > capacity * (1 + 1e-9):
        return 0.0  # no plan at all (building the problem refuses it); the LP would be infeasible
    graph = cut_graph(problem)
    count = min(MAX_SOURCES, max_nonzeros // graph.nonzeros_per_source)
    if not graph.edges or count < MIN_SOURCES:
        return 0.0
    value, _ = _solve_lp(graph, _first_sources(problem, graph, count), total - capacity)
    return value * (1 - SAFETY)
