"""Measure the links between real devices and fit latency + bytes / bandwidth.

For each ordered pair ``(i, j)`` and each size, a ``tf.function`` reads a
float32 payload variable on device ``i`` and reduces it on device ``j``; the
same function with both ops on ``i`` is the baseline, and the difference of
the medians is the transfer time. :func:`cost_models.fit_link` turns the
points into a :class:`~cost_models.Link` with its fit quality.
"""

from __future__ import annotations

import logging
import time
from typing import Sequence

import numpy as np
import tensorflow as tf

from cost_models.comm import CalibrationError, Dispatch, LinkFit, fit_link

from .devices import DeviceSet
from .errors import CostError

log = logging.getLogger(__name__)

#: Payload sizes (bytes) measured by default: 4 KiB .. 16 MiB.
DEFAULT_SIZES = (1 << 12, 1 << 16, 1 << 20, 1 << 22, 1 << 24)


def _median_seconds(fn: tf.types.experimental.ConcreteFunction, repeats: int) -> float:
    fn()  # warm-up (function instantiation on every device)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        tf.nest.map_structure(lambda x: x.numpy(), fn())
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def _reader(payload: tf.Variable, src: str, where: str):
    @tf.function
    def f():
        with tf.device(src):
            x = payload.read_value() * 1.0
        with tf.device(where):
            return tf.reduce_sum(x)

    return f


def measure_link(src: str, dst: str, sizes: Sequence[int] = DEFAULT_SIZES, repeats: int = 7) -> LinkFit:
    """Measure transfers ``src -> dst`` of each size and fit them.

    Raises
    ------
    CostError
        Fewer than three distinct sizes (the fit needs them).
    """
    xs, ys = [], []
    for size in sizes:
        n = max(1, int(size) // 4)
        with tf.device(src):
            payload = tf.Variable(tf.ones([n], tf.float32))

        cross = _median_seconds(_reader(payload, src, dst), repeats)
        local = _median_seconds(_reader(payload, src, src), repeats)
        xs.append(4.0 * n)
        ys.append(max(cross - local, 0.0))
    try:
        fit = fit_link(xs, ys)
    except CalibrationError as e:
        raise CostError(f"cannot calibrate link {src} -> {dst}: {e}; pass at least three sizes") from None
    log.info("link %s -> %s: %.1f µs + %.3g GB/s (R² %.3f)", src, dst, fit.link.latency_s * 1e6,
             fit.link.bandwidth_bytes_per_s / 1e9, fit.r2)
    return fit


def calibrate_links(devset: DeviceSet, sizes: Sequence[int] = DEFAULT_SIZES,
                    repeats: int = 7) -> tuple[DeviceSet, dict[tuple[int, int], LinkFit]]:
    """Measure every ordered pair of ``devset`` and return it with the fitted links."""
    fits = {}
    for i, a in enumerate(devset.devices):
        for j, b in enumerate(devset.devices):
            if i != j:
                fits[(i, j)] = measure_link(a.name, b.name, sizes, repeats)
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
