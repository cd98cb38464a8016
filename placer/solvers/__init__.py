"""Placement solvers: pure functions over a :class:`PlacementProblem`.

No module in this package imports TensorFlow. Solvers are registered by
name; :func:`solve_problem` picks one by argument (``"auto"`` by default)
and scores every plan by ``SolveOptions.objective``
(:data:`placer.objectives.OBJECTIVES`).

============  =======================================================
name          what it does
============  =======================================================
auto          every heuristic below, then CP-SAT warm-started from the
              best (on a coarsened problem when it is large), then
              local refinement; the best plan is kept
cpsat         CP-SAT max-load or min-traffic model, proven bound
heft          HEFT list scheduling (earliest finish), memory-capped
etf           ETF list scheduling (earliest start; Baechi's m-ETF)
partition     METIS k-way partition (balanced compute, min bytes cut)
mincut        exact min-cut of total busy time (2 devices only)
contiguous    topological order in k equal-compute stages
round_robin   nodes dealt to devices in turn
single        everything on the best single device that fits
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
from dataclasses import replace

import numpy as np

from ..errors import GraphError, NoFeasiblePlanError, SolverError
from ..objectives import get_objective
from ..problem import PlacementProblem
from . import cpsat as _cpsat  # noqa: F401  (registers)
from . import heuristics as _heuristics  # noqa: F401
from . import listsched as _listsched  # noqa: F401
from . import mincut as _mincut  # noqa: F401
from . import partition as _partition  # noqa: F401
from .base import Solution, SolveOptions, finish
from .multilevel import coarsen_problem
from .refine import VISITS_PER_S, refine
from .registry import SOLVERS

__all__ = ["DEFAULT_SOLVER", "SolveOptions", "Solution", "available_solvers", "solve_problem"]

log = logging.getLogger(__name__)

#: The algorithm used when none is named.
DEFAULT_SOLVER = "auto"
#: Heuristics ``auto`` always runs on the full problem.
_HEURISTICS = ("single", "round_robin", "contiguous", "partition", "heft", "etf", "mincut")
#: The least refinement ``auto`` does (estimated seconds), even when the heuristics used the budget.
MIN_REFINE_S = 0.5
#: Estimated cost of each heuristic in µs per fine op: (fixed, per device), scoring excluded (that is
#: ``Objective.score_us_per_op``). ``auto`` spends its time limit by these estimates (measured on the
#: 2-core reference machine), not by the clock, so that its choices, and hence its plans, are
#: reproducible.
HEURISTIC_US_PER_OP: dict[str, tuple[float, float]] = {
    "single": (1.0, 0.0), "round_robin": (1.0, 0.0), "contiguous": (2.0, 0.0), "partition": (8.0, 0.0),
    "heft": (25.0, 10.0), "etf": (5.0, 15.0), "mincut": (250.0, 0.0),
}


def available_solvers() -> list[str]:
    """Names accepted by :func:`solve_problem`."""
    return sorted([*SOLVERS, "auto"])


def _describe(name: str, sol: Solution | None) -> str:
    return f"{name}: {'no feasible plan' if sol is None else f'{sol.objective:.6g}'}"


def _estimated_s(name: str, m: int, k: int, objective: str) -> float:
    """Estimated seconds of heuristic ``name`` on ``m`` fine ops and ``k`` devices, scoring included."""
    per_op, per_op_device = HEURISTIC_US_PER_OP[name]
    return 1e-6 * m * (per_op + per_op_device * k + get_objective(objective).score_us_per_op)


def _proven(value: float, bound: float) -> bool:
    """Whether ``value`` equals the lower ``bound`` (relative tolerance 1e-9): nothing to improve."""
    return value - bound <= 1e-9 * max(abs(value), 1e-300)


def _auto(problem: PlacementProblem, options: SolveOptions) -> tuple[Solution | None, list[str]]:
    # Every decision below reads the *estimated* work spent (sizes × measured rates), never the
    # clock, so the same problem, options and seed always give the same plan.
    t0 = time.perf_counter()
    m = problem.schedule_view().m
    left = options.time_limit_s
    tried: list[str] = []
    found: list[Solution] = []
    for name in _HEURISTICS:
        if name == "mincut" and problem.k != 2:
            continue
        if name == "mincut" and np.array_equal(problem.compute_s[:, 0], problem.compute_s[:, 1]):
            # min total busy time on two identical devices is one device (or infeasible): nothing new
            tried.append("mincut: skipped (identical devices)")
            continue
        left -= _estimated_s(name, m, problem.k, options.objective)
        try:
            sol = SOLVERS[name](problem, options)
        except GraphError as e:  # list schedulers need the schedule to be a DAG
            tried.append(f"{name}: skipped ({e})")
            continue
        tried.append(_describe(name, sol))
        log.info("%s (%.1f s)", tried[-1], time.perf_counter() - t0)
        if sol is not None:
            found.append(sol)
            if _proven(sol.objective, sol.lower_bound):
                tried.append(f"stopped: {name} reached the lower bound")
                break
    bound = max((s.lower_bound for s in found), default=0.0)
    best = min(found, key=lambda s: s.objective, default=None)
    cpsat_min_left = min(1.0, 0.25 * options.time_limit_s)  # less: building the model alone takes that
    search_on = problem.k > 1 and not (best is not None and _proven(best.objective, bound))

    if search_on and best is not None:
        model = "throughput" if get_objective(options.objective).cpsat_model == "max_load" else "memory"

        def polish(start: Solution, share_s: float) -> None:
            refined = refine(problem, start.assignment, model, work=int(max(share_s, MIN_REFINE_S) * VISITS_PER_S))
            sol = finish(problem, refined, f"{start.solver}+refine", t0, options, "feasible")
            tried.append(_describe(f"refine {start.solver}", sol))
            log.info("%s (%.1f s)", tried[-1], time.perf_counter() - t0)
            if sol is not None and sol.objective < start.objective:
                found.append(sol)

        # 1. local refinement of the best heuristic plan (a third of what is left)
        # (all of it when too little would be left for CP-SAT anyway)
        share = left / 3 if 2 * left / 3 >= cpsat_min_left else left
        polish(best, share)
        left -= max(share, MIN_REFINE_S)
        best = min(found, key=lambda s: s.objective)
    if search_on and found and left < cpsat_min_left:
        # building a CP-SAT model of a large problem alone takes seconds: keep the time limit
        tried.append("cpsat: skipped (the heuristics used the time limit)")
        log.info("%s (%.1f s)", tried[-1], time.perf_counter() - t0)
    elif search_on:
        # 2. CP-SAT, warm-started from the best plan so far, with the rest of the budget
        search, contraction = problem, None
        warm = best.assignment if best is not None else None
        if problem.n > options.max_nodes:
            contraction = coarsen_problem(problem, options.max_nodes, keys=options.coarsen_keys, seed=options.seed)
            search = contraction.coarse
            tried.append(f"coarsened {problem.n} -> {search.n} nodes")
            starts = [SOLVERS["partition"](search, replace(options, coarsen_keys=None))]
            if best is not None:
                work = np.where(np.isfinite(problem.compute_s), problem.compute_s, 0.0).max(axis=1)
                restricted = contraction.restrict(best.assignment, work)
                starts.append(finish(search, restricted, "restricted", t0, options))
            starts = [s for s in starts if s is not None]
            warm = min(starts, key=lambda s: s.objective).assignment if starts else None
        # CP-SAT's budget is deterministic time (reproducible plans). On the 2-core reference machine
        # one deterministic second took 1.5-4 wall seconds (overshoot included), so it gets a third
        # of what is left to keep the wall budget.
        budget = max(0.3, left / 3)
        exact = SOLVERS["cpsat"](search, replace(options, time_limit_s=budget, warm_start=warm, coarsen_keys=None))
        tried.append(f"cpsat: {'no feasible plan' if exact is None else f'{exact.objective:.6g} ({exact.status})'}")
        log.info("%s (%.1f s)", tried[-1], time.perf_counter() - t0)
        if exact is not None:
            if contraction is None:
                bound = max(bound, exact.lower_bound)
                found.append(exact)
            else:  # a coarse bound does not bound the full problem; re-score the projection
                exact = finish(problem, contraction.expand(exact.assignment), "cpsat", t0, options, "feasible")
                if exact is not None:
                    found.append(exact)
        # 3. a short refinement of CP-SAT's plan when it is the best and not proven optimal
        if exact is not None and exact.status != "optimal" and exact.objective <= min(s.objective for s in found):
            polish(exact, left - 3 * budget)
        # equal values: prefer a plan proven optimal
        best = min(found, key=lambda s: (s.objective, s.status != "optimal"), default=None)
    if best is None:
        return None, tried
    lb = min(max(bound, best.lower_bound), best.objective)
    status = "optimal" if _proven(best.objective, lb) else best.status
    return Solution(best.assignment, best.objective, lb, f"auto/{best.solver}", time.perf_counter() - t0,
                    status), tried


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
    log.debug("solved %d nodes on %d devices with %s: %s %.6g, gap %.2f%%", problem.n, problem.k, sol.solver,
              options.objective, sol.objective, 100 * sol.gap)
    return sol
