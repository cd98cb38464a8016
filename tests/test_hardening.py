"""What a tampered file, a special path or an unusual model must not break: typed errors before any work, never
a replaced device or link, never a spin; dict labels placed like any other."""

import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import keras
import networkx as nx
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import placer
from placer.core.outputs import write_text
from placer.errors import DeviceError, ExportError, GraphError, ModelError, OutputError, UnsupportedError
from placer.tf.export import EXTRA_DIR

ROOT = Path(__file__).resolve().parents[1]


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "placer.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=120)


@pytest.fixture(scope="module")
def graph_file(tmp_path_factory):
    g = nx.DiGraph()
    g.add_node("a", compute_us=10.0)
    g.add_node("b", compute_us=20.0)
    g.add_edge("a", "b", bytes=64)
    path = tmp_path_factory.mktemp("graph") / "g.json"
    placer.save_graph(path, g, ["/CPU:0", "/CPU:1"])
    return path


def test_an_output_path_that_is_a_fifo_or_a_symlink_is_refused_not_replaced(graph_file, tmp_path):
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    target = tmp_path / "real.json"
    target.write_text("keep me")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(tmp_path / "nowhere.json")
    for out, what in ((fifo, "FIFO"), (link, "symbolic link"), (dangling, "symbolic link")):
        proc = _cli("plan-graph", str(graph_file), "--out", str(out), cwd=tmp_path)
        assert proc.returncode == 2 and what in proc.stderr, proc.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert link.is_symlink() and target.read_text() == "keep me" and dangling.is_symlink()
    with pytest.raises(OutputError, match="FIFO"):  # the library's writer refuses it too
        write_text(fifo, "x")
    if os.path.exists("/dev/full") and os.access("/dev/full", os.W_OK):  # a device node, where writable
        with pytest.raises(OutputError, match="device"):
            write_text("/dev/full", "x")
        assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


def _model():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((4,), name="x"), keras.layers.Dense(8, name="d1"),
                             keras.layers.Dense(3, name="d2")], name="small")


@pytest.fixture(scope="module")
def exported(devices, tmp_path_factory):
    model = _model()
    placed = placer.autoplace(model, devices[:2], batch_size=4, time_limit_s=1, algorithm="round_robin",
                              shared_capacity=None, measure_call=False)
    path = placed.export(tmp_path_factory.mktemp("export") / "saved")
    x = np.random.default_rng(0).standard_normal((4, 4)).astype("float32")
    return {"path": Path(path), "x": x, "y": placed(x).numpy()}


