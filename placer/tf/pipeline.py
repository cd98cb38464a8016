"""``autoplace(model, devices)``: the pipeline, one explicit list of stages.

==========  ==================================  =================================  =========================
stage       function                            takes                              returns (frozen)
==========  ==================================  =================================  =========================
devices     :func:`~placer.core.devices.        the user's device list             ``DeviceSet``
            resolve_devices`
trace       :func:`~placer.tf.trace.            the Keras model                    ``TracedModel``
            trace_model` (training:
            :func:`~placer.tf.training.
            trace_training`)
costs       :func:`~placer.tf.costs.            traced model, device kinds         ``ComputeCosts``
            compute_costs`
hosts       :func:`~placer.measure.hosts.       traced model, devices              ``DeviceSet`` with the
            shared_processors`                                                     processors devices share
graph       :func:`~placer.tf.opgraph.          traced model, costs                ``OpGraph``
            build_op_graph`
problem     :func:`~placer.core.build.          op graph, devices, grouping        ``BuiltProblem``
            build_problem`
solve       :func:`~placer.planner.             built problem, options             ``Plan``
            plan_problem`                       (or a saved plan)
microbatch  :func:`_microbatches` (``placer.      plan, model                        ``Plan`` with its
            core.microbatch``)                                                     micro-batches
calls       :func:`_call_overhead`              plan, traced model                 ``Plan`` + the measured
                                                                                   fixed cost per call
codecs      :func:`compression_policy`          compression options, devices       ``CompressionPolicy``
emit        :meth:`PlacedModel.place`           traced model, plan                 ``EmittedModel``
            (:func:`~placer.tf.emit.emit`)
report      :func:`~placer.tf.report.           what the stages returned           ``Report``
            build_report`
==========  ==================================  =================================  =========================

One :class:`StageTimer` runs them: it times each stage, logs it, and puts
the stage's name on any error it raises (``AutoplaceError.stage``, and the
message starts with ``[solve stage]``, say). The problem and solve stages
are the same code :func:`placer.solve` runs on a saved op graph.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence, TypeVar

import tensorflow as tf

from cost_models.simulate import SimOptions, checked_ready_order

from ..core.build import MODEL_GROUP_BY, build_problem
from ..core.compression import DEFAULT_ERROR_BUDGET, CompressionPolicy
from ..core.microbatch import checked_pipeline
from ..core.devices import resolve_devices
from ..core.order import MODEL_EXECUTION_ORDER
from ..core.plan import Plan
from ..core.validate import MAX_BATCH_SIZE, MAX_TIME_LIMIT_S, integer, real
from ..errors import AutoplaceError, InputSignatureError, PlanError, TrainingError
from ..planner import (DEFAULT_SOLVER, MAX_SPLIT_MARGIN, MODEL_MEMORY, SPLIT_MARGIN, PlanOptions, options_from,
                       pipeline_plan, plan_problem)
from .costs import ProfileOptions, compute_costs
from .opgraph import build_op_graph
from .placed_model import PlacedModel
from .remote import DEFAULT_WORKER_TIMEOUT_S
from .report import build_report
from .sends import SENDS, acknowledged_nodes
from .trace import trace_model
from .training import check_replicable, trace_training

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class PlacementOptions:
    """Options of :func:`autoplace` (all keyword arguments; defaults are the library's own).

    Attributes
    ----------
    batch_size : int or None
        Planning batch size; required when the model's batch is unknown.
    input_signature : sequence or None
        ``tf.TensorSpec``s or shape tuples overriding the model's inputs.
    objective, algorithm, time_limit_s, seed, max_nodes
        As in :class:`placer.planner.PlanOptions` (same defaults).
    group_by : str
        Which ops move together: ``"layer"`` (default: a Keras layer stays on
        one device, so TensorFlow fuses the same kernels and outputs stay
        bit-exact) or ``"op"`` (only colocation constraints).
    memory : str
        What must fit each device's ``memory_bytes``: ``"peak"`` (default:
        the simulated step's peak, i.e. parameters, optimizer slots,
        gradients and live activations) or ``"resident"`` (variables only);
        see :class:`placer.planner.PlanOptions`.
    execution_order : str
        ``"executor"`` (default: TensorFlow's executor orders each device's ops) or ``"auto"`` (a plan may fix
        that order where predicted faster: control edges in the placed graph; not with micro-batches), as in
        :class:`placer.planner.PlanOptions` (whose default is ``"auto"``; why they differ:
        :data:`placer.core.order.MODEL_EXECUTION_ORDER`).
    compression : str
        Codec of cut float edges (:data:`placer.core.compression.CODECS`):
        ``"none"`` (default, bit-exact), ``"bf16"``, ``"fp16"`` or ``"int8"``
        (forward activations only) on every eligible cut edge, or ``"auto"``:
        per edge, the codec that sends it fastest on its link (measured codec
        cost on both devices) within ``compression_error``, else none.
    compression_error : float
        ``auto``'s error budget: the largest per-tensor relative error
        (``max|decoded - x| / max|x|``) a codec may introduce.
    profile_repeats, profile_grappler, profile_cache, profile_runtime, hardware
        How op costs are obtained: :class:`placer.tf.costs.ProfileOptions`'
        ``repeats``, ``grappler``, ``cache``, ``runtime`` and ``hardware`` (same defaults).
    training : bool
        Plan and place the whole training step (Keras' ``train_step``:
        forward, loss, gradients, optimizer update) so that ``fit`` and
        ``evaluate`` run placed; ``False`` (default) places inference only.
    optimizer, loss, metrics, loss_weights
        Compile settings for training (as ``keras.Model.compile`` takes them);
        ``None``: the compiled model's own (fresh objects, same configuration).
    progress : callable or None
        ``progress(stage, seconds)`` is called as each stage of
        :data:`STAGES` starts (``seconds`` ``None``) and ends (its wall
        seconds); the CLI draws its progress bar with it. ``None`` (default):
        the library only logs.
    worker_timeout_s : float
        Placed calls on remote (gRPC) workers: how long a worker may leave a
        health probe unanswered before the call ends with a ``WorkerError``
        (TensorFlow alone would wait forever on a frozen worker; see
        :mod:`placer.tf.remote`).
    replicas : int
        Hybrid data + model parallelism for training: the devices are split
        into this many equal groups, in order; the plan is made for the first
        group at ``batch_size / replicas`` and run by every group on its part
        of each batch; gradients are summed where each variable lives and one
        update is applied (the full-batch step; models with batch
        normalization are refused, random ops draw per replica).
    microbatches : int or "auto"
        Run each batch as a pipeline of this many micro-batches
        (:mod:`placer.tf.microbatch`: GPipe's schedule, each device's
        micro-batches in order), which is how a plan that cuts a chain of
        layers into stages speeds up a batch (pair it with
        ``objective="throughput"``). It must divide the planning batch
        size (with ``replicas``, each replica's share). Training accumulates
        the micro-batches' gradients and applies one update: the full-batch
        step (models with batch normalization are refused: each micro-batch
        would use its own statistics); with ``replicas`` each group
        pipelines its share of the batch.
        ``"auto"``: the divisor up to 16 whose simulated pipelined step is
        shortest. Default 1 (no pipelining).
    pipeline : {"auto", "gpipe", "1f1b"}
        How a pipelined *training* step orders each device's micro-batches:
        ``"gpipe"``, every forward micro-batch, then (ordered apart) every
        backward one; ``"1f1b"``, after a warm-up of as many forward
        micro-batches as stages remain, one backward and one forward in
        turn, so a device holds the activations of at most that many
        micro-batches (GPipe's first stage holds all of them). ``"auto"``
        (default): 1F1B where the simulated peak memory is lower and the
        simulated step at most 2% longer
        (:func:`placer.core.microbatch.pipeline_order`), else GPipe. 1F1B
        needs devices that hold contiguous stages (else its gates would
        wait in a cycle: ``"1f1b"`` is then a ``PlanError``, ``"auto"``
        keeps GPipe). The same full-batch update in every order.
    sends : {"auto", "prompt", "executor"}
        When a tensor another process waits for leaves its producer's
        process. TensorFlow's executor queues a ``_Send`` behind the ops it
        runs inline, and a worker with one inter-op thread reaches its queue
        only when it runs out of other work: a two-stage split then overlaps
        nothing (:mod:`placer.tf.sends`). ``"prompt"``: each transfer that
        unblocks at least a millisecond of work on its receiver is
        acknowledged, and the sender's competing ops wait for that (one
        round trip); ``"executor"``: as TensorFlow orders them; ``"auto"``
        (default): ``"prompt"`` where the ready order is ``"lifo"`` (every
        process runs one inter-op thread), else ``"executor"``.
    calibrate_links : bool
        Measure the links between devices of different processes (gRPC
        workers) before planning (:func:`placer.measure.links.calibrate_links`:
        a ping-pong chain per pair and payload size, a few seconds); the
        report marks them ``calibrated``. Links inside one process keep the
        assumed defaults. Default True.
    measure_call : bool
        Measure the plan's fixed cost per call (dispatch, feeding the inputs,
        fetching the outputs, one round of RPCs per worker:
        :func:`placer.measure.links.measure_call`, well under a second) and
        add it to the predicted step (``plan.call_overhead_s``). Default True.
    shared_capacity : "measure", float or None
        Logical CPU devices of one process share its cores, and worker
        processes on one machine share it (caches, memory bandwidth, the
        client). ``"measure"`` (default): measure how much of the model's
        work they do at once (:mod:`placer.measure.hosts`; a second or so
        for small models, ~10 s for ResNet50 on workers) and let the
        simulator and the objectives charge it; a number: that capacity
        (1 … devices in the group) for every group; ``None``: treat them as
        independent processors (what the plan then promises is not what
        runs).
    targets : tf.TensorSpec, shape tuple or list of them, optional
        The labels' shapes and dtypes for planning (default: those of the
        model's outputs; labels of another shape, e.g. sparse class ids, are
        traced when ``fit`` first sees them, on the same plan).
    split_margin : float
        With the default algorithm and a time objective, the plan on several
        devices is kept over one device only where it is predicted at least
        this much faster (default :data:`placer.planner.SPLIT_MARGIN`, 0.1:
        10%, about the cost model's median error; ``0`` keeps any predicted
        gain; larger where predictions of split plans have run fast, e.g.
        gRPC workers sharing one machine).
    ready_order : {"detect", "fifo", "lifo"} or None
        Which ready op each device's executor runs next, for the simulator
        the solvers plan with: ``"fifo"`` (or ``None``), the earliest ready
        (several inter-op threads per process, as this process's logical
        devices by default); ``"lifo"``, depth first, for processes with one
        inter-op thread, such as ``LocalCluster(threads=1)``'s workers: a
        plan made under ``"fifo"`` measured slower than one such worker where
        the plan made under ``"lifo"`` did not (``benchmarks/fidelity.py``).
        ``"detect"`` (default): ``"lifo"`` when every process holding a
        device runs one inter-op thread, else ``"fifo"``
        (:func:`placer.measure.hosts.executor_ready_order`; a worker not
        started by ``python -m placer.measure.worker`` cannot be told and
        counts as ``"fifo"``, logged).
    """

    batch_size: int | None = None
    input_signature: Sequence[Any] | None = None
    objective: str = PlanOptions.objective
    algorithm: str = PlanOptions.algorithm
    time_limit_s: float = PlanOptions.time_limit_s
    seed: int = PlanOptions.seed
    max_nodes: int = PlanOptions.max_nodes
    group_by: str = MODEL_GROUP_BY
    memory: str = MODEL_MEMORY
    execution_order: str = MODEL_EXECUTION_ORDER
    compression: str = "none"
    compression_error: float = DEFAULT_ERROR_BUDGET
    profile_repeats: int = ProfileOptions.repeats
    profile_grappler: bool = ProfileOptions.grappler
    profile_cache: bool | str | os.PathLike = ProfileOptions.cache
    profile_runtime: bool = ProfileOptions.runtime
    hardware: Mapping[str, Any] | None = None
    training: bool = False
    optimizer: Any = None
    loss: Any = None
    metrics: Any = None
    loss_weights: Any = None
    targets: Any = None
    replicas: int = 1
    shared_capacity: str | float | None = "measure"
    microbatches: int | str = 1
    split_margin: float = SPLIT_MARGIN
    ready_order: str | None = "detect"
    pipeline: str = "auto"
    sends: str = "auto"
    calibrate_links: bool = True
    measure_call: bool = True
    worker_timeout_s: float = DEFAULT_WORKER_TIMEOUT_S
    progress: Callable[[str, float | None], None] | None = None

    def __post_init__(self) -> None:
        if self.progress is not None and not callable(self.progress):
            raise AutoplaceError(f"progress must be a callable progress(stage, seconds), got {self.progress!r}")
        object.__setattr__(self, "replicas", integer("replicas", self.replicas, minimum=1, error=TrainingError))
        for flag in ("training", "profile_grappler", "profile_runtime", "calibrate_links", "measure_call"):
            if not isinstance(getattr(self, flag), bool):
                raise AutoplaceError(f"{flag} must be True or False, got {getattr(self, flag)!r}")
        if self.batch_size is not None:
            object.__setattr__(self, "batch_size", integer("batch_size", self.batch_size, minimum=1,
                                                           maximum=MAX_BATCH_SIZE, error=InputSignatureError))
        object.__setattr__(self, "profile_repeats", integer("profile_repeats", self.profile_repeats, minimum=1,
                                                            maximum=10**6))
        object.__setattr__(self, "worker_timeout_s", real("worker_timeout_s", self.worker_timeout_s, strict=True,
                                                          maximum=MAX_TIME_LIMIT_S))
        object.__setattr__(self, "split_margin", real("split_margin", self.split_margin, maximum=MAX_SPLIT_MARGIN))
        try:
            CompressionPolicy(self.compression, self.compression_error)
        except ValueError as e:
            raise AutoplaceError(str(e)) from None
        if self.shared_capacity is not None and self.shared_capacity != "measure":
            if isinstance(self.shared_capacity, (str, bool)):
                raise AutoplaceError(f"shared_capacity must be 'measure', a number >= 1 or None, "
                                     f"got {self.shared_capacity!r}")
            object.__setattr__(self, "shared_capacity", real("shared_capacity", self.shared_capacity, strict=True,
                                                              maximum=1e6))
            if self.shared_capacity < 1:
                raise AutoplaceError(f"shared_capacity is at least 1 (one device's work at a time), "
                                     f"got {self.shared_capacity}")
        checked_pipeline(self.pipeline, AutoplaceError)
        if self.sends not in SENDS:
            raise AutoplaceError(f"sends must be one of {', '.join(map(repr, SENDS))} (prompt: acknowledged "
                                 f"transfers; executor: TensorFlow's order), got {self.sends!r}")
        checked_ready_order(self.ready_order, AutoplaceError,
                            also={"detect": "the default: lifo where every process runs one inter-op thread"})
        if self.microbatches != "auto":
            if isinstance(self.microbatches, (str, bool)):
                raise AutoplaceError(f"microbatches must be a positive integer or 'auto', got {self.microbatches!r}")
            object.__setattr__(self, "microbatches", integer("microbatches", self.microbatches, minimum=1,
                                                              maximum=MAX_BATCH_SIZE, error=InputSignatureError))
        self.plan_options()
        self.profile_options()

    def plan_options(self) -> PlanOptions:
        """The solve stage's options."""
        return PlanOptions(objective=self.objective, algorithm=self.algorithm, time_limit_s=self.time_limit_s,
                           seed=self.seed, max_nodes=self.max_nodes, group_by=self.group_by, memory=self.memory,
                           execution_order=self.execution_order)

    def profile_options(self) -> ProfileOptions:
        """The costs stage's options."""
        return ProfileOptions(repeats=self.profile_repeats, grappler=self.profile_grappler, cache=self.profile_cache,
                              hardware=self.hardware, seed=self.seed, runtime=self.profile_runtime)


