"""A latency bound from the merges a known plan forces (no TensorFlow).

Two problem nodes joined by many tensors are either on one device or they are not. When they are not,
every tensor between them crosses one link (one in each direction), and a link carries one transfer at a
time: the step lasts at least Carlier's one-machine bound over those transfers (each released when its
producer can end at the earliest, occupying the link for its bytes at the fastest link, and followed by
the least latency and its earliest reader's time and tail: :func:`apart_bounds`). Where that bound is at
least the step of a plan in hand (the *incumbent*), no better plan puts the two apart: merging them loses
no plan that could beat the incumbent. So the problem with every such pair merged bounds the optimum
unless the incumbent is optimal itself:

    optimum ≥ min(incumbent, bound of the merged problem)

and the merged problem's bounds are stronger (its nodes' ops run one at a time on one device;
:func:`placer.core.objectives.critical_path_bound`). Merging changes the heads and tails, so it repeats
(up to :data:`ROUNDS` times). On the densely connected CNN's training step (op groups, 4 devices, links of
100 µs + 250 bytes/µs; incumbent 261.2 ms) 80 pairs merge and the bound rises from 240.7 to 250.2 ms.

Without an incumbent, each pair is apart or together, so the least of its apart bound and the one-device
bound of both nodes' ops bounds every plan (:func:`either_bound`, each round): the LSTM seq2seq's forward
pass under layer groups 16.92 → 17.09 ms (encoder and decoder layers), its training step 100.34 → 100.80.
"""

from __future__ import annotations

from collections import defaultdict

import networkx as nx
import numpy as np

from ..core.objectives import (_heads_tails, _node_bound, _one_device, critical_path_bound, get_objective,
                               orders_by_priority)
from ..core.problem import PlacementProblem
from .multilevel import _contract

#: Problems of at most this many fine ops (the pass walks every tensor in Python: 1.1 s in all on the
#: densely connected CNN's 5,342-op training step, four rounds of merges and bounds) ...
MAX_OPS = 8000
#: ... and at most this many rounds of merges.
ROUNDS = 4
#: Pairs of nodes :func:`either_bound` tries per round (those of largest apart bound).
EITHER_PAIRS = 64
#: Cut points of Carlier's bound per link (as :func:`placer.core.objectives.critical_path_bound`'s grid).
GRID = 48


def apart_bounds(problem: PlacementProblem) -> dict[tuple[int, int], float]:
    """Per pair ``(u, v)`` (``u < v``) of problem nodes joined by a tensor: a lower bound of the step of any
    plan that puts them on different devices (see the module docstring; heads and tails are
    :func:`placer.core.objectives.step_tails`'s, valid in any plan).

    Examples
    --------
    Node ``u`` (1 s) sends 2 bytes to ``v`` (1 s) over links of 1 byte/s: apart, ``v`` ends 4 s in.

    >>> from cost_models import TensorEdge
    >>> p = PlacementProblem.build(names=["u", "v"], compute_s=np.ones((2, 2)), memory_bytes=np.zeros(2),
    ...     capacity_bytes=np.full(2, np.inf), tensors=[TensorEdge(0, (1,), 2.0)], bandwidth=np.ones((2, 2)),
    ...     latency=np.zeros((2, 2)))
    >>> apart_bounds(p)
    {(0, 1): 4.0}
    """
    sched = problem.schedule_view()
    head_l, tail_l, fastest = _heads_tails(problem)
    head, tail, best = np.array(head_l), np.array(tail_l), np.array(fastest)
    group = sched.group
    off = ~np.eye(problem.k, dtype=bool)
    per_byte = float((1.0 / problem.bandwidth[off]).min())  # the fastest link's seconds per byte
    latency = float(problem.latency[off].min())
    jobs: dict[tuple[int, int], list[tuple[float, float, float]]] = defaultdict(list)  # (from, to) -> (r, p, q)
    for t in sched.tensors:
        u = int(group[t.src])
        readers: dict[int, list[int]] = defaultdict(list)
        for w in t.dsts:
            if group[w] != u:
                readers[int(group[w])].append(w)
        for v, ws in readers.items():  # sent once to v's device, whichever of its ops read it
            jobs[(u, v)].append((head[t.src] + best[t.src], t.nbytes * per_byte,
                                 latency + min(best[w] + tail[w] for w in ws)))
    bounds: dict[tuple[int, int], float] = {}
    for (u, v), link in jobs.items():
        r, p, q = (np.array(x) for x in zip(*link))
        one = float(r[0] + p[0] + q[0]) if r.size == 1 else _node_bound(r, q, p, np.zeros(r.size, dtype=int), 1.0,
                                                                          GRID)
        key = (min(u, v), max(u, v))
        bounds[key] = max(bounds.get(key, 0.0), one)
    return bounds


