"""The predicted step of a plan run as a pipeline of micro-batches (no TensorFlow).

:mod:`placer.tf.rewrites.copies` runs ``m`` copies of the placed graph, one per
micro-batch, and orders each device's work with gates: a device finishes
micro-batch ``i`` (every op of it there) before it starts ``i + 1``; in a
training step the forward and the backward copies are ordered apart (GPipe)
and the optimizer's update runs once, on the summed gradients.
:func:`pipelined_schedule` builds the same graph for the simulator: the
fine schedule copied ``m`` times, each tensor's bytes divided by ``m``, per
device and phase (the graph's ``phase``) a zero-time gate between
consecutive copies, and the update once, fed by the sum of every copy's
gradients, summed as they come (:func:`sum_seconds_per_byte` prices a sum).
Variables are read by every copy; their bytes are resident once. Until 2026-12-03 a
training step was simulated with whole micro-batches gated (a device ran
micro-batch ``i``'s backward pass before ``i + 1``'s forward pass) and the
update once per micro-batch, unlike what runs. Op times do not shrink with the rows
(fixed per-op costs): with :class:`SmallBatchCosts`, measured at smaller
batches, each op's time on a micro-batch is interpolated between the nearest two.

Examples
--------
>>> import numpy as np
>>> from cost_models import TensorEdge
>>> from .problem import Schedule
>>> s = Schedule(np.ones((2, 2)), (TensorEdge(0, (1,), 8.0),), (), np.array([0, 1]))
>>> d, ts, ctrl, a = pipelined_schedule(s, np.array([0, 1]), 2)
>>> d.shape, len(ts), a.tolist()
((6, 2), 2, [0, 1, 0, 1, 0, 1])
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import numpy as np

from cost_models import MemoryTraits, SimOptions, SimResult, TensorEdge, simulate

from ..errors import PlanError
from .attrs import PHASES
from .problem import Schedule

#: ``(bytes, src device index, dst device index) → (bytes on the wire, encode s on src, decode s on dst)`` of
#: parameter traffic (the codec :meth:`placer.core.compression.CompressionPolicy.parameter_codec` chooses).
ParameterCodec = Callable[[float, int, int], tuple[float, float, float]]

#: Largest number of micro-batches ``microbatches="auto"`` tries.
MAX_AUTO_MICROBATCHES = 16


@dataclass(frozen=True)
class SmallBatchCosts:
    """Op times measured at smaller batches: what a micro-batch's ops cost is not linear in its rows.

    Measured here (2 cores, an 8-tower MLP): the ops sum to 18.3 ms at batch
    64 and 7.9 ms at batch 8, not 2.3 ms (fixed per-op costs, small
    matrices). Nor are they affine between the smallest micro-batch and the
    batch: a 4-tower MLP's copies at 128 of 256 rows, interpolated between 16
    and 256 rows, were predicted at 8.3 ms; profiled at 128 rows, 6.8 ms
    (one gRPC worker, 2026-12-06). So each op's time at a batch between two
    profiled ones is interpolated linearly between the nearest two (the
    planning batch the largest), and held at the smallest's below it.

    Attributes
    ----------
    batches : tuple[int, ...]
        The smaller batches the ops were profiled at, ascending.
    durations_s : tuple[numpy.ndarray, ...]
        Per batch, ``(fine nodes, devices)`` seconds at it, rows in the schedule's order.

    Examples
    --------
    >>> import numpy as np
    >>> small = SmallBatchCosts((2, 4), (np.array([[2.0]]), np.array([[3.0]])))
    >>> [float(small.at(np.array([[7.0]]), 8, rows)[0, 0]) for rows in (1, 3, 4, 6)]
    [2.0, 2.5, 3.0, 5.0]
    """

    batches: tuple[int, ...]
    durations_s: tuple[np.ndarray, ...]

    def __post_init__(self) -> None:
        if not self.batches or len(self.batches) != len(self.durations_s) or list(self.batches) != sorted(
                set(self.batches)):
            raise ValueError(f"small-batch costs need one duration array per batch, batches ascending and distinct; "
                             f"got batches {self.batches} for {len(self.durations_s)} arrays")

    def at(self, full: np.ndarray, full_batch: int, rows: float) -> np.ndarray:
        """The ``(fine nodes, devices)`` seconds at ``rows`` rows, from ``full`` (at ``full_batch``) and these."""
        points = [(b, d) for b, d in zip(self.batches, self.durations_s) if b < full_batch] + [(full_batch, full)]
        if len(points) == 1:
            return full * (rows / full_batch)
        if rows <= points[0][0]:
            return points[0][1]
        for (b0, d0), (b1, d1) in zip(points, points[1:]):
            if rows <= b1:
                return d0 + ((rows - b0) / (b1 - b0)) * (d1 - d0)
        return full


#: How a pipelined training step orders each device's micro-batches: ``"gpipe"`` (every forward micro-batch
#: in order, and apart from them every backward one) or ``"1f1b"`` (one forward, one backward: after a
#: warm-up of ``stages - position`` forward micro-batches each device alternates, so it holds the
#: activations of at most that many micro-batches, where GPipe's first stage holds all ``m``).
PIPELINE_ORDERS = ("gpipe", "1f1b")
#: ``pipeline="auto"`` takes 1F1B where its simulated peak memory is lower than GPipe's and its simulated
#: step at most this much longer (a 2-stage pipeline has the same fill and drain in both orders).
ORDER_TIME_TOLERANCE = 0.02


def checked_pipeline(order: str, error: type[Exception] = PlanError) -> str:
    """``order`` if it is ``"auto"`` or one of :data:`PIPELINE_ORDERS`; else raises ``error`` saying which to use.

    Examples
    --------
    >>> checked_pipeline("1f1b")
    '1f1b'
    """
    if order != "auto" and order not in PIPELINE_ORDERS:
        raise error(f"unknown pipeline order {order!r}: pipeline must be 'auto' (1F1B where it is predicted to "
                    "pay: only it fits the memory, or it holds less at no cost in time), 'gpipe' or '1f1b'")
    return order


@dataclass(frozen=True)
class OrderChoice:
    """The pipeline order a plan runs its micro-batches in (:func:`pipeline_order`).

    Attributes
    ----------
    order : str
        ``"gpipe"`` or ``"1f1b"``.
    why : str
        How it was chosen (for the plan's log).
    step_s : float or None
        The simulated pipelined step in that order, where choosing it took that simulation (``None``: not
        simulated here; GPipe's step is what :func:`best_microbatches` gave).
    """

    order: str
    why: str
    step_s: float | None = None


def device_chains(order: str, m: int, position: int, stages: int) -> list[list[tuple[int, str]]]:
    """The chains of ``(micro-batch, phase)`` units a device at pipeline ``position`` (of ``stages``) runs
    in order; consecutive units of a chain are gated (each unit's first ops wait for the previous unit's
    last ops on the device).

    Examples
    --------
    >>> device_chains("gpipe", 2, 0, 2)
    [[(0, 'forward'), (1, 'forward')], [(0, 'backward'), (1, 'backward')]]
    >>> device_chains("1f1b", 3, 1, 2)  # the last stage: warm-up of one
    [[(0, 'forward'), (0, 'backward'), (1, 'forward'), (1, 'backward'), (2, 'forward'), (2, 'backward')]]
    """
    if checked_pipeline(order) == "gpipe":
        return [[(i, "forward") for i in range(m)], [(i, "backward") for i in range(m)]]
    if order != "1f1b":
        raise PlanError(f"device_chains takes a pipeline order, {list(PIPELINE_ORDERS)}; 'auto' is chosen first "
                        "(pipeline_order)")
    warm = max(1, min(m, stages - position))
    chain = [(i, "forward") for i in range(warm)]
    for i in range(m):
        chain.append((i, "backward"))
        if i + warm < m:
            chain.append((i + warm, "forward"))
    return [chain]


def _ungated(schedule: Schedule, fine: np.ndarray, once: np.ndarray) -> np.ndarray:
    """Per fine node: whether no gate waits for it or holds it back: ops run once, and sources that take no
    time on their device (the fed inputs, constants: the placed graph splits inputs outside the gated
    micro-batches, :func:`placer.tf.rewrites.gates.add_gates`)."""
    fed = np.zeros(len(fine), dtype=bool)
    for t in schedule.tensors:
        fed[list(t.dsts)] = True
    for _, v in schedule.control:
        fed[v] = True
    free = schedule.durations_s[np.arange(len(fine)), fine] == 0
    return once | (~fed & free)


def unit_ends(schedule: Schedule, fine: np.ndarray, phase: Sequence[str], free: np.ndarray
              ) -> tuple[dict[tuple[int, str], list[int]], dict[tuple[int, str], list[int]]]:
    """``(exits, entries)`` of each unit ``(device, phase)`` of one copy: its last ops (no consumer in the
    unit) and first ops (no producer in the unit), which the gate between consecutive copies waits for and
    holds back; ``free`` ops (:func:`_ungated`) belong to no unit."""
    n = len(fine)
    local_src = np.zeros(n, dtype=bool)
    has_local_input = np.zeros(n, dtype=bool)
    edges = [(t.src, w) for t in schedule.tensors for w in t.dsts] + list(schedule.control)
    for u, w in edges:
        if fine[w] == fine[u] and phase[w] == phase[u] and w != u and not free[u] and not free[w]:
            has_local_input[w] = True
            local_src[u] = True
    exits: dict[tuple[int, str], list[int]] = {}
    entries: dict[tuple[int, str], list[int]] = {}
    for v in range(n):
        if not free[v]:
            if not local_src[v]:
                exits.setdefault((int(fine[v]), phase[v]), []).append(v)
            if not has_local_input[v]:
                entries.setdefault((int(fine[v]), phase[v]), []).append(v)
    return exits, entries


def pipeline_stages(schedule: Schedule, fine: np.ndarray, phases: Sequence[str] | None) -> tuple[int, ...]:
    """The devices that run ops per micro-batch, in pipeline order: the order the forward pass's tensors
    flow between them (a topological order of the devices, with an edge where a forward op sends a forward
    op on another device a tensor; ties, and devices a cycle leaves unordered, by their first forward op in
    the schedule's topological order), then devices with no forward op by their first op. Ops run once
    (:func:`_run_once`) and sources that take no time do not count.

    Examples
    --------
    >>> from cost_models import TensorEdge
    >>> s = Schedule(np.ones((3, 2)), (TensorEdge(0, (1,), 1.0),), (), np.arange(3))
    >>> pipeline_stages(s, np.array([1, 0, 1]), ["forward", "forward", "backward"])
    (1, 0)
    """
    fine = np.asarray(fine, dtype=int)
    return _stage_order(schedule, fine, phases, _ungated(schedule, fine, _run_once(schedule, phases)))


def _stage_order(schedule: Schedule, fine: np.ndarray, phases: Sequence[str] | None,
                 skip: np.ndarray) -> tuple[int, ...]:
    """:func:`pipeline_stages` given the nodes that do not count (``skip``: :func:`_ungated`)."""
    import networkx as nx

    forward = [not skip[v] and (phases is None or phases[v] == "forward") for v in range(len(fine))]
    first: dict[int, tuple[int, int]] = {}
    for v, d in enumerate(fine.tolist()):
        if not skip[v]:
            first[d] = min(first.get(d, (1, v)), (0 if forward[v] else 1, v))
    flow = nx.DiGraph()
    flow.add_nodes_from(d for d in first if first[d][0] == 0)
    flow.add_edges_from((int(fine[t.src]), int(fine[w])) for t in schedule.tensors if forward[t.src]
                        for w in t.dsts if forward[w] and fine[w] != fine[t.src])
    try:
        ordered = list(nx.lexicographical_topological_sort(flow, key=first.__getitem__))
    except nx.NetworkXUnfeasible:  # not a chain of stages (1F1B will refuse it): by first forward op
        ordered = sorted(flow, key=first.__getitem__)
    return tuple(ordered + sorted((d for d in first if d not in flow), key=first.__getitem__))


def _check_acyclic(total: int, tensors: Sequence[TensorEdge], control: Sequence[tuple[int, int]], order: str) -> None:
    """Raise ``PlanError`` where the gated copies wait on each other in a cycle (TensorFlow would hang; the
    emitted graph is checked the same way, :func:`placer.tf.rewrites.gates.add_gates`)."""
    import networkx as nx

    g = nx.DiGraph()
    g.add_nodes_from(range(total))
    g.add_edges_from((t.src, w) for t in tensors for w in t.dsts)
    g.add_edges_from(control)
    if not nx.is_directed_acyclic_graph(g):
        raise PlanError(f"the {order} order would make this plan's micro-batches wait on each other in a cycle "
                        "(a device runs stages that are not next to each other in the pipeline); use "
                        "pipeline='gpipe'")


def _run_once(schedule: Schedule, phases: Sequence[str] | None) -> np.ndarray:
    """Per fine node: whether it runs once per step, not per micro-batch: the ``update`` ops and everything
    that depends on one (the step's outputs wait for the update), as the placed training step runs the
    optimizer once on the summed gradients."""
    n = schedule.durations_s.shape[0]
    once = np.array([ph == "update" for ph in phases], dtype=bool) if phases is not None else np.zeros(n, bool)
    if not once.any():
        return once
    succ: list[list[int]] = [[] for _ in range(n)]
    for t in schedule.tensors:
        succ[t.src].extend(t.dsts)
    for u, v in schedule.control:
        succ[u].append(v)
    todo = np.flatnonzero(once).tolist()
    while todo:
        for w in succ[todo.pop()]:
            if not once[w]:
                once[w] = True
                todo.append(w)
    return once


def pipelined_schedule(schedule: Schedule, group_assignment: np.ndarray, m: int,
                       micro_durations_s: np.ndarray | None = None, phases: Sequence[str] | None = None,
                       order: str = "gpipe", sum_s_per_byte: np.ndarray | None = None,
                       maps: np.ndarray | None = None, pinned: np.ndarray | None = None,
                       anchored: np.ndarray | None = None, parameter_codec: ParameterCodec | None = None
                       ) -> tuple[np.ndarray, tuple[TensorEdge, ...], tuple[tuple[int, int], ...], np.ndarray]:
    """``(durations, tensors, control edges, fine assignment)`` of ``m`` gated copies of ``schedule``.

    Node ``i * n + v`` is op ``v`` of micro-batch ``i``; the gates follow the ``m * n`` ops.
    ``micro_durations_s``: each op's seconds on a micro-batch (default: the schedule's divided by ``m``).

    ``phases`` (per fine node, :data:`placer.core.attrs.PHASES`; default all ``"forward"``), as the
    placed training step runs them (:mod:`placer.tf.rewrites.gates`): each device orders its forward copies
    and, apart, its backward copies (GPipe: a device need not finish micro-batch ``i``'s backward pass
    before it starts ``i + 1``'s forward pass), and the ops that run once (:func:`_run_once`: the update
    and what depends on it) run in the last copy at their full time, fed by every copy, with full bytes for tensors into them
    (gradients have a weight's size whatever the rows); their other copies are empty (no time, no edges),
    so that node ``i * n + v`` stays op ``v`` of micro-batch ``i``.

    ``order`` (:data:`PIPELINE_ORDERS`): how each device's units ``(micro-batch, phase)`` are chained
    (:func:`device_chains`, positions from :func:`pipeline_stages`).

    A tensor that copies send to an op run once (a weight's gradient) is summed as the copies come, as the
    placed step sums them: ``m - 1`` sum nodes after the gates, on the producer's device, each adding the
    next copy's tensor to the running sum (so at most two of them are live) and taking
    ``sum_s_per_byte[device] × bytes`` (default 0). A running sum that feeds the next one is waited for by
    the gate after its micro-batch's backward pass on that device, as in the placed step
    (:func:`placer.tf.rewrites.gates.hold_gradient_sums`: it keeps Grappler from merging the sums).

    ``maps`` (``m`` rows, :func:`placer.core.replicas.group_maps`): the copies are data-parallel replicas, one
    per group of devices: copy ``i`` runs each op on ``maps[i][d]`` for its planned device ``d``, except the
    ops run once and the ``pinned`` ones (variables and their reads, :func:`placer.core.replicas.pinned_nodes`),
    which stay on the plan's (the first group's) devices; a pinned op's tensors keep their full bytes (a
    weight's size whatever the rows). No gates (each device runs one copy); every copy's gradients are summed
    on the first group's devices, as :func:`placer.tf.replicas.replicated_train_step` sums them. The
    ``anchored`` ops (a table's row gathers: :attr:`placer.core.build.BuiltProblem.anchored`) run in every copy,
    on its rows, but on the plan's device: where the table is, as TensorFlow colocates them with it.

    ``parameter_codec`` (:data:`ParameterCodec`, e.g.
    :meth:`placer.core.compression.CompressionPolicy.parameter_codec` by device index): the parameter
    traffic's codec, applied where a copy reads a pinned op's tensor (a weight) on another device and where a
    copy's gradient crosses to its running sum: an encode node on the sender and a decode node on the
    receiver (numbered after the sums) with the codec's seconds, the narrower bytes between them; default:
    sent as they are.

    Raises
    ------
    PlanError
        An unknown ``order``, or one whose gates would wait in a cycle (1F1B on a plan whose devices do not
        hold contiguous stages).
    """
    fine = np.asarray(group_assignment, dtype=int)[schedule.group]
    n, k = schedule.durations_s.shape
    phase = [PHASES[0]] * n if phases is None else list(phases)
    once = _run_once(schedule, phase)
    free = _ungated(schedule, fine, once)
    last = (m - 1) * n
    exits, entries = unit_ends(schedule, fine, phase, free)
    stages = _stage_order(schedule, fine, phase, free)
    links: list[tuple[int, int, str, int, str]] = []  # (device, i, phase) -> (j, phase2): one gate each
    for position, d in enumerate(stages):
        for chain in device_chains(order, m, position, len(stages)):
            units = [(i, ph) for i, ph in chain if (d, ph) in exits]
            links += [(d, i, ph, j, ph2) for (i, ph), (j, ph2) in zip(units, units[1:])]
    pin = np.zeros(n, dtype=bool) if maps is None or pinned is None else np.asarray(pinned, dtype=bool)
    if maps is not None:
        links = []  # one copy per device: nothing to gate
    gate = {link: m * n + g for g, link in enumerate(links)}
    total = m * n + len(gate)
    durations = np.zeros((total, k))
    micro = schedule.durations_s / m if micro_durations_s is None else np.asarray(micro_durations_s, dtype=float)
    durations[:m * n] = np.tile(np.where(once[:, None], 0.0, micro), (m, 1))
    durations[last:m * n][once] = schedule.durations_s[once]
    stay = once | pin if anchored is None or not len(anchored) else once | pin | np.asarray(anchored, dtype=bool)
    copies = [fine if maps is None else np.where(stay, fine, np.asarray(maps)[i][fine]) for i in range(m)]
    assignment = np.concatenate([*copies, np.array([link[0] for link in gate], dtype=int)]).astype(int)
    tensors = []
    sums: list[tuple[int, float]] = []  # (device, seconds) of each sum (or codec) node, numbered after the gates
    after = {(d, i, ph): g for (d, i, ph, _, _), g in gate.items()}  # the gate after unit (i, ph) on device d
    held: list[tuple[int, int]] = []  # (running sum, the gate that waits for it)
    rate = np.zeros(k) if sum_s_per_byte is None else np.asarray(sum_s_per_byte, dtype=float)

    def send(src: int, dsts: tuple[int, ...], nbytes: float, count: int, at: int, to: int) -> None:
        """The tensor of node ``src`` (on device ``at``) to nodes ``dsts`` (on ``to``), through the parameter
        codec where it crosses devices."""
        wire, enc_s, dec_s = (nbytes, 0.0, 0.0) if parameter_codec is None or at == to else \
            parameter_codec(nbytes, at, to)
        if wire == nbytes and enc_s == dec_s == 0.0:
            tensors.append(TensorEdge(src, dsts, nbytes, count))
            return
        enc, dec = total + len(sums), total + len(sums) + 1
        sums.extend([(at, float(enc_s)), (to, float(dec_s))])
        tensors.extend([TensorEdge(src, (enc,), nbytes, count), TensorEdge(enc, (dec,), float(wire), count),
                        TensorEdge(dec, dsts, nbytes, count)])

    for t in schedule.tensors:
        if once[t.src]:
            tensors.append(TensorEdge(last + t.src, tuple(last + w for w in t.dsts), t.nbytes, t.count))
            continue
        copied = tuple(w for w in t.dsts if not once[w])
        into_once = tuple(w for w in t.dsts if once[w])
        for i in range(m):
            if copied:
                dsts = tuple(i * n + w for w in copied)
                if pin[t.src]:  # a weight read: its full bytes, to this copy's device
                    send(i * n + t.src, dsts, t.nbytes, t.count, int(copies[i][t.src]), int(copies[i][copied[0]]))
                else:
                    tensors.append(TensorEdge(i * n + t.src, dsts, t.nbytes / m, t.count))
        if into_once:
            running = t.src  # copy 0's tensor, then the running sum
            for i in range(1, m):
                node = total + len(sums)
                sums.append((int(fine[t.src]), float(rate[fine[t.src]] * t.nbytes)))
                tensors.append(TensorEdge(running, (node,), t.nbytes, t.count))
                send(i * n + t.src, (node,), t.nbytes, t.count, int(copies[i][t.src]), int(fine[t.src]))
                if i < m - 1 and (int(fine[t.src]), i, "backward") in after:
                    held.append((node, after[(int(fine[t.src]), i, "backward")]))
                running = node
            tensors.append(TensorEdge(running, tuple(last + w for w in into_once), t.nbytes, t.count))
    if sums:
        extra = np.zeros((len(sums), k))
        extra[np.arange(len(sums)), [d for d, _ in sums]] = [c for _, c in sums]
        durations = np.vstack([durations, extra])
        assignment = np.concatenate([assignment, np.array([d for d, _ in sums], dtype=int)])
        total += len(sums)
    control = []
    for u, v in schedule.control:
        if once[u]:
            control.append((last + u, last + v))
        else:
            control += [(i * n + u, (last if once[v] else i * n) + v) for i in range(m)]
    for (d, i, ph, j, ph2), g in gate.items():
        control += [(i * n + v, g) for v in exits[(d, ph)]]
        control += [(g, j * n + v) for v in entries.get((d, ph2), ())]
    control += held
    if order != "gpipe":  # GPipe's gates only point from a micro-batch to the next: never a cycle
        _check_acyclic(total, tensors, control, order)
    return durations, tuple(tensors), tuple(control), assignment


def _pipelined_memory(memory: MemoryTraits, n: int, m: int, total: int) -> MemoryTraits:
    """The memory traits of ``m`` copies of ``n`` nodes and ``total - m * n`` gates: resident bytes once
    (the copies share the variables), the op-type facts per copy."""

    def tiled(xs: Sequence | None, fill: object) -> list | None:
        return None if xs is None else [*list(xs) * m, *([fill] * (total - m * n))]

    resident = None
    if memory.resident_bytes is not None:
        resident = [*memory.resident_bytes, *([0.0] * (total - n))]
    return MemoryTraits(resident, tiled(memory.aliasing, False), tiled(memory.inplace, False),
                        tiled(memory.held, False))


#: Element-wise ops whose output has fewer bytes than this do not count towards the sum rate (fixed costs).
SUM_RATE_MIN_BYTES = 1 << 16


def sum_seconds_per_byte(built: Any) -> np.ndarray:
    """Per device: seconds per output byte of the graph's own element-wise ops (the memory model's in-place
    op types, outputs of at least :data:`SUM_RATE_MIN_BYTES`), the median; what summing a micro-batch's
    gradient into the running sum costs (0 where the graph has no such op). Measured op times, not a
    bandwidth figure."""
    sched = built.schedule
    out = np.zeros(sched.durations_s.shape[0])
    for t in sched.tensors:
        out[t.src] = max(out[t.src], t.nbytes)
    inplace = np.asarray(built.memory.inplace if built.memory.inplace is not None else [], dtype=bool)
    if inplace.size != out.size:
        return np.zeros(sched.durations_s.shape[1])
    rows = np.flatnonzero(inplace & (out >= SUM_RATE_MIN_BYTES))
    if rows.size == 0:
        return np.zeros(sched.durations_s.shape[1])
    per_byte = sched.durations_s[rows] / out[rows, None]
    return np.array([float(np.median(col[np.isfinite(col)])) if np.isfinite(col).any() else 0.0
                     for col in per_byte.T])


def copies_fed(schedule: Schedule, copies: int) -> frozenset[int]:
    """The nodes of ``copies`` copies of ``schedule`` (node ``c * n + v`` is op ``v`` of copy ``c``) that the
    caller feeds (``Schedule.fed``): every copy's inputs, each its part of the batch split on the caller.

    >>> s = Schedule(np.ones((3, 2)), (TensorEdge(0, (1,), 1.0),), (), np.arange(3), fed=(0,))
    >>> sorted(copies_fed(s, 2))
    [0, 3]
    """
    n = schedule.m
    return frozenset(c * n + v for c in range(copies) for v in schedule.fed)


def simulate_pipeline(built: Any, group_assignment: np.ndarray, m: int,
                      options: SimOptions = SimOptions(peak_memory=False), *,
                      small: SmallBatchCosts | None = None, batch_size: int | None = None,
                      order: str = "gpipe") -> SimResult:
    """One simulated step of ``built``'s plan as ``m`` micro-batches (the whole batch, all copies) in the
    pipeline ``order`` (:data:`PIPELINE_ORDERS`).

    ``small`` (with the planning ``batch_size``): op times at a smaller batch, interpolated to the
    micro-batch (:class:`SmallBatchCosts`); without it each op's time is divided by ``m``.

    Raises
    ------
    PlanError
        An ``order`` that would wait in a cycle on this plan (:func:`pipelined_schedule`).
    """
    if m == 1:
        return built.simulate(group_assignment, options)
    micro = None
    if small is not None and batch_size:
        micro = small.at(built.schedule.durations_s, batch_size, batch_size / m)
    d, tensors, control, a = pipelined_schedule(built.schedule, group_assignment, m, micro, built.phases or None,
                                                order, sum_seconds_per_byte(built))
    p = built.problem
    memory = _pipelined_memory(built.memory, built.schedule.durations_s.shape[0], m, d.shape[0])
    return simulate(d, tensors, a, p.occupancy_seconds, control_edges=control, link_latency_s=p.latency,
                    memory=memory, options=replace(p.sim_options(options), fed=copies_fed(built.schedule, m)))


def pipeline_order(built: Any, group_assignment: np.ndarray, m: int, order: str = "auto", *,
                   small: SmallBatchCosts | None = None, batch_size: int | None = None) -> OrderChoice:
    """The pipeline order a training plan runs its ``m`` micro-batches in (with 1F1B's simulated step).

    ``order`` ``"gpipe"`` or ``"1f1b"`` is checked and kept; ``"auto"`` takes 1F1B where the plan has a
    backward pass spread over several devices, 1F1B does not wait in a cycle, and it pays: its simulated
    peaks fit the devices' memory where GPipe's do not, or its largest peak is lower than GPipe's at a
    simulated step at most :data:`ORDER_TIME_TOLERANCE` longer; else GPipe.

    Raises
    ------
    PlanError
        ``"1f1b"`` for a plan without a backward pass (inference), or one whose devices do not hold
        contiguous stages (a cycle); an unknown ``order``.
    """
    training = "backward" in (built.phases or ())
    if checked_pipeline(order) == "gpipe" or m == 1:
        return OrderChoice("gpipe", "given" if order == "gpipe" else "one micro-batch")
    if not training:
        if order == "1f1b":
            raise PlanError("pipeline='1f1b' orders forward and backward passes; this step has no backward pass "
                            "(inference): use 'gpipe' or 'auto'")
        return OrderChoice("gpipe", "no backward pass")
    args = dict(options=SimOptions(), small=small, batch_size=batch_size)
    if order == "1f1b":  # the simulation raises where it would hang
        return OrderChoice("1f1b", "given", simulate_pipeline(built, group_assignment, m, **args,
                                                              order="1f1b").step_time_s)
    if len(np.unique(np.asarray(group_assignment)[built.schedule.group])) < 2:
        return OrderChoice("gpipe", "one device: the orders hold the same")
    try:
        one = simulate_pipeline(built, group_assignment, m, **args, order="1f1b")
    except PlanError as e:
        return OrderChoice("gpipe", str(e))
    gp = simulate_pipeline(built, group_assignment, m, **args)
    peak_1, peak_g = float(np.max(one.peak_memory_bytes)), float(np.max(gp.peak_memory_bytes))
    facts = (f"1F1B {1e3 * one.step_time_s:.3f} ms, peak {peak_1 / 2**20:.1f} MiB; GPipe "
             f"{1e3 * gp.step_time_s:.3f} ms, peak {peak_g / 2**20:.1f} MiB (simulated)")
    capacity = np.asarray(built.problem.capacity_bytes, dtype=float) * (1 + 1e-9)
    fits_1, fits_g = bool(np.all(one.peak_memory_bytes <= capacity)), bool(np.all(gp.peak_memory_bytes <= capacity))
    if fits_1 and not fits_g:
        return OrderChoice("1f1b", facts + ": only 1F1B fits the devices' memory", one.step_time_s)
    if fits_1 == fits_g and peak_1 < peak_g and one.step_time_s <= gp.step_time_s * (1 + ORDER_TIME_TOLERANCE):
        return OrderChoice("1f1b", facts, one.step_time_s)
    return OrderChoice("gpipe", facts)


def candidate_microbatches(batch_size: int, limit: int = MAX_AUTO_MICROBATCHES) -> list[int]:
    """The divisors of ``batch_size`` up to ``limit`` (``microbatches="auto"`` tries each).

    Examples
    --------
    >>> candidate_microbatches(24)
    [1, 2, 3, 4, 6, 8, 12]
    """
    return [m for m in range(1, min(batch_size, limit) + 1) if batch_size % m == 0]


def best_microbatches(built: Any, group_assignment: np.ndarray, batch_size: int,
                      candidates: Sequence[int] | None = None, small: SmallBatchCosts | None = None
                      ) -> tuple[int, float]:
    """``(m, predicted step s)`` of the candidate with the shortest simulated pipelined step (ties: fewer).

    Raises
    ------
    PlanError
        No candidate divides ``batch_size``.
    """
    cands = candidate_microbatches(batch_size) if candidates is None else [
        m for m in candidates if m >= 1 and batch_size % m == 0]
    if not cands:
        raise PlanError(f"no micro-batch count among {list(candidates or [])} divides the batch of {batch_size}")
    scored = [(simulate_pipeline(built, group_assignment, m, small=small, batch_size=batch_size).step_time_s, m)
              for m in cands]
    step, m = min(scored)
    return m, step
