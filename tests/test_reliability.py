"""Failure behaviour (issue 16): children that import only the installed packages, atomic outputs,
a cache that validates, typed errors for bad numbers and types, inputs shaped like Keras takes them."""

import os

from placer.solvers import SolveOptions
from placer.solvers.cpsat import _solve_in_child
from tests.test_solvers import random_problem


def _plant(directory, *packages):
    marker = directory / "HIJACKED"
    for pkg in packages:
        (directory / pkg).mkdir()
        (directory / pkg / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write({pkg!r})\n")
    return marker


def test_the_solver_child_does_not_import_from_the_current_directory(tmp_path, monkeypatch):
    marker = _plant(tmp_path, "ortools", "placer", "numpy")
    monkeypatch.chdir(tmp_path)
    result = _solve_in_child(random_problem(0, 6, 2), SolveOptions(time_limit_s=1, objective="throughput"))
    assert not marker.exists()
    assert result.solution is not None and len(result.solution.assignment) == 6
    assert os.getcwd() == str(tmp_path)


# --- graph files and CLI arguments: exit 0 or 2, one line, never a traceback --------------------------
import json  # noqa: E402
import time  # noqa: E402

import pytest  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from placer import cli  # noqa: E402
from placer.core.graph_io import save_graph  # noqa: E402
from placer.core.synthetic import training_graph  # noqa: E402

LIMIT_S = 1.0
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.sampled_from([10**400, -1, 0, 2**63, 1e308])
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6)


@pytest.fixture(scope="module")
def base_doc(tmp_path_factory):
    path = tmp_path_factory.mktemp("graph") / "g.json"
    save_graph(path, training_graph(3, 3, seed=1), ["/CPU:0", "/CPU:1"])
    return json.loads(path.read_text())


def _paths(doc, prefix=()):
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _paths(v, (*prefix, i))


def _mutate(doc, path, value, delete):
    doc = json.loads(json.dumps(doc))
    if not path:
        return value
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    if delete and isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return doc


def _run_cli(capsys, argv):
    t = time.monotonic()
    rc = cli.main(argv)
    elapsed = time.monotonic() - t
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    assert rc in (0, 2), (rc, err)
    if rc == 2:
        errors = [ln for ln in err.splitlines() if ln.startswith("autoplace: error:")]
        assert len(errors) == 1 and err.rstrip().endswith(errors[0].rstrip()), err
    return rc, elapsed


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_graph_files_exit_0_or_2_with_one_line(base_doc, tmp_path, capsys, data):
    paths = list(_paths(base_doc))
    path = data.draw(st.sampled_from(paths))
    doc = _mutate(base_doc, path, data.draw(JSON_VALUES), data.draw(st.booleans()))
    f = tmp_path / "g.json"
    f.write_text(json.dumps(doc))
    rc, elapsed = _run_cli(capsys, ["plan-graph", str(f), "--time-limit", str(LIMIT_S), "-q"])
    assert elapsed < 2 * LIMIT_S + 5, elapsed  # the limit, twice, plus validation


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.one_of(st.binary(max_size=64), st.sampled_from([b"\xff\xfe{}", b"[" * 200_000 + b"]" * 200_000,
                                                             b'{"format": "autoplace-graph", "version": "2"}',
                                                             b"[1, 2]", b'{"format": "autoplace-graph"}'])))
def test_corrupt_graph_files_exit_2_with_one_line(tmp_path, capsys, raw):
    f = tmp_path / "g.json"
    f.write_bytes(raw)
    rc, _ = _run_cli(capsys, ["plan-graph", str(f), "--time-limit", "1", "-q"])
    assert rc == 2


ARG_VALUES = st.sampled_from(["nan", "inf", "-inf", "-1", "0", "1e20", "abc", "", "1e9", "2", "0.5", str(2**70)])


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flag=st.sampled_from(["--time-limit", "--seed", "--memory-bytes", "--objective", "--algorithm",
                             "--group-by", "--memory", "--devices", "--out"]), value=ARG_VALUES)
def test_cli_arguments_exit_0_or_2_with_one_line(base_doc, tmp_path, capsys, flag, value):
    f = tmp_path / "g.json"
    f.write_text(json.dumps(base_doc))
    argv = ["plan-graph", str(f), "-q", flag, value]
    if flag == "--memory-bytes":
        argv += ["--devices", "/CPU:0", "/CPU:1"]
    if flag != "--time-limit":
        argv += ["--time-limit", "1"]
    if flag == "--out":
        argv[-1] = str(tmp_path / value) if value else ""
    _run_cli(capsys, argv)


