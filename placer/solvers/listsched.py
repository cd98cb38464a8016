"""List scheduling under memory caps: HEFT and ETF (no TensorFlow).

Both walk the fine dataflow graph (:meth:`PlacementProblem.schedule_view`)
and put each op where it *finishes* (HEFT, Topcuoglu et al. 2002) or
*starts* (ETF, Hwang et al. 1989; Baechi's m-ETF) earliest, given when its
inputs arrive over the links. They honour what a placement must:

* a device the op has no kernel for is never chosen (``inf`` duration);
* ops of one problem node (a colocation group or a coarse group) share the
  device the first of them was given;
* a group is only put on a device whose remaining memory holds it.

They return ``None`` when memory runs out, and are scored like every solver
by ``options.objective`` (they optimise one step's latency by design).
Transfers are costed without link contention while scheduling; the
objective's simulator includes it.
"""

from __future__ import annotations

import heapq
import time
from typing import Sequence

import numpy as np

from cost_models import TensorEdge

from ..core.order import timed_only
from ..core.problem import PlacementProblem, Schedule, dependencies
from .base import Solution, SolveOptions, finish
from .registry import acyclic_schedule, solver


def _mean_transfer_s(problem: PlacementProblem, tensors: Sequence[TensorEdge]) -> list[float]:
    """Per tensor edge: its transfer time averaged over every ordered pair of distinct devices
    (:meth:`PlacementProblem.transfer_s` per pair, computed for all tensors at once)."""
    k = problem.k
    if k < 2 or not tensors:
        return [0.0] * len(tensors)
    off = ~np.eye(k, dtype=bool)
    lat, bw = np.asarray(problem.latency)[off], np.asarray(problem.bandwidth)[off]
    nbytes = np.array([t.nbytes for t in tensors], dtype=float)
    count = np.array([t.count for t in tensors], dtype=float)
    per_pair = count[:, None] * lat[None, :] + nbytes[:, None] / bw[None, :]
    return np.where(nbytes > 0, per_pair.mean(axis=1), 0.0).tolist()


