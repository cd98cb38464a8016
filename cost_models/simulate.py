"""Discrete-event simulation of a placed dataflow graph (no TensorFlow).

Semantics (TensorFlow's dataflow executor, simplified):

* an op becomes *ready* when every tensor it consumes has arrived on its
  device and every control predecessor has finished;
* each device runs ``concurrency`` ops at a time (default 1). Which ready op
  goes next is ``ready_order``: ``"fifo"`` (the default, which the ETF
  heuristic's list schedule follows) takes the earliest ready first;
  ``"lifo"`` takes the one that became ready last, depth first (ops that
  take no time first, as the executor runs inexpensive ops inline), as
  TensorFlow's executor with *one* inter-op thread does (a finished op's
  successor runs inline and other ready ops go to the front of the thread's
  queue; a trace of two such gRPC workers running the multi-tower MLP
  showed each tower run to its end before the next began). Ops that became
  ready at the same time go by when the event that made them ready
  happened (an op's end: the successor of the op that just ended goes
  first), then by the lower node index (the topological order); with
  ``"fifo"``, by the lower node index;
* ``"priority"`` (a plan's own order, not an executor's: the simulation
  only) takes the ready op of highest ``SimOptions.priority`` first (ties:
  the lower node index); a planner scores an assignment so with the order
  it would then prescribe (:mod:`placer.core.order`);
* a tensor consumed on another device is sent **once per destination
  device** when its producer finishes; each ordered link carries one
  transfer at a time, in the order the transfers were issued;
* devices may **share a processor** (``SimOptions.shared``): logical CPU
  devices of one process are one processor (its cores, and one inter-op
  thread pool for all of them), and each op's profiled time was measured
  with those cores to itself. A group of capacity ``c`` runs its running
  ops at rate ``min(1, c / running)`` each (processor sharing), and each
  of its devices may run up to ``ceil(c)`` ops at once, as one device's
  independent ops overlap in the pool too. So four logical devices whose
  measured capacity is 1.2 do 1.2 ops' worth of work at once, placed on
  one of them or spread over all four.

Examples
--------
A chain of two ops on two devices with a 1 ms link:

>>> import numpy as np
>>> r = simulate(np.array([[1.0, 1.0], [2.0, 2.0]]), [TensorEdge(0, (1,), 10.0)], [0, 1],
...              link_seconds=lambda i, j, b: 1e-3 * (b > 0))
>>> round(r.step_time_s, 6)
3.001
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Callable, Hashable, Mapping, Sequence

import numpy as np

from .pool import replay_pool

#: Values of ``SimOptions.ready_order`` for an executor (a device's).
READY_ORDERS = ("fifo", "lifo")
#: The further value :func:`simulate` takes: each device runs its ready op of highest ``SimOptions.priority``.
PRIORITY = "priority"


def checked_ready_order(order: str | None, error: type[Exception] = ValueError,
                        also: Mapping[str, str] | None = None) -> str | None:
    """``order`` if it is one of :data:`READY_ORDERS`, ``None`` or a key of ``also`` (further values a caller
    takes, each with what it means); else raises ``error`` saying which to use.

    Examples
    --------
    >>> checked_ready_order("lifo"), checked_ready_order(None)
    ('lifo', None)
    """
    if order is not None and order not in READY_ORDERS and order not in (also or {}):
        more = "".join(f"{value!r} ({meaning}), " for value, meaning in (also or {}).items())
        raise error(f"ready_order must be {more}'fifo' (devices with several inter-op threads), 'lifo' (one "
                    f"inter-op thread: depth first) or None (fifo), got {order!r}")
    return order


@dataclass(frozen=True)
class TensorEdge:
    """A (group of) tensor(s) produced by ``src`` and consumed by ``dsts``.

    ``count`` is how many distinct tensors were merged into this edge (each
    pays the link latency once).
    """

    src: int
    dsts: tuple[int, ...]
    nbytes: float
    count: int = 1


@dataclass(frozen=True)
class SimResult:
    """Outcome of :func:`simulate`.

    Attributes
    ----------
    step_time_s : float
        Makespan of one step.
    busy_s : numpy.ndarray
        Compute seconds per device.
    link_bytes : numpy.ndarray
        ``(k, k)`` bytes sent from device ``i`` to device ``j``.
    timeline : tuple
        ``(node, device, start_s, end_s)`` per op, in start order.
    transfers : tuple
        ``(tensor_index, src_device, dst_device, start_s, end_s)``.
    peak_memory_bytes : numpy.ndarray
        Per device: resident bytes plus the largest sum of live tensors. A
        tensor is live on its producer's device from the producer's start
        until its last local consumer and its last outgoing transfer end, and
        on a receiving device from the transfer's start until the last
        consumer there ends (no memory reuse inside ops is modelled).
    live_at_peak_bytes : numpy.ndarray
        Per node: the bytes of the tensors it produced that are live at the
        peak of a device holding them (its own, or one it sent them to, at
        the first moment that device reached its peak). Summed over the
        nodes: the peaks less the resident bytes. Zeros without
        ``SimOptions.peak_memory``.
    snapshots : Snapshots or None
        See :func:`simulate`'s ``resume``.
    simulated_ops : int
        How many ops this simulation ran (all of them unless it resumed).
    """

    step_time_s: float
    busy_s: np.ndarray
    link_bytes: np.ndarray
    timeline: tuple[tuple[int, int, float, float], ...]
    transfers: tuple[tuple[int, int, int, float, float], ...]
    peak_memory_bytes: np.ndarray
    live_at_peak_bytes: np.ndarray
    #: States the simulation passed through, to continue it after a change of assignment
    #: (``SimOptions.snapshots``; ``None`` without them).
    snapshots: "Snapshots | None" = field(default=None, compare=False, repr=False)
    #: Ops simulated to get this result (fewer than the nodes when it continued another's snapshot).
    simulated_ops: int = field(default=0, compare=False)  # every simulate() path sets it


def _check_costs(durations: np.ndarray, assignment: np.ndarray) -> None:
    n = durations.shape[0]
    if assignment.shape != (n,):
        raise ValueError(f"assignment has shape {assignment.shape}, expected ({n},)")
    chosen = durations[np.arange(n), assignment]
    bad = np.flatnonzero(~np.isfinite(chosen) | (chosen < 0))
    if bad.size:
        raise ValueError(
            f"node {int(bad[0])} has duration {chosen[bad[0]]!r} on device {int(assignment[bad[0]])}; "
            "durations must be finite and non-negative"
        )


@dataclass(frozen=True)
class MemoryTraits:
    """Per-node facts the memory model reads (all optional; ``None``: none of the nodes has it).

    Attributes
    ----------
    resident_bytes : sequence of float, optional
        Bytes each node keeps on its device for the whole step (variables).
    aliasing : sequence of bool, optional
        Nodes whose outputs share an existing buffer (a variable read, a
        reshape): their outputs allocate nothing on the producing device.
    inplace : sequence of bool, optional
        Nodes that may write their output into an input buffer of the same
        size when they are its last reader (TensorFlow forwards such buffers
        for element-wise ops).
    held : sequence of bool, optional
        Nodes whose outputs stay allocated until the step ends: the inputs a
        caller feeds (its call frame holds them; a remote worker measured
        here kept a fed 0.5 MB input for the whole step).
    """

    resident_bytes: Sequence[float] | None = None
    aliasing: Sequence[bool] | None = None
    inplace: Sequence[bool] | None = None
    held: Sequence[bool] | None = None

    def padded(self, n: int, pad: int, aliasing: Sequence[bool]) -> "MemoryTraits":
        """The traits of ``n`` nodes followed by ``pad`` extra nodes (with the given ``aliasing``)."""

        def ext(xs: Sequence | None, fill: object) -> list | None:
            return None if xs is None else [*xs, *([fill] * pad)]

        return MemoryTraits(ext(self.resident_bytes, 0.0), [*(self.aliasing or [False] * n), *aliasing],
                            ext(self.inplace, False), ext(self.held, False))


@dataclass(frozen=True, kw_only=True)
class SimOptions:
    """How :func:`simulate` runs a step (defaults: TensorFlow's executor, simplified).

    Attributes
    ----------
    concurrency : int
        Ops a device runs at once.
    ready_order : {"fifo", "lifo", "priority"} or None
        Which of a device's ready ops runs next: the earliest ready, the
        latest ready, or the one of highest :attr:`priority` (see the module
        docstring). ``None``: whoever fills in the options decides (a
        placement problem: its devices' order), else ``"fifo"``.
    priority : sequence of float, optional
        Per node, its priority under ``ready_order="priority"`` (required
        there, ignored otherwise). Only the plain simulation takes that order
        (not ``shared``, ``transfer_cpu_s`` nor ``acknowledged``).
    transfer_cpu_s : numpy.ndarray, optional
        ``(k, k)`` compute time one tensor sent from ``i`` to ``j`` takes on
        *each* of the two devices (serialisation and RPC handling; TensorFlow's
        ``_Send``/``_Recv``). Each such transfer becomes a send op on the
        producer's device and a receive op on the consumer's, which queue like
        any op; the timeline lists original ops only (their busy time counts).
    time_factor : sequence of float, optional
        One factor per device multiplying its op times: a device measured 20%
        slower than the one its kind was profiled on gets 1.2.
    peak_memory : bool
        Compute each device's peak memory (``False``: ``SimResult.peak_memory_bytes``
        is all zeros; a step-time score does not need it, and on 50k-op graphs
        it is half the simulation's time).
    shared : tuple of (tuple of int, float) or (tuple of int, float, float)
        Groups of devices that share one processor, each with its capacity:
        how many ops' worth of work the group does at once (measured by
        :func:`placer.tf.timing.measure_shared_capacity`; at least 1),
        and optionally how much of it one device can use alone (default: all
        of it, as logical devices of one process's thread pool; 1 for worker
        processes that each run one op at a time).
    acknowledged : tuple of (int, int, tuple of int)
        Transfers the step acknowledges (``placer.tf.rewrites.sends``): ``(producer,
        receiving device, waiting nodes)``. Each gets a zero-time node on the
        receiving device that consumes the producer's output there (the
        tensor still crosses once) and sends a zero-byte tensor back to the
        waiting nodes (a link latency). With ``transfer_cpu_s`` under
        ``"lifo"`` the send is then the only op the producer's device can
        run, as on a one-thread TensorFlow worker.
    inline_first : frozenset of int
        Nodes that run before every other op that is ready with them on their device, under ``"lifo"``
        (TensorFlow's executor runs an inexpensive op inline before expensive ones, whatever their profiled
        times: a fused product's ``MatMul`` profiles at 0 s, the fused kernel's time on the op it is named
        after). :func:`simulate` sets it for the acknowledgements it adds; the caller need not.
    snapshots : int
        Keep this many states of the simulation, evenly spaced over its ops,
        in ``SimResult.snapshots``, so that a simulation of a changed
        assignment can continue from the last one the change leaves intact
        (:func:`simulate`'s ``resume``). Only the plain simulation keeps them
        (not ``shared`` nor ``transfer_cpu_s``); 0: none.
    memory_pools : tuple of (float or None)
        Per device (empty: none): ``None``, or the bytes of regions its allocator pool may take (TensorFlow's
        BFC allocator, ``inf``: no limit). A pooled device's ``SimResult.peak_memory_bytes`` is what the pool
        holds in use at its peak (its chunks, :mod:`cost_models.pool`), the step replayed twice after its
        resident bytes (each node's, in node order, as variables are created), or, where the pool cannot serve
        an allocation under its limit, that limit plus the allocation's bytes (over any capacity it is
        compared with, when the limit is the capacity).
    memory_pool_history : tuple of tuple of (key, bytes)
        Per device (empty: none), the allocations and frees its pool served before the step (as
        :func:`cost_models.pool.replay_pool` takes them: ``bytes < 0`` frees ``key``), replayed first: a pool
        keeps the regions it took, so what ran before decides which region a large tensor gets and whether
        its chunk is split (``placer.core.devices.DeviceSet.pool_history``).
    fed : frozenset of int
        Nodes whose outputs the step's caller feeds (a function's arguments, fed where each consumer runs):
        with ``transfer_cpu_s``, a tensor of theirs that crosses to another device gets a receive op there
        but no send op on their own device, so it never queues behind that device's ops (the caller sends
        it when the step starts).
    """

    concurrency: int = 1
    ready_order: str | None = None
    priority: Sequence[float] | None = None
    transfer_cpu_s: np.ndarray | None = None
    time_factor: Sequence[float] | None = None
    peak_memory: bool = True
    shared: tuple[tuple[tuple[int, ...], float] | tuple[tuple[int, ...], float, float], ...] = ()
    acknowledged: tuple[tuple[int, int, tuple[int, ...]], ...] = ()
    inline_first: frozenset[int] = frozenset()
    fed: frozenset[int] = frozenset()
    snapshots: int = 0
    memory_pools: tuple[float | None, ...] = ()
    memory_pool_history: tuple[tuple[tuple[Hashable, float], ...], ...] = ()

    def checked_shares(self, k: int) -> tuple[tuple[tuple[int, ...], float, float], ...]:
        """:attr:`shared` as ``(devices, capacity, one device's share)`` with ints and floats.

        Raises
        ------
        ValueError
            A device outside ``0..k-1`` or in two groups, or a capacity below 1 or not finite.
        """
        seen: set[int] = set()
        out = []
        for entry in self.shared:
            devs, cap = entry[0], entry[1]
            alone = entry[2] if len(entry) > 2 else cap
            devs = tuple(int(d) for d in devs)
            if not devs or any(not 0 <= d < k for d in devs) or seen & set(devs) or len(set(devs)) != len(devs):
                raise ValueError(f"shared groups must name distinct devices in 0..{k - 1}, got {self.shared!r}")
            seen |= set(devs)
            if not math.isfinite(cap) or cap < 1:
                raise ValueError(f"a shared group's capacity must be a finite number >= 1, got {cap!r}")
            if not math.isfinite(alone) or not 1 <= alone <= cap:
                raise ValueError(f"one device's share of a shared group must lie in 1..{cap}, got {alone!r}")
            out.append((devs, float(cap), float(alone)))
        return tuple(out)


def simulate(
    durations_s: np.ndarray,
    tensors: Sequence[TensorEdge],
    assignment: Sequence[int],
    link_seconds: Callable[[int, int, float], float],
    *,
    control_edges: Sequence[tuple[int, int]] = (),
    link_latency_s: np.ndarray | None = None,
    memory: MemoryTraits = MemoryTraits(),
    options: SimOptions = SimOptions(),
    deps: Dependencies | None = None,
    resume: SimResult | None = None,
    stop_above: float | None = None,
    tails: Sequence[float] | None = None,
) -> SimResult:
    """Simulate one step of a placed graph.

    Parameters
    ----------
    durations_s : numpy.ndarray
        ``(n, k)`` compute seconds of node ``v`` on device ``d``.
    tensors : sequence of TensorEdge
        Data dependencies (node indices).
    assignment : sequence of int
        Device index of each node.
    link_seconds : callable
        ``(src_device, dst_device, nbytes) -> seconds`` for one transfer.
    control_edges : sequence of (int, int)
        Ordering-only dependencies (no data moves).
    link_latency_s : numpy.ndarray, optional
        ``(k, k)`` per-transfer latency that does *not* occupy the link
        (RPCs in flight overlap); ``link_seconds`` is then only the time the
        bytes occupy the link. Without it, ``link_seconds`` is the whole
        transfer and transfers on one link never overlap.
    memory : MemoryTraits
        What the memory model knows of each node (resident bytes, aliasing,
        in-place, held).
    options : SimOptions
        Concurrency, ready order, transfer CPU cost and per-device time factors.
    deps : Dependencies, optional
        :func:`dependencies_of` these tensors and control edges, when one graph is simulated many times
        (derived here otherwise).
    resume : SimResult, optional
        A simulation of the same graph, durations and options under another
        assignment, made with ``SimOptions.snapshots``: this one continues
        from the last of its states that the change of assignment leaves
        intact (before the first op that produces an input of, or has a
        control edge to, an op that moved), so it runs only the ops after
        that and gives the same result as simulating from the start. Ignored
        where snapshots are not kept (``shared``, ``transfer_cpu_s``).
    stop_above : float, optional
        With ``tails``: stop as soon as an op ends at ``t`` with ``t + tails[op] > stop_above`` (the step
        would end after ``stop_above``) and return ``step_time_s = inf``, ``simulated_ops`` the ops run so
        far, nothing else (empty timeline). A step that ends at or before ``stop_above`` is simulated whole,
        the same result as without it. For searches that only keep plans faster than a known step
        (:mod:`placer.solvers.descent`). Ignored by the ``shared``, ``transfer_cpu_s`` and
        ``acknowledged`` simulations.
    tails : sequence of float, optional
        Per node, a lower bound of the time the step runs after it ends (e.g. the longest path of its
        successors' fastest durations, control edges included, after ``time_factor``).

    Returns
    -------
    SimResult

    Raises
    ------
    ValueError
        On a cycle, a bad assignment, a non-finite/negative duration or bad options.

    Examples
    --------
    A diamond on one device serialises: 1 + 2 + 3 + 1 seconds.

    >>> import numpy as np
    >>> d = np.array([[1.0], [2.0], [3.0], [1.0]])
    >>> es = [TensorEdge(0, (1, 2), 4.0), TensorEdge(1, (3,), 4.0), TensorEdge(2, (3,), 4.0)]
    >>> simulate(d, es, [0, 0, 0, 0], lambda i, j, b: 0.0).step_time_s
    7.0
    >>> simulate(d, es, [0, 0, 0, 0], lambda i, j, b: 0.0, options=SimOptions(concurrency=2)).step_time_s
    5.0

    A plan only wanted if its step ends by 6.5 s: op 2 ends at 6 s with op 3's 1 s still to run after
    it (``tails``: what must run after each op), so the simulation stops there, one op short:

    >>> early = simulate(d, es, [0, 0, 0, 0], lambda i, j, b: 0.0, stop_above=6.5, tails=[4.0, 1.0, 1.0, 0.0])
    >>> early.step_time_s, early.simulated_ops
    (inf, 3)

    Moving the last op continues from the state before the first op that feeds it (three of four run again):

    >>> d2, link = np.hstack([d, d]), lambda i, j, b: 1.0
    >>> first = simulate(d2, es, [0, 0, 0, 0], link, options=SimOptions(snapshots=4))
    >>> moved = simulate(d2, es, [0, 0, 0, 1], link, options=SimOptions(snapshots=4), resume=first)
    >>> moved.step_time_s, moved.simulated_ops
    (8.0, 3)
    >>> moved.timeline == simulate(d2, es, [0, 0, 0, 1], link).timeline
    True
    """
    durations = np.asarray(durations_s, dtype=float)
    a = np.asarray(assignment, dtype=int)
    n, k = durations.shape
    concurrency, ready_order = options.concurrency, options.ready_order
    if concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    checked_ready_order(ready_order, also={PRIORITY: "each device runs its ready op of highest priority first"})
    by_priority = ready_order == PRIORITY
    if by_priority:
        if options.priority is None or len(options.priority) != n or not all(map(math.isfinite, options.priority)):
            raise ValueError(f"ready_order='priority' needs SimOptions.priority, one finite number per node ({n})")
        if options.acknowledged or options.transfer_cpu_s is not None or options.shared:
            raise ValueError("ready_order='priority' is simulated without shared processors, transfer CPU costs "
                             "or acknowledgements only; simulate those in an executor's order ('fifo' or 'lifo')")
    if options.time_factor is not None:
        factors = np.asarray(options.time_factor, dtype=float)
        if factors.shape != (k,) or not np.isfinite(factors).all() or (factors <= 0).any():
            raise ValueError(f"time_factor must be {k} positive finite factors (one per device), "
                             f"got {list(options.time_factor)!r}")
        durations = durations * factors[None, :]
    _check_costs(durations, a)
    if options.acknowledged:
        return _with_acknowledgements(durations, tensors, a, link_seconds, control_edges, link_latency_s, memory,
                                      options)
    if options.transfer_cpu_s is not None:
        return _with_transfer_ops(durations, tensors, a, link_seconds, control_edges, link_latency_s, memory,
                                  options)
    shares = options.checked_shares(k)
    if shares:
        return _simulate_shared(durations, tensors, a, link_seconds, control_edges, link_latency_s, memory,
                                options, shares, deps)

    lifo = ready_order == "lifo"
    key = [-float(x) for x in options.priority] if by_priority else []  # the pool's heap key: highest first
    deps = _checked(deps, n, tensors) or dependencies_of(n, tensors, control_edges)
    if stop_above is not None and (tails is None or len(tails) != n):
        raise ValueError(f"stop_above needs tails, one per node ({n}), got {None if tails is None else len(tails)}")
    stopping = stop_above is not None
    limit, after = (float(stop_above), tails) if stopping else (math.inf, ())
    start = None if resume is None or resume.snapshots is None else resume.snapshots.state_for(a, deps)
    dev, heaps, stacks, release, waiting = _ready_queues(deps, a, k, lifo, start)
    consumers_of, ctrl_succ, receivers = deps.produced, deps.control_successors, deps.receivers
    seconds = durations[np.arange(n), a].tolist()
    first = options.inline_first  # only the lifo stack reads `instant`: 2 runs first, then 1 (no time), 0
    instant = [2 if v in first else int(t == 0.0) for v, t in enumerate(seconds)] if lifo else []
    # Python lists in the event loop (numpy scalars are several times slower to index); arrays in _State
    if start is None:
        # Each device has `concurrency` slots; keep their free times in a heap.
        slots = [[0.0] * concurrency for _ in range(k)]
        link_free, link_bytes, busy = [[0.0] * k for _ in range(k)], [[0.0] * k for _ in range(k)], [0.0] * k
        timeline: list[tuple[int, int, float, float]] = []
        transfers: list[tuple[int, int, int, float, float]] = []
        done, now, kept, latest = 0, 0.0, [], 0.0
    else:
        snaps = resume.snapshots
        slots = [list(x) for x in start.slots]
        link_free, link_bytes, busy = start.link_free.tolist(), start.link_bytes.tolist(), start.busy.tolist()
        timeline, transfers = list(snaps.timeline[:start.done]), list(snaps.transfers[:start.transfers])
        done, now, latest = start.done, start.now, start.latest
        kept = [st for st in snaps.states if st.done <= start.done]
    first_done = done
    every = max(1, -(-n // options.snapshots)) if options.snapshots > 0 else 0
    at = [0.0] * k  # per device: when it can start its next op (the lifo order's scan)
    arrived = len(transfers)  # transfers before this one are counted in `latest` (the last op or arrival so far)

    while done < n:
        if every and done and done % every == 0 and (not kept or kept[-1].done < done):  # 0: a fresh start
            latest = max(latest, max((tr[4] for tr in transfers[arrived:]), default=0.0))
            arrived = len(transfers)
            kept.append(_State(done, now, *(list(x) for x in waiting), [list(h) for h in heaps],
                               [list(x) for x in stacks], [list(x) for x in slots], np.array(link_free),
                               np.array(link_bytes), np.array(busy), len(transfers), latest))
        d = v = -1  # the device and op that start next, at t_start
        t_start = math.inf
        if lifo or by_priority:
            # Ops start in time order, so an op ready by the earliest start of any device is known by then: only
            # then is a device's stack (which ops became ready last), or pool (by priority), complete. Stacked
            # (pooled) ops are ready by `now`.
            for e in range(k):  # each device's earliest start (inline max/min: this loop runs once per op)
                free = slots[e][0]
                if stacks[e]:
                    at[e] = now if now > free else free
                elif heaps[e]:
                    ready = heaps[e][0][0]
                    at[e] = ready if ready > free else free
                else:
                    at[e] = math.inf
                if at[e] < t_start:
                    t_start = at[e]
            now = t_start
            if by_priority:
                top = None
                for e in range(k):
                    if at[e] == t_start and (stacks[e] or heaps[e]):
                        _to_pool(heaps[e], stacks[e], t_start, key)
                        if top is None or stacks[e][0] < top:
                            d, top = e, stacks[e][0]
                if top is not None:
                    v = top[1]
            else:
                for e in range(k):
                    if at[e] == t_start and (stacks[e] or heaps[e]):
                        _to_stack(heaps[e], stacks[e], t_start, instant)
                        if d < 0 or stacks[e][-1] < v:
                            d, v = e, stacks[e][-1]
        else:
            for e in range(k):
                if heaps[e]:
                    ready, _, u = heaps[e][0]
                    free = slots[e][0]
                    start_e = ready if ready > free else free
                    if d < 0 or start_e < t_start or (start_e == t_start and u < v):
                        t_start, d, v = start_e, e, u
        if d < 0:
            raise ValueError("the graph has a cycle: some ops can never become ready")
        if lifo:
            stacks[d].pop()
        elif by_priority:
            heapq.heappop(stacks[d])
        else:
            heapq.heappop(heaps[d])
        end = t_start + seconds[v]
        if end > latest:
            latest = end
        if stopping and end + after[v] > limit:  # the step would end after stop_above
            return SimResult(math.inf, np.zeros(k), np.zeros((k, k)), (), (), np.zeros(k), np.zeros(n),
                             simulated_ops=done + 1 - first_done)
        heapq.heapreplace(slots[d], end)
        busy[d] += end - t_start
        timeline.append((v, d, t_start, end))
        done += 1
        _send(d, end, tensors, consumers_of[v], receivers, dev, link_seconds, link_latency_s, link_free, link_bytes,
              transfers, release)
        for w in ctrl_succ[v]:
            release(w, end, end)
    latest = max(latest, max((tr[4] for tr in transfers[arrived:]), default=0.0))
    result = _result(tensors, a, k, timeline, transfers, np.array(busy), np.array(link_bytes), memory, options,
                     step=latest)
    snaps = Snapshots(a.copy(), tuple(timeline), tuple(transfers), tuple(kept)) if every else None
    return replace(result, snapshots=snaps, simulated_ops=n - first_done)


def _ready_queues(deps: Dependencies, a: np.ndarray, k: int, lifo: bool, saved: "_State | None" = None
                  ) -> tuple[list[int], list[list[tuple[float, float, int]]], list[list[int]],
                             Callable[[int, float, float], None], tuple[list[int], list[float], list[float]]]:
    """The ready queues both simulators share: ``(device of each node as a list, heaps, stacks, release,
    (inputs each node still waits for, when its inputs are there, what made it ready))``, fresh or copied
    from ``saved``.

    Per device, a heap of the ops released but not yet ready (entries ``(ready time, -cause, node)``, the
    cause 0 with ``"fifo"``; see :func:`_to_stack`) and, with ``"lifo"``, a stack of ready ops. The sources
    start in the heaps; ``release(v, t, cause)`` tells node ``v`` that one of its inputs is there at ``t``
    thanks to an op that ended at ``cause``, and pushes it once all are. Python lists: indexing them is
    several times faster than numpy scalars in the event loop.
    """
    dev = a.tolist()
    if saved is not None:
        n_waiting, ready_at, caused_at = list(saved.n_waiting), list(saved.ready_at), list(saved.caused_at)
        heaps = [list(h) for h in saved.heaps]
        stacks = [list(x) for x in saved.stacks]
    else:
        n_waiting = list(deps.n_waiting)
        n = len(n_waiting)
        ready_at = [0.0] * n
        caused_at = [0.0] * n  # when the event that made each op ready happened (an op's end)
        heaps = [[] for _ in range(k)]
        stacks = [[] for _ in range(k)]
        for v in range(n):
            if n_waiting[v] == 0:
                heapq.heappush(heaps[dev[v]], (0.0, 0.0, v))

    push = heapq.heappush

    def release(v: int, t: float, cause: float) -> None:  # the event loop's hottest call: no tuples compared
        ready = ready_at[v]
        if t > ready or (t == ready and cause > caused_at[v]):
            ready_at[v] = ready = t
            caused_at[v] = cause
        left = n_waiting[v] - 1
        n_waiting[v] = left
        if left == 0:
            push(heaps[dev[v]], (float(ready), -float(caused_at[v]) if lifo else 0.0, v))

    return dev, heaps, stacks, release, (n_waiting, ready_at, caused_at)


@dataclass(frozen=True)
class _State:
    """A plain simulation's state before its ``done``-th op (in start order) runs."""

    done: int
    now: float
    n_waiting: list[int]
    ready_at: list[float]
    caused_at: list[float]
    heaps: list[list[tuple[float, float, int]]]
    stacks: list[list]  # per device: "lifo"'s stack of ready ops, or "priority"'s pool (a heap)
    slots: list[list[float]]
    link_free: np.ndarray
    link_bytes: np.ndarray
    busy: np.ndarray
    transfers: int  # how many transfers had been issued
    latest: float  # the last end of an op or arrival of a transfer so far


@dataclass(frozen=True)
class Snapshots:
    """States of one simulation (``SimOptions.snapshots``) and what it did, to continue it under another
    assignment (:func:`simulate`'s ``resume``)."""

    assignment: np.ndarray
    timeline: tuple[tuple[int, int, float, float], ...]
    transfers: tuple[tuple[int, int, int, float, float], ...]
    states: tuple[_State, ...]

    def state_for(self, assignment: np.ndarray, deps: Dependencies) -> _State | None:
        """The last state that ``assignment`` leaves intact: before the first op (in this simulation's
        order) that produces an input of, or has a control edge to, a node whose device differs; ``None``
        when that is the first op or a moved node is a source.

        Raises
        ------
        ValueError
            The snapshots are of a graph with another number of nodes.
        """
        n = len(deps.n_waiting)
        if self.assignment.shape != (n,):
            raise ValueError(f"resume is a simulation of {self.assignment.shape[0]} nodes, this graph has {n}: "
                             "resume only a simulation of the same graph")
        moved = np.flatnonzero(np.asarray(assignment) != self.assignment)
        if moved.size == 0:
            return self.states[-1] if self.states else None
        position = self.position
        first = n
        for v in moved.tolist():
            if deps.n_waiting[v] == 0:
                return None
            first = min(first, min(position[u] for u in deps.inputs[v]))
        best = None
        for st in self.states:  # ascending
            if st.done > first:
                break
            best = st
        return best

    @cached_property
    def position(self) -> list[int]:
        """Each node's index in the timeline (computed once: a plan is resumed by many trials)."""
        position = [0] * len(self.timeline)
        for i, (v, *_) in enumerate(self.timeline):
            position[v] = i
        return position


def _to_stack(heap: list[tuple[float, float, int]], stack: list[int], now: float, instant: Sequence[int]) -> None:
    """Move a device's ops that are ready by ``now`` from its heap onto its ready stack (``ready_order="lifo"``).

    ``instant`` ranks each node: 2 (``SimOptions.inline_first``) above 1 (takes no time) above 0.
    Heap entries are ``(ready time, -cause, node)``, where the cause is when
    the op whose end made it ready ended (its last input's producer, or
    control predecessor): the top of the stack is the op that became ready
    last, by time and then by its cause (a successor of the op that just
    ended comes before an op whose input arrived from a transfer issued
    earlier); at a tie the lower index is on top. Ops that take no time
    (``instant``) go above all others moved with them: TensorFlow's executor
    runs a finished op's inexpensive successors inline before any expensive
    one, so a shape computation or a gate never waits at the bottom of the
    stack while a depth-first chain runs above it (it did in the simulator:
    a pipeline's gate then opened only after the device's queued sends, which
    TensorFlow runs when the chain ends, ``benchmarks/results/send_deferral.md``).
    The order depends on these times only, not on the order the simulation
    processed events.
    """
    moved = []
    while heap and heap[0][0] <= now:
        moved.append(heapq.heappop(heap))
    stack.extend(v for _, _, v in sorted(moved, key=lambda x: (instant[x[2]], x[0], -x[1], -x[2])))


def _to_pool(heap: list[tuple[float, float, int]], pool: list, now: float, key: Sequence[float]) -> None:
    """Move a device's ops that are ready by ``now`` from its heap into its pool, a heap of ``(key, node)``
    (``ready_order="priority"``: the least key, the highest priority, runs first; ties: the lower index)."""
    while heap and heap[0][0] <= now:
        v = heapq.heappop(heap)[2]
        heapq.heappush(pool, (key[v], v))


def _result(tensors: Sequence[TensorEdge], a: np.ndarray, k: int, timeline: list, transfers: list, busy: np.ndarray,
            link_bytes: np.ndarray, memory: MemoryTraits, options: SimOptions, step: float | None = None
            ) -> SimResult:
    """The :class:`SimResult` of a finished simulation (the step ends with its last op or transfer: ``step``
    where the caller kept it)."""
    if step is None:
        step = max((e for *_, e in timeline), default=0.0)
        if transfers:
            step = max(step, max(e for *_, e in transfers))
    if not math.isfinite(step):
        raise ValueError("simulated step time is not finite")
    if options.peak_memory:
        peak, at_peak = _peak_memory(tensors, a, k, timeline, transfers, memory, options.memory_pools,
                                     options.memory_pool_history)
    else:
        peak, at_peak = np.zeros(k), np.zeros(len(a))
    return SimResult(step, busy, link_bytes, tuple(timeline), tuple(transfers), peak, at_peak,
                     simulated_ops=len(a))


@dataclass(frozen=True)
class Dependencies:
    """What :func:`simulate` derives from a graph's edges alone, to reuse across simulations of one graph
    (:func:`dependencies_of`): a third of a simulation's time on a 5k-op training step.

    Attributes
    ----------
    n_waiting : tuple of int
        Inputs (distinct tensors and control predecessors) each node waits for.
    produced : tuple of tuple of int
        Indices of the tensors each node produces.
    control_successors : tuple of tuple of int
        Per node, the nodes its control edges lead to.
    receivers : tuple of tuple of int
        Per tensor, its readers other than its producer, each once, in order.
    inputs : tuple of tuple of int
        Per node, the nodes it waits for (its inputs' producers and control predecessors).
    """

    n_waiting: tuple[int, ...]
    produced: tuple[tuple[int, ...], ...]
    control_successors: tuple[tuple[int, ...], ...]
    receivers: tuple[tuple[int, ...], ...]
    inputs: tuple[tuple[int, ...], ...]

    def with_control(self, edges: Sequence[tuple[int, int]]) -> "Dependencies":
        """These dependencies with ``edges`` as further control edges: :func:`dependencies_of` with them after
        its control edges, without walking the tensors again (a plan's order on a 16k-op training step).

        Examples
        --------
        >>> base = dependencies_of(3, [TensorEdge(0, (1,), 4.0)])
        >>> base.with_control([(1, 2)]) == dependencies_of(3, [TensorEdge(0, (1,), 4.0)], [(1, 2)])
        True
        """
        n_waiting = list(self.n_waiting)
        successors, inputs = list(self.control_successors), list(self.inputs)
        for u, v in edges:
            successors[u] += (v,)
            inputs[v] += (u,)
            n_waiting[v] += 1
        return Dependencies(tuple(n_waiting), self.produced, tuple(successors), self.receivers, tuple(inputs))


def _checked(deps: Dependencies | None, n: int, tensors: Sequence[TensorEdge]) -> Dependencies | None:
    if deps is not None and (len(deps.n_waiting) != n or len(deps.receivers) != len(tensors)):
        raise ValueError(f"deps describe {len(deps.n_waiting)} nodes and {len(deps.receivers)} tensors, the graph "
                         f"has {n} and {len(tensors)}: make them with dependencies_of(n, tensors, control_edges)")
    return deps


def dependencies_of(n: int, tensors: Sequence[TensorEdge], control_edges: Sequence[tuple[int, int]] = ()
                 ) -> Dependencies:
    """The :class:`Dependencies` of ``n`` nodes joined by ``tensors`` and ``control_edges``.

    Examples
    --------
    >>> dependencies_of(3, [TensorEdge(0, (1, 2, 1), 4.0)], [(1, 2)]).n_waiting
    (0, 1, 2)
    """
    n_waiting = [0] * n
    consumers_of: list[list[int]] = [[] for _ in range(n)]
    ctrl_succ: list[list[int]] = [[] for _ in range(n)]
    inputs: list[list[int]] = [[] for _ in range(n)]
    receivers: list[tuple[int, ...]] = []
    for ti, t in enumerate(tensors):
        consumers_of[t.src].append(ti)
        readers = tuple(w for w in dict.fromkeys(t.dsts) if w != t.src)
        receivers.append(readers)
        for v in readers:
            n_waiting[v] += 1
            inputs[v].append(t.src)
    for u, v in control_edges:
        ctrl_succ[u].append(v)
        n_waiting[v] += 1
        inputs[v].append(u)
    return Dependencies(tuple(n_waiting), tuple(map(tuple, consumers_of)), tuple(map(tuple, ctrl_succ)),
                        tuple(receivers), tuple(map(tuple, inputs)))


def _send(d: int, end: float, tensors: Sequence[TensorEdge], produced: Sequence[int],
          receivers: Sequence[tuple[int, ...]], dev: list[int], link_seconds: Callable[[int, int, float], float],
          link_latency_s: np.ndarray | None, link_free: np.ndarray | list[list[float]],
          link_bytes: np.ndarray | list[list[float]], transfers: list,
          release: Callable[[int, float, float], None]) -> None:
    """An op ended on device ``d`` at ``end``: send each tensor it produced (indices ``produced``) once per
    other device that reads it (each ordered link one transfer at a time) and release its readers when it
    arrives."""
    for ti in produced:
        readers = receivers[ti]
        for w in readers:
            if dev[w] != d:
                break
        else:  # the common case: every reader on the producer's device
            for w in readers:
                release(w, end, end)
            continue
        t = tensors[ti]
        by_dev: dict[int, list[int]] = {}
        for w in readers:
            by_dev.setdefault(dev[w], []).append(w)
        for dd in sorted(by_dev):
            arrival = end
            if dd != d:
                ls = float(max(link_free[d][dd], end))
                cost = sum(link_seconds(d, dd, t.nbytes / t.count) for _ in range(t.count))
                link_free[d][dd] = ls + cost
                arrival = ls + cost + (0.0 if link_latency_s is None else float(link_latency_s[d, dd]))
                link_bytes[d][dd] += t.nbytes
                transfers.append((ti, d, dd, ls, arrival))
            for w in by_dev[dd]:
                release(w, arrival, end)


def _with_transfer_ops(durations: np.ndarray, tensors: Sequence[TensorEdge], a: np.ndarray,
                       link_seconds: Callable[[int, int, float], float], control_edges: Sequence[tuple[int, int]],
                       link_latency_s: np.ndarray | None, memory: MemoryTraits, options: SimOptions) -> SimResult:
    """:func:`simulate` with a send and a receive op per cross-device transfer (``SimOptions.transfer_cpu_s``)."""
    n, k = durations.shape
    cpu = np.asarray(options.transfer_cpu_s, dtype=float)
    if cpu.shape != (k, k) or not np.isfinite(cpu).all() or (cpu < 0).any():
        raise ValueError(f"transfer_cpu_s must be a finite non-negative ({k}, {k}) array")
    rows = [durations]
    devs = list(a)
    new_tensors: list[TensorEdge] = []
    origin: list[int] = []  # original tensor of each new tensor
    extra_alias: list[bool] = []
    for ti, t in enumerate(tensors):
        src_dev = int(a[t.src])
        local = tuple(w for w in t.dsts if a[w] == src_dev)
        remote: dict[int, list[int]] = {}
        for w in dict.fromkeys(t.dsts):
            if a[w] != src_dev:
                remote.setdefault(int(a[w]), []).append(w)
        sends = []
        for dd, ws in sorted(remote.items()):
            c = cpu[src_dev, dd] * t.count
            if t.src in options.fed:  # the caller sends it: a receive op alone
                rcv = len(devs)
                rows.append(np.full((1, k), c))
                devs.append(dd)
                extra_alias.append(False)
                sends.append(rcv)
                new_tensors.append(TensorEdge(rcv, tuple(ws), t.nbytes, t.count))
                origin.append(ti)
                continue
            snd, rcv = len(devs), len(devs) + 1
            rows.append(np.full((2, k), c))
            devs += [src_dev, dd]
            extra_alias += [True, False]  # a send shares the producer's buffer; a receive owns its copy
            sends.append(snd)
            new_tensors += [TensorEdge(snd, (rcv,), t.nbytes, t.count), TensorEdge(rcv, tuple(ws), t.nbytes, t.count)]
            origin += [ti, ti]
        new_tensors.append(TensorEdge(t.src, local + tuple(sends), t.nbytes, t.count))
        origin.append(ti)
    r = simulate(np.vstack(rows), new_tensors, devs, link_seconds, control_edges=control_edges,
                 link_latency_s=link_latency_s, memory=memory.padded(n, len(devs) - n, extra_alias),
                 options=SimOptions(concurrency=options.concurrency, ready_order=options.ready_order,
                                    shared=options.shared, inline_first=options.inline_first,
                                    memory_pools=options.memory_pools,
                                    memory_pool_history=options.memory_pool_history))
    timeline = tuple(x for x in r.timeline if x[0] < n)
    transfers = tuple((origin[ti], i, j, ts, te) for ti, i, j, ts, te in r.transfers)
    # what a send or receive op holds is its original tensor's, so its producer's
    at_peak = r.live_at_peak_bytes[:n].copy()
    for t, ti in zip(new_tensors, origin):
        if t.src >= n:
            at_peak[tensors[ti].src] += r.live_at_peak_bytes[t.src]
    return SimResult(r.step_time_s, r.busy_s, r.link_bytes, timeline, transfers, r.peak_memory_bytes, at_peak,
                     simulated_ops=n)


def _with_acknowledgements(durations: np.ndarray, tensors: Sequence[TensorEdge], a: np.ndarray,
                           link_seconds: Callable[[int, int, float], float], control_edges: Sequence[tuple[int, int]],
                           link_latency_s: np.ndarray | None, memory: MemoryTraits, options: SimOptions) -> SimResult:
    """:func:`simulate` with a zero-time acknowledgement node per acknowledged transfer
    (``SimOptions.acknowledged``); the result lists and counts the original nodes and tensors only."""
    n, k = durations.shape
    grown = list(tensors)
    devs = a.tolist()
    for src, device, waiting in options.acknowledged:
        if not (0 <= src < n and 0 <= device < k and all(0 <= w < n for w in waiting)):
            raise ValueError(f"an acknowledged transfer names a node outside 0..{n - 1} or a device outside "
                             f"0..{k - 1}: {(src, device, waiting)!r}")
        ack = len(devs)
        hit = [i for i, t in enumerate(tensors) if t.src == src and any(a[w] == device for w in t.dsts)]
        if not hit or a[src] == device:
            raise ValueError(f"node {src} sends no tensor to device {device} to acknowledge")
        for i in hit:
            t = grown[i]
            grown[i] = TensorEdge(t.src, (*t.dsts, ack), t.nbytes, t.count)
        devs.append(device)
        if waiting:
            grown.append(TensorEdge(ack, tuple(waiting), 0.0, 1))
    extra = len(devs) - n
    r = simulate(np.vstack([durations, np.zeros((extra, k))]), grown, devs, link_seconds,
                 control_edges=control_edges, link_latency_s=link_latency_s,
                 memory=memory.padded(n, extra, [False] * extra),
                 options=replace(options, acknowledged=(), time_factor=None, snapshots=0,
                                 inline_first=options.inline_first | frozenset(range(n, len(devs)))))
    timeline = tuple(x for x in r.timeline if x[0] < n)
    transfers = tuple(x for x in r.transfers if x[0] < len(tensors))
    return SimResult(r.step_time_s, r.busy_s, r.link_bytes, timeline, transfers, r.peak_memory_bytes,
                     r.live_at_peak_bytes[:n], simulated_ops=n)


def _simulate_shared(durations: np.ndarray, tensors: Sequence[TensorEdge], a: np.ndarray,
                     link_seconds: Callable[[int, int, float], float], control_edges: Sequence[tuple[int, int]],
                     link_latency_s: np.ndarray | None, memory: MemoryTraits, options: SimOptions,
                     shares: tuple[tuple[tuple[int, ...], float, float], ...], deps: Dependencies | None) -> SimResult:
    """:func:`simulate` with processor sharing inside device groups (an event loop over rate changes).

    Same dependency, ready-order and link rules as :func:`simulate`; an
    op's *work* is its duration, and it progresses at its group's rate
    ``min(1, capacity / running ops of the group)`` (1 outside groups); a
    group's devices run up to ``ceil(one device's share)`` ops at once. Its outgoing
    transfers are issued when it ends, in the order ops end.
    """
    n, k = durations.shape
    lifo = options.ready_order == "lifo"
    group_of = np.full(k, -1, dtype=int)
    capacity = [c for _, c, _ in shares]
    slots = np.full(k, options.concurrency, dtype=int)
    for g, (devs, _, alone) in enumerate(shares):
        group_of[list(devs)] = g
        slots[list(devs)] = max(options.concurrency, math.ceil(alone - 1e-9))
    deps = _checked(deps, n, tensors) or dependencies_of(n, tensors, control_edges)
    dev, heaps, stacks, release, _ = _ready_queues(deps, a, k, lifo)
    instant = ([2 if v in options.inline_first else int(t == 0.0)
                for v, t in enumerate(durations[np.arange(n), a].tolist())] if lifo else [])
    consumers_of, ctrl_succ, receivers = deps.produced, deps.control_successors, deps.receivers
    running: dict[int, list[float]] = {}  # node -> [remaining work, start]
    on_device = np.zeros(k, dtype=int)
    in_group = np.zeros(len(shares), dtype=int)
    link_free = np.zeros((k, k))
    link_bytes = np.zeros((k, k))
    busy = np.zeros(k)
    timeline: list[tuple[int, int, float, float]] = []
    transfers: list[tuple[int, int, int, float, float]] = []
    now, done = 0.0, 0

    def next_ready(d: int) -> int | None:
        if lifo:
            _to_stack(heaps[d], stacks[d], now, instant)
            return stacks[d].pop() if stacks[d] else None
        return heapq.heappop(heaps[d])[2] if heaps[d] and heaps[d][0][0] <= now else None

    def rate(d: int) -> float:
        g = group_of[d]
        return 1.0 if g < 0 else min(1.0, capacity[g] / in_group[g])

    while done < n:
        for d in range(k):
            while on_device[d] < slots[d]:
                v = next_ready(d)
                if v is None:
                    break
                running[v] = [float(durations[v, d]), now]
                on_device[d] += 1
                if group_of[d] >= 0:
                    in_group[group_of[d]] += 1
        finish = {v: now + (r[0] / rate(a[v]) if r[0] > 0 else 0.0) for v, r in running.items()}
        t_next = min(finish.values(), default=math.inf)
        for d in range(k):
            if on_device[d] < slots[d] and heaps[d] and not (lifo and stacks[d]):
                t_next = min(t_next, max(heaps[d][0][0], now))
        if not math.isfinite(t_next):
            raise ValueError("the graph has a cycle: some ops can never become ready")
        ended = sorted((f, v) for v, f in finish.items() if f <= t_next * (1 + 1e-12) + 1e-18)
        for v, r in running.items():
            r[0] = max(0.0, r[0] - rate(a[v]) * (t_next - now))
        now = t_next
        for _, v in ended:
            d = int(a[v])
            start = running.pop(v)[1]
            on_device[d] -= 1
            if group_of[d] >= 0:
                in_group[group_of[d]] -= 1
            busy[d] += float(durations[v, d])
            timeline.append((v, d, start, now))
            done += 1
            _send(d, now, tensors, consumers_of[v], receivers, dev, link_seconds, link_latency_s, link_free,
                  link_bytes, transfers, release)
            for w in ctrl_succ[v]:
                release(w, now, now)
    timeline.sort(key=lambda e: e[2])  # stable: ops that started together in the order they ended
    return _result(tensors, a, k, timeline, transfers, busy, link_bytes, memory, options)


def _reads_until(tensors: Sequence[TensorEdge], a: np.ndarray,
                 timeline: Sequence[tuple[int, int, float, float]]) -> dict[int, float]:
    """Until when each op reads its inputs: its end, or for an op that took no time, when the ops it feeds end.

    An op with no time of its own did not run a kernel of its own: Grappler
    fused it into the op it feeds (a fused conv or matmul is profiled under
    the name of the op that ends the pattern, e.g. ``BiasAdd``, and the
    ``Conv2D`` before it reads 0), or it only aliases its input (a reshape).
    Either way its inputs are read until the ops it feeds on its device end;
    taking its own zero-length run instead freed the input of every fused
    conv of ResNet50 at once (its activation peak read 11% low).
    """
    feeds: dict[int, set[int]] = {}
    for t in tensors:
        feeds.setdefault(t.src, set()).update(w for w in t.dsts if a[w] == a[t.src])
    reads: dict[int, float] = {}
    for v, _, s, e in reversed(timeline):  # in start order, so the ops an op feeds come after it
        later = [reads[w] for w in feeds.get(v, ()) if w in reads]
        reads[v] = max(later) if e <= s and later else e
    return reads


def _peak_memory(tensors: Sequence[TensorEdge], a: np.ndarray, k: int,
                 timeline: Sequence[tuple[int, int, float, float]],
                 transfers: Sequence[tuple[int, int, int, float, float]],
                 memory: MemoryTraits, pools: Sequence[float | None] = (),
                 history: Sequence[Sequence[tuple[Hashable, float]]] = ()) -> tuple[np.ndarray, np.ndarray]:
    """Per device: resident + the most live tensor bytes (a pooled device: what its pool holds, ``pools``:
    :attr:`SimOptions.memory_pools`, after ``history``: :attr:`SimOptions.memory_pool_history`); per node:
    what it holds live at those peaks."""
    if pools and len(pools) != k:
        raise ValueError(f"memory_pools has {len(pools)} entries for {k} devices")
    if history and len(history) != k:
        raise ValueError(f"memory_pool_history has {len(history)} entries for {k} devices")
    resident_bytes, aliasing, inplace, held = memory.resident_bytes, memory.aliasing, memory.inplace, memory.held
    start = {v: s for v, _, s, _ in timeline}
    end = {v: e for v, _, _, e in timeline}
    reads = _reads_until(tensors, a, timeline)
    sends: dict[int, list[tuple[int, float, float]]] = {}
    for ti, _src, dst, ts, te in transfers:
        sends.setdefault(ti, []).append((dst, ts, te))
    # Producer-side buffer of each tensor: allocated when its producer starts, released after its last
    # local consumer and its last outgoing transfer.
    alloc = np.zeros(len(tensors), dtype=bool)
    release = np.zeros(len(tensors))
    for ti, t in enumerate(tensors):
        src_dev = int(a[t.src])
        local_end = max([reads[w] for w in t.dsts if a[w] == src_dev] + [end[t.src]])
        release[ti] = max([local_end] + [te for _, _, te in sends.get(ti, [])])
        alloc[ti] = t.nbytes > 0 and (aliasing is None or not aliasing[t.src])
        if held is not None and held[t.src]:
            release[ti] = max(end.values())
    if inplace is not None:
        # An in-place op (e.g. Relu, BiasAdd) writes into an input of the same size on its own device
        # when it is that input's last reader (every other consumer and outgoing transfer has ended when
        # it starts: TF checks the buffer's reference count at run time): its output allocates nothing
        # and keeps that buffer alive.
        by_src: dict[int, list[int]] = {}
        for ti, t in enumerate(tensors):
            by_src.setdefault(t.src, []).append(ti)

        def _last_reader(ti: int, v: int) -> bool:
            return (all(reads[w] <= start[v] for w in tensors[ti].dsts if w != v)
                    and all(te <= start[v] for _, _, te in sends.get(ti, [])))

        feeding: dict[int, list[int]] = {}
        for ti, t in enumerate(tensors):
            for w in set(t.dsts):
                feeding.setdefault(w, []).append(ti)
        for v, _, _, _ in sorted(timeline, key=lambda e: -e[2]):  # latest first: chains propagate
            if not inplace[v]:
                continue
            for to in by_src.get(v, []):
                donor = next((ti for ti in feeding.get(v, []) if alloc[ti] and _last_reader(ti, v)
                              and not (held is not None and held[tensors[ti].src])  # the caller holds it too
                              and tensors[ti].nbytes == tensors[to].nbytes and a[tensors[ti].src] == a[v]), None)
                if donor is not None and alloc[to]:
                    alloc[to] = False
                    release[donor] = max(release[donor], release[to])
    # (time, frees first at a tie, device, delta, producer, tensor: its index, and the receiving device or -1);
    # a tensor freed the moment it is made holds nothing (its free would sort before its allocation)
    events: list[tuple[float, int, int, float, int, tuple[int, int]]] = []
    for ti, t in enumerate(tensors):
        if t.nbytes <= 0:
            continue
        if alloc[ti] and release[ti] > start[t.src]:
            events.append((start[t.src], 1, int(a[t.src]), t.nbytes, t.src, (ti, -1)))
            events.append((release[ti], 0, int(a[t.src]), -t.nbytes, t.src, (ti, -1)))
        for dst, ts, _te in sends.get(ti, []):
            last = max(reads[w] for w in t.dsts if a[w] == dst)
            if last > ts:
                events.append((ts, 1, dst, t.nbytes, t.src, (ti, dst)))
                events.append((last, 0, dst, -t.nbytes, t.src, (ti, dst)))
    events.sort()
    live = np.zeros(k)
    peak = np.zeros(k)
    when = np.full(k, -1)  # the event at which each device first reached its peak
    for i, (_, _, d, delta, _, _) in enumerate(events):
        live[d] += delta
        if live[d] > peak[d]:
            peak[d], when[d] = live[d], i
    # the producers of what each device holds at that moment
    held_now: list[dict[int, float]] = [{} for _ in range(k)]
    at_peak = np.zeros(len(a))
    last_event = int(when.max(initial=-1))
    for i, (_, _, d, delta, v, _) in enumerate(events[:last_event + 1]):
        held_now[d][v] = held_now[d].get(v, 0.0) + delta
        if i == when[d]:
            for u, b in held_now[d].items():
                at_peak[u] += b
    if resident_bytes is not None:
        peak += np.bincount(a, weights=np.asarray(resident_bytes, dtype=float), minlength=k)
    for d, limit in enumerate(pools):
        if limit is not None:
            peak[d] = max(peak[d], _pool_peak(d, limit, a, resident_bytes, events, history[d] if history else ()))
    return peak, at_peak


def _pool_peak(d: int, limit: float, a: np.ndarray, resident_bytes: Sequence[float] | None,
               events: Sequence[tuple[float, int, int, float, int, tuple[int, int]]],
               history: Sequence[tuple[Hashable, float]] = ()) -> float:
    """Device ``d``'s pool (:mod:`cost_models.pool`): what it served before the step first (``history``, its
    peak not counted: those tensors are gone), its resident bytes allocated, node by node, then the step's
    allocations and frees twice (a pool keeps its regions from one step to the next); the most it holds in use
    from the resident bytes on, or ``limit`` plus the first allocation it cannot serve."""
    held = [] if resident_bytes is None else [
        (("resident", v), float(b)) for v, b in enumerate(resident_bytes) if a[v] == d and b > 0]
    step = [(key, delta) for _, _, dev, delta, _, key in events if dev == d]
    use = replay_pool([*held, *step, *step], limit, before=history)
    return use.peak_bytes if use.failed is None else limit + use.failed_bytes