# --- inputs shaped like Keras takes them ----------------------------------------------------------------
import keras  # noqa: E402
import networkx as nx  # noqa: E402
import numpy as np  # noqa: E402

import placer  # noqa: E402
from placer.errors import InputSignatureError, OutputError  # noqa: E402


@pytest.fixture(scope="module")
def two_inputs():
    a, b = keras.Input((3,), name="a"), keras.Input((2,), name="b")
    m = keras.Model([a, b], keras.layers.Dense(2)(keras.layers.Concatenate()([a, b])))
    return m, placer.autoplace(m, ["/CPU:0", "/CPU:1"], batch_size=8, time_limit_s=1, profile_cache=False)


def test_inputs_by_list_tuple_and_dict_give_the_models_outputs(two_inputs):
    m, placed = two_inputs
    rng = np.random.default_rng(0)
    xa, xb = rng.standard_normal((8, 3)).astype("float32"), rng.standard_normal((8, 2)).astype("float32")
    ref = m([xa, xb]).numpy()
    for x in ([xa, xb], (xa, xb), {"a": xa, "b": xb}):
        assert np.array_equal(placed(x).numpy(), ref)
    assert np.array_equal(placed.predict({"b": xb, "a": xa}, batch_size=4, verbose=0),
                          m.predict([xa, xb], batch_size=4, verbose=0))


@pytest.mark.parametrize("bad", ["abc", None, 3.0, {"a": 1}, [np.ones((2, 3), "float32")]])
def test_bad_inputs_are_input_signature_errors(two_inputs, bad):
    with pytest.raises(InputSignatureError):
        two_inputs[1](bad)


def test_predict_checks_cardinality_and_batch_size(two_inputs):
    _, placed = two_inputs
    with pytest.raises(ValueError, match="cardinality"):  # Keras' own check, as for the original model
        placed.predict([np.ones((16, 3), "float32"), np.ones((24, 2), "float32")], batch_size=8, verbose=0)
    with pytest.raises(InputSignatureError, match="batch_size"):
        placed.predict([np.ones((4, 3), "float32"), np.ones((4, 2), "float32")], batch_size=0, verbose=0)


def test_a_model_with_dict_inputs_is_placed_and_called_by_name():
    z, a = keras.Input((3,), name="z"), keras.Input((2,), name="a")
    m = keras.Model({"z": z, "a": a}, keras.layers.Dense(2)(keras.layers.Concatenate()([z, a])))
    placed = placer.autoplace(m, ["/CPU:0", "/CPU:1"], batch_size=4, time_limit_s=1, profile_cache=False)
    x = {"z": np.ones((4, 3), "float32"), "a": np.full((4, 2), 2.0, "float32")}
    assert np.array_equal(placed(x).numpy(), m(x).numpy())


def test_an_unbuilt_model_is_refused_and_left_unbuilt():
    from tests.models import Subclassed

    m = Subclassed()
    with pytest.raises(InputSignatureError, match="not built"):
        placer.autoplace(m, ["/CPU:0"], input_signature=[(4, 5)], time_limit_s=1)
    assert not m.built and not m.variables


def test_numbers_out_of_range_are_typed_errors():
    from placer import DeviceSpec
    from placer.errors import AutoplaceError, DeviceError, SolverError

    for bad in (float("nan"), float("inf"), "abc", 2**63, True, 0):
        with pytest.raises(DeviceError):
            DeviceSpec("/CPU:0", memory_bytes=bad)
    m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    for opts, error in (({"time_limit_s": float("inf")}, SolverError), ({"time_limit_s": 1e9}, SolverError),
                        ({"time_limit_s": True}, SolverError), ({"seed": "x"}, SolverError),
                        ({"seed": 2**70}, SolverError), ({"batch_size": 10**12}, InputSignatureError),
                        ({"batch_size": 0}, InputSignatureError), ({"worker_timeout_s": 0}, AutoplaceError)):
        with pytest.raises(error):
            placer.autoplace(m, ["/CPU:0"], **{"batch_size": 4, **opts})


# --- atomic outputs: a full disk leaves the old file and nothing else ------------------------------------
import shutil  # noqa: E402
import stat  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import textwrap  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tmpfs_works() -> bool:
    if not shutil.which("unshare"):
        return False
    r = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"], capture_output=True)
    return r.returncode == 0


