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

from cost_models.comm import LinkFit, fit_link

from .devices import DeviceSet

log = logging.getLogger(__name__)

#: Payload sizes (bytes) measured by default: 4 KiB .. 16 MiB.
DEFAULT_SIZES = (1 << 12, 1 << 16, 1 << 20, 1 << 22, 1 << 24)


def _median_seconds(fn: tf.types.experimental.ConcreteFunction, repeats: int) -> float:
    fn()  # warm-up (function instantiation on every device)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn().numpy()
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
    cost_models.CalibrationError
        Fewer than three sizes.
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
    fit = fit_link(xs, ys)
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
