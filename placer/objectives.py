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
                       :func:`placer.problem.evaluate`)
memory         bytes   bytes crossing devices, with every device under its
                       capacity (the least traffic that fits)
=============  ======  ==========================================================

Every objective is ``inf`` for an infeasible assignment (a node on a device it
may not use, or a device over capacity), and comes with a cheap lower bound.

Examples
--------
>>> import numpy as np
>>> from cost_models import TensorEdge
>>> from placer.problem import PlacementProblem
>>> p = PlacementProblem.build(["a", "b", "c"], np.ones((3, 2)), np.zeros(3), np.full(2, np.inf),
...     [TensorEdge(0, (1, 2), 1e3)], np.full((2, 2), 1e6), np.zeros((2, 2)))
>>> a = np.array([0, 0, 1])
>>> [round(OBJECTIVES[o].value(p, a), 6) for o in ("latency", "throughput", "memory")]
[2.001, 2.001, 1000.0]
>>> round(OBJECTIVES["latency"].lower_bound(p), 6)   # critical path a -> b
2.0
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from cost_models import simulate

from .errors import GraphError, SolverError
from .problem import PlacementProblem, evaluate, trivial_lower_bound

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


def makespan(problem: PlacementProblem, assignment: np.ndarray) -> float:
    """Simulated one-step time of the fine DAG under ``assignment`` (``inf`` if infeasible)."""
    if not evaluate(problem, assignment).feasible:
        return float("inf")
    sched = problem.schedule_view()
    fine = np.asarray(assignment, dtype=int)[sched.group]
    try:
        res = simulate(sched.durations_s, sched.tensors, fine, problem.occupancy_seconds, control_edges=sched.control,
                       link_latency_s=problem.latency)
    except ValueError as e:
        raise GraphError(f"cannot simulate the placed graph: {e}") from e
    return res.step_time_s


def critical_path_bound(problem: PlacementProblem) -> float:
    """max(critical path with each op on its fastest device and free transfers, work / devices).

    Both terms bound any schedule's makespan from below.
    """
    sched = problem.schedule_view()
    best = np.where(np.isfinite(sched.durations_s), sched.durations_s, np.inf).min(axis=1)
    if sched.m == 0:
        return 0.0
    finish = np.zeros(sched.m)
    preds: list[list[int]] = [[] for _ in range(sched.m)]
    for t in sched.tensors:
        for w in set(t.dsts) - {t.src}:
            preds[w].append(t.src)
    for u, w in sched.control:
        preds[w].append(u)
    for v in problem.schedule_order():
        finish[v] = best[v] + max((finish[u] for u in preds[v]), default=0.0)
    return float(max(finish.max(), best.sum() / problem.k))


def max_load(problem: PlacementProblem, assignment: np.ndarray) -> float:
    """Pipelined max-load (``inf`` if infeasible)."""
    return evaluate(problem, assignment).objective


def traffic_bytes(problem: PlacementProblem, assignment: np.ndarray) -> float:
    """Bytes crossing devices (``inf`` if infeasible)."""
    ev = evaluate(problem, assignment)
    return float(ev.traffic_bytes.sum()) if ev.feasible else float("inf")


_register(Objective("latency", "s", makespan, critical_path_bound, cpsat_model="max_load"))
_register(Objective("throughput", "s", max_load, trivial_lower_bound, cpsat_model="max_load"))
_register(Objective("memory", "bytes", traffic_bytes, lambda p: 0.0, cpsat_model="traffic"))
