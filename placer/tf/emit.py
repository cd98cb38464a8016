"""Stage 4 — emit a placed function: a rewritten GraphDef in a new ``tf.function``.

The same code places the forward pass, Keras' ``train_step`` and ``test_step``:

* every node of the traced (unknown-batch) graph gets its planned device;
* every captured variable is replaced by one the placed model created on
  its planned device (:mod:`placer.tf.placed_model`: TensorFlow moves reads
  to wherever a variable lives, so placing the reads alone would not move
  the weights); the user's variables are not touched;
* with compression, each float tensor that crosses devices is cast to a
  narrow dtype on the sending device and back on each receiving device, so
  the transfer carries the narrow dtype;
* the GraphDef is imported inside a new ``tf.function`` whose resource
  placeholders are mapped to the new variables.

This is "propose, then apply": the plan is data; only this module rewrites.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import tensorflow as tf

from ..core.compression import WIRE_DTYPES
from ..errors import GraphError
from .opgraph import layer_of
from .trace import TracedModel

log = logging.getLogger(__name__)

#: Name scope of the imported graph inside the placed function.
IMPORT_PREFIX = "autoplace"


@dataclass(frozen=True)
class Compressor:
    """A lossy cast pair for cut edges."""

    wire_dtype: tf.DType
    eligible: Callable[[tf.Tensor], bool]


def _float32_non_scalar(t: tf.Tensor) -> bool:
    # Never scalars (a loss came back rounded), integers, bools or resources.
    return t.dtype == tf.float32 and t.shape.rank is not None and t.shape.rank >= 1


#: Compression name → cast pair (``"none"`` inserts nothing), from :data:`placer.core.compression.WIRE_DTYPES`.
COMPRESSORS: dict[str, Compressor | None] = {
    name: None if wire is None else Compressor(tf.as_dtype(wire), _float32_non_scalar)
    for name, wire in WIRE_DTYPES.items()
}


@dataclass(frozen=True)
class CompressedEdge:
    """A tensor sent in a narrow dtype from ``src_device`` to ``dst_device``."""

    tensor: str
    src_device: str
    dst_device: str
    wire_dtype: str


@dataclass(frozen=True)
class EmittedModel:
    """One placed function (forward pass, training or test step) and what it was built from.

    The variables it reads and updates belong to the placed model; the
    function captures their handles.
    """

    function: Any
    graph_def: tf.compat.v1.GraphDef
    compressed: tuple[CompressedEdge, ...]
    structured_outputs: Any
    step: str = "predict"


def _ref(tensor_name: str) -> str:
    op, idx = tensor_name.rsplit(":", 1)
    return op if idx == "0" else tensor_name


def _insert_casts(gd: tf.compat.v1.GraphDef, graph: tf.Graph, devices: Mapping[str, str],
                  comp: Compressor) -> list[CompressedEdge]:
    edges: list[CompressedEdge] = []
    narrow: dict[str, str] = {}          # tensor → narrow cast node
    widened: dict[tuple[str, str], str] = {}  # (tensor, device) → widening cast node
    for node in list(gd.node):
        dst_dev = devices[node.name]
        for i, inp in enumerate(node.input):
            if inp.startswith("^"):
                continue
            op_name, _, idx = inp.partition(":")
            tname = f"{op_name}:{idx or '0'}"
            src_dev = devices.get(op_name)
            if src_dev is None or src_dev == dst_dev:
                continue
            t = graph.get_tensor_by_name(tname)
            if not comp.eligible(t):
                continue
            safe = tname.replace(":", "_")
            if tname not in narrow:
                c = gd.node.add()
                c.name, c.op, c.device = f"{safe}/autoplace_narrow", "Cast", src_dev
                c.input.append(inp)
                c.attr["SrcT"].type = t.dtype.as_datatype_enum
                c.attr["DstT"].type = comp.wire_dtype.as_datatype_enum
                c.attr["Truncate"].b = False
                narrow[tname] = c.name
            if (tname, dst_dev) not in widened:
                w = gd.node.add()
                w.name = f"{safe}/autoplace_widen_{len(widened)}"
                w.op, w.device = "Cast", dst_dev
                w.input.append(narrow[tname])
                w.attr["SrcT"].type = comp.wire_dtype.as_datatype_enum
                w.attr["DstT"].type = t.dtype.as_datatype_enum
                w.attr["Truncate"].b = False
                widened[(tname, dst_dev)] = w.name
                edges.append(CompressedEdge(tname, src_dev, dst_dev, comp.wire_dtype.name))
            node.input[i] = widened[(tname, dst_dev)]
    return edges


def complete_assignment(graph: tf.Graph, op_devices: Mapping[str, str],
                        layer_devices: Mapping[str, str] | None = None) -> dict[str, str]:
    """Give every op of ``graph`` a device: the plan's, else its layer's, else a neighbour's.

    The plan names the ops of the trace it was made on. Another trace of the
    same model (unknown batch: extra shape computations; Keras' test step or
    the forward pass of a plan made on the training step) has ops the plan
    does not name: each takes the device of its Keras layer in the plan
    (``layer_devices``, keyed by :func:`~placer.tf.opgraph.layer_of`), else
    of its first placed producer, else of its first placed consumer. Plan
    entries for ops this graph lacks are ignored.

    Raises
    ------
    GraphError
        If some op has no planned device and no placed neighbour at all.
    """
    ops = graph.get_operations()
    out = {op.name: op_devices[op.name] for op in ops if op.name in op_devices}
    if layer_devices:
        for op in ops:
            if op.name not in out and layer_of(op.name) in layer_devices:
                out[op.name] = layer_devices[layer_of(op.name)]
    for _ in range(2):
        for op in ops:
            if op.name in out:
                continue
            for t in op.inputs:
                if t.op.name in out:
                    out[op.name] = out[t.op.name]
                    break
        for op in reversed(ops):
            if op.name in out:
                continue
            for c in (c for t in op.outputs for c in t.consumers()):
                if c.name in out:
                    out[op.name] = out[c.name]
                    break
    missing = [op.name for op in ops if op.name not in out]
    if missing:
        raise GraphError(f"{len(missing)} ops have no planned device and no placed neighbour, e.g. {missing[:5]}")
    return out


def _handle(variable: Any) -> Any:
    """The resource handle of a Keras variable (its ``tf.Variable`` at ``.value``) or a ``tf.Variable``."""
    return getattr(variable, "value", variable).handle


def emit(traced: TracedModel, op_devices: Mapping[str, str], variables: Mapping[str, Any],
         compression: str = "none", layer_devices: Mapping[str, str] | None = None) -> EmittedModel:
    """Build the placed function of one trace.

    Parameters
    ----------
    traced : TracedModel
        Its ``dynamic`` trace is what is placed.
    op_devices : Mapping[str, str]
        The plan: op name → device (see :func:`complete_assignment` for ops it does not name).
    variables : Mapping[str, keras.Variable or tf.Variable]
        Each captured resource placeholder of the trace → the variable that
        replaces it, already created on its planned device.
    compression : str
        A key of :data:`COMPRESSORS`.
    layer_devices : Mapping[str, str], optional
        Layer → device, for ops the plan does not name.

    Raises
    ------
    GraphError
        If an op has no device, a captured variable has no replacement, or ``compression`` is unknown.
    """
    if compression not in COMPRESSORS:
        raise GraphError(f"unknown compression {compression!r}; choose one of {sorted(COMPRESSORS)}")
    missing = sorted(set(traced.variables) - set(variables))
    if missing:
        raise GraphError(f"{len(missing)} captured variables have no placed copy, e.g. {missing[:3]}")
    graph = traced.dynamic.graph
    gd = graph.as_graph_def()
    op_devices = complete_assignment(graph, op_devices, layer_devices)
    for node in gd.node:
        node.device = op_devices[node.name]
    comp = COMPRESSORS[compression]
    compressed = _insert_casts(gd, graph, op_devices, comp) if comp is not None else []

    placeholders = list(traced.variables)
    handles = [variables[ph] for ph in placeholders]
    constants = dict(traced.constants)
    input_names = list(traced.input_names)
    output_names = list(traced.output_names)
    structured = traced.dynamic.structured_outputs

    def placed_step(*xs: tf.Tensor) -> Any:
        fg = tf.compat.v1.get_default_graph()
        input_map: dict[str, Any] = dict(zip(input_names, xs))
        for ph, var in zip(placeholders, handles):
            input_map[f"{ph}:0"] = fg.capture(_handle(var))
        for ph, value in constants.items():
            input_map[f"{ph}:0"] = fg.capture(value)
        outs = tf.graph_util.import_graph_def(gd, input_map=input_map, return_elements=output_names,
                                              name=IMPORT_PREFIX)
        return tf.nest.pack_sequence_as(structured, outs)

    fn = tf.function(placed_step, input_signature=list(traced.input_specs), autograph=False)
    log.info("emitted the placed %s function: %d ops on %d devices, %d compressed edges", traced.step,
             len(gd.node), len(set(op_devices.values())), len(compressed))
    return EmittedModel(fn, gd, tuple(compressed), structured, traced.step)
