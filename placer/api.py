"""``autoplace(model, devices)``: the whole pipeline in one call."""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import tensorflow as tf

from cost_models.cache import ProfileCache, default_cache_dir

from .coarsen import GROUPINGS, coarsen
from .costs import compute_costs
from .devices import DeviceSet, resolve_devices
from .emit import COMPRESSORS, emit
from .errors import AutoplaceError, InsufficientMemoryError
from .objectives import DEFAULT_OBJECTIVE, OBJECTIVES, get_objective
from .opgraph import MEMORY_BYTES, OpGraph, build_op_graph
from .placed_model import PlacedModel
from .plan import BaselineResult, Plan
from .planning import build_problem, project, simulate_ops
from .problem import evaluate
from .report import build_report
from .solvers import DEFAULT_SOLVER, SolveOptions, available_solvers, solve_problem
from .trace import check_model, trace_model

log = logging.getLogger(__name__)

BASELINES = ("single", "round_robin", "contiguous")


@dataclass(frozen=True)
class PlacementOptions:
    """Options of :func:`autoplace` (all keyword arguments).

    Attributes
    ----------
    batch_size : int or None
        Planning batch size; required when the model's batch is unknown.
    input_signature : sequence or None
        ``tf.TensorSpec``s or shape tuples overriding the model's inputs.
    algorithm : str
        Solver name (see :func:`placer.solvers.available_solvers`).
    time_limit_s : float
        Solver time budget.
    compression : str
        ``"none"`` (bit-exact), ``"bf16"`` or ``"fp16"`` on cut float edges.
    group_by : str
        Coarsening: ``"layer"`` (default) or ``"op"``.
    profile_repeats : int
        Measured runs per op (after 2 warm-up runs).
    profile_grappler : bool
        Profile ops with TensorFlow's graph optimizer on, as the placed
        function runs them (default; fused kernels are timed under one op's
        name); ``False`` times every traced op on its own.
    seed : int
        Seed for solvers and the profiling inputs.
    objective : str
        ``"latency"`` (default: one predicted step), ``"throughput"``
        (pipelined max device load) or ``"memory"`` (least traffic that fits);
        see :mod:`placer.objectives`.
    profile_cache : bool or str
        Reuse measured op times across runs: ``True`` (default) caches in
        ``$AUTOPLACE_CACHE_DIR`` / ``~/.cache/autoplace``, a path caches
        there, ``False`` always profiles.
    hardware : Mapping or None
        Device kind → analytic spec (a name in
        ``cost_models.analytic.HARDWARE``, a dict or a ``HardwareSpec``): ops
        are costed by the roofline model for that kind instead of measured.
    """

    batch_size: int | None = None
    input_signature: Sequence[Any] | None = None
    algorithm: str = DEFAULT_SOLVER
    time_limit_s: float = 10.0
    compression: str = "none"
    group_by: str = "layer"
    profile_repeats: int = 5
    profile_grappler: bool = True
    seed: int = 0
    objective: str = DEFAULT_OBJECTIVE
    profile_cache: bool | str = True
    hardware: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.algorithm not in available_solvers():
            raise AutoplaceError(f"unknown algorithm {self.algorithm!r}; choose one of {available_solvers()}")
        if self.objective not in OBJECTIVES:
            raise AutoplaceError(f"unknown objective {self.objective!r}; choose one of {sorted(OBJECTIVES)}")
        if self.compression not in COMPRESSORS:
            raise AutoplaceError(f"unknown compression {self.compression!r}; choose one of {sorted(COMPRESSORS)}")
        if self.group_by not in GROUPINGS:
            raise AutoplaceError(f"unknown group_by {self.group_by!r}; choose one of {sorted(GROUPINGS)}")
        if not (isinstance(self.time_limit_s, (int, float)) and self.time_limit_s > 0):
            raise AutoplaceError(f"time_limit_s must be a positive number, got {self.time_limit_s!r}")
        if not (isinstance(self.profile_repeats, int) and self.profile_repeats >= 1):
            raise AutoplaceError(f"profile_repeats must be a positive integer, got {self.profile_repeats!r}")


def _check_memory(op_graph: OpGraph, devset: DeviceSet) -> None:
    caps = [d.memory_bytes for d in devset.devices]
    if any(c is None for c in caps):
        return
    sizes = {}
    for ph, path in op_graph.variables.items():
        sizes[path] = op_graph.graph.nodes[ph][MEMORY_BYTES]
    total, cap = sum(sizes.values()), sum(caps)
    if total > cap:
        largest = sorted(sizes.items(), key=lambda kv: -kv[1])[:5]
        listing = ", ".join(f"{p} ({b:,} B)" for p, b in largest)
        raise InsufficientMemoryError(
            f"the model's {len(sizes)} variables need {total:,} bytes but the {len(caps)} devices declare "
            f"{cap:,} bytes in all: {total - cap:,} bytes short. Largest variables: {listing}. "
            "Add devices or declare larger memory_bytes."
        )


