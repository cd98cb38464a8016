"""The object :func:`placer.autoplace` returns: a ``keras.Model`` whose steps run placed functions.

:class:`PlacedModel` subclasses ``keras.Model`` and overrides only
``train_step``, ``test_step`` and ``__call__`` (which ``predict_step``
uses). Each runs a placed function: a trace of the user's model — or of
Keras' *own* ``train_step``/``test_step`` on it — rewritten op by op onto
the planned devices (:mod:`placer.tf.emit`). Keras keeps its job:
``fit``, ``evaluate`` and ``predict`` with their data handling, callbacks,
progress bar, ``History``, validation and ``save_weights``/``load_weights``
are Keras' own, so the logs are the ones ``model.fit`` gives.

Variables. Before placement, the model is a *shell*: it calls the user's
model (held untracked, never modified), and its compiled optimizer and
metrics are built on the user's variables, so that tracing Keras' step
captures exactly the state ``model.fit`` would use. Placement then gives
every captured variable a home on its planned device:

* each of the user's variables gets a **copy** (a ``keras.Variable``
  created under ``tf.device``); the user's model is never written;
* the shell's own optimizer and metric variables (slots, iteration count,
  learning rate, metric totals) are **moved**: the ``tf.Variable`` behind
  each ``keras.Variable`` is re-created on its device with the same value,
  so ``placed.optimizer.learning_rate = …`` (a learning-rate callback) and
  ``reset_metrics`` act on what the placed step reads.

Functions are emitted lazily, one per step and batch structure (as
``tf.function`` retraces), all from the one plan: ops the plan names get
its device, the others their layer's (:func:`placer.tf.emit.complete_assignment`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import warnings
from dataclasses import dataclass, field, replace
from typing import Any, Collection, Iterator, Mapping, Sequence

import keras
import tensorflow as tf

from ..core.attrs import COMPUTE_US, PHASE
from ..core.compression import CODECS, CompressionPolicy
from ..core.devices import DeviceSet, device_kind
from ..core.graph_io import save_graph
from ..core.plan import Plan
from ..core.validate import integer, real
from ..errors import InputSignatureError, ModelError, TrainingError, UnsupportedError
from .codecs import CompressedEdge
from .emit import EmittedModel, emit, layer_devices_of, observed_devices
from .microbatch import COPY_PREFIX
from .costs import random_batch
from .export import export_saved_model
from ..measure.steps import DEFAULT_MIN_TIME_S, DEFAULT_REPEATS, DEFAULT_WARMUP, StepMeasurement, measure_steps
from .opgraph import GRADIENT_SCOPE, OpGraph, layer_of
from .remote import DEFAULT_WORKER_TIMEOUT_S, Watchdog, worker_addresses
from .sends import SendRule
from .report import Report
from .trace import TracedModel, input_keys, model_inputs, trace_model, trace_step

log = logging.getLogger(__name__)

def _spec_of(t: Any) -> tf.TensorSpec:
    return tf.TensorSpec((None, *t.shape[1:]), t.dtype)


class _Origin:
    """Holds the user's model where Keras does not look (not a Keras object, not a container)."""

    __slots__ = ("model",)

    def __init__(self, model: Any) -> None:
        self.model = model


def fresh_copy(obj: Any) -> Any:
    """A fresh Keras object with ``obj``'s configuration (strings and callables are kept)."""
    if isinstance(obj, (str, type(None))) or not hasattr(obj, "get_config"):
        return obj
    return keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(obj))


def one_device_twin(model: Any, weights: Sequence[Any], compile_kwargs: Mapping[str, Any] | None,
                    compile_config: Mapping[str, Any] | None, device: str) -> Any:
    """A clone of ``model`` with ``weights``, every variable on ``device``, compiled with the given settings
    (fresh optimizer and metrics): what one device trains, for :meth:`PlacedModel.measure`."""
    with tf.device(device):
        twin = keras.models.clone_model(model)
        twin.set_weights(weights)
        if compile_config is not None:
            twin.compile_from_config(dict(compile_config))
        else:
            kwargs = dict(compile_kwargs or {})
            kwargs["optimizer"] = fresh_copy(kwargs.get("optimizer"))
            kwargs["metrics"] = tf.nest.map_structure(fresh_copy, kwargs.get("metrics"))
            twin.compile(**kwargs)
    return twin


@dataclass
class _Placement:
    """What placement gave the shell (mutable: functions are added as new batch structures arrive)."""

    plan: Plan
    op_graph: OpGraph
    devices: DeviceSet
    input_specs: tuple[tf.TensorSpec, ...]
    compression: CompressionPolicy
    training: bool
    placed: dict[int, Any]             # id(user's or shell's keras.Variable) -> the variable on its device
    layer_devices: dict[str, str]
    watchdog: Watchdog
    functions: dict[Any, EmittedModel] = field(default_factory=dict)
    planned: EmittedModel | None = None  # the function of the planned trace
    report: Report | None = None
    measurement: StepMeasurement | None = None  # the last placed.measure(x)
    data_structure: Any = None  # a training placement: the planned step's (x, y) specs
    prompt_sends: bool = False  # acknowledge awaited cross-process transfers (placer.tf.sends)


