"""The exported SavedModel, reloaded in a fresh process with the same devices."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import placer
from placer.errors import OutputError
from tests.models import multi_input, sample

CHILD = textwrap.dedent("""
    import json, sys
    import numpy as np
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 4)
    from placer.tf.export import LOAD_OPTIONS
    path, inp, out = sys.argv[1:4]
    loaded = tf.saved_model.load(path, options=LOAD_OPTIONS)
    fn = loaded.signatures["serving_default"]
    data = np.load(inp)
    result = fn(**{k: tf.constant(data[k]) for k in data.files})
    np.savez(out, **{k: v.numpy() for k, v in result.items()})
    print(json.dumps(sorted({v.device for v in loaded.placed_variables})))
""")


def test_export_reloads_in_fresh_process_with_same_outputs(tmp_path, devices):
    model = multi_input()
    p = placer.autoplace(model, devices, batch_size=4, algorithm="contiguous")
    x = sample(model, 4, seed=5)
    expected = [t.numpy() for t in p(x)]
    path = p.export(tmp_path / "saved")
    np.savez(tmp_path / "in.npz", left=x[0], right=x[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([sys.executable, "-c", CHILD, path, str(tmp_path / "in.npz"), str(tmp_path / "out.npz")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = np.load(tmp_path / "out.npz")
    for i, e in enumerate(expected):
        assert np.array_equal(got[f"output_{i}"], e)
    var_devices = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(var_devices) == {v.value.device for v in p.variables}
    assert len(var_devices) > 1, "variables keep their planned devices after reload"


def test_export_refuses_non_empty_directory(tmp_path, devices):
    model = multi_input()
    p = placer.autoplace(model, devices[:1], batch_size=2)
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "file").write_text("keep me")
    with pytest.raises(OutputError, match="not empty"):
        p.export(tmp_path / "taken")
    assert (tmp_path / "taken" / "file").read_text() == "keep me"


REMAP_CHILD = textwrap.dedent("""
    import json, sys
    import numpy as np
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 6)
    import placer
    path, inp, out = sys.argv[1:4]
    data = np.load(inp)
    xs = [data["left"], data["right"]]
    results, report = {}, {}
    for tag, devices in {"same": None, "two": ["/CPU:0", "/CPU:1"],
                         "renamed": ["/CPU:2", "/CPU:3", "/CPU:4", "/CPU:5"]}.items():
        loaded = placer.load(path, devices, time_limit_s=1)
        for i, t in enumerate(tf.nest.flatten(loaded(*xs))):
            results[f"{tag}_{i}"] = t.numpy()
        report[tag] = {"remapped": loaded.remapped, "planned": sorted(set(loaded.op_devices.values())),
                       "ran": sorted(set(loaded.observed_placement(*xs).values())),
                       "variables": sorted({v.device for v in loaded.placed_variables})}
    np.savez(out, **results)
    print(json.dumps(report))
