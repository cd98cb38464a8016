"""Compute cost models: analytic roofline, calibration, the profile cache, link fits."""

import json
import logging
from dataclasses import replace

import keras
import numpy as np
import pytest
import tensorflow as tf

import placer
from cost_models.analytic import (
    HARDWARE,
    OP_FLOPS,
    HardwareSpec,
    OpShapes,
    SpecError,
    calibrate,
    estimate_us,
    op_flops_bytes,
)
from cost_models.cache import CacheKey, ProfileCache
from placer.tf.timing import runtime_factor
from placer.tf.costs import ProfileOptions, compute_costs, op_shapes
from placer.errors import CostError, DeviceError, GraphError, WorkerError
from placer.tf.trace import trace_model
from placer.reporting import validate_report


def test_formulas_known_answers():
    conv = OpShapes("Conv2D", ((8, 32, 32, 16), (3, 3, 16, 32)), ((8, 32, 32, 32),))
    assert op_flops_bytes(conv)[0] == 2 * 8 * 32 * 32 * 32 * 3 * 3 * 16
    bmm = OpShapes("BatchMatMulV2", ((4, 64, 32), (4, 32, 16)), ((4, 64, 16),))
    assert op_flops_bytes(bmm)[0] == 2 * 4 * 64 * 16 * 32
    relu = OpShapes("Relu", ((10, 10),), ((10, 10),))
    assert op_flops_bytes(relu) == (100.0, 800.0)
    unknown = OpShapes("SomeCustomOp", ((10,),), ((10,),))
    assert "SomeCustomOp" not in OP_FLOPS and op_flops_bytes(unknown) == (0.0, 80.0)
    # memory-bound vs compute-bound on the same device
    spec = HardwareSpec("x", peak_flops=1e12, memory_bandwidth=1e11, launch_overhead_s=0.0)
    assert estimate_us(relu, spec) == pytest.approx(800 / 1e11 * 1e6)
    assert estimate_us(conv, spec) == pytest.approx(op_flops_bytes(conv)[0] / 1e12 * 1e6)


def test_spec_validation_names_the_field():
    with pytest.raises(SpecError, match="missing field"):
        HardwareSpec.from_dict({"name": "gpu", "peak_flops": 1e12})
    with pytest.raises(SpecError, match="memory_bandwidth must be a positive"):
        HardwareSpec.from_dict({"name": "gpu", "peak_flops": 1e12, "memory_bandwidth": -1, "launch_overhead_s": 0})
    assert {"nvidia-a100-40gb", "nvidia-h100-sxm", "nvidia-t4"} <= set(HARDWARE)


def test_calibration_recovers_synthetic_parameters_and_rejects_too_few_points():
    rng = np.random.default_rng(1)
    shapes = [OpShapes("MatMul", ((int(n), 512), (512, 512)), ((int(n), 512),)) for n in rng.integers(8, 512, 20)]
    shapes += [OpShapes("AddV2", ((int(n), 1024), (int(n), 1024)), ((int(n), 1024),))
               for n in rng.integers(8, 512, 20)]
    true = np.array([1e6 * (3e-6 + f / 8e10 + b / 1.5e10) for f, b in map(op_flops_bytes, shapes)])
    noisy = true * rng.lognormal(0, 0.05, true.size)
    c = calibrate(shapes, noisy)
    assert c.spec.peak_flops == pytest.approx(8e10, rel=0.1)
    assert c.spec.memory_bandwidth == pytest.approx(1.5e10, rel=0.1)
    assert c.r2 > 0.95 and c.median_abs_rel_error < 0.1
    with pytest.raises(SpecError, match="at least 8"):
        calibrate(shapes[:3], true[:3])


@pytest.fixture(scope="module")
def small_traced():
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(8)], name="cost_mlp")
    return trace_model(model, batch_size=16)


def test_analytic_costs_for_absent_hardware(small_traced):
    shapes = op_shapes(small_traced.fixed.graph)
    matmuls = [s for s in shapes.values() if s.op_type == "MatMul"]
    assert sorted(s.inputs[0] for s in matmuls) == [(16, 32), (16, 64)]
    costs = compute_costs(small_traced, ["GPU"], ProfileOptions(repeats=1, seed=0, hardware={"GPU": "nvidia-a100-40gb"}))
    assert costs.source["GPU"] == "analytic:nvidia-a100-40gb"
    assert all(v >= 0 for v in costs.us["GPU"].values())
    with pytest.raises(CostError, match="no GPU device in this process"):
        compute_costs(small_traced, ["GPU"], ProfileOptions(repeats=1, seed=0))
    with pytest.raises(CostError, match="unknown hardware"):
        compute_costs(small_traced, ["GPU"], ProfileOptions(repeats=1, seed=0, hardware={"GPU": "tpu-v9"}))