REPLICA_SCOPE = "replica"
#: A micro-batch's or replica's name scope in an emitted graph (``mb{i}/`` of a pipelined forward pass,
#: ``replica_{i}/`` of a replicated training step, also inside ``gradient_tape/``).
_COPY_SCOPE = re.compile(r"(^|/)(?:" + COPY_PREFIX.format("") + "|" + REPLICA_SCOPE + r"_)(\d+)/")
#: Name scope of the running gradient sums after replica ``r`` (``autoplace_gradient_sum_r/…``).
GRADIENT_SUM_SCOPE = "autoplace_gradient_sum"
#: ... and of the sum of the groups' sums, group ``r``'s added under ``autoplace_gradient_total_r/``.
GRADIENT_TOTAL_SCOPE = "autoplace_gradient_total"


def replicated_train_step(model: Any, data: Any) -> Any:
    """One training step of ``model`` split over its replicas: the math of the full-batch step.

    The batch is split in ``R`` parts of sizes differing by at most one row;
    replica ``r`` (ops under the name scope ``replica_r/``) runs the forward
    pass, the loss and the gradients of its part, its loss weighted by its
    share of the rows, so the gradients' sum is the gradient of the
    full-batch loss. Each group of devices sums its replicas' gradients as
    they come (a running sum per variable, replica ``r``'s under the name
    scope ``autoplace_gradient_sum_r/``, beside the gradients it adds: the
    micro-batches of one data-parallel group send one sum, not each its
    own); the groups' sums (``autoplace_gradient_total_r/``, ``r`` the
    group) and the single optimizer update run where the variables live
    (the first group's devices); the metrics see the whole batch. Random
    ops draw per replica (dropout masks differ from the unsplit step); batch
    normalization is refused (:func:`placer.tf.training.check_replicable`).
    """
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    replicas = len(model._replica_groups)  # noqa: SLF001
    n = tf.shape(tf.nest.flatten(x)[0])[0]
    sizes = [(n + replicas - 1 - r) // replicas for r in range(replicas)]

    def part(t: Any, r: int) -> Any:
        return None if t is None else tf.split(t, sizes, axis=0)[r]

    def add(a: list[Any], b: list[Any]) -> list[Any]:
        return [g if s is None else s if g is None else s + g for s, g in zip(a, b)]

    group_of = {g: i for i, g in enumerate(dict.fromkeys(model._replica_groups))}  # noqa: SLF001
    trainable = model.trainable_weights
    sums: dict[int, list[Any]] = {}  # per group of devices: the running sum of its replicas' gradients
    total_loss = tf.constant(0.0)
    preds = []
    for r in range(replicas):
        xr, yr, swr = (tf.nest.map_structure(lambda t, r=r: part(t, r), v) for v in (x, y, sample_weight))
        share = tf.cast(sizes[r], "float32") / tf.cast(n, "float32")
        with tf.name_scope(f"{REPLICA_SCOPE}_{r}"):
            with tf.GradientTape() as tape:
                y_pred = model(xr, training=True)
                loss = model._compute_loss(x=xr, y=yr, y_pred=y_pred, sample_weight=swr,  # noqa: SLF001
                                           training=True) * share
                scaled = model.optimizer.scale_loss(loss)
            grads = tape.gradient(scaled, trainable)
        group = group_of[model._replica_groups[r]]  # noqa: SLF001
        if group not in sums:
            sums[group] = grads
        else:
            with tf.name_scope(f"{GRADIENT_SUM_SCOPE}_{r}"):  # the running sums, named for hold_gradient_sums
                sums[group] = add(sums[group], grads)
        total_loss = total_loss + loss
        preds.append(y_pred)
    total_grads = sums[0]
    for group in range(1, len(sums)):
        with tf.name_scope(f"{GRADIENT_TOTAL_SCOPE}_{group}"):
            total_grads = add(total_grads, sums[group])
    model._loss_tracker.update_state(total_loss, sample_weight=n)  # noqa: SLF001
    model.optimizer.apply_gradients(zip(total_grads, trainable))
    y_pred = tf.nest.map_structure(lambda *ps: tf.concat(ps, axis=0), *preds)
    return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)


def replica_assignment(graph: tf.Graph, plan: Mapping[str, str], layer_devices: Mapping[str, str],
                       groups: Sequence[Sequence[str]], once: Collection[str] = ()) -> dict[str, str]:
    """Op → device for a replicated step: ``replica_r/<op>`` gets ``<op>``'s planned device, mapped to group ``r``.

    Reads of variables stay on the variable's device. Ops outside the
    replica scopes (gradient sums, the update, metrics)
    keep the plan's names and devices (the first group, where the variables
    live); :func:`placer.tf.emit.complete_assignment` places the rest. A
    replica's op whose name the plan gives an op that runs once per step
    (``once``, the op graph's ``update`` phase) shares only the name with
    it (``replica_0/mul``, the loss scaled by the replica's rows, against
    the plan's ``mul`` of the loss tracker), so it goes with its first
    placed producer. A replica's gradient op that the plan does not name (the
    gradient of that scaling) runs with the forward op it differentiates, as
    TensorFlow's ``colocate_gradients_with_ops`` would place it: left to its
    first producer (the gradient seed, wherever the plan put the
    unreplicated step's), it sat on another device than the loss, and with
    micro-batches gated per device every micro-batch's backward pass there
    waited for the previous one's on the seed's device (measured:
    ``benchmarks/results/pipeline_orders.md``).
    """
    maps = [dict(zip(groups[0], g)) for g in groups]
    out: dict[str, str] = {}
    for op in graph.get_operations():
        parts = op.name.split("/")
        at = 1 if parts[0] == GRADIENT_SCOPE and len(parts) > 2 else 0  # gradient_tape/replica_r/<forward op>
        scope, _, replica = parts[at].rpartition("_")
        if scope == REPLICA_SCOPE and replica.isdigit():
            rest = "/".join(parts[:at] + parts[at + 1:])
            device = None
            if rest in once:  # the name is all it shares with the plan's op: with its first placed producer
                device = next((out[t.op.name] for t in op.inputs if t.op.name in out), None)
            else:
                planned = plan.get(rest)
                if planned is None and at == 1:
                    device = _forward_device(parts[1:], out)
                planned = planned or layer_devices.get(layer_of(rest))
                if device is None and planned is not None:
                    # a read of a variable runs where the variable lives (TensorFlow moves it)
                    reads = any(t.dtype == tf.resource for t in op.inputs)
                    device = planned if reads else maps[int(replica)][planned]
            if device is not None:
                out[op.name] = device
        elif op.name in plan:
            out[op.name] = plan[op.name]
    return out


