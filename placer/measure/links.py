"""Measure the links between real devices and fit latency + bytes / bandwidth.

What the simulator needs is the time from a producer's end to its consumer's
start on another device *inside a step*, so a link is measured as a
ping-pong chain: a float32 payload is multiplied ``h`` times, each multiply
on the other device of the pair (every one receives the previous result).
The slope of the step time between a short and a long chain, minus the slope
of the same chains on one device (the multiplies), is the time of one hop.
Fixed costs of a step (the client's dispatch, involving a second process,
fetching the result) cancel in the slope: they are measured separately by
:func:`measure_call`. (An earlier version timed one transfer per step
against a one-device baseline; that difference included the second
process's dispatch, so the fitted latency came out ~1 ms on gRPC loopback
and transfer-heavy plans were over-predicted by 40-120%.)

A hop alternates directions, so the fit is the mean of ``i -> j`` and
``j -> i``; :func:`calibrate_links` measures each pair once and gives the
fit to both directions. :func:`cost_models.fit_link` turns the points into a
:class:`~cost_models.Link` with its fit quality.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Hashable, Iterable, Sequence

import numpy as np
import tensorflow as tf

from cost_models.pool import paired_payload_events

from cost_models.comm import CalibrationError, LinkFit, fit_link

from ..core.devices import DeviceSet
from ..errors import CostError

log = logging.getLogger(__name__)

#: This process's CPU, where a caller's inputs live and its outputs are fetched to.
CLIENT_DEVICE = "/job:localhost/replica:0/task:0/device:CPU:0"

#: Payload sizes (bytes) measured by default: 4 KiB .. 16 MiB.
DEFAULT_SIZES = (1 << 12, 1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24)


def on_caller(x: tf.Tensor) -> tf.Tensor:
    """Inside a function: ``x`` copied to this process's CPU (:data:`CLIENT_DEVICE`) when it is made on another
    process's device (a gRPC worker), else ``x`` itself.

    An output a function returns from a worker's device is fetched by TensorFlow's eager runtime after the
    call; when the function also captures two or more variables, that fetch took 3x as long at a shaped
    1 Gbit/s link for 16 MB (393 against 132 ms: the loopback's byte count said the output crossed three
    times) and 2.6-3.0x on loopback, and a 320-byte output 0.4-1.3 ms more per call (0.2-0.6 ms without
    captured variables; TF 2.21, 2026-12-07,
    ``benchmarks/fetch_to_caller.py``). Received inside the function (an identity on the caller's CPU), it
    crosses once at the link's speed. Placed functions, their stand-ins (:func:`stand_in`) and the
    benchmarks' one-worker baselines return every output through here.

    Examples
    --------
    >>> with tf.Graph().as_default():
    ...     with tf.device("/job:worker/replica:0/task:1/device:CPU:0"):
    ...         y = tf.ones([2])
    ...     z = tf.ones([2])
    ...     on_caller(y).device, on_caller(z) is z
    ('/job:localhost/replica:0/task:0/device:CPU:0', True)
    """
    spec = tf.DeviceSpec.from_string(x.device or "")
    if spec.job in (None, "localhost"):
        return x
    with tf.device(CLIENT_DEVICE):
        return tf.identity(x)


def call_seconds(fn: Callable[[], Any]) -> float:
    """Wall seconds of one call of ``fn``, its results fetched to this process.

    Examples
    --------
    >>> call_seconds(lambda: tf.constant(1.0) + 1.0) > 0
    True
    """
    t = time.perf_counter()
    tf.nest.map_structure(lambda x: x.numpy(), fn())
    return time.perf_counter() - t


#: Untimed calls before a call's fixed cost is timed: the first instantiates the function on every device, and
#: the next two still ran ~0.5 ms slower than later ones against two gRPC workers (3.6/3.3 against a median of
#: 2.4-2.7 ms, 2026-12-06).
CALL_WARMUP = 3


def _median_seconds(fn: Callable[[], Any], repeats: int) -> float:
    for _ in range(CALL_WARMUP):
        fn()
    return float(np.median([call_seconds(fn) for _ in range(repeats)]))


#: Chain lengths (hops) whose difference gives one hop's time.
DEFAULT_HOPS = (2, 10)

#: Payloads larger than this many bytes (beyond :data:`DEFAULT_SIZES`: only where a caller asks for them,
#: as ``benchmarks``' probes do; ``autoplace`` calibrates the default sizes, see ``docs/costs.md``) ...
LARGE_PAYLOAD_BYTES = 1 << 24

#: ... run chains of these lengths, ...
LARGE_PAYLOAD_HOPS = (1, 3)

#: ... in at most this many rounds: a 128 MiB hop took 1.1 s at a 1 Gbit/s link (2026-12-07).
LARGE_PAYLOAD_REPEATS = 4

#: Payloads smaller than this many bytes get a longer chain, ...
SMALL_PAYLOAD_BYTES = 1 << 20

#: ... of this many hops: a small hop (~200 µs on gRPC loopback) is a small
#: part of a 10-hop step, and the hop time of 4 KiB .. 256 KiB spread 40-120 µs
#: (standard deviation over 8 measurements of 3 rounds) with 10 hops against
#: 20-30 µs with 34; the latency fitted from them came out 0 in a CI run.
SMALL_PAYLOAD_HOPS = 34


def _excess_slope(make: Callable[[int, bool], Callable[[], Any]], sizes: tuple[int, int], repeats: int) -> float:
    """Per unit of size: how much faster ``make(n, True)`` grows with ``n`` than ``make(n, False)``.

    The four functions (both sizes, with and without the measured effect)
    run interleaved, once each per round, and the result is the median over
    rounds of ``((with hi - with lo) - (without hi - without lo)) / (hi - lo)``:
    a slow spell of the machine hits all four runs of a round alike and
    cancels, where timing each function's repeats in a block let drift
    between blocks into the difference (link fits with R² < 0 on this VM).
    """
    lo, hi = sizes
    fns = [make(n, effect) for effect in (True, False) for n in (lo, hi)]
    for fn in fns:  # warm-up (function instantiation on every device)
        call_seconds(fn)
    rounds = []
    for _ in range(repeats):
        t = [call_seconds(fn) for fn in fns]
        rounds.append(((t[1] - t[0]) - (t[3] - t[2])) / (hi - lo))
    return float(np.median(rounds))


def _chain(payload: tf.Variable, scales: Sequence[tf.Variable], devices: Sequence[str], hops: int):
    """``payload`` multiplied ``hops`` times, the i-th time on ``devices[i % len(devices)]``.

    The scale is a variable on each device (a constant 1.0 would be folded
    away by Grappler), so every multiply is real and reads its input from the
    previous device.
    """

    @tf.function
    def f():
        x = payload.read_value()
        for i in range(hops):
            d = i % len(devices)
            with tf.device(devices[d]):
                x = x * scales[d]
        with tf.device(devices[(hops - 1) % len(devices)]):
            return tf.reduce_sum(x[:1])

    return f


def measure_link(src: str, dst: str, sizes: Sequence[int] = DEFAULT_SIZES, repeats: int = 7,
                 hops: tuple[int, int] = DEFAULT_HOPS) -> LinkFit:
    """Measure one in-step hop between ``src`` and ``dst`` for each size and fit them.

    Returns the fit of the mean of both directions (see the module
    docstring). ``hops`` are the short and long chains; payloads under
    :data:`SMALL_PAYLOAD_BYTES` use a long chain of at least
    :data:`SMALL_PAYLOAD_HOPS` (their hop is mostly latency, and a longer
    chain lifts it above the step's noise), payloads over
    :data:`LARGE_PAYLOAD_BYTES` chains of :data:`LARGE_PAYLOAD_HOPS` in at most
    :data:`LARGE_PAYLOAD_REPEATS` rounds. The fit keeps the measured times
    (``Link.points``).

    Raises
    ------
    CostError
        Fewer than three distinct sizes (the fit needs them), or ``hops``
        not two increasing positive lengths.
    """
    short, long_ = hops
    if not 0 < short < long_:
        raise CostError(f"hops must be two increasing positive chain lengths, got {hops!r}")
    with tf.device(src):
        one_src = tf.Variable(1.0)
    with tf.device(dst):
        one_dst = tf.Variable(1.0)
    xs, ys = [], []
    for size in sizes:
        n = max(1, int(size) // 4)
        with tf.device(src):
            payload = tf.Variable(tf.ones([n], tf.float32))

        chains = (short, max(long_, SMALL_PAYLOAD_HOPS)) if 4 * n < SMALL_PAYLOAD_BYTES else hops
        rounds = repeats
        if 4 * n > LARGE_PAYLOAD_BYTES:
            chains, rounds = LARGE_PAYLOAD_HOPS, min(repeats, LARGE_PAYLOAD_REPEATS)
        hop = _excess_slope(lambda h, cross: _chain(payload, [one_dst, one_src] if cross else [one_src],
                                                    [dst, src] if cross else [src], h), chains, rounds)
        xs.append(4.0 * n)
        ys.append(max(hop, 0.0))
    try:
        fit = fit_link(xs, ys)
    except CalibrationError as e:
        raise CostError(f"cannot calibrate link {src} <-> {dst}: {e}; pass at least three sizes") from None
    log.info("link %s <-> %s: %.1f µs + %.3g GB/s per hop (R² %.3f)", src, dst, fit.link.latency_s * 1e6,
             fit.link.bandwidth_bytes_per_s / 1e9, fit.r2)
    return fit


def _fan_out(payload: tf.Variable, scales: Sequence[tf.Variable], src: str, dst: str, n: int):
    """``n`` independent 64-byte slices made on ``src`` and each scaled on ``dst`` (``n`` transfers in flight)."""

    @tf.function
    def f():
        with tf.device(src):
            parts = [payload[16 * i:16 * i + 16] * scales[0] for i in range(n)]
        with tf.device(dst):
            return tf.add_n([x * scales[1] for x in parts])[0]

    return f


def measure_transfer_cpu(src: str, dst: str, counts: tuple[int, int] = (8, 64), repeats: int = 15) -> float:
    """Seconds one small transfer ``src -> dst`` costs when many are in flight at once.

    The slope of the step time of a fan-out (``counts`` independent tiny
    tensors, each consumed on ``dst``) over the number of tensors, minus the
    same fan-out on ``src`` alone. Transfers in flight overlap their
    latency, so what remains is the work each one costs the two processes
    (serialisation, RPC handling): on one-core workers that work does not
    overlap compute. Use it as ``transfer_cpu_s`` of
    :func:`cost_models.simulate` (charged on both devices). Measured here:
    28–79 µs between two pinned one-thread gRPC workers (0 on logical
    devices of one process is typical).

    Raises
    ------
    CostError
        If ``counts`` are not two increasing positive numbers.
    """
    few, many = counts
    if not 0 < few < many:
        raise CostError(f"counts must be two increasing positive numbers of transfers, got {counts!r}")
    with tf.device(src):
        payload = tf.Variable(tf.ones([16 * many]))
        one_src = tf.Variable(1.0)
    with tf.device(dst):
        one_dst = tf.Variable(1.0)

    cost = max(_excess_slope(lambda n, cross: _fan_out(payload, [one_src, one_dst if cross else one_src], src,
                                                       dst if cross else src, n), counts, repeats), 0.0)
    log.info("transfer CPU cost %s -> %s: %.1f µs", src, dst, cost * 1e6)
    return cost


def calibration_pool_events(label: Hashable, sizes: Sequence[int] = DEFAULT_SIZES) -> list[tuple[Hashable, float]]:
    """What :func:`measure_link` leaves in each end's allocator pool, as ``(key, bytes)`` events
    (:attr:`placer.core.devices.DeviceSet.pool_history`): for each payload size in turn, two tensors of that
    size at once (a hop's input and its product), then both freed (:func:`cost_models.pool.paired_payload_events`).

    >>> calibration_pool_events("link", [4096, 1 << 20])[:3]
    [(('link', 4096, 0), 4096.0), (('link', 4096, 1), 4096.0), (('link', 4096, 0), -1.0)]
    """
    return paired_payload_events(label, sizes)


def calibrate_links(devset: DeviceSet, sizes: Sequence[int] = DEFAULT_SIZES, repeats: int = 7, *,
                    cross_process_only: bool = False, transfer_cpu: bool = False
                    ) -> tuple[DeviceSet, dict[tuple[int, int], LinkFit]]:
    """Measure every pair of ``devset`` and return it with the fitted links.

    Each unordered pair is measured once (a hop alternates directions) and
    its fit is given to both ``(i, j)`` and ``(j, i)``; the returned set
    marks those links calibrated (``DeviceSet.calibrated``), and records in both ends' pool history what the
    payloads left in their allocator pools (:func:`calibration_pool_events`).
    ``cross_process_only``: only pairs on different processes (gRPC tasks); the others keep their links.
    ``transfer_cpu``: also measure each pair's CPU cost per transfer (:func:`measure_transfer_cpu`,
    the mean of both directions) into ``Link.cpu_s``; else each link keeps the ``cpu_s`` it had (between
    processes, :data:`placer.core.devices.DEFAULT_REMOTE_TRANSFER_CPU_S`).
    """
    fits = {}
    cpu: dict[tuple[int, int], float] = {}
    for i, a in enumerate(devset.devices):
        for j, b in enumerate(devset.devices):
            if i < j and not (cross_process_only and a.host == b.host):
                fits[(i, j)] = fits[(j, i)] = measure_link(a.name, b.name, sizes, repeats)
                if transfer_cpu:
                    cpu[(i, j)] = cpu[(j, i)] = float(np.mean([measure_transfer_cpu(a.name, b.name),
                                                               measure_transfer_cpu(b.name, a.name)]))
    old = devset.links  # a link whose CPU cost is not measured keeps the one it had
    links = {**old, **{ij: replace(f.link, cpu_s=cpu.get(ij, old[ij].cpu_s if ij in old else 0.0))
                       for ij, f in fits.items()}}
    out = replace(devset, links=links, fits={**devset.fits, **fits})
    return with_calibration_history(out, [ij for ij in fits if ij[0] < ij[1]], sizes), fits


def with_calibration_history(devset: DeviceSet, pairs: Iterable[tuple[int, int]],
                             sizes: Sequence[int] = DEFAULT_SIZES) -> DeviceSet:
    """``devset`` with both ends of each calibrated pair given what the calibration left in their pools
    (:func:`calibration_pool_events`); also where the links' figures are read back from the profile cache,
    which keys them by the worker processes that were calibrated (their pools still hold those regions)."""
    for i, j in sorted(pairs):
        for d in (i, j):
            devset = devset.with_pool_events(d, calibration_pool_events(("link calibration", i, j), sizes))
    return devset


@dataclass(frozen=True)
class TensorAt:
    """A tensor of ``shape`` and ``dtype`` living on ``device``."""

    device: str
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class CallInterface:
    """What one call of a placed function costs besides its compute.

    Attributes
    ----------
    inputs : tuple of TensorAt
        Tensors the caller feeds, each on the device of its placeholder.
    outputs : tuple of TensorAt
        Tensors the caller fetches, each on the device that produces it.
    variables : tuple of (str, int)
        Number of captured variables per device.
    devices : tuple of str
        Every device the function runs ops on.
    joined : int
        The outputs come as this many consecutive parts of each result, which the function joins on the
        caller (data-parallel copies: the parts are received at once, each from its device); 1: each output
        is fetched as it is.
    """

    inputs: tuple[TensorAt, ...]
    outputs: tuple[TensorAt, ...]
    variables: tuple[tuple[str, int], ...]
    devices: tuple[str, ...]
    joined: int = 1


def stand_in(interface: CallInterface) -> Callable[[], list[tf.Tensor]]:
    """A call of a function with ``interface``'s inputs, outputs, captures and devices, and next to no compute.

    Every device gets a scalar made of its own inputs' first elements, its
    variables and one op of its own; each output is that scalar filled into
    the output's shape on the output's device, received on the caller as a
    placed function's outputs are (:func:`on_caller`). No tensor crosses between
    devices except the caller's inputs and outputs.
    """
    variables: dict[str, list[tf.Variable]] = {}
    for device, count in interface.variables:
        with tf.device(device):
            variables[device] = [tf.Variable(0.0) for _ in range(count)]
    devices = list(dict.fromkeys([*interface.devices, *(t.device for t in interface.inputs),
                                  *(t.device for t in interface.outputs)]))

    @tf.function(autograph=False)
    def f(*xs: tf.Tensor) -> list[tf.Tensor]:
        scalars: dict[str, tf.Tensor] = {}
        for d in devices:
            with tf.device(d):
                parts = [tf.cast(tf.reshape(x, [-1])[0], tf.float32)
                         for x, spec in zip(xs, interface.inputs) if spec.device == d]
                parts += [v.read_value() for v in variables.get(d, [])]
                scalars[d] = tf.add_n([tf.constant(1.0) + 1.0, *parts])
        outs = []
        for spec in interface.outputs:
            with tf.device(spec.device):
                outs.append(tf.cast(tf.fill(spec.shape, scalars[spec.device]), spec.dtype))
        if interface.joined > 1 and all(len(spec.shape) for spec in interface.outputs):
            k = len(outs) // interface.joined
            with tf.device(CLIENT_DEVICE):
                outs = [tf.concat(outs[j::k], axis=0) for j in range(k)]
        return [on_caller(y) for y in outs]  # as placed functions return them

    with tf.device(CLIENT_DEVICE):
        feeds = [tf.zeros(spec.shape, spec.dtype) for spec in interface.inputs]
    return lambda: f(*feeds)


def measure_call(interface: CallInterface, repeats: int = 15) -> float:
    """Median seconds of one call of a stand-in with ``interface`` (see :class:`CallInterface`).

    The stand-in feeds the same inputs from this process, fetches the same
    outputs back, captures as many variables per device and runs an op on
    every device, but computes next to nothing: its time is the fixed cost of
    a call of the placed function (the client's dispatch, one round of
    RPCs per worker, the inputs' and outputs' transfers, the captures'
    handling). Add it to a simulated makespan to predict a step.

    Measured here (2026-11-30, one pinned gRPC worker): 2.4 ms for a scalar
    function; 5.6–8.1 ms for the interfaces of the fidelity workloads
    (64–378 variables, up to 0.6 MB in and out), where the older
    dispatch-plus-link estimate gave ~3 ms.

    Examples
    --------
    >>> iface = CallInterface(inputs=(TensorAt("/CPU:0", (4, 8), "float32"),),
    ...                       outputs=(TensorAt("/CPU:0", (4, 2), "float32"),),
    ...                       variables=(("/CPU:0", 3),), devices=("/CPU:0",))
    >>> 0 < measure_call(iface, repeats=3) < 1
    True
    """
    return _median_seconds(stand_in(interface), repeats)


