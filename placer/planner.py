"""Stage 3 — the planner: a built problem → a :class:`~placer.core.plan.Plan` (no TensorFlow).

:func:`plan_problem` is the solve stage of both paths: :func:`solve` (a
user's cost-annotated graph) and :func:`placer.autoplace` (a traced
model's op graph) call it on the problem of :mod:`placer.core.build`, so
the same graph, devices and :class:`PlanOptions` give the same plan either
way. It searches (or re-applies a given assignment), scores the plan under
every objective, and scores the baselines on the same problem.

Examples
--------
Two independent 3 ms branches and a join, on two devices:

>>> import networkx as nx
>>> g = nx.DiGraph()
>>> for v, us in {"in": 1.0, "left": 3000.0, "right": 3000.0, "join": 1.0}.items():
...     g.add_node(v, compute_us=us)
>>> g.add_edges_from([("in", "left"), ("in", "right"), ("left", "join"), ("right", "join")], bytes=1024)
>>> p = solve(g, ["/CPU:0", "/CPU:1"], time_limit_s=1.0)
>>> p.assignment["left"] != p.assignment["right"], p.objective, p.status
(True, 'latency', 'optimal')
>>> round(p.value * 1e3, 3), round(p.lower_bound * 1e3, 3)   # ms, predicted: makespan = bound
(3.022, 3.022)
>>> round(p.baselines["single"].value * 1e3, 3)
6.002
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, fields, replace
from typing import Any, Callable, Hashable, Mapping, Sequence

import networkx as nx
import numpy as np

from cost_models import SimOptions, SimResult

from .core.build import DEFAULT_GROUP_BY, GROUPINGS, BuiltProblem, build_problem
from .core.order import DEFAULT_EXECUTION_ORDER, EXECUTION_ORDERS
from .core.devices import DeviceSet
from .core.graph_io import PLAN_OPTIONS_KEY, as_device_set
from .core.microbatch import ParameterCodec, best_microbatches, pipeline_order, pipeline_stages, simulate_pipeline
from .core.objectives import DEFAULT_OBJECTIVE, OBJECTIVES, get_objective
from .core.plan import KEPT, BaselineResult, Candidate, Plan
from .core.replicas import best_replicas, simulate_replicas
from .core.problem import PlacementProblem, evaluate
from .core.validate import MAX_SEED, MAX_TIME_LIMIT_S, integer, real
from .errors import AutoplaceError, InsufficientMemoryError, NoFeasiblePlanError, PlanError, SolverError
from .solvers import (
    DEFAULT_MAX_NODES,
    DEFAULT_SOLVER,
    DEFAULT_TIME_LIMIT_S,
    Solution,
    SolveOptions,
    available_solvers,
    solve_problem,
)

log = logging.getLogger(__name__)

#: A plan on several devices is kept over one device only where it is predicted at least this much faster
#: (``one device's step / its step ≥ 1 + SPLIT_MARGIN``): a smaller predicted gain is within the cost
#: model's error. On two gRPC workers its median step error was 9-14% (three runs of 2026-12-02), and the
#: splits predicted 1.01x (the demo, 4 logical CPUs) and 1.07x (Transformer training) measured 0.92x and
#: 0.90x, while those predicted 1.14x and 1.66x measured 1.18x and 1.12x (benchmarks/results/speedup.md).
SPLIT_MARGIN = 0.10
#: The largest split margin accepted (a plan predicted this many times faster than one device is still kept).
MAX_SPLIT_MARGIN = 100.0

#: Baselines scored next to every plan, on the same problem and cost model.
BASELINES = ("single", "round_robin", "contiguous")


@dataclass(frozen=True, kw_only=True)
class PlanOptions:
    """What to plan for and how (keyword-only; the defaults are the library's).

    Attributes
    ----------
    objective : str
        ``"latency"`` (one step's simulated makespan), ``"throughput"``
        (pipelined max device load) or ``"memory"`` (least bytes across
        devices with every device under capacity); see
        :mod:`placer.core.objectives`.
    algorithm : str
        A name from :func:`placer.solvers.available_solvers`; ``"auto"``
        runs all heuristics, CP-SAT and local refinement.
    time_limit_s : float
        Search budget in seconds of *estimated* work (never read from the
        clock, so the plan does not depend on the machine's load).
    seed : int
        Same graph, devices, options and seed give the same plan.
    max_nodes : int
        ``auto`` coarsens problems with more groups than this before CP-SAT.
    group_by : str
        Which nodes move together (:data:`placer.core.build.GROUPINGS`).
    baselines : tuple of str
        Solvers scored next to the plan (``()`` for none).
    memory : str
        What must fit each device's capacity: ``"resident"`` (the nodes'
        ``memory_bytes``, default: what a user's graph declares) or
        ``"peak"`` (the simulated step's peak: resident bytes plus the live
        tensors, e.g. the activations a training step keeps for its backward
        pass; :func:`placer.autoplace`'s default). See :data:`MEMORY_MODELS`.
    execution_order : str
        ``"auto"`` (default): a plan may fix the order each device runs its ops in (control edges in the
        placed graph) where that is predicted faster; ``"executor"``: TensorFlow's executor orders them in
        every plan; ``"simulated"`` (:func:`placer.autoplace`'s default): searched as ``"executor"``, then
        ``autoplace``'s order stage fixes a one-copy plan's simulated order on one-thread workers (here, as
        ``"executor"``). See :mod:`placer.core.order`.
    split_margin : float or None
        With the default algorithm and a time objective, the plan on several devices is kept over one
        device only where its simulated step is predicted at least this much faster (:func:`pipeline_plan`:
        ``0.1`` is 10%, about the cost model's median error); ``None`` (default): the best plan found, as it
        is. :func:`placer.autoplace` plans with :data:`SPLIT_MARGIN` (``placer.tf.options.MODEL_PLAN_OPTIONS``),
        and a graph file it saves carries it, so that :func:`solve` applies the same rule offline.
    """

    objective: str = DEFAULT_OBJECTIVE
    algorithm: str = DEFAULT_SOLVER
    time_limit_s: float = DEFAULT_TIME_LIMIT_S
    seed: int = 0
    max_nodes: int = DEFAULT_MAX_NODES
    group_by: str = DEFAULT_GROUP_BY
    baselines: tuple[str, ...] = BASELINES
    memory: str = "resident"
    execution_order: str = DEFAULT_EXECUTION_ORDER
    split_margin: float | None = None

    def __post_init__(self) -> None:
        if self.memory not in MEMORY_MODELS:
            raise SolverError(f"unknown memory model {self.memory!r}; choose one of {list(MEMORY_MODELS)}")
        if self.execution_order not in EXECUTION_ORDERS:
            raise SolverError(f"unknown execution_order {self.execution_order!r}; choose one of "
                              f"{list(EXECUTION_ORDERS)}")
        get_objective(self.objective)
        for name in (self.algorithm, *self.baselines):
            if name not in available_solvers():
                raise SolverError(f"unknown algorithm {name!r}; choose one of {available_solvers()}")
        if self.group_by not in GROUPINGS:
            raise SolverError(f"unknown group_by {self.group_by!r}; choose one of {sorted(GROUPINGS)}")
        object.__setattr__(self, "time_limit_s", real("time_limit_s", self.time_limit_s, strict=True,
                                                      maximum=MAX_TIME_LIMIT_S, error=SolverError))
        object.__setattr__(self, "seed", integer("seed", self.seed, maximum=MAX_SEED, error=SolverError))
        object.__setattr__(self, "max_nodes", integer("max_nodes", self.max_nodes, minimum=1, error=SolverError))
        if self.split_margin is not None:
            object.__setattr__(self, "split_margin", real("split_margin", self.split_margin,
                                                          maximum=MAX_SPLIT_MARGIN, error=SolverError))

    def solve_options(self, built: BuiltProblem) -> SolveOptions:
        """The solvers' options for ``built`` (its layer keys guide ``auto``'s coarsening, its layers' positions
        the layer-order DP)."""
        return SolveOptions(time_limit_s=self.time_limit_s, seed=self.seed, objective=self.objective,
                            max_nodes=self.max_nodes, coarsen_keys=built.layer_keys,
                            layer_positions=built.layer_positions(), ordered=self.execution_order == "auto")


def options_from(kwargs: Mapping[str, Any], cls: type) -> Any:
    """``cls(**kwargs)``, or :class:`AutoplaceError` naming unknown options and listing the valid ones."""
    valid = [f.name for f in fields(cls)]
    unknown = sorted(set(kwargs) - set(valid))
    if unknown:
        raise AutoplaceError(f"unknown option(s) {unknown}; valid options: {valid}")
    return cls(**kwargs)


def _predicted_step(built: BuiltProblem, sol: Solution, objective: str) -> float:
    """The simulated step of ``sol``: its value when it was scored by latency, else one simulation."""
    return sol.objective if objective == "latency" else OBJECTIVES["latency"].value(built.problem, sol.assignment)


def _baseline(built: BuiltProblem, name: str, options: SolveOptions) -> BaselineResult | None:
    try:
        sol = solve_problem(built.problem, name, options)
    except AutoplaceError as e:  # logged and named in the plan's log, never silently dropped
        log.info("baseline %s dropped: %s", name, e)
        return None
    return BaselineResult(float(sol.objective), float(_predicted_step(built, sol, options.objective)))


def _given(built: BuiltProblem, assignment: Mapping[Hashable, str], options: SolveOptions,
           op_order: Mapping[str, Sequence[Any]] | None = None) -> Solution:
    """A re-applied assignment (and its order of each device's ops), scored like a solver's plan."""
    t0 = time.perf_counter()
    a = built.group_assignment(assignment)
    obj = get_objective(options.objective)
    order = built.order_of(op_order or {}, a) if obj.simulated else ()
    value = obj.score(built.problem, a, order)
    if not math.isfinite(value):
        ev = evaluate(built.problem, a)
        raise PlanError(f"the given plan is infeasible on these devices (resident bytes per device "
                        f"{ev.memory_bytes.tolist()}, capacities {built.problem.capacity_bytes.tolist()}); "
                        "give the devices it was made for, or solve again")
    lb = min(obj.bound(built.problem), value)
    return Solution(a, value, lb, "given", time.perf_counter() - t0, "given", ("given: re-applied a saved plan",),
                    order=order)


#: What must fit a device's capacity: resident bytes only, or the simulated step's peak.
MEMORY_MODELS = ("resident", "peak")
#: The memory model of :func:`placer.autoplace`: an op graph's tensors are real, so the step's peak must fit
#: (``placer.solve`` keeps ``resident``: a user's graph declares its own memory).
MODEL_MEMORY = "peak"
#: Rounds of each way :func:`_fit_peak` tightens the memory model (charges, then budgets).
PEAK_ROUNDS = 4
#: :func:`_fit_peak` charges a group this many times the bytes it kept live at a peak, and lowers a
#: device's budget by this many times what it kept live.
LIVE_MARGIN = 1.1


def _over(peak: np.ndarray, cap: np.ndarray) -> np.ndarray:
    return np.flatnonzero(peak > cap * (1 + 1e-9))


def _peak_error(built: BuiltProblem, peak: np.ndarray, why: str) -> InsufficientMemoryError:
    cap = built.problem.capacity_bytes
    names = built.devices.names
    over = ", ".join(f"{names[d]} {int(peak[d]):,} B of {int(cap[d]):,} B ({int(peak[d] - cap[d]):,} B over)"
                     for d in _over(peak, cap)) or "none on the last plan"
    act = built.activation_bytes()
    res = np.asarray(built.problem.memory_bytes)
    def top(values: np.ndarray) -> str:
        idx = [int(i) for i in np.argsort(-values, kind="stable")[:3] if values[i] > 0]
        return ", ".join(f"{built.problem.names[i]} ({int(values[i]):,} B)" for i in idx) or "none"
    pooled = [names[d] for d, p in enumerate(built.problem.memory_pools) if p is not None]
    pools = (f" On {', '.join(pooled)} the peak is what TensorFlow's BFC allocator pool holds (whole chunks, "
             "regions of doubling size, no tensor across two: docs/costs.md#memory), more than the tensors "
             "alone." if pooled else "")
    return InsufficientMemoryError(
        f"no plan keeps every device's predicted peak memory (resident state + live tensors of one step) "
        f"under its capacity: {why}. Over: {over}. Largest resident groups: {top(res)}; largest activation "
        f"producers: {top(act)}.{pools} Add devices, declare larger memory_bytes or use a smaller batch")


def _fit_peak(built: BuiltProblem, sol: Solution, algorithm: str, options: SolveOptions) -> tuple[Solution, list[str]]:
    """Re-solve until the simulated peak (resident + live tensors) fits every device's capacity.

    The solvers constrain a per-device sum of per-group bytes (which they
    can reason about); the live tensors depend on the schedule, so the
    simulator measures them, and each round where a device overflows
    tightens what the solvers see and solves again, at most
    :data:`PEAK_ROUNDS` rounds each way:

    1. *charges*: each group is charged, besides its resident bytes, what
       its ops kept live at the peak of an overflowing device
       (``SimResult.live_at_peak_bytes``, ×:data:`LIVE_MARGIN`; the largest
       charge of any round so far). A charge moves with its group, so the
       solvers trade it between devices;
    2. if no round fits, *budgets*: each overflowing device's resident
       budget is lowered by 1.25× its overflow, or to its capacity less what
       it kept live (×:data:`LIVE_MARGIN`) when that is lower.

    Each way fits some plans the other does not (charges: a 5-layer MLP's
    training step capped at 0.75-0.8 of its one-device peak, where budgets
    made plans swing from one device to the other until no plan was left;
    budgets: some random graphs where new peak holders kept appearing).

    Raises
    ------
    InsufficientMemoryError
        Neither way fits: names each device's peak against its capacity and
        the largest resident and activation holders.
    """
    problem = built.problem
    if not np.isfinite(np.asarray(problem.capacity_bytes, dtype=float)).any():
        return sol, []
    first = built.simulate(sol.assignment, order=sol.order)
    notes: list[str] = []
    try:
        return _fit_rounds(built, sol, first, algorithm, options, "charges", notes)
    except InsufficientMemoryError as e:
        notes.append("charging groups for their live tensors did not fit; lowering resident budgets instead")
        log.info("%s: %s", notes[-1], e)
    return _fit_rounds(built, sol, first, algorithm, options, "budgets", notes)


def _fit_rounds(built: BuiltProblem, sol: Solution, sim: SimResult, algorithm: str, options: SolveOptions,
                way: str, notes: list[str]) -> tuple[Solution, list[str]]:
    """:func:`_fit_peak`'s rounds one ``way`` (``"charges"`` or ``"budgets"``) from ``sol`` simulated as ``sim``."""
    problem = built.problem
    cap = np.asarray(problem.capacity_bytes, dtype=float)
    resident = np.asarray(problem.memory_bytes, dtype=float)
    charge, budget = np.zeros(problem.n), cap.copy()
    for rounds in range(PEAK_ROUNDS):
        over = _over(sim.peak_memory_bytes, cap)
        if not over.size:
            return _scored_on(problem, sol, options), notes
        a = np.asarray(sol.assignment, dtype=int)
        if way == "charges":
            at_over = np.where(np.isin(a[built.schedule.group], over), sim.live_at_peak_bytes, 0.0)
            charge = np.maximum(charge, LIVE_MARGIN * np.bincount(built.schedule.group, weights=at_over,
                                                                  minlength=problem.n))
            what = (f"{int(np.count_nonzero(charge))} groups charged for the tensors they keep live "
                    f"({int(charge.sum()):,} B)")
        else:
            live = sim.peak_memory_bytes - np.bincount(a, weights=resident, minlength=problem.k)
            budget[over] = np.minimum(budget[over] - 1.25 * (sim.peak_memory_bytes[over] - cap[over]),
                                      cap[over] - LIVE_MARGIN * live[over])
            if (budget[over] <= 0).any():
                break
            what = f"resident budgets {[int(b) if np.isfinite(b) else None for b in budget]}"
        notes.append(f"predicted peak memory over capacity on {[built.devices.names[d] for d in over]}: "
                     f"re-solving with {what}")
        try:
            sol = solve_problem(problem.with_memory(memory_bytes=resident + charge, capacity_bytes=budget),
                                algorithm, options)
        except (InsufficientMemoryError, NoFeasiblePlanError) as e:
            raise _peak_error(built, sim.peak_memory_bytes, f"re-solving with {what}: {e}") from e
        sim = built.simulate(sol.assignment, order=sol.order)
    if not _over(sim.peak_memory_bytes, cap).size:
        return _scored_on(problem, sol, options), notes
    raise _peak_error(built, sim.peak_memory_bytes, f"after {rounds + 1} rounds of re-solving with {way}")


def _scored_on(problem: PlacementProblem, sol: Solution, options: SolveOptions) -> Solution:
    """``sol`` (solved on ``problem`` with other memory) valued on ``problem`` itself."""
    obj = get_objective(options.objective)
    value = obj.score(problem, np.asarray(sol.assignment, dtype=int), sol.order)
    if value == sol.objective:
        return sol
    return replace(sol, objective=value, lower_bound=min(obj.bound(problem), value))


def plan_problem(built: BuiltProblem, options: PlanOptions, *,
                 given: Mapping[Hashable, str] | None = None,
                 given_order: Mapping[str, Sequence[Any]] | None = None) -> Plan:
    """Solve ``built`` (or score the ``given`` node → device assignment, with its ``given_order`` of each
    device's ops: ``Plan.op_order``) and describe the plan.

    Raises
    ------
    NoFeasiblePlanError
        No algorithm found a plan within the budget.
    PlanError
        ``given`` does not fit the graph or devices.
    """
    t0 = time.perf_counter()
    solve_options = options.solve_options(built)
    problem = built.problem
    log.info("placing %d nodes (%d groups) on %d devices, objective %s", len(built.nodes), problem.n, problem.k,
             options.objective)
    notes: list[str] = []
    if given is None:
        sol = solve_problem(problem, options.algorithm, solve_options)
        if options.memory == "peak":
            sol, notes = _fit_peak(built, sol, options.algorithm, solve_options)
    else:
        sol = _given(built, given, solve_options, given_order)
    a = np.asarray(sol.assignment, dtype=int)
    ev = evaluate(problem, a)
    sim = built.simulate(a, order=sol.order)
    step = _predicted_step(built, sol, options.objective)
    baselines = {}
    attempts = [*notes, *(list(sol.log) or [f"{sol.solver}: {sol.objective:.6g}"])]
    for name in options.baselines:
        if name in sol.scored and sol.scored[name] is None:  # the search had no time for it: neither has the report
            attempts.append(f"baseline {name}: skipped (the time limit was spent)")
            continue
        if not notes and options.objective == "latency" and name in sol.scored:  # scored on this very problem
            baselines[name] = BaselineResult(sol.scored[name], sol.scored[name])
            continue
        b = _baseline(built, name, solve_options)
        if b is None:
            attempts.append(f"baseline {name}: no feasible plan (dropped)")
        else:
            baselines[name] = b
    wall = time.perf_counter() - t0
    obj = get_objective(options.objective)
    log.info("placed with %s [%s]: %s %.6g %s predicted (lower bound %.6g, gap %.1f%%) in %.2f s", sol.solver,
             sol.status, options.objective, sol.objective, obj.unit, sol.lower_bound, 100 * sol.gap, wall)
    return Plan(
        devices=built.devices.names, assignment=built.node_devices(a), objective=options.objective, unit=obj.unit,
        value=float(sol.objective), lower_bound=float(sol.lower_bound), gap=float(sol.gap), solver=sol.solver,
        status=sol.status, solve_time_s=wall, group_by=built.group_by, groups=problem.n,
        predicted_step_time_s=float(step), predicted_max_load_s=float(ev.objective),
        traffic_bytes=float(ev.traffic_bytes.sum()), predicted_device_load_s=tuple(float(x) for x in ev.load_s),
        device_memory_bytes=tuple(float(x) for x in ev.memory_bytes),
        predicted_peak_memory_bytes=tuple(float(x) for x in sim.peak_memory_bytes), baselines=baselines,
        log=tuple(attempts), op_order=built.op_order(sol.order),
    )


def _on_one_device(built: BuiltProblem, options: PlanOptions, plan: Plan, group_assignment: np.ndarray,
                   note: str, *, solver: str = "single", status: str = "heuristic") -> Plan:
    """``plan`` replaced by ``group_assignment`` (every op on one device; or a copy's plan on its group's devices,
    by ``solver`` with ``status``), scored like any plan, with ``note`` in its log and ``plan``'s baselines,
    batch, compression and solve time."""
    single = plan_problem(built, options, given=built.node_devices(group_assignment))
    return replace(single, solver=solver, status=status, log=(*plan.log, note), baselines=plan.baselines,
                   batch_size=plan.batch_size, compression=plan.compression, solve_time_s=plan.solve_time_s,
                   candidates=plan.candidates)


def pipeline_plan(built: BuiltProblem, plan: Plan, options: PlanOptions, batch_size: int,
                  candidates: Sequence[int], *, small: Any = None, fallback: bool = True,
                  split_margin: float = SPLIT_MARGIN, order: str = "auto") -> Plan:
    """``plan`` run as the candidate micro-batch count with the shortest predicted step; or one device.

    With ``fallback`` and a time objective, one device (the single
    baseline's) at its own best count is tried too: the solver spreads
    work for its objective (for ``throughput``, the busiest device's load,
    which ignores how many micro-batches fill the pipeline), while a batch
    runs as one step. The spread plan is kept only where it is predicted at
    least ``split_margin`` (default :data:`SPLIT_MARGIN`) faster than one device (whose simulated peak
    memory must fit); the plan is returned with ``microbatches`` and
    ``predicted_step_time_s`` set, and a fallback says so in its ``log``.

    A training plan in micro-batches then gets its pipeline ``order`` (``"auto"``, ``"gpipe"`` or
    ``"1f1b"``: :func:`placer.core.microbatch.pipeline_order`), with its ``stages`` for 1F1B.

    Raises
    ------
    PlanError
        ``order="1f1b"`` where it cannot run (inference, or devices that do not hold contiguous stages).
    """
    a = built.group_assignment(plan.assignment)
    m, step = best_microbatches(built, a, batch_size, candidates, small=small)
    if plan.op_order and (m == 1 or plan.predicted_step_time_s <= step):
        m, step = 1, plan.predicted_step_time_s  # in its own order (which no pipeline keeps)
    plan = plan.scored(plan.as_candidate(step, microbatches=m), kept=True)
    if fallback and options.objective != "memory" and len(np.unique(a)) > 1:
        try:
            one = solve_problem(built.problem, "single", options.solve_options(built))
        except NoFeasiblePlanError as e:  # nothing fits one device: the spread plan stands
            log.info("one device is not an alternative to the pipeline: %s", e)
            one = None
            plan = plan.scored(Candidate("one device", "single", 1, 1, 1, 0, None, None,
                                         f"does not fit: {e}"), kept=False)
        if one is not None:
            m1, step1 = best_microbatches(built, one.assignment, batch_size, candidates, small=small)
            peak1 = None
            if step1 < step * (1 + split_margin):  # peak simulated only if it wins
                peak1 = simulate_pipeline(built, one.assignment, m1, SimOptions(), small=small,
                                          batch_size=batch_size).peak_memory_bytes
            single = Candidate("one device", "single", 1, 1, m1, 0, step1,
                               None if peak1 is None else float(np.max(peak1)), KEPT)
            if peak1 is not None and not _over(peak1, built.problem.capacity_bytes).size:
                faster = ("faster than" if step1 < step else
                          f"within {100 * split_margin:.0f}% (split_margin, the cost model's error) of")
                note = (f"one device at {m1} micro-batch(es) is predicted {faster} the {plan.solver} plan at its "
                        f"best {m} ({1e3 * step1:.3f} ms against {1e3 * step:.3f} ms): placed on one device")
                log.info(note)
                plan = _on_one_device(built, options, plan, one.assignment, note).scored(
                    replace(single, note=note), kept=True)
                m, step, a = m1, step1, one.assignment
            else:
                plan = plan.scored(single.with_outcome(
                    "over memory" if peak1 is not None else
                    f"not within {100 * split_margin:.0f}% (split_margin) of the {plan.solver} plan"), kept=False)
    choice = pipeline_order(built, a, m, order, small=small, batch_size=batch_size)
    stages: tuple[str, ...] = ()
    if choice.order == "1f1b":
        step = choice.step_s
        fine = np.asarray(a, dtype=int)[built.schedule.group]
        stages = tuple(built.devices.names[d] for d in pipeline_stages(built.schedule, fine, built.phases or None))
    if m > 1 and "backward" in (built.phases or ()):
        plan = replace(plan, log=(*plan.log, f"pipeline order {choice.order}: {choice.why}"))
    if m > 1 and plan.op_order:
        plan = replace(plan, op_order={}, log=(*plan.log, f"the planned order of each device's ops is dropped: "
                                                         f"{m} micro-batches run in the executor's order"))
    return replace(plan, microbatches=m, predicted_step_time_s=step if m > 1 else plan.predicted_step_time_s,
                   pipeline=choice.order, stages=stages)


def replica_plan(built: BuiltProblem, plan: Plan, options: PlanOptions, batch_size: int, replicas: int | str,
                 microbatches: Sequence[int], *, small: Any = None, parameter_codec: ParameterCodec | None = None,
                 group_plan: Callable[[int], Plan] | None = None) -> Plan:
    """``plan``, or data-parallel copies of the model where that is asked or predicted faster.

    ``replicas="auto"``: for each ``R`` dividing the ``k`` devices (``R`` ≥ 2), the devices split in order into
    ``R`` groups; a group of one device holds a whole copy, a group of several runs a copy placed over them by
    ``group_plan(k // R)`` (a plan made on the first group's devices: stages or spread ops inside each copy;
    without ``group_plan`` only one device per copy is tried). Each copy runs its part of the batch as the
    best of ``microbatches`` micro-batches (:func:`placer.core.replicas.best_replicas`). The fastest copies
    replace ``plan`` where their simulated step is shorter than ``plan``'s ``predicted_step_time_s`` and their
    simulated peak memory fits every device; the plan's ``log`` says which was predicted faster, by how much.
    ``replicas=R`` (``R`` dividing the devices) takes those copies at their best micro-batch count. ``1`` or one
    device: ``plan``. The copies' plan places the first group's copy (one device: every op on the first
    device; the variables live on the first group, and each other group reads a mirror of them in a forward
    pass), with ``replicas`` and ``microbatches`` set and its predicted step the simulated replicated step.
    A training step's copies (one micro-batch each) sum their gradients where the variables live; its plan
    is that decision, made on the full batch's trace: the runner then plans one replica's step on its own
    trace. ``parameter_codec``: the codec of the copies' weights and gradients
    (:func:`placer.core.replicas.simulate_replicas`).

    Raises
    ------
    PlanError
        ``replicas=R`` that does not divide the devices (or, without ``group_plan``, is not one copy per
        device), or a batch with fewer rows than copies.
    InsufficientMemoryError
        ``replicas=R`` whose copies do not fit the devices' memory.
    """
    k = len(built.devices)
    if replicas == 1 or k < 2:
        return plan
    if replicas != "auto":
        r = int(replicas)
        if k % r or r < 2 or (r != k and group_plan is None):
            raise PlanError(f"replicas={replicas} for a forward pass takes {'groups of' if group_plan else 'one'} "
                            f"device{'s' if group_plan else ''} per copy: pass a multiple of {replicas} devices "
                            f"(got {k}), or replicas='auto'")
        counts = [r]
    else:
        counts = [r for r in range(2, k + 1) if k % r == 0 and (r == k or group_plan is not None)]
    group_plans = {r: group_plan(k // r) for r in counts if r != k} if group_plan is not None else {}
    assignments = {r: built.group_assignment(p.assignment) for r, p in group_plans.items()}
    best = best_replicas(built, batch_size, counts, microbatches, small=small, parameter_codec=parameter_codec,
                         group_assignments=assignments)
    if best is None:
        if replicas == "auto":
            return plan
        raise PlanError(f"replicas={replicas} needs a batch of at least {replicas} rows (got {batch_size}); pass a "
                        "larger batch_size, or replicas='auto'")
    r, m, step = best
    size = k // r
    inner = group_plans.get(r)
    assignment = np.zeros(len(built.problem.names), dtype=int) if inner is None else assignments[r]
    where = "" if inner is None else f" over {size} devices each ({inner.solver} plan)"
    copies = Candidate("copies", "single" if inner is None else inner.solver, size, r, m, 0, step, None, KEPT)
    if replicas == "auto" and step >= plan.predicted_step_time_s:
        note = (f"{r} data-parallel copies{where} at {m} micro-batch(es) each are predicted slower than the "
                f"{plan.solver} plan ({1e3 * step:.3f} ms against {1e3 * plan.predicted_step_time_s:.3f} ms): "
                "one copy")
        log.info(note)
        return replace(plan, log=(*plan.log, note)).scored(replace(copies, note=note).with_outcome(
            f"slower than the {plan.solver} plan ({1e3 * plan.predicted_step_time_s:.3f} ms)"), kept=False)
    peak = simulate_replicas(built, assignment, r, m, SimOptions(), small=small, batch_size=batch_size,
                             parameter_codec=parameter_codec).peak_memory_bytes
    copies = replace(copies, predicted_peak_memory_bytes=float(np.max(peak)))
    over = _over(peak, built.problem.capacity_bytes)
    if over.size:
        if replicas == "auto":
            note = f"{r} data-parallel copies would be faster but do not fit the devices' memory: one copy"
            log.info(note)
            return replace(plan, log=(*plan.log, note)).scored(
                replace(copies, note=note).with_outcome("over memory"), kept=False)
        raise _peak_error(built, peak, f"replicas={r}: the copies")
    note = (f"{r} data-parallel copies{where} at {m} micro-batch(es) each are predicted "
            + (f"faster than the {plan.solver} plan at {plan.microbatches} ({1e3 * step:.3f} ms against "
               f"{1e3 * plan.predicted_step_time_s:.3f} ms)" if replicas == "auto" else f"at {1e3 * step:.3f} ms (asked)")
            + (": a copy of the model on each device" if size == 1 else f": a copy of the model per {size} devices"))
    log.info(note)
    solver, status = ("single", "heuristic") if inner is None else (inner.solver, inner.status)
    placed = _on_one_device(built, options, plan, assignment, note, solver=solver, status=status)
    return replace(placed, replicas=r, microbatches=m, predicted_step_time_s=step, op_order={}, pipeline="gpipe",
                   stages=(), predicted_peak_memory_bytes=tuple(float(x) for x in peak)).scored(
                       replace(copies, note=note), kept=True)


def solve(graph: nx.DiGraph, devices: Sequence[Any] | DeviceSet, **options: Any) -> Plan:
    """Place every node of ``graph`` on one of ``devices``.

    Parameters
    ----------
    graph : networkx.DiGraph
        A DAG in the format of ``docs/graph-format.md`` (``compute_us``,
        ``memory_bytes``, ``colocation``, ``allowed_kinds``, ``layer``;
        edges ``bytes``), e.g. a file read by :func:`placer.load_graph`.
    devices : sequence or DeviceSet
        Device strings or :class:`~placer.DeviceSpec` (name, memory, speed,
        link); a :class:`~placer.core.devices.DeviceSet` to give every link.
    **options
        Fields of :class:`PlanOptions` (``objective``, ``algorithm``,
        ``time_limit_s``, ``seed``, ``max_nodes``, ``group_by``, ``memory``, ``execution_order``,
        ``split_margin``, ``baselines``). Those not given are taken from the graph's own plan options where it
        has them (a graph file saved by ``placed.save_graph`` carries the options ``autoplace`` planned with,
        so that the same graph and devices give ``autoplace``'s plan), else :class:`PlanOptions`' defaults.

    Returns
    -------
    Plan
        Every time in it is predicted by the cost model.

    Raises
    ------
    GraphError, CostError, DeviceError
        Bad graph or devices; the message names the node or device.
    InsufficientMemoryError
        A group or the whole graph cannot fit.
    NoFeasiblePlanError
        No algorithm found a plan within the budget.
    SolverError, AutoplaceError
        Unknown objective, algorithm or option, or a bad time limit.
    """
    saved = graph.graph.get(PLAN_OPTIONS_KEY) if isinstance(graph, nx.DiGraph) else None
    known = {f.name for f in fields(PlanOptions)}
    defaults = {k: tuple(v) if isinstance(v, list) else v for k, v in (saved or {}).items() if k in known}
    opts = options_from({**defaults, **options}, PlanOptions)
    built = build_problem(graph, as_device_set(devices), group_by=opts.group_by)
    plan = plan_problem(built, opts)
    if opts.split_margin is not None and opts.algorithm == DEFAULT_SOLVER:  # autoplace's rule, at one batch
        plan = pipeline_plan(built, plan, opts, 1, [1], fallback=True, split_margin=opts.split_margin)
    return plan