def test_profile_cache_hit_and_foreign_entry(small_traced, tmp_path, caplog):
    # the cache holds session profiles; the runtime factor (timed every run) is off here
    cache = ProfileCache(tmp_path)
    first = compute_costs(small_traced, ["CPU"], ProfileOptions(repeats=1, seed=0, runtime=False, cache=cache))
    assert first.source["CPU"] == "measured"
    second = compute_costs(small_traced, ["CPU"], ProfileOptions(repeats=1, seed=0, runtime=False, cache=cache))
    assert second.source["CPU"] == "measured (cached)" and second.us == first.us
    # an entry written for another TF version (e.g. copied between machines) is not used
    (entry,) = tmp_path.glob("profile-CPU-*.json")
    doc = json.loads(entry.read_text())
    doc["key"]["tf_version"] = "1.15.0"
    entry.write_text(json.dumps(doc))
    with caplog.at_level(logging.WARNING):
        third = compute_costs(small_traced, ["CPU"], ProfileOptions(repeats=1, seed=0, runtime=False, cache=cache))
    assert third.source["CPU"] == "measured"
    assert "ignoring profile cache entry" in caplog.text
    assert cache.get(CacheKey("other-graph", "CPU", 16, "x")) is None
    # a profile taken with Grappler off is a different measurement: not a hit for the default (on)
    off = compute_costs(small_traced, ["CPU"], ProfileOptions(repeats=1, seed=0, runtime=False, cache=cache, grappler=False))
    assert off.source["CPU"] == "measured" and len(list(tmp_path.glob("profile-CPU-*.json"))) == 2
    assert compute_costs(small_traced, ["CPU"], ProfileOptions(repeats=1, seed=0, runtime=False, cache=cache, grappler=False)).us == off.us


def test_the_runtime_factor_scales_measured_ops_to_a_timed_step(small_traced, tmp_path):
    raw = compute_costs(small_traced, ["CPU"], ProfileOptions(repeats=1, cache=tmp_path, runtime=False))
    assert raw.runtime_factor == {}
    scaled = compute_costs(small_traced, ["CPU"], ProfileOptions(repeats=1, cache=tmp_path))  # the cached profile
    factor = scaled.runtime_factor["CPU"]
    assert scaled.source["CPU"] == "measured (cached)" and 1 / 3 <= factor <= 3
    assert scaled.us["CPU"].keys() == raw.us["CPU"].keys()
    assert all(scaled.us["CPU"][n] == pytest.approx(us * factor) for n, us in raw.us["CPU"].items())
    train = trace_model(keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)]), batch_size=2)
    with pytest.raises(placer.DeviceError, match="forward pass, not a training step"):
        runtime_factor(replace(train, step="train"), "/CPU:0", 1e-3)


def test_the_runtime_factor_is_taken_against_the_ops_it_scales(small_traced, tmp_path, monkeypatch):
    # the scaled ops must add up to the runtime's step: the factor's reference is their own sum, fresh or cached
    # (a session step timed apart ran 14% faster than the rounds the ops were calibrated to: copies +16-21%)
    import placer.tf.costs as costs_module

    seen = []

    def fake_factor(traced, device, reference_s, **_):
        seen.append(reference_s)
        return 0.5

    monkeypatch.setattr(costs_module, "runtime_factor", fake_factor)
    raw = compute_costs(small_traced, ["CPU"], ProfileOptions(repeats=1, cache=tmp_path, runtime=False))
    # the cached profile (its factor not cached: runtime=False wrote none), then one profiled afresh
    cached = compute_costs(small_traced, ["CPU"], ProfileOptions(repeats=1, cache=tmp_path))
    fresh = compute_costs(small_traced, ["CPU"], ProfileOptions(repeats=1, cache=tmp_path / "fresh"))
    assert len(seen) == 2
    for scaled, reference_s in zip((cached, fresh), seen):
        assert reference_s == pytest.approx(sum(scaled.us["CPU"].values()) * 1e-6 / 0.5)
        assert scaled.runtime_factor == {"CPU": 0.5}
    assert seen[0] == pytest.approx(sum(raw.us["CPU"].values()) * 1e-6)


def test_autoplace_plans_with_an_analytic_spec_for_the_local_kind(devices):
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64), keras.layers.Dense(8)])
    p = placer.autoplace(model, devices[:2], batch_size=8, time_limit_s=1,
                         hardware={"CPU": {"name": "slow-cpu", "peak_flops": 1e9, "memory_bandwidth": 1e9,
                                           "launch_overhead_s": 1e-5}})
    x = np.ones((8, 32), "float32")
    assert np.allclose(p(x).numpy(), model(x).numpy(), atol=1e-5)
    assert p.plan.value > 0
    data = validate_report(p.report_data)
    assert data["cost_model"]["compute"] == {"CPU": "analytic:slow-cpu"}
    assert {o["compute_source"] for o in data["ops"]} == {"analytic:slow-cpu"}