""")


def test_export_remaps_onto_fewer_and_renamed_devices_in_fresh_process(tmp_path, devices):
    model = multi_input()
    p = placer.autoplace(model, devices, batch_size=4, algorithm="round_robin")
    assert len(set(p.plan.assignment.values())) == 4
    x = sample(model, 4, seed=7)
    expected = [t.numpy() for t in p(x)]
    path = p.export(tmp_path / "saved")
    np.savez(tmp_path / "in.npz", left=x[0], right=x[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([sys.executable, "-c", REMAP_CHILD, path, str(tmp_path / "in.npz"),
                           str(tmp_path / "out.npz")], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = np.load(tmp_path / "out.npz")
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    full = "/job:localhost/replica:0/task:0/device:CPU:{}".format
    wanted = {"same": {full(i) for i in range(4)}, "two": {full(0), full(1)},
              "renamed": {full(i) for i in range(2, 6)}}
    for tag, allowed in wanted.items():
        for i, e in enumerate(expected):
            assert np.array_equal(got[f"{tag}_{i}"], e), f"{tag}: output {i} differs"
        assert report[tag]["remapped"] == (tag != "same")
        for what in ("planned", "ran", "variables"):
            assert set(report[tag][what]) <= allowed, (tag, what, report[tag][what])
        assert len(report[tag]["ran"]) > 1, f"{tag}: the re-mapped model still uses several devices"


def test_load_refuses_what_it_cannot_serve(tmp_path, devices):
    model = multi_input()
    p = placer.autoplace(model, devices[:2], batch_size=2, algorithm="round_robin")
    path = p.export(tmp_path / "saved")
    with pytest.raises(placer.DeviceError, match="not available"):
        placer.load(path, ["/CPU:0", "/GPU:7"])
    with pytest.raises(placer.ExportError, match="not a SavedModel"):
        placer.load(tmp_path)
    import tensorflow as tf

    tf.saved_model.save(tf.Module(), str(tmp_path / "plain"))
    with pytest.raises(placer.ExportError, match="not an autoplace export"):
        placer.load(tmp_path / "plain")
    manifest = tmp_path / "saved" / "assets.extra" / "autoplace" / "manifest.json"
    data = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**data, "version": 99}))
    with pytest.raises(placer.ExportError, match="version 99"):
        placer.load(path)
    manifest.write_text("{not json")
    with pytest.raises(placer.ExportError, match="corrupt"):
        placer.load(path)


def test_a_remapped_placement_exports_again_with_its_device_specs(tmp_path, devices):
    model = multi_input()
    p = placer.autoplace(model, devices, batch_size=2, algorithm="round_robin")
    x = sample(model, 2, seed=3)
    path = p.export(tmp_path / "four")
    specs = [placer.DeviceSpec(d, memory_bytes=2**30) for d in devices[:2]]
    two = placer.load(path, specs, time_limit_s=1)
    again = placer.load(two.export(tmp_path / "two"))
    assert not again.remapped and again.plan.assignment == two.plan.assignment
    _, saved = placer.load_graph(tmp_path / "two" / "assets.extra" / "autoplace" / "ops.json")
    assert [d.memory_bytes for d in saved.devices] == [2**30, 2**30]
    for a, b in zip(tf_flat(again(*x)), [t.numpy() for t in p(x)]):
        assert np.array_equal(a, b)


def tf_flat(out):
    import tensorflow as tf

    return [t.numpy() for t in tf.nest.flatten(out)]


def _two_wide_branches():
    """Two branches of 512-wide dense layers: ops long enough to order (placer.core.order.MIN_ORDERED_OP_S)."""
    import keras

    x = keras.Input((256,), name="x")
    outs = []
    for name in "ab":
        h = keras.layers.Dense(512, activation="relu", name=f"{name}1")(x)
        outs.append(keras.layers.Dense(8, name=f"{name}_out")(keras.layers.Dense(512, name=f"{name}2")(h)))
    return keras.Model(x, outs, name="two_wide_branches")


def test_on_one_thread_executors_a_spread_plan_runs_in_its_simulated_order(devices):
    """``execution_order="simulated"`` (autoplace's default) where the executors run one op at a time depth first
    (``ready_order="lifo"``, as one-thread workers): neither device holds the model, so the plan spreads and
    keeps the order its own simulation ran its ops in (control edges in the placed graph); outputs unchanged.
    ``execution_order="executor"`` leaves the order to TensorFlow. (Batch 128: each branch's products take
    well over the 50 µs an op needs to be ordered; at batch 32 some ran shorter, and some runs ordered none.)"""
    model = _two_wide_branches()
    need = sum(int(np.prod(w.shape)) * 4 for w in model.weights)
    devs = [placer.DeviceSpec(d, memory_bytes=int(0.9 * need)) for d in devices[:2]]
    p = placer.autoplace(model, devs, batch_size=128, ready_order="lifo", time_limit_s=1)
    line = next(x for x in p.plan.log if x.startswith("execution order:"))
    assert line.endswith("kept") and "one device" not in line and len(set(p.plan.assignment.values())) == 2
    assert p.plan.op_order and all(p.plan.assignment[op] == dev for dev, ops in p.plan.op_order.items() for op in ops)
    assert p.emitted.order_edges and p.plan.candidates[-1].note == line
    x = sample(model, 128, seed=3)
    for got, e in zip(tf_flat(p(x)), [t.numpy() for t in model(x)]):
        assert np.array_equal(got, e)
    q = placer.autoplace(model, devs, batch_size=128, ready_order="lifo", time_limit_s=1, execution_order="executor")
    assert not q.plan.op_order and not any(x.startswith("execution order:") for x in q.plan.log)


def test_a_planned_order_is_emitted_as_control_edges_and_applied_again_at_load(tmp_path, devices):
    model = _two_wide_branches()
    assert not placer.autoplace(model, devices[:2], batch_size=32, algorithm="cp_heft").plan.op_order, \
        "a model's plans run in the executor's order unless execution_order='auto'"
    p = placer.autoplace(model, devices[:2], batch_size=32, algorithm="cp_heft", execution_order="auto")
    assert p.plan.op_order, "cp_heft plans carry each device's order of its ops"
    emitted = p.emitted
    assert emitted.order_edges
    nodes = {n.name: n for n in emitted.graph_def.node}
    for before, after in emitted.order_edges:
        assert f"^{before}" in nodes[after].input
        device = next(d for d, ops in p.plan.op_order.items() if after in ops)
        ops = p.plan.op_order[device]
        assert ops.index(before) < ops.index(after) and p.plan.assignment[before] == device
    x = sample(model, 32, seed=11)
    expected = [t.numpy() for t in model(x)]
    for got, e in zip(tf_flat(p(x)), expected):
        assert np.array_equal(got, e), "an order changes when ops run, never what they compute"
    path = p.export(tmp_path / "saved")
    import tensorflow as tf

    saved = tf.compat.v1.GraphDef()
    saved.ParseFromString((tmp_path / "saved" / "assets.extra" / "autoplace" / "graph_def.pb").read_bytes())
    inputs = {n.name: set(n.input) for n in saved.node}
    assert not any(f"^{b}" in inputs.get(a, ()) for b, a in emitted.order_edges), "stored without the order"
    loaded = placer.load(path)
    assert set(loaded.order_edges) == set(emitted.order_edges)
    for got, e in zip(tf_flat(loaded(x)), expected):
        assert np.array_equal(got, e)
    remapped = placer.load(path, devices[2:4], time_limit_s=1)  # re-planned in the executor's order: no order
    assert remapped.remapped and remapped.plan.op_order == {} and remapped.order_edges == ()
    # no ordering heuristic ran (they are skipped for the executor's order, unless auto stopped earlier at a
    # plan proven optimal: the measured costs decide; tests/test_graph_solve.py checks the skip itself)
    ordered = [line for line in remapped.plan.log if line.startswith(("cp_heft:", "cp_etf:"))]
    assert all("skipped (execution_order is not 'auto'" in line for line in ordered), remapped.plan.log
    assert ordered or any(line.startswith("stopped:") for line in remapped.plan.log), remapped.plan.log
    for got, e in zip(tf_flat(remapped(x)), expected):
        assert np.array_equal(got, e)


def test_emit_refuses_an_order_for_a_pipeline():
    import keras

    from placer.errors import GraphError
    from placer.tf.emit import rewrite_context
    from placer.tf.trace import trace_model

    traced = trace_model(keras.Sequential([keras.Input((4,)), keras.layers.ReLU()]), batch_size=2)
    ops = {op.name: "/CPU:0" for op in traced.dynamic.graph.get_operations()}
    with pytest.raises(GraphError, match="pipeline of micro-batches"):
        rewrite_context(traced, ops, order={"/CPU:0": tuple(ops)}, microbatches=2)
