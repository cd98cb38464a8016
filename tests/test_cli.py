"""The ``autoplace plan`` command, run as a user would (a fresh process)."""

import json
import os
import subprocess
import sys

from tests.models import branchy


def run_cli(*args, cwd):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run([sys.executable, "-m", "placer.cli", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=300)


def test_plan_writes_report_and_plan(tmp_path):
    path = tmp_path / "m.keras"
    branchy(width=32).save(path)
    r = run_cli("plan", str(path), "--devices", "/CPU:0", "/CPU:1", "--logical-cpus", "2", "--batch-size", "4",
                "--time-limit", "1", "--report", "rep.json", "--plan-json", "plan.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "placed" in r.stdout and "report: rep.json" in r.stdout
    assert "traced" in r.stderr  # progress output
    report = json.loads((tmp_path / "rep.json").read_text())
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert set(plan["assignment"].values()) <= {d["name"] for d in report["devices"]}
    assert report["graph"]["ops"] == len(plan["assignment"])


def test_plan_reports_bad_input_clearly(tmp_path):
    r = run_cli("plan", "missing.keras", "--devices", "/CPU:0", cwd=tmp_path)
    assert r.returncode == 2 and "does not exist" in r.stderr
    path = tmp_path / "m.keras"
    branchy(width=8).save(path)
    r = run_cli("plan", str(path), "--devices", "/CPU:5", "--batch-size", "2", cwd=tmp_path)
    assert r.returncode == 2 and "not available" in r.stderr
