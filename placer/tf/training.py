"""Stage trace, for training: the compile settings and the traced training step of a placed model.

The training step placed is Keras' own ``train_step`` on a shell
:class:`~placer.tf.placed_model.PlacedModel` that calls the user's model,
compiled with the user's settings (fresh optimizer and metric objects with
the same configuration): forward, loss (with loss weights and the model's
regularisation losses), gradients, the optimizer's update and the metric
updates, exactly what ``model.fit`` runs.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping, Sequence

import keras
import numpy as np
import tensorflow as tf

from ..errors import InputSignatureError, TrainingError, UnsupportedError
from .trace import TracedModel, _normalise_specs, as_spec, check_model, is_shape, model_inputs, with_batch

def fresh_copy(obj: Any) -> Any:
    """A fresh Keras object with ``obj``'s configuration (strings and callables are kept)."""
    if isinstance(obj, (str, type(None))) or not hasattr(obj, "get_config"):
        return obj
    return keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(obj))


#: Compile settings a placed step cannot honour, and what they become.
_PLACED_COMPILE = {"jit_compile": False, "run_eagerly": False, "steps_per_execution": 1}


def compile_settings(model: Any, *, optimizer: Any = None, loss: Any = None, metrics: Any = None,
                     loss_weights: Any = None) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """``(compile kwargs, None)`` from the options, or ``(None, compile config)`` from the compiled model.

    Optimizer and metric objects are copied (same configuration, fresh
    state): the user's objects are never shared with the placed model.

    Raises
    ------
    TrainingError
        The model is not compiled and no optimizer/loss is given, or only one
        of the two is given.
    UnsupportedError
        The model overrides ``train_step``/``test_step`` (autoplace places
        Keras' own steps and would silently ignore the override).

    Examples
    --------
    >>> import keras
    >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    >>> kwargs, config = compile_settings(m, optimizer="sgd", loss="mse")
    >>> kwargs["loss"], config
    ('mse', None)
    """
    for step in ("train_step", "test_step"):
        if getattr(type(model), step) is not getattr(keras.Model, step):
            raise UnsupportedError(
                f"model {model.name!r} overrides {step}; autoplace places Keras' own {step} and would ignore "
                "yours. Move the custom logic into the loss or layers, or place for inference only")
    if optimizer is None and loss is None:
        config = model.get_compile_config() if getattr(model, "compiled", False) else None
        if not config or config.get("optimizer") is None or config.get("loss") is None:
            raise TrainingError(
                f"model {model.name!r} is not compiled with an optimizer and a loss; call "
                "model.compile(optimizer=..., loss=...) first or pass optimizer= and loss= to autoplace")
        return None, {**config, **_PLACED_COMPILE}
    if optimizer is None or loss is None:
        raise TrainingError("give both optimizer= and loss= (or neither, to use the model's compile settings)")
    copied_metrics = None if metrics is None else tf.nest.map_structure(fresh_copy, metrics)
    return {"optimizer": fresh_copy(keras.optimizers.get(optimizer)), "loss": fresh_copy(loss),
            "metrics": copied_metrics, "loss_weights": loss_weights, **_PLACED_COMPILE}, None


def check_replicable(model: Any, replicas: int, batch_size: int, what: str = "replicas",
                     split_batch_norm: bool = False) -> None:
    """Refuse ``replicas`` (or ``microbatches``: ``what``) that would not give the math of one full-batch step.

    Raises
    ------
    TrainingError
        ``replicas`` not dividing the batch, or a model with batch normalization (each replica would
        normalise by its own part's statistics and update the moving
        statistics once per replica: not the full-batch step) unless ``split_batch_norm`` accepts that.
    """
    if replicas == 1:
        return
    if batch_size % replicas:
        raise TrainingError(f"{what}={replicas} does not divide the batch size {batch_size}; use a batch size "
                            f"that is a multiple of {replicas}")
    bn = [layer.name for layer in model._flatten_layers(include_self=False)  # noqa: SLF001
          if type(layer).__name__ == "BatchNormalization"]
    if bn and not split_batch_norm:
        part = "replica" if what == "replicas" else "micro-batch"
        raise TrainingError(
            f"{what}={replicas} with batch normalization ({bn[:3]}) would not be the full-batch step: each "
            f"{part} normalises by its part's statistics and updates the moving statistics once per {part}. "
            f"Train with {what}=1, replace BatchNormalization (e.g. LayerNormalization), or pass "
            "split_batch_norm=True to accept per-part statistics (GPipe's semantics)")


