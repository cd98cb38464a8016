"""What a placement minimises: a registry of objectives (no TensorFlow).

=============  ======  ==========================================================
name           unit    value of an assignment
=============  ======  ==========================================================
latency        s       one step's makespan, simulated on the fine dataflow graph
                       (:func:`cost_models.simulate`: an op starts when its
                       inputs have arrived, one op at a time per device, one
                       transfer at a time per link)
throughput     s       pipelined steady state: the maximum device load, compute
                       plus send and receive time (Tarnawski et al., NeurIPS'20;
                       :func:`placer.core.problem.evaluate`)
memory         bytes   bytes crossing devices, with every device under its
                       capacity (the least traffic that fits)
=============  ======  ==========================================================

Every objective is ``inf`` for an infeasible assignment (a node on a device it
may not use, or a device over capacity), and comes with a cheap lower bound.

Examples
--------
>>> import numpy as np
>>> from cost_models import TensorEdge
>>> from placer.core.problem import PlacementProblem
>>> p = PlacementProblem.build(names=["a", "b", "c"], compute_s=np.ones((3, 2)), memory_bytes=np.zeros(3),
...     capacity_bytes=np.full(2, np.inf), tensors=[TensorEdge(0, (1, 2), 1e3)], bandwidth=np.full((2, 2), 1e6),
...     latency=np.zeros((2, 2)))
>>> a = np.array([0, 0, 1])
>>> [round(OBJECTIVES[o].value(p, a), 6) for o in ("latency", "throughput", "memory")]
[2.001, 2.001, 1000.0]
>>> round(OBJECTIVES["latency"].lower_bound(p), 6)   # a, then b beside it and c across the link
2.001
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from typing import Callable, Sequence

import numpy as np

from cost_models import Dependencies, SimOptions, SimResult, dependencies_of, simulate
from cost_models.simulate import PRIORITY

from ..errors import GraphError, SolverError
from .order import order_edges
from .problem import PlacementProblem, dependencies, evaluate, trivial_lower_bound
from .spreading import spreading_bound

#: The objective used when none is named (a single step is what an
#: inference user waits for; pass ``"throughput"`` for pipelined training).
DEFAULT_OBJECTIVE = "latency"


@dataclass(frozen=True)
class Objective:
    """An objective: its value for an assignment and a valid lower bound."""

    name: str
    unit: str
    value: Callable[[PlacementProblem, np.ndarray], float]
    lower_bound: Callable[[PlacementProblem], float]
    #: Whether the CP-SAT max-load model optimises this objective exactly
    #: ("throughput"), minimum traffic ("memory"), or only serves as a proxy.
    cpsat_model: str
    #: Estimated cost of scoring one plan, µs per fine op (2-core reference machine); ``auto``
    #: budgets by such estimates instead of the clock (see :mod:`placer.solvers`).
    score_us_per_op: float = 3.0
    #: Whether the value is the simulated step itself (``auto`` then also improves plans by moves
    #: scored by the simulator: :mod:`placer.solvers.descent`).
    simulated: bool = False

    def score(self, problem: PlacementProblem, assignment: np.ndarray, order: Sequence[Sequence[int]] = ()) -> float:
        """:attr:`value` of ``assignment``, each device running its ops in ``order`` where one is given (a
        simulated objective; :mod:`placer.core.order`) and ``simulated``; else the executor's order."""
        if order and self.simulated:
            return makespan(problem, assignment, order)
        return self.value(problem, assignment)

    def bound(self, problem: PlacementProblem) -> float:
        """:attr:`lower_bound` of ``problem``, computed once per problem (the memory bound solves an LP)."""
        return problem.memo(f"bound/{self.name}", lambda: self.lower_bound(problem))


OBJECTIVES: dict[str, Objective] = {}


def _register(obj: Objective) -> Objective:
    OBJECTIVES[obj.name] = obj
    return obj


def get_objective(name: str) -> Objective:
    """The registered objective ``name``, or :class:`SolverError` listing the choices."""
    try:
        return OBJECTIVES[name]
    except KeyError:
        raise SolverError(f"unknown objective {name!r}; choose one of {sorted(OBJECTIVES)}") from None


_STEP_ONLY = SimOptions(peak_memory=False)


def step_dependencies(problem: PlacementProblem) -> Dependencies:
    """The fine DAG's :class:`~cost_models.Dependencies` (computed once per problem; every simulation of it
    and :func:`placer.solvers.descent.slack` read them)."""
    sched = problem.schedule_view()
    return problem.memo("simulate/dependencies", lambda: dependencies_of(sched.m, sched.tensors, sched.control))


def step_tails(problem: PlacementProblem) -> list[float]:
    """Per fine op: a lower bound of the time any plan's step runs after it ends: its successors' fastest
    times along the longest path, with the transfers no placement avoids (:func:`_earliest`; the same tails
    :func:`critical_path_bound` takes, computed once per problem).

    Examples
    --------
    >>> from cost_models import TensorEdge
    >>> p = PlacementProblem.build(names=list("abc"), compute_s=np.array([[1.0, 1.0], [2.0, 3.0], [4.0, 4.0]]),
    ...     memory_bytes=np.zeros(3), capacity_bytes=np.full(2, np.inf), tensors=[TensorEdge(0, (1,), 1.0),
    ...     TensorEdge(1, (2,), 1.0)], bandwidth=np.ones((2, 2)), latency=np.zeros((2, 2)))
    >>> step_tails(p)
    [6.0, 4.0, 0.0]
    """
    return _heads_tails(problem)[1]


def step_priority(problem: PlacementProblem) -> list[float]:
    """Per fine op: the least time from its end to the step's end in any plan (:func:`step_tails`): the
    priority by which a planned order runs ready ops (:func:`simulate_step`'s ``priority``; the most
    urgent first).

    This is Jackson's rule (Schrage's on ops that arrive over time): on one device, the ready op whose
    successors need longest after it goes first, whatever its own length. The op's own time is left out on
    purpose: with it (the "bottom level" of list schedulers) a long op with nothing after it, such as a
    weight gradient, outranks the input gradient the rest of the step waits for. On the densely connected
    CNN's training step (4 devices, layer groups, links of 100 µs + 250 bytes/µs) a plan with its four
    heaviest layers on three devices simulated 432.2 ms with the bottom level, whose order ran two 61-63 ms
    weight gradients before the input gradients behind them, and 322.1 ms with this priority (2026-12-05;
    ``benchmarks/results/ab/solvers_ab_latency_budget_2026-12-05.md``: neither rule wins on every graph).

    Examples
    --------
    A 1 s op feeding a 2 s op: 2 s follow the first one's end, none the second's.

    >>> from cost_models import TensorEdge
    >>> p = PlacementProblem.build(names=["a", "b"], compute_s=np.array([[1.0], [2.0]]), memory_bytes=np.zeros(2),
    ...     capacity_bytes=np.full(1, np.inf), tensors=[TensorEdge(0, (1,), 1.0)], bandwidth=np.ones((1, 1)),
    ...     latency=np.zeros((1, 1)))
    >>> step_priority(p)
    [2.0, 0.0]
    """
    return problem.memo("simulate/priority", lambda: list(_heads_tails(problem)[1]))