def test_an_export_to_a_symlink_is_refused(exported, devices, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    for link, to in ((tmp_path / "to_empty", empty), (tmp_path / "dangling", tmp_path / "gone")):
        link.symlink_to(to)
        placed = placer.load(exported["path"])
        with pytest.raises(OutputError, match="symbolic link"):
            placed.export(link)
        assert link.is_symlink() and not any(empty.iterdir())


def _copy(exported, tmp_path) -> Path:
    path = tmp_path / f"copy{len(list(tmp_path.iterdir()))}"
    shutil.copytree(exported["path"], path)
    return path


def _edit_json(path: Path, name: str, edit) -> None:
    f = path / EXTRA_DIR / name
    f.write_text(json.dumps(edit(json.loads(f.read_text()))))


def _outputs_equal(loaded, exported) -> bool:
    got = [np.asarray(t) for t in tf.nest.flatten(loaded(exported["x"]))]
    return len(got) == 1 and np.array_equal(got[0], exported["y"])


def _variables(d, edit):
    return {**d, "variables": edit(d["variables"])}


MUTATIONS = {
    "microbatches 1e30": ("manifest.json", lambda d: {**d, "microbatches": 1e30}),
    "microbatches 10**30": ("manifest.json", lambda d: {**d, "microbatches": 10**30}),
    "microbatches 100000": ("manifest.json", lambda d: {**d, "microbatches": 100000}),
    "microbatches abc": ("manifest.json", lambda d: {**d, "microbatches": "abc"}),
    "microbatches 0": ("manifest.json", lambda d: {**d, "microbatches": 0}),
    "microbatches -1": ("manifest.json", lambda d: {**d, "microbatches": -1}),
    "a list for a manifest": ("manifest.json", lambda d: [d]),
    "a variable key ../../x": ("manifest.json",
                               lambda d: _variables(d, lambda vs: [{**vs[0], "key": "../../x"}, *vs[1:]])),
    "an output ../../x:0": ("manifest.json", lambda d: {**d, "outputs": ["../../x:0"]}),
    "swapped variable keys": ("manifest.json", lambda d: _variables(
        d, lambda vs: [{**v, "key": vs[(i + 1) % len(vs)]["key"]} for i, v in enumerate(vs)])),
    "emptied variables": ("manifest.json", lambda d: _variables(d, lambda vs: [])),
    "a wrong input shape": ("manifest.json", lambda d: {**d, "inputs": [{**d["inputs"][0], "shape": [None, 5]}]}),
    "another version": ("manifest.json", lambda d: {**d, "version": 99}),
    "plan microbatches abc": ("plan.json", lambda d: {**d, "microbatches": "abc"}),
    "plan microbatches 4": ("plan.json", lambda d: {**d, "microbatches": 4}),
    "ops output_bytes -5": ("ops.json", lambda d: {**d, "graph": {**d["graph"], "nodes": [
        {**d["graph"]["nodes"][0], "output_bytes": -5}, *d["graph"]["nodes"][1:]]}}),
}


@pytest.mark.parametrize("case", list(MUTATIONS))
def test_a_tampered_export_is_an_export_error_naming_the_file(case, exported, tmp_path):
    name, edit = MUTATIONS[case]
    path = _copy(exported, tmp_path)
    _edit_json(path, name, edit)
    t = time.perf_counter()
    with pytest.raises(ExportError, match="manifest" if name == "manifest.json" else name.replace(".", r"\.")):
        placer.load(path)
    assert time.perf_counter() - t < 10


@pytest.mark.parametrize("name", [f"{EXTRA_DIR}/graph_def.pb", "variables/variables.index",
                                  "variables/variables.data-00000-of-00001"])
def test_a_truncated_or_flipped_binary_file_is_an_export_error_or_loads_exactly(name, exported, tmp_path):
    for how in ("truncate", "flip"):
        path = _copy(exported, tmp_path)
        data = bytearray((path / name).read_bytes())
        if how == "truncate":
            data = data[:len(data) // 3]
        else:
            for i in range(0, len(data), max(len(data) // 8, 1)):
                data[i] ^= 0xFF
        (path / name).write_bytes(bytes(data))
        try:
            loaded = placer.load(path)
        except ExportError as e:
            assert name.split("/")[0] in str(e) or EXTRA_DIR in str(e), e
        else:  # what was damaged is not what the placed model reads: it loads, and computes exactly
            assert _outputs_equal(loaded, exported), (name, how)


_JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=12)
                     | st.sampled_from(["../../x", "../../x:0", "/CPU:9", "Identity:0", "gpipe", ""]),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                  max_size=3), max_leaves=6)


def _mutate(doc, data, depth=0):
    """A copy of the JSON ``doc`` with one value somewhere replaced (or a key dropped), drawn from ``data``."""
    if isinstance(doc, (dict, list)) and doc and depth < 4 and data.draw(st.booleans(), label="descend"):
        keys = list(doc) if isinstance(doc, dict) else list(range(len(doc)))
        key = data.draw(st.sampled_from(keys), label="key")
        out = dict(doc) if isinstance(doc, dict) else list(doc)
        if isinstance(doc, dict) and data.draw(st.booleans(), label="drop"):
            del out[key]
            return out
        out[key] = _mutate(doc[key], data, depth + 1)
        return out
    return data.draw(_JSON, label="value")


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_fuzzed_exports_load_exactly_or_say_what_is_wrong(exported, tmp_path_factory, data):
    """Any mutation of the three JSON files, or a truncation of a binary one: an ExportError (or, for a plan
    whose devices are well-formed but not here, a DeviceError) or a load that computes exactly, in seconds."""
    path = tmp_path_factory.mktemp("fuzz") / "saved"
    shutil.copytree(exported["path"], path)
    target = data.draw(st.sampled_from(["manifest.json", "plan.json", "ops.json", "graph_def.pb",
                                        "variables.index", "variables.data-00000-of-00001"]), label="file")
    if target.endswith(".json"):
        f = path / EXTRA_DIR / target
        f.write_text(json.dumps(_mutate(json.loads(f.read_text()), data)))
    else:
        f = path / (EXTRA_DIR if target == "graph_def.pb" else "variables") / target
        raw = f.read_bytes()
        f.write_bytes(raw[:data.draw(st.integers(0, max(len(raw) - 1, 0)), label="keep")])
    t = time.perf_counter()
    try:
        loaded = placer.load(path)
    except (ExportError, DeviceError):
        pass
    else:
        assert _outputs_equal(loaded, exported)
    assert time.perf_counter() - t < 10


def test_dict_outputs_train_with_labels_by_name(devices):
    def build():
        keras.utils.set_random_seed(0)
        i = keras.Input((6,), name="i")
        h = keras.layers.Dense(8, activation="relu", name="h")(i)
        m = keras.Model(i, {"cls": keras.layers.Dense(3, name="cls")(h), "reg": keras.layers.Dense(1, name="reg")(h)})
        m.compile(optimizer=keras.optimizers.SGD(0.05),
                  loss={"cls": keras.losses.SparseCategoricalCrossentropy(from_logits=True), "reg": "mse"})
        return m

    model, ref = build(), build()
    rng = np.random.default_rng(1)
    x = rng.standard_normal((32, 6)).astype("float32")
    y = {"cls": rng.integers(0, 3, 32).astype("int32"), "reg": rng.standard_normal((32, 1)).astype("float32")}
    with pytest.raises(placer.InputSignatureError, match="targets="):  # sparse labels: they need a signature
        placer.autoplace(model, devices[:2], training=True, batch_size=8, time_limit_s=1)
    with pytest.raises(placer.InputSignatureError, match="outputs"):
        placer.autoplace(model, devices[:2], training=True, batch_size=8, time_limit_s=1,
                         targets={"nope": tf.TensorSpec((None,), "int32")})
    placed = placer.autoplace(model, devices[:2], training=True, batch_size=8, time_limit_s=1, algorithm="round_robin",
                              targets={"cls": tf.TensorSpec((None,), "int32"), "reg": tf.TensorSpec((None, 1))})
    got = placed.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0).history
    want = ref.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0).history
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-5)