#: The stages of :func:`autoplace`, in order; :func:`profile` runs :data:`PROFILE_STAGES`.
STAGES = ("devices", "trace", "costs", "hosts", "graph", "problem", "solve", "microbatches", "calls", "codecs", "emit", "report")
PROFILE_STAGES = STAGES[:3]


@dataclass
class StageTimer:
    """Runs pipeline stages: one timer, one log line each, the stage's name on its errors.

    ``progress(stage, seconds)`` (optional) hears each stage start (``None``) and end.
    """

    seconds: dict[str, float] = field(default_factory=dict)
    progress: Callable[[str, float | None], None] | None = None

    def run(self, name: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` as stage ``name``.

        Raises
        ------
        AutoplaceError
            Whatever the stage raised, its message starting with the stage's name;
            other exceptions get a note naming the stage.
        """
        if self.progress is not None:
            self.progress(name, None)
        t = time.perf_counter()
        try:
            out = fn(*args, **kwargs)
        except AutoplaceError as e:
            raise e.in_stage(name)
        except Exception as e:
            if hasattr(e, "add_note"):  # Python 3.11+
                e.add_note(f"raised in autoplace's {name!r} stage")
            raise
        self.seconds[name] = time.perf_counter() - t
        log.info("%s: %.2f s", name, self.seconds[name])
        if self.progress is not None:
            self.progress(name, self.seconds[name])
        return out


def _replica_groups(devices: Any, opts: PlacementOptions) -> list[tuple[str, ...]]:
    """The device groups of ``opts.replicas`` (one group: all devices)."""
    if opts.replicas == 1:
        return [devices.names]
    if not opts.training:
        raise TrainingError(f"replicas={opts.replicas} applies to training; pass training=True (inference "
                            "places one copy of the model)")
    if len(devices) % opts.replicas:
        raise TrainingError(f"replicas={opts.replicas} does not divide the {len(devices)} devices; give a multiple "
                            f"of {opts.replicas} devices (the replicas split them into equal groups, in order)")
    size = len(devices) // opts.replicas
    return [devices.names[r * size:(r + 1) * size] for r in range(opts.replicas)]


def compression_policy(compression: str, error_budget: float, devices: Any) -> CompressionPolicy:
    """The codec choice of one placement; ``auto`` measures each codec's cost on each device here."""
    if compression != "auto":
        return CompressionPolicy(compression, error_budget)
    from .codecs import measure_codec_costs

    names = devices.names
    links = {(names[i], names[j]): (link.bandwidth_bytes_per_s, link.latency_s)
             for (i, j), link in devices.links.items()}
    return CompressionPolicy(compression, error_budget, links, measure_codec_costs(names))


def _as_plan(plan: Plan | str | os.PathLike | None) -> Plan | None:
    if plan is None or isinstance(plan, Plan):
        return plan
    if isinstance(plan, (str, os.PathLike)):
        return Plan.load(plan)
    raise PlanError(f"plan must be a Plan or the path of a saved plan, got {type(plan).__name__}")


def _solve(built: Any, options: PlanOptions, given: Plan | None, batch_size: int, compression: str) -> Plan:
    """The solve stage: search, or re-apply ``given`` (on the devices it was made for)."""
    if given is not None and tuple(given.devices) != built.devices.names:
        raise PlanError(f"the plan was made for devices {list(given.devices)}, not {list(built.devices.names)}; "
                        "pass the devices it was made for, or solve again")
    plan = plan_problem(built, options, given=None if given is None else given.assignment,
                        given_order=None if given is None else given.op_order)
    return replace(plan, batch_size=batch_size, compression=compression)


def _microbatches(model: Any, built: Any, plan: Plan, devset: Any, opts: PlacementOptions,
                  microbatches: int | str, fallback: bool, order: str = "auto") -> tuple[Plan, Any]:
    """The microbatches stage: how many micro-batches the plan runs as, and its pipelined predicted step.

    Op times on a micro-batch are not the batch's divided by ``m``: the ops are profiled again at the
    smallest micro-batch tried (:class:`placer.core.microbatch.SmallBatchCosts`). With ``fallback``, one
    device at its best count replaces the plan where it is predicted faster
    (:func:`placer.planner.pipeline_plan`). Returns the plan and those costs (``None`` without micro-batches).
    """
    batch = int(plan.batch_size or 1)
    if microbatches == 1:
        return pipeline_plan(built, plan, opts.plan_options(), batch, [1], fallback=fallback,
                             split_margin=opts.split_margin), None
    from ..core.microbatch import SmallBatchCosts, candidate_microbatches

    if microbatches != "auto" and batch % int(microbatches):
        rows = (f"each replica's {batch} rows (batch size {batch * opts.replicas} over replicas={opts.replicas})"
                if opts.replicas > 1 else f"the batch size {batch}")
        raise InputSignatureError(f"microbatches={microbatches} does not divide {rows}; pick a divisor of {batch} "
                                  "or microbatches='auto'")
    candidates = candidate_microbatches(batch) if microbatches == "auto" else [int(microbatches)]
    if opts.training:  # the micro-batches must give the full-batch step
        allowed = []
        for m in candidates:
            try:
                check_replicable(model, m, batch, what="microbatches")
                allowed.append(m)
            except TrainingError:
                if microbatches != "auto":
                    raise
        candidates = allowed
    small = None
    smallest = batch // max(candidates)
    if smallest < batch:
        if opts.training:
            traced = trace_training(model, batch_size=smallest, input_signature=opts.input_signature,
                                    targets=opts.targets, optimizer=opts.optimizer, loss=opts.loss,
                                    metrics=opts.metrics, loss_weights=opts.loss_weights)[1]
        else:
            traced = trace_model(model, batch_size=smallest, input_signature=opts.input_signature)
        costs = compute_costs(traced, sorted({d.kind for d in devset.devices}), opts.profile_options(),
                              devset.names)
        other = build_problem(build_op_graph(traced, costs.us).graph, devset, group_by=opts.group_by)
        row = {name: i for i, name in enumerate(other.nodes)}
        durations = built.schedule.durations_s * (smallest / batch)  # ops this trace lacks: scaled
        for i, name in enumerate(built.nodes):
            if name in row:
                durations[i] = other.schedule.durations_s[row[name]]
        small = SmallBatchCosts(smallest, durations)
    out = pipeline_plan(built, plan, opts.plan_options(), batch, candidates, small=small, fallback=fallback,
                        split_margin=opts.split_margin, order=order)
    log.info("%d micro-batches per batch%s: predicted step %.3f ms (%.3f ms without; ops profiled again at "
             "batch %d)", out.microbatches, " (1F1B)" if out.pipeline == "1f1b" else "",
             1e3 * out.predicted_step_time_s, 1e3 * plan.predicted_step_time_s, smallest)
    return out, small


def _first_stages(model: Any, devices: Sequence[Any], opts: PlacementOptions, stages: StageTimer) -> tuple[Any, ...]:
    """The stages :data:`PROFILE_STAGES` (devices, trace, costs) that :func:`autoplace` and :func:`profile`
    share: ``(devices planned on, placed-model shell, traced model, input specs, costs)``."""
    available = [d.name for d in tf.config.list_logical_devices()]
    all_devices = stages.run("devices", resolve_devices, devices, available=available)
    groups = _replica_groups(all_devices, opts)
    devset = all_devices if len(groups) == 1 else resolve_devices(list(devices)[:len(groups[0])], available)
    if opts.training:
        shell, traced, input_specs = stages.run(
            "trace", trace_training, model, batch_size=opts.batch_size, input_signature=opts.input_signature,
            targets=opts.targets, optimizer=opts.optimizer, loss=opts.loss, metrics=opts.metrics,
            loss_weights=opts.loss_weights, replicas=opts.replicas)
        if len(groups) > 1:
            shell.set_replicas(groups)
    else:
        traced = stages.run("trace", trace_model, model, batch_size=opts.batch_size,
                            input_signature=opts.input_signature)
        shell, input_specs = PlacedModel(model), traced.input_specs
    costs = stages.run("costs", compute_costs, traced, sorted({d.kind for d in devset.devices}),
                       opts.profile_options(), devset.names)
    return devset, shell, traced, input_specs, costs


def _hosts(model: Any, traced: Any, devset: Any, opts: PlacementOptions, costs: Any = None) -> Any:
    """The hosts stage: the links between processes, calibrated (``PlacementOptions.calibrate_links``), and the
    processors ``devset``'s devices share (``PlacementOptions.shared_capacity``), and their executors' ready
    order (``PlacementOptions.ready_order``)."""
    order = opts.ready_order
    if order == "detect":
        from ..measure.hosts import executor_ready_order

        order, why = executor_ready_order(devset)
        log.info("executors' ready order: %s (%s)", order, why)
    devset = replace(devset, ready_order=order)
    if opts.calibrate_links and len({d.host for d in devset.devices}) > 1:
        from ..measure.links import calibrate_links

        devset = calibrate_links(devset, cross_process_only=True, transfer_cpu=True)[0]
    if opts.shared_capacity is None:
        return devset
    from ..measure.hosts import shared_processors, sharing_groups

    groups = sharing_groups(devset)
    if not groups:
        return devset

    given = None if opts.shared_capacity == "measure" else float(opts.shared_capacity)
    forward = traced
    if given is None and traced.step != "predict":  # a training step's copies would update the variables
        forward = trace_model(model, batch_size=traced.batch_size, input_signature=opts.input_signature)
    work_s = None
    if costs is not None and forward is traced and "CPU" in costs.us:
        work_s = sum(costs.us["CPU"].values()) * 1e-6
    out = shared_processors(forward, devset, groups, given=given, seed=opts.seed, work_s=work_s)
    for sp in out.shared:
        log.info("devices %s share one %s: capacity %.2f (%s)", [devset.names[i] for i in sp.devices],
                 "processor" if sp.pooled else "machine", sp.capacity, sp.source)
    return out


def _emit(shell: PlacedModel, traced: Any, plan: Plan, op_graph: Any, devset: Any, built: Any,
          input_specs: Sequence[Any], policy: CompressionPolicy, opts: PlacementOptions) -> tuple[Any, Plan, Any]:
    """The emit stage: the placed functions (:meth:`PlacedModel.place`), then the step as emitted simulated
    once (its acknowledged transfers, :mod:`placer.tf.sends`, where it is neither pipelined nor replicated);
    the plan's predicted step changes by what they change. Returns the emitted step, the plan and that
    simulation (the report's)."""
    prompt = opts.sends == "prompt" or (opts.sends == "auto" and devset.ready_order == "lifo")
    emitted = shell.place(traced, plan, op_graph, devset, input_specs, policy, worker_timeout_s=opts.worker_timeout_s,
                          prompt_sends=prompt)
    acks = acknowledged_nodes(built, emitted.sends) if plan.microbatches == 1 and opts.replicas == 1 else ()
    a = built.group_assignment(plan.assignment)
    order = built.order_of(plan.op_order, a) if plan.microbatches == 1 else ()
    sim = built.simulate(a, SimOptions(acknowledged=acks), order=order)
    if acks:  # their round trips, and the sends that no longer wait
        change = sim.step_time_s - built.simulate(a, order=order).step_time_s
        log.info("predicted step with %d acknowledged transfers: %+.3f ms", len(acks), change * 1e3)
        plan = replace(plan, predicted_step_time_s=plan.predicted_step_time_s + change)
        shell.set_predicted_step(plan.predicted_step_time_s)
    return emitted, plan, sim


def _call_overhead(traced: Any, plan: Plan) -> Plan:
    """The calls stage: the plan's fixed cost per call, measured (a stand-in with the placement's inputs,
    outputs, captured variables and devices and no compute: :func:`placer.measure.links.measure_call`),
    added to its predicted step."""
    from ..measure.links import plan_call_seconds

    call_s = plan_call_seconds(traced, plan.assignment)
    log.info("fixed cost of one call of the plan: %.3f ms (measured)", call_s * 1e3)
    return replace(plan, call_overhead_s=call_s, predicted_step_time_s=plan.predicted_step_time_s + call_s)


@dataclass(frozen=True)
class ModelProfile:
    """What :func:`profile` measured: the op times of one model's trace on each device kind.

    Attributes
    ----------
    costs : ComputeCosts
        µs per op per device kind, and each kind's source (measured, cached or analytic).
    op_types : Mapping[str, str]
        Op name → TensorFlow op type.
    step : str
        The traced step (``predict`` or ``train``).
    batch_size : int
        The batch size the ops were timed at.
    stage_seconds : Mapping[str, float]
        Wall seconds of the devices, trace and costs stages.
    """

    costs: Any
    op_types: Mapping[str, str]
    step: str
    batch_size: int
    stage_seconds: Mapping[str, float]


def profile(model: Any, devices: Sequence[Any], **options: Any) -> ModelProfile:
    """Trace ``model`` and time its ops on each kind of ``devices`` (filling the profile cache), without placing.

    Runs the first stages of :func:`autoplace` with the same options (``batch_size``, ``training``,
    ``profile_repeats``, ``profile_cache``, ...); a later ``autoplace`` with the same options reads
    these times from the cache.

    Examples
    --------
    >>> import keras, placer
    >>> from placer.tf.pipeline import profile
    >>> m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    >>> prof = profile(m, ["/CPU:0"], batch_size=2, profile_cache=False)
    >>> prof.costs.source["CPU"], prof.step, prof.batch_size
    ('measured', 'predict', 2)
    """
    opts = options_from(options, PlacementOptions)
    stages = StageTimer(progress=opts.progress)
    _, _, traced, _, costs = _first_stages(model, devices, opts, stages)
    types = {op.name: op.type for op in traced.fixed.graph.get_operations()}
    return ModelProfile(costs, types, traced.step, int(traced.batch_size), dict(stages.seconds))


def autoplace(model: Any, devices: Sequence[Any], *, plan: Plan | str | os.PathLike | None = None,
              **options: Any) -> PlacedModel:
    """Place a Keras model's ops on ``devices`` and return a placed model.

    Parameters
    ----------
    model : keras.Model
        A built Keras 3 model (TensorFlow backend). It is never modified.
    devices : sequence
        Device strings (``"/CPU:1"``, ``"/GPU:0"``,
        ``"/job:worker/replica:0/task:1/device:CPU:0"``),
        ``tf.config.LogicalDevice`` objects or :class:`placer.DeviceSpec`.
    plan : Plan or path, optional
        A plan saved from an earlier placement of the same model
        (``placed.plan.save(path)``): it is re-applied without solving (and
        re-scored with this run's costs). It runs as the micro-batches it was
        made with unless ``microbatches=`` is given; ``group_by=`` or
        ``objective=`` other than the plan's raise :class:`PlanError`.
    **options
        Fields of :class:`PlacementOptions`.

    Returns
    -------
    PlacedModel

    Raises
    ------
    ModelError, InputSignatureError, DeviceError, InsufficientMemoryError,
    NoFeasiblePlanError, PlanError, AutoplaceError
        Each with a message that starts with the stage that raised it and says what to change.

    Examples
    --------
    >>> import keras, numpy as np, placer
    >>> m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    >>> placed = placer.autoplace(m, ["/CPU:0"], batch_size=2, time_limit_s=1)
    >>> x = np.ones((2, 4), "float32")
    >>> bool(np.array_equal(placed(x).numpy(), m(x).numpy()))
    True
    >>> again = placer.autoplace(m, ["/CPU:0"], batch_size=2, plan=placed.plan)
    >>> again.plan.assignment == placed.plan.assignment, again.plan.solver
    (True, 'given')
    """
    opts = options_from(options, PlacementOptions)
    given = _as_plan(plan)
    if given is not None:  # a re-applied plan is grouped and scored as it was made
        for name in ("group_by", "objective"):
            if name in options and options[name] != getattr(given, name):
                raise PlanError(f"the plan was made with {name}={getattr(given, name)!r}, not "
                                f"{options[name]!r}; drop {name}= to re-apply it, or solve again without plan=")
        opts = replace(opts, group_by=given.group_by, objective=given.objective)
    stages = StageTimer(progress=opts.progress)
    devset, shell, traced, input_specs, costs = _first_stages(model, devices, opts, stages)
    devset = stages.run("hosts", _hosts, model, traced, devset, opts, costs)
    op_graph = stages.run("graph", build_op_graph, traced, costs.us)
    built = stages.run("problem", build_problem, op_graph.graph, devset, group_by=opts.group_by)
    placed_plan = stages.run("solve", _solve, built, opts.plan_options(), given, traced.batch_size, opts.compression)
    placed_plan, small = stages.run("microbatches", _microbatches, model, built, placed_plan, devset, opts,
                                    opts.microbatches if given is None or "microbatches" in options
                                    else given.microbatches,
                                    given is None and opts.algorithm == DEFAULT_SOLVER,
                                    opts.pipeline if given is None or "pipeline" in options else given.pipeline)
    if opts.measure_call:
        placed_plan = stages.run("calls", _call_overhead, traced, placed_plan)
    if opts.training and placed_plan.microbatches > 1:
        shell.set_microbatches(placed_plan.microbatches, devset.names)
    policy = stages.run("codecs", compression_policy, opts.compression, opts.compression_error, devset)
    emitted, placed_plan, sim = stages.run("emit", _emit, shell, traced, placed_plan, op_graph, devset, built,
                                           input_specs, policy, opts)

    def report() -> Any:
        a = built.group_assignment(placed_plan.assignment)
        piped = None
        if placed_plan.microbatches > 1:
            from ..core.microbatch import simulate_pipeline

            piped = simulate_pipeline(built, a, placed_plan.microbatches, small=small,
                                      batch_size=placed_plan.batch_size, order=placed_plan.pipeline)
        return build_report(placed_plan, op_graph, built, sim, costs, opts.profile_grappler, emitted,
                            dict(stages.seconds), model.name, pipeline_sim=piped)

    shell.set_report(stages.run("report", report))
    log.info("autoplace %s: %s", model.name, " ".join(f"{k}={v:.2f}s" for k, v in stages.seconds.items()))
    return shell
