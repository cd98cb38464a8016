"""One pipeline: a traced model's op graph, saved and solved offline, gives the plan autoplace made;
saved plans re-apply without solving; the TensorFlow-free modules import without TensorFlow.
"""

import json
import os
import pkgutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import placer
from placer.errors import PlanError
from tests.models import branchy, multi_input, sample

ROOT = Path(__file__).resolve().parents[1]
OPTIONS = {"time_limit_s": 1.5, "seed": 3}
PLACE_OPTIONS = {**OPTIONS, "shared_capacity": None, "replicas": 1}  # independent processors: plans split
# (one copy: a saved op graph is solved for one copy of the model; the data-parallel choice needs the model)
OBJECTIVES = ("latency", "throughput")


@pytest.fixture(scope="module")
def model():
    return branchy(width=512)


@pytest.fixture(scope="module")
def placed(model, devices):
    return {o: placer.autoplace(model, devices, batch_size=64, objective=o, **PLACE_OPTIONS) for o in OBJECTIVES}


@pytest.fixture(scope="module")
def saved(placed, tmp_path_factory):
    out = tmp_path_factory.mktemp("replan")
    return {o: Path(p.save_graph(out / f"{o}.json")) for o, p in placed.items()}


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_saved_op_graph_solves_to_the_same_plan(objective, placed, saved):
    p = placed[objective].plan
    graph, devices = placer.load_graph(saved[objective])
    again = placer.solve(graph, devices, objective=objective, group_by=p.group_by, **OPTIONS)
    assert again.assignment == p.assignment
    assert again.value == p.value and again.lower_bound == p.lower_bound and again.solver == p.solver
    # autoplace adds the measured fixed cost of a call, which a saved op graph does not know
    assert again.call_overhead_s == 0 and p.call_overhead_s > 0
    assert again.predicted_step_time_s == pytest.approx(p.predicted_step_time_s - p.call_overhead_s, rel=1e-12)
    assert len(set(p.assignment.values())) > 1, "a split plan, so that the comparison means something"


def test_plan_round_trips_and_reapplies_without_solving(model, devices, placed, tmp_path):
    p = placed["latency"]
    path = p.plan.save(tmp_path / "plan.json")
    loaded = placer.Plan.load(path)
    assert loaded.assignment == p.plan.assignment and loaded.value == p.plan.value
    assert loaded.baselines == p.plan.baselines and loaded.devices == p.plan.devices
    again = placer.autoplace(model, devices, batch_size=64, plan=path)
    assert again.plan.solver == "given" and again.plan.status == "given"
    assert again.plan.assignment == p.plan.assignment
    assert again.plan.objective == "latency"
    x = sample(model, 64, seed=4)
    assert np.array_equal(again(x).numpy(), p(x).numpy())


def test_a_reapplied_plan_takes_microbatches_and_refuses_other_groupings(model, devices, placed):
    p = placed["latency"].plan
    assert p.microbatches == 1
    piped = placer.autoplace(model, devices, batch_size=64, plan=p, microbatches=2)
    assert piped.plan.microbatches == 2 and piped.plan.assignment == p.assignment
    x = sample(model, 64, seed=5)
    ref = np.concatenate([model(part, training=False).numpy() for part in np.split(x, 2)])
    assert np.array_equal(piped(x).numpy(), ref)
    other = "op" if p.group_by != "op" else "layer"
    with pytest.raises(PlanError, match=f"made with group_by={p.group_by!r}, not {other!r}; drop group_by="):
        placer.autoplace(model, devices, batch_size=64, plan=p, group_by=other)
    with pytest.raises(PlanError, match="made with objective='latency', not 'memory'"):
        placer.autoplace(model, devices, batch_size=64, plan=p, objective="memory")


def test_a_plan_for_another_graph_names_the_ops_that_differ(devices, placed, tmp_path):
    other = multi_input()
    with pytest.raises(PlanError, match=r"\[solve stage\] the plan does not fit this graph: .* ops the graph lacks "
                                        r"\(e\.g\. \['.*'\]\)") as e:
        placer.autoplace(other, devices, batch_size=8, plan=placed["latency"].plan)
    assert e.value.stage == "solve"
    with pytest.raises(PlanError, match="made for devices"):
        placer.autoplace(other, devices[:2], batch_size=8, plan=placed["latency"].plan)
    with pytest.raises(PlanError, match="a Plan or the path of a saved plan, got dict"):
        placer.autoplace(other, devices, batch_size=8, plan=placed["latency"].plan.to_dict())