def test_link_calibration_on_logical_devices(devices):
    from placer.core.devices import resolve_devices
    from placer.measure.links import calibrate_links

    devset = resolve_devices(devices[:2])
    calibrated, fits = calibrate_links(devset, sizes=(1 << 10, 1 << 16, 1 << 20), repeats=3)
    assert set(fits) == {(0, 1), (1, 0)}
    for fit in fits.values():
        assert fit.points == 3 and fit.link.latency_s >= 0 and fit.link.bandwidth_bytes_per_s > 0
    assert calibrated.link(0, 1) == fits[(0, 1)].link
    # both ends' pools saw two payloads of each size at once (replayed where a pool is: DeviceSpec(memory_pool_bytes))
    from placer.measure.links import calibration_pool_events

    events = calibration_pool_events(("link calibration", 0, 1), (1 << 10, 1 << 16, 1 << 20))
    assert calibrated.pool_history == (tuple(events), tuple(events)) and len(events) == 12
    assert calibrated.memory_pool_history() == ()  # logical CPUs: no pool replayed
    with pytest.raises(CostError, match="at least three sizes"):
        calibrate_links(devset, sizes=(1 << 10, 1 << 16), repeats=1)
    from placer.measure.links import measure_link, measure_transfer_cpu

    assert measure_transfer_cpu(devset.names[0], devset.names[1], counts=(2, 6), repeats=3) >= 0.0
    with pytest.raises(CostError, match="increasing"):
        measure_transfer_cpu(devset.names[0], devset.names[1], counts=(6, 2))
    with pytest.raises(CostError, match="hops must be two increasing"):
        measure_link(devset.names[0], devset.names[1], hops=(10, 2))


def test_call_interface_and_stand_in_of_a_split_model(small_traced, devices):
    from placer.measure.links import TensorAt, measure_call
    from placer.tf.timing import call_interface

    ops = [op.name for op in small_traced.fixed.graph.get_operations()]
    second = ops.index(small_traced.fixed.graph.get_operations()[-1].name) // 2  # the second Dense onwards
    placement = {op: devices[int(i > second)] for i, op in enumerate(ops)}
    iface = call_interface(small_traced, placement)
    assert iface.inputs == (TensorAt(devices[0], (16, 32), "float32"),)
    assert iface.outputs == (TensorAt(devices[1], (16, 8), "float32"),)
    assert dict(iface.variables) == {devices[0]: 2, devices[1]: 2}  # kernel and bias of each Dense
    assert iface.devices == tuple(sorted(devices[:2]))
    assert 0 < measure_call(iface, repeats=3) < 1.0
    with pytest.raises(CostError, match="no device for 1 ops"):
        call_interface(small_traced, {op: d for op, d in list(placement.items())[1:]})
    # a step traced for any batch (Keras' training step) is sized at its batch, and refused without one
    anybatch = replace(small_traced, fixed=small_traced.dynamic, batch_size=4)
    whole = {op.name: devices[0] for op in anybatch.fixed.graph.get_operations()}
    assert call_interface(anybatch, whole).inputs == (TensorAt(devices[0], (4, 32), "float32"),)
    with pytest.raises(CostError, match="unknown shape"):
        call_interface(replace(anybatch, batch_size=0), whole)
    # an output of unknown rank (a numpy_function) has no size to feed back: refused, not taken as a scalar
    import tensorflow as tf

    opaque = tf.function(lambda x: tf.numpy_function(lambda a: a, [x], tf.float32)).get_concrete_function(
        tf.TensorSpec((16, 32), tf.float32))
    unknown = replace(small_traced, fixed=opaque, input_names=(opaque.inputs[0].name,),
                      output_names=(opaque.outputs[0].name,), variables=())
    with pytest.raises(CostError, match="unknown shape"):
        call_interface(unknown, {op.name: devices[0] for op in opaque.graph.get_operations()})


def test_link_fit_rejects_bad_measurements():
    from cost_models import CalibrationError, fit_link

    with pytest.raises(CalibrationError, match="non-negative"):
        fit_link([1.0, 2.0, 3.0], [0.1, -0.2, 0.3])
    with pytest.raises(CalibrationError, match="equal length"):
        fit_link([1.0, 2.0, 3.0], [0.1, 0.2])
    fit = fit_link([1e3, 1e6, 1e7], [5e-5, 5e-5, 5e-5])  # no size dependence (shared memory)
    assert fit.link.bandwidth_bytes_per_s == float("inf") and fit.link.latency_s == pytest.approx(5e-5)


def test_link_fit_keeps_the_latency_when_a_large_transfer_is_noisy():
    # 200 µs + 1 GB/s, the 16 MiB point 5% slow (typical jitter): relative weighting keeps the
    # latency that most (small) tensors pay; an ordinary least-squares fit is ~25% off
    from cost_models import fit_link

    sizes = [1 << 12, 1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24]
    times = [2e-4 + b / 1e9 for b in sizes]
    times[-1] *= 1.05
    fit = fit_link(sizes, times)
    assert fit.link.latency_s == pytest.approx(2e-4, rel=0.1)
    assert fit.link.bandwidth_bytes_per_s == pytest.approx(1e9, rel=0.1)
    ols_latency = np.polyfit(sizes, times, 1)[1]
    assert abs(ols_latency - 2e-4) > 0.2 * 2e-4  # the case is one that OLS gets wrong


