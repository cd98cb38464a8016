"""The object :func:`placer.autoplace` returns: a ``keras.Model`` whose steps run placed functions.

:class:`PlacedModel` subclasses ``keras.Model`` and overrides only
``train_step``, ``test_step`` and ``__call__`` (which ``predict_step``
uses). Each runs a placed function: a trace of the user's model — or of
Keras' *own* ``train_step``/``test_step`` on it — rewritten op by op onto
the planned devices (:mod:`placer.tf.emit`). Keras keeps its job:
``fit``, ``evaluate`` and ``predict`` with their data handling, callbacks,
progress bar, ``History``, validation and ``save_weights``/``load_weights``
are Keras' own, so the logs are the ones ``model.fit`` gives.

Before placement, the model is a *shell*: it calls the user's model (held
untracked, never modified), and its compiled optimizer and metrics are built
on the user's variables, so that tracing Keras' step captures exactly the
state ``model.fit`` would use (:meth:`PlacedModel.trace`). The emit stage
then creates every variable on its planned device and emits the planned
function (:mod:`placer.tf.placement`), and hands the shell one frozen
:class:`~placer.tf.placement.Placement` (:meth:`PlacedModel.attach`); the
placed model reads everything from it and delegates the rest: the functions
to :class:`~placer.tf.placement.PlacedFunctions`, exports to
:mod:`placer.tf.export`, measurements to :mod:`placer.tf.measuring`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
from dataclasses import replace
from typing import Any, Iterator, Mapping, Sequence

import keras
import tensorflow as tf

from ..core.graph_io import save_graph
from ..core.plan import Plan
from ..core.validate import integer, real
from ..errors import InputSignatureError, ModelError, TrainingError, UnsupportedError
from ..measure.steps import DEFAULT_MIN_TIME_S, DEFAULT_REPEATS, DEFAULT_WARMUP, StepMeasurement
from .codecs import CompressedEdge
from .emit import EmittedModel, observed_devices
from .export import WholeGraphs, export_saved_model
from .measuring import measure_forward, measure_training
from .placement import Placement, ReplicatedVariable
from .replicas import replicated_train_step
from .report import Report
from .trace import TracedModel, input_keys, model_inputs, random_batch, trace_model, trace_step

log = logging.getLogger(__name__)


def _spec_of(t: Any) -> tf.TensorSpec:
    shape = tf.TensorShape(t.shape)
    if shape.rank is None:
        raise InputSignatureError(f"a batch element of unknown rank ({t.dtype}, shape {shape}) cannot be "
                                  "placed: give inputs and labels of known rank (a tf.data pipeline can set them "
                                  "with dataset.map(lambda x, y: (tf.ensure_shape(x, ...), tf.ensure_shape(y, ...))))")
    return tf.TensorSpec((None, *shape[1:]), t.dtype)


@contextlib.contextmanager
def _shapes_said(what: str) -> Iterator[None]:
    """TensorFlow's "Incompatible shapes" inside a placed step (labels of another shape than the outputs, in a
    batch whose shapes Keras had relaxed to unknown, so that tracing could not tell) as an InputSignatureError.
    The failing op computes the loss or its gradient, before any update."""
    try:
        yield
    except tf.errors.InvalidArgumentError as e:
        if "Incompatible shapes" not in str(e):
            raise
        shapes = next((ln.strip() for ln in str(e).splitlines() if "Incompatible shapes" in ln), "")
        raise InputSignatureError(f"{what}: a batch does not fit the model ({shapes}): check that the labels have "
                                  "the shape of the model's outputs (or of the targets it was placed with)") from e


def _check_callbacks(callbacks: Any) -> None:
    """Refuse, before any update, a callback that could only fail after the first epoch: a ``ModelCheckpoint``
    of the whole model to ``.keras`` (a placed model saves its weights, not a ``.keras`` file)."""
    for cb in callbacks or ():
        if isinstance(cb, keras.callbacks.ModelCheckpoint) and not cb.save_weights_only:
            raise UnsupportedError(f"ModelCheckpoint({cb.filepath!r}) saves the whole model as a .keras file, which a "
                                   "PlacedModel cannot be; use ModelCheckpoint(path ending in '.weights.h5', "
                                   "save_weights_only=True)")


class _Origin:
    """Holds the user's model where Keras does not look (not a Keras object, not a container)."""

    __slots__ = ("model",)

    def __init__(self, model: Any) -> None:
        self.model = model


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
        object.__setattr__(self, "_compile_settings", (None, None))
        object.__setattr__(self, "_measurement", None)
        object.__setattr__(self, "_resets", None)  # (metrics' ids, the graph function resetting them)

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

    def known_variables(self) -> list[Any]:
        """Every variable a trace of this shell may capture (the user's model's, and when compiled the
        optimizer's and the metrics')."""
        return self.training_variables() if self.compiled else list(self._origin.model.variables)

    def source_model(self) -> Any:
        """The user's model (read, never written; a method, not a property: Keras' saving walk reads every
        attribute, and must never reach the user's variables)."""
        return self._origin.model

    def trace(self, step: str, data_structure: Any, batch_size: int | None, *,
              replica_groups: Sequence[Sequence[str]] = ()) -> TracedModel:
        """Trace Keras' ``train_step``/``test_step`` of this shell (:func:`placer.tf.trace.trace_step`).

        ``replica_groups``: the training step in those replicas instead
        (:func:`placer.tf.replicas.replicated_train_step`).
        """
        body = functools.partial(replicated_train_step, groups=replica_groups) if replica_groups else None
        with self._tracing_source():
            return trace_step(self, step, data_structure, batch_size=batch_size,
                              known_variables=self.known_variables(), body=body)

    def trace_step(self, step: str, data_structure: Any,
                   replica_groups: Sequence[Sequence[str]] = ()) -> TracedModel:
        """Keras' step on one batch structure, traced for any batch (what a placed step runs)."""
        return self.trace(step, data_structure, None, replica_groups=replica_groups)

    def trace_forward(self, input_specs: Sequence[tf.TensorSpec], batch_size: int, training: bool) -> TracedModel:
        """The user's model's forward pass (:func:`placer.tf.trace.trace_model`), sized at ``batch_size``."""
        return trace_model(self._origin.model, input_signature=list(input_specs), batch_size=batch_size,
                           training=training)

    # -- placement -------------------------------------------------------------
    def attach(self, placement: Placement) -> None:
        """Take the placement the emit stage made (once; :func:`placer.autoplace` calls it).

        Raises
        ------
        UnsupportedError
            If this model was placed already.
        """
        if self._placement is not None:
            raise UnsupportedError("this PlacedModel is placed already; call placer.autoplace again")
        object.__setattr__(self, "_placement", placement)
        self.built = True

    @property
    def placement(self) -> Placement:
        """The placement record (plan, devices, op graph, variables, functions, report)."""
        return self._placed

    @property
    def _placed(self) -> Placement:
        if self._placement is None:
            raise UnsupportedError("this model is not placed yet; use placer.autoplace(model, devices)")
        return self._placement

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
        return [self._placement.variables[id(v)] for v in source_variables]

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
        return self._placed.functions.forward(False).function

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
        return self._run(self._placed.functions.forward(training).function, self._as_inputs(x))

    def _run_step(self, step: str, data: Any) -> Any:
        if isinstance(data, tuple):  # train_on_batch / test_on_batch pass (x, y, None): drop what is absent
            data = keras.utils.pack_x_y_sample_weight(*keras.utils.unpack_x_y_sample_weight(data))
        structure = tf.nest.map_structure(_spec_of, data)
        try:
            return self._run(self._placed.functions.step(step, structure).function, tf.nest.flatten(data))
        finally:
            if step == "train" and tf.executing_eagerly():
                self._mark_trained()

    def _run(self, fn: Any, args: Sequence[Any]) -> Any:
        """``fn(*args)``; watched when it runs eagerly (inside Keras' functions the watch is on those)."""
        if tf.executing_eagerly():
            return self._placed.watchdog.call(fn, *args)
        return fn(*args)

    # Keras runs fit/evaluate/predict through these functions: each is watched like a direct call.
    def make_train_function(self, force: bool = False) -> Any:  # noqa: D102
        super().make_train_function(force)
        self.train_function = self._trained(self._watched(self.train_function))
        return self.train_function

    def reset_metrics(self) -> None:
        """Keras' ``reset_metrics``, done where the metric variables live before this returns.

        Keras resets metrics eagerly before ``train_on_batch``/``test_on_batch`` and each epoch. On a worker those
        writes are queued, and the placed step called next reaches the worker another way and could overtake
        them: one ``train_on_batch`` in 20 reported half its loss (the count's reset landed after the step's
        update). A placed model therefore resets its metrics in one graph function (every metric's
        ``reset_state``, then each device's last reset variable read back) and fetches its result: one call
        instead of an eager write per variable and a read per device (on a gRPC worker 4.7–5.6 ms a
        ``train_on_batch`` instead of 5.9–7.0 ms, 2026-12-06).
        """
        if self._placement is None or self._tracing or not tf.executing_eagerly():
            super().reset_metrics()
            return
        metrics = tuple(self.metrics)
        key = tuple(id(m) for m in metrics)
        if self._resets is None or self._resets[0] != key:
            last = list({v.value.device: v for metric in metrics for v in metric.variables}.values())

            @tf.function(autograph=False)
            def reset() -> list[tf.Tensor]:
                for metric in metrics:
                    metric.reset_state()
                return [tf.identity(v.value) for v in last]  # after the writes (automatic control dependencies)

            object.__setattr__(self, "_resets", (key, reset))
        for t in self._resets[1]():  # fetched: the resets are done on every device
            t.numpy()

    def _mark_trained(self) -> None:
        """Note that a placed training step ran: each placed weight with shards gathers them on its next read
        (:meth:`ReplicatedVariable.mark_trained`)."""
        for v in self._placement.variables.values():  # the optimizer's sharded slots too
            if isinstance(v, ReplicatedVariable):
                v.mark_trained()

    def _trained(self, fn: Any) -> Any:
        """``fn`` (Keras' train function), then :meth:`_mark_trained` (``fn`` itself where no weight has
        shards or mirrors: nothing to note)."""
        if fn is None or self._placement is None or not any(isinstance(v, ReplicatedVariable)
                                                            for v in self.variables):
            return fn

        def train(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            finally:
                self._mark_trained()
        return train

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
        _check_callbacks(kwargs.get("callbacks"))
        try:
            with _shapes_said("fit"):
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
        with _shapes_said("evaluate"):
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
            If the file does not exist, or was not saved from a placement of the same model (Keras'
            own ``ValueError``, with this model's reason inside, is its cause).
        """
        if isinstance(filepath, (str, os.PathLike)) and not os.path.exists(filepath):
            raise ModelError(f"cannot load {os.fspath(filepath)!r} into {self.name!r}: no such file (save it with "
                             "placed.save_weights(path) first)")
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
            emitted, args = self._placed.functions.forward(False), self._as_inputs(x)
        elif step in ("train", "test"):
            data = (x, y)
            emitted = self._placed.functions.step(step, tf.nest.map_structure(_spec_of, data))
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
    @property
    def _report(self) -> Report:
        """The placement's report, with the last measurement in it."""
        report, m = self._placed.report, self._measurement
        return report if m is None else replace(report, measurements=m.report_entries())

    def report(self, path: str | os.PathLike) -> str:
        """Write the placement report (``.json`` data, ``.html`` page or ``.trace.json``) and return its path."""
        return self._report.write(path)

    @property
    def report_data(self) -> dict[str, Any]:
        """The report as a dictionary (:meth:`placer.tf.report.Report.to_dict`)."""
        return self._report.to_dict()

    def save_graph(self, path: str | os.PathLike) -> str:
        """Write the cost-annotated op graph and the devices as a graph file (``docs/graph-format.md``).

        The file carries the options this placement was planned with (``plan_options``), so
        ``placer.solve(*placer.load_graph(path))`` re-plans it offline, without TensorFlow, and gives the
        same plan (micro-batches apart: ``autoplace`` pipelines the plan after solving); returns the path.

        Examples
        --------
        >>> import keras, os, tempfile, placer
        >>> m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
        >>> placed = placer.autoplace(m, ["/CPU:0", "/CPU:1"], batch_size=2, time_limit_s=1)
        >>> path = placed.save_graph(os.path.join(tempfile.mkdtemp(), "ops.json"))
        >>> graph, devices = placer.load_graph(path)
        >>> again = placer.solve(graph, devices)
        >>> again.assignment == placed.plan.assignment, again.value == placed.plan.value
        (True, True)
        """
        p = self._placed
        options = {f.name: getattr(p.plan_options, f.name) for f in dataclasses.fields(p.plan_options)}
        save_graph(path, p.op_graph.graph, p.devices, plan_options=options)
        return os.fspath(path)

    def export(self, path: str | os.PathLike) -> str:
        """Save a SavedModel whose ``serving_default`` computes the placed outputs; returns the path.

        It carries its plan, op graph and placed GraphDef, so :func:`placer.load` can rebuild it on
        these or on other devices without the model's code (:mod:`placer.tf.export`).
        """
        p = self._placed
        forward = p.functions.forward(False)
        whole = None if p.whole_op_graph is None or forward.source_graph_def is None else WholeGraphs(
            forward.source_graph_def, p.whole_op_graph.graph, p.split_ops)
        return export_saved_model(forward, path, plan=p.plan, op_graph=p.op_graph.graph, devices=p.devices,
                                  whole=whole)

    def summary(self, *args: Any, **kwargs: Any) -> str:  # type: ignore[override]
        """The plan in words, with the last measurement if there is one (returned, not printed; Keras'
        layer table is the original model's)."""
        m = self._measurement
        return self.plan.summary() + ("" if m is None else "\n" + m.summary())

    def measure(self, x: Any = None, y: Any = None, *, repeats: int = DEFAULT_REPEATS,
                warmup: int = DEFAULT_WARMUP, min_time_s: float = DEFAULT_MIN_TIME_S,
                seed: int = 0) -> StepMeasurement:
        """Time the placed step against the original model's, interleaved (measured, not predicted).

        The step is the one the plan was made for. For inference, the placed forward pass on ``x``
        against the original run as one graph function with every op and a copy of every weight on the
        plan's first device. For a placement of the training step, one training step on ``(x, y)`` of this
        model against one of a copy of the original (its current weights, the same compile settings,
        every variable on the plan's first device): Keras' own step on both sides, as ``fit`` runs it
        (:func:`placer.tf.measuring.fit_step`: no metric reset per step, which ``train_on_batch`` adds:
        2–4 ms a call on a gRPC worker). Training steps change
        weights, so every variable of this model (weights, optimizer slots and iterations, metric totals) is
        restored afterwards; the user's model is never touched (:mod:`placer.tf.measuring`).

        ``x=None`` (and ``y=None``): a random batch of the planning batch size
        (:func:`placer.tf.trace.random_batch`, ``seed``; ids below their tables' rows, as profiled). Each call's
        outputs are fetched to the host, and the two alternate which goes first every round
        (:func:`placer.measure.steps.measure_steps`): ``repeats`` rounds after ``warmup``, and more until the
        timed ones took ``min_time_s``. The result, with the cost model's prediction beside it when the batch
        is the planning batch size, goes into :meth:`summary` and the report's ``measurements``.

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
        device = p.plan.devices[0]
        if p.training:
            if (x is None) != (y is None):
                raise TrainingError("measure() of a training placement takes both x and y (a batch and its "
                                    "targets), or neither (a random batch of the planning size)")
            if x is None:
                specs = tf.nest.flatten(p.data_structure)
                x, y = tf.nest.pack_sequence_as(p.data_structure, random_batch(specs, p.plan.batch_size or 1, seed,
                                                                               p.index_bounds))
            batch = int(tf.nest.flatten(x)[0].shape[0])
            predicted = p.plan.predicted_step_time_s if batch == self._predicted_batch() else None
            result = measure_training(self, self._origin.model, self._compile_settings, device, x, y, predicted,
                                      rounds)
        else:
            if y is not None:
                raise TrainingError("y is for measuring a training step; this placement is for inference: "
                                    "call measure(x), or place with training=True to time training")
            if x is None:
                x = random_batch(p.input_specs, p.plan.batch_size or 1, seed, p.index_bounds)
            args = self._as_inputs(x)
            fn = p.functions.forward(False).function
            batch = int(args[0].shape[0])
            predicted = p.plan.predicted_step_time_s if batch == p.plan.batch_size else None
            result = measure_forward(lambda xs: self._run(fn, xs), p.functions.forward_trace(False), device, args,
                                     predicted, rounds)
        object.__setattr__(self, "_measurement", result)
        return result

    def _predicted_batch(self) -> int | None:
        """The batch of the step the plan's ``predicted_step_time_s`` is for (``None``: it covers no whole step).

        Micro-batches alone (replicas on one group): the plan predicts their pipelined step, of its batch. Data-
        parallel copies of one device each, chosen on the full batch's trace (``replicas="auto"``, or asked with
        one device per copy): the plan is one copy's, of its share of the batch, and predicts the copies' whole
        step (its kept candidate runs that many copies). Copies of several devices each: the plan predicts one
        copy's step alone."""
        p = self._placed
        copies = len(set(p.replica_groups))
        if copies <= 1:
            return p.plan.batch_size
        kept = p.plan.kept
        whole = kept is not None and kept.replicas == copies == len(p.replica_groups)
        return p.plan.batch_size * copies if whole and p.plan.batch_size else None

    def get_config(self) -> dict[str, Any]:
        raise UnsupportedError("a PlacedModel cannot be saved as a .keras file; use placed.export(path) for a "
                               "SavedModel, save_weights(...) for its weights, or placed.plan.save(...) for the plan")

    def __repr__(self) -> str:
        if self._placement is None:
            return f"<PlacedModel {self.name!r}: not placed>"
        return f"<PlacedModel {self.name!r}: {len(self.plan.assignment)} ops on {len(self.plan.devices)} devices>"
