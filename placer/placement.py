"""``placer.solve``: place a cost-annotated ``networkx.DiGraph`` (no TensorFlow).

Examples
--------
Two independent 3 ms branches and a join, on two devices:

>>> import networkx as nx
>>> g = nx.DiGraph()
>>> for v, us in {"in": 1.0, "left": 3000.0, "right": 3000.0, "join": 1.0}.items():
...     g.add_node(v, compute_us=us)
>>> g.add_edges_from([("in", "left"), ("in", "right"), ("left", "join"), ("right", "join")], bytes=1024)
>>> p = solve(g, ["/CPU:0", "/CPU:1"], time_limit=1.0)
>>> p.assignment["left"] != p.assignment["right"], p.objective, p.status
(True, 'latency', 'heuristic')
>>> round(p.value * 1e3, 3), round(p.lower_bound * 1e3, 3)   # ms: makespan, critical path
(3.022, 3.002)
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Hashable, Mapping, Sequence

import networkx as nx
import numpy as np

from .devices import DeviceSet, resolve_devices
from .errors import SolverError
from .graphs import layer_keys, problem_from_graph
from .objectives import DEFAULT_OBJECTIVE, OBJECTIVES, get_objective
from .plan import Scored
from .problem import evaluate
from .solvers import DEFAULT_SOLVER, SolveOptions, solve_problem

log = logging.getLogger(__name__)

#: Search budget when ``time_limit`` is None (heuristics run on top of it).
DEFAULT_TIME_LIMIT_S = 5.0


@dataclass(frozen=True)
class Placement(Scored):
    """A solved placement of a graph (quality fields: :class:`~placer.plan.Scored`).

    Attributes
    ----------
    assignment : Mapping
        Graph node → canonical device name.
    wall_s : float
        Seconds spent in :func:`solve` (validation, coarsening and search).
    devices : tuple of str
        Device names, in the order of the per-device figures.
    step_time_s, max_load_s, traffic_bytes : float
        The plan under every objective: simulated step, pipelined max load,
        bytes crossing devices.
    device_load_s, device_memory_bytes : tuple of float
        Per-device compute + communication load and resident memory.
    """

    assignment: Mapping[Hashable, str] = field(default_factory=dict)
    wall_s: float = 0.0
    devices: tuple[str, ...] = ()
    step_time_s: float = 0.0
    max_load_s: float = 0.0
    traffic_bytes: float = 0.0
    device_load_s: tuple[float, ...] = ()
    device_memory_bytes: tuple[float, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (node keys as strings)."""
        return {
            "objective": self.objective, "unit": self.unit, "value": self.value, "lower_bound": self.lower_bound,
            "gap": self.gap, "solver": self.solver, "status": self.status, "wall_s": self.wall_s,
            "step_time_s": self.step_time_s, "max_load_s": self.max_load_s, "traffic_bytes": self.traffic_bytes,
            "devices": [{"name": n, "load_s": ld, "memory_bytes": mb}
                        for n, ld, mb in zip(self.devices, self.device_load_s, self.device_memory_bytes)],
            "assignment": {str(k): v for k, v in self.assignment.items()},
        }


def solve(
    graph: nx.DiGraph,
    devices: Sequence[Any] | DeviceSet,
    *,
    objective: str = DEFAULT_OBJECTIVE,
    algorithm: str = DEFAULT_SOLVER,
    time_limit: float | None = None,
    seed: int = 0,
    max_nodes: int = 1500,
) -> Placement:
    """Place every node of ``graph`` on one of ``devices``.

    Parameters
    ----------
    graph : networkx.DiGraph
        A DAG in the format of :mod:`placer.graphs` (``compute_us``,
        ``memory_bytes``, ``colocation``, ``allowed_kinds``; edges ``bytes``).
    devices : sequence or DeviceSet
        Device strings or :class:`~placer.DeviceSpec` (name, memory, speed,
        link); a :class:`~placer.devices.DeviceSet` to give every link.
    objective : str
        ``"latency"`` (default: one step's simulated makespan),
        ``"throughput"`` (pipelined max device load) or ``"memory"`` (least
        bytes across devices with every device under capacity).
    algorithm : str
        A name from :func:`placer.solvers.available_solvers`; ``"auto"``
        runs all heuristics, CP-SAT and local refinement.
    time_limit : float, optional
        Search budget in seconds (default :data:`DEFAULT_TIME_LIMIT_S`).
        ``auto`` spends it by *estimated* work (per-op rates of each stage,
        CP-SAT's deterministic time), never by reading the clock, so the
        wall time on a slow or loaded machine can exceed it while the plan
        stays the same. The best plan found is returned with its gap.
    seed : int
        Same graph, devices, time limit and seed give the same plan (CP-SAT
        also has a wall-clock safety cap of 8× its budget + 5 s; a warning
        is logged when it cuts a search short).
    max_nodes : int
        Problems with more colocation groups than this are coarsened
        (heavy-edge matching, layer scopes first) before CP-SAT.

    Returns
    -------
    Placement

    Raises
    ------
    GraphError, CostError, DeviceError
        Bad graph or devices; the message names the node or device.
    InsufficientMemoryError
        A colocation group or the whole graph cannot fit.
    NoFeasiblePlanError
        No algorithm found a plan within the budget.
    SolverError
        Unknown objective or algorithm.
    """
    t0 = time.perf_counter()
    obj = get_objective(objective)
    devset = devices if isinstance(devices, DeviceSet) else resolve_devices(devices)
    problem, nodes = problem_from_graph(graph, devset)
    log.info("placing %d nodes (%d colocation groups) on %d devices, objective %s",
             len(nodes), problem.n, len(devset), objective)
    limit = DEFAULT_TIME_LIMIT_S if time_limit is None else float(time_limit)
    if limit <= 0:
        raise SolverError(f"time_limit must be positive, got {time_limit!r}")
    keys = layer_keys(graph, nodes, problem)
    options = SolveOptions(time_limit_s=limit, seed=seed, objective=objective, max_nodes=max_nodes,
                           coarsen_keys=None if keys is None else tuple(keys))
    sol = solve_problem(problem, algorithm, options)
    group_dev = np.asarray(sol.assignment, dtype=int)
    fine_dev = group_dev[problem.schedule_view().group]
    ev = evaluate(problem, group_dev)
    step = OBJECTIVES["latency"].value(problem, group_dev)
    wall = time.perf_counter() - t0
    log.info("placed with %s: %s %.6g %s (lower bound %.6g, gap %.1f%%) in %.2f s", sol.solver, objective,
             sol.objective, obj.unit, sol.lower_bound, 100 * sol.gap, wall)
    return Placement(
        assignment={v: devset.names[int(fine_dev[i])] for i, v in enumerate(nodes)},
        objective=objective, unit=obj.unit, value=float(sol.objective), lower_bound=float(sol.lower_bound),
        gap=float(sol.gap), solver=sol.solver, status=sol.status, wall_s=wall, devices=devset.names,
        step_time_s=float(step), max_load_s=float(ev.objective), traffic_bytes=float(ev.traffic_bytes.sum()),
        device_load_s=tuple(float(x) for x in ev.load_s), device_memory_bytes=tuple(float(x) for x in ev.memory_bytes),
    )
