"""The placement problem handed to solvers: plain arrays, no TensorFlow.

A :class:`PlacementProblem` is what every solver takes; :func:`evaluate`
computes the pipelined *max-load* objective of Tarnawski et al.
(NeurIPS'20) for any assignment: a device's load is the compute of its ops
plus the transfer time of every tensor it sends to another device (charged
once per tensor) and of every tensor it receives (charged once per receiving
device).

Examples
--------
>>> import numpy as np
>>> from cost_models import TensorEdge
>>> p = PlacementProblem.build(
...     names=["a", "b"], compute_s=np.array([[1.0, 1.0], [1.0, 1.0]]),
...     memory_bytes=np.zeros(2), capacity_bytes=np.full(2, np.inf),
...     tensors=[TensorEdge(0, (1,), 1e3)], bandwidth=np.full((2, 2), 1e6),
...     latency=np.zeros((2, 2)))
>>> evaluate(p, np.array([0, 0])).objective
2.0
>>> evaluate(p, np.array([0, 1])).objective   # 1 s compute + 1 ms send / receive
1.001
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Hashable, Sequence

import numpy as np

from cost_models import Link, SimOptions, TensorEdge
from cost_models.simulate import checked_ready_order

from ..errors import CostError, GraphError


def _frozen(a: np.ndarray, dtype: type = float) -> np.ndarray:
    """A read-only copy of ``a`` (problems are immutable)."""
    a = np.array(a, dtype=dtype)
    a.setflags(write=False)
    return a


@dataclass(frozen=True)
class Schedule:
    """The dataflow DAG that a problem's nodes stand for (for schedule-aware objectives).

    A coarse problem places *groups*; its latency is still simulated on the
    fine ops. ``group[i]`` is the problem node that fine node ``i`` belongs to.

    Attributes
    ----------
    durations_s : numpy.ndarray
        ``(m, k)`` seconds of fine node ``i`` on device ``d`` (``inf`` = not allowed).
    tensors : tuple of TensorEdge
        Data dependencies between fine nodes.
    control : tuple of (int, int)
        Ordering-only dependencies between fine nodes.
    group : numpy.ndarray
        ``(m,)`` problem node of each fine node.
    fed : tuple of int
        The fine nodes whose outputs the step's caller feeds (the model's inputs:
        ``cost_models.SimOptions.fed``).
    """

    durations_s: np.ndarray
    tensors: tuple[TensorEdge, ...]
    control: tuple[tuple[int, int], ...]
    group: np.ndarray
    fed: tuple[int, ...] = ()

    @property
    def m(self) -> int:
        """Number of fine nodes."""
        return int(self.durations_s.shape[0])

    def regroup(self, coarse_of: np.ndarray) -> "Schedule":
        """The same DAG, with problem nodes merged by ``coarse_of[old] = new``."""
        return Schedule(self.durations_s, self.tensors, self.control, _frozen(np.asarray(coarse_of)[self.group], int),
                        self.fed)


Edge = tuple[int, int]  # (tensor index, or -1 for a control edge; the other node)


def dependencies(m: int, tensors: Sequence[TensorEdge],
                 control: Sequence[tuple[int, int]] = ()) -> tuple[list[list[Edge]], list[list[Edge]]]:
    """Per node: its incoming ``(tensor, producer)`` and outgoing ``(tensor, consumer)`` edges.

    A tensor consumed by its own producer and a control edge from a node to
    itself are dropped; control edges carry tensor index ``-1``.

    Examples
    --------
    >>> preds, succs = dependencies(3, [TensorEdge(0, (1, 2), 1.0)], control=[(1, 2)])
    >>> preds[2], succs[0]
    ([(0, 0), (-1, 1)], [(0, 1), (0, 2)])
    """
    preds: list[list[Edge]] = [[] for _ in range(m)]
    succs: list[list[Edge]] = [[] for _ in range(m)]
    for ti, t in enumerate(tensors):
        for w in sorted(set(t.dsts) - {t.src}):
            preds[w].append((ti, t.src))
            succs[t.src].append((ti, w))
    for u, w in control:
        if u != w:
            preds[w].append((-1, u))
            succs[u].append((-1, w))
    return preds, succs


def topological_order(m: int, tensors: Sequence[TensorEdge], control: Sequence[tuple[int, int]] = ()) -> np.ndarray:
    """Kahn's order of ``m`` nodes (ties by index), or :class:`GraphError` on a cycle.

    Examples
    --------
    >>> topological_order(3, [TensorEdge(2, (0,), 1.0)]).tolist()
    [1, 2, 0]
    """
    preds, succs = dependencies(m, tensors, control)
    indeg = np.array([len(p) for p in preds], dtype=int)
    heap = [int(v) for v in np.flatnonzero(indeg == 0)]
    heapq.heapify(heap)
    out = []
    while heap:
        v = heapq.heappop(heap)
        out.append(v)
        for _, w in succs[v]:
            indeg[w] -= 1
            if indeg[w] == 0:
                heapq.heappush(heap, w)
    if len(out) != m:
        stuck = int(np.flatnonzero(indeg > 0)[0])
        raise GraphError(f"the graph has a cycle through node {stuck}; placement needs a DAG")
    return np.array(out, dtype=int)


def group_tensors(tensors: Sequence[TensorEdge], group_of: Sequence[int] | np.ndarray) -> list[TensorEdge]:
    """Tensors between groups: a tensor's consumers in its producer's group drop out, and
    tensors with the same producer group and consumer groups merge (bytes and counts add).

    Examples
    --------
    >>> group_tensors([TensorEdge(0, (1, 2), 8.0), TensorEdge(1, (2,), 4.0)], [0, 0, 1])
    [TensorEdge(src=0, dsts=(1,), nbytes=12.0, count=2)]
    """
    merged: dict[tuple[int, tuple[int, ...]], list[float]] = {}
    for t in tensors:
        s = int(group_of[t.src])
        d = tuple(sorted({int(group_of[w]) for w in t.dsts} - {s}))
        if d:
            acc = merged.setdefault((s, d), [0.0, 0])
            acc[0] += t.nbytes
            acc[1] += t.count
    return [TensorEdge(s, d, nb, int(c)) for (s, d), (nb, c) in sorted(merged.items())]


def _checked_memory(memory_bytes: Any, capacity_bytes: Any, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Node memory (finite, non-negative, one per node) and device capacities (positive, ``inf`` for
    unlimited, one per device) as float arrays; raises :class:`CostError` otherwise."""
    mem = np.asarray(memory_bytes, dtype=float)
    if mem.shape != (n,) or not np.isfinite(mem).all() or (mem < 0).any():
        raise CostError("memory_bytes must be finite, non-negative, one per node")
    cap = np.asarray(capacity_bytes, dtype=float)
    if cap.shape != (k,) or np.isnan(cap).any() or (cap <= 0).any():
        raise CostError("capacity_bytes must be positive (inf for unlimited), one per device")
    return mem, cap


