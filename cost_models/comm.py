"""Communication cost model: latency + bytes / bandwidth per ordered link."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class Link:
    """Latency + bytes / bandwidth model of one ordered device pair.

    Examples
    --------
    >>> Link(1e9, 1e-3).seconds(1e6)
    0.002
    >>> Link(1e9, 1e-3).seconds(0)
    0.0
    """

    bandwidth_bytes_per_s: float
    latency_s: float
    #: CPU seconds one transfer costs on *each* end (serialisation, RPC handling: TF's ``_Send``/``_Recv``),
    #: which queue with the devices' ops (``cost_models.SimOptions.transfer_cpu_s``); 0: not modelled.
    cpu_s: float = 0.0

    def seconds(self, nbytes: float) -> float:
        """Transfer time of ``nbytes``; zero bytes cost nothing."""
        return 0.0 if nbytes <= 0 else self.latency_s + nbytes / self.bandwidth_bytes_per_s


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
    return LinkFit(Link(bw, lat), r2, float(rel.max()), int(x.size))