def either_bound(problem: PlacementProblem, apart: dict[tuple[int, int], float], lower: float) -> float:
    """A lower bound of any plan's step (at least ``lower``) from pairs of nodes that are either apart (at
    least their :func:`apart_bounds` value, given as ``apart``) or on one device, where all their ops run one
    at a time (Carlier's one-machine bound over both nodes' ops): the least of the two, over the
    :data:`EITHER_PAIRS` pairs of largest apart bound above ``lower``.

    Examples
    --------
    Node ``u`` holds ``a`` (1 s), which sends 4 bytes to ``c`` (1 s) of ``v`` over links of 1 byte/s, and a 3 s
    op reading nothing, as does ``v``; node ``w`` is a chain of two 2.5 s ops; three devices. The critical
    path and the heaviest path's runs give 5 s (``w``'s chain). Apart, ``c`` ends no earlier than 6 s;
    together, ``u``'s and ``v``'s four ops take 8 s: at least 6 s, which the best plan takes.

    >>> from cost_models import TensorEdge
    >>> from placer.core.problem import Schedule
    >>> sched = Schedule(np.array([[1.0] * 3, [3.0] * 3, [1.0] * 3, [3.0] * 3, [2.5] * 3, [2.5] * 3]),
    ...     (TensorEdge(0, (2,), 4.0), TensorEdge(4, (5,), 0.0)), (), np.array([0, 0, 1, 1, 2, 2]))
    >>> p = PlacementProblem.build(names=["u", "v", "w"], compute_s=np.array([[4.0] * 3, [4.0] * 3, [5.0] * 3]),
    ...     memory_bytes=np.zeros(3), capacity_bytes=np.full(3, np.inf), tensors=[TensorEdge(0, (1,), 4.0)],
    ...     bandwidth=np.ones((3, 3)), latency=np.zeros((3, 3)), schedule=sched)
    >>> critical_path_bound(p), either_bound(p, apart_bounds(p), critical_path_bound(p))
    (5.0, 6.0)
    """
    sched = problem.schedule_view()
    head_l, tail_l, fastest = _heads_tails(problem)
    head, tail, best = np.array(head_l), np.array(tail_l), np.array(fastest)
    ops = defaultdict(list)
    for op, node in enumerate(sched.group.tolist()):
        ops[node].append(op)
    bound = lower
    ranked = sorted(((value, pair) for pair, value in apart.items() if value > lower), reverse=True)
    for value, (u, v) in ranked[:EITHER_PAIRS]:
        if value <= bound:
            break
        both = np.array(ops[u] + ops[v])
        bound = max(bound, min(value, _one_device(head[both], tail[both], best[both], 1.0, GRID)))
    return bound


def forced_merge_bound(problem: PlacementProblem, incumbent: float) -> tuple[float, int]:
    """A lower bound of the optimal step given a plan whose step is ``incumbent``: every pair of nodes whose
    :func:`apart_bounds` reaches the incumbent merged (repeatedly), the merged problem's
    :func:`~placer.core.objectives.critical_path_bound`, at most ``incumbent``. Returns the bound and the
    pairs merged; ``(0.0, 0)`` where it does not apply (one device, shared processors or transfer CPU
    costs, more than :data:`MAX_OPS` ops).

    Examples
    --------
    Nodes of three 1 s ops each, ``u``'s ops each sending 1 byte to one of ``v``'s over links of 1 byte/s.
    Apart, the link carries the three one after another: at least 5 s, which a plan takes. A better plan
    would keep them together, on one device, where their six ops take 6 s, so none is better, which the
    critical path bound (4 s: one node's three ops one after another, then a reader) does not show.

    >>> from cost_models import TensorEdge
    >>> from placer.core.problem import Schedule
    >>> p = PlacementProblem.build(names=["u", "v"], compute_s=np.array([[3.0, 3.0], [3.0, 3.0]]),
    ...     memory_bytes=np.zeros(2), capacity_bytes=np.full(2, np.inf), tensors=[TensorEdge(0, (1,), 3.0)],
    ...     bandwidth=np.ones((2, 2)), latency=np.zeros((2, 2)), schedule=Schedule(np.ones((6, 2)),
    ...     tuple(TensorEdge(i, (i + 3,), 1.0) for i in range(3)), (), np.array([0, 0, 0, 1, 1, 1])))
    >>> critical_path_bound(p), forced_merge_bound(p, 5.0)
    (4.0, (5.0, 1))
    """
    if problem.k < 2 or not orders_by_priority(problem) or problem.schedule_view().m > MAX_OPS:
        return 0.0, 0
    # the problem's own critical_path_bound, computed once per problem (auto's search read it already)
    bound, merged, current = get_objective("latency").bound(problem), 0, problem
    for _ in range(ROUNDS):
        if bound >= incumbent:
            break
        apart = apart_bounds(current)
        bound = max(bound, either_bound(current, apart, bound))
        forced = [pair for pair, value in apart.items() if value >= incumbent]
        if not forced:
            break
        clusters = nx.utils.UnionFind(range(current.n))
        for pair in forced:
            clusters.union(*pair)
        merged += len(forced)
        current = _contract(current, np.array([clusters[x] for x in range(current.n)])).coarse
        bound = max(bound, critical_path_bound(current))
    return min(bound, incumbent), merged