def _target_specs(model: Any, x_specs: Sequence[tf.TensorSpec], batch: int, targets: Any) -> Any:
    """The labels' structure: given by the user, else one per model output with its shape and dtype."""
    if targets is not None:
        if isinstance(targets, tf.TensorSpec) or (isinstance(targets, tuple) and is_shape(targets)):
            return with_batch(as_spec(targets, "targets"), None)
        if isinstance(targets, Mapping):  # by output name, as a dict-output model takes its labels
            names = list(getattr(model, "output_names", None) or [])
            unknown = sorted(set(map(str, targets)) - set(names)) if names else []
            if unknown:
                raise InputSignatureError(f"targets names outputs {unknown} that model {model.name!r} does not "
                                          f"have; its outputs are {names}")
            return {k: with_batch(as_spec(s, f"targets[{k!r}]"), None) for k, s in targets.items()}
        if not isinstance(targets, (list, tuple)):
            raise InputSignatureError(f"targets must be a tf.TensorSpec, a shape tuple, or a list or dict of them "
                                      f"(one per output), got {type(targets).__name__}")
        return [with_batch(as_spec(s, "targets"), None) for s in targets]
    fn = tf.function(lambda *xs: model(model_inputs(model, xs), training=False), autograph=False)
    out = fn.get_concrete_function(*[with_batch(s, batch) for s in x_specs]).structured_outputs
    # Unnamed: an output tensor's name ("Identity:0") is no valid placeholder name.
    return tf.nest.map_structure(lambda t: tf.TensorSpec((None, *t.shape[1:]), t.dtype), out)


def trace_training(shell: Any, model: Any, *, batch_size: int | None, input_signature: Sequence[Any] | None,
                   targets: Any, optimizer: Any, loss: Any, metrics: Any, loss_weights: Any,
                   replicas: int = 1, split_batch_norm: bool = False) -> tuple[TracedModel, tuple[tf.TensorSpec, ...]]:
    """Compile ``shell`` (a new :class:`~placer.tf.placed_model.PlacedModel` of ``model``) like ``model`` and
    trace its training step at the planning batch size.

    Returns the traced step and the model's input specs (unknown batch); the
    shell is placed later (the emit stage). With ``replicas``, the planning
    trace is one replica's step: ``batch_size / replicas`` rows (``split_batch_norm``: see
    :func:`check_replicable`).

    Raises
    ------
    ModelError, InputSignatureError, TrainingError, UnsupportedError
    """
    check_model(model)
    x_specs, batch = _normalise_specs(model, input_signature, batch_size)
    check_replicable(model, replicas, batch, split_batch_norm=split_batch_norm)
    batch //= replicas
    kwargs, config = compile_settings(model, optimizer=optimizer, loss=loss, metrics=metrics,
                                      loss_weights=loss_weights)
    y_struct = _target_specs(model, x_specs, batch, targets)
    x_struct = x_specs[0] if len(x_specs) == 1 else list(x_specs)

    def zeros(s: tf.TensorSpec) -> np.ndarray:
        return np.zeros((batch, *s.shape[1:]), s.dtype.as_numpy_dtype)

    try:
        shell.prepare_training(kwargs, config, tf.nest.map_structure(zeros, (x_struct, y_struct)))
    except (TypeError, ValueError) as e:
        shapes = tf.nest.map_structure(lambda s: (None, *s.shape[1:]), y_struct)
        raise InputSignatureError(
            f"the loss or metrics of {model.name!r} cannot take labels of shapes {shapes}: {e}. Pass "
            "targets= with the labels' shapes and dtypes (e.g. tf.TensorSpec((None,), 'int32') for sparse "
            "class ids)") from e
    # Planned on the trace that runs: an unknown batch (Keras' fit feeds any batch), sized at ``batch``. The
    # fixed-batch trace of the same step has other ops where gradients broadcast (Reshape pairs that carry
    # each gradient twice across a cut), so a plan made on it would under-count the real traffic.
    traced = replace(shell.trace("train", (x_struct, y_struct), None), batch_size=batch)
    return traced, x_specs