FULL_DISK = textwrap.dedent("""
    import json, os, sys
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import keras, numpy as np, placer
    from placer.errors import OutputError
    d = sys.argv[1]
    m = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64), keras.layers.Dense(4)])
    placed = placer.autoplace(m, ["/CPU:0"], batch_size=4, time_limit_s=1, profile_cache=False)
    out = {}
    placed.report(os.path.join(d, "r.json"))
    good = open(os.path.join(d, "r.json")).read()
    with open(os.path.join(d, "fill"), "wb", buffering=0) as f:  # fill the disk
        try:
            while True:
                f.write(b"x" * 1024)
        except OSError:
            pass
    for name, call in (("report", lambda: placed.report(os.path.join(d, "r.json"))),
                       ("plan", lambda: placed.plan.save(os.path.join(d, "p.json"))),
                       ("export", lambda: placed.export(os.path.join(d, "saved")))):
        try:
            call()
            out[name] = "written"
        except OutputError as e:
            out[name] = "OutputError"
        except Exception as e:
            out[name] = type(e).__name__ + ": " + str(e)[:200]
    out["report_intact"] = open(os.path.join(d, "r.json")).read() == good
    out["left"] = sorted(os.listdir(d))
    print("RESULT " + json.dumps(out))
""")


@pytest.mark.skipif(not _tmpfs_works(), reason="needs unshare -rm (a mount namespace) for a small tmpfs")
def test_a_full_disk_keeps_the_old_report_and_leaves_nothing_behind():
    cmd = ["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=256k tmpfs /mnt && exec {sys.executable} -c "
           f"'{FULL_DISK}' /mnt"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=ROOT))
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and line, proc.stderr[-3000:]
    out = json.loads(line[0][len("RESULT "):])
    assert out["report"] == out["plan"] == out["export"] == "OutputError", out
    assert out["report_intact"]
    assert out["left"] == ["fill", "r.json"], out  # no temporary file, no half SavedModel


def test_the_writer_refuses_a_directory_and_leaves_no_temporary_file(tmp_path):
    from placer.core.outputs import write_text

    (tmp_path / "d").mkdir()
    with pytest.raises(OutputError, match="is a directory"):
        write_text(tmp_path / "d", "x")
    write_text(tmp_path / "f.json", "1")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "f.json"]


# --- the profile cache validates its entries -------------------------------------------------------------
from dataclasses import asdict  # noqa: E402

from cost_models.cache import CACHE_FORMAT, CacheKey, ProfileCache  # noqa: E402


@pytest.mark.parametrize("entry", [
    {"median_us": [1], "spread_us": {}}, {"median_us": {}, "spread_us": {}},
    {"median_us": {"a": float("nan"), "b": 1}, "spread_us": {}}, {"median_us": {"a": -1, "b": 1}, "spread_us": {}},
    {"median_us": {"a": "1", "b": 1}, "spread_us": {}}, {"median_us": {"a": 1, "b": 1}, "spread_us": None},
])
def test_bad_cache_entries_are_ignored_with_a_warning(tmp_path, caplog, entry):
    cache, key = ProfileCache(tmp_path), CacheKey("g", "CPU", 4, "2.21.0")
    (tmp_path / key.filename()).write_text(json.dumps({"format": CACHE_FORMAT, "key": asdict(key), **entry}))
    assert cache.get(key, {"a", "b"}) is None
    assert "ignoring profile cache entry" in caplog.text


def test_cache_files_are_private_and_a_failed_write_is_not_fatal(tmp_path, caplog):
    key = CacheKey("g", "CPU", 4, "2.21.0")
    cache = ProfileCache(tmp_path / "cache")
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "cache").mkdir(mode=0o700)
    (tmp_path / "cache" / (key.filename()[:-5] + f".tmp{os.getpid()}")).symlink_to(victim)  # the old temp name
    assert cache.put(key, {"a": 1.0}, {"a": 0.0})
    assert victim.read_text() == "keep"
    assert stat.S_IMODE((tmp_path / "cache" / key.filename()).stat().st_mode) == 0o600
    fresh = ProfileCache(tmp_path / "new")
    assert fresh.put(key, {"a": 1.0}, {})
    assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o700
    blocked = ProfileCache(victim / "sub")  # a file where the folder should be
    assert blocked.put(key, {"a": 1.0}, {}) is False
    assert "could not write the profile cache entry" in caplog.text


def test_lookup_layers_and_shapeless_py_functions_say_what_to_do():
    import tensorflow as tf

    from placer.errors import ModelError

    inp = keras.Input((1,), dtype="string")
    lookup = keras.Model(inp, keras.layers.StringLookup(vocabulary=["a", "b"])(inp))
    with pytest.raises(ModelError, match="outside the placed model"):
        placer.autoplace(lookup, ["/CPU:0"], batch_size=4, time_limit_s=1)

    class Py(keras.layers.Layer):
        def call(self, x):
            return tf.py_function(lambda t: t * 2, [x], tf.float32)

        def compute_output_shape(self, s):
            return s

    i = keras.Input((3,))
    shapeless = keras.Model(i, keras.layers.Dense(2)(Py()(i)))
    with pytest.raises(InputSignatureError, match="ensure_shape") as e:
        placer.autoplace(shapeless, ["/CPU:0"], batch_size=4, time_limit_s=1)
    assert "\x1b[" not in str(e.value) and "\n" not in str(e.value)


