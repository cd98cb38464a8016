"""Compression of cut edges, by name: which narrow dtype a tensor travels in (no TensorFlow).

The registry the emitter (:mod:`placer.tf.emit`), the options and the CLI
read: ``"none"`` sends tensors as they are (bit-exact); the others cast each
float32 tensor of rank ≥ 1 that crosses devices to the narrow dtype on the
sender and back on each receiver.

Examples
--------
>>> sorted(WIRE_DTYPES)
['bf16', 'fp16', 'none']
"""

from __future__ import annotations

#: Compression name → wire dtype name (``None``: no cast).
WIRE_DTYPES: dict[str, str | None] = {"none": None, "bf16": "bfloat16", "fp16": "float16"}
