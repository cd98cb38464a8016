"""The predicted step of a forward pass run as data-parallel replicas: a copy of the plan per group of devices.

Data parallelism is what a Keras user with several devices runs first: a
copy of the model per device, each on its part of the batch. For a forward
pass, :mod:`placer.tf.rewrites.copies` emits it as ``R × m`` copies of the
placed graph (``R`` groups of devices, ``m`` micro-batches each): copy
``c`` runs on group ``c // m``, its ops on the devices the plan gives group
0's, mapped device for device (:func:`group_maps`); each device orders its
own copies with gates. Each group reads the weights from its own devices (the
variables on group 0's, a mirror of each on every other group's, kept equal
to the variable by :class:`placer.tf.placement.ReplicatedVariable`), once per
step for all its copies. The batch splits into ``R × m`` parts as evenly as
it allows.

:func:`replicated_schedule` builds that graph for the simulator and
:func:`simulate_replicas` runs it; :func:`best_replicas` searches ``R``
(one device per group) and ``m`` together. No TensorFlow.

Examples
--------
>>> group_maps(4, 2).tolist()
[[0, 1, 2, 3], [2, 3, 2, 3]]
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping, Sequence

import numpy as np

from cost_models import MemoryTraits, SimOptions, SimResult, TensorEdge, simulate

from ..errors import PlanError
from .attrs import PHASES
from .microbatch import (SmallBatchCosts, ParameterCodec, _pipelined_memory, _ungated, copies_fed,
                         pipelined_schedule, sum_seconds_per_byte, unit_ends)
from .problem import Schedule


def group_maps(devices: int, replicas: int) -> np.ndarray:
    """``(replicas, devices)``: row ``g`` maps a device of group 0 to its twin in group ``g``.

    The devices split in order into ``replicas`` equal groups (group ``g`` is devices
    ``g·s … g·s + s - 1``, ``s = devices / replicas``); a device outside group 0 maps to itself in
    every row (a plan of group 0 never uses one).

    Raises
    ------
    PlanError
        ``replicas`` below 1 or not dividing ``devices``.
    """
    if replicas < 1 or devices % replicas:
        raise PlanError(f"replicas={replicas} does not divide the {devices} devices; give a multiple of "
                        f"{replicas} devices (the replicas split them into equal groups, in order)")
    size = devices // replicas
    maps = np.tile(np.arange(devices), (replicas, 1))
    for g in range(1, replicas):
        maps[g, :size] = np.arange(size) + g * size
    return maps


def device_groups(devices: Sequence[str], replicas: int) -> tuple[tuple[str, ...], ...]:
    """The devices in order in ``replicas`` equal groups (what :func:`group_maps` maps between).

    Raises
    ------
    PlanError
        ``replicas`` not dividing the devices.

    Examples
    --------
    >>> device_groups(["a", "b", "c", "d"], 2)
    (('a', 'b'), ('c', 'd'))
    """
    group_maps(len(devices), replicas)  # checks
    size = len(devices) // replicas
    return tuple(tuple(devices[g * size:(g + 1) * size]) for g in range(replicas))


def pinned_nodes(schedule: Schedule, resident_bytes: Sequence[float] | None) -> np.ndarray:
    """Per fine node: whether it stays where the plan put it in every copy and runs once per step: the
    variables (resident bytes) and their reads (every tensor input from a variable)."""
    n = schedule.durations_s.shape[0]
    resident = np.zeros(n, dtype=bool) if resident_bytes is None else np.asarray(resident_bytes, float)[:n] > 0
    from_resident = np.zeros(n, dtype=bool)
    from_other = np.zeros(n, dtype=bool)
    for t in schedule.tensors:
        for w in t.dsts:
            if resident[t.src]:
                from_resident[w] = True
            else:
                from_other[w] = True
    return resident | (from_resident & ~from_other)


def replicated_schedule(schedule: Schedule, group_assignment: np.ndarray, maps: np.ndarray, m: int,
                        micro_durations_s: np.ndarray | None = None, pinned: np.ndarray | None = None,
                        mirrors: bool = True
                        ) -> tuple[np.ndarray, tuple[TensorEdge, ...], tuple[tuple[int, int], ...], np.ndarray]:
    """``(durations, tensors, control edges, fine assignment)`` of a forward pass as ``R × m`` copies.

    ``maps`` (:func:`group_maps`, ``R`` rows): copy ``c`` runs on group ``c // m``, each op on
    ``maps[c // m][d]`` for its planned device ``d``. Node ``c * n + v`` is op ``v`` of copy ``c``; the
    gates follow the copies. ``pinned`` ops (:func:`pinned_nodes`: the variables and their reads) run once
    per group, in its first copy, and feed the group's copies their full bytes (a weight has its size
    whatever the rows): with ``mirrors`` on the group's own device (a copy of the weights per device, as
    :mod:`placer.tf.rewrites.copies` emits them), else once in all, in copy 0 on the planned device (every
    other group receives each weight once per step); their other copies are empty. Other tensors carry
    ``1 / (R m)`` of their bytes. ``micro_durations_s``: each op's seconds on one copy's rows (default: the
    schedule's divided by ``R m``). Each device chains its own copies in order (GPipe's forward gates): copy
    ``c``'s ops that take a tensor from no other op of the copy there wait for copy ``c - 1``'s last ops
    there.
    """
    fine = np.asarray(group_assignment, dtype=int)[schedule.group]
    n, k = schedule.durations_s.shape
    maps = np.asarray(maps, dtype=int)
    total_copies = len(maps) * m
    pin = np.zeros(n, dtype=bool) if pinned is None else np.asarray(pinned, dtype=bool)
    forward = [PHASES[0]] * n
    ends = unit_ends(schedule, fine, forward, _ungated(schedule, fine, pin))  # the pinned ops are in no unit
    exits, entries = ({d: ops.get((d, PHASES[0]), []) for d in range(k)} for ops in ends)

    def holder(c: int) -> int:
        """The copy whose pinned ops copy ``c`` reads: its group's first (mirrors), else copy 0."""
        return (c // m) * m if mirrors else 0

    holders = sorted({holder(c) for c in range(total_copies)})
    micro = schedule.durations_s / total_copies if micro_durations_s is None else np.asarray(micro_durations_s)
    durations = np.tile(np.where(pin[:, None], 0.0, micro), (total_copies, 1))
    for h in holders:
        durations[h * n:(h + 1) * n][pin] = schedule.durations_s[pin]
    assignment = np.concatenate([np.where(pin & (not mirrors), fine, maps[c // m][fine])
                                 for c in range(total_copies)])
    tensors: list[TensorEdge] = []
    for t in schedule.tensors:
        if pin[t.src]:
            for h in holders:
                readers = [c for c in range(total_copies) if holder(c) == h]
                dsts = tuple(h * n + w for w in t.dsts if pin[w]) + tuple(
                    c * n + w for c in readers for w in t.dsts if not pin[w])
                tensors.append(TensorEdge(h * n + t.src, dsts, t.nbytes, t.count))
            continue
        for c in range(total_copies):  # a pinned op fed by a copied one does not occur in a forward pass
            tensors.append(TensorEdge(c * n + t.src, tuple(holder(c) * n + w if pin[w] else c * n + w
                                                           for w in t.dsts), t.nbytes / total_copies, t.count))
    control = []
    for c in range(total_copies):
        for u, v in schedule.control:
            if pin[u] and pin[v] and c != holder(c):
                continue
            control.append((holder(c) * n + u if pin[u] else c * n + u, holder(c) * n + v if pin[v] else c * n + v))
    gates: list[int] = []
    for c in range(1, total_copies):
        if c % m == 0:
            continue  # a group's first copy: the previous copy ran on another group
        for d in range(k):
            if not exits[d]:
                continue
            g = total_copies * n + len(gates)
            gates.append(int(maps[c // m][d]))
            control += [((c - 1) * n + v, g) for v in exits[d]]
            control += [(g, c * n + v) for v in entries[d]]
    durations = np.vstack([durations, np.zeros((len(gates), k))])
    assignment = np.concatenate([assignment, np.array(gates, dtype=int)]).astype(int)
    return durations, tuple(tensors), tuple(control), assignment


def _replicated_memory(memory: MemoryTraits, n: int, copies: int, holders: Sequence[int], total: int
                       ) -> MemoryTraits:
    """The memory traits of ``copies`` copies of ``n`` nodes (resident bytes in each holder copy: a mirror of
    the weights per group) and ``total - copies * n`` gates."""
    base = _pipelined_memory(memory, n, copies, total)
    if memory.resident_bytes is None:
        return base
    resident = np.zeros(total)
    for h in holders:
        resident[h * n:(h + 1) * n] = np.asarray(memory.resident_bytes, dtype=float)[:n]
    return replace(base, resident_bytes=list(resident))


def simulate_replicas(built: Any, group_assignment: np.ndarray, replicas: int, m: int,
                      options: SimOptions = SimOptions(peak_memory=False), *,
                      small: SmallBatchCosts | None = None, batch_size: int | None = None,
                      parameter_codec: ParameterCodec | None = None) -> SimResult:
    """One simulated forward step of ``built``'s plan (on group 0's devices) as ``replicas`` data-parallel
    groups of ``m`` micro-batches each (:func:`replicated_schedule`).

    ``small`` (with the planning ``batch_size``): op times at a smaller batch, interpolated to one copy's
    rows (:class:`~placer.core.microbatch.SmallBatchCosts`); without it each op's time is divided by the
    copies.

    A training step (``built.phases`` with a backward pass) runs one copy per group (``m`` = 1): each copy's
    forward and backward pass on its group, every copy's gradients summed where the variables live (the first
    group) and one update there (:func:`placer.core.microbatch.pipelined_schedule` with ``maps``), as
    :func:`placer.tf.replicas.replicated_train_step` runs it; each copy's row gathers of a table run where the
    table is (``built.anchored``), so only their rows travel, not the table. ``parameter_codec``: the codec
    of the weights each copy reads and the gradients it sends (training; :func:`pipelined_schedule`).

    Raises
    ------
    PlanError
        ``replicas`` not dividing the devices, or a training step with ``m`` > 1.
    """
    sched = built.schedule
    maps = group_maps(len(built.devices), replicas)
    copies = replicas * m
    micro = None
    if small is not None and batch_size:
        micro = small.at(sched.durations_s, batch_size, batch_size / copies)
    pinned = pinned_nodes(sched, built.memory.resident_bytes)
    training = "backward" in (built.phases or ())
    if training:
        if m != 1:
            raise PlanError("a replicated training step is predicted at one micro-batch per replica")
        d, tensors, control, a = pipelined_schedule(sched, group_assignment, replicas, micro, built.phases,
                                                    "gpipe", sum_seconds_per_byte(built), maps=maps, pinned=pinned,
                                                    anchored=np.asarray(built.anchored, dtype=bool),
                                                    parameter_codec=parameter_codec)
    else:
        d, tensors, control, a = replicated_schedule(sched, group_assignment, maps, m, micro, pinned)
    p = built.problem
    n = sched.durations_s.shape[0]
    if training:
        memory = _pipelined_memory(built.memory, n, copies, d.shape[0])
    else:
        memory = _replicated_memory(built.memory, n, copies, [g * m for g in range(replicas)], d.shape[0])
    return simulate(d, tensors, a, p.occupancy_seconds, control_edges=control, link_latency_s=p.latency,
                    memory=memory, options=replace(p.sim_options(options), fed=copies_fed(sched, copies)))


def best_replicas(built: Any, batch_size: int, replicas: Sequence[int], microbatches: Sequence[int], *,
                  small: SmallBatchCosts | None = None, parameter_codec: ParameterCodec | None = None,
                  group_assignments: Mapping[int, np.ndarray] | None = None) -> tuple[int, int, float] | None:
    """``(R, m, predicted step s)``: the data-parallel configuration with the shortest simulated step; ``None``
    where no candidate applies (fewer rows than copies, ``R`` not dividing the devices, or one device).

    A group of one device holds the whole model (group 0: the first device). ``group_assignments`` (``R`` →
    group assignment on group 0's devices, :meth:`placer.core.build.BuiltProblem.group_assignment`) places one
    copy over each group of several devices (a placement inside each copy); an ``R`` whose groups have several
    devices and no entry there is not tried. A training step tries ``m`` = 1 only, and ``R`` dividing the batch
    (the replicas' losses must give the full-batch step).

    Ties go to fewer copies. ``parameter_codec``: as :func:`simulate_replicas`.
    """
    k = len(built.devices)
    zero = np.zeros(len(built.problem.names), dtype=int)
    placed = dict(group_assignments or {})
    training = "backward" in (built.phases or ())
    scored = []
    for r in replicas:
        if r < 2 or k % r or (training and batch_size % r):
            continue
        if k // r > 1 and r not in placed:
            continue
        assignment = zero if k // r == 1 else placed[r]
        for m in ([1] if training else microbatches):
            if m >= 1 and r * m <= batch_size:
                step = simulate_replicas(built, assignment, r, m, small=small, batch_size=batch_size,
                                         parameter_codec=parameter_codec).step_time_s
                scored.append((step, r * m, r, m))
    if not scored:
        return None
    step, _, r, m = min(scored)
    return r, m, step
