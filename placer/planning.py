"""Bridges between the op graph, the solver's problem and the simulator."""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from cost_models import SimResult, TensorEdge, simulate

from .coarsen import Coarsening
from .devices import DeviceSet
from .errors import CostError
from .opgraph import (
    ALIASING_OP_TYPES,
    ALLOWED_KINDS,
    COMPUTE_US,
    CONTROL,
    HELD_OP_TYPES,
    INPLACE_OP_TYPES,
    MEMORY_BYTES,
    OP_TYPE,
    OpGraph,
)
from .problem import PlacementProblem, Schedule


def _seconds_per_device(us_by_kind: Mapping[str, np.ndarray], allowed: Sequence[frozenset[str] | None],
                        devset: DeviceSet) -> np.ndarray:
    """``(n, k)`` seconds on each device: µs of its kind / speed; inf where the kind is not allowed."""
    out = np.empty((len(allowed), len(devset)))
    for d, dev in enumerate(devset.devices):
        out[:, d] = np.asarray(us_by_kind[dev.kind], dtype=float) * 1e-6 / dev.speed
        out[[a is not None and dev.kind not in a for a in allowed], d] = np.inf
    return out


def _op_arrays(op_graph: OpGraph, devset: DeviceSet) -> tuple[list[str], np.ndarray, list[TensorEdge],
                                                                list[tuple[int, int]]]:
    """Ops in topological order, their ``(n, k)`` seconds, tensors and control edges (op indices)."""
    g = op_graph.graph
    ops = op_graph.topological_ops()
    index = {op: i for i, op in enumerate(ops)}
    us_by_kind = {kind: [g.nodes[op][COMPUTE_US][kind] for op in ops] for kind in {d.kind for d in devset.devices}}
    durations = _seconds_per_device(us_by_kind, [g.nodes[op][ALLOWED_KINDS] for op in ops], devset)
    tensors = [TensorEdge(index[t.src], tuple(index[c] for c in t.dsts), float(t.nbytes)) for t in op_graph.tensors]
    control = [(index[u], index[v]) for u, v, c in g.edges(data=CONTROL) if c]
    return ops, durations, tensors, control


def build_problem(coarse: Coarsening, devset: DeviceSet, op_graph: OpGraph | None = None) -> PlacementProblem:
    """Placement problem of the coarse groups on ``devset`` (seconds, bytes).

    With ``op_graph``, the problem carries the op-level DAG as its schedule,
    so that the ``latency`` objective simulates ops, not groups.
    """
    compute = _seconds_per_device(coarse.compute_us, coarse.allowed_kinds, devset)
    bw, lat, cap = devset.arrays()
    schedule = None
    if op_graph is not None:
        ops, durations, tensors, control = _op_arrays(op_graph, devset)
        group = np.array([coarse.group_of[op] for op in ops], dtype=int)
        schedule = Schedule(durations, tuple(tensors), tuple(control), group)
    return PlacementProblem.build(coarse.names, compute, coarse.memory_bytes, cap, coarse.tensors, bw, lat,
                                  coarse.order, schedule=schedule)


def project(coarse: Coarsening, assignment: np.ndarray, devset: DeviceSet) -> dict[str, str]:
    """Op name → device name, from a group assignment."""
    names = devset.names
    return {op: names[int(assignment[i])] for i, members in enumerate(coarse.groups) for op in members}


def simulate_ops(op_graph: OpGraph, devset: DeviceSet, op_devices: Mapping[str, str],
                 transfer_cpu_s: np.ndarray | None = None, ready_order: str = "fifo",
                 speed: Sequence[float] | None = None) -> SimResult:
    """Simulate one step of the op-level graph under ``op_devices``.

    ``transfer_cpu_s`` (``(k, k)``, optional) charges each cross-device tensor
    that much compute on both devices; ``ready_order`` picks which ready op
    a device runs next (see :func:`cost_models.simulate`). ``speed`` (one
    factor per device of ``devset``, optional) multiplies each device's op
    times: a device measured 20% slower than the one its kind was profiled
    on gets 1.2.

    Raises
    ------
    CostError
        If ``speed`` does not give one positive finite factor per device.
    """
    ops, durations, tensors, control = _op_arrays(op_graph, devset)
    if speed is not None:
        factors = np.asarray(speed, dtype=float)
        if factors.shape != (len(devset),) or not np.isfinite(factors).all() or (factors <= 0).any():
            raise CostError(f"speed must be {len(devset)} positive finite factors (one per device), "
                                 f"got {list(speed)!r}")
        durations = durations * factors[None, :]
    dev_index = {name: i for i, name in enumerate(devset.names)}
    assignment = [dev_index[op_devices[op]] for op in ops]

    bw, lat, _ = devset.arrays()

    def occupancy(i: int, j: int, nbytes: float) -> float:
        return 0.0 if nbytes <= 0 else nbytes / bw[i, j]

    g = op_graph.graph
    return simulate(durations, tensors, assignment, occupancy, control_edges=control, link_latency_s=lat,
                    transfer_cpu_s=transfer_cpu_s, ready_order=ready_order,
                    resident_bytes=[g.nodes[op][MEMORY_BYTES] for op in ops],
                    aliasing=[g.nodes[op][OP_TYPE] in ALIASING_OP_TYPES for op in ops],
                    inplace=[g.nodes[op][OP_TYPE] in INPLACE_OP_TYPES for op in ops],
                    held=[g.nodes[op][OP_TYPE] in HELD_OP_TYPES for op in ops])
