"""``placed.measure``: the placed model timed against the original, and what the summary and report say of it."""

import numpy as np
import pytest

import placer
from placer.reporting import validate_report
from placer.reporting.html import render_html
from tests.models import branchy


@pytest.fixture(scope="module")
def placed(devices):
    return placer.autoplace(branchy(width=16), devices[:2], batch_size=4, time_limit_s=1)


def test_measure_times_both_models_and_compares_with_the_prediction(placed):
    x = np.random.default_rng(0).standard_normal((4, 16)).astype("float32")
    m = placed.measure(x, repeats=7, warmup=1, min_time_s=0)
    assert len(m.placed_s) == len(m.original_s) == 7 and min(m.placed_s + m.original_s) > 0
    assert m.placed_step_s == pytest.approx(float(np.median(m.placed_s)))
    assert m.speedup == pytest.approx(np.median(m.original_s) / np.median(m.placed_s))
    assert m.predicted_step_s == placed.plan.predicted_step_time_s
    assert m.prediction_error == pytest.approx((m.predicted_step_s - m.placed_step_s) / m.placed_step_s)
    assert m.original_device == placed.plan.devices[0]
    assert "measured speedup" in placed.summary() and "predicted" in placed.summary()
    data = validate_report(placed.report_data)
    entries = {e["what"]: e for e in data["measurements"]}
    assert entries["placed model"]["step_time_s"] == pytest.approx(m.placed_step_s)
    assert entries[f"original model on {m.original_device}"]["speedup_of_placed"] == pytest.approx(m.speedup)
    page = render_html(data)
    assert "Nothing was measured" not in page and "measured step time" in page and "off the measurement" in page


def test_measure_at_another_batch_has_no_prediction_and_bad_counts_are_refused(placed):
    m = placed.measure(repeats=3, warmup=0, min_time_s=0)  # a random batch of the planning size
    assert m.batch_size == 4 and m.prediction_error is not None
    other = placed.measure(np.ones((8, 16), "float32"), repeats=3, warmup=0, min_time_s=0)
    assert other.batch_size == 8 and other.predicted_step_s is None and other.prediction_error is None
    with pytest.raises(placer.AutoplaceError, match="repeats"):
        placed.measure(repeats=0)
    with pytest.raises(placer.AutoplaceError, match="min_time_s"):
        placed.measure(min_time_s=-1.0)


def test_measure_goes_on_until_its_minimum_time(placed):
    """Past ``repeats``, rounds continue until the timed ones took ``min_time_s`` (a fast step's median over
    20 calls drifted ±20% on a shared VM)."""
    import time

    t = time.perf_counter()
    m = placed.measure(repeats=3, warmup=0, min_time_s=0.5)
    took = time.perf_counter() - t
    assert len(m.placed_s) > 3 and took >= 0.5
    assert sum(m.placed_s) + sum(m.original_s) >= 0.5 * 0.9  # the rounds' own time (the loop adds a little)
    with pytest.raises(placer.TrainingError, match="this placement is for inference"):
        placed.measure(np.ones((4, 16), "float32"), np.ones((4, 4), "float32"))


def test_a_placement_measured_slower_than_one_device_is_said_plainly():
    from placer.measure.steps import StepMeasurement

    slow = StepMeasurement((0.013, 0.0131, 0.0129, 0.0132), (0.010, 0.0101, 0.0099, 0.0102), 4, "/CPU:0", 0.011)
    assert slow.slower_than_original and slow.speedup < 1
    assert "measured slower than the original on /CPU:0" in slow.summary()
    assert "algorithm='single'" in slow.summary()
    # within the noise (overlapping spreads) or faster: no verdict
    noisy = StepMeasurement((0.013, 0.009, 0.016, 0.010), (0.010, 0.0101, 0.0099, 0.0102), 4, "/CPU:0", None)
    fast = StepMeasurement((0.008, 0.0081, 0.0079, 0.0082), (0.010, 0.0101, 0.0099, 0.0102), 4, "/CPU:0", None)
    for m in (noisy, fast):
        assert not m.slower_than_original and "measured slower" not in m.summary()

