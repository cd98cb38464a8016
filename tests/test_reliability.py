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
