"""Micro-batch pipelining: the gated schedule (no TensorFlow) and placed pipelines on logical CPU devices.

The contract: a pipelined placed model gives, bit for bit, what the original model gives on the same
micro-batches (the same kernels at the same sizes run), and the whole batch's outputs to rounding.
"""

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import placer
from cost_models import SimOptions, TensorEdge, simulate
from placer.core.microbatch import candidate_microbatches, pipelined_schedule
from placer.core.problem import Schedule
from placer.tf.microbatch import GATE_PREFIX, microbatch_sizes
from tests.models import MODELS, sample


@st.composite
def placed_dags(draw):
    n = draw(st.integers(1, 10))
    k = draw(st.integers(1, 3))
    durations = np.array([[draw(st.sampled_from([0.0, 1.0, 2.0]))] * k for _ in range(n)])
    tensors = []
    for u in range(n - 1):
        dsts = tuple(sorted({v for v in range(u + 1, n) if draw(st.booleans())}))
        if dsts:
            tensors.append(TensorEdge(u, dsts, float(draw(st.integers(0, 8)))))
    a = np.array([draw(st.integers(0, k - 1)) for _ in range(n)])
    return Schedule(durations, tuple(tensors), (), np.arange(n)), a, draw(st.integers(1, 4))


@settings(max_examples=120, deadline=None)
@given(placed_dags())
def test_pipelined_schedule_runs_each_devices_micro_batches_in_order(case):
    schedule, a, m = case
    n = len(a)
    d, tensors, control, fine = pipelined_schedule(schedule, a, m)
    assert d.shape[0] >= m * n and fine.shape == (d.shape[0],)
    r = simulate(d, tensors, fine, lambda i, j, b: 1e-3 * b, control_edges=control)
    span = {v: (s, e) for v, _, s, e in r.timeline}
    for v in range(n):  # micro-batch i+1's op starts after micro-batch i's ops on that device have ended
        for i in range(m - 1):
            later = span[(i + 1) * n + v][0]
            assert all(span[i * n + w][1] <= later + 1e-12 for w in range(n) if a[w] == a[v])
    # the whole batch's work is conserved (each copy does 1/m of it)
    assert r.busy_s.sum() == pytest.approx(schedule.durations_s[np.arange(n), a].sum())


def test_two_stage_chain_overlaps_its_micro_batches():
    # a -> b, one op per device, 1 s each and free transfers: 2 s unsplit; with m micro-batches 1 + 1/m
    s = Schedule(np.ones((2, 2)), (TensorEdge(0, (1,), 0.0),), (), np.array([0, 1]))
    for m, expect in [(1, 2.0), (2, 1.5), (4, 1.25)]:
        d, ts, ctrl, fine = pipelined_schedule(s, np.array([0, 1]), m)
        assert simulate(d, ts, fine, lambda i, j, b: 0.0, control_edges=ctrl,
                        options=SimOptions()).step_time_s == pytest.approx(expect)
    assert candidate_microbatches(12) == [1, 2, 3, 4, 6, 12]
    assert microbatch_sizes(44, 4) == [11, 11, 11, 11] and microbatch_sizes(5, 4) == [2, 1, 1, 1]


@pytest.fixture(scope="module")
def chain():
    model = MODELS["sequential"][0]()
    placed = placer.autoplace(model, ["/CPU:0", "/CPU:1"], batch_size=16, algorithm="contiguous", microbatches=4,
                              time_limit_s=1, shared_capacity=None)
    return model, placed


def test_pipelined_outputs_are_bit_exact_per_micro_batch(chain):
    model, placed = chain
    assert placed.plan.microbatches == 4 and "4 micro-batches" in placed.plan.summary()
    assert len(set(placed.plan.assignment.values())) == 2
    x = sample(model, 16)
    got = placed(x).numpy()
    ref = np.concatenate([model(part, training=False).numpy() for part in np.split(x, 4)])
    assert np.array_equal(got, ref)
    np.testing.assert_allclose(got, model(x, training=False).numpy(), rtol=1e-5, atol=1e-6)
    # Keras' predict with a short last batch (37 = 2 x 16 + 5): uneven micro-batches, same values
    x2 = sample(model, 37, seed=1)
    np.testing.assert_allclose(placed.predict(x2, batch_size=16, verbose=0), model.predict(x2, batch_size=16, verbose=0),
                               rtol=1e-5, atol=1e-6)


def test_pipelined_graph_has_gates_and_runs_each_copy_where_planned(chain):
    model, placed = chain
    nodes = placed.function.get_concrete_function().graph.as_graph_def().node
    gates = [n for n in nodes if GATE_PREFIX in n.name and n.op == "NoOp"]
    assert len(gates) == 3 * 2  # (m - 1) gates per device
    observed = placed.observed_placement(sample(model, 16))
    for op, device in placed.plan.assignment.items():
        for i in range(4):
            if f"mb{i}/{op}" in observed:
                assert observed[f"mb{i}/{op}"] == device


def test_microbatches_auto_picks_a_divisor_and_bad_counts_are_refused(chain):
    model, _ = chain
    auto = placer.autoplace(model, ["/CPU:0", "/CPU:1"], batch_size=16, algorithm="contiguous",
                            microbatches="auto", time_limit_s=1, shared_capacity=None)
    assert 16 % auto.plan.microbatches == 0
    x = sample(model, 16)
    np.testing.assert_allclose(auto(x).numpy(), model(x, training=False).numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(placer.InputSignatureError, match="does not divide the batch size 16"):
        placer.autoplace(model, ["/CPU:0", "/CPU:1"], batch_size=16, microbatches=3, time_limit_s=1)
    for bad in (0, "many", 2.5):
        with pytest.raises(placer.AutoplaceError, match="microbatches"):
            placer.autoplace(model, ["/CPU:0", "/CPU:1"], batch_size=16, microbatches=bad)


def test_pipelined_export_loads_and_runs_pipelined(chain, tmp_path):
    model, placed = chain
    path = placed.export(tmp_path / "saved")
    loaded = placer.load(path)
    x = sample(model, 16)
    assert np.array_equal(tf.nest.flatten(loaded(x))[0].numpy(), placed(x).numpy())


def test_report_shows_the_pipelined_timeline(chain, tmp_path):
    from placer.reporting import validate_report

    _, placed = chain
    data = validate_report(placed.report_data)
    assert data["simulation"]["microbatches"] == 4
    ops = {t["op"] for t in data["simulation"]["timeline"]}
    assert {o.split("/", 1)[0] for o in ops} == {"mb0", "mb1", "mb2", "mb3"}
    plan = placed.plan  # the simulated pipeline plus the measured fixed cost of a call
    assert plan.call_overhead_s > 0
    assert data["simulation"]["predicted_step_time_s"] == pytest.approx(plan.predicted_step_time_s - plan.call_overhead_s)
    page = open(placed.report(tmp_path / "r.html")).read()
    assert "pipeline of 4 micro-batches" in page
