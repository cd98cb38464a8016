"""Placement solvers: pure functions over a :class:`PlacementProblem`.

No module in this package imports TensorFlow. Solvers are registered by
name; :func:`solve_problem` picks one by argument (``"auto"`` by default).

============  =======================================================
name          what it does
============  =======================================================
auto          best heuristic as warm start, then ``cpsat``; best kept
cpsat         CP-SAT max-load model, proven lower bound (k devices)
mincut        exact min-cut of total busy time (2 devices only)
contiguous    topological order in k equal-compute stages
round_robin   nodes dealt to devices in turn
single        everything on the fastest device that fits
============  =======================================================

Examples
--------
>>> import numpy as np
>>> from cost_models import TensorEdge
>>> from placer.problem import PlacementProblem
>>> p = PlacementProblem.build(["a", "b", "c"], np.ones((3, 2)), np.zeros(3), np.full(2, np.inf),
...     [TensorEdge(0, (1, 2), 0.0)], np.full((2, 2), 1e9), np.zeros((2, 2)))
>>> s = solve_problem(p, "auto", SolveOptions(time_limit_s=1.0))
>>> s.objective, round(s.gap, 4), s.status
(2.0, 0.0, 'optimal')
"""

from __future__ import annotations

import logging
import time

from ..errors import NoFeasiblePlanError, SolverError
from ..problem import PlacementProblem
from . import cpsat as _cpsat  # noqa: F401  (registers)
from . import heuristics as _heuristics  # noqa: F401
from . import mincut as _mincut  # noqa: F401
from .base import SolveOptions, Solution
from .registry import SOLVERS

__all__ = ["DEFAULT_SOLVER", "SolveOptions", "Solution", "available_solvers", "solve_problem"]

log = logging.getLogger(__name__)

#: The algorithm used when none is named.
DEFAULT_SOLVER = "auto"
_WARM_STARTS = ("single", "round_robin", "contiguous", "mincut")


def available_solvers() -> list[str]:
    """Names accepted by :func:`solve_problem`."""
    return sorted([*SOLVERS, "auto"])


def _auto(problem: PlacementProblem, options: SolveOptions) -> tuple[Solution | None, list[str]]:
    tried: list[str] = []
    best: Solution | None = None
    t0 = time.perf_counter()
    for name in _WARM_STARTS:
        if name == "mincut" and problem.k != 2:
            continue
        sol = SOLVERS[name](problem, options)
        tried.append(f"{name}: {'no feasible plan' if sol is None else f'{sol.objective:.6g}'}")
        if sol is not None and (best is None or sol.objective < best.objective):
            best = sol
    if problem.k > 1:
        warm = best.assignment if best is not None else None
        exact = SOLVERS["cpsat"](problem, SolveOptions(options.time_limit_s, options.seed, options.workers, warm))
        tried.append(f"cpsat: {'no feasible plan' if exact is None else f'{exact.objective:.6g} ({exact.status})'}")
        if exact is not None:
            if best is None or exact.objective <= best.objective:
                best = exact
            else:  # keep the better heuristic plan, with cpsat's proven bound
                best = Solution(best.assignment, best.objective, max(best.lower_bound, exact.lower_bound),
                                best.solver, best.wall_s, best.status)
    if best is not None:
        best = Solution(best.assignment, best.objective, best.lower_bound, f"auto/{best.solver}",
                        time.perf_counter() - t0, best.status)
    return best, tried


def solve_problem(problem: PlacementProblem, algorithm: str = DEFAULT_SOLVER,
                  options: SolveOptions | None = None) -> Solution:
    """Place ``problem`` with the named algorithm.

    Parameters
    ----------
    problem : PlacementProblem
    algorithm : str
        One of :func:`available_solvers`; default ``"auto"``.
    options : SolveOptions, optional

    Raises
    ------
    SolverError
        Unknown algorithm, or one used outside its domain.
    NoFeasiblePlanError
        Nothing feasible was found; the message lists what was tried.
    """
    options = options or SolveOptions()
    if algorithm == "auto":
        sol, tried = _auto(problem, options)
    elif algorithm in SOLVERS:
        sol = SOLVERS[algorithm](problem, options)
        tried = [algorithm]
    else:
        raise SolverError(f"unknown algorithm {algorithm!r}; choose one of {available_solvers()}")
    if sol is None:
        raise NoFeasiblePlanError(
            f"no feasible placement of {problem.n} nodes on {problem.k} devices within "
            f"{options.time_limit_s:g} s; tried: {'; '.join(tried)}. Give the devices more memory, "
            "add devices, or raise time_limit_s."
        )
    log.debug("solved %d nodes on %d devices with %s: objective %.6g s, gap %.2f%%",
             problem.n, problem.k, sol.solver, sol.objective, 100 * sol.gap)
    return sol
