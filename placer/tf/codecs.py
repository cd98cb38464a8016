"""The TensorFlow side of the codec registry: encode/decode ops, their insertion on cut edges, their cost.

Each codec of :data:`placer.core.compression.CODECS` (but ``none``) has an
encode function (float32 tensor → wire tensors, run on the sender) and a
decode function (wire tensors → float32, run on each receiver), written
with ordinary TensorFlow ops. :func:`insert_codecs` traces them once into a
template graph per tensor and splices the template's nodes into the placed
GraphDef, so the runtime's ``_Send``/``_Recv`` carry the wire tensors.

The placed graph is already differentiated (a training step is traced
whole), so no gradient ever flows through a codec: compressing a forward
activation changes what the consumers on the receiving device read,
backward ops included; backward tensors are compressed only by codecs that
allow it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np
import tensorflow as tf

from ..core.compression import CODECS, CompressionPolicy
from .opgraph import GRADIENT_SCOPE, tensor_bytes


def _int8_encode(x: tf.Tensor) -> list[tf.Tensor]:
    scale = tf.maximum(tf.reduce_max(tf.abs(x)), 1e-30) / 127.0
    return [tf.cast(tf.round(x / scale), tf.int8), scale]


#: Codec name → (encode, decode); one entry per codec of CODECS except ``none``.
TF_CODECS: dict[str, tuple[Callable[[tf.Tensor], list[tf.Tensor]], Callable[..., tf.Tensor]]] = {
    "bf16": (lambda x: [tf.cast(x, tf.bfloat16)], lambda w: tf.cast(w, tf.float32)),
    "fp16": (lambda x: [tf.cast(x, tf.float16)], lambda w: tf.cast(w, tf.float32)),
    "int8": (_int8_encode, lambda q, scale: tf.cast(q, tf.float32) * scale),
}
assert set(TF_CODECS) == set(CODECS) - {"none"}, "every codec needs its ops"


@dataclass(frozen=True)
class CompressedEdge:
    """A tensor sent from ``src_device`` to ``dst_device`` through ``codec``.

    ``bytes_before``/``bytes_after`` are at the planning batch size.
    """

    tensor: str
    src_device: str
    dst_device: str
    codec: str
    bytes_before: int
    bytes_after: int

    @property
    def wire_dtype(self) -> str:
        """The payload's dtype on the wire."""
        return {"bf16": "bfloat16", "fp16": "float16", "int8": "int8"}[self.codec]


def _template(fn: Callable[..., list[tf.Tensor] | tf.Tensor],
              specs: Sequence[tf.TensorSpec]) -> tuple[list, list[str], list[str]]:
    """Trace ``fn`` on placeholders: (nodes, placeholder names, output tensor names)."""
    g = tf.Graph()
    with g.as_default():
        phs = [tf.compat.v1.placeholder(s.dtype, s.shape, name=f"in{i}") for i, s in enumerate(specs)]
        outs = fn(*phs)
        outs = outs if isinstance(outs, list) else [outs]
    return list(g.as_graph_def().node), [p.op.name for p in phs], [o.name for o in outs]


def _splice(gd: tf.compat.v1.GraphDef, nodes: list, placeholders: list[str], inputs: Sequence[str],
            outputs: list[str], prefix: str, device: str) -> list[str]:
    """Copy template ``nodes`` into ``gd`` under ``prefix`` on ``device``; returns the new output refs."""
    bound = dict(zip(placeholders, inputs))

    def ref(name: str) -> str:
        ctrl = name.startswith("^")
        op, _, idx = name.lstrip("^").partition(":")
        if op in bound:
            return bound[op] if not idx or idx == "0" else f"{bound[op]}:{idx}"
        new = f"{prefix}/{op}" + (f":{idx}" if idx and idx != "0" else "")
        return ("^" if ctrl else "") + new

    for n in nodes:
        if n.name in bound:
            continue
        c = gd.node.add()
        c.CopyFrom(n)
        c.name, c.device = f"{prefix}/{n.name}", device
        del c.input[:]
        c.input.extend(ref(i) for i in n.input)
    return [ref(o) for o in outputs]


def _backward(op_name: str, optimizer_scope: str | None) -> bool:
    return op_name.startswith(GRADIENT_SCOPE + "/") or bool(optimizer_scope and op_name.startswith(optimizer_scope + "/"))


