"""Stage 5b — SavedModel export of a placed model.

Per-op devices live in the saved FunctionDefs; variable devices are kept
with ``SAVE_VARIABLE_DEVICES``. Load with
``tf.saved_model.load(path, options=LOAD_OPTIONS)`` in a process that has the
same devices (with fewer devices TensorFlow's soft placement runs everything
on the ones that exist).
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any

import tensorflow as tf

from ..core.outputs import new_directory
from ..errors import ExportError, OutputError

log = logging.getLogger(__name__)

SAVE_OPTIONS = tf.saved_model.SaveOptions(
    experimental_variable_policy=tf.saved_model.experimental.VariablePolicy.SAVE_VARIABLE_DEVICES)
#: Options to pass to ``tf.saved_model.load`` so variables return to their devices.
LOAD_OPTIONS = tf.saved_model.LoadOptions(experimental_variable_policy="save_variable_devices")


def _arg_name(spec: tf.TensorSpec, i: int) -> str:
    name = re.sub(r"[^A-Za-z0-9_]", "_", spec.name or "")
    return name if name and name[0].isalpha() else f"input_{i}"


def export_saved_model(function: Any, variables: tuple[tf.Variable, ...], input_specs: tuple[tf.TensorSpec, ...],
                       path: str | os.PathLike) -> str:
    """Save the placed forward function with a ``serving_default`` signature.

    The signature takes the model's inputs by name (``input_0``… when a
    name is unusable) and returns ``{"output_0": …, "output_1": …}`` in the
    flattened order of the model's outputs.

    Raises
    ------
    OutputError
        If ``path`` is a file or a non-empty directory, or cannot be written (a full disk, say).
    ExportError
        If TensorFlow cannot save the function.

    Nothing is left behind on failure: the SavedModel is written to a temporary
    sibling directory and renamed to ``path`` when complete.
    """
    path = os.fspath(path)
    names = [_arg_name(s, i) for i, s in enumerate(input_specs)]
    if len(set(names)) != len(names):
        names = [f"input_{i}" for i in range(len(names))]
    specs = [tf.TensorSpec(s.shape, s.dtype, name=n) for s, n in zip(input_specs, names)]

    def serve(*xs: tf.Tensor) -> dict[str, tf.Tensor]:
        flat = tf.nest.flatten(function(*xs))
        return {f"output_{i}": t for i, t in enumerate(flat)}

    module = tf.Module()
    module.placed_variables = list(variables)
    module.forward = function
    module.serve = tf.function(serve, input_signature=specs, autograph=False)
    with new_directory(path) as tmp:
        try:
            tf.saved_model.save(module, tmp, signatures={"serving_default": module.serve}, options=SAVE_OPTIONS)
        except OSError as e:
            raise OutputError(f"cannot write the SavedModel {path!r}: {e.strerror or e}; nothing was left there") from e
        except Exception as e:  # noqa: BLE001  (TF raises many types here)
            if "No space left" in str(e) or "Read-only file system" in str(e):  # TF's own IO errors
                raise OutputError(f"cannot write the SavedModel {path!r}: {str(e).strip().splitlines()[0]}; "
                                  "nothing was left there") from e
            raise ExportError(f"saving the placed model to {path!r} failed: {e}") from e
    log.info("exported placed model to %s", path)
    return path