class _State:
    """Shared bookkeeping of a list scheduler over the fine DAG."""

    def __init__(self, problem: PlacementProblem) -> None:
        self.p = problem
        self.s: Schedule = problem.schedule_view()
        m, k = self.s.m, problem.k
        # (tensor index or -1, producer) per node, and (tensor index or -1, consumer)
        self.preds, self.succs = dependencies(m, self.s.tensors, self.s.control)
        self.topo = problem.schedule_order()
        self.finish = np.zeros(m)
        self.dev = np.full(m, -1)
        self.dev_free = np.zeros(k)
        self.group_dev = np.full(problem.n, -1)
        self.mem_used = np.zeros(k)
        self.group_ok = np.isfinite(problem.compute_s)
        self.cap = problem.capacity_bytes * (1 + 1e-9)
        # Work pinned to each device but not yet run: a group's later ops (e.g. an optimizer
        # update colocated with its variable) follow its first op, so ties go to the least committed.
        self.committed = np.zeros(k)

    def transfer(self, ti: int, i: int, j: int) -> float:
        return 0.0 if ti < 0 else self.p.transfer_s(self.s.tensors[ti], i, j)

    def candidates(self, v: int) -> np.ndarray:
        """Devices fine node ``v`` may go to now (group pin, kernels, memory)."""
        g = self.s.group[v]
        if self.group_dev[g] >= 0:
            return np.array([self.group_dev[g]])
        fits = self.mem_used + self.p.memory_bytes[g] <= self.cap
        return np.flatnonzero(self.group_ok[g] & fits & np.isfinite(self.s.durations_s[v]))

    def may_take(self, v: int, d: int) -> bool:
        """Whether device ``d`` may take fine op ``v`` now: its group is pinned there, or unpinned and fits
        ``d``'s memory (pins and memory use only grow: once false, always false)."""
        g = self.s.group[v]
        pin = self.group_dev[g]
        return bool(pin == d or (pin < 0 and self.mem_used[d] + self.p.memory_bytes[g] <= self.cap[d]))

    def push_arrival(self, heaps: list[list[tuple[float, float, int]]], v: int, priority: float) -> None:
        """Push fine op ``v`` (its inputs placed) onto the heap of each device that has a kernel for it and
        its group may use, as ``(when its inputs arrive there, -priority, v)``."""
        for d in np.flatnonzero(self.group_ok[self.s.group[v]] & np.isfinite(self.s.durations_s[v])):
            heapq.heappush(heaps[d], (self.data_ready(v, int(d)), -float(priority), v))

    def data_ready(self, v: int, d: int) -> float:
        return max((self.finish[u] + self.transfer(ti, self.dev[u], d) for ti, u in self.preds[v]), default=0.0)

    def place(self, v: int, d: int, start: float) -> None:
        g = self.s.group[v]
        if self.group_dev[g] < 0:
            self.group_dev[g] = d
            self.mem_used[d] += self.p.memory_bytes[g]
            self.committed[d] += self.p.compute_s[g, d]
        self.committed[d] -= self.s.durations_s[v, d]
        self.dev[v] = d
        self.finish[v] = start + self.s.durations_s[v, d]
        self.dev_free[d] = self.finish[v]

    def mean_costs(self) -> tuple[np.ndarray, list[float]]:
        """Mean duration per op over the devices it may use, mean transfer time per tensor."""
        p, s = self.p, self.s
        d = np.where(np.isfinite(s.durations_s), s.durations_s, np.nan)
        wbar = np.nan_to_num(np.nanmean(d, axis=1)) if s.m else np.zeros(0)
        return wbar, _mean_transfer_s(p, s.tensors)

    def upward_rank(self) -> np.ndarray:
        """HEFT's rank: mean duration plus the longest mean-cost path to an exit."""
        wbar, cbar = self.mean_costs()
        rank = np.zeros(self.s.m)
        for v in self.topo[::-1]:
            rank[v] = wbar[v] + max(((cbar[ti] if ti >= 0 else 0.0) + rank[w] for ti, w in self.succs[v]), default=0.0)
        return rank

    def earliest_finish(self, v: int, devices: np.ndarray) -> tuple[float, float, int, float] | None:
        """(finish, committed work, device, start) of the device in ``devices`` where ``v`` ends first.

        Ties go to the device with the least work pinned to it but not yet run, then the lower index.
        """
        best = None
        for d in devices:
            start = max(self.data_ready(v, int(d)), self.dev_free[d])
            opt = (start + self.s.durations_s[v, d], self.committed[d], int(d), start)
            best = opt if best is None or opt < best else best
        return best


@solver("heft", requires=(acyclic_schedule,))
def heft(problem: PlacementProblem, options: SolveOptions) -> Solution | None:
    """HEFT: ops by decreasing upward rank, each on the device where it finishes first.

    Ties (common for a colocation group's first, cheap op) go to the device with
    the least work pinned to it but not yet run.
    """
    t0 = time.perf_counter()
    st = _State(problem)
    rank = st.upward_rank()
    pos = np.empty(st.s.m, dtype=int)
    pos[st.topo] = np.arange(st.s.m)
    for v in sorted(range(st.s.m), key=lambda v: (-rank[v], pos[v])):  # a topological order
        choice = st.earliest_finish(v, st.candidates(v))
        if choice is None:
            return None
        st.place(v, choice[2], choice[3])
    return finish(problem, _groups(st), "heft", t0, options)