def test_profiling_with_grappler_times_fused_ops_under_one_name(small_traced):
    # Dense(relu) = MatMul + BiasAdd + Relu; with Grappler on they run as one fused kernel, so fewer
    # ops carry time, and the untraced step time is recorded either way
    from cost_models.profile import profile_graph
    from placer.tf.costs import sample_inputs

    t = small_traced
    args = (t.fixed.graph.as_graph_def(), sample_inputs(t, 0),
            {f"{ph}:0": v.value.numpy() for ph, v in t.variables.items()}, t.output_names)
    consts = {f"{ph}:0": c.numpy() for ph, c in t.constants.items()}
    off = profile_graph(*args, constants=consts, repeats=2, measure_step=True)
    on = profile_graph(*args, constants=consts, repeats=2, grappler=True, measure_step=True)
    timed = lambda p: {n for n, us in p.median_us.items() if us > 0}  # noqa: E731
    assert timed(on) < timed(off) and timed(on)
    assert off.step_s > 0 and on.step_s > 0 and on.op_sum_s > 0
    assert profile_graph(*args, constants=consts, repeats=1).step_s is None  # not timed unless asked


def test_link_fit_is_not_pinned_to_zero_latency_by_one_near_zero_point():
    # 200 µs + 1 GB/s over the default six sizes, but the smallest hop measured ~0 (a noisy
    # difference of two medians): weighting by 1/(t + 1 µs) put the latency at ~0
    from cost_models import fit_link

    sizes = [1 << 12, 1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24]
    times = [2e-4 + b / 1e9 for b in sizes]
    times[0] = 1e-8
    assert fit_link(sizes, times).link.latency_s > 5e-5


def test_calibrated_op_times_add_up_to_the_untraced_step():
    from cost_models.profile import OpProfile

    med = {"a": 100.0, "b": 0.0, "c": 300.0}  # µs; b was folded away (never ran)
    slow = OpProfile("/CPU:0", med, dict.fromkeys(med, 0.0), (), 3, 1.0, step_s=600e-6, call_s=100e-6)
    assert slow.ops_run == 2 and slow.overhead_us == pytest.approx(50.0)
    assert slow.calibrated_us() == pytest.approx({"a": 150.0, "b": 0.0, "c": 350.0})  # overhead per op that ran
    fast = OpProfile("/CPU:0", med, dict.fromkeys(med, 0.0), (), 3, 1.0, step_s=300e-6, call_s=100e-6)
    assert fast.overhead_us < 0  # traced kernels add up to more than the step: scaled down, none negative
    assert fast.calibrated_us() == pytest.approx({"a": 50.0, "b": 0.0, "c": 150.0})
    plain = OpProfile("/CPU:0", med, dict.fromkeys(med, 0.0), (), 3, 1.0)
    assert plain.overhead_us is None and plain.calibrated_us() == med


def test_profiler_runs_rounds_on_demand(small_traced):
    from cost_models.profile import GraphProfiler
    from placer.tf.costs import sample_inputs

    t = small_traced
    prof = GraphProfiler(t.fixed.graph.as_graph_def(), sample_inputs(t, 0),
                         {f"{ph}:0": v.value.numpy() for ph, v in t.variables.items()}, t.output_names,
                         constants={f"{ph}:0": c.numpy() for ph, c in t.constants.items()}, warmup=1,
                         measure_step=True)
    with prof:
        with pytest.raises(ValueError, match="no profiling round"):
            prof.result()
        prof.round()
        prof.round()
        two = prof.result()
        prof.clear()
        prof.round()
        one = prof.result()
    assert (two.repeats, one.repeats) == (2, 1)
    # no timing order is asserted: on this tiny model the untraced step and its fixed cost are both ~0.4 ms,
    # and a loaded machine measured the step 2 µs below the fixed cost once (CI, 2026-12-01)
    assert one.step_s > 0 and one.call_s > 0 and one.overhead_us is not None
    # either way (overhead added or kernels scaled down) the calibrated ops add up to the step less its fixed
    # cost, or to nothing when the noise put the step below it
    assert sum(one.calibrated_us().values()) == pytest.approx(max(one.step_s - one.call_s, 0.0) * 1e6, rel=1e-6)


def test_simulated_ops_scale_with_a_device_time_factor(small_traced, devices):
    from cost_models import SimOptions
    from placer.core.build import build_problem
    from placer.core.devices import resolve_devices
    from placer.tf.opgraph import build_op_graph

    og = build_op_graph(small_traced, {"CPU": {op.name: 100.0 for op in small_traced.fixed.graph.get_operations()}})
    built = build_problem(og.graph, resolve_devices(devices[:2]))
    on_second = np.ones(built.problem.n, dtype=int)
    base = built.simulate(on_second).step_time_s
    assert built.simulate(on_second, SimOptions(time_factor=[1.0, 2.0])).step_time_s == pytest.approx(2 * base)
    assert built.simulate(on_second, SimOptions(time_factor=[3.0, 1.0])).step_time_s == pytest.approx(base)
    with pytest.raises(CostError, match="positive finite factors"):
        built.simulate(on_second, SimOptions(time_factor=[1.0, 0.0]))


