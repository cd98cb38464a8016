"""A placement: the model's variables on their planned devices, and the functions emitted from its plan.

The emit stage of :func:`placer.autoplace` builds it, then hands the placed
model one frozen :class:`Placement` record (plan, devices, report, the
placed variables, the functions); nothing is set on the placed model after.

* :func:`place_variables` gives every variable a traced step may capture a
  home on its planned device: each of the user's variables gets a **copy**
  (a ``keras.Variable`` created under ``tf.device``; the user's model is
  never written); the shell's own optimizer and metric variables (slots,
  iteration count, learning rate, metric totals) are **moved**: the
  ``tf.Variable`` behind each ``keras.Variable`` is re-created on its device
  with the same value, so ``placed.optimizer.learning_rate = …`` (a
  learning-rate callback) and ``reset_metrics`` act on what the placed step
  reads.
* :class:`PlacedFunctions` emits the placed functions, one per step and
  batch structure (as ``tf.function`` retraces), all from the one plan: ops
  the plan names get its device, the others their layer's
  (:func:`placer.tf.graphdef.complete_assignment`). It is the one mutable
  part of a placement (functions are added as new batch structures arrive).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Protocol, Sequence

import keras
import tensorflow as tf

from ..core.attrs import PHASE
from ..core.compression import CompressionPolicy
from ..core.devices import DeviceSet
from ..core.plan import Plan
from ..core.replicas import device_groups
from ..core.splits import Split
from ..errors import GraphError
from ..measure.links import CLIENT_DEVICE
from ..planner import PlanOptions
from .emit import EmittedModel, emit, rewrite_context, rewrite_graph_def
from .graphdef import layer_devices_of
from .opgraph import OpGraph
from .remote import Watchdog, read_rows, variable_on, write_rows
from .replicas import replica_assignment
from .report import Report
from .rewrites import find_record
from .rewrites.sends import acknowledged_nodes, send_rule
from .rewrites.split import Shard, split_candidates, splittable
from .trace import TracedModel

# A split op's whole weight lives on CLIENT_DEVICE: the CPU of the process that placed the model (with gRPC
# workers, the client; its parts read shards on the workers).


class StepTracer(Protocol):
    """What traces the functions a placement emits: the placed model's shell
    (:class:`~placer.tf.placed_model.PlacedModel`)."""

    def trace_forward(self, input_specs: Sequence[tf.TensorSpec], batch_size: int, training: bool) -> TracedModel:
        """The user's model's forward pass, traced for any batch."""

    def trace_step(self, step: str, data_structure: Any,
                   replica_groups: Sequence[Sequence[str]] = ()) -> TracedModel:
        """Keras' ``train_step``/``test_step`` on one batch structure (replicated over ``replica_groups``)."""