def _forward_device(forward_parts: Sequence[str], devices: Mapping[str, str]) -> str | None:
    """The device of the forward op a gradient op differentiates: the longest prefix of its name (below the
    tape's scope) that names a placed op, e.g. ``replica_0/mul`` for ``gradient_tape/replica_0/mul/Mul``."""
    for end in range(len(forward_parts) - 1, 0, -1):
        device = devices.get("/".join(forward_parts[:end]))
        if device is not None:
            return device
    return None


def _say_what_compression_did(policy: CompressionPolicy, emitted: EmittedModel) -> None:
    """Warn when compression was asked for and nothing was compressed, saying why."""
    if policy.compression == "none" or emitted.compressed:
        return
    if policy.budget_excludes_all:
        why = (f"no codec meets the error budget compression_error={policy.error_budget:g} "
               f"(smallest error: {min(c.max_error for n, c in CODECS.items() if n != 'none'):.2g})")
    elif policy.compression == "auto":
        why = "no codec saves time on these links (or no cut edge carries a float tensor of rank >= 1)"
    else:
        why = ("no cut edge carries a tensor the codec may take (float32 of rank >= 1"
               + (", forward pass only" if CODECS[policy.compression].forward_only else "") + ")")
    warnings.warn(f"compression={policy.compression!r}: nothing compressed, every edge is sent as it is: {why}",
                  stacklevel=3)