def test_the_models_inputs_are_fed_by_the_caller_and_its_variables_and_their_shards_are_not():
    """``Schedule.fed`` (what the simulator takes as fed by the caller, ``SimOptions.fed``): a training step's
    inputs and labels, not its variables' resources, nor the shards a split makes of them."""
    from placer.core.build import build_problem
    from placer.core.devices import resolve_devices
    from placer.core.splits import split_graph
    from placer.tf.opgraph import build_op_graph
    from placer.tf.rewrites.split import split_candidates
    from placer.tf.trace import trace_training_step

    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, name="a"), keras.layers.Dense(4, name="b")])
    traced = trace_training_step(model, batch_size=2, optimizer="sgd")
    og = build_op_graph(traced, {"CPU": {op.name: 1.0 for op in traced.fixed.graph.get_operations()}}).graph
    found = split_candidates(traced.fixed.graph, traced.variables, 2, 0)
    for graph in (og, split_graph(og, found[:1])):
        built = build_problem(graph, resolve_devices(["/CPU:0"]))
        fed = {built.nodes[i] for i in built.problem.schedule.fed}
        inputs = {v for v in graph if graph.nodes[v].get("op_type") == "Placeholder" and "variable" not in graph.nodes[v]}
        assert fed == inputs and len(fed) >= 2, (fed, inputs)  # x and y at least
        assert not any("variable" in graph.nodes[v] for v in fed)
        assert built.problem.sim_options().fed == frozenset(built.problem.schedule.fed)


def test_simulated_activation_peak_matches_tfs_allocation_records():
    """The issue's memory bound (15%) on a real Keras model: TF's allocation records vs the simulator."""
    from cost_models.profile import profile_graph
    from placer.core.build import build_problem
    from placer.core.devices import resolve_devices
    from placer.tf.costs import sample_inputs
    from placer.tf.opgraph import build_op_graph
    from tests.models import branchy

    t = trace_model(branchy(128), batch_size=32)
    feeds = sample_inputs(t, 0)
    prof = profile_graph(t.fixed.graph.as_graph_def(), feeds,
                         {f"{ph}:0": v.value.numpy() for ph, v in t.variables.items()}, t.output_names,
                         constants={f"{ph}:0": c.numpy() for ph, c in t.constants.items()}, repeats=2,
                         grappler=True)
    og = build_op_graph(t, {"CPU": prof.median_us})
    built = build_problem(og.graph, resolve_devices(["/device:CPU:0"]))
    sim = built.simulate(np.zeros(built.problem.n, dtype=int))
    resident = sum(og.graph.nodes[op]["memory_bytes"] for op in og.graph)
    predicted = float(sim.peak_memory_bytes[0]) - resident - sum(v.nbytes for v in feeds.values())
    # at least the four towers' 32x128 float outputs are live together before the concatenation
    assert prof.activation_peak_bytes >= 4 * 32 * 128 * 4
    assert predicted == pytest.approx(prof.activation_peak_bytes, rel=0.15)


def test_ids_are_profiled_spread_over_their_tables_rows_and_other_integers_stay_zero(tmp_path):
    # fed zeros, every lookup read (and every sparse update wrote) one row, which stays in cache: a 98 MiB
    # table's gather was profiled 4x faster than it ran in the step
    from placer.tf.costs import feeds_key, sample_inputs
    from placer.tf.trace import index_bounds

    ids, labels = keras.Input((6,), dtype="int32", name="ids"), keras.Input((2,), dtype="int32", name="labels")
    features = keras.Input((3,), dtype="int32", name="features")
    items = keras.layers.Embedding(500, 4)(ids)
    words = keras.layers.Embedding(40, 4)(keras.ops.reshape(ids, (-1, 3, 2)))  # the same ids index a smaller table
    pooled = keras.ops.mean(items, axis=1) + keras.ops.sum(keras.ops.mean(words, axis=2), axis=1)
    hot = keras.ops.sum(keras.ops.one_hot(labels, 7), axis=1)  # values that are not row indices: kept zero
    out = keras.layers.Dense(2)(keras.ops.concatenate([pooled, hot, keras.ops.cast(features, "float32")], axis=-1))
    traced = trace_model(keras.Model([ids, labels, features], out, name="lookups"), batch_size=64)
    assert index_bounds(traced) == (40, None, None)
    feeds = sample_inputs(traced, 0)
    fed = feeds[traced.input_names[0]]
    assert fed.min() >= 0 and fed.max() < 40 and len(np.unique(fed)) > 20
    assert not feeds[traced.input_names[1]].any() and not feeds[traced.input_names[2]].any()
    assert feeds_key(traced) == f"{traced.input_names[0]}<40"
    # profiled with them, and cached under them: a profile fed other ids is another measurement
    cache = ProfileCache(tmp_path)
    costs = compute_costs(traced, ["CPU"], ProfileOptions(repeats=1, runtime=False, cache=cache))
    assert costs.source["CPU"] == "measured"
    (entry,) = tmp_path.glob("profile-CPU-*.json")
    assert json.loads(entry.read_text())["key"]["feeds"] == feeds_key(traced)
    dense = trace_model(keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]), batch_size=2)
    assert feeds_key(dense) == "" and index_bounds(dense) == (None,)
    # a training step: the ids also index the sparse update (SGD's scatter) or the gradient's segment sum (Adam)
    from placer.tf.trace import trace_training_step

    table = keras.Model(ids, keras.layers.Dense(1)(keras.ops.mean(keras.layers.Embedding(300, 4)(ids), axis=1)))
    for optimizer in ("sgd", "adam"):
        assert index_bounds(trace_training_step(table, batch_size=8, optimizer=optimizer)) == (300, None)


