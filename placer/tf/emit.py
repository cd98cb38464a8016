"""Stage 4 — emit the placed model: a rewritten GraphDef in a new ``tf.function``.

* every node of the traced (unknown-batch) graph gets its planned device;
* every variable is **created** on its planned device (a copy of the user's
  value: TensorFlow moves reads to wherever a variable lives, so placing the
  reads alone would not move the weights); the user's variables are not
  touched;
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
    """The placed forward function and the variables it owns."""

    function: Any
    variables: tuple[tf.Variable, ...]
    variable_paths: tuple[str, ...]
    graph_def: tf.compat.v1.GraphDef
    compressed: tuple[CompressedEdge, ...]
    structured_outputs: Any


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


def complete_assignment(graph: tf.Graph, op_devices: Mapping[str, str]) -> dict[str, str]:
    """Give ops the plan does not name the device of a neighbour.

    Ops of the unknown-batch trace that the fixed-batch trace lacks are
    shape computations (``Shape``, ``StridedSlice``, ``Pack``); each takes
    the device of its first placed producer, else of its first placed
    consumer. Plan entries for ops this graph lacks are ignored.

    Raises
    ------
    GraphError
        If some op has no placed neighbour at all.
    """
    ops = graph.get_operations()
    out = {op.name: op_devices[op.name] for op in ops if op.name in op_devices}
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


def emit(traced: TracedModel, op_devices: Mapping[str, str], compression: str = "none") -> EmittedModel:
    """Build the placed forward function.

    Parameters
    ----------
    traced : TracedModel
    op_devices : Mapping[str, str]
        Device of every op of the fixed-batch trace (see :func:`complete_assignment`).
    compression : str
        A key of :data:`COMPRESSORS`.

    Raises
    ------
    GraphError
        If an op has no planned device or ``compression`` is unknown.
    """
    if compression not in COMPRESSORS:
        raise GraphError(f"unknown compression {compression!r}; choose one of {sorted(COMPRESSORS)}")
    graph = traced.dynamic.graph
    gd = graph.as_graph_def()
    op_devices = complete_assignment(graph, op_devices)
    for node in gd.node:
        node.device = op_devices[node.name]
    comp = COMPRESSORS[compression]
    compressed = _insert_casts(gd, graph, op_devices, comp) if comp is not None else []

    placeholders = list(traced.variables)
    new_vars: list[tf.Variable] = []
    for ph in placeholders:
        src = traced.variables[ph]
        with tf.device(op_devices[ph]):
            new_vars.append(tf.Variable(src.value.read_value(), trainable=src.trainable,
                                        name=src.path.replace("/", "_")))
    constants = dict(traced.constants)
    input_names = list(traced.input_names)
    output_names = list(traced.output_names)
    structured = traced.dynamic.structured_outputs

    def placed_forward(*xs: tf.Tensor) -> Any:
        fg = tf.compat.v1.get_default_graph()
        input_map: dict[str, Any] = dict(zip(input_names, xs))
        for ph, var in zip(placeholders, new_vars):
            input_map[f"{ph}:0"] = fg.capture(var.handle)
        for ph, value in constants.items():
            input_map[f"{ph}:0"] = fg.capture(value)
        outs = tf.graph_util.import_graph_def(gd, input_map=input_map, return_elements=output_names,
                                              name=IMPORT_PREFIX)
        return tf.nest.pack_sequence_as(structured, outs)

    fn = tf.function(placed_forward, input_signature=list(traced.input_specs), autograph=False)
    log.info("emitted placed model: %d variables on %d devices, %d compressed edges", len(new_vars),
             len(set(op_devices.values())), len(compressed))
    return EmittedModel(fn, tuple(new_vars), tuple(traced.variables[ph].path for ph in placeholders), gd,
                        tuple(compressed), structured)