@dataclass(frozen=True)
class PlacementProblem:
    """Nodes × devices costs, memory and tensors of one placement problem.

    Attributes
    ----------
    names : tuple of str
        Node names (coarse groups or ops).
    compute_s : numpy.ndarray
        ``(n, k)`` seconds of node ``v`` on device ``d``; ``inf`` = not allowed.
    memory_bytes : numpy.ndarray
        ``(n,)`` resident bytes of each node.
    capacity_bytes : numpy.ndarray
        ``(k,)`` device capacities (``inf`` = unlimited).
    tensors : tuple of TensorEdge
        Data moving between nodes.
    bandwidth, latency : numpy.ndarray
        ``(k, k)`` link bandwidth (bytes/s) and latency (s).
    order : tuple of int
        A topological order of the nodes (for contiguous splits).
    symmetric : bool
        Devices are interchangeable (same costs, capacity and links).
    control : tuple of (int, int)
        Ordering-only dependencies between nodes.
    schedule : Schedule or None
        The fine DAG behind coarse nodes; ``None``: the nodes themselves.
    shared : tuple of (tuple of int, float, float)
        Groups of devices that share one processor, with the group's
        capacity and how much of it one device can use alone
        (``cost_models.SimOptions.shared``).
    transfer_cpu : numpy.ndarray or None
        ``(k, k)`` CPU seconds a transfer costs on each end (calibrated gRPC
        links; ``cost_models.SimOptions.transfer_cpu_s``); ``None``: not modelled.
    ready_order : {"fifo", "lifo"} or None
        Which ready op the devices' executors run next
        (``cost_models.SimOptions.ready_order``; ``None``: ``"fifo"``).
    measured_links : tuple of ((int, int), cost_models.Link)
        Links whose transfer times are read from their measurements (``Link.points``: a calibrated link's
        time per byte depends on the size) by :meth:`occupancy_seconds`, :meth:`link_seconds` and
        :meth:`transfer_s`; ``bandwidth`` and ``latency`` stay their fitted line (the solvers' linear
        models).
    memory_pools : tuple of (float or None)
        Per device (empty: none), the limit of its allocator's pool where the simulated peak replays it
        (``cost_models.SimOptions.memory_pools``; ``placer.core.devices.DeviceSet.memory_pools``). Kept when
        :meth:`with_memory` lowers the capacities the solvers see.
    memory_pool_history : tuple of tuple of (key, bytes)
        Per device (empty: none), what its pool served before the step, replayed first
        (``cost_models.SimOptions.memory_pool_history``; ``placer.core.devices.DeviceSet.pool_history``).
    """

    names: tuple[str, ...]
    compute_s: np.ndarray
    memory_bytes: np.ndarray
    capacity_bytes: np.ndarray
    tensors: tuple[TensorEdge, ...]
    bandwidth: np.ndarray
    latency: np.ndarray
    order: tuple[int, ...]
    symmetric: bool
    control: tuple[tuple[int, int], ...] = ()
    schedule: Schedule | None = None
    shared: tuple[tuple[tuple[int, ...], float, float], ...] = ()
    transfer_cpu: np.ndarray | None = None
    ready_order: str | None = None
    measured_links: tuple[tuple[tuple[int, int], Link], ...] = ()
    memory_pools: tuple[float | None, ...] = ()
    memory_pool_history: tuple[tuple[tuple[Hashable, float], ...], ...] = ()
    _memo: dict = field(default_factory=dict, init=False, compare=False, repr=False)

    @property
    def n(self) -> int:
        """Number of nodes."""
        return len(self.names)

    @property
    def k(self) -> int:
        """Number of devices."""
        return self.compute_s.shape[1]

    @classmethod
    def build(
        cls,
        *,
        names: Sequence[str],
        compute_s: np.ndarray,
        memory_bytes: np.ndarray,
        capacity_bytes: np.ndarray,
        tensors: Sequence[TensorEdge],
        bandwidth: np.ndarray,
        latency: np.ndarray,
        order: Sequence[int] | None = None,
        control: Sequence[tuple[int, int]] = (),
        schedule: Schedule | None = None,
        shared: Sequence[tuple[Sequence[int], float] | tuple[Sequence[int], float, float]] = (),
        transfer_cpu: np.ndarray | None = None,
        ready_order: str | None = None,
        measured_links: Sequence[tuple[tuple[int, int], Link]] = (),
        memory_pools: Sequence[float | None] = (),
        memory_pool_history: Sequence[Sequence[tuple[Hashable, float]]] = (),
    ) -> "PlacementProblem":
        """Validate the arrays and build a frozen problem.

        Raises
        ------
        CostError
            On NaN or negative costs, memory or bandwidth.
        GraphError
            On shapes that disagree or tensor endpoints out of range.
        """
        c = np.asarray(compute_s, dtype=float)
        n = len(names)
        if c.ndim != 2 or c.shape[0] != n or c.shape[1] < 1:
            raise GraphError(f"compute_s must have shape (n={n}, k>=1), got {c.shape}")
        k = c.shape[1]
        bad = np.argwhere(np.isnan(c) | (c < 0))
        if bad.size:
            v, d = bad[0]
            raise CostError(f"node {names[v]!r} has invalid compute cost {c[v, d]!r} on device {d}")
        unplaceable = np.flatnonzero(~np.isfinite(c).any(axis=1))
        if unplaceable.size:
            raise GraphError(f"node {names[unplaceable[0]]!r} is allowed on no device (infinite cost everywhere)")
        mem, cap = _checked_memory(memory_bytes, capacity_bytes, n, k)
        bw = np.asarray(bandwidth, dtype=float)
        lat = np.asarray(latency, dtype=float)
        if bw.shape != (k, k) or lat.shape != (k, k):
            raise GraphError(f"bandwidth and latency must be ({k}, {k})")
        off = ~np.eye(k, dtype=bool)
        if (bw[off] <= 0).any() or np.isnan(bw).any() or (lat < 0).any() or np.isnan(lat).any():
            raise CostError("link bandwidths must be positive and latencies non-negative")
        for t in tensors:
            if not (0 <= t.src < n) or any(not (0 <= v < n) for v in t.dsts):
                raise GraphError(f"tensor {t} names a node outside 0..{n - 1}")
            if not np.isfinite(t.nbytes) or t.nbytes < 0:
                raise CostError(f"tensor from node {names[t.src]!r} has invalid size {t.nbytes!r}")
        order_t = tuple(range(n)) if order is None else tuple(int(i) for i in order)
        if sorted(order_t) != list(range(n)):
            raise GraphError("order must be a permutation of the nodes")
        control_t = tuple((int(u), int(v)) for u, v in control)
        if any(not (0 <= u < n and 0 <= v < n) for u, v in control_t):
            raise GraphError(f"a control edge names a node outside 0..{n - 1}")
        if schedule is not None:
            if schedule.durations_s.shape[1] != k or schedule.group.shape != (schedule.m,):
                raise GraphError("schedule durations must have one column per device and one group per fine node")
            if schedule.m and (schedule.group.min() < 0 or schedule.group.max() >= n):
                raise GraphError(f"schedule groups must lie in 0..{n - 1}")
        try:
            shared_t = SimOptions(shared=tuple((tuple(g[0]), *map(float, g[1:])) for g in shared)).checked_shares(k)
        except (TypeError, ValueError) as e:
            raise GraphError(f"bad shared device groups: {e}") from None
        symmetric = bool(
            np.allclose(c, c[:, :1]) and np.allclose(cap, cap[0])
            and (k < 2 or (np.allclose(bw[off], bw[off][0]) and np.allclose(lat[off], lat[off][0])))
            and (not shared_t or (len(shared_t) == 1 and len(shared_t[0][0]) == k))
        )
        cpu = None
        if transfer_cpu is not None:
            cpu = np.asarray(transfer_cpu, dtype=float)
            if cpu.shape != (k, k) or not np.isfinite(cpu).all() or (cpu < 0).any():
                raise CostError(f"transfer_cpu must be a finite non-negative ({k}, {k}) array")
            cpu = _frozen(cpu) if cpu.any() else None
        checked_ready_order(ready_order, GraphError)
        measured_t = tuple(((int(i), int(j)), link) for (i, j), link in measured_links if link.points)
        if any(not (0 <= i < k and 0 <= j < k) or i == j for (i, j), _ in measured_t):
            raise GraphError(f"a measured link names a device pair outside 0..{k - 1} or one device twice")
        if measured_t:  # twin devices: every pair measured alike
            symmetric = symmetric and len(measured_t) == k * (k - 1) and len({x.points for _, x in measured_t}) == 1
        pools = tuple(None if p is None else float(p) for p in memory_pools)
        if pools and (len(pools) != k or any(p is not None and not p > 0 for p in pools)):
            raise GraphError(f"memory_pools must be empty or one positive limit (or None) per device, not {pools}")
        history = tuple(tuple((key, float(b)) for key, b in events) for events in memory_pool_history)
        if history and len(history) != k:
            raise GraphError(f"memory_pool_history must be empty or one sequence of events per device, "
                             f"not {len(history)} for {k} devices")
        symmetric = symmetric and len(set(pools)) <= 1 and len(set(history)) <= 1
        return cls(tuple(names), _frozen(c), _frozen(mem), _frozen(cap), tuple(tensors),
                   _frozen(bw), _frozen(lat), order_t, symmetric, control_t, schedule, shared_t, cpu, ready_order,
                   measured_t, pools, history)

    def with_memory(self, *, memory_bytes: np.ndarray | None = None,
                    capacity_bytes: np.ndarray | None = None) -> "PlacementProblem":
        """The same problem with other node memory or device capacities (``None``: kept).

        The planner charges nodes for the activations they keep live this way
        (see ``placer.planner``).

        Raises
        ------
        CostError
            Memory that is not finite and non-negative (one per node), or
            capacities that are not positive (``inf`` for unlimited, one per device).

        Examples
        --------
        >>> p = PlacementProblem.build(names=["a", "b"], compute_s=np.ones((2, 2)), memory_bytes=np.array([1.0, 2.0]),
        ...     capacity_bytes=np.full(2, 4.0), tensors=[], bandwidth=np.full((2, 2), 1e9), latency=np.zeros((2, 2)))
        >>> q = p.with_memory(memory_bytes=[3.0, 2.0], capacity_bytes=[4.0, 8.0])
        >>> q.memory_bytes.tolist(), q.capacity_bytes.tolist(), q.symmetric, p.memory_bytes.tolist()
        ([3.0, 2.0], [4.0, 8.0], False, [1.0, 2.0])
        """
        mem, cap = _checked_memory(self.memory_bytes if memory_bytes is None else memory_bytes,
                                   self.capacity_bytes if capacity_bytes is None else capacity_bytes, self.n, self.k)
        return replace(self, memory_bytes=_frozen(mem), capacity_bytes=_frozen(cap),
                       symmetric=self.symmetric and bool(np.allclose(cap, cap[0])))

    def sim_options(self, options: "SimOptions | None" = None) -> "SimOptions":
        """``options`` (default: the step only) with what this problem knows of its devices (shared
        processors, transfer CPU costs, the order their executors run ready ops, allocator pools) and of its
        schedule (the nodes the caller feeds)."""
        base = options or SimOptions(peak_memory=False)
        fed = () if self.schedule is None else self.schedule.fed  # a problem without a schedule knows of none
        return replace(base, shared=base.shared or self.shared, fed=base.fed or frozenset(fed),
                       transfer_cpu_s=base.transfer_cpu_s if base.transfer_cpu_s is not None else self.transfer_cpu,
                       ready_order=base.ready_order or self.ready_order,
                       memory_pools=base.memory_pools or self.memory_pools,
                       memory_pool_history=base.memory_pool_history or self.memory_pool_history)

    def parallel_devices(self) -> float:
        """How many ops' worth of work can run at once: one per device, a shared group's capacity for its devices."""
        return float(self.k - sum(len(g) - c for g, c, _ in self.shared))

    def memo(self, key: str, compute: Callable[[], Any]) -> Any:
        """``compute()`` once per problem (bounds, orders): the problem is immutable."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def schedule_order(self) -> np.ndarray:
        """A topological order of the schedule's fine nodes (cached)."""
        s = self.schedule_view()
        return self.memo("schedule_order", lambda: topological_order(s.m, s.tensors, s.control))

    def schedule_view(self) -> Schedule:
        """The fine DAG to simulate (the nodes themselves when there is no coarser view)."""
        if self.schedule is not None:
            return self.schedule
        return Schedule(self.compute_s, self.tensors, self.control, _frozen(np.arange(self.n), int))

    def _measured(self, i: int, j: int) -> Link | None:
        if not self.measured_links:
            return None
        return self.memo("measured_links", lambda: dict(self.measured_links)).get((i, j))

    def occupancy_seconds(self, i: int, j: int, nbytes: float) -> float:
        """Seconds ``nbytes`` occupy the link ``i -> j`` (bandwidth only; latency overlaps)."""
        if i == j or nbytes <= 0:
            return 0.0
        link = self._measured(i, j)
        if link is not None:  # the measured time less the latency the simulator adds on arrival
            return max(link.seconds(nbytes) - float(self.latency[i, j]), 0.0)
        return float(nbytes / self.bandwidth[i, j])

    def link_seconds(self, i: int, j: int, nbytes: float) -> float:
        """Seconds for one tensor of ``nbytes`` from device ``i`` to ``j`` (0 on one device)."""
        if i == j or nbytes <= 0:
            return 0.0
        link = self._measured(i, j)
        if link is not None:
            return float(max(link.seconds(nbytes), self.latency[i, j]))
        return float(self.latency[i, j] + nbytes / self.bandwidth[i, j])

    def transfer_s(self, t: TensorEdge, i: int, j: int) -> float:
        """Seconds to move tensor edge ``t`` from device ``i`` to ``j``."""
        if i == j or t.nbytes <= 0:
            return 0.0
        if self._measured(i, j) is not None:
            return t.count * self.link_seconds(i, j, t.nbytes / t.count)
        return t.count * self.latency[i, j] + t.nbytes / self.bandwidth[i, j]


