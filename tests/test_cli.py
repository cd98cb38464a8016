"""Every ``autoplace`` subcommand run as a user would (a fresh process): outputs, exit codes, one-line errors."""

import json
import os
import subprocess
import sys

import pytest

from placer.reporting import validate_report
from tests.models import branchy

DEVICES = ["--devices", "/CPU:0", "/CPU:1", "--logical-cpus", "2", "--batch-size", "4"]


def run_cli(*args, cwd):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run([sys.executable, "-m", "placer.cli", *map(str, args)], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=300)


#: What TensorFlow's C++ core prints on import whatever ``TF_CPP_MIN_LOG_LEVEL`` says (TF 2.21 logs it through
#: absl before absl's logging is initialised; the oneDNN line only on CPUs where oneDNN's ops are on).
TF_IMPORT_LINES = ("All log messages before absl::InitializeLog() is called", "] oneDNN custom operations are on.")


def own_stderr(r) -> str:
    """The command's stderr without TensorFlow's own import-time lines."""
    return "".join(ln for ln in r.stderr.splitlines(keepends=True) if not any(m in ln for m in TF_IMPORT_LINES))


def one_line_error(r, code=2):
    """Exit ``code``, one ``autoplace: error:`` line on stderr, no traceback, nothing on stdout."""
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == code, r.stderr[-2000:]
    assert lines and lines[-1].startswith("autoplace: error: ") and "Traceback" not in r.stderr, r.stderr[-2000:]
    return lines[-1]


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """``autoplace plan`` once, with every output: report (HTML and JSON), plan, op graph, SavedModel."""
    d = tmp_path_factory.mktemp("cli")
    branchy(width=32).save(d / "m.keras")
    r = run_cli("plan", "m.keras", *DEVICES, "--time-limit", "1", "--report", "rep.json", "--plan-json", "plan.json",
                "--graph-json", "ops.json", "--export", "saved", "--measure", "5", "--measure-seconds", "0", cwd=d)
    assert r.returncode == 0, r.stderr[-2000:]
    return d, r


def test_plan_writes_every_output(planned):
    d, r = planned
    assert "placed" in r.stdout and "report: rep.json" in r.stdout and "SavedModel: saved" in r.stdout
    assert "measured at batch 4 (5 interleaved runs)" in r.stdout
    assert "traced" in r.stderr  # progress output: plain log lines when stderr is not a terminal
    report = validate_report(json.loads((d / "rep.json").read_text()))
    plan = json.loads((d / "plan.json").read_text())
    assert set(plan["assignment"].values()) <= {dev["name"] for dev in report["devices"]}
    assert report["graph"]["ops"] == len(plan["assignment"]) == len(report["ops"])
    assert (d / "saved" / "saved_model.pb").is_file() and (d / "ops.json").is_file()
    assert [m["repeats"] for m in report["measurements"]] == [5, 5]


def test_report_rerenders_reports_and_plans_offline(planned):
    d, _ = planned
    r = run_cli("report", "rep.json", "--out", "again.html", cwd=d)
    assert r.returncode == 0, r.stderr[-2000:]
    page = (d / "again.html").read_text()
    assert page.count('<figure class="chart"') == 5 and "measured step time" in page
    r = run_cli("report", "plan.json", "--out", "plan.html", cwd=d)
    assert r.returncode == 0 and "report (plan)" in r.stdout, r.stderr[-2000:]
    assert "made from a plan JSON alone" in (d / "plan.html").read_text()
    r = run_cli("report", "rep.json", "--out", "steps.trace.json", cwd=d)
    trace = json.loads((d / "steps.trace.json").read_text())
    report = json.loads((d / "rep.json").read_text())
    assert sum(e["ph"] == "X" for e in trace["traceEvents"]) == len(report["simulation"]["timeline"])


def test_export_with_a_plan_does_not_solve_and_profile_fills_the_cache(planned, tmp_path):
    d, _ = planned
    env_cache = tmp_path / "cache"
    r = run_cli("export", "m.keras", *DEVICES, tmp_path / "out", "--plan", "plan.json", cwd=d)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "not re-solved" in r.stdout and "given" in r.stdout
    saved = json.loads((tmp_path / "out" / "assets.extra" / "autoplace" / "plan.json").read_text())
    assert saved["assignment"] == json.loads((d / "plan.json").read_text())["assignment"]
    os.environ["AUTOPLACE_CACHE_DIR"] = str(env_cache)
    try:
        r = run_cli("profile", "m.keras", *DEVICES, "--top", "3", cwd=d)
    finally:
        del os.environ["AUTOPLACE_CACHE_DIR"]
    assert r.returncode == 0, r.stderr[-2000:]
    assert "CPU: measured," in r.stdout and str(env_cache) in r.stdout
    assert len([ln for ln in r.stdout.splitlines() if " µs " in ln]) == 3
    assert list(env_cache.rglob("*.json")), "the profile is in the cache"


