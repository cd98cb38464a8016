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