def test_a_table_is_profiled_by_a_stand_in_of_its_first_rows_with_ids_below_them(tmp_path):
    # how a worker that cannot hold a table whole still profiles the step (placer.tf.runner._profiling): the
    # table fed its first rows, the ids below them; a split table's parts clamp ids to their whole shard: refused
    from placer.tf.costs import sample_inputs
    from placer.tf.graphdef import row_tables
    from placer.tf.rewrites.split import split_candidates
    from placer.tf.trace import trace_training_step

    ids = keras.Input((6,), dtype="int32", name="ids")
    table = keras.Model(ids, keras.layers.Dense(1)(keras.ops.mean(keras.layers.Embedding(5000, 8)(ids), axis=1)))
    step = trace_training_step(table, batch_size=16, optimizer="sgd")
    (ph,) = row_tables(step.fixed.graph)
    assert "embedding" in ph and len(step.fixed_captures[0][ph].shape) == 2
    fed = sample_inputs(step, 0, {ph: 100})[step.input_names[0]]
    assert fed.max() < 100 and len(np.unique(fed)) > 50
    cache = ProfileCache(tmp_path)
    costs = compute_costs(step, ["CPU"], ProfileOptions(repeats=1, runtime=False, cache=cache), table_rows={ph: 100})
    assert costs.source["CPU"] == "measured" and costs.stand_ins == {ph: 100}
    assert any(us > 0 for name, us in costs.us["CPU"].items() if "ScatterSub" in name)
    (entry,) = tmp_path.glob("profile-CPU-*.json")
    assert f"{ph}=100 rows" in json.loads(entry.read_text())["key"]["feeds"]
    # Adam updates the whole table (a dense step from the segment sum): no stand-in serves it
    assert not row_tables(trace_training_step(table, batch_size=16, optimizer="adam").fixed.graph)
    splits = [s for s in split_candidates(step.fixed.graph, step.fixed_captures[0], 2) if ph in s.placeholders]
    with pytest.raises(CostError, match="stand-in"):
        compute_costs(step, ["CPU"], ProfileOptions(repeats=1, runtime=False), splits=splits, table_rows={ph: 100})


def test_a_measured_link_times_transfers_from_its_measurements():
    # a link whose large transfers are slower per byte than its fitted line (two gRPC workers: 1.4-1.8 GB/s at
    # 1-4 MiB, ~1 GB/s at 64-128 MiB): the simulated step pays the measured time, the solvers keep the line
    from cost_models import Link, TensorEdge, fit_link
    from placer.core.problem import PlacementProblem

    sizes = [1 << 12, 1 << 16, 1 << 20, 1 << 24, 1 << 26, 1 << 27]
    times = [2e-4 + b / 1.6e9 if b <= 1 << 24 else 2e-4 + b / 1.0e9 for b in sizes]
    fit = fit_link(sizes, times)
    link = fit.link
    assert [b for b, _ in link.points] == [float(s) for s in sizes]
    assert link.seconds(1 << 27) == pytest.approx(times[-1])  # measured, not the line's
    assert link.latency_s + (1 << 27) / link.bandwidth_bytes_per_s < 0.9 * times[-1]
    assert link.seconds(1 << 28) == pytest.approx(2 * times[-1])  # beyond the largest: its rate
    assert link.seconds(40 << 20) == pytest.approx((times[3] + times[4]) / 2)  # halfway between 16 and 64 MiB

    def problem(measured):
        return PlacementProblem.build(
            names=["a", "b"], compute_s=np.ones((2, 2)), memory_bytes=np.zeros(2), capacity_bytes=np.full(2, np.inf),
            tensors=[TensorEdge(0, (1,), float(1 << 27))], bandwidth=np.full((2, 2), link.bandwidth_bytes_per_s),
            latency=np.full((2, 2), link.latency_s), measured_links=measured)

    line, measured = problem(()), problem([((0, 1), link), ((1, 0), link)])
    assert measured.symmetric and line.symmetric  # both pairs measured alike
    assert measured.link_seconds(0, 1, 1 << 27) == pytest.approx(times[-1])
    assert measured.transfer_s(measured.tensors[0], 0, 1) == pytest.approx(times[-1])
    assert line.transfer_s(line.tensors[0], 0, 1) < 0.9 * times[-1]
    from cost_models import simulate

    a = np.array([0, 1])
    step = simulate(measured.compute_s, measured.tensors, a, measured.occupancy_seconds,
                    link_latency_s=measured.latency).step_time_s
    assert step == pytest.approx(2.0 + times[-1])
    assert problem([((0, 1), Link(1e9, 0.0))]).measured_links == ()  # a link without measurements is the line
    with pytest.raises(GraphError, match="outside"):
        problem([((0, 2), link)])
    with pytest.raises(GraphError, match="outside"):
        problem([((1, 1), link)])


