"""``placed.measure``: the placed step against what runs on one device, interleaved (measured, not predicted).

The baseline is what a user would run instead on the plan's first device,
with its variables *there* (a model whose weights stay in the client
process reads every weight over the link on every call: on two gRPC
workers that made the original look 1.5× slower than it is):

* inference: :func:`one_device_original`, the original's forward pass as
  one graph function with every op and a copy of every weight on the
  device, imported the way the placed function is (:mod:`placer.tf.emit`);
* training: :func:`one_device_twin`, a copy of the original (its current
  weights, the same compile settings, every variable on the device) trained
  one Keras step at a time as ``fit`` runs them (:func:`fit_step`), as the
  placed model is. ``train_on_batch`` would add its metric resets to both
  sides (eager writes on the worker, ~1 ms; on the placed model also the wait
  for them, 2–3 ms on a gRPC worker, ``PlacedModel.reset_metrics``): ``fit``
  resets once an epoch, not once a step.

On both sides the inputs are fed from this process and the outputs fetched
to it; :func:`placer.measure.steps.measure_steps` alternates which goes
first. The report names each side (``setup``).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import keras
import numpy as np
import tensorflow as tf

from ..measure.steps import StepMeasurement, measure_steps
from .emit import PlacedFunction, emit, rewrite_context
from .graphdef import tf_variable
from .trace import TracedModel
from .training import fresh_copy

#: What the inference baseline is, for the report (the device is filled in).
FORWARD_SETUP = ("the original model as one graph function, every op and a copy of every weight on {device}; "
                 "inputs fed from and outputs fetched to this process")
#: ... and the training baseline.
TRAINING_SETUP = ("a copy of the original model with every variable on {device}, one Keras training step as fit "
                  "runs it (its train function, no metric reset); inputs fed from and logs fetched to this process")


def one_device_original(traced: TracedModel, device: str) -> tuple[PlacedFunction, tuple[tf.Variable, ...]]:
    """The forward pass of ``traced`` as one graph function with every op on ``device``, reading a copy of
    every weight made there: ``(function, the copies)``. Imported like a placed function (the same
    rewrites, the same import), so the two differ only in where their ops and variables are.

    Examples
    --------
    >>> import keras
    >>> from placer.tf.trace import trace_model
    >>> m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    >>> fn, copies = one_device_original(trace_model(m, batch_size=2), "/CPU:0")
    >>> [v.device.endswith("CPU:0") for v in copies], tuple(fn(tf.ones((2, 4))).shape)
    ([True, True], (2, 3))
    """
    with tf.device(device):
        copies = {ph: tf.Variable(tf_variable(v).read_value(), trainable=False, name=ph.rpartition("/")[2])
                  for ph, v in traced.variables.items()}
    ops = {op.name: device for op in traced.dynamic.graph.get_operations()}
    emitted = emit(traced, copies, rewrite_context(traced, ops))
    return emitted.function, tuple(copies.values())


def copy_per_device(model: Any, devices: Sequence[str]) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """Data parallelism as a user writes it by hand: a clone of ``model`` (its weights copied) on each of
    ``devices``, each running its part of the batch (split evenly by ``tf.split``: the batch must divide),
    the outputs joined on the caller; ``(the tf.function, the clones)``. The baseline
    ``benchmarks/strategy.py`` and ``examples/two_workers.py`` measure autoplace's copies against.

    Examples
    --------
    >>> import keras, numpy as np
    >>> m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    >>> fn, clones = copy_per_device(m, ["/CPU:0", "/CPU:0"])
    >>> x = np.ones((4, 4), "float32")
    >>> len(clones), bool(np.allclose(fn(x).numpy(), m(x).numpy()))
    (2, True)
    """
    clones = []
    for device in devices:
        with tf.device(device):
            clone = keras.models.clone_model(model)
            clone.set_weights(model.get_weights())
        clones.append(clone)

    @tf.function(autograph=False)
    def step(x: Any) -> Any:
        outs = []
        for device, clone, part in zip(devices, clones, tf.split(x, len(devices))):
            with tf.device(device):
                outs.append(clone(part, training=False))
        return tf.concat(outs, axis=0)

    return step, tuple(clones)


def one_device_twin(model: Any, weights: Sequence[Any], compile_kwargs: Mapping[str, Any] | None,
                    compile_config: Mapping[str, Any] | None, device: str) -> Any:
    """A clone of ``model`` with ``weights``, every variable on ``device``, compiled with the given settings
    (fresh optimizer and metrics): what one device trains."""
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


def measure_forward(run_placed: Callable[[list[tf.Tensor]], Any], traced: TracedModel, device: str,
                    args: Sequence[tf.Tensor], predicted_s: float | None,
                    rounds: Mapping[str, Any]) -> StepMeasurement:
    """The placed forward pass (``run_placed(inputs)``) against :func:`one_device_original` of ``traced`` on
    ``device``, on ``args``; ``rounds``: :func:`~placer.measure.steps.measure_steps`' keywords."""
    original, _copies = one_device_original(traced, device)  # the copies live as long as the timing
    placed_s, original_s = measure_steps(lambda *xs: run_placed(list(xs)), original, args, **rounds)
    return StepMeasurement(tuple(placed_s), tuple(original_s), int(args[0].shape[0]), device, predicted_s,
                           setup=FORWARD_SETUP.format(device=device))


def fit_step(model: Any, x: Any, y: Any) -> list[Any]:
    """One training step of ``model`` (compiled) on the batch ``(x, y)`` as Keras' ``fit`` runs it: its train
    function on that batch, the logs fetched to this process (returned, flattened). Unlike ``train_on_batch`` it
    does not reset the metrics first (``fit`` resets them once an epoch), so they accumulate over calls.

    Examples
    --------
    >>> import keras, numpy as np
    >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    >>> m.compile(optimizer="sgd", loss="mse")
    >>> logs = fit_step(m, np.ones((4, 3), "float32"), np.zeros((4, 1), "float32"))
    >>> len(logs), logs[0].shape
    (1, ())
    """
    model.make_train_function()

    def data() -> Any:
        yield (x, y, None)

    return [np.asarray(v) for v in tf.nest.flatten(model.train_function(data()))]


def measure_training(placed: Any, model: Any, compile_settings: tuple[Mapping[str, Any] | None,
                                                                      Mapping[str, Any] | None],
                     device: str, x: Any, y: Any, predicted_s: float | None,
                     rounds: Mapping[str, Any]) -> StepMeasurement:
    """One training step of ``placed`` (:func:`fit_step`) against one of a one-device twin of ``model`` on
    ``device``.

    The measurement trains ``placed``: every variable of it (weights, optimizer slots and iterations,
    metric totals) is put back afterwards; the user's ``model`` is never touched.
    """
    twin = one_device_twin(model, placed.get_weights(), *compile_settings, device)
    state = [*placed.variables, *placed.optimizer.variables, *placed.metrics_variables]
    saved = [v.numpy() for v in state]

    def original() -> Any:
        with tf.device(device):
            return fit_step(twin, x, y)

    try:
        placed_s, original_s = measure_steps(lambda: fit_step(placed, x, y), original, (), **rounds)
    finally:  # the measurement trained the placed model: put every variable back
        for v, value in zip(state, saved):
            v.assign(value)
    batch = int(tf.nest.flatten(x)[0].shape[0])
    return StepMeasurement(tuple(placed_s), tuple(original_s), batch, device, predicted_s, step="train",
                           setup=TRAINING_SETUP.format(device=device))