def test_the_smaller_edges_are_typed_errors_at_the_start(devices, tmp_path, graph_file):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    for command in (["report", str(deep), "--out", str(tmp_path / "r.html")], ["plan-graph", str(deep)]):
        proc = _cli(*command, cwd=tmp_path)
        assert proc.returncode == 2 and "nested too deeply" in proc.stderr, proc.stderr
    doc = json.loads(graph_file.read_text())
    doc["graph"]["nodes"][0]["output_bytes"] = -5
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(GraphError, match="output_bytes"):
        placer.solve(*placer.load_graph(bad))
    with pytest.raises(DeviceError, match="workers"):
        placer.LocalCluster(workers=1000)
    model = _model()
    model.compile(optimizer="sgd", loss="mse")
    placed = placer.autoplace(model, devices[:2], training=True, batch_size=4, time_limit_s=1)
    with pytest.raises(ModelError, match="no such file"):
        placed.load_weights(str(tmp_path / "missing.weights.h5"))
    x, y = np.ones((8, 4), "float32"), np.zeros((8, 3), "float32")
    before = [w.copy() for w in placed.get_weights()]
    with pytest.raises(UnsupportedError, match="weights.h5"):  # refused before the first update
        placed.fit(x, y, batch_size=4, epochs=1, verbose=0,
                   callbacks=[keras.callbacks.ModelCheckpoint(str(tmp_path / "x.keras"))])
    assert all(np.array_equal(a, b) for a, b in zip(before, placed.get_weights()))


def test_a_model_whose_nested_function_captures_a_variable_places_bit_exactly(devices):
    """ConvNeXt's depthwise convolutions call a nested function that captures its kernel: that capture is named
    by a counter, differently in every trace (it failed in the costs stage, then ran the call away from its
    kernel)."""
    model = keras.applications.ConvNeXtTiny(weights=None, input_shape=(32, 32, 3), classes=10)
    placed = placer.autoplace(model, devices, batch_size=2, algorithm="round_robin", time_limit_s=1,
                              shared_capacity=None, measure_call=False, profile_repeats=1)
    x = np.random.default_rng(0).standard_normal((2, 32, 32, 3)).astype("float32")
    assert len(set(placed.plan.assignment.values())) == len(devices)
    assert np.array_equal(placed.predict(x, verbose=0), model.predict(x, verbose=0))


def test_dict_inputs_of_unknown_length_are_planned_from_a_sample_or_a_dict_signature(devices):
    keras.utils.set_random_seed(0)
    ids, mask = keras.Input((None,), dtype="int32", name="ids"), keras.Input((None,), dtype="float32", name="mask")
    h = keras.layers.Embedding(50, 8, name="embed")(ids) * keras.ops.expand_dims(mask, -1)
    model = keras.Model({"ids": ids, "mask": mask}, keras.layers.Dense(4, name="out")(h), name="dict_inputs")
    rng = np.random.default_rng(2)
    x = {"ids": rng.integers(0, 50, (4, 6)).astype("int32"), "mask": np.ones((4, 6), "float32")}
    with pytest.raises(placer.InputSignatureError):  # the sequence length is unknown: it needs a shape
        placer.autoplace(model, devices[:2], batch_size=4, time_limit_s=1)
    by_sample = placer.autoplace(model, devices[:2], sample=x, time_limit_s=1, algorithm="round_robin")
    assert by_sample.plan.batch_size == 4
    by_dict = placer.autoplace(model, devices[:2], batch_size=4, time_limit_s=1, algorithm="round_robin",
                               input_signature={"mask": (None, 6), "ids": tf.TensorSpec((None, 6), "int32")})
    want = model(x).numpy()
    for placed in (by_sample, by_dict):
        assert np.array_equal(placed(x).numpy(), want)
    with pytest.raises(placer.InputSignatureError, match="takes"):
        placer.autoplace(model, devices[:2], batch_size=4, input_signature={"nope": (None, 6)})