@dataclass(frozen=True)
class Evaluation:
    """Objective and per-device breakdown of one assignment."""

    objective: float
    compute_s: np.ndarray
    comm_s: np.ndarray
    memory_bytes: np.ndarray
    traffic_bytes: np.ndarray
    feasible: bool

    @property
    def load_s(self) -> np.ndarray:
        """Compute plus communication seconds per device."""
        return self.compute_s + self.comm_s


def evaluate(problem: PlacementProblem, assignment: np.ndarray) -> Evaluation:
    """Max-load objective of ``assignment`` (device index per node).

    ``feasible`` is False where a node sits on a device it may not use or a
    device's memory is over capacity; ``objective`` is then ``inf``.
    """
    a = np.asarray(assignment, dtype=int)
    p = problem
    if a.shape != (p.n,) or (a < 0).any() or (a >= p.k).any():
        raise GraphError(f"assignment must give a device index in 0..{p.k - 1} for each of {p.n} nodes")
    per_node = p.compute_s[np.arange(p.n), a]
    comp = np.bincount(a, weights=np.where(np.isfinite(per_node), per_node, 0.0), minlength=p.k)
    mem = np.bincount(a, weights=p.memory_bytes, minlength=p.k)
    comm = np.zeros(p.k)
    traffic = np.zeros((p.k, p.k))
    for t in p.tensors:
        s = a[t.src]
        recv = {int(a[v]) for v in t.dsts} - {int(s)}
        if not recv:
            continue
        comm[s] += max(p.transfer_s(t, s, r) for r in recv)
        for r in recv:
            comm[r] += p.transfer_s(t, s, r)
            traffic[s, r] += t.nbytes
    feasible = bool(np.isfinite(per_node).all() and (mem <= p.capacity_bytes * (1 + 1e-9)).all())
    per_device = comp.copy()
    load = 0.0
    for devs, c, alone in p.shared:  # one processor doing c ops' worth at once, one device up to `alone`
        per_device[list(devs)] /= alone
        load = max(load, float(comp[list(devs)].sum()) / c)
    load = max(load, float((per_device + comm).max()))
    obj = load if feasible else float("inf")
    return Evaluation(obj, comp, comm, mem, traffic, feasible)


def trivial_lower_bound(problem: PlacementProblem) -> float:
    """max(largest single node, total work / parallel devices), communication free.

    A node on a shared processor may overlap its ops up to the processor's capacity, so its own
    term is divided by the largest capacity.
    """
    best = problem.compute_s.min(axis=1)
    if best.size == 0:
        return 0.0
    overlap = max([alone for _, _, alone in problem.shared], default=1.0)
    return float(max(best.max() / overlap, best.sum() / problem.parallel_devices()))
