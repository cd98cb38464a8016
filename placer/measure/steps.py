"""Measured step times: the placed model against the original, interleaved, on the same inputs.

:func:`measure_steps` times two callables on one batch: each call is
followed by fetching its outputs to the host (so the time covers the whole
step, transfers included), the two alternate which goes first in every
round (so drift and warm caches hit both alike), and the first ``warmup``
rounds are discarded (tracing, allocation). The result keeps every sample;
its figures are medians, with half the interquartile range as the spread.

These are *measurements*; :class:`StepMeasurement` compares them with the
cost model's prediction, and a prediction that disagrees is a cost-model
bug to report, not a footnote.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import tensorflow as tf

#: Timed rounds (each runs both callables once) and discarded warm-up rounds, by default.
DEFAULT_REPEATS, DEFAULT_WARMUP = 20, 3
#: ... and rounds go on past ``repeats`` until this much time has passed (at most :data:`MAX_ROUNDS`): on a
#: shared 2-core VM, medians of 20 rounds of the demo's model (~9 ms a round) in one process spread
#: 3.6-5.5 ms from one measurement to the next, of 100 rounds (~1 s) 4.0-4.3 ms.
DEFAULT_MIN_TIME_S = 1.0
MAX_ROUNDS = 1000


def _median_spread(samples: Sequence[float]) -> tuple[float, float]:
    q1, q2, q3 = np.percentile(np.asarray(samples, dtype=float), [25, 50, 75])
    return float(q2), float((q3 - q1) / 2)


@dataclass(frozen=True)
class StepMeasurement:
    """Measured step times of a placed model and of the original, on the same devices and batch.

    Attributes
    ----------
    placed_s, original_s : tuple of float
        Every timed sample (seconds per step, outputs fetched).
    batch_size : int
        The measured batch.
    original_device : str
        Where the original model ran (the plan's first device).
    predicted_step_s : float or None
        The cost model's step for this batch (``None`` when the plan was made at another batch size).
    step : str
        What was timed: ``"predict"`` (the forward pass) or ``"train"`` (one Keras training step as ``fit``
        runs it, :func:`placer.tf.measuring.fit_step`).
    setup : str
        What exactly the original side was (where its ops and variables were, what was timed), for the
        report; empty: not said.
    """

    placed_s: tuple[float, ...]
    original_s: tuple[float, ...]
    batch_size: int
    original_device: str
    predicted_step_s: float | None
    step: str = "predict"
    setup: str = ""

    @property
    def placed_step_s(self) -> float:
        """Median measured step of the placed model."""
        return _median_spread(self.placed_s)[0]

    @property
    def original_step_s(self) -> float:
        """Median measured step of the original model on one device."""
        return _median_spread(self.original_s)[0]

    @property
    def speedup(self) -> float:
        """Measured: original median / placed median (> 1: the placement is faster)."""
        return self.original_step_s / self.placed_step_s

    @property
    def slower_than_original(self) -> bool:
        """Measured: the placed step's median exceeds the original's by more than both spreads (half the
        interquartile range of each), i.e. by more than the run's own noise.

        Examples
        --------
        >>> StepMeasurement((1.3, 1.31, 1.29), (1.0, 1.01, 0.99), 4, "/CPU:0", None).slower_than_original
        True
        >>> StepMeasurement((1.0, 1.2, 0.9), (1.0, 1.01, 0.99), 4, "/CPU:0", None).slower_than_original
        False
        """
        placed, ps = _median_spread(self.placed_s)
        original, os_ = _median_spread(self.original_s)
        return placed - ps > original + os_

    @property
    def prediction_error(self) -> float | None:
        """``(predicted - measured) / measured`` of the placed step, or ``None`` without a prediction."""
        if self.predicted_step_s is None:
            return None
        return (self.predicted_step_s - self.placed_step_s) / self.placed_step_s

    def report_entries(self) -> tuple[dict[str, Any], ...]:
        """The report's ``measurements`` entries (``docs/report-format.md``)."""
        placed, placed_spread = _median_spread(self.placed_s)
        original, original_spread = _median_spread(self.original_s)
        common = {"repeats": len(self.placed_s), "batch_size": self.batch_size}
        what = "" if self.step == "predict" else ", training step"
        return ({"what": f"placed model{what}", "step_time_s": placed, "spread_s": placed_spread, **common,
                 "predicted_step_time_s": self.predicted_step_s, "prediction_error": self.prediction_error},
                {"what": f"original model on {self.original_device}{what}", "step_time_s": original,
                 "spread_s": original_spread, **common, "speedup_of_placed": self.speedup,
                 **({"setup": self.setup} if self.setup else {})})

    def summary(self) -> str:
        """Two lines for people (every figure here is measured, except the prediction it is compared with)."""
        placed, ps = _median_spread(self.placed_s)
        original, os_ = _median_spread(self.original_s)
        err = self.prediction_error
        pred = ("" if err is None else f"; predicted {self.predicted_step_s * 1e3:.3f} ms, "
                f"{100 * err:+.1f}% off the measurement")
        what = "" if self.step == "predict" else "training step "
        verdict = ("" if not self.slower_than_original else
                   f"\nthe placement is measured slower than the original on {self.original_device} (by more "
                   "than either run's spread): place it with algorithm='single' to run it there, or measure "
                   "again with more repeats if the machine was busy")
        return (f"{what}measured at batch {self.batch_size} ({len(self.placed_s)} interleaved runs): placed "
                f"{placed * 1e3:.3f} ± {ps * 1e3:.3f} ms, original on {self.original_device} "
                f"{original * 1e3:.3f} ± {os_ * 1e3:.3f} ms, measured speedup {self.speedup:.2f}x{pred}{verdict}")


def _timed(fn: Callable[..., Any], args: Sequence[Any]) -> float:
    t = time.perf_counter()
    out = fn(*args)
    for x in tf.nest.flatten(out):
        if hasattr(x, "numpy"):  # the step is done when its outputs are on the host (floats already are)
            x.numpy()
    return time.perf_counter() - t


def measure_steps(placed: Callable[..., Any], original: Callable[..., Any], args: Sequence[Any], *,
                  repeats: int = DEFAULT_REPEATS, warmup: int = DEFAULT_WARMUP,
                  min_time_s: float = DEFAULT_MIN_TIME_S) -> tuple[list[float], list[float]]:
    """Time ``placed(*args)`` and ``original(*args)``, interleaved; returns both sample lists (seconds).

    Round ``r`` runs the placed callable first when ``r`` is even, the original first when odd. At least
    ``repeats`` rounds are timed after the ``warmup`` ones, and more while the timed rounds have taken less
    than ``min_time_s`` (up to :data:`MAX_ROUNDS`): a median over a second of a fast step is steadier
    than over 20 calls.

    Examples
    --------
    >>> a, b = measure_steps(lambda: 1.0, lambda: 2.0, (), repeats=4, warmup=1, min_time_s=0)
    >>> len(a), len(b)
    (4, 4)
    """
    def round_(r: int) -> tuple[float, float]:
        if r % 2 == 0:
            ta, tb = _timed(placed, args), _timed(original, args)
        else:
            tb, ta = _timed(original, args), _timed(placed, args)
        return ta, tb

    for r in range(warmup):
        round_(r)
    a: list[float] = []
    b: list[float] = []
    start = time.perf_counter()
    while len(a) < repeats or (len(a) < MAX_ROUNDS and time.perf_counter() - start < min_time_s):
        ta, tb = round_(warmup + len(a))
        a.append(ta)
        b.append(tb)
    return a, b