def orders_by_priority(problem: PlacementProblem) -> bool:
    """Whether :func:`simulate_step` can run the problem's devices by ``priority`` (its simulation has no
    shared processors nor transfer CPU costs)."""
    return not problem.shared and problem.transfer_cpu is None


#: The ops of a problem node run on one device: an op's heads and tails count its node's ops before (after) it
#: in the DAG, one after another (:func:`_heads_tails`), where the sets fit in this many bits in all (ops x
#: ops in nodes of two or more; ~50 MB: the 16k-op InceptionV3 training step takes ~1.6e8, a 250k-op graph
#: is far above and keeps the bound without them) ...
NODE_ANCESTOR_BITS = 400_000_000
#: ... and for an op with at most this many of them (each takes a sort).
NODE_ANCESTORS_MAX = 4096
#: The path-runs bound (:func:`_path_runs`) takes paths of at most this many ops ...
RUNS_MAX_PATH = 1000
#: ... whose nodes hold at most this many ops times the path's ops (a matrix of booleans) ...
RUNS_MAX_CELLS = 4_000_000
#: ... and bisects its makespan this many times.
RUNS_STEPS = 30
#: The path-runs bound keeps apart, within a run, any two of the path's this many heaviest nodes whose ops on
#: one device (Carlier's bound over both, with up to this many heads) exceed the step it tests.
RUNS_PAIR_NODES = 24
RUNS_PAIR_GRID = 48
#: Relative difference of ``total`` within which :func:`_heaviest_path` counts neighbours as tied.
PATH_TIE = 1e-9


def _heads_tails(problem: PlacementProblem) -> tuple[list[float], list[float], list[float]]:
    """Per fine op: its earliest start, the least time after it ends, and its fastest time, in any plan
    (:func:`_earliest` forwards and backwards over the fine DAG; transfer times only where no device shares a
    processor). Where no device overlaps its own ops, an op's neighbours in its own problem node are on its
    device (no transfer), and so are all its node's ops before it in the DAG: they run one after another, so
    the op starts no earlier than ``t`` + the work of those that cannot start before ``t``, for every ``t``
    (:class:`_NodeAncestors`; likewise after it). Computed once per problem.

    Examples
    --------
    Independent 1 s ops ``a`` and ``b`` feeding ``c``, all of one node: ``c`` waits for both, which run
    one after the other on its device, so it starts at 2 s at the earliest (1 s without the node).

    >>> from cost_models import TensorEdge
    >>> from placer.core.problem import Schedule
    >>> p = PlacementProblem.build(names=["abc"], compute_s=np.full((1, 2), 3.0), memory_bytes=np.zeros(1),
    ...     capacity_bytes=np.full(2, np.inf), tensors=[], bandwidth=np.full((2, 2), 1e9), latency=np.zeros((2, 2)),
    ...     schedule=Schedule(np.ones((3, 2)), (TensorEdge(0, (2,), 0.0), TensorEdge(1, (2,), 0.0)), (),
    ...     np.array([0, 0, 0])))
    >>> _heads_tails(p)[0]
    [0.0, 0.0, 2.0]
    """
    def compute() -> tuple[list[float], list[float], list[float]]:
        sched = problem.schedule_view()
        best = np.where(np.isfinite(sched.durations_s), sched.durations_s, np.inf).min(axis=1)
        preds, succs = dependencies(sched.m, sched.tensors, sched.control)
        order = problem.schedule_order()
        pooled = any(alone > 1 for _, _, alone in problem.shared)  # a device may overlap its own ops
        delay = _least_transfer_s(problem, sched.tensors) if not pooled and problem.k > 1 else None
        fastest = best.tolist()
        delays = None if delay is None else delay.tolist()
        group = sched.group.tolist() if delay is not None else None
        head = [0.0] * sched.m  # earliest start
        tail = [0.0] * sched.m  # time needed after v ends
        shared = _shared_nodes(sched.group) if delay is not None else []
        in_bits = 0 < sched.m * sum(ops.size for ops in shared) <= NODE_ANCESTOR_BITS
        for times, edges, walk in ((head, preds, order.tolist()), (tail, succs, order[::-1].tolist())):
            within = _NodeAncestors(shared, sched.group, best) if in_bits else None
            for v in walk:
                t = _earliest(edges[v], times, fastest, delays, group, -1 if group is None else group[v])
                times[v] = t if within is None else max(t, within(v, edges[v], times))
        return head, tail, fastest

    return problem.memo("bound/heads_tails", compute)


def _shared_nodes(group: np.ndarray) -> list[np.ndarray]:
    """The fine ops of each problem node of two or more (``group``: each op's node), by node, each in index
    order.

    Examples
    --------
    >>> [ops.tolist() for ops in _shared_nodes(np.array([1, 0, 1, 2, 1]))]
    [[0, 2, 4]]
    """
    order = np.argsort(group, kind="stable")
    starts = np.flatnonzero(np.r_[True, np.diff(group[order]) != 0]) if group.size else np.zeros(0, dtype=int)
    sizes = np.diff(np.r_[starts, group.size])
    return [order[first:first + size] for first, size in zip(starts[sizes > 1], sizes[sizes > 1])]


