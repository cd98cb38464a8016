"""Measured step times: the placed model against the original, interleaved, on the same inputs.

:func:`measure_steps` times two callables on one batch: each call is
followed by fetching its outputs to the host (so the time covers the whole
step, transfers included), the two alternate which goes first in every
round (so drift hits both alike), each settles into its own runs before it
is timed in a round (:data:`SETTLE_S`), and the first ``warmup`` calls are
discarded (tracing, allocation). The result keeps every sample;
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

#: Timed samples of each callable and its untimed warm-up calls, by default.
DEFAULT_REPEATS, DEFAULT_WARMUP = 20, 3
#: ... and rounds go on past ``repeats`` until this much time has passed (at most :data:`MAX_ROUNDS`): on a
#: shared 2-core VM, medians of 20 rounds of the demo's model (~9 ms a round) in one process spread
#: 3.6-5.5 ms from one measurement to the next, of 100 rounds (~1 s) 4.0-4.3 ms.
DEFAULT_MIN_TIME_S = 1.0
MAX_ROUNDS = 1000
#: In each round a callable runs untimed calls for this long (at least one) before its timed ones: in one
#: session the first call after another callable's ran slower, by 1.5-2.5 ms for a 3.5 ms training step on a
#: gRPC worker (after Keras' own step, a 12 ms sleep, or a step on the other worker), the second by
#: 0.5-0.8 ms, the third on (~10 ms in) as in a run of its own; later the same day, with every step slower,
#: no difference showed (2026-12-06). A user runs one placement over and over.
SETTLE_S = 0.01
#: Timed calls of each callable per round.
TIMED_PER_ROUND = 2


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
    # lazy: benchmarks import this module before TensorFlow (they pin their cores before TF sizes its pools)
    import tensorflow as tf

    t = time.perf_counter()
    out = fn(*args)
    for x in tf.nest.flatten(out):
        if hasattr(x, "numpy"):  # the step is done when its outputs are on the host (floats already are)
            x.numpy()
    return time.perf_counter() - t


def interleaved_times(calls: Sequence[Callable[[], Any]], *, repeats: int = DEFAULT_REPEATS,
                      warmup: int = DEFAULT_WARMUP, min_time_s: float = 0.0) -> list[list[float]]:
    """Seconds per call of each of ``calls``, interleaved; one list of samples per callable.

    After ``warmup`` untimed calls of each, rounds alternate the order (forward, then backward) so that a
    drifting machine weighs on all alike. In a round each callable first runs untimed calls until
    :data:`SETTLE_S` has passed (at least one), then :data:`TIMED_PER_ROUND` timed ones: rounds go on
    until each has ``repeats`` samples and, up to :data:`MAX_ROUNDS`, the timed calls took ``min_time_s``.
    Each timed call includes fetching its outputs to the host.

    Examples
    --------
    >>> a, b = interleaved_times([lambda: 1.0, lambda: 2.0], repeats=5, warmup=1)
    >>> len(a), len(b)
    (5, 5)
    """
    for call in calls:
        for _ in range(warmup):
            _timed(call, ())
    times: list[list[float]] = [[] for _ in calls]
    timed_s = 0.0
    for r in range(MAX_ROUNDS):
        if r * TIMED_PER_ROUND >= repeats and timed_s >= min_time_s:
            break
        # the last round times what ``repeats`` still lacks (once ``min_time_s`` has passed)
        timed = TIMED_PER_ROUND if timed_s < min_time_s else min(TIMED_PER_ROUND, repeats - r * TIMED_PER_ROUND)
        for i in (range(len(calls)) if r % 2 == 0 else reversed(range(len(calls)))):
            start = time.perf_counter()
            _timed(calls[i], ())
            while time.perf_counter() - start < SETTLE_S:
                _timed(calls[i], ())
            for _ in range(timed):
                times[i].append(_timed(calls[i], ()))
                timed_s += times[i][-1]
    return times


def measure_steps(placed: Callable[..., Any], original: Callable[..., Any], args: Sequence[Any], *,
                  repeats: int = DEFAULT_REPEATS, warmup: int = DEFAULT_WARMUP,
                  min_time_s: float = DEFAULT_MIN_TIME_S) -> tuple[list[float], list[float]]:
    """Time ``placed(*args)`` and ``original(*args)``, interleaved (:func:`interleaved_times`); returns both
    sample lists (seconds).

    At least ``repeats`` samples of each are timed after the ``warmup`` calls, and more while the timed
    calls have taken less than ``min_time_s``: a median over a second of a fast step is steadier than over
    20 calls.

    Examples
    --------
    >>> a, b = measure_steps(lambda: 1.0, lambda: 2.0, (), repeats=4, warmup=1, min_time_s=0)
    >>> len(a), len(b)
    (4, 4)
    """
    a, b = interleaved_times([lambda: placed(*args), lambda: original(*args)], repeats=repeats, warmup=warmup,
                             min_time_s=min_time_s)
    return a, b
