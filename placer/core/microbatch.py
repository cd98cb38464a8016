"""The predicted step of a plan run as a pipeline of micro-batches (no TensorFlow).

:mod:`placer.tf.microbatch` runs ``m`` copies of the placed graph, one per
micro-batch, and orders each device's work with gates: a device finishes
micro-batch ``i`` (every op of it there) before it starts ``i + 1``; in a
training step the forward and the backward copies are ordered apart (GPipe)
and the optimizer's update runs once, on the summed gradients.
:func:`pipelined_schedule` builds the same graph for the simulator: the
fine schedule copied ``m`` times, each tensor's bytes divided by ``m``, per
device and phase (the graph's ``phase``) a zero-time gate between
consecutive copies, and the update once, fed by every copy. Variables are
read by every copy; their bytes are resident once. Until 2026-12-03 a
training step was simulated with whole micro-batches gated (a device ran
micro-batch ``i``'s backward pass before ``i + 1``'s forward pass) and the
update once per micro-batch, unlike what runs. Op times do not shrink with the rows
(fixed per-op costs): with :class:`SmallBatchCosts`, measured at a second
batch, each op's time on a micro-batch is interpolated between the two.

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

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from cost_models import SimOptions, SimResult, TensorEdge, simulate

from ..errors import PlanError
from .attrs import PHASES
from .problem import Schedule

#: Largest number of micro-batches ``microbatches="auto"`` tries.
MAX_AUTO_MICROBATCHES = 16


@dataclass(frozen=True)
class SmallBatchCosts:
    """Op times measured at a second, smaller batch: what a micro-batch's ops cost is not linear in its rows.

    Measured here (2 cores, an 8-tower MLP): the ops sum to 18.3 ms at batch
    64 and 7.9 ms at batch 8, not 2.3 ms (fixed per-op costs, small
    matrices). Each op's time at a batch between the two is interpolated
    linearly (affine in the rows), and held at ``durations_s`` below ``batch``.

    Attributes
    ----------
    batch : int
        The smaller batch the ops were profiled at.
    durations_s : numpy.ndarray
        ``(fine nodes, devices)`` seconds at ``batch``, rows in the schedule's order.
    """

    batch: int
    durations_s: np.ndarray

    def at(self, full: np.ndarray, full_batch: int, rows: float) -> np.ndarray:
        """The ``(fine nodes, devices)`` seconds at ``rows`` rows, from ``full`` (at ``full_batch``) and these."""
        if full_batch <= self.batch:
            return full * (rows / full_batch)
        w = min(max((rows - self.batch) / (full_batch - self.batch), 0.0), 1.0)
        return self.durations_s + w * (full - self.durations_s)


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
                       micro_durations_s: np.ndarray | None = None, phases: Sequence[str] | None = None
                       ) -> tuple[np.ndarray, tuple[TensorEdge, ...], tuple[tuple[int, int], ...], np.ndarray]:
    """``(durations, tensors, control edges, fine assignment)`` of ``m`` gated copies of ``schedule``.

    Node ``i * n + v`` is op ``v`` of micro-batch ``i``; the gates follow the ``m * n`` ops.
    ``micro_durations_s``: each op's seconds on a micro-batch (default: the schedule's divided by ``m``).

    ``phases`` (per fine node, :data:`placer.core.attrs.PHASES`; default all ``"forward"``), as the
    placed training step runs them (:mod:`placer.tf.microbatch`): each device orders its forward copies
    and, apart, its backward copies (GPipe: a device need not finish micro-batch ``i``'s backward pass
    before it starts ``i + 1``'s forward pass), and the ops that run once (:func:`_run_once`: the update
    and what depends on it) run in the last copy at their full time, fed by every copy, with full bytes for tensors into them
    (gradients have a weight's size whatever the rows); their other copies are empty (no time, no edges),
    so that node ``i * n + v`` stays op ``v`` of micro-batch ``i``.
    """
    fine = np.asarray(group_assignment, dtype=int)[schedule.group]
    n, k = schedule.durations_s.shape
    phase = [PHASES[0]] * n if phases is None else list(phases)
    once = _run_once(schedule, phase)
    last = (m - 1) * n
    local_src: set[int] = set()
    has_local_input = np.zeros(n, dtype=bool)

    def local(u: int, w: int) -> bool:
        return fine[w] == fine[u] and phase[w] == phase[u] and w != u and not once[u] and not once[w]

    for t in schedule.tensors:
        for w in t.dsts:
            if local(t.src, w):
                has_local_input[w] = True
                local_src.add(t.src)
    for u, v in schedule.control:
        if local(u, v):
            has_local_input[v] = True
            local_src.add(u)
    exits = [v for v in range(n) if v not in local_src and not once[v]]
    entries = [v for v in range(n) if not has_local_input[v] and not once[v]]
    keys = sorted({(int(fine[v]), phase[v]) for v in range(n) if not once[v]})
    gate = {(i, d, ph): m * n + i * len(keys) + j for i in range(m - 1) for j, (d, ph) in enumerate(keys)}
    total = m * n + len(gate)
    durations = np.zeros((total, k))
    micro = schedule.durations_s / m if micro_durations_s is None else np.asarray(micro_durations_s, dtype=float)
    durations[:m * n] = np.tile(np.where(once[:, None], 0.0, micro), (m, 1))
    durations[last:m * n][once] = schedule.durations_s[once]
    assignment = np.concatenate([np.tile(fine, m), np.array([d for (_, d, _) in gate], dtype=int)]).astype(int)
    tensors = []
    for t in schedule.tensors:
        if once[t.src]:
            tensors.append(TensorEdge(last + t.src, tuple(last + w for w in t.dsts), t.nbytes, t.count))
            continue
        copied = tuple(w for w in t.dsts if not once[w])
        into_once = tuple(w for w in t.dsts if once[w])
        for i in range(m):
            if copied:
                tensors.append(TensorEdge(i * n + t.src, tuple(i * n + w for w in copied), t.nbytes / m, t.count))
            if into_once:
                tensors.append(TensorEdge(i * n + t.src, tuple(last + w for w in into_once), t.nbytes, t.count))
    control = []
    for u, v in schedule.control:
        if once[u]:
            control.append((last + u, last + v))
        else:
            control += [(i * n + u, (last if once[v] else i * n) + v) for i in range(m)]
    for (i, d, ph), g in gate.items():
        control += [(i * n + v, g) for v in exits if fine[v] == d and phase[v] == ph]
        control += [(g, (i + 1) * n + v) for v in entries if fine[v] == d and phase[v] == ph]
    return durations, tuple(tensors), tuple(control), assignment


def simulate_pipeline(built: Any, group_assignment: np.ndarray, m: int,
                      options: SimOptions = SimOptions(peak_memory=False), *,
                      small: SmallBatchCosts | None = None, batch_size: int | None = None) -> SimResult:
    """One simulated step of ``built``'s plan as ``m`` micro-batches (the whole batch, all copies).

    ``small`` (with the planning ``batch_size``): op times at a smaller batch, interpolated to the
    micro-batch (:class:`SmallBatchCosts`); without it each op's time is divided by ``m``.
    """
    if m == 1:
        return built.simulate(group_assignment, options)
    micro = None
    if small is not None and batch_size:
        micro = small.at(built.schedule.durations_s, batch_size, batch_size / m)
    d, tensors, control, a = pipelined_schedule(built.schedule, group_assignment, m, micro, built.phases or None)
    p = built.problem
    return simulate(d, tensors, a, p.occupancy_seconds, control_edges=control, link_latency_s=p.latency,
                    options=p.sim_options(options))


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