@solver("etf", requires=(acyclic_schedule,))
def etf(problem: PlacementProblem, options: SolveOptions) -> Solution | None:
    """ETF: repeatedly start the (ready op, device) pair that can start earliest.

    A device takes its ready ops in the order their inputs arrived there
    (ties: larger upward rank), as the simulator's ready queues (and
    TensorFlow's) do, so an ETF plan keeps its schedule when simulated.
    Equal starts go to the op that has waited longest, then to the device
    with the least work pinned to it but not yet run. (Taking the
    highest-ranked ready op instead gives shorter schedules on paper that
    the FIFO simulator does not reproduce: 2.26 s planned, 2.50 s simulated
    on the InceptionV3 training step, 4 devices.)

    Each device keeps one heap of the ready ops it may run, by arrival; a
    step compares one candidate per device, so the whole schedule costs
    O(ops × devices × log ops). An op whose group was pinned elsewhere, or
    which no longer fits a device's memory, is dropped from that device's
    heap when it reaches the top (pins and memory use only grow).
    """
    t0 = time.perf_counter()
    st = _State(problem)
    rank = st.upward_rank()
    k, m = problem.k, st.s.m
    waiting = np.array([len(x) for x in st.preds])
    placed = np.zeros(m, dtype=bool)
    queues: list[list[tuple[float, float, int]]] = [[] for _ in range(k)]  # (arrival, -rank, op)

    def make_ready(v: int) -> None:
        st.push_arrival(queues, v, rank[v])

    def usable(v: int, d: int) -> bool:
        return not placed[v] and st.may_take(v, d)

    def candidate(d: int) -> tuple[float, float, float, int, int] | None:
        q = queues[d]
        while q and not usable(q[0][2], d):
            heapq.heappop(q)
        if not q:
            return None
        arrival, _, v = q[0]
        return (max(arrival, float(st.dev_free[d])), arrival, float(st.committed[d]), v, d)

    for v in np.flatnonzero(waiting == 0):
        make_ready(int(v))
    for _ in range(m):
        cands = [c for c in (candidate(d) for d in range(k)) if c is not None]
        if not cands:
            return None  # ops are left that no device can take (memory)
        est, _, _, v, d = min(cands)
        placed[v] = True
        st.place(v, d, est)
        for _, w in st.succs[v]:
            waiting[w] -= 1
            if waiting[w] == 0:
                make_ready(w)
    return finish(problem, _groups(st), "etf", t0, options)


@solver("cp_heft", requires=(acyclic_schedule,))
def cp_heft(problem: PlacementProblem, options: SolveOptions) -> Solution | None:
    """Critical path first, each op where it finishes first, and each device's order kept in the plan.

    A list schedule over the fine DAG: of the ready ops (inputs placed), the one with the longest path
    of fastest times to an exit goes next (HLFET's priority), to the device where it would finish first
    (HEFT's choice: its inputs' transfers, the device free, group pins, memory). Each device's ops in the
    order they were scheduled are the plan's :mod:`order <placer.core.order>`: emitted as control edges,
    so the executor runs them so (TensorFlow's executor would take them as they become ready, which
    holds critical ops behind others: this schedule in ready order simulated 2.30 s on the InceptionV3
    training step on 4 devices, 1.90 s in its own order, ``benchmarks/results/execution_order.md``). A
    simulated objective scores the plan in its order; others ignore the order.

    Examples
    --------
    A 3 s chain ``a -> c`` beside ``b`` (1.5 s) on one device: the executor would run ``b`` (ready first)
    between ``a`` and ``c``; the plan runs the critical path first.

    >>> import numpy as np
    >>> from cost_models import TensorEdge
    >>> p = PlacementProblem.build(names=["a", "b", "c"], compute_s=np.array([[1.0], [1.5], [2.0]]),
    ...     memory_bytes=np.zeros(3), capacity_bytes=np.full(1, np.inf), tensors=[TensorEdge(0, (2,), 8.0)],
    ...     bandwidth=np.full((1, 1), 1e9), latency=np.zeros((1, 1)))
    >>> s = cp_heft(p, SolveOptions(objective="latency"))
    >>> s.order, s.objective
    (((0, 2, 1),), 4.5)
    """
    t0 = time.perf_counter()
    st = _State(problem)
    m = st.s.m
    rank = _critical_ranks(st)
    pos = np.empty(m, dtype=int)
    pos[st.topo] = np.arange(m)
    waiting = [len(x) for x in st.preds]
    ready = [(-float(rank[v]), int(pos[v]), int(v)) for v in range(m) if waiting[v] == 0]
    heapq.heapify(ready)
    order: list[list[int]] = [[] for _ in range(problem.k)]
    while ready:
        _, _, v = heapq.heappop(ready)
        choice = st.earliest_finish(v, st.candidates(v))
        if choice is None:
            return None  # memory ran out
        st.place(v, choice[2], choice[3])
        order[choice[2]].append(v)
        for _, w in st.succs[v]:
            waiting[w] -= 1
            if waiting[w] == 0:
                heapq.heappush(ready, (-float(rank[w]), int(pos[w]), int(w)))
    return finish(problem, _groups(st), "cp_heft", t0, options, order=timed_only(order, st.s.durations_s, st.dev))