def test_connecting_to_tasks_off_this_machine_warns_about_unauthenticated_servers():
    from placer.measure.cluster import SecurityWarning, connect

    with pytest.warns(SecurityWarning, match="without authentication"):
        with pytest.raises(placer.WorkerError):  # nothing answers there: refused before any server starts
            connect({"worker": ["192.0.2.1:2222"]}, timeout_s=0.5)  # TEST-NET-1: never routed
    with pytest.raises(placer.WorkerError):  # loopback: no warning (warnings are errors here)
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("error", SecurityWarning)
            connect({"worker": ["127.0.0.1:1"]}, timeout_s=0.5)


def test_labels_of_another_shape_after_a_dataset_fit_are_a_typed_error(devices):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    model.compile(optimizer="sgd", loss="mse")
    placed = placer.autoplace(model, devices[:2], training=True, batch_size=4, time_limit_s=1)
    x, y = np.ones((8, 4), "float32"), np.zeros((8, 3), "float32")
    placed.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(4), epochs=1, shuffle=False, verbose=0)  # relaxed
    before = [w.copy() for w in placed.get_weights()]
    for bad in (np.zeros((8, 5), "float32"), np.zeros((8,), "float32")):
        with pytest.raises(placer.InputSignatureError):
            placed.fit(x, bad, batch_size=4, epochs=1, verbose=0)
    assert all(np.array_equal(a, b) for a, b in zip(before, placed.get_weights()))


def test_a_sample_that_cannot_give_shapes_is_a_typed_error(devices):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    model.compile(optimizer="sgd", loss="mse")
    x = np.ones((4, 4), "float32")
    with pytest.raises(placer.InputSignatureError, match="not an array"):
        placer.autoplace(model, devices[:1], sample=object())
    with pytest.raises(placer.InputSignatureError, match="batch dimension"):
        placer.autoplace(model, devices[:1], sample=np.float32(1.0))
    with pytest.raises(placer.InputSignatureError, match="one batch \\(x, y\\)"):
        placer.autoplace(model, devices[:1], training=True, sample=x)
    placed = placer.autoplace(model, devices[:1], training=True, sample=(x, np.zeros((4, 3), "float32")),
                              time_limit_s=1)
    assert placed.plan.batch_size == 4


def test_watched_calls_reuse_their_helper_thread_a_stuck_call_keeps_its_own_and_idle_ones_end():
    # A fresh thread per call cost ~3 ms against gRPC workers (TensorFlow sets up each thread's eager context on
    # its first call): the watchdog keeps its helper threads, but never hands a stuck call's thread to another.
    import threading

    from placer.tf.remote import _Callers

    callers = _Callers(idle_s=0.3)
    seen: list[threading.Thread] = []
    for _ in range(3):
        assert callers.run(lambda: seen.append(threading.current_thread())).wait(10)
    assert len(set(seen)) == 1 and seen[0] is not threading.current_thread()
    release = threading.Event()
    stuck = callers.run(lambda: release.wait(10))
    other: list[threading.Thread] = []
    assert callers.run(lambda: other.append(threading.current_thread())).wait(10)
    assert other[0] is not seen[0] and not stuck.is_set()
    release.set()
    assert stuck.wait(10)
    for thread in (seen[0], other[0]):
        thread.join(10)
        assert not thread.is_alive(), "an idle helper thread did not end"


def test_an_idle_helper_thread_holds_nothing_of_its_last_call():
    # Its last job's closure holds the placed function, whose captured variables live on the workers: held by an
    # idle thread, a dropped placed model's weights stayed in the workers' memory for ``idle_s`` (a 256 MiB model
    # placed three times on two workers within a minute: 128 MiB more in use on each worker per placement).
    import gc
    import threading
    import weakref

    from placer.tf.remote import _Callers

    class Job:
        def __init__(self) -> None:
            self.thread: threading.Thread | None = None

        def __call__(self) -> None:
            self.thread = threading.current_thread()

    callers = _Callers(idle_s=30.0)
    job = Job()
    assert callers.run(job).wait(10)
    thread, held = job.thread, weakref.ref(job)
    del job
    gc.collect()
    assert thread is not None and thread.is_alive(), "the helper thread should still be idle, waiting for a call"
    assert held() is None, "the idle helper thread still holds its last job"
