"""``placed.measure``: the placed step against what runs on one device, interleaved (measured, not predicted).

For inference, the placed forward pass against the original model run as
one graph function on the plan's first device; for a placement of the
training step, one ``train_on_batch`` of the placed model against one of a
copy of the original (:func:`one_device_twin`: its current weights, the same
compile settings, every variable on the plan's first device): Keras' own
step on both sides. Both are timed by
:func:`placer.measure.steps.measure_steps` (each call's outputs fetched, the
two alternating which goes first).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import keras
import tensorflow as tf

from ..measure.steps import StepMeasurement, measure_steps
from .trace import model_inputs
from .training import fresh_copy


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


def measure_forward(run_placed: Callable[[list[tf.Tensor]], Any], model: Any,
                    input_specs: Sequence[tf.TensorSpec], device: str, args: Sequence[tf.Tensor],
                    predicted_s: float | None, rounds: Mapping[str, Any]) -> StepMeasurement:
    """The placed forward pass (``run_placed(inputs)``) against ``model`` run on ``device`` as one graph
    function, on ``args``; ``rounds``: :func:`~placer.measure.steps.measure_steps`' keywords."""

    def original_step(*xs: tf.Tensor) -> Any:
        with tf.device(device):
            return model(model_inputs(model, list(xs)), training=False)

    original = tf.function(original_step, input_signature=list(input_specs), autograph=False)
    placed_s, original_s = measure_steps(lambda *xs: run_placed(list(xs)), original, args, **rounds)
    return StepMeasurement(tuple(placed_s), tuple(original_s), int(args[0].shape[0]), device, predicted_s)


def measure_training(placed: Any, model: Any, compile_settings: tuple[Mapping[str, Any] | None,
                                                                      Mapping[str, Any] | None],
                     device: str, x: Any, y: Any, predicted_s: float | None,
                     rounds: Mapping[str, Any]) -> StepMeasurement:
    """``placed.train_on_batch(x, y)`` against the same on a one-device twin of ``model`` on ``device``.

    The measurement trains ``placed``: every variable of it (weights, optimizer slots and iterations,
    metric totals) is put back afterwards; the user's ``model`` is never touched.
    """
    twin = one_device_twin(model, placed.get_weights(), *compile_settings, device)
    state = [*placed.variables, *placed.optimizer.variables, *placed.metrics_variables]
    saved = [v.numpy() for v in state]

    def original() -> Any:
        with tf.device(device):
            return twin.train_on_batch(x, y)

    try:
        placed_s, original_s = measure_steps(lambda: placed.train_on_batch(x, y), original, (), **rounds)
    finally:  # the measurement trained the placed model: put every variable back
        for v, value in zip(state, saved):
            v.assign(value)
    batch = int(tf.nest.flatten(x)[0].shape[0])
    return StepMeasurement(tuple(placed_s), tuple(original_s), batch, device, predicted_s, step="train")