def _critical_ranks(st: _State) -> np.ndarray:
    """Per fine op: the longest path of fastest times from its start to an exit (HLFET's priority)."""
    s = st.s
    fastest = np.where(np.isfinite(s.durations_s), s.durations_s, np.inf).min(axis=1) if s.m else np.zeros(0)
    rank = np.zeros(s.m)
    for v in st.topo[::-1]:
        rank[v] = fastest[v] + max((rank[w] for _, w in st.succs[v]), default=0.0)
    return rank


@solver("cp_etf", requires=(acyclic_schedule,))
def cp_etf(problem: PlacementProblem, options: SolveOptions) -> Solution | None:
    """Critical path first among the ops a device can start now, and each device's order kept in the plan.

    Time-driven list scheduling (HLFET with transfers): each device, when it is free, takes the op with
    the longest path of fastest times to an exit among those whose inputs have arrived there (else it
    waits for the earliest to arrive, ties by that path); the device that can start first goes first.
    Where :func:`cp_heft` takes ops by priority and puts each where it finishes first (a device can wait
    for an urgent op while others could have run), this keeps devices busy; each wins on other graphs
    (the Transformer's training step on 4 devices: 168.9 ms, cp_heft 198.0; InceptionV3's on 8: cp_heft
    1652 ms, cp_etf 1655; ``benchmarks/results/execution_order.md``). Each device's ops in the order they
    ran are the plan's :mod:`order <placer.core.order>`.

    Each device keeps a heap of the ops whose inputs are placed, by arrival there, and a heap by priority
    of those that have arrived by the time it is free (its free time only grows); an op placed elsewhere,
    or whose group went elsewhere or no longer fits, is dropped when it reaches a top. O(ops × devices ×
    log ops).

    Examples
    --------
    Two devices, a 1 s op ``a`` feeding a 2 s ``c``, and ``b`` (1.5 s): ``a`` and ``b`` start at once, one
    per device, and ``c`` follows ``a`` without a transfer.

    >>> import numpy as np
    >>> from cost_models import TensorEdge
    >>> p = PlacementProblem.build(names=["a", "b", "c"], compute_s=np.array([[1.0, 1.0], [1.5, 1.5], [2.0, 2.0]]),
    ...     memory_bytes=np.zeros(3), capacity_bytes=np.full(2, np.inf), tensors=[TensorEdge(0, (2,), 8.0)],
    ...     bandwidth=np.full((2, 2), 1e3), latency=np.zeros((2, 2)))
    >>> s = cp_etf(p, SolveOptions(objective="latency"))
    >>> s.order, s.objective   # a device with one op has nothing to order
    (((0, 2), ()), 3.0)
    """
    t0 = time.perf_counter()
    st = _State(problem)
    rank = _critical_ranks(st)
    k, m = problem.k, st.s.m
    waiting = [len(x) for x in st.preds]
    placed = np.zeros(m, dtype=bool)
    pending: list[list[tuple[float, float, int]]] = [[] for _ in range(k)]  # (arrival, -rank, op)
    arrived: list[list[tuple[float, int]]] = [[] for _ in range(k)]  # (-rank, op), arrived by the device's free time

    def release(v: int) -> None:
        st.push_arrival(pending, v, rank[v])

    def usable(v: int, d: int) -> bool:
        return not placed[v] and st.may_take(v, d)

    def proposal(d: int) -> tuple[float, float, int, int] | None:
        free = float(st.dev_free[d])
        q, ready = pending[d], arrived[d]
        while q and q[0][0] <= free:
            _, r, v = heapq.heappop(q)
            heapq.heappush(ready, (r, v))
        while ready and not usable(ready[0][1], d):
            heapq.heappop(ready)
        if ready:
            return (free, ready[0][0], d, ready[0][1])
        while q and not usable(q[0][2], d):
            heapq.heappop(q)
        return (q[0][0], q[0][1], d, q[0][2]) if q else None

    for v in range(m):
        if waiting[v] == 0:
            release(v)
    order: list[list[int]] = [[] for _ in range(k)]
    for _ in range(m):
        cands = [c for c in (proposal(d) for d in range(k)) if c is not None]
        if not cands:
            return None  # ops are left that no device can take (memory)
        start, _, d, v = min(cands)
        placed[v] = True
        st.place(v, d, start)
        order[d].append(v)
        for _, w in st.succs[v]:
            waiting[w] -= 1
            if waiting[w] == 0:
                release(w)
    return finish(problem, _groups(st), "cp_etf", t0, options, order=timed_only(order, st.s.durations_s, st.dev))