def test_user_errors_are_one_line_with_exit_2_and_write_nothing(planned, tmp_path):
    d, _ = planned
    import keras

    keras.Sequential([keras.Input((4,)), keras.layers.Lambda(lambda x: x * 2)]).save(tmp_path / "lam.keras")
    keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)]).save(tmp_path / "other.keras")
    (tmp_path / "corrupt.keras").write_bytes(b"PK\x03\x04 not a zip")
    report = json.loads((d / "rep.json").read_text())
    (tmp_path / "v99.json").write_text(json.dumps({**report, "report_version": 99}))
    (tmp_path / "ro").mkdir()
    (tmp_path / "ro").chmod(0o500)
    cases = {
        ("plan", "missing.keras", "--devices", "/CPU:0"): "does not exist",
        ("plan", "corrupt.keras", "--devices", "/CPU:0"): "cannot load",
        ("plan", "lam.keras", "--devices", "/CPU:0", "--batch-size", "2"): "--unsafe-deserialization",
        ("plan", d / "saved", "--devices", "/CPU:0"): "placer.load",
        ("plan", d / "m.keras", "--devices", "/CPU:5", "--batch-size", "2"): "not available",
        ("frobnicate",): "invalid choice",
        ("plan", d / "m.keras", "--devices", "/CPU:0", "--no-such-flag"): "unrecognized arguments",
        ("plan", d / "m.keras", "--devices", "/CPU:0", "--report", "ro/r.json"): "cannot write",
        ("export", "other.keras", *DEVICES, "out", "--plan", d / "plan.json"): "not in the plan",
        ("report", "v99.json", "--out", "v99.html"): "report version 99",
        ("report", d / "m.keras", "--out", "m.html"): "cannot read report file",
    }
    if os.geteuid() == 0:  # root writes anywhere: the read-only folder only stops other users
        cases.pop(("plan", d / "m.keras", "--devices", "/CPU:0", "--report", "ro/r.json"))
        cases[("plan", d / "m.keras", "--devices", "/CPU:0", "--report", d / "m.keras" / "r.json")] = "not a folder"
    before = sorted(p.name for p in tmp_path.iterdir())
    for argv, message in cases.items():
        line = one_line_error(run_cli(*argv, cwd=tmp_path))
        assert message in line, (argv, line)
    assert sorted(p.name for p in tmp_path.iterdir()) == before, "a failed command wrote nothing"
    r = run_cli("plan", "lam.keras", "--devices", "/CPU:0", "--batch-size", "2", "--unsafe-deserialization",
                "--report", "lam.json", "-q", cwd=tmp_path)
    assert r.returncode == 0 and own_stderr(r) == "", r.stderr[-2000:]


@pytest.mark.parametrize("command", ["plan", "profile", "export", "report", "plan-graph"])
def test_every_subcommand_has_help(command, capsys):
    from placer import cli

    with pytest.raises(SystemExit) as e:
        cli.main([command, "--help"])
    assert e.value.code == 0 and f"autoplace {command}" in capsys.readouterr().out


def test_a_terminal_gets_a_progress_bar_over_the_stages(planned, tmp_path):
    import pty
    import select

    d, _ = planned
    import fcntl
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # a 120-column terminal
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.Popen([sys.executable, "-m", "placer.cli", "plan", str(d / "m.keras"), *DEVICES,
                             "--time-limit", "1", "--report", str(tmp_path / "r.json")],
                            stdin=slave, stdout=subprocess.DEVNULL, stderr=slave, env=env, cwd=tmp_path)
    os.close(slave)
    chunks = []
    while True:
        ready, _, _ = select.select([master], [], [], 1.0)
        if ready:
            try:
                data = os.read(master, 4096)
            except OSError:  # the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    proc.wait(timeout=300)
    os.close(master)
    text = b"".join(chunks).decode("utf-8", "replace")
    assert proc.returncode == 0, text[-2000:]
    assert "stages" in text and "solve…" in text and "emit…" in text, text[-2000:]  # the bar named each stage
    assert "traced" not in text, "on a terminal the bar replaces the log lines"
    assert (tmp_path / "r.json").is_file()


def test_export_without_an_output_directory_is_a_user_error(capsys):
    from placer import cli

    assert cli.main(["export", "m.keras", "--devices", "/CPU:0", "/CPU:1", "-q"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "give the SavedModel directory to write" in err[0]


def test_progress_must_be_callable(devices):
    import keras

    import placer

    m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    with pytest.raises(placer.AutoplaceError, match="progress must be a callable"):
        placer.autoplace(m, devices[:1], batch_size=2, progress=42)
    heard = []
    placer.autoplace(m, devices[:1], batch_size=2, time_limit_s=1, progress=lambda s, t: heard.append((s, t is None)))
    from placer.tf.runner import STAGES

    assert [s for s, start in heard if start] == list(STAGES) == [s for s, start in heard if not start]
