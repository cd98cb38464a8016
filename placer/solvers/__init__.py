"""Placement solvers: pure functions over a :class:`PlacementProblem`.

No module in this package imports TensorFlow. Solvers are registered by
name; :func:`solve_problem` picks one by argument (``"auto"`` by default)
and scores every plan by ``SolveOptions.objective``
(:data:`placer.core.objectives.OBJECTIVES`).

============  =======================================================
name          what it does
============  =======================================================
auto          every heuristic below, then CP-SAT warm-started from the
              best (on a coarsened problem when it is large), then
              local refinement; the best plan is kept
cpsat         CP-SAT max-load or min-traffic model, proven bound
heft          HEFT list scheduling (earliest finish), memory-capped
group_heft    HEFT on the contracted graph: each group one unit
etf           ETF list scheduling (earliest start; Baechi's m-ETF)
cp_heft       critical path first, each op where it finishes first; the
              plan keeps each device's order of its ops (control edges:
              :mod:`placer.core.order`; simulated objectives)
cp_etf        each free device takes the most critical op that has
              arrived (time-driven HLFET with transfers); order kept too
partition     METIS k-way partition (balanced compute, min bytes cut)
mincut        exact min-cut of total busy time (2 devices only)
contiguous    topological order in k equal-compute stages
contiguous_dp the best split of the topological order into stages (DP
              over the throughput objective, Tarnawski et al.)
layer_dp      the same DP over the layers' order (a training step's
              forward, gradient and update ops of a layer together)
heavy_enum    every placement of the few heaviest nodes, the others
              following the nearest (where a few hold 80% of the work)
path_runs     the latency bound's split of the heaviest path into runs,
              each run's nodes on a device in turn (simulated objectives)
round_robin   nodes dealt to devices in turn
single        everything on the best single device that fits
============  =======================================================

Examples
--------
Two independent 1 s nodes and a third that reads the first, on two devices:

>>> import numpy as np
>>> from cost_models import TensorEdge
>>> from placer.core.problem import PlacementProblem
>>> p = PlacementProblem.build(names=["a", "b", "c"], compute_s=np.ones((3, 2)), memory_bytes=np.zeros(3),
...                            capacity_bytes=np.full(2, np.inf), tensors=[TensorEdge(0, (2,), 0.0)],
...                            bandwidth=np.full((2, 2), 1e9), latency=np.zeros((2, 2)))
>>> s = solve_problem(p, "auto", SolveOptions(time_limit_s=1.0))
>>> s.objective, round(s.gap, 4), s.status   # a then c: the critical path
(2.0, 0.0, 'optimal')
"""

from __future__ import annotations

import logging

from ..core.objectives import get_objective
from ..core.problem import PlacementProblem
from ..errors import SolverError
from . import cpsat as _cpsat  # noqa: F401  (registers)
from . import heavy as _heavy  # noqa: F401
from . import heuristics as _heuristics  # noqa: F401
from . import listsched as _listsched  # noqa: F401
from . import mincut as _mincut  # noqa: F401
from . import partition as _partition  # noqa: F401
from . import runs as _runs  # noqa: F401
from . import pipeline_stages as _pipeline_stages  # noqa: F401
from .auto import DEFAULT_SOLVER, auto, no_plan_error
from .base import DEFAULT_MAX_NODES, DEFAULT_TIME_LIMIT_S, Solution, SolveOptions
from .registry import SOLVERS

__all__ = ["DEFAULT_MAX_NODES", "DEFAULT_SOLVER", "DEFAULT_TIME_LIMIT_S", "SolveOptions", "Solution",
           "available_solvers", "solve_problem"]

log = logging.getLogger(__name__)


def available_solvers() -> list[str]:
    """Names accepted by :func:`solve_problem`."""
    return sorted([*SOLVERS, "auto"])


def solve_problem(problem: PlacementProblem, algorithm: str = DEFAULT_SOLVER,
                  options: SolveOptions | None = None) -> Solution:
    """Place ``problem`` with the named algorithm.

    Parameters
    ----------
    problem : PlacementProblem
    algorithm : str
        One of :func:`available_solvers`; default ``"auto"``.
    options : SolveOptions, optional
        Time limit, seed and the objective to score plans by.

    Raises
    ------
    SolverError
        Unknown algorithm or objective, or an algorithm used outside its domain.
    NoFeasiblePlanError
        Nothing feasible was found; the message lists what was tried.
    """
    options = options or SolveOptions()
    get_objective(options.objective)
    if algorithm == "auto":
        sol = auto(problem, options)
    elif algorithm in SOLVERS:
        reason = SOLVERS[algorithm].unmet(problem)
        if reason is not None:
            raise SolverError(f"{algorithm} cannot place this problem: {reason}; choose another algorithm "
                              f"(e.g. {DEFAULT_SOLVER!r})")
        found = SOLVERS[algorithm](problem, options)
        if found is None:
            raise no_plan_error(problem, options, [algorithm])
        sol = found
    else:
        raise SolverError(f"unknown algorithm {algorithm!r}; choose one of {available_solvers()}")
    log.debug("solved %d nodes on %d devices with %s: %s %.6g, gap %.2f%%", problem.n, problem.k, sol.solver,
              options.objective, sol.objective, 100 * sol.gap)
    return sol