class PlacedModel(keras.Model):
    """A Keras model placed op by op on several devices; trains, evaluates and predicts like Keras.

    Call it like the model (``placed(x)``, ``placed(x, training=True)``),
    or use Keras' ``predict``, ``fit`` and ``evaluate`` (training needs a
    placement made with ``training=True``). ``plan`` holds the placement
    (``plan.save(path)`` keeps it, ``autoplace(model, devices, plan=path)``
    re-applies it); :meth:`report`, :meth:`export` and :meth:`save_graph`
    write the report, a SavedModel and the cost-annotated op graph.

    The placed model owns *copies* of the model's variables, each created on
    its planned device; the original model is never modified.
    :meth:`sync_to` writes the trained weights into a Keras model on
    request.
    """

    def __init__(self, source: Any, *, name: str | None = None) -> None:
        super().__init__(name=name or source.name)
        # Untracked and out of reach of Keras' saving walk (which visits every attribute, properties
        # included): the user's variables must neither become this model's weights nor be written by
        # load_weights.
        object.__setattr__(self, "_origin", _Origin(source))
        object.__setattr__(self, "_placement", None)
        object.__setattr__(self, "_tracing", False)
        object.__setattr__(self, "_replica_groups", ())
        object.__setattr__(self, "_compile_settings", (None, None))

    # -- the shell: what tracing sees -------------------------------------------
    def call(self, inputs: Any, training: bool = False) -> Any:  # noqa: D102  (see __call__)
        return self.__call__(inputs, training=training)

    @contextlib.contextmanager
    def _tracing_source(self) -> Iterator[None]:
        object.__setattr__(self, "_tracing", True)
        try:
            yield
        finally:
            object.__setattr__(self, "_tracing", False)

    def prepare_training(self, compile_kwargs: Mapping[str, Any] | None, compile_config: Mapping[str, Any] | None,
                         sample_batch: Any) -> None:
        """Compile the shell and build its optimizer and metrics on the user's variables.

        Exactly one of ``compile_kwargs`` (arguments of ``compile``) and
        ``compile_config`` (``model.get_compile_config()``: fresh objects with
        the same settings) is given. ``sample_batch`` is one ``(x, y)`` batch
        of arrays, used only for shapes.
        """
        object.__setattr__(self, "_compile_settings", (compile_kwargs, compile_config))  # for measure()
        names = getattr(self._origin.model, "output_names", None)
        if names:  # Keras names per-output losses and metrics after them ("o1_loss", "o1_mae")
            self.output_names = list(names)
        with self._tracing_source():
            if compile_config is not None:
                self.compile_from_config(dict(compile_config))
            else:
                self.compile(**compile_kwargs)
            self.optimizer.build(self._origin.model.trainable_variables)
            self._symbolic_build(data_batch=sample_batch)
        self.built = True

    def training_variables(self) -> list[Any]:
        """Every variable a traced step may capture: the user's, the optimizer's, the metrics'."""
        own = [*(self.optimizer.variables if self.optimizer is not None else []), *self.metrics_variables]
        return [*self._origin.model.variables, *own]

    def trace(self, step: str, data_structure: Any, batch_size: int | None, *,
              replicated: bool = False) -> TracedModel:
        """Trace Keras' ``train_step``/``test_step`` of this shell (:func:`placer.tf.trace.trace_step`).

        ``replicated``: the training step of :meth:`set_replicas` instead.
        """
        with self._tracing_source():
            return trace_step(self, step, data_structure, batch_size=batch_size,
                              known_variables=self._known_variables(),
                              body=replicated_train_step if replicated else None)

    def set_replicas(self, groups: Sequence[Sequence[str]]) -> None:
        """Train on ``len(groups)`` replicas: group ``r``'s devices run replica ``r`` of every placed op.

        The plan is made for ``groups[0]``; replica ``r`` runs the same
        plan with device ``groups[0][i]`` mapped to ``groups[r][i]``.
        """
        object.__setattr__(self, "_replica_groups", tuple(tuple(g) for g in groups))

    def set_microbatches(self, m: int, devices: Sequence[str]) -> None:
        """Train in ``m`` micro-batches: the replicated step (:func:`replicated_train_step`: the full-batch
        math) with ``m`` replicas on the same ``devices``, each device's micro-batches ordered by gates.

        With data-parallel groups (:meth:`set_replicas`, ``devices`` the first), each group runs ``m``
        consecutive replicas: the micro-batches of its share of the batch."""
        groups = self._replica_groups or (tuple(devices),)
        self.set_replicas([g for g in groups for _ in range(m)])

    def _known_variables(self) -> list[Any]:
        return self.training_variables() if self.compiled else list(self._origin.model.variables)

    # -- placement -------------------------------------------------------------
    def place(self, traced: TracedModel, plan: Plan, op_graph: OpGraph, devices: DeviceSet,
              input_specs: Sequence[tf.TensorSpec], compression: CompressionPolicy, *,
              worker_timeout_s: float = DEFAULT_WORKER_TIMEOUT_S, prompt_sends: bool = False) -> EmittedModel:
        """Create every variable on its planned device and emit the planned function.

        ``prompt_sends``: every function placed for this model acknowledges its awaited cross-process transfers
        (:mod:`placer.tf.sends`).

        Calls that use remote workers are watched (:class:`placer.tf.remote.Watchdog`): a worker that
        leaves a health probe unanswered for ``worker_timeout_s`` ends the call with a ``WorkerError``.

        Raises
        ------
        UnsupportedError
            If this model was placed already.
        """
        if self._placement is not None:
            raise UnsupportedError("this PlacedModel is placed already; call placer.autoplace again")
        home: dict[int, str] = {}
        for ph, var in traced.variables.items():
            home.setdefault(id(var), plan.assignment.get(ph, devices.names[0]))
        user = {id(v) for v in self._origin.model.variables}
        placed: dict[int, Any] = {}
        for var in self._known_variables():
            device = home.get(id(var), devices.names[0])
            with tf.device(device):
                if id(var) in user:
                    placed[id(var)] = keras.Variable(var.value.read_value(), dtype=var.dtype, trainable=var.trainable,
                                                     name=var.name)
                else:  # the shell's own optimizer/metric state: moved, so Keras' objects keep working
                    var._value = tf.Variable(var.value.read_value(), trainable=var.trainable,  # noqa: SLF001
                                             name=var.name)
                    placed[id(var)] = var
        layer_devices = layer_devices_of(plan.assignment)
        object.__setattr__(self, "_placement", _Placement(
            plan=plan, op_graph=op_graph, devices=devices, input_specs=tuple(input_specs),
            compression=compression, training=traced.step == "train", placed=placed, layer_devices=layer_devices,
            watchdog=Watchdog(worker_addresses(devices.names), worker_timeout_s), prompt_sends=prompt_sends))
        self.built = True
        emitted = (self._forward(False) if traced.step == "predict"
                   else self._step_function(traced.step, traced.data_structure))
        self._placement.planned = emitted
        self._placement.data_structure = traced.data_structure
        _say_what_compression_did(compression, emitted)
        return emitted

    def set_predicted_step(self, seconds: float) -> None:
        """Replace the plan's predicted step with that of the step as emitted (the pipeline's emit stage, once
        it knows which transfers the placed step acknowledges)."""
        self._placed.plan = replace(self._placed.plan, predicted_step_time_s=seconds)

    def set_report(self, report: Report) -> None:
        """Attach the placement report (the pipeline's last stage)."""
        self._placed.report = report

    @property
    def _placed(self) -> _Placement:
        if self._placement is None:
            raise UnsupportedError("this model is not placed yet; use placer.autoplace(model, devices)")
        return self._placement

    def _emit(self, key: Any, traced: TracedModel) -> EmittedModel:
        p = self._placed
        by_var = {ph: p.placed[id(var)] for ph, var in traced.variables.items()}
        assignment = p.plan.assignment
        if self._replica_groups and traced.step == "train":
            g = p.op_graph.graph
            once = {v for v in g if g.nodes[v].get(PHASE) == "update"}
            assignment = replica_assignment(traced.dynamic.graph, assignment, p.layer_devices, self._replica_groups,
                                            once)
        pipelined_training = traced.step == "train" and p.plan.microbatches > 1
        emitted = emit(traced, assignment, by_var, compression=p.compression, layer_devices=p.layer_devices,
                       batch_size=p.plan.batch_size or 1,
                       microbatches=p.plan.microbatches if traced.step == "predict" else 1,
                       replica_groups=self._replica_groups if pipelined_training else (),
                       pipeline=p.plan.pipeline, stages=p.plan.stages,
                       sends=SendRule(seconds=self._op_seconds, eligible=self._first_microbatch)
                       if p.prompt_sends else None,
                       order=p.plan.op_order if p.plan.microbatches == 1 and not self._replica_groups else None)
        p.functions[key] = emitted
        return emitted

    def _op_seconds(self, name: str) -> float:
        """Measured seconds of the emitted node ``name`` on its planned device: its op's in the op graph (a
        copy, ``mb{i}/…`` of a micro-batch or ``replica_{i}/…`` of a replica, its share of the batch's); 0 if
        unknown."""
        p = self._placed
        op, copies = _COPY_SCOPE.subn(r"\1", name)
        node, device = p.op_graph.graph.nodes.get(op), p.plan.assignment.get(op)
        if node is None or device is None:
            return 0.0
        us = node.get(COMPUTE_US) or {}
        seconds = float(us.get(device_kind(device), max(us.values(), default=0.0))) * 1e-6
        return seconds / max(len(self._replica_groups), p.plan.microbatches, 1) if copies else seconds

    def _first_microbatch(self, name: str) -> bool:
        """Whether the emitted node ``name`` belongs to no micro-batch or to the first of its group's."""
        found = _COPY_SCOPE.search(name)
        return found is None or int(found.group(2)) % max(self._placed.plan.microbatches, 1) == 0

    def _forward(self, training: bool) -> EmittedModel:
        key = ("call", bool(training))
        if key not in self._placed.functions:
            traced = trace_model(self._origin.model, input_signature=list(self._placed.input_specs),
                                 batch_size=max(self._placed.plan.batch_size or 1, 1), training=training)
            self._emit(key, traced)
        return self._placed.functions[key]

    def _step_function(self, step: str, data_structure: Any) -> EmittedModel:
        key = (step, repr(tf.nest.map_structure(lambda s: (tuple(s.shape), s.dtype.name), data_structure)))
        if key not in self._placed.functions:
            replicated = step == "train" and len(self._replica_groups) > 1
            self._emit(key, self.trace(step, data_structure, None, replicated=replicated))
        return self._placed.functions[key]

    # -- running ---------------------------------------------------------------
    @property
    def plan(self) -> Plan:
        """The placement (op → device and its predicted figures)."""
        return self._placed.plan

    @property
    def input_specs(self) -> tuple[tf.TensorSpec, ...]:
        """The inputs' specs (unknown batch dimension)."""
        return self._placed.input_specs

    def _mirror(self, source_variables: Sequence[Any]) -> list[Any]:
        """The placed copies of ``source_variables`` (the user's own while tracing or before placement)."""
        if self._placement is None or self._tracing:
            return list(source_variables)
        return [self._placement.placed[id(v)] for v in source_variables]

    @property
    def variables(self) -> list[Any]:
        """The placed copies of the model's variables, in the model's ``variables`` order."""
        return self._mirror(self._origin.model.variables)

    @property
    def weights(self) -> list[Any]:
        """The placed copies of the model's weights, in the model's ``weights`` order (``get_weights``)."""
        return self._mirror(self._origin.model.weights)

    @property
    def trainable_weights(self) -> list[Any]:  # what Keras' train_step differentiates
        return self._mirror(self._origin.model.trainable_weights)

    @property
    def non_trainable_weights(self) -> list[Any]:
        return self._mirror(self._origin.model.non_trainable_weights)

    trainable_variables = trainable_weights
    non_trainable_variables = non_trainable_weights

    @property
    def function(self) -> Any:
        """The placed forward ``tf.function`` (inference; takes the inputs positionally)."""
        return self._forward(False).function

    def _as_inputs(self, x: Any) -> list[tf.Tensor]:
        """The flat inputs of the placed function, from one array, a list/tuple, or a dict by input name."""
        specs = self._placed.input_specs
        keys = input_keys(self._origin.model) or tuple(s.name for s in specs)
        if isinstance(x, Mapping):
            if set(x) != set(keys):
                raise InputSignatureError(f"{self.name} takes the inputs {sorted(keys)} by name; got {sorted(x)}")
            flat = [x[k] for k in keys]
        elif x is None or isinstance(x, (str, bytes)):
            raise InputSignatureError(f"{self.name} takes arrays or tensors (one per input: {list(keys)}), not "
                                      f"{type(x).__name__}")
        elif isinstance(x, (list, tuple)):
            flat = list(x)
        elif len(specs) == 1:
            flat = [x]
        else:
            raise InputSignatureError(f"{self.name} takes {len(specs)} inputs ({list(keys)}) as a list, a tuple or a "
                                      f"dict by name, not one {type(x).__name__}")
        if len(flat) != len(specs):
            raise InputSignatureError(f"{self.name} takes {len(specs)} inputs ({list(keys)}), got {len(flat)}")
        out = []
        for value, spec, key in zip(flat, specs, keys):
            try:
                t = tf.convert_to_tensor(value, dtype=spec.dtype)
            except (TypeError, ValueError) as e:
                raise InputSignatureError(f"input {key!r} must be an array of {spec.dtype.name}, got "
                                          f"{type(value).__name__}: {str(e).splitlines()[0][:120]}") from None
            if not spec.shape.is_compatible_with(t.shape):
                raise InputSignatureError(
                    f"input {key!r} of shape {tuple(t.shape)} does not match the planned shape {tuple(spec.shape)}")
            out.append(t)
        return out

    def __call__(self, x: Any, training: bool = False, **kwargs: Any) -> Any:
        """Run the placed forward pass on one batch (``training=True``: dropout on, batch statistics)."""
        if self._tracing or self._placement is None:
            if isinstance(x, (list, tuple)) and input_keys(self._origin.model):
                x = model_inputs(self._origin.model, x)
            return self._origin.model(x, training=training, **kwargs)
        return self._run(self._forward(training).function, self._as_inputs(x))

    def _run_step(self, step: str, data: Any) -> Any:
        if isinstance(data, tuple):  # train_on_batch / test_on_batch pass (x, y, None): drop what is absent
            data = keras.utils.pack_x_y_sample_weight(*keras.utils.unpack_x_y_sample_weight(data))
        structure = tf.nest.map_structure(_spec_of, data)
        return self._run(self._step_function(step, structure).function, tf.nest.flatten(data))

    def _run(self, fn: Any, args: Sequence[Any]) -> Any:
        """``fn(*args)``; watched when it runs eagerly (inside Keras' functions the watch is on those)."""
        if tf.executing_eagerly():
            return self._placed.watchdog.call(fn, *args)
        return fn(*args)

    # Keras runs fit/evaluate/predict through these functions: each is watched like a direct call.
    def make_train_function(self, force: bool = False) -> Any:  # noqa: D102
        super().make_train_function(force)
        self.train_function = self._watched(self.train_function)
        return self.train_function

    def make_test_function(self, force: bool = False) -> Any:  # noqa: D102
        super().make_test_function(force)
        self.test_function = self._watched(self.test_function)
        return self.test_function

    def make_predict_function(self, force: bool = False) -> Any:  # noqa: D102
        super().make_predict_function(force)
        self.predict_function = self._watched(self.predict_function)
        return self.predict_function

    def _watched(self, fn: Any) -> Any:
        if fn is None or self._placement is None or self._tracing:
            return fn
        return self._placement.watchdog.guard(fn)

    def check_workers(self) -> None:
        """Probe every remote worker this placement uses (nothing to do on local devices).

        Raises
        ------
        WorkerError
            Naming each worker that does not answer within ``worker_timeout_s`` or cannot be reached.
        """
        self._placed.watchdog.check()

    def _check_trainable(self, what: str) -> None:
        if not self._placed.training:
            raise TrainingError(
                f"{what} needs a placement of the training step; this one was planned for inference. "
                "Place again with placer.autoplace(model, devices, training=True) (the model compiled, or "
                "optimizer= and loss= given)")

    def train_step(self, data: Any) -> Any:
        """Keras' ``train_step``, placed (forward, loss, gradients, update, metrics)."""
        if self._tracing or self._placement is None:
            return super().train_step(data)
        return self._run_step("train", data)

    def test_step(self, data: Any) -> Any:
        """Keras' ``test_step``, placed (forward, loss, metrics)."""
        if self._tracing or self._placement is None:
            return super().test_step(data)
        return self._run_step("test", data)

    def fit(self, *args: Any, **kwargs: Any) -> Any:
        """Keras' ``fit`` on the placed training step (same arguments, logs, callbacks and ``History``).

        Raises
        ------
        TrainingError
            If the placement was made for inference (``training=False``).

        Examples
        --------
        >>> import keras, numpy as np, placer
        >>> m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        >>> m.compile(optimizer="sgd", loss="mse")
        >>> placed = placer.autoplace(m, ["/CPU:0", "/CPU:1"], training=True, batch_size=4, time_limit_s=1)
        >>> h = placed.fit(np.ones((8, 4), "float32"), np.zeros((8, 2), "float32"), batch_size=4, verbose=0)
        >>> len(h.history["loss"]), int(placed.optimizer.iterations.numpy())
        (1, 2)
        """
        self._check_trainable("fit")
        try:
            return self._placed.watchdog.call(super().fit, *args, **kwargs)
        except KeyboardInterrupt:  # fit runs in the watchdog's thread with remote workers: stop it there too
            self.stop_training = True
            raise

    def predict(self, x: Any, batch_size: int | None = None, *args: Any, **kwargs: Any) -> Any:
        """Keras' ``predict`` on the placed forward pass (``batch_size`` a positive integer or None)."""
        if batch_size is not None:
            integer("batch_size", batch_size, minimum=1, error=InputSignatureError)
        return self._placed.watchdog.call(super().predict, x, batch_size, *args, **kwargs)

    def evaluate(self, *args: Any, **kwargs: Any) -> Any:
        """Keras' ``evaluate`` on the placed test step."""
        self._check_trainable("evaluate")
        return self._placed.watchdog.call(super().evaluate, *args, **kwargs)

    def sync_to(self, model: Any) -> None:
        """Write the placed model's weights into ``model`` (never done implicitly).

        Raises
        ------
        ModelError
            If ``model`` is not a Keras model with weights of the same shapes.
        """
        if not isinstance(model, keras.Model):
            raise ModelError(f"sync_to needs a keras.Model, got {type(model).__name__}")
        ours, theirs = self.weights, model.weights
        shapes = [tuple(v.shape) for v in ours], [tuple(v.shape) for v in theirs]
        if shapes[0] != shapes[1]:
            raise ModelError(f"model {model.name!r} has weights of shapes {shapes[1][:4]}… ({len(theirs)} in all), "
                             f"not this placed model's {shapes[0][:4]}… ({len(ours)}); sync to the model that "
                             "was placed (or a clone of it)")
        model.set_weights([v.numpy() for v in ours])

    def save_own_variables(self, store: Any) -> None:
        """Keras' ``save_weights`` hook: the placed copies (in the model's ``variables`` order)."""
        for i, v in enumerate(self.variables):
            store[str(i)] = v.numpy()

    def load_weights(self, filepath: Any, *args: Any, **kwargs: Any) -> None:
        """Keras' ``load_weights`` (placed copies and optimizer state).

        Raises
        ------
        ModelError
            If the file was not saved from a placement of the same model (Keras'
            own ``ValueError``, with this model's reason inside, is its cause).
        """
        try:
            super().load_weights(filepath, *args, **kwargs)
        except ValueError as e:
            raise ModelError(f"cannot load {os.fspath(filepath)!r} into {self.name!r}: {e}") from e

    def load_own_variables(self, store: Any) -> None:
        """Keras' ``load_weights`` hook (the inverse of :meth:`save_own_variables`)."""
        own = self.variables
        if len(store.keys()) != len(own):
            raise ModelError(f"the weights file holds {len(store.keys())} variables, this placed model has "
                             f"{len(own)}; load weights saved from a placement of the same model")
        for i, v in enumerate(own):
            v.assign(store[str(i)])

    def observed_placement(self, x: Any, y: Any = None, *, step: str = "predict") -> dict[str, str]:
        """Run one batch and return op name → device where it *actually* ran.

        ``step="predict"`` runs the forward pass; ``"train"`` runs one training
        step on ``(x, y)`` (it updates the variables, like one step of
        ``fit``); ``"test"`` one test step. Read from the runtime's partition
        graphs; ops Grappler fused or folded away do not appear (fused kernels
        keep one original op's name). The runtime reports partition graphs only
        when a function is instantiated, so this traces a fresh copy of the
        placed function for the run.
        """
        if step == "predict":
            emitted, args = self._forward(False), self._as_inputs(x)
        elif step in ("train", "test"):
            data = (x, y)
            emitted = self._step_function(step, tf.nest.map_structure(_spec_of, data))
            args = [tf.convert_to_tensor(a) for a in tf.nest.flatten(data)]
        else:
            raise UnsupportedError(f"unknown step {step!r}; choose 'predict', 'train' or 'test'")
        return observed_devices(emitted.function, args)

    @property
    def emitted(self) -> EmittedModel:
        """The placed function of the planned trace (its rewritten ``graph_def``, compressed edges)."""
        return self._placed.planned

    @property
    def compressed_edges(self) -> tuple[CompressedEdge, ...]:
        """The (tensor, receiving device) pairs of the planned function that travel in a narrow dtype."""
        return self._placed.planned.compressed

    # -- outputs -----------------------------------------------------------
    def report(self, path: str | os.PathLike) -> str:
        """Write the placement report (``.json`` data, ``.html`` page or ``.trace.json``) and return its path."""
        return self._placed.report.write(path)

    @property
    def report_data(self) -> dict[str, Any]:
        """The report as a dictionary (:meth:`placer.tf.report.Report.to_dict`)."""
        return self._placed.report.to_dict()

    def save_graph(self, path: str | os.PathLike) -> str:
        """Write the cost-annotated op graph and the devices as a graph file (``docs/graph-format.md``).

        ``placer.solve(*placer.load_graph(path), group_by=self.plan.group_by, ...)`` with the
        options of this placement re-plans it offline, without TensorFlow, and gives the same
        plan; returns the path.

        Examples
        --------
        >>> import keras, os, tempfile, placer
        >>> m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
        >>> placed = placer.autoplace(m, ["/CPU:0", "/CPU:1"], batch_size=2, time_limit_s=1)
        >>> path = placed.save_graph(os.path.join(tempfile.mkdtemp(), "ops.json"))
        >>> graph, devices = placer.load_graph(path)
        >>> again = placer.solve(graph, devices, group_by=placed.plan.group_by, time_limit_s=1)
        >>> again.assignment == placed.plan.assignment, again.value == placed.plan.value
        (True, True)
        """
        save_graph(path, self._placed.op_graph.graph, self._placed.devices)
        return os.fspath(path)

    def export(self, path: str | os.PathLike) -> str:
        """Save a SavedModel whose ``serving_default`` computes the placed outputs; returns the path.

        It carries its plan, op graph and placed GraphDef, so :func:`placer.load` can rebuild it on
        these or on other devices without the model's code (:mod:`placer.tf.export`).
        """
        p = self._placed
        return export_saved_model(self._forward(False), path, plan=p.plan, op_graph=p.op_graph.graph,
                                  devices=p.devices)

    def summary(self, *args: Any, **kwargs: Any) -> str:  # type: ignore[override]
        """The plan in words, with the last measurement if there is one (returned, not printed; Keras'
        layer table is the original model's)."""
        m = self._placed.measurement
        return self.plan.summary() + ("" if m is None else "\n" + m.summary())

    def measure(self, x: Any = None, y: Any = None, *, repeats: int = DEFAULT_REPEATS,
                warmup: int = DEFAULT_WARMUP, min_time_s: float = DEFAULT_MIN_TIME_S,
                seed: int = 0) -> StepMeasurement:
        """Time the placed step against the original model's, interleaved (measured, not predicted).

        The step is the one the plan was made for. For inference, the placed forward pass on ``x``
        against the original run as one graph function on the plan's first device. For a placement
        of the training step, one ``train_on_batch(x, y)`` of this model against one of a copy of the
        original (its current weights, the same compile settings, every variable on the plan's first
        device): Keras' own step on both sides. Training steps change weights, so every variable of
        this model (weights, optimizer slots and iterations, metric totals) is restored afterwards;
        the user's model is never touched.

        ``x=None`` (and ``y=None``): a random batch of the planning batch size
        (:func:`placer.tf.costs.random_batch`, ``seed``). Each call's outputs are fetched to the host,
        and the two alternate which goes first every round (:func:`placer.measure.steps.measure_steps`):
        ``repeats`` rounds after ``warmup``, and more until the timed ones took ``min_time_s``.
        The result, with the cost model's prediction beside it when the batch is the planning batch
        size, goes into :meth:`summary` and the report's ``measurements``.

        Raises
        ------
        TrainingError
            ``y`` for an inference placement, or only one of ``x`` and ``y`` for a training placement.

        Examples
        --------
        >>> import keras, numpy as np, placer
        >>> m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
        >>> placed = placer.autoplace(m, ["/CPU:0", "/CPU:1"], batch_size=2, time_limit_s=1)
        >>> result = placed.measure(np.ones((2, 4), "float32"), repeats=5, warmup=1, min_time_s=0)
        >>> len(result.placed_s), result.speedup > 0, result.prediction_error is not None
        (5, True, True)
        >>> placed.report_data["measurements"][0]["what"]
        'placed model'
        """
        repeats = integer("repeats", repeats, minimum=1, maximum=10**6)
        warmup = integer("warmup", warmup, minimum=0, maximum=10**6)
        min_time_s = real("min_time_s (seconds)", min_time_s, maximum=3600.0)
        rounds = {"repeats": repeats, "warmup": warmup, "min_time_s": min_time_s}
        p = self._placed
        if p.training:
            return self._record(self._measure_training(x, y, seed, rounds))
        if y is not None:
            raise TrainingError("y is for measuring a training step; this placement is for inference: "
                                "call measure(x), or place with training=True to time training")
        if x is None:
            x = random_batch(p.input_specs, p.plan.batch_size or 1, seed)
        args = self._as_inputs(x)
        fn = self._forward(False).function
        model, device = self._origin.model, p.plan.devices[0]

        def original_step(*xs: tf.Tensor) -> Any:
            with tf.device(device):
                return model(model_inputs(model, list(xs)), training=False)

        original = tf.function(original_step, input_signature=list(p.input_specs), autograph=False)
        placed_s, original_s = measure_steps(lambda *xs: self._run(fn, list(xs)), original, args, **rounds)
        batch = int(args[0].shape[0])
        predicted = p.plan.predicted_step_time_s if batch == p.plan.batch_size else None
        return self._record(StepMeasurement(tuple(placed_s), tuple(original_s), batch, device, predicted))

    def _record(self, result: StepMeasurement) -> StepMeasurement:
        p = self._placed
        p.measurement = result
        if p.report is not None:
            p.report = replace(p.report, measurements=result.report_entries())
        return result

    def _measure_training(self, x: Any, y: Any, seed: int, rounds: dict[str, Any]) -> StepMeasurement:
        """:meth:`measure` of a training placement: ``train_on_batch`` here and on a one-device twin."""
        p = self._placed
        if (x is None) != (y is None):
            raise TrainingError("measure() of a training placement takes both x and y (a batch and its "
                                "targets), or neither (a random batch of the planning size)")
        if x is None:
            specs = tf.nest.flatten(p.data_structure)
            x, y = tf.nest.pack_sequence_as(p.data_structure, random_batch(specs, p.plan.batch_size or 1, seed))
        device = p.plan.devices[0]
        twin = one_device_twin(self._origin.model, self.get_weights(), *self._compile_settings, device)
        state = [*self.variables, *self.optimizer.variables, *self.metrics_variables]
        saved = [v.numpy() for v in state]

        def original() -> Any:
            with tf.device(device):
                return twin.train_on_batch(x, y)

        try:
            placed_s, original_s = measure_steps(lambda: self.train_on_batch(x, y), original, (), **rounds)
        finally:  # the measurement trained this model: put every variable back
            for v, value in zip(state, saved):
                v.assign(value)
        batch = int(tf.nest.flatten(x)[0].shape[0])
        # with data-parallel groups the plan is one group's step on its share of the batch: no prediction for
        # the whole (micro-batches alone are replicas on one group: the plan predicts their pipelined step)
        predicted = (p.plan.predicted_step_time_s
                     if batch == p.plan.batch_size and len(set(self._replica_groups)) <= 1 else None)
        return StepMeasurement(tuple(placed_s), tuple(original_s), batch, device, predicted, step="train")

    def get_config(self) -> dict[str, Any]:
        raise UnsupportedError("a PlacedModel cannot be saved as a .keras file; use placed.export(path) for a "
                               "SavedModel, save_weights(...) for its weights, or placed.plan.save(...) for the plan")

    def __repr__(self) -> str:
        if self._placement is None:
            return f"<PlacedModel {self.name!r}: not placed>"
        return f"<PlacedModel {self.name!r}: {len(self.plan.assignment)} ops on {len(self.plan.devices)} devices>"