# --- the CLI checks its outputs before any work and never writes over its input ---------------------------
@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "m.keras"
    keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)]).save(path)
    return path


@pytest.mark.parametrize("flag", ["--plan-json", "--graph-json", "--report", "--export"])
def test_the_cli_refuses_to_write_over_its_input(saved_model, capsys, flag):
    before = saved_model.read_bytes()
    argv = ["plan", str(saved_model), "--devices", "/CPU:0", "-q", flag, str(saved_model)]
    if flag == "--report":
        argv[-1] = str(saved_model)
    rc, elapsed = _run_cli(capsys, argv)
    assert rc == 2 and saved_model.read_bytes() == before


def test_the_cli_checks_output_paths_before_any_work(saved_model, tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    for argv in (["--report", str(tmp_path / "file" / "r.json")], ["--export", str(tmp_path / "file")],
                 ["--report", str(tmp_path / "r.json"), "--plan-json", str(tmp_path / "r.json")]):
        rc, elapsed = _run_cli(capsys, ["plan", str(saved_model), "--devices", "/CPU:0", "-q", *argv])
        assert rc == 2 and elapsed < 1.0  # refused before loading, tracing, profiling or solving
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


@pytest.mark.parametrize("where, value", [
    (("graph", "nodes", 0, "compute_us"), 10**400), (("graph", "nodes", 0, "colocation"), ["a", "b"]),
    (("graph", "nodes", 0, "allowed_kinds"), 3), (("version",), "2"), (("graph", "nodes", 0, "memory_bytes"), 2**70),
    (("devices", 0, "memory_bytes"), float("nan")), (("graph", "edges", 0, "bytes"), -1), ((), [1, 2]),
])
def test_the_named_bad_graph_files_exit_2_with_one_line(base_doc, tmp_path, capsys, where, value):
    f = tmp_path / "g.json"
    text = json.dumps(_mutate(base_doc, where, value, False)).replace("NaN", "NaN")
    f.write_text(text)
    rc, _ = _run_cli(capsys, ["plan-graph", str(f), "--time-limit", "1", "-q"])
    assert rc == 2


# --- the same graph gives the same problem, whatever order its nodes were added in -----------------------
@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(2, 40))
def test_the_problem_does_not_depend_on_node_insertion_order(seed, n):
    from placer.core.build import build_problem
    from placer.core.devices import resolve_devices
    from placer.planner import PlanOptions, plan_problem

    rng = np.random.default_rng(seed)
    g = nx.gnp_random_graph(n, 0.2, seed=seed, directed=True)
    dag = nx.DiGraph((u, v) for u, v in g.edges if u < v)
    dag.add_nodes_from(range(n))
    for v in dag:
        dag.nodes[v]["compute_us"] = float(rng.integers(1, 5))  # ties on purpose
    for e in dag.edges:
        dag.edges[e]["bytes"] = 1024.0
    shuffled = nx.DiGraph()
    order = rng.permutation(n).tolist()
    shuffled.add_nodes_from((v, dag.nodes[v]) for v in order)
    shuffled.add_edges_from(sorted(dag.edges(data=True), key=lambda e: order.index(e[1])))
    devices = resolve_devices(["/CPU:0", "/CPU:1"])
    a, b = build_problem(dag, devices), build_problem(shuffled, devices)
    assert a.nodes == b.nodes
    opts = PlanOptions(time_limit_s=0.5, baselines=())
    assert plan_problem(a, opts).assignment == plan_problem(b, opts).assignment


def test_validated_integers_are_stored_as_ints():
    from placer.measure.cluster import LocalCluster
    from placer.planner import PlanOptions
    from placer.tf.options import PlacementOptions

    opts = PlacementOptions(batch_size=8.0, replicas=1.0, profile_repeats=3.0)
    assert (opts.batch_size, opts.replicas, opts.profile_repeats) == (8, 1, 3)
    assert all(type(v) is int for v in (opts.batch_size, opts.replicas, opts.profile_repeats))
    plan = PlanOptions(seed=3.0, max_nodes=100.0, time_limit_s=2)
    assert type(plan.seed) is int and type(plan.max_nodes) is int and type(plan.time_limit_s) is float
    assert LocalCluster(2.0).workers == 2
    with pytest.raises(InputSignatureError):
        PlacementOptions(batch_size=8.5)
