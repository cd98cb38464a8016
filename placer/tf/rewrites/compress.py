"""Rewrite: each cut float edge gets its codec (encode on the sender, decode once per receiving device).

The codecs' ops live in :mod:`placer.tf.codecs`; the policy
(``context.compression``) picks one per edge. Record: the compressed edges
(detail: :class:`~placer.tf.codecs.CompressedEdge`, bytes at the planning
batch).

The placed graph is already differentiated (a training step is traced
whole), so no gradient ever flows through a codec: compressing a forward
activation changes what the consumers on the receiving device read,
backward ops included; backward tensors are compressed only by codecs that
allow it.

The *parameter traffic* (:func:`parameter_edge`: a weight read sent to a copy
on another device, a weight's gradient sent to its sum or update) is
compressed only by the policy's ``gradients`` setting; every other edge by
its ``compression``.
"""

from __future__ import annotations

from typing import Callable, Mapping

import tensorflow as tf

from ...core.compression import CODECS, CompressionPolicy
from ...core.splits import is_split_node
from ..codecs import TF_CODECS, CompressedEdge
from ..graphdef import GRADIENT_SCOPE, GRADIENT_SUM_SCOPE, GRADIENT_TOTAL_SCOPE, scope_index, tensor_bytes
from .base import Rewrite, RewriteContext, RewriteRecord, splice, template


def _summing(op_name: str) -> bool:
    """Whether ``op_name`` sums replicas' gradients: under ``autoplace_gradient_sum_r/`` or ``…_total_r/``."""
    head = op_name.split("/", 1)[0]
    return any(scope_index(head, scope) is not None for scope in (GRADIENT_SUM_SCOPE, GRADIENT_TOTAL_SCOPE))


def _updating(op_name: str, optimizer_scope: str | None) -> bool:
    return bool(optimizer_scope and op_name.startswith(optimizer_scope + "/"))


def _backward(op_name: str, optimizer_scope: str | None) -> bool:
    """A tensor of the backward pass: the tape's gradients, the replicas' gradient sums, the optimizer's."""
    return op_name.startswith(GRADIENT_SCOPE + "/") or _summing(op_name) or _updating(op_name, optimizer_scope)


def parameter_edge(producer: tf.Operation, consumer: str, optimizer_scope: str | None) -> bool:
    """Whether the tensor ``producer`` sends to the op ``consumer`` is parameter traffic: a variable's value
    (its read) or a weight's gradient on its way to a sum of replicas' gradients or to the optimizer's update.

    Examples
    --------
    >>> g = tf.Graph()
    >>> with g.as_default():
    ...     v = tf.Variable(1.0, name="w")
    ...     read = tf.raw_ops.ReadVariableOp(resource=v.handle, dtype=tf.float32)
    ...     x = tf.identity(read, name="x")
    >>> parameter_edge(read.op, "layer/mul", None), parameter_edge(x.op, "autoplace_gradient_total_1/add", None)
    (True, True)
    >>> parameter_edge(x.op, "layer/mul", None), parameter_edge(x.op, "adam/update", "adam")
    (False, True)
    """
    if producer.type == "ReadVariableOp":
        return True
    return _summing(consumer) or _updating(consumer, optimizer_scope)


def insert_codecs(gd: tf.compat.v1.GraphDef, graph: tf.Graph, devices: Mapping[str, str], policy: CompressionPolicy,
                  *, batch_size: int, optimizer_scope: str | None = None) -> list[CompressedEdge]:
    """Put the policy's codec on every cut edge of ``gd`` (a copy of ``graph``'s GraphDef, devices set).

    Each tensor is encoded once on its producer's device and decoded once
    per receiving device; consumers there read the decoded tensor. The outputs of a split op's parts
    (:mod:`placer.tf.rewrites.split`) are sent uncompressed.
    """
    edges: list[CompressedEdge] = []
    encoded: dict[tuple[str, str], list[str]] = {}   # (tensor, codec) → wire refs
    decoded: dict[tuple[str, str], str] = {}         # (tensor, device) → decoded ref
    for node in list(gd.node):
        dst_dev = devices.get(node.name)
        if dst_dev is None:
            continue
        for i, inp in enumerate(node.input):
            if inp.startswith("^"):
                continue
            op_name, _, idx = inp.partition(":")
            tname = f"{op_name}:{idx or '0'}"
            src_dev = devices.get(op_name)
            if src_dev is None or src_dev == dst_dev:
                continue
            if (tname, dst_dev) in decoded:
                node.input[i] = decoded[(tname, dst_dev)]
                continue
            if is_split_node(op_name):  # a split op's part (not in the trace): its output is sent as it is
                continue
            t = graph.get_tensor_by_name(tname)
            shape, rank = t.shape, t.shape.rank
            nbytes = tensor_bytes(t, batch_size)
            parameter = parameter_edge(t.op, node.name, optimizer_scope)
            backward = _backward(op_name, optimizer_scope)
            codec = policy.codec_for(nbytes=nbytes, dtype=t.dtype.name, rank=rank, backward=backward,
                                     src=src_dev, dst=dst_dev, parameter=parameter)
            if codec == "none":
                continue
            encode, decode = TF_CODECS[codec]
            safe = tname.replace(":", "_")
            if (tname, codec) not in encoded:
                nodes, phs, outs = template(encode, [tf.TensorSpec(shape, t.dtype)])
                encoded[(tname, codec)] = splice(gd, nodes, phs, [inp], outs, f"{safe}/autoplace_{codec}_enc",
                                                  src_dev)
            wire = encoded[(tname, codec)]
            nodes, phs, outs = template(decode, _wire_specs(encode, shape, t.dtype))
            out = splice(gd, nodes, phs, wire, outs, f"{safe}/autoplace_{codec}_dec_{len(decoded)}", dst_dev)[0]
            decoded[(tname, dst_dev)] = out
            node.input[i] = out
            edges.append(CompressedEdge(tname, src_dev, dst_dev, codec, nbytes,
                                        int(CODECS[codec].wire_bytes(nbytes)),
                                        "parameter" if parameter else "backward" if backward else "forward"))
    return edges


def _wire_specs(encode: Callable, shape: tf.TensorShape, dtype: tf.DType) -> list[tf.TensorSpec]:
    g = tf.Graph()
    with g.as_default():
        outs = encode(tf.compat.v1.placeholder(dtype, shape))
    return [tf.TensorSpec(o.shape, o.dtype) for o in outs]


def compress_cut_edges(gd: tf.compat.v1.GraphDef, context: RewriteContext) -> RewriteRecord:
    """:func:`insert_codecs` with the context's policy; detail: the compressed edges."""
    edges = tuple(insert_codecs(gd, context.graph, context.devices, context.compression,
                                batch_size=context.batch_size, optimizer_scope=context.optimizer_scope))
    return RewriteRecord("codecs", changes=len(edges), detail=edges)


REWRITE = Rewrite("codecs", compress_cut_edges)