def _groups(st: _State) -> np.ndarray:
    """Problem-node assignment from the scheduled fine ops (nodes without ops: least memory used)."""
    a = st.group_dev.copy()
    for g in np.flatnonzero(a < 0):
        ok = np.flatnonzero(st.group_ok[g])
        a[g] = ok[np.argmin(st.mem_used[ok])]
    return a


@solver("group_heft")
def group_heft(problem: PlacementProblem, options: SolveOptions) -> Solution | None:
    """HEFT with each problem node (a colocation or coarse group) as one unit of decision.

    The textbook algorithm on the contracted graph: groups whose dependencies
    form a cycle are merged into one unit (networkx's condensation); a unit's
    time on a device is the sum of its groups', its upward rank the mean time
    plus the longest mean-cost path to an exit; units go, by decreasing rank,
    to the device where the whole unit would finish first (inputs arrived,
    device free, memory left).

    With ``options.coarsen_keys`` (autoplace passes each node's Keras layer)
    it also runs with each key's nodes merged into one unit (a layer view: the
    ops of a layer seldom gain from being split, and the units are found
    whole, where op-level moves split a branch into pieces) and keeps the
    better plan: the two-branch CNN's forward pass on 4 devices, colocation
    groups only, 99.0 ms by groups, 50.9 ms by layers (its lower bound: 50.8).

    Examples
    --------
    Two independent 1 s groups after a free source, on two devices: one each.

    >>> import numpy as np
    >>> from cost_models import TensorEdge
    >>> p = PlacementProblem.build(names=["src", "a", "b"], compute_s=np.array([[0.0, 0.0], [1.0, 1.0], [1.0, 1.0]]),
    ...     memory_bytes=np.zeros(3), capacity_bytes=np.full(2, np.inf), tensors=[TensorEdge(0, (1, 2), 8.0)],
    ...     bandwidth=np.full((2, 2), 1e9), latency=np.zeros((2, 2)))
    >>> s = group_heft(p, SolveOptions(objective="latency"))
    >>> sorted(s.assignment[1:].tolist()), round(s.objective, 6)
    ([0, 1], 1.0)

    Keys that tie each of ``a`` and ``b`` to a 1 s node after it (two layers of
    two nodes): the layers are placed whole, one per device.

    >>> p = PlacementProblem.build(names=["src", "a", "b", "a2", "b2"], compute_s=np.r_[np.zeros((1, 2)),
    ...     np.ones((4, 2))], memory_bytes=np.zeros(5), capacity_bytes=np.full(2, np.inf),
    ...     tensors=[TensorEdge(0, (1, 2), 8.0), TensorEdge(1, (3,), 8.0), TensorEdge(2, (4,), 8.0)],
    ...     bandwidth=np.full((2, 2), 1e9), latency=np.zeros((2, 2)))
    >>> s = group_heft(p, SolveOptions(objective="latency", coarsen_keys=(None, "A", "B", "A", "B")))
    >>> s.assignment.tolist(), round(s.objective, 6)
    ([0, 0, 1, 0, 1], 2.0)
    """
    t0 = time.perf_counter()
    plans = [_heft_units(problem, np.arange(problem.n))]
    keys = options.coarsen_keys
    if keys is not None:
        first: dict = {}
        by_key = np.array([v if key is None else first.setdefault(key, v) for v, key in enumerate(keys)])
        if np.unique(by_key).size < problem.n:
            plans.append(_heft_units(problem, by_key))
    best = None
    for a in plans:
        sol = None if a is None else finish(problem, a, "group_heft", t0, options)
        if sol is not None and (best is None or sol.objective < best.objective):
            best = sol
    return best


