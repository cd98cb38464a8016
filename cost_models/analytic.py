"""Analytic (roofline) compute costs for devices that are not present (no TensorFlow).

An op's time on a device is ``launch overhead + max(FLOPs / peak FLOP/s,
bytes moved / memory bandwidth)``. FLOPs and bytes come from a registry of
per-op-type formulas filled by the :func:`op_cost` decorator; each formula
reads an :class:`OpShapes` (op type, attributes, input and output shapes and
element sizes) that the caller extracts from its graph. Op types without a
formula fall back to "bytes in + bytes out, no FLOPs" and are listed as
*unknown* so that reports can show them.

Specs for a few devices ship with their public datasheet numbers
(:data:`HARDWARE`); :func:`calibrate` fits a spec to measured per-op times
by least squares, which is how a CPU (whose effective numbers depend on the
machine and thread count) gets a usable model.

Examples
--------
>>> mm = OpShapes("MatMul", inputs=((64, 512), (512, 1024)), outputs=((64, 1024),))
>>> flops, nbytes = op_flops_bytes(mm)
>>> flops, nbytes
(67108864.0, 2490368.0)
>>> spec = HARDWARE["nvidia-a100-40gb"]
>>> round(estimate_us(mm, spec), 2)   # compute-bound: 67 MFLOP at 19.5 TFLOP/s + 5 µs launch
8.44
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from itertools import combinations
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np

Shape = tuple[int, ...]


class SpecError(ValueError):
    """A hardware spec or calibration input is unusable (the message says which field)."""


@dataclass(frozen=True)
class OpShapes:
    """What the formulas need to know about one op.

    Shapes must be fully known (the planning batch size is fixed); element
    sizes are bytes per element of each input/output (4 for float32).
    """

    op_type: str
    inputs: tuple[Shape, ...] = ()
    outputs: tuple[Shape, ...] = ()
    input_itemsize: tuple[int, ...] = ()
    output_itemsize: tuple[int, ...] = ()
    attrs: Mapping[str, object] = field(default_factory=dict)

    def in_bytes(self) -> float:
        sizes = self.input_itemsize or (4,) * len(self.inputs)
        return float(sum(_numel(s) * b for s, b in zip(self.inputs, sizes)))

    def out_bytes(self) -> float:
        sizes = self.output_itemsize or (4,) * len(self.outputs)
        return float(sum(_numel(s) * b for s, b in zip(self.outputs, sizes)))


def _numel(shape: Shape) -> int:
    return int(np.prod(shape, dtype=np.int64)) if len(shape) else 1


@dataclass(frozen=True)
class HardwareSpec:
    """Roofline parameters of one device kind.

    Attributes
    ----------
    name : str
    peak_flops : float
        FLOP/s the device sustains on dense math (FP32 unless stated).
    memory_bandwidth : float
        Bytes/s between the device and its memory.
    launch_overhead_s : float
        Fixed cost per op (kernel launch / executor dispatch).
    source : str
        Where the numbers come from (datasheet, or a calibration).
    """

    name: str
    peak_flops: float
    memory_bandwidth: float
    launch_overhead_s: float
    source: str = ""

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> "HardwareSpec":
        """Build from a mapping, naming any missing or invalid field.

        Examples
        --------
        >>> HardwareSpec.from_dict({"name": "x", "peak_flops": 1e12})
        Traceback (most recent call last):
        ...
        cost_models.analytic.SpecError: hardware spec 'x' is missing field(s) ['memory_bandwidth', 'launch_overhead_s']
        """
        required = [f.name for f in fields(cls) if f.name not in ("source",)]
        missing = [f for f in required if f not in d]
        if missing:
            raise SpecError(f"hardware spec {d.get('name', '?')!r} is missing field(s) {missing}")
        spec = cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})
        for f in ("peak_flops", "memory_bandwidth"):
            v = getattr(spec, f)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise SpecError(f"hardware spec {spec.name!r}: {f} must be a positive number, got {v!r}")
        if not isinstance(spec.launch_overhead_s, (int, float)) or not spec.launch_overhead_s >= 0:
            raise SpecError(f"hardware spec {spec.name!r}: launch_overhead_s must be >= 0")
        return spec


#: Public datasheet numbers (dense FP32 without tensor cores; HBM/GDDR bandwidth).
#: Launch overheads are typical CUDA kernel launch costs, an assumption.
HARDWARE: dict[str, HardwareSpec] = {
    s.name: s for s in (
        HardwareSpec("nvidia-v100-sxm2", 15.7e12, 900e9, 5e-6, "NVIDIA V100 datasheet: 15.7 TFLOPS FP32, 900 GB/s"),
        HardwareSpec("nvidia-t4", 8.1e12, 320e9, 5e-6, "NVIDIA T4 datasheet: 8.1 TFLOPS FP32, 320 GB/s"),
        HardwareSpec("nvidia-a100-40gb", 19.5e12, 1555e9, 5e-6, "NVIDIA A100 datasheet: 19.5 TFLOPS FP32, 1555 GB/s"),
        HardwareSpec("nvidia-h100-sxm", 67e12, 3350e9, 5e-6, "NVIDIA H100 SXM datasheet: 67 TFLOPS FP32, 3.35 TB/s"),
        HardwareSpec("nvidia-h200-sxm", 67e12, 4800e9, 5e-6, "NVIDIA H200 datasheet: 67 TFLOPS FP32, 4.8 TB/s"),
    )
}

FlopsFn = Callable[[OpShapes], float]
#: op type -> FLOPs formula (bytes are inputs + outputs unless a formula says otherwise).
OP_FLOPS: dict[str, FlopsFn] = {}


def op_cost(*op_types: str) -> Callable[[FlopsFn], FlopsFn]:
    """Register a FLOPs formula for one or more op types."""

    def deco(fn: FlopsFn) -> FlopsFn:
        for t in op_types:
            OP_FLOPS[t] = fn
        return fn

    return deco


@op_cost("MatMul")
def _matmul(s: OpShapes) -> float:
    a = s.inputs[0]
    k = a[0] if s.attrs.get("transpose_a") else a[1]
    return 2.0 * k * _numel(s.outputs[0])


@op_cost("BatchMatMul", "BatchMatMulV2", "BatchMatMulV3")
def _batch_matmul(s: OpShapes) -> float:
    a = s.inputs[0]
    k = a[-2] if s.attrs.get("adj_x") else a[-1]
    return 2.0 * k * _numel(s.outputs[0])


@op_cost("Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter")
def _conv2d(s: OpShapes) -> float:
    # 2 * (output elements of the forward conv) * kh * kw * cin; the backprops cost the same.
    fwd_out = s.outputs[0] if s.op_type == "Conv2D" else (s.inputs[2] if s.op_type == "Conv2DBackpropFilter"
                                                         else s.inputs[2])
    filt = s.inputs[1] if s.op_type != "Conv2DBackpropFilter" else s.outputs[0]
    kh, kw, cin = filt[0], filt[1], filt[2]
    return 2.0 * _numel(fwd_out) * kh * kw * cin


@op_cost("DepthwiseConv2dNative", "DepthwiseConv2dNativeBackpropInput", "DepthwiseConv2dNativeBackpropFilter")
def _depthwise(s: OpShapes) -> float:
    filt = s.inputs[1] if s.op_type != "DepthwiseConv2dNativeBackpropFilter" else s.outputs[0]
    fwd_out = s.outputs[0] if s.op_type == "DepthwiseConv2dNative" else s.inputs[2]
    return 2.0 * _numel(fwd_out) * filt[0] * filt[1]


_ELEMENTWISE = ("Add", "AddV2", "Sub", "Mul", "RealDiv", "Maximum", "Minimum", "BiasAdd", "BiasAddGrad", "Relu",
                "Relu6", "ReluGrad", "Relu6Grad", "Neg", "Square", "SquaredDifference", "Cast", "AddN",
                "Sigmoid", "SigmoidGrad", "Tanh", "TanhGrad", "Exp", "Log", "Sqrt", "Rsqrt", "Pow", "Erf",
                "Selu", "Elu", "Softplus", "FloorDiv", "Mean", "Sum", "Max", "Min", "Prod", "ArgMax",
                "AvgPool", "MaxPool", "MaxPoolGrad", "AvgPoolGrad")


@op_cost(*_ELEMENTWISE)
def _elementwise(s: OpShapes) -> float:
    return float(max((_numel(x) for x in (*s.inputs, *s.outputs)), default=0))


@op_cost("Softmax", "LogSoftmax", "SoftmaxCrossEntropyWithLogits", "SparseSoftmaxCrossEntropyWithLogits")
def _softmax(s: OpShapes) -> float:
    return 5.0 * _numel(s.inputs[0])


@op_cost("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3", "FusedBatchNormGradV3")
def _batch_norm(s: OpShapes) -> float:
    return 8.0 * _numel(s.inputs[0])


@op_cost("ResourceApplyAdam", "ApplyAdam", "ResourceApplyGradientDescent", "AssignVariableOp",
         "AssignAddVariableOp", "AssignSubVariableOp")
def _update(s: OpShapes) -> float:
    return 10.0 * max((_numel(x) for x in s.inputs), default=0)


@op_cost("ResourceGather", "GatherV2", "Identity", "ReadVariableOp", "Reshape", "Transpose", "ConcatV2", "Pack",
         "Slice", "StridedSlice", "Pad", "Tile", "Squeeze", "ExpandDims")
def _data_movement(s: OpShapes) -> float:
    return 0.0


_FREE = frozenset({"Const", "Placeholder", "NoOp", "Shape", "VarHandleOp", "_Arg", "_Retval", "Size", "Rank"})


def op_flops_bytes(s: OpShapes) -> tuple[float, float]:
    """``(FLOPs, bytes moved)`` of one op; unknown ops get 0 FLOPs and their bytes."""
    if s.op_type in _FREE:
        return 0.0, 0.0
    fn = OP_FLOPS.get(s.op_type)
    flops = fn(s) if fn is not None else 0.0
    return float(flops), s.in_bytes() + s.out_bytes()


def estimate_us(s: OpShapes, spec: HardwareSpec) -> float:
    """Roofline time of one op on ``spec`` in µs (free ops cost nothing)."""
    if s.op_type in _FREE:
        return 0.0
    flops, nbytes = op_flops_bytes(s)
    return 1e6 * (spec.launch_overhead_s + max(flops / spec.peak_flops, nbytes / spec.memory_bandwidth))


@dataclass(frozen=True)
class AnalyticEstimate:
    """µs per op name, and which op types had no formula."""

    us: Mapping[str, float]
    unknown_op_types: tuple[str, ...]


def estimate_graph(ops: Mapping[str, OpShapes], spec: HardwareSpec) -> AnalyticEstimate:
    """Roofline µs of every op of a graph (op name → shapes)."""
    unknown = sorted({s.op_type for s in ops.values() if s.op_type not in OP_FLOPS and s.op_type not in _FREE})
    return AnalyticEstimate({name: estimate_us(s, spec) for name, s in ops.items()}, tuple(unknown))


@dataclass(frozen=True)
class Calibration:
    """A spec fitted to measured times, with how well it fits."""

    spec: HardwareSpec
    r2: float
    median_abs_rel_error: float
    points: int


def calibrate(ops: Iterable[OpShapes], measured_us: Sequence[float], name: str = "calibrated",
              min_points: int = 8) -> Calibration:
    """Fit ``t = overhead + flops / peak + bytes / bandwidth`` to measured op times (least squares, ≥ 0).

    The additive form (rather than the roofline's max) keeps the fit linear;
    the fitted peak and bandwidth then feed the roofline estimate.

    Raises
    ------
    SpecError
        Fewer than ``min_points`` ops with a non-zero time, or a degenerate
        fit (no FLOPs or no bytes among them).

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> shapes = [OpShapes("MatMul", ((n, 256), (256, 256)), ((n, 256),)) for n in range(8, 264, 16)]
    >>> shapes += [OpShapes("Relu", ((n, 4096),), ((n, 4096),)) for n in range(8, 264, 16)]
    >>> true = [1e6 * (2e-6 + f / 5e10 + b / 2e10) for f, b in map(op_flops_bytes, shapes)]
    >>> c = calibrate(shapes, true)
    >>> round(c.spec.peak_flops / 1e10, 2), round(c.spec.memory_bandwidth / 1e10, 2), round(c.r2, 6)
    (5.0, 2.0, 1.0)
    """
    ops = list(ops)
    y = np.asarray(measured_us, dtype=float) * 1e-6
    if len(ops) != len(y):
        raise SpecError(f"{len(ops)} ops but {len(y)} measured times")
    fb = np.array([op_flops_bytes(s) for s in ops]) if ops else np.zeros((0, 2))
    keep = (y > 0) & np.isfinite(y) & np.array([s.op_type not in _FREE for s in ops], dtype=bool)
    if keep.sum() < min_points:
        raise SpecError(f"calibration needs at least {min_points} measured ops with a non-zero time, "
                        f"got {int(keep.sum())}; profile a larger graph or more op types")
    a = np.column_stack([np.ones(keep.sum()), fb[keep, 0], fb[keep, 1]])
    if not (a[:, 1] > 0).any() or not (a[:, 2] > 0).any():
        raise SpecError("calibration needs ops with FLOPs and ops with bytes moved (e.g. MatMul and Relu)")
    # Non-negative least squares on scaled columns (scipy-free: a tiny active-set loop).
    scale = a.max(axis=0)
    coef = _nnls(a / scale, y[keep]) / scale
    overhead, inv_peak, inv_bw = coef
    pred = a @ coef
    ss_res = float(((y[keep] - pred) ** 2).sum())
    ss_tot = float(((y[keep] - y[keep].mean()) ** 2).sum()) or 1.0
    rel = np.abs(pred - y[keep]) / y[keep]
    spec = HardwareSpec(name, float(1.0 / inv_peak) if inv_peak > 0 else float("inf"),
                        float(1.0 / inv_bw) if inv_bw > 0 else float("inf"), float(overhead),
                        f"least-squares fit to {int(keep.sum())} measured ops")
    return Calibration(spec, 1.0 - ss_res / ss_tot, float(np.median(rel)), int(keep.sum()))


def _nnls(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with non-negative coefficients for a handful of columns (exhaustive active sets)."""
    best, best_res = np.zeros(a.shape[1]), float((y ** 2).sum())
    cols = range(a.shape[1])
    for r in range(1, a.shape[1] + 1):
        for subset in map(list, combinations(cols, r)):
            sol, *_ = np.linalg.lstsq(a[:, subset], y, rcond=None)
            if (sol < 0).any():
                continue
            res = float(((a[:, subset] @ sol - y) ** 2).sum())
            if res < best_res:
                best_res = res
                best = np.zeros(a.shape[1])
                best[list(subset)] = sol
    return best