def _bit_flags(bits: int, size: int) -> np.ndarray:
    """The ``size`` lowest bits of a Python int as booleans, lowest first.

    >>> _bit_flags(0b101, 4).tolist()
    [True, False, True, False]
    """
    return np.unpackbits(np.frombuffer(bits.to_bytes((size + 7) // 8, "little"), dtype=np.uint8),
                         bitorder="little")[:size].astype(bool)


class _NodeAncestors:
    """The one-device bound of an op's node's ops before it in a walk of the DAG (its ancestors there, or
    with the edges and walk reversed its descendants): they share its device and run one after another, so
    it starts no earlier than ``t`` + the work of those whose time is at least ``t``, for every ``t``
    (Carlier's bound). The sets are bits of Python ints over the ops of ``shared`` (:func:`_shared_nodes`),
    each node's ops at consecutive bits."""

    def __init__(self, shared: list[np.ndarray], group: np.ndarray, best: np.ndarray) -> None:
        self.best = best
        self.node = group.tolist()
        self.bit = [0] * group.size
        self.span: dict[int, tuple[int, np.ndarray]] = {}  # node -> (its first bit, its ops in bit order)
        first = 0
        for ops in shared:
            self.span[self.node[int(ops[0])]] = (first, ops)
            for i, v in enumerate(ops.tolist(), start=first):
                self.bit[v] = 1 << i
            first += ops.size
        self.before = [0] * group.size  # per op: the grouped ops before it in the walk (as bits)

    def __call__(self, v: int, edges, times: list[float]) -> float:
        """Op ``v``'s bound, its neighbours before it (``edges``) walked already, ``times`` theirs."""
        bits, before, bit = 0, self.before, self.bit
        for _, u in edges:
            bits |= before[u] | bit[u]
        before[v] = bits
        if not bit[v]:
            return 0.0
        first, ops = self.span[self.node[v]]
        same = (bits >> first) & ((1 << ops.size) - 1)
        if not same or same.bit_count() > NODE_ANCESTORS_MAX:
            return 0.0
        ops = ops[_bit_flags(same, ops.size)]
        t = np.fromiter((times[u] for u in ops.tolist()), dtype=float, count=ops.size)
        by = np.argsort(-t, kind="stable")
        return float((t[by] + np.cumsum(self.best[ops][by])).max())


def simulate_step(problem: PlacementProblem, assignment: np.ndarray, *, snapshots: int = 0,
                  resume: SimResult | None = None, stop_above: float | None = None,
                  order: Sequence[Sequence[int]] = (), priority: Sequence[float] | None = None) -> SimResult:
    """One step of the fine DAG under ``assignment`` (one device per problem node), simulated; feasibility
    is not checked (see :func:`makespan`).

    ``snapshots`` keeps that many states of the simulation, and ``resume`` (such a simulation of another
    assignment) continues from the last one a move leaves intact (:func:`cost_models.simulate`): the
    same result, for the ops after the move's inputs only (:mod:`placer.solvers.descent`). With
    ``stop_above``, a step that would end after it stops as soon as an op's end plus its
    :func:`step_tails` shows it (``step_time_s`` is then ``inf``); one that ends by it is simulated whole.
    ``order``: per device, the fine ops in the order the plan runs them (:func:`placer.core.order.order_edges`
    become control edges); empty: the executor's order. ``priority`` (per fine op, :func:`step_priority`):
    each device runs its ready op of highest priority first instead, the order a plan would then fix
    (:func:`placer.core.order.simulated_order`; only where :func:`orders_by_priority`).

    Raises
    ------
    GraphError
        The placed graph cannot be simulated (a cycle).
    """
    sched = problem.schedule_view()
    fine = np.asarray(assignment, dtype=int)[sched.group]
    options = problem.sim_options(_STEP_ONLY if not snapshots else replace(_STEP_ONLY, snapshots=snapshots))
    control, deps = sched.control, step_dependencies(problem)
    if order:
        edges = order_edges(order)
        control, deps = [*sched.control, *edges], deps.with_control(edges)
    if priority is not None:
        options = replace(options, ready_order=PRIORITY, priority=priority)
    try:
        return simulate(sched.durations_s, sched.tensors, fine, problem.occupancy_seconds, control_edges=control,
                        link_latency_s=problem.latency, options=options, deps=deps,
                        resume=resume, stop_above=stop_above,
                        tails=None if stop_above is None else step_tails(problem))
    except ValueError as e:
        raise GraphError(f"cannot simulate the placed graph: {e}") from e


def makespan(problem: PlacementProblem, assignment: np.ndarray, order: Sequence[Sequence[int]] = ()) -> float:
    """Simulated one-step time of the fine DAG under ``assignment`` (``inf`` if infeasible), each device
    running its ops in ``order`` where one is given (:func:`simulate_step`)."""
    if not evaluate(problem, assignment).feasible:
        return float("inf")
    return simulate_step(problem, assignment, order=order).step_time_s


def _least_transfer_s(problem: PlacementProblem, tensors) -> np.ndarray:
    """Per tensor: the least time it takes to cross any link (0 for an empty tensor)."""
    off = ~np.eye(problem.k, dtype=bool)
    lat = np.unique(np.stack([np.asarray(problem.latency, dtype=float)[off],
                              1.0 / np.asarray(problem.bandwidth, dtype=float)[off]], axis=1), axis=0)
    nbytes = np.fromiter((t.nbytes for t in tensors), dtype=float, count=len(tensors))
    count = np.fromiter((t.count for t in tensors), dtype=float, count=len(tensors))
    least = np.full(len(tensors), np.inf)
    for latency, inverse in lat:  # the distinct links (one when all are alike)
        np.minimum(least, count * latency + nbytes * inverse, out=least)
    return np.where(nbytes > 0, least, 0.0)


def _earliest(edges, times: list[float], best: list[float], delay: list[float] | None,
              group: list[int] | None = None, own: int = -1) -> float:
    """A lower bound of when an op can start given its predecessors ``edges`` (or, given its successors,
    of the time needed after it ends), ``times`` being those of the neighbours.

    Free transfers give ``max(times[u] + best[u])``. With transfer times (no
    shared processor: one op at a time per device), each neighbour is either
    on the op's device, where those run one after another (at least their
    summed time past the least of their ``times``), or on another, adding
    its least transfer time. Taking the neighbours by decreasing
    ``times + best + transfer``, the colocated set that minimises this is
    (by a bound monotone in it) a prefix, so the least over prefixes bounds
    every choice. With ``group`` (each op's problem node), a neighbour in the op's own node ``own`` is on its
    device. Pure Python: it runs once per op in both directions.
    """
    if not edges:
        return 0.0
    if len(edges) == 1 or delay is None:
        return max(times[u] + best[u] for _, u in edges)
    slowest: dict[int, float] = {}  # neighbour -> its slowest transfer to us (each neighbour counted once)
    for ti, u in edges:
        c = math.inf if group is not None and group[u] == own else 0.0 if ti < 0 else delay[ti]
        if c >= slowest.get(u, -1.0):
            slowest[u] = c
    free = max(times[u] + best[u] for u in slowest)
    if len(slowest) == 1:
        return free
    cross = sorted(((times[u] + best[u] + c, u) for u, c in slowest.items()), reverse=True)
    together = min(times[u] for u in slowest)  # all colocated so far run after the earliest of them
    least = max(cross[0][0], together)  # j = 0: nothing colocated
    for j, (_, u) in enumerate(cross):  # the first j + 1 colocated
        together += best[u]
        apart = cross[j + 1][0] if j + 1 < len(cross) else 0.0
        least = min(least, max(apart, together))
    return max(free, least)


def critical_path_bound(problem: PlacementProblem, grid: int = 48) -> float:
    """A valid lower bound of any schedule's makespan (every op at its fastest).

    The largest of

    * the critical path, where an op's earliest start counts its inputs'
      transfers unless those inputs run on its device, one after another
      (:func:`_earliest`; without transfer times where devices share a
      processor);
    * total work / devices (fewer where devices share a processor:
      :meth:`~placer.core.problem.PlacementProblem.parallel_devices`);
    * per node, its ops' one-device bound: they share one device, one at a
      time (a shared processor's capacity's worth at once), so any of them
      that cannot start before ``t`` and need ``τ`` after them take
      ``t + their work + τ`` (:func:`_node_bound`; with ``t = τ = 0``, the
      node's work);
    * the two-sided "energy" bound: ops that cannot start before ``t``
      (longest path to them ≥ ``t``) and must end ``τ`` before the end
      (longest path after them ≥ ``τ``) fit between, so
      ``makespan ≥ t + τ + their work / devices``, over a grid of quantiles
      of ``t`` and ``τ``;
    * where no device overlaps its own ops, the runs of the heaviest path
      (:func:`_path_runs`): however the path splits into stretches on
      devices, each stretch's nodes' work after its start and the path's
      transfers between stretches.

    Examples
    --------
    A chain a -> b next to an independent c, all 1 s, on 2 devices: the
    critical path (2 s) is the bound.

    >>> import numpy as np
    >>> from cost_models import TensorEdge
    >>> p = PlacementProblem.build(names=list("abc"), compute_s=np.ones((3, 2)), memory_bytes=np.zeros(3),
    ...     capacity_bytes=np.full(2, np.inf), tensors=[TensorEdge(0, (1,), 0.0)], bandwidth=np.ones((2, 2)),
    ...     latency=np.zeros((2, 2)))
    >>> critical_path_bound(p)
    2.0
    """
    return problem.memo(f"bound/critical_path/{grid}", lambda: _critical_path(problem, grid))[0]


def critical_path_split(problem: PlacementProblem) -> tuple[tuple[int, ...], ...]:
    """The split of the heaviest path into runs (its ops per run, in order) under which
    :func:`critical_path_bound` found the step could reach its bound: each run's problem nodes on one device,
    the next run's on another. Empty where that bound was not computed (one device, shared processors, a
    path too long). A placement heuristic's start (:mod:`placer.solvers.runs`).

    Examples
    --------
    A two-op path ``a -> b`` of two nodes: one run holds both.

    >>> from cost_models import TensorEdge
    >>> p = PlacementProblem.build(names=list("ab"), compute_s=np.ones((2, 2)), memory_bytes=np.zeros(2),
    ...     capacity_bytes=np.full(2, np.inf), tensors=[TensorEdge(0, (1,), 1.0)], bandwidth=np.ones((2, 2)),
    ...     latency=np.zeros((2, 2)))
    >>> critical_path_split(p)
    ((0, 1),)
    """
    return problem.memo("bound/critical_path/48", lambda: _critical_path(problem, 48))[1]


def _critical_path(problem: PlacementProblem, grid: int) -> tuple[float, tuple[tuple[int, ...], ...]]:
    """:func:`critical_path_bound` and :func:`critical_path_split`."""
    sched = problem.schedule_view()
    if sched.m == 0:
        return 0.0, ()
    head_l, tail_l, fastest = _heads_tails(problem)
    head, tail, best = np.array(head_l), np.array(tail_l), np.array(fastest)
    k = problem.parallel_devices()
    overlap = max([alone for _, _, alone in problem.shared], default=1.0)
    largest_group = float(problem.compute_s.min(axis=1).max()) / overlap if problem.n else 0.0
    bound = max(float((head + best + tail).max()), float(best.sum() / k), largest_group,
                _node_bound(head, tail, best, sched.group, overlap, grid))
    ts = np.unique(np.quantile(head, np.linspace(0, 1, grid)))
    taus = np.unique(np.quantile(tail, np.linspace(0, 1, grid)))
    for t in ts:
        sel = head >= t
        if not sel.any():
            continue
        tl, w = tail[sel], best[sel]
        idx = np.argsort(-tl)
        tl, cw = tl[idx], np.cumsum(w[idx])  # work of ops with tail >= tl[i]
        # for each tau: the ops with tail >= tau are a prefix of the sorted list
        n_ge = np.searchsorted(-tl, -taus, side="right")
        work = cw[np.maximum(n_ge - 1, 0)]
        valid = n_ge > 0  # an empty set of ops constrains nothing
        if valid.any():
            bound = max(bound, float((t + taus[valid] + work[valid] / k).max()))
    pooled = any(alone > 1 for _, _, alone in problem.shared)  # a device may overlap its own ops
    if problem.k > 1 and not pooled:
        return _path_runs(problem, head, tail, best, bound)
    return bound, ()


def _heaviest_path(preds: list, succs: list, total: list[float], head: list[float]) -> list[int]:
    """A path of the DAG through its op of largest ``total``, extended both ways through the neighbour of
    largest ``total``; among neighbours within :data:`PATH_TIE` of it, the latest-starting predecessor and
    the earliest-starting successor (on a critical path every op ties: a shortcut edge past a chain, such
    as a concatenation reading an early layer, would skip the chain's ops)."""
    def pick(options: list[int], later: bool) -> int:
        top = max(total[u] for u in options)
        tied = [u for u in options if total[u] >= top * (1 - PATH_TIE)]
        return max(tied, key=head.__getitem__) if later else min(tied, key=head.__getitem__)

    v = max(range(len(total)), key=total.__getitem__)
    path = [v]
    while preds[v]:
        v = pick([u for _, u in preds[v]], True)
        path.append(v)
    path.reverse()
    v = path[-1]
    while succs[v]:
        v = pick([w for _, w in succs[v]], False)
        path.append(v)
    return path


def _path_runs(problem: PlacementProblem, head: np.ndarray, tail: np.ndarray, best: np.ndarray,
               lower: float) -> tuple[float, tuple[tuple[int, ...], ...]]:
    """A lower bound of the makespan (at least ``lower``, a valid one) from how a path's ops split into runs
    on devices, and a split that reaches it (:func:`_split`; empty where the path is not taken). ``head``,
    ``tail``, ``best``: per fine op, as :func:`_heads_tails` gives them; devices run one op at a time.

    Take the heaviest path ``p_0 .. p_{L-1}``. In any plan it splits into *runs*: maximal stretches of
    consecutive path ops on one device. For a run ``p_a .. p_b`` on device ``D``:

    * every op of the problem nodes of ``p_a .. p_b`` runs on ``D``, and those that descend from
      ``p_{a-1}`` start after it ends (``E``), so the step lasts at least ``E`` + their work + the least
      tail among them (for ``a = 0``: ``p_0``'s descendants, from its head); and, whenever they start,
      all of those nodes' ops (a variable's read descends from nothing) take the least head among them +
      their work + the least tail;
    * ``p_b`` ends at least ``p_a``'s start + the path's work from ``a`` to ``b``;
    * the next run starts after the tensor from ``p_b`` to ``p_{b+1}`` crossed devices (its least
      transfer time); it cannot start at an op of the run's nodes (that op is on ``D``).

    A bisection over the makespan ``B`` keeps the least end of ``p_{a-1}`` over the splits whose runs so
    far all fit in ``B`` (the least end is what every later condition is monotone in); when no split fits,
    the step exceeds ``B``. Only for paths of up to :data:`RUNS_MAX_PATH` ops whose nodes' ops fit
    :data:`RUNS_MAX_CELLS`; ``lower`` otherwise.

    Examples
    --------
    Nodes ``{a, d}`` and ``{b, c}``: ``a`` (3 s) sends 1 byte to ``b``, ``c`` and ``d``, ``c`` sends 2 bytes to
    ``d``, the others take 2 s, links of 1 byte/s. The critical path ``a -> c -> d`` takes 7 s, but every
    split of it into runs needs 9 s: one device runs all four ops in 9 s; ``c`` apart from ``a`` and ``d``
    waits 1 s for ``a``'s tensor, and ``d`` 2 s for ``c``'s (3 + 1 + 2 + 2 + 2 = 10 s); ``c`` and ``d``
    apart from ``a`` run ``b``, ``c`` and ``d`` after ``a`` ends (3 + 6 s).

    >>> from cost_models import TensorEdge
    >>> from placer.core.problem import Schedule
    >>> sched = Schedule(np.array([[3.0] * 2, [2.0] * 2, [2.0] * 2, [2.0] * 2]),
    ...     (TensorEdge(0, (1, 2, 3), 1.0), TensorEdge(2, (3,), 2.0)), (), np.array([1, 0, 0, 1]))
    >>> p = PlacementProblem.build(names=["bc", "ad"], compute_s=np.array([[4.0] * 2, [5.0] * 2]),
    ...     memory_bytes=np.zeros(2), capacity_bytes=np.full(2, np.inf), tensors=[], bandwidth=np.ones((2, 2)),
    ...     latency=np.zeros((2, 2)), schedule=sched)
    >>> head, tail, best = map(np.array, _heads_tails(p))
    >>> bound, split = _path_runs(p, head, tail, best, 7.0)
    >>> round(bound, 6), split
    (9.0, ((0, 2, 3),))
    """
    sched = problem.schedule_view()
    preds, succs = dependencies(sched.m, sched.tensors, sched.control)
    total = (head + best + tail).tolist()
    path = _heaviest_path(preds, succs, total, head.tolist())
    length = len(path)
    node = sched.group
    on_path = np.unique(node[path])
    rows = np.flatnonzero(np.isin(node, on_path))  # the ops of the path's nodes
    if length < 2 or length > RUNS_MAX_PATH or length * rows.size > RUNS_MAX_CELLS \
            or sched.m * rows.size > NODE_ANCESTOR_BITS:
        return lower, ()
    delay = _least_transfer_s(problem, sched.tensors)
    # descendants among `rows` (bits of Python ints), from the last op of a topological order back
    bit = [0] * sched.m
    for i, v in enumerate(rows.tolist()):
        bit[v] = 1 << i
    desc = [0] * sched.m
    for v in problem.schedule_order()[::-1].tolist():
        d = bit[v]
        for _, w in succs[v]:
            d |= desc[w]
        desc[v] = d
    # the ops each run start a must count: p_0's descendants (itself included) or p_{a-1}'s (not itself)
    after = np.stack([_bit_flags(desc[path[0]], rows.size)]
                     + [_bit_flags(desc[u] & ~bit[u], rows.size) for u in path[:-1]])
    col = np.searchsorted(on_path, node[rows])  # each row's node among the path's
    work = after * best[rows]  # (runs starts, rows): the work each start counts
    node_work = np.zeros((length, on_path.size))
    np.add.at(node_work.T, col, work.T)
    node_tail = np.full((length, on_path.size), np.inf)
    for j in range(on_path.size):
        cols = np.flatnonzero(col == j)
        node_tail[:, j] = np.where(after[:, cols], tail[rows][cols], np.inf).min(axis=1)
    path_node = np.searchsorted(on_path, node[path])
    last_seen: dict[int, int] = {}
    prev = np.full(length, -1)  # per path position: the last earlier position in the same node
    for i, j in enumerate(path_node.tolist()):
        prev[i] = last_seen.get(j, -1)
        last_seen[j] = i
    node_all = np.bincount(col, weights=best[rows], minlength=on_path.size)
    node_head = np.full(on_path.size, np.inf)
    np.minimum.at(node_head, col, head[rows])
    node_low = np.full(on_path.size, np.inf)
    np.minimum.at(node_low, col, tail[rows])
    whole = []  # per start a, over b >= a: the least step that runs all of a..b's nodes' ops (nondecreasing)
    runs = []  # per start a, over b >= a: what the run a..b needs after p_{a-1} ends (nondecreasing)
    for a in range(length):
        first = prev[a:] < a  # the node appears for the first time in the run
        nodes = path_node[a:]
        w = np.cumsum(np.where(first, node_work[a, nodes], 0.0))
        t = np.minimum.accumulate(np.where(first, node_tail[a, nodes], np.inf))
        runs.append(np.maximum.accumulate(w + np.where(np.isfinite(t), t, 0.0)))
        # every op of the run's nodes, whenever it may start: least head + their work + least tail
        whole.append(np.minimum.accumulate(np.where(first, node_head[nodes], np.inf))
                     + np.cumsum(np.where(first, node_all[nodes], 0.0))
                     + np.minimum.accumulate(np.where(first, node_low[nodes], np.inf)))
    chain = np.concatenate([[0.0], np.cumsum(best[path])])
    cross = np.zeros(length)
    for i in range(length - 1):
        c = [float(delay[ti]) for ti, w in succs[path[i]] if w == path[i + 1] and ti >= 0]
        cross[i] = max(c, default=0.0)
    ends = head[path] + best[path]
    last_tail = float(tail[path[-1]])
    # pairs of the heaviest path nodes: one device's bound over both nodes' ops, and per path position a,
    # the first position >= a of each node (a run from a that reaches both puts them on one device)
    heavy = np.argsort(-node_all, kind="stable")[:RUNS_PAIR_NODES]
    pairs = [(i, j) for x, i in enumerate(heavy.tolist()) for j in heavy[x + 1:].tolist()]

    def together(i: int, j: int) -> float:
        ops = rows[(col == i) | (col == j)]
        return _one_device(head[ops], tail[ops], best[ops], 1.0, RUNS_PAIR_GRID)

    pair_bound = np.array([together(i, j) for i, j in pairs])
    at = np.full((on_path.size, length + 1), length)
    for i, j in enumerate(path_node.tolist()):
        at[j, i] = i
    at = np.minimum.accumulate(at[:, ::-1], axis=1)[:, ::-1]
    both = np.array([np.maximum(at[i], at[j]) for i, j in pairs]).reshape(len(pairs), length + 1)

    def fits(limit: float) -> bool:
        end = np.full(length + 1, np.inf)  # least end of p_{a-1} over the splits that fit so far
        came[:] = -1  # per path position a, the start of the run before it in the split that gave end[a]
        apart = pair_bound > limit
        stop = both[apart].min(axis=0) if apart.any() else np.full(length + 1, length)
        for a in range(length):
            if a == 0:
                start = anchor = float(head[path[0]])
            elif np.isfinite(end[a]):
                anchor = float(end[a])
                start = max(float(head[path[a]]), anchor + cross[a - 1])
            else:
                continue
            count = min(int(np.searchsorted(anchor + runs[a], limit, side="right")),
                        int(np.searchsorted(whole[a], limit, side="right")), int(stop[a]) - a)
            if count == 0:
                continue
            b = np.arange(a, a + count)
            finish = np.maximum(start + chain[b + 1] - chain[a], ends[b])
            if b[-1] == length - 1 and finish[-1] + last_tail <= limit:
                came[length] = a
                return True
            cut = b < length - 1
            cut[cut] = prev[b[cut] + 1] < a  # the next op's node is not on this run's device
            nxt = b[cut] + 1
            better = finish[cut] < end[nxt]
            came[nxt[better]] = a
            end[nxt] = np.where(better, finish[cut], end[nxt])
        return False

    came = np.full(length + 1, -1)
    if fits(lower):
        return lower, _split(path, came)
    low, high = lower, lower + float(best.sum() + head.max() + tail.max())
    for _ in range(RUNS_STEPS):
        mid = 0.5 * (low + high)
        if fits(mid):
            high = mid
        else:
            low = mid
    fits(high)
    return low, _split(path, came)


def _split(path: list[int], came: np.ndarray) -> tuple[tuple[int, ...], ...]:
    """The runs (ops of ``path``, in order) of the split :func:`_path_runs` found: ``came[a]`` is the start
    of the run that ends before position ``a`` (``came[len(path)]``: the last run's)."""
    runs = []
    b = len(path)
    if came[b] < 0:
        return ()
    while b > 0:
        a = int(came[b])
        runs.append(tuple(path[a:b]))
        b = a
    return tuple(runs[::-1])


def _node_bound(head: np.ndarray, tail: np.ndarray, work: np.ndarray, group: np.ndarray, overlap: float,
                grid: int) -> float:
    """The largest one-device bound of a problem node: its ops run on one device, one at a time (``overlap``
    ops at once on a shared processor), so the set of them with ``head ≥ t`` and ``tail ≥ τ`` needs
    ``t + work / overlap + τ`` (Carlier's head-body-tail bound of one machine), over every ``t`` of a node
    of up to ``grid`` ops, else ``grid`` quantiles, and every ``τ``.

    Examples
    --------
    A node of two 1 s ops, one that cannot start before 3 s, one that needs 2 s after it: either order
    ends by the other's head or tail, 1 + 1 + 2 (from 0) or 3 + 1 + 2 (the first alone).

    >>> _node_bound(np.array([0.0, 3.0]), np.array([2.0, 2.0]), np.ones(2), np.array([0, 0]), 1.0, 8)
    6.0
    """
    # a single op's bound is its critical path
    return max([_one_device(head[idx], tail[idx], work[idx], overlap, grid) for idx in _shared_nodes(group)],
               default=0.0)


def _one_device(h: np.ndarray, t: np.ndarray, w: np.ndarray, overlap: float, grid: int) -> float:
    """Carlier's head-body-tail bound of ops that share one device: ``t + work / overlap + τ`` over the set
    with ``head ≥ t`` and ``tail ≥ τ``, for every ``t`` of up to ``grid`` ops (else ``grid`` quantiles) and
    every ``τ``."""
    bound = 0.0
    by_tail = np.argsort(-t, kind="stable")
    h, t, w = h[by_tail], t[by_tail], w[by_tail]
    cuts = np.unique(h) if h.size <= grid else np.unique(np.quantile(h, np.linspace(0, 1, grid)))
    for a in cuts:
        sel = h >= a  # by decreasing tail: the ops with tail >= t[j] among them are a prefix
        if sel.any():
            bound = max(bound, float(a + (np.cumsum(w[sel]) / overlap + t[sel]).max()))
    return bound


#: The separation bound tries the heaviest nodes that outweigh a device (up to this many: one max flow per
#: node beyond the first) ...
MAX_CUT_TERMINALS = 8
#: ... and up to this many pairs of nodes that outweigh a device together (one max flow each).
MAX_CUT_PAIRS = 16
#: Max flows the balance bound may solve (a bisection over its Lagrange multiplier).
BALANCE_FLOWS = 24
#: The largest flow network (nodes and arcs) the cut bounds take: OR-Tools' push-relabel took ~0.01 s a
#: flow on ResNet50's training step (12k nodes, 60k arcs) but ~5 s on a 94k-node synthetic chain of 2,000
#: layers (300k arcs), where they are not computed (0) so that placing such a graph stays within a minute.
MAX_BALANCE_NETWORK = 150_000


class _CutNetwork:
    """The flow network of the problem's tensors for hypergraph cuts (OR-Tools' max flow): a tensor read on
    one other node is an arc each way of its bytes; one read by several is Lawler's gadget (an arc of its
    bytes between two extra nodes, joined to every node of the tensor by arcs no cut takes), and an arc
    from every node with memory to a sink after the problem's nodes (:func:`balance_bound` prices them;
    0 otherwise). Above :data:`MAX_BALANCE_NETWORK` nodes and arcs only its size is known (``net`` is
    ``None``): the bounds are not computed there.

    Capacities are set per solve, scaled to integers (``scale`` units per byte, all of them together under
    2^61 so that no flow overflows) and rounded down, so a flow scaled back is at most the true one and a
    bound made of it stays a bound (as it does where an arc "no cut takes" is cut: that only lowers it).
    """

    def __init__(self, problem: PlacementProblem) -> None:
        from ortools.graph.python import max_flow

        n = problem.n
        tails: list[int] = []
        heads: list[int] = []
        caps: list[float] = []
        self.extra = n + 1  # gadget nodes after the problem's nodes and the (optional) sink
        #: more than any cut: an arc never cut
        self.big = big = float(sum(t.nbytes for t in problem.tensors)) + 1.0
        for t in problem.tensors:
            pins = sorted({t.src, *t.dsts})
            w = float(t.nbytes)
            if len(pins) < 2 or w <= 0:
                continue
            if len(pins) == 2:
                u, v = pins
                tails += [u, v]
                heads += [v, u]
                caps += [w, w]
                continue
            a, b = self.extra, self.extra + 1
            self.extra += 2
            tails.append(a)
            heads.append(b)
            caps.append(w)
            for v in pins:
                tails += [v, b]
                heads += [a, v]
                caps += [big, big]
        self.sink = n
        self.heavy = np.flatnonzero(np.asarray(problem.memory_bytes, dtype=float) > 0)
        self.size = self.extra + len(tails) + self.heavy.size
        self.tensor_caps = np.asarray(caps, dtype=float)
        self.scale = 1.0
        self.net = None
        if self.size > MAX_BALANCE_NETWORK:
            return
        self.net = max_flow.SimpleMaxFlow()
        self.tensor_arcs = self.net.add_arcs_with_capacity(np.asarray(tails, dtype=np.int64),
                                                           np.asarray(heads, dtype=np.int64),
                                                           np.zeros(len(tails), dtype=np.int64))
        self.to_sink = self.net.add_arcs_with_capacity(self.heavy.astype(np.int64),
                                                       np.full(self.heavy.size, self.sink, dtype=np.int64),
                                                       np.zeros(self.heavy.size, dtype=np.int64))

    def set_capacities(self, sink_caps: np.ndarray | None = None) -> None:
        """Tensor arcs at their bytes; the arcs to the sink at ``sink_caps`` (bytes; 0 when ``None``)."""
        sink_caps = np.zeros(self.heavy.size) if sink_caps is None else np.asarray(sink_caps, dtype=float)
        self.scale = 2.0 ** 61 / (self.tensor_caps.sum() + sink_caps.sum() + 1.0)
        self.net.set_arcs_capacity(self.tensor_arcs, np.floor(self.scale * self.tensor_caps).astype(np.int64))
        self.net.set_arcs_capacity(self.to_sink, np.floor(self.scale * sink_caps).astype(np.int64))

    def flow(self, source: int, sink: int) -> float:
        """The max flow from ``source`` to ``sink`` in bytes (rounded down, see the class docstring)."""
        if self.net.solve(source, sink) != self.net.OPTIMAL:
            raise SolverError("the memory bound's max flow failed; this is a bug in autoplace, please report it")
        return float(self.net.optimal_flow()) / self.scale

    def source_side(self) -> np.ndarray:
        """Per network node, whether it is on the source side of the last flow's min cut."""
        side = np.zeros(self.extra, dtype=bool)
        side[np.asarray(self.net.get_source_side_min_cut(), dtype=np.int64)] = True
        return side


def _whole_bytes(problem: PlacementProblem, bound: float) -> float:
    """``bound`` rounded up to whole bytes where every tensor has whole bytes (a cut is then whole), never -0."""
    if all(float(t.nbytes).is_integer() for t in problem.tensors):
        bound = float(np.ceil(bound - 1e-6 * max(1.0, bound)))
    return max(bound, 0.0) + 0.0


def separation_bound(problem: PlacementProblem, network: _CutNetwork | None = None) -> float:
    """A valid lower bound of the bytes crossing devices in any plan that fits the memory capacities, from
    nodes that cannot share one device.

    Every feasible plan cuts some tensor (a tensor with readers on another
    device crosses at least once) between

    * two of the smallest set ``T`` of the heaviest nodes whose memory exceeds
      the largest capacity (at least the least of the max flows from ``T``'s
      heaviest node to each of the others), and
    * each pair of nodes that outweigh the largest capacity together (their
      max flow; up to :data:`MAX_CUT_PAIRS` pairs, heaviest first),

    so the bound is the largest of those cuts (Lawler's gadget for tensors
    with several readers: :class:`_CutNetwork`). The pairs see what ``T``
    does not: an unrolled LSTM whose input and recurrent kernels cannot share
    a device cuts a tensor at every time step. Kernels (devices a node may
    not use) are ignored, which keeps it a bound. 0 when one device can hold
    everything or the flow network (``network``, built here when not given) is
    larger than :data:`MAX_BALANCE_NETWORK`;
    ``T`` is skipped above :data:`MAX_CUT_TERMINALS` nodes.

    Examples
    --------
    Two 6-byte nodes on devices of 10 bytes joined by a 3-byte tensor: it must cross.

    >>> import numpy as np
    >>> from cost_models import TensorEdge
    >>> p = PlacementProblem.build(names=list("ab"), compute_s=np.ones((2, 2)), memory_bytes=np.array([6.0, 6.0]),
    ...     capacity_bytes=np.full(2, 10.0), tensors=[TensorEdge(0, (1,), 3.0)], bandwidth=np.ones((2, 2)),
    ...     latency=np.zeros((2, 2)))
    >>> separation_bound(p)
    3.0

    Two weights that cannot share a device, each read at three steps whose results meet: three crossings.

    >>> steps = [TensorEdge(0, (2, 3, 4), 100.0), TensorEdge(1, (5, 6, 7), 100.0)]
    >>> steps += [TensorEdge(first + i, (8 + i,), 4.0) for first in (2, 5) for i in range(3)]
    >>> p = PlacementProblem.build(names=[f"n{i}" for i in range(11)], compute_s=np.ones((11, 2)),
    ...     memory_bytes=np.r_[6.0, 6.0, np.zeros(9)], capacity_bytes=np.full(2, 10.0), tensors=steps,
    ...     bandwidth=np.ones((2, 2)), latency=np.zeros((2, 2)))
    >>> separation_bound(p)
    12.0
    """
    memory = np.asarray(problem.memory_bytes, dtype=float)
    cap = float(np.max(problem.capacity_bytes)) * (1 + 1e-9) if problem.k else 0.0
    if not np.isfinite(cap) or memory.sum() <= cap:
        return 0.0
    heavy = np.argsort(-memory, kind="stable")
    need = int(np.searchsorted(np.cumsum(memory[heavy]), cap, side="right")) + 1
    pairs = [(int(u), int(v)) for u, v in itertools.combinations(heavy[:MAX_CUT_PAIRS + 1].tolist(), 2)
             if memory[u] + memory[v] > cap][:MAX_CUT_PAIRS]
    if need > MAX_CUT_TERMINALS and not pairs:
        return 0.0
    network = network or _CutNetwork(problem)
    if network.net is None:
        return 0.0
    network.set_capacities()
    bound = 0.0
    if need <= MAX_CUT_TERMINALS:
        bound = min(network.flow(int(heavy[0]), int(v)) for v in heavy[1:need])
    for u, v in pairs:
        bound = max(bound, network.flow(u, v))
    return _whole_bytes(problem, bound)


def balance_bound(problem: PlacementProblem, flows: int = BALANCE_FLOWS, network: _CutNetwork | None = None
                  ) -> float:
    """A valid lower bound of the bytes crossing devices in any plan that fits the memory capacities,
    from the bisection every such plan contains.

    Devices hold at most ``C`` (the largest capacity) of the nodes' memory ``M``,
    so their sets can be grouped into two sides that each hold at least
    ``β = (M - C) / 2`` (add devices to the lighter side: the sides differ by at most
    one device's share; on 2 devices each side is one device, ``β = M - C``). A
    tensor with a consumer across the sides crosses at least once, so the traffic
    is at least the least hypergraph cut ``cut(A, B)`` over splits with ``m(B) ≥ β``
    and the heaviest node ``s`` in ``A`` (the sides are interchangeable). Its
    Lagrangian relaxation, for any ``λ ≥ 0``,

        ``L(λ) = λ (β - M) + min over A ∋ s of [cut(A, B) + λ m(A)]``,

    is at most that least cut, and the inner minimum is one s-t max flow
    (:class:`_CutNetwork`, each node an arc to the sink of capacity
    ``λ m(v)``). ``λ`` is bisected on a log scale by the subgradient
    ``β - m(B)``, in at most ``flows`` max flows; the best ``L`` seen is
    returned (0 when one device can hold every node, or the flow network,
    ``network`` or built here, is larger than :data:`MAX_BALANCE_NETWORK`). Kernels (devices a node may
    not use) are ignored, which keeps it a bound.

    Examples
    --------
    A chain of four 5-byte nodes on two devices of 10: two nodes each, so a tensor crosses; the least
    of them (3 bytes) is the bound.

    >>> from cost_models import TensorEdge
    >>> p = PlacementProblem.build(names=list("abcd"), compute_s=np.ones((4, 2)), memory_bytes=np.full(4, 5.0),
    ...     capacity_bytes=np.full(2, 10.0), tensors=[TensorEdge(0, (1,), 8.0), TensorEdge(1, (2,), 3.0),
    ...     TensorEdge(2, (3,), 8.0)], bandwidth=np.ones((2, 2)), latency=np.zeros((2, 2)))
    >>> balance_bound(p)
    3.0
    """
    memory = np.asarray(problem.memory_bytes, dtype=float)
    total = float(memory.sum())
    caps = np.asarray(problem.capacity_bytes, dtype=float)
    cap = float(caps.max()) if problem.k else 0.0
    if problem.k < 2 or not np.isfinite(cap) or total <= cap * (1 + 1e-9):
        return 0.0
    beta = total - cap if problem.k == 2 else (total - cap) / 2
    n = problem.n
    s = int(np.argmax(memory))
    network = network or _CutNetwork(problem)
    if network.net is None:
        return 0.0
    heavy = network.heavy
    limit = 1e6 * network.big / max(float(memory[heavy].min()), 1e-300)  # beyond it every node is priced out of A

    def lagrangian(lam: float) -> tuple[float, float, float]:
        """``(L(λ), cut(A, B), β - m(B))`` at ``lam`` for the minimising ``A``."""
        network.set_capacities(lam * memory[heavy])
        flow = network.flow(s, network.sink)
        source_side = network.source_side()
        slope = beta - float(memory[~source_side[:n]].sum())
        return lam * (beta - total) + flow, flow - lam * float(memory[source_side[:n]].sum()), slope

    # λ where a node's memory outweighs every tensor, and where it weighs nothing next to the least tensor
    lo, hi = np.log(1e-6 / max(total, 1e-300)), np.log(limit)
    best = 0.0
    lines: dict[bool, tuple[float, float]] = {}  # the last line L follows on each side of its maximum
    for _ in range(max(1, flows - 1)):
        mid = 0.5 * (lo + hi)
        value, cut, slope = lagrangian(float(np.exp(mid)))
        best = max(best, value)
        lines[slope > 0] = (cut, slope)
        if slope > 0:
            lo = mid  # B too light: a higher price on A's memory
        else:
            hi = mid
    if len(lines) == 2 and lines[True][1] > lines[False][1]:  # L is concave: its maximum is where they meet
        (c_up, g_up), (c_down, g_down) = lines[True], lines[False]
        lam = (c_down - c_up) / (g_up - g_down)
        if 0 < lam < limit:
            best = max(best, lagrangian(lam)[0])
    return _whole_bytes(problem, best)


def cluster_bound(problem: PlacementProblem) -> float:
    """A valid lower bound of the bytes crossing devices in any plan that fits the memory capacities, from
    the clusters that heavy tensors tie together (Kruskal's order, largest tensors first).

    Take the tensors of at least ``θ`` bytes: the nodes they connect form
    clusters. A cluster whose memory exceeds the largest capacity ``C`` spans
    at least ``p = ceil(M / C)`` devices, and since its tensors connect it,
    at least ``p - 1`` receiving devices of those tensors are not their
    producer's (a tensor whose nodes are on ``q`` devices joins at most ``q``
    of them and crosses ``q - 1`` times), each at least ``θ`` bytes. Over the
    thresholds ``θ`` (the tensor sizes, largest first: the clusters merge as
    ``θ`` falls), each cluster ``K`` formed at ``θ`` from clusters ``K_i``
    (of larger thresholds) has

    * ``units(K) = max(p(K) - 1, Σ units(K_i))`` crossings at least, and
    * ``bound(K) = Σ bound(K_i) + θ (units(K) - Σ units(K_i))`` bytes at least

    (the crossings the parts need are paid at their larger sizes, the rest
    at ``θ``); the bound is the sum over the final clusters. It sees what
    the cut bounds miss on training graphs: a weight and its optimizer slots,
    joined by weight-sized tensors, that no device can hold together
    (MobileNetV2's classifier on 4 devices of 13.2 MB: kernel, m and v of
    5.12 MB each). Kernels (devices a node may not use) are ignored, which
    keeps it a bound; 0 when one device holds every node. networkx's
    union-find, ``O(tensors log tensors)``.

    Examples
    --------
    Three 6-byte nodes tied by 5-byte tensors, devices of 10 bytes: at least two devices, so one of those
    tensors crosses; the 1-byte tensor to a fourth node does not have to.

    >>> from cost_models import TensorEdge
    >>> p = PlacementProblem.build(names=list("abcd"), compute_s=np.ones((4, 2)),
    ...     memory_bytes=np.array([6.0, 6.0, 6.0, 0.0]), capacity_bytes=np.full(2, 10.0),
    ...     tensors=[TensorEdge(0, (1, 2), 5.0), TensorEdge(2, (3,), 1.0)], bandwidth=np.ones((2, 2)),
    ...     latency=np.zeros((2, 2)))
    >>> cluster_bound(p)
    5.0
    """
    import networkx as nx

    memory = np.asarray(problem.memory_bytes, dtype=float)
    cap = float(np.max(problem.capacity_bytes)) * (1 + 1e-9) if problem.k else 0.0
    if problem.k < 2 or not np.isfinite(cap) or memory.sum() <= cap:
        return 0.0

    def parts(m: float) -> int:  # the fewest devices that hold m bytes
        return 1 if m <= cap else int(np.ceil(m / cap))

    heavy = sorted(((float(t.nbytes), tuple(dict.fromkeys((t.src, *t.dsts)))) for t in problem.tensors
                    if t.nbytes > 0 and any(d != t.src for d in t.dsts)), key=lambda e: -e[0])
    clusters = nx.utils.UnionFind(range(problem.n))
    mem = dict(enumerate(memory.tolist()))  # per cluster (its root)
    units: dict[int, int] = {}
    bound: dict[int, float] = {}
    for theta, level in itertools.groupby(heavy, key=lambda e: e[0]):
        level = list(level)
        before = {clusters[v] for _, pins in level for v in pins}  # the clusters of larger thresholds
        for _, pins in level:
            clusters.union(*pins)
        merged: dict[int, list[int]] = {}
        for r in before:
            merged.setdefault(clusters[r], []).append(r)
        for root, parts_of in merged.items():
            if len(parts_of) < 2:
                continue
            m = sum(mem.pop(r) for r in parts_of)
            below_units = sum(units.pop(r, 0) for r in parts_of)
            below = sum(bound.pop(r, 0.0) for r in parts_of)
            mem[root] = m
            units[root] = max(parts(m) - 1, below_units)
            bound[root] = below + theta * (units[root] - below_units)
    return float(sum(bound.values()))


def memory_bound(problem: PlacementProblem) -> float:
    """The memory objective's bound: the largest of :func:`separation_bound`, :func:`balance_bound` (on one
    flow network), :func:`cluster_bound` and the spreading-metric LP's
    (:func:`placer.core.spreading.spreading_bound`, on problems small enough for it)."""
    memory = np.asarray(problem.memory_bytes, dtype=float)
    cap = float(np.max(problem.capacity_bytes)) if problem.k else 0.0
    if not np.isfinite(cap) or memory.sum() <= cap * (1 + 1e-9):
        return 0.0  # one device holds every node: nothing has to cross (each bound says so too)
    network = _CutNetwork(problem)
    return max(separation_bound(problem, network), balance_bound(problem, network=network), cluster_bound(problem),
               spreading_bound(problem))


def max_load(problem: PlacementProblem, assignment: np.ndarray) -> float:
    """Pipelined max-load (``inf`` if infeasible)."""
    return evaluate(problem, assignment).objective


def traffic_bytes(problem: PlacementProblem, assignment: np.ndarray) -> float:
    """Bytes crossing devices (``inf`` if infeasible)."""
    ev = evaluate(problem, assignment)
    return float(ev.traffic_bytes.sum()) if ev.feasible else float("inf")


# Scoring a latency plan is one simulation: 10.5 µs per op for a round-robin plan of the densely connected
# CNN's training step (5,342 ops, a transfer on most edges), 3.6 for a one-device plan, since the simulator
# reuses the graph's dependencies (2026-12-03; 30 before, when a simulation took 2-3x as long).
_register(Objective("latency", "s", makespan, critical_path_bound, cpsat_model="max_load", score_us_per_op=12.0,
                    simulated=True))
_register(Objective("throughput", "s", max_load, trivial_lower_bound, cpsat_model="max_load"))
_register(Objective("memory", "bytes", traffic_bytes, memory_bound, cpsat_model="traffic"))