def _heft_units(p: PlacementProblem, label: np.ndarray) -> np.ndarray | None:
    """HEFT's assignment of the problem's nodes with the nodes sharing a ``label`` one unit (merged further
    where their dependencies form a cycle), or ``None`` when some unit fits no device."""
    import networkx as nx

    g = nx.DiGraph()
    g.add_nodes_from(np.unique(label).tolist())
    g.add_edges_from((int(label[t.src]), int(label[d])) for t in p.tensors for d in t.dsts
                     if label[d] != label[t.src])
    g.add_edges_from((int(label[u]), int(label[v])) for u, v in p.control if label[u] != label[v])
    cond = nx.condensation(g)
    unit_of = np.array([cond.graph["mapping"][int(label[v])] for v in range(p.n)])
    units = cond.number_of_nodes()
    order = np.argsort(unit_of, kind="stable")
    members = np.split(order, np.flatnonzero(np.diff(unit_of[order])) + 1) if p.n else []
    work = np.array([p.compute_s[m].sum(axis=0) for m in members]).reshape(units, p.k)
    memory = np.array([p.memory_bytes[m].sum() for m in members])
    preds: list[list[tuple[int, int]]] = [[] for _ in range(units)]  # (tensor index, producer unit)
    succ_cost: list[list[tuple[float, int]]] = [[] for _ in range(units)]
    for ti, (t, mean) in enumerate(zip(p.tensors, _mean_transfer_s(p, p.tensors))):
        su = int(unit_of[t.src])
        for du in {int(unit_of[d]) for d in t.dsts} - {su}:
            preds[du].append((ti, su))
            succ_cost[su].append((mean, du))
    for u, v in p.control:
        su, du = int(unit_of[u]), int(unit_of[v])
        if su != du:
            preds[du].append((-1, su))
            succ_cost[su].append((0.0, du))
    finite = np.where(np.isfinite(work), work, np.nan)
    wbar = np.nan_to_num(np.nanmean(finite, axis=1)) if units else np.zeros(0)
    topo = list(nx.topological_sort(cond))
    pos = np.empty(units, dtype=int)
    pos[topo] = np.arange(units)
    rank = np.zeros(units)
    for u in reversed(topo):
        rank[u] = wbar[u] + max((c + rank[w] for c, w in succ_cost[u]), default=0.0)
    dev = np.full(units, -1)
    done = np.zeros(units)
    free = np.zeros(p.k)
    used = np.zeros(p.k)
    cap = p.capacity_bytes * (1 + 1e-9)
    for u in sorted(range(units), key=lambda u: (-rank[u], pos[u])):  # predecessors first
        best = None
        for d in np.flatnonzero(np.isfinite(work[u]) & (used + memory[u] <= cap)):
            ready = max((done[s] + (0.0 if ti < 0 else p.transfer_s(p.tensors[ti], int(dev[s]), int(d)))
                         for ti, s in preds[u]), default=0.0)
            end = max(ready, free[d]) + work[u, d]
            if best is None or (end, used[d], d) < best:
                best = (end, used[d], int(d))
        if best is None:
            return None  # no device has the memory (or a kernel) for this unit
        end, _, d = best
        dev[u], done[u], free[d] = d, end, end
        used[d] += memory[u]
    return dev[unit_of]
