"""Data parallelism for a forward pass: a copy of the model per device, searched beside model parallelism.

The simulator's twin (:mod:`placer.core.replicas`) on random DAGs, then real Keras models on logical CPUs:
the copies' outputs equal the original run on the same parts bit for bit, each copy runs on its device,
the variables are read once per step, plans and exports keep ``replicas``, and bad requests are typed.
"""

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import keras
import tensorflow as tf

import placer
from placer.errors import PlanError
from tests.models import dense_chain
from cost_models import TensorEdge
from placer.core.build import build_problem
from placer.core.devices import DeviceSpec
from placer.core.graph_io import as_device_set
from placer.core.microbatch import simulate_pipeline
from placer.core.plan import Plan
from placer.core.problem import Schedule
from cost_models import SimOptions
from placer.core.replicas import (best_replicas, device_groups, group_maps, pinned_nodes, replicated_schedule,
                                  simulate_replicas)


# --- the simulator's twin (no TensorFlow) -------------------------------------------------------------------

@settings(max_examples=25, deadline=None)
@given(n=st.integers(3, 25), seed=st.integers(0, 10_000), m=st.integers(1, 3))
def test_replicated_schedule_is_a_dag_with_each_copy_on_its_device(n, seed, m):
    import networkx as nx

    rng = np.random.default_rng(seed)
    edges = [(u, v) for v in range(1, n) for u in range(v) if rng.random() < 0.3]
    tensors = tuple(TensorEdge(u, (v,), float(rng.integers(1, 100))) for u, v in edges)
    pinned = np.zeros(n, dtype=bool)
    pinned[0] = True
    s = Schedule(rng.random((n, 2)), tensors, (), np.arange(n))
    d, ts, control, a = replicated_schedule(s, np.zeros(n, int), group_maps(2, 2), m, pinned=pinned)
    copies = 2 * m
    assert d.shape[0] == len(a) >= copies * n
    g = nx.DiGraph()
    g.add_nodes_from(range(len(a)))
    g.add_edges_from((t.src, w) for t in ts for w in t.dsts)
    g.add_edges_from(control)
    assert nx.is_directed_acyclic_graph(g)
    for c in range(copies):
        ops = a[c * n:(c + 1) * n]
        assert set(ops.tolist()) == {c // m}                  # copy c runs on group c // m, its mirror too
        if c % m:
            assert d[c * n:(c + 1) * n][pinned].sum() == 0    # the pinned op runs once per group
    # the pinned op's tensors go to its group's copies at full size, never across groups
    full = {x.nbytes for x in tensors if x.src == 0}
    for t in ts:
        if t.src % n == 0 and t.src < copies * n:
            assert t.nbytes in full and {a[w] for w in t.dsts} == {a[t.src]}


def _two_device_problem(weight_bytes: float, bandwidth: float = 1e9):
    import networkx as nx

    g = nx.DiGraph()
    g.add_node("w", compute_us=0.0, memory_bytes=weight_bytes, layer="dense")
    g.add_node("read", compute_us=0.0, memory_bytes=0.0, layer="dense")
    g.add_node("x", compute_us=0.0, memory_bytes=0.0)
    g.add_node("mm", compute_us=1000.0, memory_bytes=0.0, layer="dense")
    g.add_node("out", compute_us=1000.0, memory_bytes=0.0, layer="head")
    g.add_edge("w", "read", bytes=8.0)
    g.add_edge("read", "mm", bytes=weight_bytes)
    g.add_edge("x", "mm", bytes=4096.0)
    g.add_edge("mm", "out", bytes=4096.0)
    devs = as_device_set([DeviceSpec(f"/CPU:{i}", memory_bytes=1 << 34, bandwidth_bytes_per_s=bandwidth, latency_s=0.0)
                          for i in range(2)])
    return build_problem(g, devs, group_by="op")


def test_copies_halve_a_compute_bound_step_and_pay_for_their_weights():
    built = _two_device_problem(weight_bytes=1e3)
    one = simulate_pipeline(built, np.zeros(len(built.problem.names), int), 1).step_time_s
    two = simulate_replicas(built, np.zeros(len(built.problem.names), int), 2, 1).step_time_s
    assert two == pytest.approx(one / 2, rel=0.05)
    assert best_replicas(built, 8, [2], [1, 2])[:2] == (2, 1)
    # heavy weights on a slow link: each copy reads its own device's mirror, nothing crosses per step, and
    # the mirror's bytes count in the second device's memory
    heavy = _two_device_problem(weight_bytes=4e6, bandwidth=1e6)
    zero = np.zeros(len(heavy.problem.names), int)
    fast = simulate_replicas(heavy, zero, 2, 1)
    assert fast.step_time_s == pytest.approx(simulate_replicas(built, np.zeros(len(built.problem.names), int), 2,
                                                               1).step_time_s, rel=0.05)
    peak = simulate_replicas(heavy, zero, 2, 1, SimOptions()).peak_memory_bytes
    assert peak[1] >= 4e6 and peak[0] >= 4e6
    # without mirrors, the weights cross the slow link once per step (not once per micro-batch)
    s = heavy.schedule
    d, ts, c, a = replicated_schedule(s, zero, group_maps(2, 2), 2, pinned=pinned_nodes(s, heavy.memory.resident_bytes),
                                      mirrors=False)
    crossing = [t for t in ts if any(a[w] != a[t.src] for w in t.dsts)]
    assert len(crossing) == 1 and crossing[0].nbytes == 4e6


def test_a_copys_row_gathers_run_where_the_table_is_and_only_their_rows_travel():
    # a training step's copies: the table, its read and its row gather share a colocation key (the op graph's),
    # so each copy gathers its rows on the table's device and receives those, as TensorFlow colocates the
    # placed step's gathers; simulated on the copy's own device, the whole 4 MB table crossed a 1 MB/s link
    # every step (placed.measure on two workers: a 391 MiB table's copies predicted at 147 ms, measured 8.8 ms)
    import networkx as nx

    g = nx.DiGraph()
    g.add_node("table", compute_us=0.0, memory_bytes=4e6, colocation="T", phase="forward")
    g.add_node("read", compute_us=0.0, memory_bytes=0.0, colocation="T", phase="forward")
    g.add_node("ids", compute_us=0.0, memory_bytes=0.0, phase="forward")
    g.add_node("gather", compute_us=100.0, memory_bytes=0.0, colocation="T", phase="forward")
    g.add_node("head", compute_us=2000.0, memory_bytes=0.0, phase="forward")
    g.add_node("grad", compute_us=2000.0, memory_bytes=0.0, phase="backward")
    g.add_node("update", compute_us=10.0, memory_bytes=0.0, colocation="T", phase="update")
    g.add_edges_from([("table", "read", {"bytes": 8.0}), ("read", "gather", {"bytes": 4e6}),
                      ("ids", "gather", {"bytes": 1024.0}), ("gather", "head", {"bytes": 8192.0}),
                      ("head", "grad", {"bytes": 8192.0}), ("grad", "update", {"bytes": 8192.0}),
                      ("table", "update", {"bytes": 8.0})])
    devs = as_device_set([DeviceSpec(f"/CPU:{i}", memory_bytes=1 << 34, bandwidth_bytes_per_s=1e6, latency_s=0.0)
                          for i in range(2)])
    built = build_problem(g, devs, group_by="op")
    assert [v for v, a in zip(built.nodes, built.anchored) if a] == ["read", "gather", "update"]
    zero = np.zeros(len(built.problem.names), int)
    copies = simulate_replicas(built, zero, 2, 1).step_time_s
    assert copies < 0.1  # half the compute, the rows and ids over the link: milliseconds
    assert simulate_replicas(replace(built, anchored=()), zero, 2, 1).step_time_s > 4.0  # the table crossing


def test_the_parameter_codec_shrinks_what_a_training_copy_reads_and_sends():
    # a training step's second copy reads the 4 MB weight over a 1 MB/s link and sends its 4 MB gradient back:
    # about 8 s; with the parameter traffic in bf16 (gradient_compression) half the bytes cross, about 4 s.
    # Tensors that stay on a device are never charged the codec
    import networkx as nx

    g = nx.DiGraph()
    g.add_node("w", compute_us=0.0, memory_bytes=4e6, colocation="W", phase="forward")
    g.add_node("read", compute_us=0.0, memory_bytes=0.0, phase="forward")
    g.add_node("x", compute_us=0.0, memory_bytes=0.0, phase="forward")
    g.add_node("mm", compute_us=1000.0, memory_bytes=0.0, phase="forward")
    g.add_node("grad", compute_us=1000.0, memory_bytes=0.0, phase="backward")
    g.add_node("update", compute_us=10.0, memory_bytes=0.0, colocation="W", phase="update")
    g.add_edges_from([("w", "read", {"bytes": 8.0}), ("read", "mm", {"bytes": 4e6}), ("x", "mm", {"bytes": 1024.0}),
                      ("mm", "grad", {"bytes": 1024.0}), ("grad", "update", {"bytes": 4e6}),
                      ("w", "update", {"bytes": 8.0})])
    devs = as_device_set([DeviceSpec(f"/CPU:{i}", memory_bytes=1 << 34, bandwidth_bytes_per_s=1e6, latency_s=0.0)
                          for i in range(2)])
    built = build_problem(g, devs, group_by="op")
    zero = np.zeros(len(built.problem.names), int)
    calls = []

    def bf16(nbytes, src, dst):
        calls.append((src, dst))
        return nbytes / 2, 0.0, 0.0

    plain = simulate_replicas(built, zero, 2, 1).step_time_s
    halved = simulate_replicas(built, zero, 2, 1, parameter_codec=bf16).step_time_s
    assert plain == pytest.approx(8.0, rel=0.01) and halved == pytest.approx(4.0, rel=0.01)
    assert calls and all(src != dst for src, dst in calls)   # only edges that cross devices
    assert best_replicas(built, 8, [2], [1], parameter_codec=bf16)[2] == pytest.approx(halved)
    # the codec's own time, on the sender (encode) and the receiver (decode), is on the path: the weight's
    # encode, wire and decode before the second copy's forward pass, the gradient's after its backward pass
    slow = simulate_replicas(built, zero, 2, 1, parameter_codec=lambda b, s, d: (b / 2, 0.5, 0.5)).step_time_s
    assert slow == pytest.approx(6.0, rel=0.01)


def test_copies_over_groups_of_devices_are_scored_with_their_placement():
    # four devices, two copies of two devices each: a copy whose two ops run at once (a fan-out) on its two
    # devices halves its step; without the group's placement, R = 2 is not tried, and R = 4 (one device per
    # copy, the batch in quarters) is
    import networkx as nx

    g = nx.DiGraph()
    g.add_node("x", compute_us=0.0, memory_bytes=0.0)
    g.add_node("a", compute_us=4000.0, memory_bytes=0.0)
    g.add_node("b", compute_us=4000.0, memory_bytes=0.0)
    g.add_node("out", compute_us=0.0, memory_bytes=0.0)
    g.add_edges_from([("x", "a", {"bytes": 64.0}), ("x", "b", {"bytes": 64.0}), ("a", "out", {"bytes": 64.0}),
                      ("b", "out", {"bytes": 64.0})])
    devs = as_device_set([DeviceSpec(f"/CPU:{i}", memory_bytes=1 << 34, bandwidth_bytes_per_s=1e12, latency_s=0.0)
                          for i in range(4)])
    built = build_problem(g, devs, group_by="op")
    spread = built.group_assignment({"x": devs.names[0], "a": devs.names[0], "b": devs.names[1],
                                     "out": devs.names[0]})
    two = simulate_replicas(built, spread, 2, 1).step_time_s
    assert two == pytest.approx(0.002, rel=0.01)          # each copy: half the rows, its two ops at once
    assert simulate_replicas(built, np.zeros(4, int), 4, 1).step_time_s == pytest.approx(0.002, rel=0.01)
    assert best_replicas(built, 8, [2, 4], [1])[:2] == (4, 1)        # no placement for R = 2: not tried
    scored = best_replicas(built, 8, [2], [1], group_assignments={2: spread})
    assert scored[:2] == (2, 1) and scored[2] == pytest.approx(two)
    with pytest.raises(PlanError, match="does not divide"):
        simulate_replicas(built, spread, 3, 1)


def test_device_groups_and_bad_counts():
    assert device_groups(["a", "b", "c", "d"], 4) == (("a",), ("b",), ("c",), ("d",))
    with pytest.raises(placer.PlanError, match="does not divide"):
        device_groups(["a", "b", "c"], 2)


# --- real models on logical CPUs ----------------------------------------------------------------------------

def _mlp() -> keras.Model:
    return dense_chain(16, 64, 5, "mlp")


@pytest.fixture(scope="module")
def replicated(devices):
    model = _mlp()
    placed = placer.autoplace(model, devices[:2], batch_size=8, replicas=2, microbatches=1, time_limit_s=1)
    return model, placed


def test_copies_of_several_devices_each_equal_the_model_on_each_copys_rows(devices, caplog):
    # four devices, replicas=2: each copy is placed over two devices (the solver's plan on the first group,
    # mapped device for device onto the second); the outputs are each copy's rows, bit for bit
    model = _mlp()
    with caplog.at_level("INFO", logger="placer"):
        placed = placer.autoplace(model, devices, batch_size=8, replicas=2, microbatches=1, time_limit_s=1,
                                  algorithm="contiguous")
    plan = placed.plan
    full = [tf.DeviceSpec.from_string("/job:localhost/replica:0/task:0/device:" + d.strip("/")).to_string()
            for d in devices]
    assert plan.replicas == 2 and set(plan.assignment.values()) <= set(full[:2])
    assert any("placing one data-parallel copy over 2 devices" in r.getMessage() for r in caplog.records)
    assert plan.kept.strategy == "copies" and plan.kept.replicas == 2
    x = np.random.default_rng(2).standard_normal((8, 16)).astype("float32")
    np.testing.assert_array_equal(placed(x).numpy(), np.concatenate([model(x[:4]).numpy(), model(x[4:]).numpy()]))
    observed = placed.observed_placement(x)
    first = {d for op, d in observed.items() if op.startswith(f"mb0/{model.name}")}
    second = {d for op, d in observed.items() if op.startswith(f"mb1/{model.name}")}
    assert first and first <= set(full[:2]) and second and second <= set(full[2:]), (first, second)
    assert len(second) == len(first)                       # the second copy uses the twins of the first's devices
    with pytest.raises(placer.PlanError, match="multiple of 3"):
        placer.autoplace(model, devices, batch_size=8, replicas=3, time_limit_s=1)


def test_replicated_inference_equals_the_model_on_each_copys_rows(replicated, devices):
    model, placed = replicated
    plan = placed.plan
    assert plan.replicas == 2 and plan.microbatches == 1 and "data-parallel copies" in plan.summary()
    x = np.random.default_rng(1).standard_normal((8, 16)).astype("float32")
    out = placed(x).numpy()
    # each copy runs the model's kernels on its rows: bit-exact against the model on those rows
    np.testing.assert_array_equal(out, np.concatenate([model(x[:4]).numpy(), model(x[4:]).numpy()]))
    # a batch that does not split evenly: 5 = 3 + 2 rows
    odd = x[:5]
    np.testing.assert_array_equal(placed(odd).numpy(), np.concatenate([model(odd[:3]).numpy(),
                                                                        model(odd[3:]).numpy()]))
    np.testing.assert_array_equal(placed.predict(x, batch_size=8, verbose=0), out)
    # each copy on its device
    full = [tf.DeviceSpec.from_string("/job:localhost/replica:0/task:0/device:" + d.strip("/")).to_string()
            for d in devices[:2]]
    observed = placed.observed_placement(x)
    for c in range(2):
        mine = {op: d for op, d in observed.items() if op.startswith(f"mb{c}/{model.name}")}
        assert len(mine) >= 3 and set(mine.values()) == {full[c]}, (c, mine)
    # the weights are read once per step per copy's device: the variables on the first device, and a mirror
    # of each on the second (data parallelism keeps a copy of the weights per device)
    emitted = placed.placement.functions.forward(False)
    reads = [n for n in emitted.graph_def.node if n.op == "ReadVariableOp"]
    assert reads and not any(n.name.startswith("mb") for n in reads)
    assert {n.device for n in reads if n.name.startswith("autoplace_mirror_1/")} == {full[1]}
    assert {n.device for n in reads if not n.name.startswith("autoplace_mirror")} == {full[0]}
    assert len(emitted.mirrors) == len(model.weights)


def test_writes_reach_the_mirrors_of_replicated_weights(devices):
    # set_weights, a single assign and an assign inside a tf.function: the second copy's outputs follow
    model = _mlp()
    placed = placer.autoplace(model, devices[:2], batch_size=8, replicas=2, microbatches=1, time_limit_s=1)
    x = np.random.default_rng(5).standard_normal((8, 16)).astype("float32")
    placed(x)  # the mirrors exist
    rng = np.random.default_rng(6)
    new = [rng.standard_normal(w.shape).astype("float32") for w in model.get_weights()]
    placed.set_weights(new)
    model.set_weights(new)
    np.testing.assert_array_equal(placed(x).numpy(), np.concatenate([model(x[:4]).numpy(), model(x[4:]).numpy()]))
    kernel = placed.weights[0]
    kernel.assign_add(tf.ones_like(kernel))
    model.weights[0].assign_add(tf.ones_like(model.weights[0]))

    @tf.function
    def halve_bias():
        placed.weights[1].assign(placed.weights[1] * 0.5)

    halve_bias()
    model.weights[1].assign(model.weights[1] * 0.5)
    np.testing.assert_array_equal(placed(x).numpy(), np.concatenate([model(x[:4]).numpy(), model(x[4:]).numpy()]))
    mirrors = placed.weights[0].mirrors
    assert len(mirrors) == 1 and np.array_equal(mirrors[0].numpy(), placed.weights[0].numpy())


def test_replicas_survive_save_load_and_export(replicated, tmp_path):
    model, placed = replicated
    path = placed.plan.save(tmp_path / "plan.json")
    again = Plan.load(path)
    assert again.replicas == 2 and again == placed.plan
    x = np.random.default_rng(2).standard_normal((8, 16)).astype("float32")
    export = placed.export(tmp_path / "export")
    loaded = placer.load(export)
    assert loaded.plan.replicas == 2
    np.testing.assert_array_equal(loaded(x).numpy(), placed(x).numpy())
    assert {d for op, d in loaded.op_devices.items()} <= set(placed.plan.devices)


def test_replicas_auto_chooses_what_is_predicted_faster_and_says_why(devices):
    model = _mlp()
    placed = placer.autoplace(model, devices[:2], batch_size=8, time_limit_s=1)  # replicas="auto" by default
    plan = placed.plan
    said = [line for line in plan.log if "data-parallel copies" in line]
    assert said, plan.log
    assert "2 data-parallel copies at " in said[-1] or "do not fit" in said[-1], said  # one device per copy
    if plan.replicas == 2:
        assert "predicted faster" in said[-1]
    else:
        assert "predicted slower" in said[-1] or "do not fit" in said[-1]
    # the strategies scored, in order: the solver's placement (its best micro-batches), one device where the
    # placement spread, the copies; one kept, the one the plan runs, every other saying why it lost
    strategies = [c.strategy for c in plan.candidates]
    assert strategies[0] == "placement" and strategies[-1] == "copies", strategies
    assert [c.outcome for c in plan.candidates].count("kept") == 1 and plan.kept is not None
    kept = plan.kept
    assert (kept.replicas, kept.microbatches) == (plan.replicas, plan.microbatches)
    assert kept.predicted_step_time_s == pytest.approx(plan.predicted_step_time_s - plan.call_overhead_s)
    copies = plan.candidates[-1]
    assert copies.replicas == 2 and (copies.outcome == "kept") == (plan.replicas == 2)
    for c in plan.candidates:
        if c is not kept:
            assert c.outcome.startswith(("replaced", "slower", "over memory", "not within", "does not fit")), c
    assert "strategies scored (predicted):" in plan.summary() and kept.describe() in plan.summary()
    x = np.random.default_rng(3).standard_normal((8, 16)).astype("float32")
    np.testing.assert_allclose(placed(x).numpy(), model(x).numpy(), rtol=1e-6, atol=1e-6)


def test_bad_replica_requests_are_typed(devices):
    model = _mlp()
    with pytest.raises(placer.PlanError, match="multiple of 3 devices"):
        placer.autoplace(model, devices[:2], batch_size=8, replicas=3, time_limit_s=1)
    with pytest.raises(placer.PlanError, match="at least 2 rows"):
        placer.autoplace(model, devices[:2], batch_size=1, replicas=2, microbatches=1, time_limit_s=1)
    with pytest.raises(placer.TrainingError, match="replicas"):
        placer.autoplace(model, devices[:2], batch_size=8, replicas="many")


def test_copies_that_do_not_fit_and_a_plan_whose_copy_spans_groups_are_refused(devices):
    # two 1 MB layers: spread over two 1.5 MB devices one copy fits; a whole copy on each does not
    keras.utils.set_random_seed(0)
    inp = keras.Input((16,))
    h = keras.layers.Dense(512, activation="relu", name="d1")(inp)
    h = keras.layers.Dense(512, activation="relu", name="d2")(h)
    h = keras.layers.Dense(512, activation="relu", name="d3")(h)
    model = keras.Model(inp, keras.layers.Dense(5, name="head")(h))
    small = [placer.DeviceSpec(d, memory_bytes=1_500_000) for d in devices[:2]]
    spread = placer.autoplace(model, small, batch_size=8, replicas=1, microbatches=1, time_limit_s=1)
    assert len(set(spread.plan.assignment.values())) == 2
    with pytest.raises(placer.InsufficientMemoryError, match="replicas=2: the copies"):
        placer.autoplace(model, small, batch_size=8, replicas=2, microbatches=1, time_limit_s=1)
    # auto keeps one copy here
    auto = placer.autoplace(model, small, batch_size=8, microbatches=1, time_limit_s=1)
    assert auto.plan.replicas == 1
    # a plan that runs copies places the first copy only: one spread over every device is refused
    with pytest.raises(placer.PlanError, match="outside the first copy's devices"):
        placer.autoplace(model, small, batch_size=8, plan=replace(spread.plan, replicas=2))


def test_the_report_shows_the_copies(replicated, tmp_path):
    from placer.reporting import validate_report

    model, placed = replicated
    data = placed.report_data
    validate_report(data)
    assert data["plan"]["replicas"] == 2 and data["simulation"]["microbatches"] == 2
    second = placed.plan.devices[1]
    on_second = {t["op"].split("/", 1)[0] for t in data["simulation"]["timeline"] if t["device"] == second}
    assert on_second == {"mb1"}, on_second
    assert placed.report(tmp_path / "r.html").endswith(".html")
    assert any("data-parallel copies" in line for line in data["plan"]["log"])
    assert [c["strategy"] for c in data["plan"]["candidates"]][-1] == "copies"  # asked: replicas=2, kept
    assert data["plan"]["candidates"][-1]["outcome"] == "kept"
    assert "Strategies scored" in (tmp_path / "r.html").read_text(encoding="utf-8")
