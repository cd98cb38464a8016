"""The options of :func:`placer.autoplace`, grouped by the stage that reads them.

Each group is a frozen keyword-only dataclass that validates itself and
holds its one default:

=====================  ======================================  ==========================================
group (attribute)      class                                   stages
=====================  ======================================  ==========================================
``trace``              :class:`TraceOptions`                   trace
``train``              :class:`TrainingOptions`                trace (training), microbatches, emit
``costs``              :class:`~placer.tf.costs.ProfileOptions` costs
``hosts``              :class:`HostOptions`                    hosts, calls
``solve``              :class:`~placer.planner.PlanOptions`    problem, solve (a model's defaults:
                                                               :data:`MODEL_PLAN_OPTIONS`)
``split``              :class:`SplitOptions`                   graph, splits
``microbatch``         :class:`MicrobatchOptions`              microbatches
``emit``               :class:`EmitOptions`                    codecs, emit, the placed model's calls
=====================  ======================================  ==========================================

:class:`PlacementOptions` holds one of each. ``autoplace(model, devices,
**options)`` takes the *flat* options (``batch_size=``, ``objective=``,
``profile_repeats=``, …): each flat name is a field of one or more groups
(``seed`` of three), under the same name except the profiling options
(:data:`FLAT_NAMES`); ``PlacementOptions(**options)`` routes them, and
``options.batch_size`` reads one back.

Examples
--------
>>> opts = PlacementOptions(batch_size=8, objective="throughput", profile_repeats=3, seed=2)
>>> opts.trace.batch_size, opts.solve.objective, opts.costs.repeats, opts.hosts.seed, opts.seed
(8, 'throughput', 3, 2, 2)
>>> opts.solve.group_by, opts.solve.memory   # a model's defaults, not placer.solve's
('layer', 'peak')
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from cost_models.simulate import checked_ready_order

from ..core.build import MODEL_GROUP_BY
from ..core.compression import DEFAULT_ERROR_BUDGET, CompressionPolicy
from ..core.microbatch import checked_pipeline
from ..core.order import MODEL_EXECUTION_ORDER
from ..core.splits import SPLITS
from ..core.validate import MAX_BATCH_SIZE, MAX_TIME_LIMIT_S, boolean, integer, real
from ..errors import AutoplaceError, InputSignatureError, TrainingError
from ..planner import MODEL_MEMORY, SPLIT_MARGIN, PlanOptions
from .costs import ProfileOptions
from .remote import DEFAULT_WORKER_TIMEOUT_S
from .rewrites.sends import SENDS


@dataclass(frozen=True, kw_only=True)
class TraceOptions:
    """How the model is traced (keyword-only).

    Attributes
    ----------
    batch_size : int or None
        Planning batch size; required when the model's batch is unknown (or given by ``sample``).
    input_signature : sequence, mapping or None
        ``tf.TensorSpec``s or shape tuples overriding the model's inputs: a list in the model's input order,
        or a dict by input name for a model that takes a dict.
    sample : array, list, dict or tuple, optional
        One batch the model will see: the inputs' shapes (a sequence length the model leaves open, say) and
        the batch size come from it where ``input_signature`` and ``batch_size`` are not given. For training,
        ``(x, y)``: the labels' structure, shapes and dtypes too (``targets``). Read for its shapes only.
    """

    batch_size: int | None = None
    input_signature: Sequence[Any] | Mapping[str, Any] | None = None
    sample: Any = None

    def __post_init__(self) -> None:
        if self.batch_size is not None:
            object.__setattr__(self, "batch_size", integer("batch_size", self.batch_size, minimum=1,
                                                           maximum=MAX_BATCH_SIZE, error=InputSignatureError))


@dataclass(frozen=True, kw_only=True)
class TrainingOptions:
    """Whether and how the training step is placed (keyword-only).

    Attributes
    ----------
    training : bool
        Plan and place the whole training step (Keras' ``train_step``:
        forward, loss, gradients, optimizer update) so that ``fit`` and
        ``evaluate`` run placed; ``False`` (default) places inference only.
    optimizer, loss, metrics, loss_weights
        Compile settings for training (as ``keras.Model.compile`` takes them);
        ``None``: the compiled model's own (fresh objects, same configuration).
    targets : tf.TensorSpec, shape tuple or list of them, optional
        The labels' shapes and dtypes for planning (default: those of the
        model's outputs; labels of another shape, e.g. sparse class ids, are
        traced when ``fit`` first sees them, on the same plan).
    replicas : int or "auto"
        Data parallelism: copies of the model on groups of the devices, each on its part of the batch.
        For inference, ``"auto"`` (default) runs a whole copy on every device where that is predicted
        faster than the placed plan (:func:`placer.planner.replica_plan`) and ``R`` (the number of devices)
        always does. For training, an integer ``R`` is hybrid data + model parallelism: the devices are
        split into ``R`` equal groups, in order; the plan is made for the first group at
        ``batch_size / R`` and run by every group on its part of each batch; gradients are summed where
        each variable lives and one update is applied (the full-batch step; models with batch
        normalization are refused, random ops draw per replica); ``"auto"`` for training predicts one copy per
        device (one micro-batch each) beside the placed plan and, where it is faster, plans with that ``R``.
        ``R`` equal to the number of devices is predicted as ``"auto"`` predicts the copies (the full batch
        traced first, the gradients' traffic included); groups of several devices are predicted as one
        group's step (their gradients' traffic between groups is not counted).
    split_batch_norm : bool
        Let a model with batch normalization train as micro-batches or replicas, with GPipe's semantics: each
        part (micro-batch or replica) normalises by its own rows' statistics, and updates the moving mean and
        variance once, in part order, so that the moving statistics see every part of the batch. This changes
        the math of the step (``model.fit`` normalises by the whole batch's statistics and updates them once):
        the losses follow another curve (``docs/training.md``). It applies to explicit ``microbatches=m`` and
        ``replicas=R``; ``"auto"`` still keeps such a model whole (the search's prediction of its parts is not
        validated: ResNet50's copies were predicted 40% short of their measured step). ``False`` (default): such
        a model is refused (``TrainingError``) for explicit ``microbatches``/``replicas``.
    """

    training: bool = False
    optimizer: Any = None
    loss: Any = None
    metrics: Any = None
    loss_weights: Any = None
    targets: Any = None
    replicas: int | str = "auto"
    split_batch_norm: bool = False

    def __post_init__(self) -> None:
        boolean("split_batch_norm", self.split_batch_norm)
        if self.replicas != "auto":
            object.__setattr__(self, "replicas", integer("replicas (an integer or 'auto')", self.replicas,
                                                         minimum=1, error=TrainingError))
        boolean("training", self.training)

    @property
    def training_replicas(self) -> int:
        """The data-parallel groups a training step is traced in (``"auto"``: 1, until its search chose more)."""
        return 1 if self.replicas == "auto" else int(self.replicas)


@dataclass(frozen=True, kw_only=True)
class HostOptions:
    """What is measured about the hosts before planning (keyword-only).

    Attributes
    ----------
    shared_capacity : "measure", float or None
        Logical CPU devices of one process share its cores, and worker
        processes on one machine share it (caches, memory bandwidth, the
        client). ``"measure"`` (default): measure how much of the model's
        work they do at once (:mod:`placer.tf.timing`; a second or so
        for small models, ~10 s for ResNet50 on workers) and let the
        simulator and the objectives charge it; a number: that capacity
        (1 … devices in the group) for every group; ``None``: treat them as
        independent processors (what the plan then promises is not what
        runs).
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
    calibrate_links : bool
        Measure the links between devices of different processes (gRPC
        workers) before planning (:func:`placer.measure.links.calibrate_links`:
        a ping-pong chain per pair and payload size, a few seconds); the
        report marks them ``calibrated``. Links inside one process keep the
        assumed defaults. Default True.
    measure_call : bool
        Measure the plan's fixed cost per call (dispatch, feeding the inputs,
        fetching the outputs, one round of RPCs per worker:
        :func:`placer.tf.timing.plan_call_seconds`, well under a second) and
        add it to the predicted step (``plan.call_overhead_s``). Default True.
    seed : int
        Seed of the random batch the shared capacity is measured with.
    """

    shared_capacity: str | float | None = "measure"
    ready_order: str | None = "detect"
    calibrate_links: bool = True
    measure_call: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        boolean("calibrate_links", self.calibrate_links)
        boolean("measure_call", self.measure_call)
        if self.shared_capacity is not None and self.shared_capacity != "measure":
            if isinstance(self.shared_capacity, (str, bool)):
                raise AutoplaceError(f"shared_capacity must be 'measure', a number >= 1 or None, "
                                     f"got {self.shared_capacity!r}")
            object.__setattr__(self, "shared_capacity", real("shared_capacity", self.shared_capacity, strict=True,
                                                              maximum=1e6))
            if self.shared_capacity < 1:
                raise AutoplaceError(f"shared_capacity is at least 1 (one device's work at a time), "
                                     f"got {self.shared_capacity}")
        checked_ready_order(self.ready_order, AutoplaceError,
                            also={"detect": "the default: lifo where every process runs one inter-op thread"})


@dataclass(frozen=True, kw_only=True)
class SplitOptions:
    """Which ops are split over several devices, their weights sharded (keyword-only;
    :mod:`placer.core.splits`).

    Attributes
    ----------
    splits : {"auto", "none", "all"}
        ``"auto"`` (default): on several devices (not one process's logical CPUs: they share its threads),
        the dense products (and convolutions) whose weight holds at least ``split_min_bytes`` and whose split
        could save time are candidates; the largest one, the largest half and all of them are split by output
        columns into one part per device (forward passes and training steps: a ``Dense`` kernel's gradients
        and update split with it) and each graph placed again; from the best of those plans, layers are
        toggled one at a time (``split_toggles``); the best plan is kept where its simulated step is predicted
        at least ``split_margin`` (the solve group's) shorter than the plan of whole ops. In any step, a
        weight larger than every device is split before the solve: a dense product's by output columns, a
        lookup's (an ``Embedding``) table by rows with its updates. ``"all"``: every candidate (products and
        lookups) split and kept regardless (to measure it). ``"none"``: every op whole (a weight no device
        holds is an ``InsufficientMemoryError``). What is not split: ``docs/limitations.md``.
    split_min_bytes : int
        The least bytes of a weight whose product is split for speed.
    split_pairs : bool
        Whether a split product pairs with the product after it where it can (Megatron-LM's column then row
        split, one sum instead of two joins: :class:`placer.core.splits.Pair`); ``False``: each by columns.
    split_toggles : int
        ``splits="auto"``: the most plans the search scores after its largest-first subsets, each the best
        plan so far with one layer split (its parts side by side) or run whole again (where its join ran),
        moving to the fastest while one is faster (:func:`placer.core.splits.descend_splits`); ``0``: the
        largest-first subsets alone.
    """

    splits: str = "auto"
    split_min_bytes: int = 1 << 20
    split_pairs: bool = True
    split_toggles: int = 24

    def __post_init__(self) -> None:
        if self.splits not in SPLITS:
            raise AutoplaceError(f"splits must be one of {', '.join(map(repr, SPLITS))}, got {self.splits!r}")
        object.__setattr__(self, "split_min_bytes", integer("split_min_bytes", self.split_min_bytes, minimum=0,
                                                           maximum=1 << 50))
        object.__setattr__(self, "split_pairs", boolean("split_pairs", self.split_pairs))
        object.__setattr__(self, "split_toggles", integer("split_toggles", self.split_toggles, minimum=0,
                                                         maximum=1 << 20))


@dataclass(frozen=True, kw_only=True)
class MicrobatchOptions:
    """How a plan is pipelined in micro-batches (keyword-only; when a spread plan is kept over one device is
    ``PlanOptions.split_margin``).

    Attributes
    ----------
    microbatches : int or "auto"
        Run each batch as a pipeline of this many micro-batches
        (:mod:`placer.tf.rewrites.copies`: GPipe's schedule, each device's
        micro-batches in order), which is how a plan that cuts a chain of
        layers into pipeline stages speeds up a batch (pair it with
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
        micro-batches as pipeline stages remain, one backward and one forward in
        turn, so a device holds the activations of at most that many
        micro-batches (GPipe's first stage holds all of them). ``"auto"``
        (default): 1F1B where the simulated peak memory is lower and the
        simulated step at most 2% longer
        (:func:`placer.core.microbatch.pipeline_order`), else GPipe. 1F1B
        needs devices that hold contiguous pipeline stages (else its gates would
        wait in a cycle: ``"1f1b"`` is then a ``PlanError``, ``"auto"``
        keeps GPipe). The same full-batch update in every order.
    """

    microbatches: int | str = 1
    pipeline: str = "auto"

    def __post_init__(self) -> None:
        checked_pipeline(self.pipeline, AutoplaceError)
        if self.microbatches != "auto":
            if isinstance(self.microbatches, (str, bool)):
                raise AutoplaceError(f"microbatches must be a positive integer or 'auto', got {self.microbatches!r}")
            object.__setattr__(self, "microbatches", integer("microbatches", self.microbatches, minimum=1,
                                                              maximum=MAX_BATCH_SIZE, error=InputSignatureError))


@dataclass(frozen=True, kw_only=True)
class EmitOptions:
    """How the placed functions are emitted and called (keyword-only).

    Attributes
    ----------
    compression : str
        Codec of cut float edges (:data:`placer.core.compression.CODECS`):
        ``"none"`` (default, bit-exact), ``"bf16"``, ``"fp16"`` or ``"int8"``
        (forward activations only) on every eligible cut edge, or ``"auto"``:
        per edge, the codec that sends it fastest on its link (measured codec
        cost on both devices) within ``compression_error``, else none.
    compression_error : float
        ``auto``'s error budget: the largest per-tensor relative error
        (``max|decoded - x| / max|x|``) a codec may introduce.
    gradient_compression : str
        Codec of the parameter traffic of a training step, which
        ``compression`` never touches: a weight sent to a copy of the model on
        another device, and a weight's gradient sent to where the copies'
        gradients are summed or the weight is updated. ``"none"`` (default:
        the gradient sums are exact), ``"bf16"`` (every such float edge; half
        the bytes, 8 bits of mantissa: the loss curve follows ``model.fit``'s
        within about 1%), or ``"auto"`` (bf16 where it sends the edge faster on its link,
        by the codec's measured cost). fp16 and int8 are refused here (forward only: fp16
        underflowed on gradients).
    sends : {"auto", "prompt", "executor"}
        When a tensor another process waits for leaves its producer's
        process. TensorFlow's executor queues a ``_Send`` behind the ops it
        runs inline, and a worker with one inter-op thread reaches its queue
        only when it runs out of other work: a two-stage split then overlaps
        nothing (:mod:`placer.tf.rewrites.sends`). ``"prompt"``: each transfer that
        unblocks at least a millisecond of work on its receiver is
        acknowledged, and the sender's competing ops wait for that (one
        round trip); ``"executor"``: as TensorFlow orders them; ``"auto"``
        (default): ``"prompt"`` where the ready order is ``"lifo"`` (every
        process runs one inter-op thread), else ``"executor"``.
    worker_timeout_s : float
        Placed calls on remote (gRPC) workers: how long a worker may leave a
        health probe unanswered before the call ends with a ``WorkerError``
        (TensorFlow alone would wait forever on a frozen worker; see
        :mod:`placer.tf.remote`).
    """

    compression: str = "none"
    compression_error: float = DEFAULT_ERROR_BUDGET
    gradient_compression: str = "none"
    sends: str = "auto"
    worker_timeout_s: float = DEFAULT_WORKER_TIMEOUT_S

    def __post_init__(self) -> None:
        object.__setattr__(self, "worker_timeout_s", real("worker_timeout_s", self.worker_timeout_s, strict=True,
                                                          maximum=MAX_TIME_LIMIT_S))
        try:
            CompressionPolicy(self.compression, self.compression_error, gradients=self.gradient_compression)
        except ValueError as e:
            raise AutoplaceError(str(e)) from None
        if self.sends not in SENDS:
            raise AutoplaceError(f"sends must be one of {', '.join(map(repr, SENDS))} (prompt: acknowledged "
                                 f"transfers; executor: TensorFlow's order), got {self.sends!r}")


#: The plan options of a model (:func:`placer.autoplace`): a Keras layer stays on one device, memory is the
#: simulated step's peak, TensorFlow's executor orders each device's ops, and a spread plan is kept over one
#: device only where predicted 10% faster (``placer.solve`` defaults otherwise; a graph file saved by
#: ``placed.save_graph`` carries these, so ``placer.solve`` re-plans it as ``autoplace`` did).
MODEL_PLAN_OPTIONS = PlanOptions(group_by=MODEL_GROUP_BY, memory=MODEL_MEMORY, execution_order=MODEL_EXECUTION_ORDER,
                                 split_margin=SPLIT_MARGIN)

#: The groups of :class:`PlacementOptions`, in stage order: attribute → its default.
GROUPS: Mapping[str, Any] = {
    "trace": TraceOptions(), "train": TrainingOptions(), "costs": ProfileOptions(), "hosts": HostOptions(),
    "solve": MODEL_PLAN_OPTIONS, "split": SplitOptions(), "microbatch": MicrobatchOptions(), "emit": EmitOptions(),
}
#: ``(group, field)`` → its flat option name where the two differ (``autoplace(profile_repeats=3)``).
FLAT_NAMES: Mapping[tuple[str, str], str] = {
    ("costs", "repeats"): "profile_repeats", ("costs", "grappler"): "profile_grappler",
    ("costs", "cache"): "profile_cache", ("costs", "runtime"): "profile_runtime",
}
#: Group fields that are not options of :func:`placer.autoplace` (it scores no baselines of its own choice).
NOT_FLAT = frozenset({("solve", "baselines")})


def _routes() -> dict[str, list[tuple[str, str]]]:
    """Flat option name → the ``(group, field)`` pairs it sets."""
    routes: dict[str, list[tuple[str, str]]] = {}
    for group, default in GROUPS.items():
        for f in dataclasses.fields(default):
            if (group, f.name) not in NOT_FLAT:
                routes.setdefault(FLAT_NAMES.get((group, f.name), f.name), []).append((group, f.name))
    return routes


ROUTES = _routes()


@dataclass(frozen=True, init=False)
class PlacementOptions:
    """Every option of :func:`placer.autoplace`, one group per stage (see the module docstring).

    ``PlacementOptions(**options)`` takes the flat options (each routed to
    its groups) or whole groups (``solve=PlanOptions(...)``); a flat name
    reads back as an attribute (``options.batch_size``). ``progress`` is
    ``progress(stage, seconds)``, called as each stage of
    :data:`placer.tf.runner.STAGES` starts (``seconds`` ``None``) and ends
    (its wall seconds); the CLI draws its progress bar with it. ``None``
    (default): the library only logs.

    Raises
    ------
    AutoplaceError
        An unknown option (the valid ones listed), or a value a group refuses (the group's typed error).
    """

    trace: TraceOptions
    train: TrainingOptions
    costs: ProfileOptions
    hosts: HostOptions
    solve: PlanOptions
    split: SplitOptions
    microbatch: MicrobatchOptions
    emit: EmitOptions
    progress: Callable[[str, float | None], None] | None

    def __init__(self, *, progress: Callable[[str, float | None], None] | None = None, **options: Any) -> None:
        if progress is not None and not callable(progress):
            raise AutoplaceError(f"progress must be a callable progress(stage, seconds), got {progress!r}")
        unknown = sorted(set(options) - set(ROUTES) - set(GROUPS))
        if unknown:
            raise AutoplaceError(f"unknown option(s) {unknown}; valid options: {[*ROUTES, 'progress']}")
        changes: dict[str, dict[str, Any]] = {group: {} for group in GROUPS}
        for name, value in options.items():
            for group, name_in_group in ROUTES.get(name, ()):
                changes[group][name_in_group] = value
        for group, default in GROUPS.items():
            given = options.get(group, default)
            if not isinstance(given, type(default)):
                raise AutoplaceError(f"{group}= must be a {type(default).__name__}, got {type(given).__name__}")
            object.__setattr__(self, group, dataclasses.replace(given, **changes[group]) if changes[group] else given)
        object.__setattr__(self, "progress", progress)

    def __getattr__(self, name: str) -> Any:
        routes = ROUTES.get(name)
        if not routes:
            raise AttributeError(f"{type(self).__name__!r} has no option {name!r}")
        group, name_in_group = routes[0]
        return getattr(getattr(self, group), name_in_group)

    def replace(self, **options: Any) -> "PlacementOptions":
        """These options with some changed (flat names or whole groups)."""
        return PlacementOptions(progress=options.pop("progress", self.progress),
                                **{group: getattr(self, group) for group in GROUPS}, **options)
