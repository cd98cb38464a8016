"""The ``auto`` policy: every heuristic, refinement, CP-SAT, refinement; the best plan (no TensorFlow).

1. every heuristic of :data:`HEURISTICS` whose preconditions hold, on the
   full problem (stopping early when one reaches the lower bound; once a
   plan exists, skipping those whose estimated cost exceeds what is left of
   the time limit by more than :data:`OVERSHOOT` times the limit;
   ``contiguous_dp``, quadratic in nodes, only for load-based objectives and
   within :data:`MAX_SHARE` of the limit);
2. greedy refinement of the best (:mod:`placer.solvers.refine`), and of a
   runner-up within :data:`RUNNER_UP` of it (another algorithm's plan; each
   on half the share);
3. for ``latency`` on more than :data:`FEWER_DEVICES` devices, CP-SAT on
   that many of them first (:func:`fewer_devices`; the problem coarsened to
   :data:`FEWER_MAX_NODES` nodes), its plan spread over all by refinement,
   scored, and a warm start when it is the better one;
   then CP-SAT warm-started from the best plan, on a coarsened problem above
   ``max_nodes`` nodes (:mod:`placer.solvers.multilevel`);
4. a short refinement of CP-SAT's plan when it is the best and not proven;
5. for ``latency``, moves scored by the simulator on the best plan and on
   the one-device plan, the one that descends further going on
   (:func:`~placer.solvers.descent.descend_starts`), on what is left (at least
   :data:`MIN_DESCENT_S`); on more than :data:`FEWER_DEVICES` devices
   step 3's CP-SAT on all devices gives way to it. Where plans may fix
   their order (``execution_order="auto"``, a simulation without shared
   processors), half of it goes to moves scored in the order each plan
   would fix (:func:`~placer.solvers.descent.descend_ordered`), from the
   best plan of all, ordered or not.

**Determinism.** Every decision reads the *estimated* work spent (sizes ×
the per-op rates measured on the 2-core reference machine), never the
clock: the same problem, options and seed give the same plan on an idle or
a loaded machine.
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import replace
from typing import Callable

import numpy as np

from ..core.objectives import get_objective, orders_by_priority
from ..core.problem import PlacementProblem, evaluate
from ..errors import NoFeasiblePlanError
from . import heavy
from .base import Solution, SolveOptions, finish
from .cpsat import solve_cpsat
from .descent import ORDERED_US_PER_OP
from .descent import US_PER_OP as DESCENT_US_PER_OP
from .descent import descend_ordered, descend_starts
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
              "layer_dp", "heavy_enum", "mincut", "cp_heft", "cp_etf")
#: Heuristics whose plans carry each device's order of its ops (:mod:`placer.core.order`): they run for
#: simulated objectives only (the order is what they add), and the search (refinement, CP-SAT, descent)
#: starts from the best plan without an order, whose moves the executor's order scores; the best of all
#: is kept.
ORDERED = frozenset({"cp_heft", "cp_etf"})
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
    "group_heft": (20.0, 5.0), "layer_dp": (4.0, 0.0),
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
#: Where CP-SAT's load model is only a proxy (``latency``) and there are more devices than this, the search
#: first places the problem on this many of them (half of CP-SAT's budget), spreads that plan over all by
#: refinement, scores it, and starts the full search from it when it is the better start. A plan on fewer
#: devices pays fewer transfers, and CP-SAT finds good plans of the smaller model far sooner: the two-branch
#: CNN's training step on 4 devices (layer groups) reached a max load of 111 ms on 2 devices in the budget
#: where the 4-device model stayed at 167 ms (it needed 4x the budget to pass 111 ms). For ``throughput``
#: it did not pay: no plan of the solver suite improved, and on the NeurIPS'20 workloads the halved budget
#: lost two proven optima (OperatorGraphs/bert_l-3, 21.91 -> 22.10 and 54.21 -> 54.62 ms).
FEWER_DEVICES = 2
#: ... on a problem coarsened to at most this many nodes, each key (layer) merged whole first: CP-SAT found
#: nothing better than its hint on 1,500 coarse nodes of the LSTM seq2seq training step within the budget,
#: and with keys merged under the work cap (a layer split into pieces) it found 41.03 ms where the layer
#: view gave 36.85 ms.
FEWER_MAX_NODES = 500
#: The least simulated descent (estimated seconds) ``auto`` does for ``latency`` (:mod:`placer.solvers.descent`),
#: reserved before CP-SAT. On more than :data:`FEWER_DEVICES` devices descent also takes the half of
#: CP-SAT's budget that CP-SAT on all devices had: in the solver suite's recorded runs that stage never gave
#: the best latency plan there. On the same graphs before and after (``benchmarks/results/solvers_descent_ab.md``):
#: 25 of 48 latency plans better, none worse; the colocation benchmark's training steps under op grouping
#: 205.9 -> 169.8 ms (densely connected CNN), 148.7 -> 126.6 (two-branch CNN), 62.3 -> 59.6 (LSTM seq2seq).
#: 1 s since its trials resume simulations (2026-12-04; 0.5 before, ``benchmarks/results/solvers_ab_2026-12-04.md``):
#: 26 of 48 latency plans better, none worse (the two-branch CNN's training step under layer groups 156.7 ->
#: 139.3 ms), the largest wall time of the suite 6.4 -> 7.0 s.
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


def fewer_devices(problem: PlacementProblem, count: int) -> list[int] | None:
    """The ``count`` devices a search on fewer devices uses (sorted), or ``None`` when no such set lets
    every node run.

    Devices rank fastest first (least time on the nodes every device may run; on all
    they may run where none is common), then by memory (most first), then by index;
    the first set in that ranking's order that lets every node run is taken.

    Examples
    --------
    >>> from cost_models import TensorEdge
    >>> p = PlacementProblem.build(names=["a", "b"], compute_s=np.array([[3.0, 1.0, 2.0], [3.0, np.inf, 2.0]]),
    ...     memory_bytes=np.zeros(2), capacity_bytes=np.full(3, np.inf), tensors=[], bandwidth=np.ones((3, 3)),
    ...     latency=np.zeros((3, 3)))
    >>> fewer_devices(p, 2)   # device 1 is fastest; 2 runs node b, which 1 cannot
    [1, 2]
    >>> fewer_devices(p, 1)   # the fastest device that runs both
    [2]
    """
    allowed = np.isfinite(problem.compute_s)
    common = allowed.all(axis=1)
    rows = common if common.any() else np.ones(problem.n, dtype=bool)
    speed = np.where(allowed, problem.compute_s, 0.0)[rows].sum(axis=0)
    ranked = sorted(range(problem.k), key=lambda d: (speed[d], -problem.capacity_bytes[d], d))
    for picked in itertools.combinations(ranked, min(count, problem.k)):
        if allowed[:, list(picked)].any(axis=1).all():
            return sorted(picked)
    return None


def _start_on_fewer(problem: PlacementProblem, warm: np.ndarray | None, options: SolveOptions,
                    tried: list[str]) -> np.ndarray | None:
    """CP-SAT on :data:`FEWER_DEVICES` of the devices (the problem coarsened to at most
    :data:`FEWER_MAX_NODES` nodes first, each of ``options.coarsen_keys`` merged whole), its plan spread over all
    by refinement (see :data:`FEWER_DEVICES`); ``None`` when that search finds nothing (or no such subset
    can run every node)."""
    devices = fewer_devices(problem, FEWER_DEVICES)
    if devices is None:
        tried.append(f"cpsat on {FEWER_DEVICES} devices: skipped (no {FEWER_DEVICES} of them run every node)")
        return None
    contraction = None
    search = problem
    if problem.n > FEWER_MAX_NODES:
        contraction = coarsen_problem(problem, FEWER_MAX_NODES, keys=options.coarsen_keys, seed=options.seed,
                                      whole_keys=True)
        search = contraction.coarse
    sub = search.on_devices(devices)
    hint = None
    if warm is not None:  # nodes on the other devices start on the first of these
        where = {d: i for i, d in enumerate(devices)}
        full_hint = np.array([where.get(int(d), 0) for d in warm])
        hint = full_hint if contraction is None else contraction.restrict(full_hint)
    result = solve_cpsat(sub, replace(options, warm_start=hint, coarsen_keys=None, layer_positions=None,
                                      bounded=False))
    where = f"{FEWER_DEVICES} devices" + ("" if contraction is None else f", {problem.n} -> {search.n} nodes")
    if result.solution is None:
        tried.append(f"cpsat on {where}: {result.status.value}")
        return None
    tried.append(f"cpsat on {where}: {result.solution.objective:.6g} ({result.solution.status})")
    spread = np.asarray(devices)[result.solution.assignment]
    if contraction is not None:
        spread = contraction.expand(spread)
    return refine(problem, spread, "throughput", work=int(MIN_REFINE_S * VISITS_PER_S))


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
    """The default policy: heuristics, refinement, CP-SAT, refinement; the best plan and bound.

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
        if reason is None and name in ORDERED and not simulated:
            reason = f"its order of each device's ops counts for a simulated objective only, not {options.objective}"
        if reason is None and name in ORDERED and not options.ordered:
            reason = "execution_order='executor': every plan runs in the executor's order"
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

    if search_on and best is not None:
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
    if search_on and found and left < cpsat_min_left:
        # building a CP-SAT model of a large problem alone takes seconds: keep the time limit
        tried.append("cpsat: skipped (the heuristics used the time limit)")
        log.info("%s (%.1f s)", tried[-1], time.perf_counter() - t0)
    elif search_on:
        # CP-SAT's budget is deterministic time (reproducible plans). On the 2-core reference machine
        # one deterministic second took 1.5-4 wall seconds (overshoot included), so it gets a third
        # of what is left to keep the wall budget (less the least descent, step 5, for latency).
        budget = max(0.3, (left - (MIN_DESCENT_S if simulated else 0.0)) / 3)
        warm = best.assignment if best is not None else None
        if simulated and problem.k > FEWER_DEVICES:
            # 3a. CP-SAT on fewer devices with half of that; the other half goes to simulated descent (5)
            # instead of CP-SAT on all devices, whose load model never gave the best latency plan there
            start = _start_on_fewer(problem, warm, replace(options, time_limit_s=budget / 2), tried)
            if start is not None:
                fewer = finish(problem, start, f"cpsat@{FEWER_DEVICES}", t0, options, "feasible")
                if fewer is not None:
                    tried.append(_describe(f"cpsat@{FEWER_DEVICES}+refine", fewer))
                    found.append(fewer)
            log.info("%s (%.1f s)", tried[-1], time.perf_counter() - t0)
            tried.append(f"cpsat on {problem.k} devices: skipped (its load model only stands in for latency; "
                         "simulated descent instead)")
            left -= 1.5 * budget + MIN_REFINE_S
        else:
            # 3b. CP-SAT, warm-started from the best plan so far, with the rest of the budget
            exact, proven = _cpsat(problem, warm, replace(options, time_limit_s=budget), t0, tried)
            bound = max(bound, proven)
            left -= 3 * budget
            if exact is not None:
                found.append(exact)
                # 4. a short refinement of CP-SAT's plan when it is the best and not proven optimal
                if exact.status != "optimal" and exact.objective <= min(s.objective for s in starts()):
                    share = left - (MIN_DESCENT_S if simulated else 0.0)
                    polish(exact, share)
                    left -= max(share, MIN_REFINE_S)
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
            starts = [best] + ([single] if single is not None and not np.array_equal(single.assignment,
                                                                                    best.assignment) else [])
            a, which = descend_starts(problem, [s.assignment for s in starts], sims,
                                      steps=[s.objective for s in starts])
            moved = finish(problem, a, f"{starts[which].solver}+descent", t0, options, "feasible")
            tried.append(_describe(f"descent {' / '.join(s.solver for s in starts)} ({sims} simulations)", moved))
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
    status = "optimal" if _proven(best.objective, lb) else best.status
    scored = {**dict.fromkeys(out_of_time), **{s.solver: float(s.objective) for s in found if s.solver in HEURISTICS}}
    return Solution(best.assignment, best.objective, lb, f"auto/{best.solver}", time.perf_counter() - t0,
                    status, tuple(tried), scored, best.order)


