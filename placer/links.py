"""Measure the links between real devices and fit latency + bytes / bandwidth.

What the simulator needs is the time from a producer's end to its consumer's
start on another device *inside a step*, so a link is measured as a
ping-pong chain: a float32 payload is multiplied ``h`` times, each multiply
on the other device of the pair (every one receives the previous result).
The slope of the step time between a short and a long chain, minus the slope
of the same chains on one device (the multiplies), is the time of one hop.
Fixed costs of a step (the client's dispatch, involving a second process,
fetching the result) cancel in the slope: they are measured separately by
:func:`measure_dispatch`. (An earlier version timed one transfer per step
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
from typing import Callable, Sequence

import numpy as np
import tensorflow as tf

from cost_models.comm import CalibrationError, Dispatch, LinkFit, fit_link

from .devices import DeviceSet
from .errors import CostError

log = logging.getLogger(__name__)

#: Payload sizes (bytes) measured by default: 4 KiB .. 16 MiB.
DEFAULT_SIZES = (1 << 12, 1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24)


def _median_seconds(fn: tf.types.experimental.ConcreteFunction, repeats: int) -> float:
    fn()  # warm-up (function instantiation on every device)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        tf.nest.map_structure(lambda x: x.numpy(), fn())
        times.append(time.perf_counter() - t)
    return float(np.median(times))


#: Chain lengths (hops) whose difference gives one hop's time.
DEFAULT_HOPS = (2, 10)


def _slope(make: Callable[[int], tf.types.experimental.GenericFunction], sizes: tuple[int, int],
           repeats: int) -> float:
    """Median step time of ``make(sizes[1])`` minus that of ``make(sizes[0])``, per unit of size."""
    lo, hi = sizes
    return (_median_seconds(make(hi), repeats) - _median_seconds(make(lo), repeats)) / (hi - lo)


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
    docstring).

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

        hop = (_slope(lambda h: _chain(payload, [one_dst, one_src], [dst, src], h), hops, repeats)
               - _slope(lambda h: _chain(payload, [one_src], [src], h), hops, repeats))
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

    cost = max(_slope(lambda n: _fan_out(payload, [one_src, one_dst], src, dst, n), counts, repeats)
               - _slope(lambda n: _fan_out(payload, [one_src, one_src], src, src, n), counts, repeats), 0.0)
    log.info("transfer CPU cost %s -> %s: %.1f µs", src, dst, cost * 1e6)
    return cost


def calibrate_links(devset: DeviceSet, sizes: Sequence[int] = DEFAULT_SIZES,
                    repeats: int = 7) -> tuple[DeviceSet, dict[tuple[int, int], LinkFit]]:
    """Measure every pair of ``devset`` and return it with the fitted links.

    Each unordered pair is measured once (a hop alternates directions) and
    its fit is given to both ``(i, j)`` and ``(j, i)``.
    """
    fits = {}
    for i, a in enumerate(devset.devices):
        for j, b in enumerate(devset.devices):
            if i < j:
                fits[(i, j)] = fits[(j, i)] = measure_link(a.name, b.name, sizes, repeats)
    return DeviceSet(devset.devices, {ij: f.link for ij, f in fits.items()}), fits


def measure_dispatch(devices: Sequence[str], repeats: int = 15) -> Dispatch:
    """Fixed per-step cost of a function on one device vs spread over the processes of ``devices``.

    Each device gets one independent scalar op (no data crosses devices), so
    the difference between "all devices" and "first device only" is the cost
    of involving more processes. Devices of one process count once.
    """
    hosts = list(dict.fromkeys(d.rsplit("/device:", 1)[0] for d in devices))
    first = [d for d in devices if d.startswith(hosts[0])][:1]
    per_host = [next(d for d in devices if d.startswith(h)) for h in hosts]

    def scalar_ops(where: Sequence[str]):
        @tf.function
        def f():
            outs = []
            for d in where:
                with tf.device(d):
                    outs.append(tf.constant(1.0) + 1.0)
            return tuple(outs)  # fetched separately: no tensor crosses between devices

        return f

    one = _median_seconds(scalar_ops(first), repeats)
    if len(hosts) == 1:
        return Dispatch(one, 0.0)
    many = _median_seconds(scalar_ops(per_host), repeats)
    extra = max(many - one, 0.0) / (len(hosts) - 1)
    log.info("dispatch: %.2f ms per step + %.2f ms per extra process", one * 1e3, extra * 1e3)
    return Dispatch(one, extra)