def test_measured_link_times_travel_in_the_graph_file_and_bad_ones_are_refused():
    from placer.core.devices import resolve_devices
    from placer.core.graph_io import devices_from_json, devices_to_json
    from cost_models import Link

    devset = resolve_devices(["/job:worker/task:0/device:CPU:0", "/job:worker/task:1/device:CPU:0"])
    measured = Link(1e9, 1e-4, points=((4096.0, 2e-4), (1 << 24, 0.02)))
    devset = replace(devset, links={(0, 1): measured, (1, 0): devset.links[(1, 0)]})
    data = devices_to_json(devset)
    assert data["links"][0]["measured"] == [[4096.0, 2e-4], [float(1 << 24), 0.02]]
    assert "measured" not in data["links"][1]
    again = devices_from_json(data)
    assert again.links[(0, 1)] == measured and again.measured_links() == (((0, 1), measured),)
    data["links"][0]["measured"] = [[1 << 24, 0.02], [4096, 2e-4]]
    with pytest.raises(DeviceError, match="increasing sizes"):
        devices_from_json(data)
    data["links"][0]["measured"] = [[4096, "fast"]]
    with pytest.raises(DeviceError, match="must be a number"):
        devices_from_json(data)


def test_the_workers_shared_capacity_probe_is_run_once_more_after_an_empty_tensor_fault(small_traced, devices,
                                                                                        monkeypatch, caplog):
    # TensorFlow on gRPC workers sometimes hands an op of the probe an empty weight copy (an InvalidArgumentError);
    # the probe then runs once more with new copies, and a second failure is a WorkerError saying how to skip it
    from placer.tf import timing

    calls, copies = [], []
    real_copies = timing.weight_copies

    def flaky(traced, placements, rounds, budget_s, seed, variables=None, *, stand_ins=(), min_s=0.0):
        calls.append(variables)
        if len(calls) == 1:
            raise tf.errors.InvalidArgumentError(None, None, "Must provide as many biases as the channel size: [0]")
        return [[2e-3] * 3, [2.5e-3] * 3, [1e-3] * 3, [1e-3] * 3]

    monkeypatch.setattr(timing, "_interleaved", flaky)
    monkeypatch.setattr(timing, "weight_copies", lambda t, d: copies.append(d) or real_copies(t, d))
    with caplog.at_level(logging.WARNING, logger="placer.tf.timing"):
        capacity = timing.measure_shared_capacity(small_traced, devices[:2], pooled=False)
    assert 1.0 <= capacity <= 2.0 and len(calls) == 2 and len(copies) == 2
    assert calls[0] is not calls[1]  # new weight copies for the second run
    assert "running it once more with new weight copies" in caplog.text

    def broken(*args, **kwargs):
        raise tf.errors.InvalidArgumentError(None, None, "Must provide as many biases as the channel size: [0]")

    monkeypatch.setattr(timing, "_interleaved", broken)
    with pytest.raises(WorkerError, match=r"failed twice .*biases.*pass shared_capacity=") as twice:
        timing.measure_shared_capacity(small_traced, devices[:2], pooled=False)
    assert isinstance(twice.value.__cause__, tf.errors.InvalidArgumentError)
    with pytest.raises(tf.errors.InvalidArgumentError, match="biases"):  # logical devices of one process: no retry
        timing.measure_shared_capacity(small_traced, devices[:2], pooled=True)



def test_a_profiled_variable_larger_than_a_piece_travels_in_pieces_with_the_same_value(monkeypatch):
    """A variable's value larger than ``PIECE_BYTES`` is made as zeros where it is profiled and written there in
    pieces of rows (so no transfer to a worker is larger than a piece), then read whole like any other: the step
    fetches the same sum."""
    from cost_models import profile

    monkeypatch.setattr(profile, "PIECE_BYTES", 64)  # 4 rows of 4 float32 per piece
    cut, real = [], profile.row_pieces
    monkeypatch.setattr(profile, "row_pieces", lambda *a: cut.append(real(*a)) or cut[-1])
    g = tf.Graph()
    with g.as_default():
        h = tf.compat.v1.placeholder(tf.resource, [], name="v")
        read = tf.raw_ops.ReadVariableOp(resource=h, dtype=tf.float32, name="read")
        tf.reduce_sum(read * tf.range(1.0, 11.0)[:, None], name="out")
    value = np.arange(40, dtype=np.float32).reshape(10, 4)
    with profile.GraphProfiler(g.as_graph_def(), {}, {"v:0": value}, ["out:0"], warmup=0) as p:
        pieces = [op for op in p._sess.graph.get_operations() if op.type == "ResourceStridedSliceAssign"]
        assert len(pieces) == 1 and any(op.type == "DisableCopyOnRead" for op in p._sess.graph.get_operations())
        assert p._run(p._outs[0], {}) == pytest.approx(float((value * np.arange(1, 11)[:, None]).sum()))
    assert cut == [[(0, 4), (4, 8), (8, 10)]]  # written in three pieces