def test_bad_plan_files_are_refused(tmp_path, placed):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(PlanError, match="cannot read plan file"):
        placer.Plan.load(bad)
    data = placed["latency"].plan.to_dict()
    with pytest.raises(PlanError, match="version 99"):
        placer.Plan.from_dict({**data, "version": 99})
    with pytest.raises(PlanError, match="not an autoplace plan"):
        placer.Plan.from_dict({**data, "format": "other"})
    with pytest.raises(PlanError, match="malformed plan"):
        placer.Plan.from_dict({k: v for k, v in data.items() if k != "assignment"})
    # the strategies scored travel with the plan; a malformed one is refused, naming what is wrong
    assert data["candidates"] and placer.Plan.from_dict(data).candidates == placed["latency"].plan.candidates
    one = data["candidates"][0]
    for bad_candidate, match in (({**one, "strategy": "magic"}, "candidate strategy 'magic'"),
                                 ({**one, "replicas": -1}, "candidate replicas"),
                                 ({**one, "predicted_step_time_s": "fast"}, "candidate predicted_step_time_s"),
                                 ({k: v for k, v in one.items() if k != "outcome"}, "malformed plan"), (3, "malformed")):
        with pytest.raises(PlanError, match=match):
            placer.Plan.from_dict({**data, "candidates": [bad_candidate]})
    elsewhere = dict(data["assignment"])
    elsewhere[next(iter(elsewhere))] = "/job:localhost/replica:0/task:0/device:CPU:9"
    with pytest.raises(PlanError, match="device list"):
        placer.Plan.from_dict({**data, "assignment": elsewhere})


def test_report_is_built_from_what_the_stages_did(placed):
    data = placed["latency"].report_data
    assert data["cost_model"]["compute"]["CPU"] in ("measured", "measured (cached)")
    assert data["plan"]["log"], "the solver's log is in the report"
    assert set(data["stage_seconds"]) == {"devices", "trace", "costs", "hosts", "graph", "problem", "solve", "microbatches", "splits", "order", "calls", "codecs", "emit"}
    assert data["simulation"]["predicted_step_time_s"] == pytest.approx(data["plan"]["predicted_step_time_s"]
                                                                        - data["plan"]["call_overhead_s"])


#: Modules that must import in a process without TensorFlow and Keras: everything outside placer/tf,
#: placer/measure and cost_models.profile.
TF_FACING = ("placer.tf", "placer.measure", "cost_models.profile")

CHILD = textwrap.dedent("""
    import importlib, json, pkgutil, sys

    class NoTensorFlow:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("tensorflow", "keras", "tf_keras"):
                raise ImportError(f"{name} is blocked: this process has no TensorFlow")
            return None

    sys.meta_path.insert(0, NoTensorFlow())
    tf_facing = tuple(json.loads(sys.argv[3]))
    import placer, cost_models
    names = json.loads(sys.argv[4])  # every module, listed where TensorFlow imports (walk_packages here
                                     # could not look inside a package whose __init__ imports it)
    imported, refused = [], []
    for name in names:
        if name.startswith(tf_facing):
            try:
                importlib.import_module(name)
            except ImportError:
                refused.append(name)
            continue
        importlib.import_module(name)
        imported.append(name)
    graph, devices = placer.load_graph(sys.argv[1])
    plan = placer.solve(graph, devices, **json.loads(sys.argv[2]))
    assert not any(m.split(".")[0] in ("tensorflow", "keras") for m in sys.modules)
    print("RESULT " + json.dumps({"imported": imported, "refused": refused, "plan": plan.to_dict()}))
""")


def test_tensorflow_free_modules_import_and_solve_without_tensorflow(placed, saved):
    p = placed["throughput"].plan
    opts = {"objective": "throughput", "group_by": p.group_by, **OPTIONS}
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    names = ["placer", "cost_models"] + [m.name for pkg in (placer, __import__("cost_models"))
                                         for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + ".")]
    proc = subprocess.run([sys.executable, "-c", CHILD, str(saved["throughput"]), json.dumps(opts),
                           json.dumps(TF_FACING), json.dumps(names)], capture_output=True, text=True, env=env,
                          timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))[len("RESULT "):])
    expected = {"placer.core.build", "placer.core.plan", "placer.solvers.auto", "placer.solvers.cpsat",
                "placer.planner", "placer.cli", "cost_models.simulate"}
    assert expected <= set(out["imported"])
    # the guard is real: every module that imports TensorFlow failed to import there (placer.measure may
    # hold TensorFlow-free helpers too: the cluster starts workers as processes)
    facing = {m.name for m in pkgutil.walk_packages(placer.__path__, "placer.")
              if m.name.startswith("placer.tf.") and not m.ispkg} | {"cost_models.profile", "placer.measure.links"}
    assert facing <= set(out["refused"])
    # and the TensorFlow-free solve (CP-SAT in-process) gives autoplace's plan
    assert out["plan"]["assignment"] == {str(k): v for k, v in p.assignment.items()}
    assert out["plan"]["value"] == p.value


def test_a_saved_graph_carries_the_options_autoplace_planned_with(model, devices, tmp_path):
    # a split margin this large keeps autoplace on one device; the file says so, and placer.solve follows it
    p = placer.autoplace(model, devices, batch_size=64, split_margin=5.0, **PLACE_OPTIONS)
    assert len(set(p.plan.assignment.values())) == 1 and "split_margin" in " ".join(p.plan.log)
    graph, devset = placer.load_graph(p.save_graph(tmp_path / "ops.json"))
    saved = graph.graph["plan_options"]
    assert (saved["split_margin"], saved["group_by"], saved["seed"]) == (5.0, p.plan.group_by, OPTIONS["seed"])
    again = placer.solve(graph, devset)  # no options: the file's
    assert again.assignment == p.plan.assignment and again.value == p.plan.value
    raw = placer.solve(graph, devset, split_margin=None)  # the solver's own best plan: spread
    assert len(set(raw.assignment.values())) > 1 and raw.value < again.value