def insert_codecs(gd: tf.compat.v1.GraphDef, graph: tf.Graph, devices: Mapping[str, str], policy: CompressionPolicy,
                  *, batch_size: int, optimizer_scope: str | None = None) -> list[CompressedEdge]:
    """Put the policy's codec on every cut edge of ``gd`` (a copy of ``graph``'s GraphDef, devices set).

    Each tensor is encoded once on its producer's device and decoded once
    per receiving device; consumers there read the decoded tensor.
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
            t = graph.get_tensor_by_name(tname)
            shape, rank = t.shape, t.shape.rank
            nbytes = tensor_bytes(t, batch_size)
            codec = policy.codec_for(nbytes=nbytes, dtype=t.dtype.name, rank=rank,
                                     backward=_backward(op_name, optimizer_scope), src=src_dev, dst=dst_dev)
            if codec == "none":
                continue
            encode, decode = TF_CODECS[codec]
            safe = tname.replace(":", "_")
            if (tname, codec) not in encoded:
                nodes, phs, outs = _template(encode, [tf.TensorSpec(shape, t.dtype)])
                encoded[(tname, codec)] = _splice(gd, nodes, phs, [inp], outs, f"{safe}/autoplace_{codec}_enc",
                                                  src_dev)
            wire = encoded[(tname, codec)]
            nodes, phs, outs = _template(decode, _wire_specs(encode, shape, t.dtype))
            out = _splice(gd, nodes, phs, wire, outs, f"{safe}/autoplace_{codec}_dec_{len(decoded)}", dst_dev)[0]
            decoded[(tname, dst_dev)] = out
            node.input[i] = out
            edges.append(CompressedEdge(tname, src_dev, dst_dev, codec, nbytes,
                                        int(CODECS[codec].wire_bytes(nbytes))))
    return edges


def _wire_specs(encode: Callable, shape: tf.TensorShape, dtype: tf.DType) -> list[tf.TensorSpec]:
    g = tf.Graph()
    with g.as_default():
        outs = encode(tf.compat.v1.placeholder(dtype, shape))
    return [tf.TensorSpec(o.shape, o.dtype) for o in outs]


def measure_codec_costs(devices: Sequence[str], *, sizes: Sequence[int] = (1 << 10, 1 << 20),
                        repeats: int = 5) -> dict[str, dict[str, tuple[float, float]]]:
    """Measured encode + decode cost of each codec on each device: (fixed seconds, seconds per input byte).

    Each codec round-trips float32 tensors of ``sizes`` elements on the
    device, timed as the median of ``repeats`` calls minus the same call
    without the codec; a line through the two sizes gives the fixed and the
    per-byte cost (the fixed part is what makes small tensors not pay).

    Examples
    --------
    >>> costs = measure_codec_costs(["/CPU:0"], sizes=(256, 4096), repeats=2)
    >>> sorted(costs["/CPU:0"]), all(f >= 0 and b > 0 for f, b in costs["/CPU:0"].values())
    (['bf16', 'fp16', 'int8'], True)
    """
    small, large = sizes

    def timed(fn: Callable, v: tf.Tensor) -> float:
        fn(v).numpy()  # trace and warm up
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn(v).numpy()
            times.append(time.perf_counter() - t0)
        return float(np.median(times))

    out: dict[str, dict[str, tuple[float, float]]] = {}
    for device in devices:
        def call(fn: Callable, device: str = device) -> Callable:
            def body(v: tf.Tensor) -> tf.Tensor:
                with tf.device(device):
                    return tf.reduce_sum(fn(v))
            return tf.function(body, autograph=False)

        points: dict[str, list[float]] = {name: [] for name in TF_CODECS}
        for n in (small, large):
            with tf.device(device):
                v = tf.constant(np.random.default_rng(0).standard_normal(n).astype("float32"))
            base = timed(call(tf.identity), v)  # the call and the reduction, without a codec
            for name, (enc, dec) in TF_CODECS.items():
                points[name].append(max(timed(call(lambda t, e=enc, d=dec: d(*e(t))), v) - base, 0.0))
        per = {}
        for name, (t_small, t_large) in points.items():
            per_byte = max((t_large - t_small) / (4 * (large - small)), 1e-13)
            per[name] = (max(t_small - per_byte * 4 * small, 0.0), per_byte)
        out[device] = per
    return out
