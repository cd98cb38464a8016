"""The fidelity benchmark's statistics (benchmarks/fidelity.py), on data with known answers."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from fidelity import ordered_pairs, sign_test_p, spearman, split_half  # noqa: E402
from speedup import pipeline_ceiling  # noqa: E402


def test_spearman_with_ties_and_reversal():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # one adjacent swap among five: 1 - 6*2/(5*24) = 0.9
    assert spearman([1, 2, 3, 4, 5], [1, 3, 2, 4, 5]) == pytest.approx(0.9)
    # ties share their average rank: ranks (0.5, 0.5, 2) vs (0, 1, 2)
    assert spearman([1, 1, 2], [1, 2, 3]) == pytest.approx(np.corrcoef([0.5, 0.5, 2], [0, 1, 2])[0, 1])


def test_sign_test_known_values():
    assert sign_test_p([1] * 10) == pytest.approx(2 / 2 ** 10)
    assert sign_test_p([1, -1] * 5) == 1.0
    assert sign_test_p([0, 0, 0]) == 1.0  # no information


def test_ordered_pairs_counts_only_separable_pairs():
    rng = np.random.default_rng(1)
    fast, slow = list(10 + rng.random(25)), list(20 + rng.random(25))
    same_a, same_b = list(rng.random(25)), list(rng.random(25))
    assert ordered_pairs([1.0, 2.0], [fast, slow]) == (1, 1)
    assert ordered_pairs([2.0, 1.0], [fast, slow]) == (0, 1)
    right, told = ordered_pairs([1.0, 2.0], [same_a, same_b])
    assert told == 0 and right == 0


def test_split_half_tells_a_clear_order_from_noise():
    rng = np.random.default_rng(2)
    clear = [list(m + 0.01 * rng.standard_normal(24)) for m in (1.0, 2.0, 3.0, 4.0, 5.0)]
    noise = [list(1.0 + 0.5 * rng.standard_normal(24)) for _ in range(5)]
    rho, ok = split_half(clear, splits=200)
    assert rho == pytest.approx(1.0) and ok == 1.0
    rho, ok = split_half(noise, splits=200)
    assert rho < 0.9 and ok < 0.5
    # one adjacent pair that swaps between halves: ρ is exactly 0.9 (up to rounding), which counts as ≥ 0.9
    swap = [[1.0, 1.0, 1.0, 1.0], [2.0, 2.0, 2.0, 2.0], [3.0, 3.0, 3.5, 3.5], [3.5, 3.5, 3.0, 3.0], [5.0] * 4]
    rho, ok = split_half(swap, splits=50)
    assert ok == 1.0 and min(rho, 1.0) >= 0.9 - 1e-9


def test_pipeline_ceiling_from_measured_single_worker_steps():
    # benchmarks/results/speedup.md, ResNet50 inference on one worker at m = 1, 2, 4, 8 (ms)
    speedup, m = pipeline_ceiling({1: 486.0, 2: 515.4, 4: 538.6, 8: 610.1})
    assert m == 4 and speedup == pytest.approx(486.0 / (5 * 538.6 / 8), abs=1e-3)
    assert speedup < 1.5  # the target is above what two such workers can give by pipelining
    assert pipeline_ceiling({1: 10.0, 2: 10.0}, stages=3) == (pytest.approx(1.5, abs=1e-3), 2)
