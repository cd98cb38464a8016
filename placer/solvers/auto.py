"""The ``auto`` policy: every heuristic, then refinement and CP-SAT (load objectives) or simulated descent
(``latency``); the best plan (no TensorFlow).

1. every heuristic of :data:`HEURISTICS` whose preconditions hold, on the
   full problem (stopping early when one reaches the lower bound; once a
   plan exists, skipping those whose estimated cost exceeds what is left of
   the time limit by more than :data:`OVERSHOOT` times the limit;
   ``contiguous_dp``, quadratic in nodes, only for load-based objectives and
   within :data:`MAX_SHARE` of the limit);
2. for ``throughput`` and ``memory``, greedy refinement of the best
   (:mod:`placer.solvers.refine`), and of a runner-up within
   :data:`RUNNER_UP` of it (another algorithm's plan; each on half the share);
3. CP-SAT warm-started from the best plan, on a coarsened problem above
   ``max_nodes`` nodes (:mod:`placer.solvers.multilevel`);
4. a short refinement of CP-SAT's plan when it is the best and not proven;
5. for ``latency``, instead of 2-4 (whose load model only stands in for a
   step; CP-SAT still runs where no heuristic found a feasible plan), moves
   scored by the simulator on the best plan and on the one-device plan, the
   one that descends further going on
   (:func:`~placer.solvers.descent.descend_starts`), on what is left (at
   least :data:`MIN_DESCENT_S`). Where plans may fix their order
   (``execution_order="auto"``, a simulation without shared processors),
   half of it goes to moves scored in the order each plan would fix
   (:func:`~placer.solvers.descent.descend_ordered`), from the best plan of
   all, ordered or not; then the bound from the merges that plan forces and from pairs of nodes apart or
   together (:func:`~placer.solvers.forced.forced_merge_bound`).

**Determinism.** Every decision reads the *estimated* work spent (sizes ×
the per-op rates measured on the 2-core reference machine), never the
clock: the same problem, options and seed give the same plan on an idle or
a loaded machine.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Callable

import numpy as np

from ..core.objectives import get_objective, orders_by_priority
from ..core.problem import PlacementProblem
from ..errors import NoFeasiblePlanError
from . import heavy
from .base import Solution, SolveOptions, finish
from .cpsat import solve_cpsat
from .descent import ORDERED_US_PER_OP
from .descent import US_PER_OP as DESCENT_US_PER_OP
from .descent import descend_ordered, descend_starts
from .forced import forced_merge_bound
from .multilevel import coarsen_problem
from .refine import VISITS_PER_S, refine
from .registry import SOLVERS

log = logging.getLogger(__name__)

#: The algorithm every entry point uses when none is named.
DEFAULT_SOLVER = "auto"
#: Heuristics ``auto`` runs on the full problem (each where its preconditions hold). On equal values the
#: earlier one's plan starts the search: ``layer_dp`` (2026-12-04) comes after the older ones so that a tie
#: keeps the start they gave (CP-SAT on a coarsened problem can end at coarse optima that expand to
#: different plans: MobileNetV2's forward pass on 4 devices, memory, 0.31 MB from partition's start,
#: 0.38 from layer_dp's equal plan).
HEURISTICS = ("single", "round_robin", "contiguous", "contiguous_dp", "partition", "heft", "group_heft", "etf",
              "layer_dp", "heavy_enum", "mincut", "cp_heft", "cp_etf", "path_runs")
#: Heuristics whose plans carry each device's order of its ops (:mod:`placer.core.order`): they run for
#: simulated objectives only (the order is what they add), and the search (refinement, CP-SAT, descent)
#: starts from the best plan without an order, whose moves the executor's order scores; the best of all
#: is kept.
ORDERED = frozenset({"cp_heft", "cp_etf"})
#: Heuristics that run for simulated objectives only, and why (what they add only a simulation scores):
#: the ordering ones, and the plan made from the latency bound's analysis (:mod:`placer.solvers.runs`).
SIMULATED_ONLY: dict[str, str] = {**dict.fromkeys(ORDERED, "its order of each device's ops counts"),
                                  "path_runs": "it splits the path of the step's bound,"}
#: The least refinement ``auto`` does (estimated seconds) when some budget is left.
MIN_REFINE_S = 0.5
#: Tensor receivers per fine op of the graphs the rates were measured on (NN graphs: 1-2); a graph with
#: more is costed as ``receivers / EDGES_PER_OP`` ops (a dense random DAG with 20 per op costs 10x).
EDGES_PER_OP = 2.0
#: Once a plan exists, a heuristic runs only if its estimated cost fits what is left plus this share of
#: the time limit (the search then ends within 2x the limit by estimate; scoring the plan comes on top).
OVERSHOOT = 1.0
#: Estimated cost of each heuristic in µs per fine op: (fixed, per device), scoring excluded (that is
#: ``Objective.score_us_per_op``). ``auto`` spends its time limit by these estimates (measured on the
#: 2-core reference machine), not by the clock, so that its choices, and hence its plans, are
#: reproducible.
HEURISTIC_US_PER_OP: dict[str, tuple[float, float]] = {
    "single": (1.0, 0.0), "round_robin": (1.0, 0.0), "contiguous": (2.0, 0.0), "partition": (8.0, 0.0),
    "heft": (25.0, 10.0), "etf": (5.0, 15.0), "mincut": (250.0, 0.0), "contiguous_dp": (2.0, 0.0),
    "group_heft": (20.0, 5.0), "layer_dp": (4.0, 0.0), "path_runs": (2.0, 0.0),
    # 2026-12-04, four training steps: cp_heft 20-30 µs per op on 2 devices, 26-32 on 4, 36-43 on 8; cp_etf
    # 25-37, 30-36, 54-56 (77 on the LSTM seq2seq's forward pass on 8)
    "cp_heft": (15.0, 3.5), "cp_etf": (15.0, 5.0),
}
#: Heuristics whose cost is per plan they score, not per op: their own estimate (seconds) for a problem.
HEURISTIC_ESTIMATES: dict[str, Callable[[PlacementProblem, SolveOptions], float]] = {
    "heavy_enum": heavy.estimated_s,
}
#: Heuristics quadratic in the problem's nodes ``n``: µs per ``(n + 1)² × k`` on top (``contiguous_dp``
#: measured 0.06-0.12 on the reference machine).
HEURISTIC_US_PER_PAIR: dict[str, float] = {"contiguous_dp": 0.12}
#: A heuristic plan within this factor of the best is refined as well (each on half the refinement share).
RUNNER_UP = 1.05
#: Heuristics that run only when their estimate is at most this share of the time limit (so that a large
#: problem's refinement and CP-SAT keep their budget).
MAX_SHARE: dict[str, float] = {"contiguous_dp": 0.25}
#: The least simulated descent (estimated seconds) ``auto`` does for ``latency`` (:mod:`placer.solvers.descent`),
#: which otherwise has what the heuristics leave of the time limit: refinement and CP-SAT do not run for
#: ``latency`` once a heuristic plan fits (their model is the devices' loads). On more than 2 devices CP-SAT
#: on all devices gave way to descent first (2026-12-03, ``benchmarks/results/ab/solvers_descent_ab.md``: 25 of
#: 48 latency plans better, none worse), then (2026-12-05,
#: ``benchmarks/results/ab/solvers_ab_latency_budget_2026-12-05.md``, with the priority of
#: :func:`~placer.core.objectives.step_priority` from the same day) refinement and CP-SAT on every device
#: count: 17 of the solver suite's 36 latency plans better, 5 worse (multi-tower MLP training on 8 devices
#: +2.1%), the colocation benchmark's geometric-mean gap 7.8% -> 6.3% (the densely connected CNN's training
#: step under layer groups 436.7 -> 335.6 ms: its ordered descent had 15 simulations, then 75). 1 s since
#: its trials resume simulations (2026-12-04).
MIN_DESCENT_S = 1.0
#: ... and the fewest simulations worth starting it for (one is the plan it starts from).
MIN_DESCENT_SIMULATIONS = 3


def _describe(name: str, sol: Solution | None) -> str:
    return f"{name}: {'no feasible plan' if sol is None else f'{sol.objective:.6g}'}"


def _estimated_s(name: str, m: float, k: int, objective: str, n: int = 0) -> float:
    """Estimated seconds of heuristic ``name`` on ``m`` fine ops, ``n`` problem nodes and ``k`` devices,
    scoring included."""
    per_op, per_op_device = HEURISTIC_US_PER_OP[name]
    quadratic = HEURISTIC_US_PER_PAIR.get(name, 0.0) * (n + 1) ** 2 * k
    return 1e-6 * (m * (per_op + per_op_device * k + get_objective(objective).score_us_per_op) + quadratic)


def _proven(value: float, bound: float) -> bool:
    """Whether ``value`` equals the lower ``bound`` (relative tolerance 1e-9): nothing to improve."""
    return value - bound <= 1e-9 * max(abs(value), 1e-300)


def no_plan_error(problem: PlacementProblem, options: SolveOptions, tried: list[str]) -> NoFeasiblePlanError:
    """The error for "nothing feasible was found", listing what was tried."""
    return NoFeasiblePlanError(
        f"no feasible placement of {problem.n} nodes on {problem.k} devices within "
        f"{options.time_limit_s:g} s; tried: {'; '.join(tried)}. Give the devices more memory, "
        "add devices, or raise time_limit_s.")


def _cpsat(problem: PlacementProblem, warm: np.ndarray | None, options: SolveOptions, t0: float,
           tried: list[str]) -> tuple[Solution | None, float]:
    """CP-SAT on the whole problem (coarsened above ``options.max_nodes`` nodes), warm-started from ``warm``
    (restricted to the coarse problem, or the coarse problem's own partition where that is better):
    ``(its plan scored on the problem, the lower bound it proved)``; the bound is 0 when it searched the
    coarse problem, whose bound does not bound the problem itself."""
    search, contraction = problem, None
    # the options of the search: without the objective's bound on a coarse problem (it does not bound this one)
    searched = replace(options, coarsen_keys=None, layer_positions=None)
    if problem.n > options.max_nodes:
        contraction = coarsen_problem(problem, options.max_nodes, keys=options.coarsen_keys, seed=options.seed)
        search = contraction.coarse
        tried.append(f"coarsened {problem.n} -> {search.n} nodes")
        searched = replace(searched, bounded=False)
        starts = [SOLVERS["partition"](search, searched)]
        if warm is not None:
            starts.append(finish(search, contraction.restrict(warm), "restricted", t0, searched))
        starts = [s for s in starts if s is not None]
        warm = min(starts, key=lambda s: s.objective).assignment if starts else None
    result = solve_cpsat(search, replace(searched, warm_start=warm))
    exact = result.solution
    tried.append(f"cpsat: {result.status.value}" if exact is None else f"cpsat: {exact.objective:.6g} ({exact.status})")
    log.info("%s (%.1f s)", tried[-1], time.perf_counter() - t0)
    if exact is None or contraction is None:
        return exact, 0.0 if exact is None else exact.lower_bound
    return finish(problem, contraction.expand(exact.assignment), "cpsat", t0, options, "feasible"), 0.0

def auto(problem: PlacementProblem, options: SolveOptions) -> Solution:
    """The default policy: heuristics, then refinement and CP-SAT, or simulated descent for ``latency``; the
    best plan and bound.

    ``Solution.log`` lists what was tried with each outcome.

    Raises
    ------
    NoFeasiblePlanError
        Nothing feasible was found; the message lists what was tried.
    """
    # Every decision below reads the *estimated* work spent (sizes × measured rates), never the
    # clock, so the same problem, options and seed always give the same plan.
    t0 = time.perf_counter()
    sched = problem.schedule_view()
    # the rates are per fine op of graphs with up to EDGES_PER_OP receivers per op; denser graphs cost by edges
    m = max(sched.m, sum(len(t.dsts) for t in sched.tensors) / EDGES_PER_OP)
    left = options.time_limit_s
    simulated = get_objective(options.objective).simulated
    tried: list[str] = []
    found: list[Solution] = []
    out_of_time: list[str] = []
    for name in HEURISTICS:
        reason = SOLVERS[name].unmet(problem)
        if reason is None and name == "mincut" and np.array_equal(problem.compute_s[:, 0], problem.compute_s[:, 1]):
            # min total busy time on two identical devices is one device (or infeasible): nothing new
            reason = "identical devices"
        if reason is None and name in SIMULATED_ONLY and not simulated:
            reason = f"{SIMULATED_ONLY[name]} for a simulated objective only, not {options.objective}"
        if reason is None and name in ORDERED and not options.ordered:
            reason = "execution_order is not 'auto': the search orders no plan"
        cost = (HEURISTIC_ESTIMATES[name](problem, options) if name in HEURISTIC_ESTIMATES
                else _estimated_s(name, m, problem.k, options.objective, problem.n))
        if reason is None and cost > MAX_SHARE.get(name, np.inf) * options.time_limit_s:
            reason = f"time limit: estimated {cost:.2g} s, more than {MAX_SHARE[name]:.0%} of the limit"
        if reason is None and found and cost > left + OVERSHOOT * options.time_limit_s:
            reason = f"time limit: estimated {cost:.2g} s, {max(left, 0.0):.2g} s left"  # a plan exists already
            out_of_time.append(name)
        if reason is not None:
            tried.append(f"{name}: skipped ({reason})")
            continue
        left -= cost
        sol = SOLVERS[name](problem, options)
        tried.append(_describe(name, sol))
        log.info("%s (%.1f s)", tried[-1], time.perf_counter() - t0)
        if sol is not None:
            found.append(sol)
            if _proven(sol.objective, sol.lower_bound):
                tried.append(f"stopped: {name} reached the lower bound")
                break
    bound = max((s.lower_bound for s in found), default=0.0)

    def starts() -> list[Solution]:  # the plans the search moves (an ordered plan's order would not follow)
        return [s for s in found if not s.order]

    best = min(starts(), key=lambda s: s.objective, default=None)
    cpsat_min_left = min(1.0, 0.25 * options.time_limit_s)  # less: building the model alone takes that
    search_on = problem.k > 1 and not (found and _proven(min(s.objective for s in found), bound))

    model = "throughput" if get_objective(options.objective).cpsat_model == "max_load" else "memory"

    def polish(start: Solution, share_s: float) -> None:
        refined = refine(problem, start.assignment, model, work=int(max(share_s, MIN_REFINE_S) * VISITS_PER_S))
        sol = finish(problem, refined, f"{start.solver}+refine", t0, options, "feasible")
        tried.append(_describe(f"refine {start.solver}", sol))
        log.info("%s (%.1f s)", tried[-1], time.perf_counter() - t0)
        if sol is not None and sol.objective < start.objective:
            found.append(sol)

    # the searches by load (2-4): for ``latency`` the simulated descent (5) has their budget instead, once a
    # heuristic found a feasible plan (else CP-SAT may still find one where memory is tight)
    by_load = search_on and not (simulated and found)
    if search_on and not by_load:
        tried.append("refine, cpsat: skipped (their load model only stands in for latency; simulated descent "
                     "instead)")
    if by_load and best is not None:
        # 2. local refinement of the best heuristic plan (a third of what is left)
        # (all of it when too little would be left for CP-SAT anyway)
        share = left / 3 if 2 * left / 3 >= cpsat_min_left else left
        if left > 0:
            # a runner-up within RUNNER_UP of the best (another algorithm's plan) is refined too, on half the
            # share: the best start does not always refine to the best plan
            ranked = sorted(starts(), key=lambda s: s.objective)
            runner = ranked[1] if len(ranked) > 1 and ranked[1].objective <= RUNNER_UP * best.objective else None
            if runner is not None:
                polish(best, share / 2)
                polish(runner, share / 2)
            else:
                polish(best, share)
            left -= max(share, MIN_REFINE_S)
            best = min(starts(), key=lambda s: s.objective)
        else:
            tried.append(f"refine {best.solver}: skipped (time limit)")
    if by_load and found and left < cpsat_min_left:
        # building a CP-SAT model of a large problem alone takes seconds: keep the time limit
        tried.append("cpsat: skipped (the heuristics used the time limit)")
        log.info("%s (%.1f s)", tried[-1], time.perf_counter() - t0)
    elif by_load:
        # 3. CP-SAT, warm-started from the best plan so far. Its budget is deterministic time (reproducible
        # plans); on the 2-core reference machine one deterministic second took 1.5-4 wall seconds (overshoot
        # included), so it gets a third of what is left to keep the wall budget.
        budget = max(0.3, left / 3)
        warm = best.assignment if best is not None else None
        exact, proven = _cpsat(problem, warm, replace(options, time_limit_s=budget), t0, tried)
        bound = max(bound, proven)
        left -= 3 * budget
        if exact is not None:
            found.append(exact)
            # 4. a short refinement of CP-SAT's plan when it is the best and not proven optimal
            if exact.status != "optimal" and exact.objective <= min(s.objective for s in starts()):
                polish(exact, left)
                left -= max(left, MIN_REFINE_S)
        # equal values: prefer a plan proven optimal
        best = min(starts(), key=lambda s: (s.objective, s.status != "optimal"), default=None)
    if not found:
        raise no_plan_error(problem, options, tried)
    if best is not None and simulated and search_on and not _proven(best.objective, max(bound, best.lower_bound)):
        # 5. moves scored by the simulator itself (the load model above only stands in for the step); where
        # plans may fix their order, half of it simulates each plan in the order it would fix
        seconds = max(left, MIN_DESCENT_S)
        ordered = options.ordered and orders_by_priority(problem)
        sims = int((seconds / 2 if ordered else seconds) / (1e-6 * DESCENT_US_PER_OP * m))
        ordered_sims = int(seconds / 2 / (1e-6 * ORDERED_US_PER_OP * m)) if ordered else 0
        if sims < MIN_DESCENT_SIMULATIONS:
            tried.append(f"descent: skipped (time limit: {sims} simulations of {sched.m} ops)")
        else:
            # from the best plan and from one device (descend_starts keeps the one that descends further)
            single = next((s for s in found if s.solver == "single"), None)
            origins = [best] + ([single] if single is not None and not np.array_equal(single.assignment,
                                                                                     best.assignment) else [])
            a, which = descend_starts(problem, [s.assignment for s in origins], sims,
                                      steps=[s.objective for s in origins])
            moved = finish(problem, a, f"{origins[which].solver}+descent", t0, options, "feasible")
            tried.append(_describe(f"descent {' / '.join(s.solver for s in origins)} ({sims} simulations)", moved))
            if moved is not None and moved.objective < best.objective:
                found.append(moved)
                best = moved
            if ordered_sims >= MIN_DESCENT_SIMULATIONS:
                start = min(found, key=lambda s: (s.objective, bool(s.order)))
                a, order = descend_ordered(problem, start.assignment, ordered_sims)
                moved = finish(problem, a, f"{start.solver}+ordered_descent", t0, options, "feasible", order=order)
                tried.append(_describe(f"ordered descent {start.solver} ({ordered_sims} simulations)", moved))
                if moved is not None:
                    found.append(moved)
        log.info("%s (%.1f s)", tried[-1], time.perf_counter() - t0)
    # equal values: prefer a plan proven optimal, then one in the executor's order
    best = min(found, key=lambda s: (s.objective, s.status != "optimal", bool(s.order)))
    lb = min(max(bound, best.lower_bound), best.objective)
    if simulated and not _proven(best.objective, lb):
        # the pairs of nodes no plan better than this one puts apart, merged: a stronger bound
        forced, pairs = forced_merge_bound(problem, best.objective)
        if pairs:
            tried.append(f"bound with {pairs} forced merges: {forced:.6g}")
        lb = max(lb, forced)
    status = "optimal" if _proven(best.objective, lb) else best.status
    scored = {**dict.fromkeys(out_of_time), **{s.solver: float(s.objective) for s in found if s.solver in HEURISTICS}}
    return Solution(best.assignment, best.objective, lb, f"auto/{best.solver}", time.perf_counter() - t0,
                    status, tuple(tried), scored, best.order)


