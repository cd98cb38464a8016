"""The object :func:`placer.autoplace` returns."""

from __future__ import annotations

import os
from typing import Any, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.python.eager import context

from ..core.devices import DeviceSet
from ..core.graph_io import save_graph
from ..core.plan import Plan
from ..errors import InputSignatureError, UnsupportedError
from .emit import IMPORT_PREFIX, CompressedEdge, EmittedModel
from .export import export_saved_model
from .opgraph import OpGraph
from .report import Report

_RUNTIME_OPS = frozenset({"_Send", "_Recv", "_HostSend", "_HostRecv", "_Arg", "_Retval", "_DeviceArg",
                          "_DeviceRetval"})


class PlacedModel:
    """A Keras model's forward pass placed op by op on several devices.

    Call it like the model (``placed(x)``), or use :meth:`predict` for
    arrays of any length. ``plan`` holds the placement (``plan.save(path)``
    keeps it, ``autoplace(model, devices, plan=path)`` re-applies it);
    :meth:`report`, :meth:`export` and :meth:`save_graph` write the report,
    a SavedModel and the cost-annotated op graph.

    The placed model owns *copies* of the model's variables, each created on
    its planned device; the original model is never modified.
    """

    def __init__(self, emitted: EmittedModel, plan: Plan, input_specs: Sequence[tf.TensorSpec],
                 report: Report, name: str, op_graph: OpGraph, devices: DeviceSet) -> None:
        self._emitted = emitted
        self.plan = plan
        self.input_specs = tuple(input_specs)
        self._report = report
        self._op_graph = op_graph
        self._devices = devices
        self.name = name

    # -- running -----------------------------------------------------------
    @property
    def variables(self) -> tuple[tf.Variable, ...]:
        """The placed copies of the model's variables."""
        return self._emitted.variables

    @property
    def function(self) -> Any:
        """The placed ``tf.function`` (takes the inputs positionally)."""
        return self._emitted.function

    def _as_inputs(self, x: Any) -> list[tf.Tensor]:
        flat = [x] if len(self.input_specs) == 1 and not isinstance(x, (list, tuple)) else list(x)
        if len(flat) != len(self.input_specs):
            raise InputSignatureError(f"{self.name} takes {len(self.input_specs)} inputs, got {len(flat)}")
        out = []
        for value, spec in zip(flat, self.input_specs):
            t = tf.convert_to_tensor(value, dtype=spec.dtype)
            if not spec.shape.is_compatible_with(t.shape):
                raise InputSignatureError(
                    f"input of shape {tuple(t.shape)} does not match the planned shape {tuple(spec.shape)}")
            out.append(t)
        return out

    def __call__(self, x: Any, training: bool = False) -> Any:
        """Run the placed forward pass (inference) on one batch."""
        if training:
            raise UnsupportedError("training through a placed model is not implemented yet; "
                                   "train the original model and place it again")
        return self._emitted.function(*self._as_inputs(x))

    def predict(self, x: Any, batch_size: int | None = None, verbose: int = 0) -> Any:
        """Run over ``x`` in batches and return numpy outputs (like ``Model.predict``)."""
        inputs = [np.asarray(v) for v in ([x] if len(self.input_specs) == 1 and not isinstance(x, (list, tuple))
                                          else list(x))]
        n = len(inputs[0])
        bs = batch_size or self.plan.batch_size
        parts = []
        for start in range(0, n, bs):
            out = self(inputs[0][start:start + bs] if len(inputs) == 1 else [v[start:start + bs] for v in inputs])
            parts.append(tf.nest.map_structure(lambda t: t.numpy(), out))
        if not parts:
            raise InputSignatureError("predict got an empty input")
        return tf.nest.map_structure(lambda *xs: np.concatenate(xs, axis=0), *parts)

    def observed_placement(self, x: Any) -> dict[str, str]:
        """Run one batch and return op name → device where it *actually* ran.

        Read from the runtime's partition graphs; ops Grappler fused or folded
        away do not appear (fused kernels keep one original op's name). The
        runtime reports partition graphs only when a function is instantiated,
        so this traces a fresh copy of the placed function for the run.
        """
        fresh = tf.function(self._emitted.function.python_function, input_signature=list(self.input_specs),
                            autograph=False)
        inputs = self._as_inputs(x)
        ctx = context.context()
        ctx.enable_run_metadata()
        try:
            fresh(*inputs)
            md = ctx.export_run_metadata()
        finally:
            ctx.disable_run_metadata()
        placed: dict[str, str] = {}
        prefix = IMPORT_PREFIX + "/"
        graphs = [pg for fg in md.function_graphs for pg in fg.partition_graphs] + list(md.partition_graphs)
        for pg in graphs:
            for node in pg.node:
                if node.name.startswith(prefix) and node.op not in _RUNTIME_OPS:
                    placed[node.name[len(prefix):]] = tf.DeviceSpec.from_string(node.device).to_string()
        return placed

    @property
    def compressed_edges(self) -> tuple[CompressedEdge, ...]:
        """The (tensor, receiving device) pairs that travel in a narrow dtype."""
        return self._emitted.compressed

    # -- outputs -----------------------------------------------------------
    def report(self, path: str | os.PathLike) -> str:
        """Write the placement report (``.json``) and return its path."""
        return self._report.write(path)

    @property
    def report_data(self) -> dict[str, Any]:
        """The report as a dictionary (:meth:`placer.tf.report.Report.to_dict`)."""
        return self._report.to_dict()

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
        save_graph(path, self._op_graph.graph, self._devices)
        return os.fspath(path)

    def export(self, path: str | os.PathLike) -> str:
        """Save a SavedModel whose ``serving_default`` computes the placed outputs."""
        return export_saved_model(self._emitted.function, self._emitted.variables, self.input_specs, path)

    def summary(self) -> str:
        """Human-readable summary of the plan."""
        return self.plan.summary()

    def __repr__(self) -> str:
        return f"<PlacedModel {self.name!r}: {len(self.plan.assignment)} ops on {len(self.plan.devices)} devices>"