def test_a_profile_out_of_a_workers_memory_is_taken_in_this_process_instead(small_traced, monkeypatch, caplog):
    """A worker under a memory limit that holds the weights but not the step's peak runs out of memory while
    the step is profiled there (TensorFlow's ``ResourceExhaustedError``): the costs stage profiles in this
    process instead and says so (the plan's memory check decides what fits the worker), rather than failing."""
    from cost_models.profile import ProfileOutOfMemory
    from placer.tf import costs as costs_module

    worker = "/job:worker/replica:0/task:0/device:CPU:0"
    monkeypatch.setattr(costs_module, "worker_addresses", lambda names: {"/job:worker/replica:0/task:0": "x:1"})
    where, real = [], costs_module._profiled

    def profiled(**kw):
        where.append(kw["target"])
        if kw["target"]:
            raise ProfileOutOfMemory(f"profiling ran out of memory at op 'MatMul' on {kw['device']}: OOM")
        return real(**kw)

    monkeypatch.setattr(costs_module, "_profiled", profiled)
    with caplog.at_level(logging.INFO, logger="placer.tf.costs"):
        got = compute_costs(small_traced, ["CPU"], ProfileOptions(repeats=1, seed=0, runtime=False, cache=False),
                            devices=[worker])
    assert where == ["grpc://x:1", ""] and got.source["CPU"] == "measured"
    assert all(t >= 0 for t in got.us["CPU"].values()) and got.us["CPU"]
    assert "ran out of memory" in caplog.text and "profiled in this process instead" in caplog.text

    def out_of_memory(**kw):
        raise ProfileOutOfMemory(f"profiling ran out of memory at op 'MatMul' on {kw['device']}: OOM. Profile a "
                                 "smaller batch (batch_size=), or plan with an analytic model (hardware=)")

    monkeypatch.setattr(costs_module, "_profiled", out_of_memory)  # here too: nowhere else to profile
    with pytest.raises(placer.CostError, match=r"ran out of memory.*batch_size="):
        compute_costs(small_traced, ["CPU"], ProfileOptions(repeats=1, seed=0, runtime=False, cache=False),
                      devices=[worker])


def test_a_worker_that_holds_the_weights_but_not_the_steps_peak_is_not_profiled_on(monkeypatch, caplog):
    """Before profiling, each gRPC worker under a memory limit is checked against the step's predicted peak on
    it alone (weights and live tensors, simulated from the graph with unit op times): one that holds the weights
    but not the peak is left out (profiled in this process instead) rather than run out of memory with the
    step there. A device of this process keeps being profiled on (its memory is the plan's promise, not a
    limit). Unit op times give the peak the profiled times give."""
    from placer.core.build import build_problem
    from placer.core.devices import resolve_devices
    from placer.tf import runner
    from placer.tf.graphdef import variable_bytes
    from placer.tf.opgraph import build_op_graph
    from placer.tf.trace import trace_training_step

    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256, activation="relu"),
                              keras.layers.Dense(256, activation="relu"), keras.layers.Dense(4)], name="peak_mlp")
    step = trace_training_step(model, batch_size=512, optimizer="adam")
    weights = sum(variable_bytes(v) for v in step.fixed_captures[0].values())
    names = [f"/job:worker/task:{i}/device:CPU:0" for i in range(2)]
    monkeypatch.setattr(runner, "worker_addresses", lambda devices: {
        f"/job:worker/replica:0/task:{i}": f"127.0.0.1:{2000 + i}" for i in range(2)})
    peak = runner._one_device_peak(step, resolve_devices(names), 1)
    assert peak > 1.5 * weights  # 512 rows of 256-wide activations, kept for the backward pass
    costs = compute_costs(step, ["CPU"], ProfileOptions(repeats=1, seed=0, runtime=False, cache=False))
    built = build_problem(build_op_graph(step, costs.us).graph, resolve_devices(["/CPU:0"]))
    assert built.simulate(np.zeros(built.problem.n, dtype=int)).peak_memory_bytes[0] == pytest.approx(peak, rel=0.05)

    between = int((weights + peak) / 2)
    with caplog.at_level(logging.INFO, logger="placer.tf.runner"):
        assert runner._holds_whole(step, resolve_devices(
            [placer.DeviceSpec(n, memory_bytes=between) for n in names])) == [False, False]
    assert "holds the model's weights" in caplog.text and "not its step's predicted peak" in caplog.text
    assert runner._holds_whole(step, resolve_devices(
        [placer.DeviceSpec(n, memory_bytes=int(peak * 1.01)) for n in names])) == [True, True]
    assert runner._holds_whole(step, resolve_devices(  # the weights alone do not fit: as before
        [placer.DeviceSpec(n, memory_bytes=weights // 2) for n in names])) == [False, False]
    assert runner._holds_whole(step, resolve_devices([placer.DeviceSpec("/CPU:0", memory_bytes=between)])) == [True]
    # a worker whose allocator pool is replayed is checked by its pool's peak: two 4.06 MiB kernels take an
    # 8 MiB region each (16 MiB in use), where the same worker without a pool holds the step's 8.1 MiB
    pair = keras.Sequential([keras.Input((1024,)), keras.layers.Dense(1040), keras.layers.Dense(1024)])
    forward = trace_model(pair, batch_size=1)
    specs = [placer.DeviceSpec(n, memory_bytes=12 << 20, memory_pool_bytes=pool) for n, pool in
             zip(names, (64 << 20, None))]
    assert runner._holds_whole(forward, resolve_devices(specs)) == [False, True]
