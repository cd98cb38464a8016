"""Compression of cut edges: the codec registry and the per-edge choice (no TensorFlow).

A *codec* turns a float32 tensor that crosses devices into fewer bytes on
the sender and back on each receiver. The registry :data:`CODECS` holds
what the planner needs to know of each; :mod:`placer.tf.codecs` holds the
TensorFlow ops of the same names. The ``compression`` option is a codec
name (every eligible cut edge uses it) or ``"auto"``: :func:`choose_codec`
picks, per cut edge, the codec that sends it fastest — wire time on the
link plus the codec's measured encode and decode time — among those within
the error budget, and ``none`` when nothing pays.

Never compressed: scalars (a loss came back rounded), integers, bools,
resources; by ``forward_only`` codecs, tensors of the backward pass or the
optimizer (f16 underflowed on ResNet50 gradients, ``../shared/notes/tf-facts.md``).

The *parameter traffic* of a training step — a weight's value sent to a copy
of the model on another device, a weight's gradient sent to where it is
summed or applied — is a separate opt-in (``gradient_compression``): the
``compression`` setting never touches it, so lossy activations never round
the weights or their gradient sums by accident. Its choices
(:data:`GRADIENT_COMPRESSION_CHOICES`) are the codecs that may carry
gradients (``bf16``; fp16 and int8 are forward-only) and ``auto``.

Examples
--------
>>> sorted(CODECS)
['bf16', 'fp16', 'int8', 'none']
>>> CODECS["int8"].wire_bytes(1024)
260.0
>>> costs = {"bf16": (2e-5, 1e-10), "int8": (5e-5, 1e-9)}   # (fixed s, s per byte): encode + decode
>>> choose_codec(4_000_000, bandwidth_bytes_per_s=1e8, latency_s=1e-4, error_budget=1e-2,
...              backward=False, costs=costs)
'int8'
>>> choose_codec(4_000_000, bandwidth_bytes_per_s=1e12, latency_s=1e-4, error_budget=1e-2,
...              backward=False, costs=costs)
'none'
>>> choose_codec(4_000, bandwidth_bytes_per_s=1e8, latency_s=1e-4, error_budget=1e-2,
...              backward=False, costs=costs)   # a small tensor: the codecs' fixed cost outweighs 20 µs saved
'none'
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping


@dataclass(frozen=True)
class Codec:
    """What the planner knows of one codec.

    Attributes
    ----------
    name : str
    ratio : float
        Wire bytes per input byte.
    extra_tensors : int
        Tensors sent besides the payload (int8's scale), each one more transfer.
    extra_bytes : int
        Their bytes.
    max_error : float
        Bound on ``max|decoded - x| / max|x|`` for one tensor (rounding of
        the wire format; bf16 keeps 8 bits of mantissa, fp16 11, int8 maps
        ``[-max|x|, max|x|]`` onto 255 levels).
    forward_only : bool
        Never used on backward-pass or optimizer tensors.
    """

    name: str
    ratio: float
    extra_tensors: int = 0
    extra_bytes: int = 0
    max_error: float = 0.0
    forward_only: bool = False

    def wire_bytes(self, nbytes: float) -> float:
        """Bytes on the wire for a float32 tensor of ``nbytes``."""
        return self.ratio * nbytes + self.extra_bytes


#: Codec name → what the planner knows of it; :mod:`placer.tf.codecs` has the ops of each name.
CODECS: dict[str, Codec] = {
    "none": Codec("none", 1.0),
    "bf16": Codec("bf16", 0.5, max_error=2.0 ** -8),
    "fp16": Codec("fp16", 0.5, max_error=2.0 ** -11, forward_only=True),
    "int8": Codec("int8", 0.25, extra_tensors=1, extra_bytes=4, max_error=1 / 254, forward_only=True),
}
#: The ``compression`` value that lets :func:`choose_codec` decide per edge.
AUTO = "auto"
#: Every value the ``compression`` option takes.
COMPRESSION_CHOICES = (*CODECS, AUTO)
#: Default error budget of ``compression="auto"`` (relative, per tensor: see :attr:`Codec.max_error`).
DEFAULT_ERROR_BUDGET = 1e-2
#: Every value the ``gradient_compression`` option takes: ``none``, the codecs that may carry gradients, ``auto``.
GRADIENT_COMPRESSION_CHOICES = ("none", *(n for n, c in CODECS.items() if n != "none" and not c.forward_only), AUTO)


def eligible(codec: Codec, *, dtype: str, rank: int | None, backward: bool) -> bool:
    """Whether ``codec`` may carry a tensor of this dtype and rank (``backward``: of the backward pass)."""
    if codec.name == "none":
        return True
    return dtype == "float32" and rank is not None and rank >= 1 and not (backward and codec.forward_only)


def choose_codec(nbytes: float, *, bandwidth_bytes_per_s: float, latency_s: float, error_budget: float,
                 backward: bool, costs: Mapping[str, tuple[float, float]]) -> str:
    """The fastest codec for one float32 cut edge of ``nbytes`` within ``error_budget``.

    Parameters
    ----------
    nbytes : float
        The tensor's bytes (uncompressed).
    bandwidth_bytes_per_s, latency_s : float
        The link between its producer's and its consumer's device.
    error_budget : float
        Largest :attr:`Codec.max_error` allowed.
    backward : bool
        A backward-pass or optimizer tensor (``forward_only`` codecs excluded).
    costs : Mapping[str, tuple of float]
        Codec name → measured (fixed seconds, seconds per input byte) of
        encode plus decode (codecs absent here are not considered).

    Returns
    -------
    str
        A key of :data:`CODECS` (``"none"`` when no codec saves time).
    """
    def seconds(codec: Codec, fixed: float, per_byte: float) -> float:
        return ((1 + codec.extra_tensors) * latency_s + codec.wire_bytes(nbytes) / bandwidth_bytes_per_s
                + fixed + per_byte * nbytes)

    best, best_s = "none", seconds(CODECS["none"], 0.0, 0.0)
    for name, (fixed, per_byte) in sorted(costs.items()):
        codec = CODECS[name]
        if name == "none" or codec.max_error > error_budget or (backward and codec.forward_only):
            continue
        s = seconds(codec, fixed, per_byte)
        if math.isfinite(s) and s < best_s:
            best, best_s = name, s
    return best


@dataclass(frozen=True)
class CompressionPolicy:
    """Which codec each cut edge of a placement gets (built once per placement, then consulted per edge).

    Attributes
    ----------
    compression : str
        A key of :data:`CODECS`, or :data:`AUTO`.
    error_budget : float
        Largest :attr:`Codec.max_error` ``auto`` may use.
    links : Mapping[tuple[str, str], tuple[float, float]]
        ``(src, dst)`` device names → (bandwidth bytes/s, latency s).
    costs : Mapping[str, Mapping[str, tuple of float]]
        Device name → codec → measured (fixed seconds, seconds per input
        byte) of encode + decode (``auto`` only).
    gradients : str
        Codec of the parameter traffic (weights sent to copies, gradients
        sent to their sum or update): a key of
        :data:`GRADIENT_COMPRESSION_CHOICES`; ``auto`` takes a codec where it
        sends the tensor faster on its link (no error budget: asking for
        ``auto`` accepts bf16's rounding).

    Examples
    --------
    >>> p = CompressionPolicy("bf16")
    >>> p.codec_for(nbytes=4096, dtype="float32", rank=2, backward=True, src="a", dst="b")
    'bf16'
    >>> p.codec_for(nbytes=4, dtype="float32", rank=0, backward=False, src="a", dst="b")
    'none'
    >>> p.codec_for(nbytes=4096, dtype="float32", rank=2, backward=True, src="a", dst="b", parameter=True)
    'none'
    >>> CompressionPolicy("int8", gradients="bf16").codec_for(nbytes=4096, dtype="float32", rank=2,
    ...                                                     backward=True, src="a", dst="b", parameter=True)
    'bf16'
    """

    compression: str
    error_budget: float = DEFAULT_ERROR_BUDGET
    links: Mapping[tuple[str, str], tuple[float, float]] = field(default_factory=dict)
    costs: Mapping[str, Mapping[str, tuple[float, float]]] = field(default_factory=dict)
    gradients: str = "none"

    def __post_init__(self) -> None:
        if self.compression not in COMPRESSION_CHOICES:
            raise ValueError(f"unknown compression {self.compression!r}; choose one of {list(COMPRESSION_CHOICES)}")
        if self.gradients not in GRADIENT_COMPRESSION_CHOICES:
            why = ", ".join(f"{n} (forward only: it underflows or clips gradients)"
                            for n, c in CODECS.items() if c.forward_only)
            raise ValueError(f"unknown gradient_compression {self.gradients!r}; choose one of "
                             f"{list(GRADIENT_COMPRESSION_CHOICES)} (not {why})")
        b = self.error_budget
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not math.isfinite(b) or b < 0:
            raise ValueError(f"compression_error must be a finite non-negative number, got {b!r}")

    @property
    def budget_excludes_all(self) -> bool:
        """``auto`` with an error budget no codec meets (every edge then goes uncompressed)."""
        return self.compression == AUTO and all(c.max_error > self.error_budget for n, c in CODECS.items()
                                                if n != "none")

    def parameter_codec(self, nbytes: float, src: str, dst: str) -> tuple[float, float, float]:
        """``(bytes on the wire, encode seconds on src, decode seconds on dst)`` of ``nbytes`` of float32 parameter
        traffic (a weight, a weight's gradient) sent from ``src`` to ``dst``: what the simulator charges when it
        predicts copies. The codec's time is half of each device's measured round trip (:attr:`costs`; 0 where
        it was not measured).

        Examples
        --------
        >>> p = CompressionPolicy("none", gradients="bf16", costs={"a": {"bf16": (1e-5, 1e-9)},
        ...                                                         "b": {"bf16": (3e-5, 3e-9)}})
        >>> [round(x, 9) for x in p.parameter_codec(4096, "a", "b")]
        [2048.0, 7.048e-06, 2.1144e-05]
        >>> CompressionPolicy("int8").parameter_codec(4096, "a", "b")
        (4096.0, 0.0, 0.0)
        """
        codec = self.codec_for(nbytes=nbytes, dtype="float32", rank=2, backward=True, src=src, dst=dst,
                               parameter=True)
        if codec == "none":
            return float(nbytes), 0.0, 0.0

        def half(device: str) -> float:
            fixed, per_byte = self.costs.get(device, {}).get(codec, (0.0, 0.0))
            return (fixed + per_byte * nbytes) / 2

        return float(CODECS[codec].wire_bytes(nbytes)), half(src), half(dst)

    def codec_for(self, *, nbytes: float, dtype: str, rank: int | None, backward: bool, src: str, dst: str,
                  parameter: bool = False) -> str:
        """The codec of one tensor sent from ``src`` to ``dst`` (``"none"`` if it may not or need not shrink);
        ``parameter``: a weight sent to a copy or a weight's gradient sent to its sum or update (decided by
        :attr:`gradients`, never by :attr:`compression`)."""
        mode = self.gradients if parameter else self.compression
        if mode == "none" or not eligible(CODECS["bf16"], dtype=dtype, rank=rank, backward=False):
            return "none"
        backward = backward or parameter
        if mode != AUTO:
            codec = CODECS[mode]
            return codec.name if eligible(codec, dtype=dtype, rank=rank, backward=backward) else "none"
        bandwidth, latency = self.links.get((src, dst), (math.inf, 0.0))
        unknown = (math.inf, math.inf)
        at_src, at_dst = self.costs.get(src, {}), self.costs.get(dst, {})
        # encode runs on the sender, decode on the receiver: half of each device's round trip
        costs = {name: tuple((a + b) / 2 for a, b in zip(at_src.get(name, unknown), at_dst.get(name, unknown)))
                 for name in CODECS if name != "none"}
        return choose_codec(nbytes, bandwidth_bytes_per_s=bandwidth, latency_s=latency,
                            error_budget=math.inf if parameter else self.error_budget, backward=backward,
                            costs=costs)
