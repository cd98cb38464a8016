"""Communication cost model: latency + bytes / bandwidth per ordered link, or its measured transfer times."""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class Link:
    """Latency + bytes / bandwidth model of one ordered device pair, or the measured times it was fitted to.

    With ``points`` (measured ``(bytes, seconds)`` of one transfer, sizes increasing), a transfer's time
    is read from them: interpolated between two measured sizes, the smallest's time below them, and above the
    largest that size's rate (its seconds per byte). A calibrated link's time per byte is not one number: two
    one-core gRPC workers moved 1-4 MiB at 1.4-1.8 GB/s and 64-128 MiB at 0.97-1.1 GB/s (loopback, and shaped
    to 10 Gbit/s, 2026-12-07), so the line fitted to 4 KiB-16 MiB predicted 128 MiB 32-48% fast. The fit
    (``bandwidth_bytes_per_s``, ``latency_s``) stays what the solvers' linear models read.

    Examples
    --------
    >>> Link(1e9, 1e-3).seconds(1e6)
    0.002
    >>> Link(1e9, 1e-3).seconds(0)
    0.0
    >>> measured = Link(1e9, 1e-4, points=((1e3, 1e-4), (1e6, 1.1e-3), (1e8, 0.2)))
    >>> [round(measured.seconds(b), 6) for b in (10, 1e3, 5.05e7, 2e8)]
    [0.0001, 0.0001, 0.10055, 0.4]
    """

    bandwidth_bytes_per_s: float
    latency_s: float
    #: CPU seconds one transfer costs on *each* end (serialisation, RPC handling: TF's ``_Send``/``_Recv``),
    #: which queue with the devices' ops (``cost_models.SimOptions.transfer_cpu_s``); 0: not modelled.
    cpu_s: float = 0.0
    #: Measured ``(bytes, seconds)`` of one transfer, sizes increasing (see above); empty: the line alone.
    points: tuple[tuple[float, float], ...] = ()

    def seconds(self, nbytes: float) -> float:
        """Transfer time of ``nbytes``; zero bytes cost nothing."""
        if nbytes <= 0:
            return 0.0
        if not self.points:
            return self.latency_s + nbytes / self.bandwidth_bytes_per_s
        sizes = [b for b, _ in self.points]
        i = bisect.bisect_left(sizes, nbytes)
        if i == 0:
            return self.points[0][1]
        if i == len(sizes):
            b, s = self.points[-1]
            return s * nbytes / b
        (b0, s0), (b1, s1) = self.points[i - 1], self.points[i]
        return s0 + (s1 - s0) * (nbytes - b0) / (b1 - b0)


def measured_points(nbytes: Sequence[float], seconds: Sequence[float], floor: float = 0.0
                    ) -> tuple[tuple[float, float], ...]:
    """``(bytes, seconds)`` for :attr:`Link.points`: sorted by size, each time at least ``floor`` (the fitted
    latency: a hop of a small tensor measured near 0 is noise) and at least the time of every smaller size (a
    noisy measurement never makes a larger transfer cheaper).

    Examples
    --------
    >>> measured_points([4e6, 1e3, 1e6, 1e6], [2e-3, 1e-4, 5e-5, 3e-4])
    ((1000.0, 0.0001), (1000000.0, 0.0003), (4000000.0, 0.002))
    """
    out: list[tuple[float, float]] = []
    for b, s in sorted(zip(map(float, nbytes), map(float, seconds))):
        floor = max(floor, s)
        if out and out[-1][0] == b:
            out.pop()  # one size measured twice: the larger time (the floor)
        out.append((b, floor))
    return tuple(out)


class CalibrationError(ValueError):
    """Measurements that cannot support a fit (too few sizes, bad values)."""


@dataclass(frozen=True)
class LinkFit:
    """A least-squares fit of ``seconds = latency + bytes / bandwidth`` to measured transfers.

    Attributes
    ----------
    link : Link
        The fitted model (bandwidth ``inf`` when time did not grow with size).
    r2 : float
        Coefficient of determination of the fit.
    max_rel_error : float
        Largest ``|predicted - measured| / measured`` over the points.
    points : int
    """

    link: Link
    r2: float
    max_rel_error: float
    points: int


def fit_link(nbytes: Sequence[float], seconds: Sequence[float], min_sizes: int = 3) -> LinkFit:
    """Fit latency and bandwidth to transfers of several sizes (least squares of relative errors).

    Each point is weighted by ``1 / max(time, median time / 4, 1 µs)``, so the
    fit minimises relative errors: small transfers, whose time is mostly
    latency and which are most of a model's tensors, are fitted as well as
    the large ones that would dominate an ordinary least-squares fit. The
    floor keeps one near-zero (noisy) point from pinning the latency to 0.
    The returned link also keeps the measurements (:attr:`Link.points`, :func:`measured_points`): its
    transfer times are read from them, the line is the solvers' linear model.

    Raises
    ------
    CalibrationError
        Fewer than ``min_sizes`` distinct sizes, mismatched lengths, or
        negative / non-finite measurements.

    Examples
    --------
    >>> sizes = [1e3, 1e5, 1e6, 1e7]
    >>> fit = fit_link(sizes, [1e-3 + b / 2e9 for b in sizes])
    >>> round(fit.link.latency_s * 1e3, 6), round(fit.link.bandwidth_bytes_per_s / 1e9, 6), round(fit.r2, 6)
    (1.0, 2.0, 1.0)
    >>> fit_link([1e3, 1e3], [1e-3, 1e-3])
    Traceback (most recent call last):
    ...
    cost_models.comm.CalibrationError: a link fit needs transfers of at least 3 distinct sizes, got 1
    """
    x = np.asarray(nbytes, dtype=float)
    y = np.asarray(seconds, dtype=float)
    if x.shape != y.shape or x.ndim != 1:
        raise CalibrationError(f"sizes and times must be two lists of equal length, got {x.shape} and {y.shape}")
    if not (np.isfinite(x).all() and np.isfinite(y).all()) or (x < 0).any() or (y < 0).any():
        raise CalibrationError("transfer sizes and times must be finite and non-negative")
    distinct = len(np.unique(x))
    if distinct < min_sizes:
        raise CalibrationError(f"a link fit needs transfers of at least {min_sizes} distinct sizes, got {distinct}")
    w = 1.0 / np.maximum(y, max(float(np.median(y)) / 4, 1e-6))
    a = np.column_stack([np.ones_like(x), x])
    (lat, inv_bw), *_ = np.linalg.lstsq(a * w[:, None], y * w, rcond=None)
    if inv_bw * x.max() <= 1e-9 * max(float(y.mean()), 1e-300):  # no size dependence: a pure latency link
        lat, inv_bw = float(np.median(y)), 0.0
    lat = max(float(lat), 0.0)
    pred = lat + inv_bw * x
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float(((y - pred) ** 2).sum()) / ss_tot if ss_tot > 0 else 1.0
    rel = np.abs(pred - y) / np.where(y > 0, y, 1.0)
    bw = math.inf if inv_bw == 0 else 1.0 / float(inv_bw)
    return LinkFit(Link(bw, lat, points=measured_points(x, y, floor=lat)), r2, float(rel.max()), int(x.size))