def _baselines(problem: Any, op_graph: OpGraph, devset: DeviceSet, coarse: Any,
               options: SolveOptions) -> dict[str, BaselineResult]:
    out = {}
    for name in BASELINES:
        try:
            sol = solve_problem(problem, name, options)
        except AutoplaceError:
            continue
        sim = simulate_ops(op_graph, devset, project(coarse, sol.assignment, devset))
        out[name] = BaselineResult(sol.objective, sim.step_time_s)
    return out


def autoplace(model: Any, devices: Sequence[Any], **options: Any) -> PlacedModel:
    """Place a Keras model's ops on ``devices`` and return a placed model.

    Parameters
    ----------
    model : keras.Model
        A built Keras 3 model (TensorFlow backend). It is never modified.
    devices : sequence
        Device strings (``"/CPU:1"``, ``"/GPU:0"``,
        ``"/job:worker/replica:0/task:1/device:CPU:0"``),
        ``tf.config.LogicalDevice`` objects or :class:`placer.DeviceSpec`.
    **options
        Fields of :class:`PlacementOptions`.

    Returns
    -------
    PlacedModel

    Raises
    ------
    ModelError, InputSignatureError, DeviceError, InsufficientMemoryError,
    NoFeasiblePlanError, AutoplaceError
        Each with a message that says what to change.

    Examples
    --------
    >>> import keras, numpy as np, placer
    >>> m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    >>> placed = placer.autoplace(m, ["/CPU:0"], batch_size=2, time_limit_s=1)
    >>> x = np.ones((2, 4), "float32")
    >>> bool(np.array_equal(placed(x).numpy(), m(x).numpy()))
    True
    """
    unknown = sorted(set(options) - {f.name for f in dataclasses.fields(PlacementOptions)})
    if unknown:
        raise AutoplaceError(f"unknown option(s) {unknown}; valid options: "
                             f"{[f.name for f in dataclasses.fields(PlacementOptions)]}")
    opts = PlacementOptions(**options)
    check_model(model)
    devset = resolve_devices(devices, available=[d.name for d in tf.config.list_logical_devices()])
    stages: dict[str, float] = {}
    t = time.perf_counter()
    traced = trace_model(model, batch_size=opts.batch_size, input_signature=opts.input_signature)
    stages["trace"] = time.perf_counter() - t
    t = time.perf_counter()
    kinds = sorted({d.kind for d in devset.devices})
    cache = None
    if opts.profile_cache:
        cache = ProfileCache(default_cache_dir() if opts.profile_cache is True else opts.profile_cache)
    costs = compute_costs(traced, kinds, repeats=opts.profile_repeats, seed=opts.seed, hardware=opts.hardware,
                          cache=cache, grappler=opts.profile_grappler)
    compute = costs.us
    stages["profile"] = time.perf_counter() - t
    t = time.perf_counter()
    op_graph = build_op_graph(traced, compute)
    _check_memory(op_graph, devset)
    coarse = coarsen(op_graph, opts.group_by)
    problem = build_problem(coarse, devset, op_graph)
    stages["build"] = time.perf_counter() - t
    t = time.perf_counter()
    solve_options = SolveOptions(time_limit_s=opts.time_limit_s, seed=opts.seed, objective=opts.objective)
    sol = solve_problem(problem, opts.algorithm, solve_options)
    stages["solve"] = time.perf_counter() - t
    log.info("placed %d groups (%d ops) on %d devices with %s [%s]: %s %.6g, gap %.1f%%", problem.n,
             op_graph.graph.number_of_nodes(), len(devset), sol.solver, sol.status, opts.objective, sol.objective,
             100 * sol.gap)
    op_devices = project(coarse, sol.assignment, devset)
    t = time.perf_counter()
    sim = simulate_ops(op_graph, devset, op_devices)
    baselines = _baselines(problem, op_graph, devset, coarse, solve_options)
    stages["simulate"] = time.perf_counter() - t
    t = time.perf_counter()
    emitted = emit(traced, op_devices, opts.compression)
    stages["emit"] = time.perf_counter() - t
    plan = Plan(
        devices=devset.names, assignment=op_devices, objective=opts.objective,
        unit=get_objective(opts.objective).unit, value=sol.objective, lower_bound=sol.lower_bound,
        gap=sol.gap, solver=sol.solver, status=sol.status, solve_time_s=sol.wall_s,
        predicted_step_time_s=sim.step_time_s, baselines=baselines, compression=opts.compression,
        compressed_edges=len(emitted.compressed), batch_size=traced.batch_size, groups=problem.n,
    )
    ev = evaluate(problem, sol.assignment)
    report = build_report(plan, op_graph, devset, sim, stages)
    report["plan"]["device_load_s"] = {"compute": ev.compute_s.tolist(), "communication": ev.comm_s.tolist()}
    report["costs"] = {"source": dict(costs.source), "profiled_with_grappler": opts.profile_grappler,
                       "analytic_unknown_op_types": {k: list(v) for k, v in costs.unknown_op_types.items() if v}}
    log.info("autoplace %s: %s", model.name, " ".join(f"{k}={v:.2f}s" for k, v in stages.items()))
    return PlacedModel(emitted, plan, traced.input_specs, report, model.name)