class ReplicatedVariable(keras.Variable):
    """A placed model variable with copies on other devices (``mirrors``) or shards of it (``shards``) that
    follow it.

    A forward pass run as data-parallel copies (``Plan.replicas``) reads each weight on each copy's own
    device, as data parallelism keeps a copy of the weights per device; an op split over devices
    (``Plan.splits``) reads its weight's shards, each on its part's device. Every write through Keras
    (``assign``, ``assign_add``, ``assign_sub``, hence ``set_weights`` and ``load_weights``, eager or inside a
    ``tf.function``) assigns the mirrors the new value and the shards their slices of it after it, so they
    always hold the variable's value. Writing its underlying ``tf.Variable`` (``variable.value.assign``)
    bypasses Keras, the mirrors and the shards.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._mirrors: dict[str, tf.Variable] = {}  # device → the copy there
        self._shards: dict[tuple[str, int, int, int], tuple[Shard, tf.Variable]] = {}  # (device, slice) → shard
        self._stale = False  # a placed training step updated the shards since the value was last gathered
        super().__init__(*args, **kwargs)

    @property
    def value(self) -> Any:
        """The variable's value; after a placed training step updated its shards, gathered from them first
        (eagerly: the shards are the trained weight)."""
        if self._stale and tf.executing_eagerly():
            self.gather_shards()
        return super().value

    @classmethod
    def adopt(cls, variable: keras.Variable) -> "ReplicatedVariable":
        """``variable`` (a Keras variable that another object holds: an optimizer's slot of a split weight) made,
        in place, one whose shards follow it: the same object, so its holder reads and writes it as before.

        >>> v = ReplicatedVariable.adopt(keras.Variable([[1.0, 2.0]]))
        >>> isinstance(v, ReplicatedVariable), v.shards
        (True, [])
        """
        variable.__class__ = cls
        variable._mirrors, variable._shards, variable._stale = {}, {}, False  # noqa: SLF001 (as __init__ sets)
        return variable

    def mark_trained(self) -> None:
        """Note that a training step updated the shards (the next eager read gathers them)."""
        self._stale = bool(self._shards)

    def gather_shards(self) -> None:
        """Assign the variable the concatenation of its shards (where it lives; the shards keep their values)."""
        if not self._shards:
            self._stale = False
            return
        pieces = sorted(self._shards.values(), key=lambda sv: sv[0].start)
        axis = pieces[0][0].axis
        covered = [(sh.start, sh.stop) for sh, _ in pieces]
        if covered[0][0] != 0 or covered[-1][1] != self.shape[axis] or any(
                a[1] != b[0] for a, b in zip(covered, covered[1:])):
            raise GraphError(f"the shards of {self.path} cover {covered} of its {self.shape[axis]} entries along "
                             f"axis {axis}, not all of them once; place the model again")
        with tf.device(self._value.device):
            self._value.assign(tf.concat([read_rows(v) if sh.pieces else v.read_value() for sh, v in pieces],
                                         axis=axis))
        self._stale = False  # only once gathered: a refused gather refuses every read after it too

    @property
    def mirrors(self) -> list[tf.Variable]:
        """The copies made so far, one per device."""
        return list(self._mirrors.values())

    @property
    def shards(self) -> list[tf.Variable]:
        """The shards made so far."""
        return [v for _, v in self._shards.values()]

    def _direct_assign(self, value: Any) -> None:
        self._stale = False
        super()._direct_assign(value)
        for m in self._mirrors.values():
            m.assign(self.value)
        for shard, v in self._shards.values():
            if shard.pieces and tf.executing_eagerly():
                write_rows(v, self._slice(shard))
            else:  # inside a tf.function (a Keras write there), or an old export's shard: one assign where it lives
                v.assign(self._slice(shard))

    def _slice(self, shard: Shard) -> tf.Tensor:
        """``shard``'s slice of the value, cut where the variable lives (only the slice travels to the shard)."""
        with tf.device(self.value.device):
            return shard.slice_of(self.value.read_value())

    def shard_on(self, shard: Shard) -> tf.Variable:
        """The variable on ``shard.device`` holding ``shard``'s slice of this one (made on first use; the whole
        value never goes to ``shard.device``)."""
        key = (shard.device, shard.start, shard.stop, shard.axis)  # every trace of the model shares it
        if key not in self._shards:
            name = f"{self.name.split('/')[-1]}_shard_{shard.start}"
            if shard.pieces:  # in pieces (remote.variable_on: its copy-on-read mode off afterwards)
                variable = variable_on(shard.device, self._slice(shard), name=name)
            else:  # a shard of an export made before shards travelled in pieces: sent whole
                with tf.device(shard.device):
                    variable = tf.Variable(self._slice(shard), trainable=False, name=name)
            self._shards[key] = (shard, variable)
        return self._shards[key][1]

    def mirror_on(self, device: str) -> tf.Variable:
        """The copy of this variable on ``device`` (made on first use, equal to the variable)."""
        if device not in self._mirrors:
            with tf.device(device):
                self._mirrors[device] = tf.Variable(self.value.read_value(), trainable=False,
                                                    name=self.name.split("/")[-1] + "_mirror")
        return self._mirrors[device]


def place_variables(traced: TracedModel, plan: Plan, devices: DeviceSet, variables: Sequence[Any],
                    user_variables: Sequence[Any]) -> dict[int, Any]:
    """``id(variable)`` → the variable on its planned device, for each of ``variables`` (module docstring).

    A variable's device is the plan's for the placeholder that captures it in the trace the plan was made on
    (``traced.fixed``), else the first device.
    ``user_variables`` (the user's model's) are copied (a :class:`ReplicatedVariable` where the plan runs a
    forward pass as data-parallel copies or splits the op that reads it); the others (the shell's optimizer and
    metric variables) are moved. The variable of a split op's weight lives on this process's CPU
    (:data:`CLIENT_DEVICE`): no device the plan uses holds it whole, each holds its shards.
    """
    replicated = plan.replicas > 1 and traced.step == "predict"
    captured = traced.fixed_captures[0]
    sharded = {id(captured[ph]) for s in split_candidates(traced.fixed.graph, captured, plan.splits,
                                                          pairs=plan.pairs) for ph in s.placeholders}
    home: dict[int, str] = {}
    # the plan names the placeholders of the trace it was made on (the fixed-batch one): a capture named by a
    # counter ("…/1804", a variable a nested function reads) has another name in every other trace
    for ph, var in captured.items():
        home.setdefault(id(var), CLIENT_DEVICE if id(var) in sharded else plan.assignment.get(ph, devices.names[0]))
    user = {id(v) for v in user_variables}
    placed: dict[int, Any] = {}
    for var in variables:
        device = home.get(id(var), devices.names[0])
        with tf.device(device):
            if id(var) in user:
                kind = ReplicatedVariable if replicated or id(var) in sharded else keras.Variable
                placed[id(var)] = kind(var.value.read_value(), dtype=var.dtype, trainable=var.trainable,
                                       name=var.name)
            else:  # the shell's own optimizer/metric state: moved, so Keras' objects keep working
                var._value = tf.Variable(var.value.read_value(), trainable=var.trainable,  # noqa: SLF001
                                         name=var.name)
                # an optimizer's slot of a split weight (Adam's moments): sharded as the weight is, gathered on read
                placed[id(var)] = ReplicatedVariable.adopt(var) if id(var) in sharded else var
    return placed


class PlacedFunctions:
    """The functions emitted from one plan: the planned forward pass and Keras' steps, per batch structure.

    Parameters
    ----------
    plan : Plan
        The placement (op → device, order, micro-batches, pipeline).
    op_graph : OpGraph
        The op graph it was made on (op times for acknowledged sends; the update phase of a training step).
    compression : CompressionPolicy
        Which codec each cut edge gets.
    replica_groups : tuple of tuple of str
        Each replica's devices, for a replicated training step (:func:`placer.tf.replicas.replica_groups`).
    prompt_sends : bool
        Acknowledge awaited cross-process transfers (:mod:`placer.tf.rewrites.sends`).
    variables : Mapping[int, Any]
        ``id(variable)`` → the variable on its device (:func:`place_variables`).
    tracer : StepTracer
        What traces the model's forward pass and Keras' steps.
    input_specs : tuple of tf.TensorSpec
        The model's inputs (unknown batch).
    """

    def __init__(self, *, plan: Plan, op_graph: OpGraph, compression: CompressionPolicy,
                 replica_groups: tuple[tuple[str, ...], ...], prompt_sends: bool, variables: Mapping[int, Any],
                 tracer: StepTracer, input_specs: tuple[tf.TensorSpec, ...]) -> None:
        self.plan, self.op_graph, self.compression = plan, op_graph, compression
        self.replica_groups, self.variables, self.input_specs = replica_groups, variables, input_specs
        self._tracer = tracer
        self._layer_devices = layer_devices_of(plan.assignment)
        self._sends = send_rule(plan, op_graph.graph, len(replica_groups)) if prompt_sends else None
        self._functions: dict[Any, EmittedModel] = {}
        self._traces: dict[Any, TracedModel] = {}

    def forward(self, training: bool = False) -> EmittedModel:
        """The placed forward pass (``training=True``: dropout on, batch statistics)."""
        key = ("call", bool(training))
        if key not in self._functions:
            self._functions[key] = self.emit(self.forward_trace(training))
        return self._functions[key]

    def forward_trace(self, training: bool = False) -> TracedModel:
        """The trace of the model's forward pass the placed one is emitted from (traced once; ``placed.measure``
        runs the original from it too)."""
        key = ("call", bool(training))
        if key not in self._traces:
            self._traces[key] = self._tracer.trace_forward(self.input_specs, max(self.plan.batch_size or 1, 1),
                                                           training)
        return self._traces[key]

    def step(self, step: str, data_structure: Any) -> EmittedModel:
        """The placed ``train_step``/``test_step`` for one batch structure (``(x, y)`` specs)."""
        key = (step, repr(tf.nest.map_structure(lambda s: (tuple(s.shape), s.dtype.name), data_structure)))
        if key not in self._functions:
            groups = self.replica_groups if step == "train" and len(self.replica_groups) > 1 else ()
            self._functions[key] = self.emit(self._tracer.trace_step(step, data_structure, groups))
        return self._functions[key]

    def emitted(self) -> tuple[EmittedModel, ...]:
        """Every function emitted so far."""
        return tuple(self._functions.values())

    def emit(self, traced: TracedModel) -> EmittedModel:
        """The placed function of ``traced`` (a trace of this model: its forward pass or one of its steps)."""
        plan = self.plan
        by_var = {ph: self.variables[id(var)] for ph, var in traced.variables.items()}
        assignment = plan.assignment
        if self.replica_groups and traced.step == "train":
            g = self.op_graph.graph
            once = {v for v in g if g.nodes[v].get(PHASE) == "update"}
            assignment = replica_assignment(traced.dynamic.graph, assignment, self._layer_devices,
                                            self.replica_groups, once)
        pipelined_training = traced.step == "train" and plan.microbatches > 1
        # a trace without a split op's part (another step of the model) reads the weight whole, where it lives
        splits = {op: k for op, k in plan.splits.items() if splittable(traced.dynamic.graph, op, traced.variables)}
        groups = device_groups(plan.devices, plan.replicas) if plan.replicas > 1 and traced.step == "predict" else ()
        context = rewrite_context(
            traced, assignment, layer_devices=self._layer_devices, compression=self.compression,
            batch_size=plan.batch_size or 1, microbatches=plan.microbatches if traced.step == "predict" else 1,
            replica_groups=self.replica_groups if pipelined_training else (),
            replicas=groups, mirrored=frozenset(ph for ph, v in by_var.items() if isinstance(v, ReplicatedVariable)),
            pipeline=plan.pipeline, pipeline_devices=tuple(plan.stages), sends=self._sends,
            order=plan.op_order if plan.microbatches == 1 and plan.replicas == 1 and not self.replica_groups else {},
            splits=splits, pairs=frozenset(op for op in plan.pairs if op in splits))
        return emit(traced, by_var, context, mirror=lambda variable, device: variable.mirror_on(device),
                    shard=lambda variable, shard: variable.shard_on(shard))


def predicted_acknowledgements(traced: TracedModel, plan: Plan, op_graph: OpGraph, built: Any
                               ) -> tuple[tuple[int, int, tuple[int, ...]], ...]:
    """The transfers the placed function of ``traced`` (a forward pass in one micro-batch, one copy) would
    acknowledge with prompt sends (:mod:`placer.tf.rewrites.sends`), as the simulator takes them
    (``SimOptions.acknowledged``; ``built``: the problem of ``op_graph``): the declared rewrites run on the
    trace's GraphDef as :func:`placer.tf.emit.emit` runs them, without importing it. A plan's predicted step is
    scored so before it is emitted (the splits stage compares plans by it)."""
    context = rewrite_context(traced, plan.assignment, layer_devices=layer_devices_of(plan.assignment),
                              batch_size=plan.batch_size or 1, splits=plan.splits, pairs=frozenset(plan.pairs),
                              sends=send_rule(plan, op_graph.graph))
    records = rewrite_graph_def(traced.dynamic.graph.as_graph_def(), context)[2]
    sends = find_record(records, "sends")
    return acknowledged_nodes(built, None if sends is None else sends.detail)


@dataclass(frozen=True, kw_only=True)
class Placement:
    """What :func:`placer.autoplace` hands the placed model, once.

    Attributes
    ----------
    plan : Plan
        The placement, its predicted step that of the step as emitted.
    op_graph : OpGraph
        The cost-annotated op graph it was made on.
    devices : DeviceSet
        The devices planned on (with their links and shared processors).
    input_specs : tuple of tf.TensorSpec
        The model's inputs (unknown batch).
    training : bool
        Whether the training step was placed (``fit``/``evaluate`` run placed).
    data_structure : nested tf.TensorSpec or None
        A training placement's planned ``(x, y)`` batch structure.
    replica_groups : tuple of tuple of str
        Each replica's devices (data-parallel groups × micro-batches); ``()``: not replicated.
    variables : Mapping[int, Any]
        ``id(variable)`` of the user's model, optimizer and metrics → the variable on its device.
    functions : PlacedFunctions
        The placed functions (emitted as batch structures arrive).
    planned : EmittedModel
        The function of the planned trace.
    report : Report
        The placement report (predicted figures).
    watchdog : Watchdog
        Watches calls that use remote workers.
    plan_options : PlanOptions
        The options the plan was made with (a saved op graph carries them: ``placer.solve`` re-plans it
        the same way).
    index_bounds : tuple of (int or None)
        Per flat input of the planned step (training: ``(x, y)`` flattened): the bound of the random ids it was
        profiled with (:func:`placer.tf.trace.index_bounds`); ``placed.measure()`` without a batch feeds the same.
    whole_op_graph : OpGraph or None
        Where the plan splits ops: the op graph before any split (an export keeps it, so that
        :func:`placer.load` can split the same ops into another number of parts); ``None`` otherwise.
    split_ops : tuple of Split
        The plan's splits as found on the planned trace (``Plan.splits`` names their ops).
    """

    plan: Plan
    op_graph: OpGraph
    devices: DeviceSet
    input_specs: tuple[tf.TensorSpec, ...]
    training: bool
    data_structure: Any
    replica_groups: tuple[tuple[str, ...], ...]
    variables: Mapping[int, Any]
    functions: PlacedFunctions
    planned: EmittedModel
    report: Report
    watchdog: Watchdog
    plan_options: PlanOptions
    index_bounds: tuple[int | None, ...] = ()
    whole_op_graph: OpGraph | None = None
    split_ops: tuple[Split, ...] = ()
