"""The TensorFlow side of the codec registry: each codec's encode/decode ops and their measured cost.

Each codec of :data:`placer.core.compression.CODECS` (but ``none``) has an
encode function (float32 tensor → wire tensors, run on the sender) and a
decode function (wire tensors → float32, run on each receiver), written
with ordinary TensorFlow ops. The ``codecs`` rewrite
(:func:`placer.tf.rewrites.compress.insert_codecs`) traces them once into a
template graph per tensor and splices the template's nodes into the placed
GraphDef, so the runtime's ``_Send``/``_Recv`` carry the wire tensors.
:func:`measure_codec_costs` times them for ``compression="auto"``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import tensorflow as tf

from ..core.compression import CODECS


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

    ``bytes_before``/``bytes_after`` are at the planning batch size. ``kind``: ``"forward"`` (an activation),
    ``"backward"`` (a tensor of the backward pass), or ``"parameter"`` (a weight sent to a copy, a weight's
    gradient sent to its sum or update: the ``gradient_compression`` option's edges).
    """

    tensor: str
    src_device: str
    dst_device: str
    codec: str
    bytes_before: int
    bytes_after: int
    kind: str = "forward"

    @property
    def wire_dtype(self) -> str:
        """The payload's dtype on the wire."""
        return {"bf16": "bfloat16", "fp16": "float16", "int8": "int8"}[self.codec]


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
