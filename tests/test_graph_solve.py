"""placer.solve on random networkx DAGs: validity, bounds, exactness, errors, determinism, files, CLI."""

import itertools
import json
import time
from dataclasses import replace

import networkx as nx
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import placer
from placer import DeviceSpec
from placer.cli import main as cli_main
from placer.errors import (
    CostError,
    DeviceError,
    GraphError,
    InsufficientMemoryError,
    NoFeasiblePlanError,
    SolverError,
)
from placer.core.build import build_problem
from placer.core.graph_io import as_device_set, devices_from_json, devices_to_json
from placer.core.objectives import OBJECTIVES
from placer.core.problem import PlacementProblem, dependencies
from placer.core.synthetic import training_graph

HEURISTICS = ["single", "round_robin", "contiguous", "partition", "heft", "etf"]


def random_graph(seed, n, *, kinds=("CPU",), coloc=0.0, host_only=0.0, mem=True):
    """A random DAG in the graph-API format (edges go from lower to higher index)."""
    rng = np.random.default_rng(seed)
    g = nx.DiGraph()
    for v in range(n):
        attrs = {"compute_us": ({k: float(rng.uniform(1, 100)) for k in kinds} if len(kinds) > 1
                                else float(rng.uniform(1, 100))),
                 "memory_bytes": int(rng.integers(0, 1000)) if mem else 0}
        if coloc and rng.random() < coloc:
            attrs["colocation"] = f"g{rng.integers(0, 3)}"
        if host_only and rng.random() < host_only:
            attrs["allowed_kinds"] = {"CPU"}
        g.add_node(f"op{v}", **attrs)
    for u in range(n):
        for w in range(u + 1, n):
            if rng.random() < 0.25:
                g.add_edge(f"op{u}", f"op{w}", bytes=float(rng.uniform(0, 5e5)))
    return g


def random_case(seed, n, k, coloc, hetero, tight):
    """A random graph and devices: CPU and GPU kinds (some ops host-only) when ``hetero``, capacities 1.5x an
    even share of the memory when ``tight``."""
    kinds = ("CPU", "GPU") if hetero else ("CPU",)
    g = random_graph(seed, n, kinds=kinds, coloc=coloc, host_only=0.2 if hetero else 0.0)
    total = sum(g.nodes[v]["memory_bytes"] for v in g)
    devices = devices_for(k, kinds, capacity=max(1, int(1.5 * total / k)) if tight else None)
    if hetero and k == 1:
        devices = devices_for(1, ("CPU",))
    return g, devices


def devices_for(k, kinds=("CPU",), capacity=None):
    return [DeviceSpec(f"/{kinds[i % len(kinds)]}:{i}", memory_bytes=capacity) for i in range(k)]


def check_valid(g, devices, p):
    names = {d.name for d in devices}
    assert set(p.assignment) == set(g.nodes), "every node placed exactly once"
    assert set(p.assignment.values()) <= names
    by_group = {}
    for v, d in p.assignment.items():
        key = g.nodes[v].get("colocation")
        if key is not None:
            assert by_group.setdefault(key, d) == d, f"colocation group {key} split"
        allowed = g.nodes[v].get("allowed_kinds")
        if allowed:
            assert placer.core.devices.device_kind(d) in allowed
    for dev in devices:
        used = sum(g.nodes[v].get("memory_bytes", 0) for v, d in p.assignment.items() if d == dev.name)
        if dev.memory_bytes is not None:
            assert used <= dev.memory_bytes, f"{dev.name} over capacity"
    assert p.value >= p.lower_bound - 1e-12
    assert 0.0 <= p.gap <= 1.0


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 30), k=st.integers(1, 4),
       objective=st.sampled_from(sorted(OBJECTIVES)), coloc=st.sampled_from([0.0, 0.3]),
       hetero=st.booleans(), tight=st.booleans())
# a GPU that can run none of the ops: METIS was given a part of target weight 0 and refused it
@example(seed=2, n=2, k=2, objective="latency", coloc=0.0, hetero=True, tight=False)
def test_heuristics_give_valid_plans_or_typed_errors(seed, n, k, objective, coloc, hetero, tight):
    g, devices = random_case(seed, n, k, coloc, hetero, tight)
    for algorithm in HEURISTICS:
        try:
            p = placer.solve(g, devices, objective=objective, algorithm=algorithm, time_limit_s=1)
        except (NoFeasiblePlanError, InsufficientMemoryError):
            assert tight or algorithm == "single", "only memory limits may make a heuristic fail"
            continue
        check_valid(g, devices, p)
        # every plan, whatever the objective, is a schedule: its makespan is bounded below
        assert p.predicted_step_time_s >= OBJECTIVES["latency"].lower_bound(build_problem(g, as_device_set(devices)).problem) - 1e-12


@settings(max_examples=4, deadline=None)
@given(seed=st.integers(0, 10_000), k=st.integers(2, 4), objective=st.sampled_from(sorted(OBJECTIVES)))
def test_auto_is_valid_and_no_worse_than_every_baseline(seed, k, objective):
    g = random_graph(seed, 40, coloc=0.2)
    total = sum(g.nodes[v]["memory_bytes"] for v in g)
    devices = devices_for(k, capacity=int(0.6 * total) + 1000)
    ours = placer.solve(g, devices, objective=objective, time_limit_s=1)
    check_valid(g, devices, ours)
    for b in ["single", "round_robin", "contiguous", "partition", "heft"]:
        try:
            base = placer.solve(g, devices, objective=objective, algorithm=b)
        except NoFeasiblePlanError:
            continue
        assert ours.value <= base.value * (1 + 1e-9), f"{b} beat auto"


@pytest.mark.parametrize("algorithm", ["etf", "heft"])
def test_list_schedulers_reach_the_bound_on_independent_chains_with_free_links(algorithm):
    # 4 chains of 5 ops (10 µs each) on 4 devices with free links: one chain per device, 50 µs
    g = nx.DiGraph()
    for c in range(4):
        nx.add_path(g, [f"c{c}/{i}" for i in range(5)], bytes=1e6)
    nx.set_node_attributes(g, 10.0, "compute_us")
    devices = [DeviceSpec(f"/CPU:{i}", bandwidth_bytes_per_s=1e15, latency_s=0.0) for i in range(4)]
    p = placer.solve(g, devices, objective="latency", algorithm=algorithm)
    assert p.value == pytest.approx(50e-6) and p.lower_bound == pytest.approx(50e-6)
    assert len(set(p.assignment.values())) == 4


def brute_force(g, devices, objective):
    problem = build_problem(g, as_device_set(devices)).problem
    value = OBJECTIVES[objective].value
    return min(value(problem, np.array(a)) for a in itertools.product(range(problem.k), repeat=problem.n))


@pytest.mark.parametrize("objective", ["throughput", "memory"])
@pytest.mark.parametrize("seed,n,k", [(1, 5, 2), (2, 6, 2), (3, 5, 3), (4, 6, 3)])
def test_exact_solver_equals_brute_force(objective, seed, n, k):
    g = random_graph(seed, n, coloc=0.3)
    total = sum(g.nodes[v]["memory_bytes"] for v in g)
    devices = devices_for(k, capacity=int(0.7 * total) + 1)
    best = brute_force(g, devices, objective)
    if not np.isfinite(best):
        with pytest.raises((NoFeasiblePlanError, InsufficientMemoryError)):
            placer.solve(g, devices, objective=objective, algorithm="cpsat", time_limit_s=5)
        return
    p = placer.solve(g, devices, objective=objective, algorithm="cpsat", time_limit_s=5)
    assert p.status == "optimal"
    assert p.value == pytest.approx(best, rel=1e-6, abs=1e-9)
    assert p.lower_bound == pytest.approx(best, rel=1e-4, abs=1e-6)


def test_no_fit_gives_typed_errors():
    g = nx.DiGraph()
    for v in "abc":
        g.add_node(v, compute_us=1.0, memory_bytes=60)
    g.add_edge("a", "b", bytes=1)
    g.add_edge("b", "c", bytes=1)
    # 180 bytes fit 2 x 100 in total, but no device holds two nodes
    with pytest.raises(NoFeasiblePlanError, match="tried"):
        placer.solve(g, devices_for(2, capacity=100), time_limit_s=1)
    with pytest.raises(InsufficientMemoryError, match="180"):
        placer.solve(g, devices_for(2, capacity=80))
    g.nodes["a"]["colocation"] = g.nodes["b"]["colocation"] = "w"
    with pytest.raises(InsufficientMemoryError, match="colocation group 'w'"):
        placer.solve(g, devices_for(3, capacity=100))


def tensor_heavy_graph(seed):
    """A random DAG whose tensors (up to 2 MB) are as large as its nodes' resident bytes (up to 1 MB)."""
    rng = np.random.default_rng(seed)
    g = nx.DiGraph()
    n = int(rng.integers(8, 30))
    for i in range(n):
        g.add_node(f"n{i}", compute_us=float(rng.uniform(10, 1000)),
                   memory_bytes=float(rng.choice([0, rng.uniform(1e5, 1e6)])))
    for i in range(1, n):
        for j in rng.choice(i, size=min(i, int(rng.integers(1, 3))), replace=False):
            g.add_edge(f"n{j}", f"n{i}", bytes=float(rng.uniform(1e4, 2e6)))
    return g, float(rng.uniform(0.55, 0.9))


@pytest.mark.parametrize("seed,way", [(45, "groups charged for the tensors they keep live"),
                                      (63, "lowering resident budgets instead")])
def test_peak_memory_is_fitted_by_re_solving(seed, way):
    # the first plan's simulated peak (resident + live tensors) overflows a device; re-solving with the
    # groups that held the peak charged for it fits (seed 45), or, where charges leave no plan, lowering
    # budgets does (seed 63). HEFT places (its plans do not change when auto gains a heuristic; seeds 42 and
    # 15 under auto stopped reaching these paths when its plans improved)
    g, frac = tensor_heavy_graph(seed)
    one = placer.solve(g, ["/CPU:0"], memory="peak", time_limit_s=0.5)
    cap = int(frac * one.predicted_peak_memory_bytes[0])
    p = placer.solve(g, devices_for(2, capacity=cap), memory="peak", time_limit_s=0.5, algorithm="heft")
    assert max(p.predicted_peak_memory_bytes) <= cap
    assert any("re-solving" in line for line in p.log) and any(way in line for line in p.log)
    with pytest.raises(InsufficientMemoryError, match="over"):
        placer.solve(g, devices_for(2, capacity=int(0.3 * one.predicted_peak_memory_bytes[0])), memory="peak",
                     time_limit_s=0.5, algorithm="heft")


def _small():
    g = nx.DiGraph()
    g.add_node("a", compute_us=5.0)
    g.add_node("b", compute_us=7.0)
    g.add_edge("a", "b", bytes=100)
    return g


@pytest.mark.parametrize("mutate,error,match", [
    (lambda g: g.add_edge("b", "a", bytes=1), GraphError, "cycle"),
    (lambda g: g.nodes["a"].pop("compute_us"), CostError, "node 'a' has no 'compute_us'"),
    (lambda g: g.nodes["b"].update(compute_us=-1.0), CostError, "node 'b' compute_us"),
    (lambda g: g.nodes["b"].update(compute_us=float("nan")), CostError, "node 'b'"),
    (lambda g: g.nodes["a"].update(memory_bytes=-5), CostError, "node 'a' memory_bytes"),
    (lambda g: g.edges["a", "b"].pop("bytes"), CostError, "edge 'a' -> 'b' has no 'bytes'"),
    (lambda g: g.edges["a", "b"].update(bytes=float("inf")), CostError, "edge 'a' -> 'b'"),
    (lambda g: g.nodes["a"].update(compute_us={"GPU": 1.0}), DeviceError, r"node 'a' has no compute_us\['CPU'\]"),
    (lambda g: g.nodes["a"].update(allowed_kinds={"TPU"}), GraphError, "node 'a' may only run on"),
    (lambda g: (g.nodes["a"].update(allowed_kinds={"CPU"}, colocation="x"),
                g.nodes["b"].update(allowed_kinds={"GPU"}, colocation="x")), GraphError, "colocation group 'x'"),
])
def test_bad_graphs_raise_typed_errors_naming_the_culprit(mutate, error, match):
    g = _small()
    mutate(g)
    devices = ["/CPU:0", "/GPU:0"] if "GPU" in match or "colocation" in match else ["/CPU:0", "/CPU:1"]
    with pytest.raises(error, match=match):
        placer.solve(g, devices)


def test_bad_arguments():
    g = _small()
    with pytest.raises(SolverError, match="unknown objective"):
        placer.solve(g, ["/CPU:0"], objective="speed")
    with pytest.raises(SolverError, match="unknown algorithm"):
        placer.solve(g, ["/CPU:0"], algorithm="magic")
    with pytest.raises(SolverError, match="time_limit"):
        placer.solve(g, ["/CPU:0"], time_limit_s=0)
    with pytest.raises(GraphError, match="DiGraph"):
        placer.solve(nx.Graph(), ["/CPU:0"])
    with pytest.raises(DeviceError, match="empty"):
        placer.solve(g, [])


def test_plans_are_made_and_scored_under_the_devices_ready_order():
    # two towers s -> x0 -> x1 -> x2, s -> y0 -> y1 -> y2 (x2, y2 3 ms, the rest 1 ms), free links, and
    # x2 and y2 allowed only on the second device: a device running ready ops depth first ("lifo",
    # TF's one-thread executor) feeds x2 a step earlier than one running them breadth first ("fifo")
    g = nx.DiGraph()
    for v, us in {"s": 0.0, "x0": 1e3, "y0": 1e3, "x1": 1e3, "y1": 1e3}.items():
        g.add_node(v, compute_us={"CPU": us, "GPU": 1e9})
    for v in ("x2", "y2"):
        g.add_node(v, compute_us={"GPU": 3e3}, allowed_kinds={"GPU"})
    g.add_edges_from([("s", "x0"), ("s", "y0"), ("x0", "x1"), ("y0", "y1"), ("x1", "x2"), ("y1", "y2")], bytes=0)
    base = as_device_set(["/CPU:0", "/GPU:0"])
    fifo = placer.solve(g, base, time_limit_s=1)
    lifo = placer.solve(g, replace(base, ready_order="lifo"), time_limit_s=1)
    assert lifo.assignment == fifo.assignment
    assert (fifo.value, lifo.value) == pytest.approx((9.02e-3, 8.02e-3))  # + the default link's 20 µs
    again = devices_from_json(devices_to_json(replace(base, ready_order="lifo")))
    assert again.ready_order == "lifo" and devices_from_json(devices_to_json(base)).ready_order is None
    with pytest.raises(DeviceError, match="ready_order must be 'fifo'.*'lifo'"):
        replace(base, ready_order="random")
    with pytest.raises(DeviceError, match="ready_order"):
        devices_from_json({**devices_to_json(base), "ready_order": "depth"})
    built = build_problem(g, base)
    with pytest.raises(GraphError, match="ready_order"):
        PlacementProblem.build(names=built.problem.names, compute_s=built.problem.compute_s,
                               memory_bytes=built.problem.memory_bytes, capacity_bytes=built.problem.capacity_bytes,
                               tensors=built.problem.tensors, bandwidth=built.problem.bandwidth,
                               latency=built.problem.latency, ready_order="LIFO")
    with pytest.raises(CostError, match="capacity_bytes must be positive"):
        built.problem.with_memory(capacity_bytes=[1.0, 0.0])
    with pytest.raises(CostError, match="memory_bytes must be finite, non-negative, one per node"):
        built.problem.with_memory(memory_bytes=-np.ones(built.problem.n))


def test_heterogeneous_devices_and_host_only_ops():
    g = training_graph(layers=6, ops_per_layer=3, seed=2)
    for v in g:
        us = g.nodes[v]["compute_us"]
        g.nodes[v]["compute_us"] = {"CPU": us, "GPU": us / 20}
    host_only = [v for v in g if v.endswith("/read")][:2]
    for v in host_only:
        g.nodes[v]["allowed_kinds"] = ["CPU"]
    devices = [DeviceSpec("/CPU:0"), DeviceSpec("/GPU:0"), DeviceSpec("/GPU:1")]
    p = placer.solve(g, devices, objective="throughput", time_limit_s=2)
    check_valid(g, devices, p)
    cpu = "/job:localhost/replica:0/task:0/device:CPU:0"
    for v in host_only:  # their whole colocation group follows them to the host
        key = g.nodes[v]["colocation"]
        assert {p.assignment[u] for u in g if g.nodes[u].get("colocation") == key} == {cpu}
    on_gpu = sum(g.nodes[v]["compute_us"]["GPU"] for v in g if p.assignment[v] != cpu)
    assert on_gpu > 0.5 * sum(g.nodes[v]["compute_us"]["GPU"] for v in g), "most work on the fast devices"


def test_same_seed_same_plan_and_coarsening_keeps_plans_valid():
    g = training_graph(layers=40, ops_per_layer=6, seed=3)  # 600 nodes, coarsened below 150
    devices = devices_for(4)
    a = placer.solve(g, devices, objective="throughput", time_limit_s=1.5, seed=7, max_nodes=150)
    b = placer.solve(g, devices, objective="throughput", time_limit_s=1.5, seed=7, max_nodes=150)
    check_valid(g, devices, a)
    assert a.assignment == b.assignment and a.value == b.value
    for base in ["single", "round_robin", "contiguous"]:
        assert a.value <= placer.solve(g, devices, objective="throughput", algorithm=base).value


@pytest.mark.parametrize("objective", ["latency", "throughput"])
def test_plans_do_not_depend_on_the_clock(monkeypatch, objective):
    # auto budgets by estimated work, not by time.perf_counter: a clock that runs 1000x fast
    # (every stage "over budget") must give the same plan as the real one
    g = training_graph(layers=30, ops_per_layer=6, seed=5)
    devices = devices_for(4)
    a = placer.solve(g, devices, objective=objective, time_limit_s=1.0, seed=3, max_nodes=120)
    real = time.perf_counter
    monkeypatch.setattr(time, "perf_counter", lambda: 1000.0 * real())
    b = placer.solve(g, devices, objective=objective, time_limit_s=1.0, seed=3, max_nodes=120)
    assert a.assignment == b.assignment and a.value == b.value and a.solver == b.solver


def test_time_limit_returns_the_incumbent_with_its_gap():
    g = training_graph(layers=60, ops_per_layer=8, seed=4)
    p = placer.solve(g, devices_for(4), objective="latency", time_limit_s=0.05, max_nodes=100)
    assert p.status != "optimal" or p.gap == 0.0
    assert np.isfinite(p.gap) and p.solve_time_s < 30


def test_json_round_trip_and_cli(tmp_path, capsys):
    g = random_graph(5, 12, coloc=0.3, kinds=("CPU", "GPU"), host_only=0.2)
    devices = [DeviceSpec("/CPU:0", memory_bytes=10**6), DeviceSpec("/GPU:0", memory_bytes=10**6, speed=2.0)]
    path = tmp_path / "g.json"
    placer.save_graph(path, g, devices)
    g2, devs2 = placer.load_graph(path)
    assert nx.utils.graphs_equal(nx.DiGraph(g2.edges), nx.DiGraph(g.edges))
    for v in g:
        assert g2.nodes[v]["compute_us"] == g.nodes[v]["compute_us"]
    assert [d.speed for d in devs2.devices] == [1.0, 2.0]
    p1 = placer.solve(g, devices, objective="throughput", time_limit_s=1)
    p2 = placer.solve(g2, devs2, objective="throughput", time_limit_s=1)
    assert p1.assignment == p2.assignment
    out = tmp_path / "placement.json"
    assert cli_main(["plan-graph", str(path), "--objective", "throughput", "--time-limit", "1",
                     "--out", str(out), "-q"]) == 0
    printed = capsys.readouterr().out
    assert "objective throughput" in printed
    doc = json.loads(out.read_text())
    assert doc["assignment"] == {str(k): v for k, v in p1.assignment.items()}
    assert cli_main(["plan-graph", str(path), "--devices", "/CPU:0", "/CPU:1", "--memory-bytes", "10",
                     "-q"]) == 2
    assert "error" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("{}")
    assert cli_main(["plan-graph", str(tmp_path / "bad.json"), "-q"]) == 2


def test_plan_graph_example_runs(tmp_path, capsys):
    import runpy

    mod = runpy.run_path(str(__import__("pathlib").Path(__file__).parents[1] / "examples" / "plan_graph.py"))
    plans = mod["main"](str(tmp_path))
    assert set(plans) == {"latency", "throughput", "memory"}
    assert (tmp_path / "training_graph.json").exists()
    assert "graph file" in capsys.readouterr().out
    for p in plans.values():  # the host-only op stays on the CPU, and the GPUs' 64 MB hold
        assert p.assignment["layer0/read"].endswith("CPU:0")
        assert max(p.device_memory_bytes[1:]) <= 64 << 20


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 6), k=st.integers(1, 3))
def test_latency_bound_never_exceeds_the_best_schedule(seed, n, k):
    # free links: the optimal makespan is the best over all assignments of the simulated
    # (earliest-ready-first) schedules, which upper-bounds the true optimum; the bound must stay below it
    from placer.core.objectives import critical_path_bound, makespan

    g = random_graph(seed, n, mem=False)
    for _, _, d in g.edges(data=True):
        d["bytes"] = 0.0
    problem = build_problem(g, as_device_set(devices_for(k))).problem
    best = min(makespan(problem, np.array(a)) for a in itertools.product(range(k), repeat=problem.n))
    assert critical_path_bound(problem) <= best + 1e-12


def test_op_graph_edges_carry_each_tensor_apart():
    from cost_models import TensorEdge

    g = nx.DiGraph()
    for v in "abc":
        g.add_node(v, compute_us=1.0)
    g.add_edge("a", "b", bytes=12, tensors=("a:0", "a:1"), tensor_bytes=(4, 8))
    g.add_edge("a", "c", bytes=4, tensors=("a:0",), tensor_bytes=(4,))
    sched = build_problem(g, as_device_set(["/CPU:0", "/CPU:1"])).schedule
    # a:0 goes to b and c (sent once per receiving device), a:1 to b only
    assert sorted(sched.tensors, key=lambda t: t.nbytes) == [TensorEdge(0, (1, 2), 4.0), TensorEdge(0, (1,), 8.0)]
    g.edges["a", "b"]["tensor_bytes"] = (4,)
    with pytest.raises(CostError, match="names 2 tensors but gives 1 'tensor_bytes'"):
        build_problem(g, as_device_set(["/CPU:0"]))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 6), k=st.integers(2, 3),
       latency=st.sampled_from([0.0, 1e-4, 1e-2]), bandwidth=st.sampled_from([1e4, 1e6, 1e9]),
       coloc=st.sampled_from([0.0, 0.6]))
def test_latency_bound_with_transfers_never_exceeds_the_best_schedule(seed, n, k, latency, bandwidth, coloc):
    # real links (and colocation groups): the bound counts transfers an op cannot avoid and a group's
    # work, and must stay below every simulated plan
    from placer.core.objectives import critical_path_bound, makespan
    from placer.core.devices import resolve_devices

    g = random_graph(seed, n, mem=False, coloc=coloc)
    devices = resolve_devices([DeviceSpec(f"/CPU:{i}", latency_s=latency, bandwidth_bytes_per_s=bandwidth)
                               for i in range(k)])
    problem = build_problem(g, devices).problem
    best = min(makespan(problem, np.array(a)) for a in itertools.product(range(k), repeat=problem.n))
    assert critical_path_bound(problem) <= best * (1 + 1e-9) + 1e-12


def test_latency_bound_counts_a_transfer_that_cannot_be_avoided():
    # two 1 s branches meeting in c: run apart they pay the 10 s link, together they take 2 s
    from cost_models import TensorEdge
    from placer.core.objectives import critical_path_bound
    from placer.core.problem import PlacementProblem

    p = PlacementProblem.build(names=list("abc"), compute_s=np.array([[1.0, 1.0], [1.0, 1.0], [0.0, 0.0]]),
                               memory_bytes=np.zeros(3), capacity_bytes=np.full(2, np.inf),
                               tensors=[TensorEdge(0, (2,), 10.0), TensorEdge(1, (2,), 10.0)],
                               bandwidth=np.ones((2, 2)), latency=np.zeros((2, 2)))
    assert critical_path_bound(p) == 2.0  # free links would give 1 s


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), m=st.integers(2, 9), n=st.integers(1, 4), k=st.integers(1, 3),
       latency=st.sampled_from([0.0, 0.3]), shared=st.sampled_from([None, 1.0, 1.5]))
def test_latency_bound_of_grouped_ops_never_exceeds_the_best_schedule(seed, m, n, k, latency, shared):
    """Problem nodes of several ops each (as a layer's forward and gradient ops), real links, devices
    that may share a processor: the bound (a node's ops serialised between their heads and tails among
    it) stays below every simulated plan."""
    from cost_models import TensorEdge
    from placer.core.objectives import critical_path_bound, makespan
    from placer.core.problem import PlacementProblem, Schedule

    rng = np.random.default_rng(seed)
    group = np.unique(rng.integers(0, n, m), return_inverse=True)[1]  # nodes numbered 0..n-1, none empty
    n = int(group.max()) + 1
    tensors = [TensorEdge(u, tuple(sorted(w for w in range(u + 1, m) if rng.random() < 0.4)), float(rng.uniform(0, 2)))
               for u in range(m)]
    tensors = [t for t in tensors if t.dsts]
    durations = rng.uniform(0.1, 1.0, (m, 1)) * np.ones((1, k))
    compute = np.zeros((n, k))
    np.add.at(compute, group, durations)
    p = PlacementProblem.build(names=[f"g{i}" for i in range(n)], compute_s=compute, memory_bytes=np.zeros(n),
                               capacity_bytes=np.full(k, np.inf), tensors=[], bandwidth=np.ones((k, k)),
                               latency=np.full((k, k), latency),
                               schedule=Schedule(durations, tuple(tensors), (), group),
                               shared=[(tuple(range(k)), 1.5, shared)] if shared and k > 1 else ())
    best = min(makespan(p, np.array(a)) for a in itertools.product(range(k), repeat=n))
    assert critical_path_bound(p) <= best * (1 + 1e-9) + 1e-12


def _grouped_problem(seed: int, m: int, n: int, k: int, latency: float, whole: bool = False):
    """``m`` ops in up to ``n`` problem nodes, random tensors (0-2 bytes) over links of 1 byte/s."""
    from cost_models import TensorEdge
    from placer.core.problem import PlacementProblem, Schedule

    rng = np.random.default_rng(seed)
    group = np.unique(rng.integers(0, n, m), return_inverse=True)[1]  # nodes numbered 0..n-1, none empty
    n = int(group.max()) + 1
    size = (lambda: float(rng.integers(0, 3))) if whole else (lambda: float(rng.uniform(0, 2)))
    tensors = [TensorEdge(u, tuple(sorted(w for w in range(u + 1, m) if rng.random() < 0.4)), size())
               for u in range(m)]
    durations = (rng.integers(1, 4, (m, 1)) if whole else rng.uniform(0.1, 1.0, (m, 1))) * np.ones((1, k))
    compute = np.zeros((n, k))
    np.add.at(compute, group, durations)
    return PlacementProblem.build(names=[f"g{i}" for i in range(n)], compute_s=compute, memory_bytes=np.zeros(n),
                                  capacity_bytes=np.full(k, np.inf), tensors=[], bandwidth=np.ones((k, k)),
                                  latency=np.full((k, k), latency),
                                  schedule=Schedule(durations, tuple(t for t in tensors if t.dsts), (), group))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), m=st.integers(2, 9), n=st.integers(1, 4), k=st.integers(2, 3),
       latency=st.sampled_from([0.0, 0.3]), whole=st.booleans())
def test_path_runs_bound_never_exceeds_the_best_schedule(seed, m, n, k, latency, whole):
    """The bound from splitting the heaviest path into runs on devices (each run's nodes' work after the
    run's start and in all, two heavy nodes one device cannot hold kept in different runs, the path's
    transfers between runs) stays below every simulated plan; the split it returns cuts the path into
    consecutive runs, the next run's first op in a node the run before does not hold."""
    from placer.core.objectives import _heads_tails, _heaviest_path, _path_runs, makespan

    p = _grouped_problem(seed, m, n, k, latency, whole)
    head, tail, best = map(np.array, _heads_tails(p))
    fastest = min(makespan(p, np.array(a)) for a in itertools.product(range(k), repeat=p.n))
    bound, split = _path_runs(p, head, tail, best, 0.0)
    assert bound <= fastest * (1 + 1e-9) + 1e-12
    sched = p.schedule_view()
    preds, succs = dependencies(sched.m, sched.tensors, sched.control)
    path = _heaviest_path(preds, succs, (head + best + tail).tolist(), head.tolist())
    if split:
        assert [v for run in split for v in run] == path
        for run, nxt in zip(split, split[1:]):
            assert sched.group[nxt[0]] not in set(sched.group[list(run)].tolist())


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), m=st.integers(2, 12), n=st.integers(1, 5), k=st.integers(2, 4),
       latency=st.sampled_from([0.0, 0.3]), whole=st.booleans(), tight=st.booleans())
def test_path_runs_keeps_every_constraint_and_is_deterministic(seed, m, n, k, latency, whole, tight):
    """The latency bound's split of the heaviest path as a plan (grouped ops, where the bound splits about
    half of these paths): a run's new nodes on one device, other than the previous run's, memory kept (``tight``: devices that hold
    60% of it each), at least the bound, the same plan twice; refused, saying why, exactly where the bound
    kept the path in one run."""
    from placer.core.objectives import critical_path_split
    from placer.core.problem import evaluate
    from placer.solvers import SolveOptions, solve_problem
    from placer.solvers.runs import runs_plan

    p = _grouped_problem(seed, m, n, k, latency, whole)
    if tight:
        memory = np.random.default_rng(seed).integers(1, 10, p.n).astype(float)
        p = p.with_memory(memory_bytes=memory, capacity_bytes=np.full(k, 0.6 * memory.sum()))
    split = critical_path_split(p)
    options = SolveOptions(objective="latency")
    if len(split) < 2:
        with pytest.raises(SolverError, match="path_runs cannot place this problem: the latency bound"):
            solve_problem(p, "path_runs", options)
        return
    a = runs_plan(p, split)
    group = p.schedule_view().group
    assert a.shape == (p.n,) and ((0 <= a) & (a < k)).all()
    seen: set[int] = set()
    prev = -1  # the previous run's device, where its nodes were all new
    for run in split:
        nodes = set(group[list(run)].tolist())
        new = nodes - seen
        assert len({int(a[v]) for v in new}) <= 1  # a run's new nodes share a device ...
        if new == nodes:  # ... other than the previous run's (a node seen before keeps its device)
            assert int(a[next(iter(new))]) != prev
        prev = int(a[next(iter(new))]) if new == nodes else -1
        seen |= nodes
    try:
        s = solve_problem(p, "path_runs", options)
    except NoFeasiblePlanError:
        assert not evaluate(p, a).feasible
        return
    assert np.array_equal(s.assignment, a) and evaluate(p, a).feasible
    assert s.objective >= s.lower_bound * (1 - 1e-9)
    assert np.array_equal(solve_problem(p, "path_runs", options).assignment, a)


def test_heaviest_path_follows_a_chain_past_its_shortcut():
    """a -> b -> c -> d with a shortcut a -> d (a concatenation reading an early layer): every op ties on
    the critical path's length, and the path goes through the chain, not over the shortcut."""
    from cost_models import TensorEdge
    from placer.core.objectives import _heads_tails, _heaviest_path
    from placer.core.problem import PlacementProblem

    p = PlacementProblem.build(names=list("abcd"), compute_s=np.ones((4, 2)), memory_bytes=np.zeros(4),
                               capacity_bytes=np.full(2, np.inf),
                               tensors=[TensorEdge(0, (1, 3), 1.0), TensorEdge(1, (2,), 1.0), TensorEdge(2, (3,), 1.0)],
                               bandwidth=np.full((2, 2), 1e9), latency=np.zeros((2, 2)))
    head, tail, best = _heads_tails(p)
    total = [h + b + t for h, b, t in zip(head, best, tail)]
    assert total == [4.0] * 4
    preds, succs = dependencies(4, p.tensors)
    assert _heaviest_path(preds, succs, total, head) == [0, 1, 2, 3]


def test_path_runs_bound_counts_ops_that_descend_from_nothing():
    """Node A = {s} (1 s) sends 10 bytes (10 s) to c (1 s) of node B, whose other op r (2 s) reads nothing
    (as a variable's read): one device takes 4 s, which is the best plan; without counting r in the run
    that holds c the bound would stop at B's own 3 s."""
    from cost_models import TensorEdge
    from placer.core.objectives import critical_path_bound, makespan
    from placer.core.problem import PlacementProblem, Schedule

    sched = Schedule(np.array([[1.0] * 2, [1.0] * 2, [2.0] * 2]), (TensorEdge(0, (1,), 10.0),), (),
                     np.array([0, 1, 1]))
    p = PlacementProblem.build(names=["A", "B"], compute_s=np.array([[1.0] * 2, [3.0] * 2]), memory_bytes=np.zeros(2),
                               capacity_bytes=np.full(2, np.inf), tensors=[], bandwidth=np.ones((2, 2)),
                               latency=np.zeros((2, 2)), schedule=sched)
    fastest = min(makespan(p, np.array(a)) for a in itertools.product(range(2), repeat=2))
    assert fastest == 4.0 and critical_path_bound(p) == pytest.approx(4.0)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), m=st.integers(2, 8), n=st.integers(1, 4), k=st.integers(2, 3),
       latency=st.sampled_from([0.0, 0.3]), whole=st.booleans(), slack=st.sampled_from([1.0, 1.05, 2.0]))
def test_forced_merge_bound_never_exceeds_the_best_schedule(seed, m, n, k, latency, whole, slack):
    """Given any plan's step as the incumbent (the best, or 5% or 100% above it), the bound from merging
    the pairs that no better plan puts apart (and from pairs either apart or together) stays at most the
    best plan, in the executor's order or by
    priority (every assignment tried), and at least the critical path bound."""
    from placer.core.objectives import critical_path_bound, makespan, simulate_step, step_priority
    from placer.solvers.forced import apart_bounds, either_bound, forced_merge_bound

    p = _grouped_problem(seed, m, n, k, latency, whole)
    priority = step_priority(p)
    fastest = min(min(makespan(p, np.array(a)), simulate_step(p, np.array(a), priority=priority).step_time_s)
                  for a in itertools.product(range(k), repeat=p.n))
    bound, _ = forced_merge_bound(p, fastest * slack)
    assert bound <= fastest * (1 + 1e-9) + 1e-12
    assert either_bound(p, apart_bounds(p), 0.0) <= fastest * (1 + 1e-9) + 1e-12  # no incumbent needed
    assert bound >= min(critical_path_bound(p), fastest * slack) * (1 - 1e-9)


def test_path_runs_bound_sees_work_that_the_critical_path_does_not(monkeypatch):
    """Ops a, c, d of one node and b of another (3, 3, 2, 3 s): a feeds b and c, b sends d 2 bytes. The
    critical path a -> b -> d and the node's own bound see 9 s; every split of the path into runs needs 11
    (one device runs all four in 11 s; b on another device delays d by its 2 s transfer: 3 + 3 + 2 + 3),
    which the best plan takes."""
    import placer.core.objectives as objectives

    p = _grouped_problem(234, 4, 2, 2, 0.0, whole=True)
    fastest = min(objectives.makespan(p, np.array(a)) for a in itertools.product(range(2), repeat=p.n))
    assert fastest == 11.0 and objectives.critical_path_bound(p) == pytest.approx(11.0)
    monkeypatch.setattr(objectives, "RUNS_MAX_PATH", 0)  # the bound without the runs
    assert objectives.critical_path_bound(_grouped_problem(234, 4, 2, 2, 0.0, whole=True)) == pytest.approx(9.0)


def test_layer_dp_splits_a_training_step_between_layers():
    """A training step whose gradient ops share their layer (as Keras' do): the layer-order DP cuts it
    between layers, each layer with its gradients and update, and moves far fewer bytes than a contiguous
    split of a topological order (which puts the whole forward pass before every gradient); ``auto`` runs
    it and is no worse."""
    from placer.core.attrs import LAYER

    g = training_graph(layers=8, ops_per_layer=2, seed=1, skip_prob=0.0)
    for v in g:
        g.nodes[v][LAYER] = g.nodes[v][LAYER].removeprefix("gradients/")
    group: dict = {}
    for v in g:
        key = g.nodes[v].get("colocation", v)
        group[key] = group.get(key, 0.0) + g.nodes[v].get("memory_bytes", 0.0)
    cap = int(max(1.25 * sum(group.values()) / 4, 1.05 * max(group.values()))) + 1
    devices = [DeviceSpec(f"/CPU:{i}", memory_bytes=cap) for i in range(4)]
    by_layers = placer.solve(g, devices, objective="memory", algorithm="layer_dp", baselines=())
    by_order = placer.solve(g, devices, objective="memory", algorithm="contiguous_dp", baselines=())
    assert by_layers.value < 0.5 * by_order.value
    layer_device: dict = {}
    for v, d in by_layers.assignment.items():
        assert layer_device.setdefault(g.nodes[v][LAYER], d) == d  # a layer, its gradients, its update together
    best = placer.solve(g, devices, objective="memory", baselines=(), time_limit_s=1)
    assert any(line.startswith("layer_dp: ") and "skipped" not in line for line in best.log), best.log
    assert best.value <= by_layers.value


def _ordering_graph():
    """A GPU op ``p`` feeds a CPU chain ``c1 -> c2 -> c3 -> q`` (``q`` on the GPU) and two CPU ops ``x1``,
    ``x2`` (1.5 s each) that become ready with ``c1``, lower in the node order: TensorFlow's executor (and
    the simulator) runs them first and the chain 3 s late; every placement is forced by the kinds."""
    g = nx.DiGraph()
    for name, us, kind in [("p", 1e6, "GPU"), ("x1", 1.5e6, "CPU"), ("x2", 1.5e6, "CPU"), ("c1", 1e6, "CPU"),
                           ("c2", 1e6, "CPU"), ("c3", 1e6, "CPU"), ("q", 1e6, "GPU")]:
        g.add_node(name, compute_us={"CPU": us, "GPU": us}, allowed_kinds={kind}, memory_bytes=0)
    for u, v in [("p", "x1"), ("p", "x2"), ("p", "c1"), ("c1", "c2"), ("c2", "c3"), ("c3", "q")]:
        g.add_edge(u, v, bytes=8.0)
    return g


def test_a_planned_order_runs_the_critical_path_first_and_is_kept_when_re_applied():
    from placer.planner import PlanOptions, plan_problem

    g, devices = _ordering_graph(), [DeviceSpec("/CPU:0"), DeviceSpec("/GPU:0")]
    ordered = placer.solve(g, devices, time_limit_s=1)
    executor = placer.solve(g, devices, time_limit_s=1, execution_order="executor")
    log = "\n".join(executor.log)
    assert executor.op_order == {}
    assert "cp_heft: skipped (execution_order is not 'auto'" in log and "cp_etf: skipped (execution_order is not" in log
    assert executor.value == pytest.approx(8.0, abs=1e-3)  # x1, x2, then the chain: 1 + 3 + 3 + 1 s
    assert ordered.value == pytest.approx(7.0, abs=1e-3) and ordered.solver in ("auto/cp_heft", "auto/cp_etf")
    cpu, gpu = sorted(ordered.devices)
    assert ordered.op_order == {cpu: ("c1", "c2", "c3", "x1", "x2"), gpu: ("p", "q")}
    assert ordered.predicted_step_time_s == ordered.value
    assert "planned order" in ordered.summary()
    again = placer.Plan.from_dict(json.loads(ordered.to_json()))
    assert again == ordered
    built = build_problem(g, as_device_set(devices))
    reapplied = plan_problem(built, PlanOptions(), given=again.assignment, given_order=again.op_order)
    assert reapplied.value == ordered.value and reapplied.op_order == ordered.op_order
    plain = plan_problem(built, PlanOptions(), given=again.assignment)
    assert plain.value == pytest.approx(8.0, abs=1e-3) and plain.op_order == {}
    with pytest.raises(placer.errors.PlanError, match="op order puts op"):
        plan_problem(built, PlanOptions(), given=again.assignment, given_order={cpu: ("c1", "p"), gpu: ("q",)})
    with pytest.raises(placer.errors.PlanError, match="lacks"):
        plan_problem(built, PlanOptions(), given=again.assignment, given_order={cpu: ("c1", "nope")})
    with pytest.raises(placer.errors.PlanError, match="pass the devices the plan was made for"):
        plan_problem(built, PlanOptions(), given=again.assignment, given_order={"/GPU:7": ("p", "q")})
    with pytest.raises(placer.errors.PlanError, match="which its device list"):
        placer.Plan.from_dict({**json.loads(ordered.to_json()), "op_order": {"/GPU:7": ["p", "q"]}})
    with pytest.raises(SolverError, match="execution_order"):
        placer.solve(g, devices, execution_order="fastest")


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 30), k=st.integers(1, 4), coloc=st.sampled_from([0.0, 0.3]),
       hetero=st.booleans(), tight=st.booleans(), algorithm=st.sampled_from(["cp_heft", "cp_etf"]))
def test_ordered_plans_order_every_op_once_on_its_device_and_the_step_follows_the_order(seed, n, k, coloc, hetero,
                                                                                       tight, algorithm):
    from placer.core.objectives import simulate_step

    g, devices = random_case(seed, n, k, coloc, hetero, tight)
    try:
        p = placer.solve(g, devices, algorithm=algorithm, baselines=())
    except (NoFeasiblePlanError, InsufficientMemoryError):
        assert tight, "only memory limits may make it fail"
        return
    check_valid(g, devices, p)
    from placer.core.order import MIN_ORDERED_OP_S

    assert all(p.assignment[v] == d for d, ops in p.op_order.items() for v in ops), "on its own device"
    built = build_problem(g, as_device_set(devices))
    a = built.group_assignment(p.assignment)
    order = built.order_of(p.op_order, a)  # each op at most once (checked)
    seconds = built.schedule.durations_s[np.arange(len(built.nodes)), a[built.schedule.group]]
    timed = [[v for v in range(len(built.nodes)) if a[built.schedule.group[v]] == d and seconds[v] >= MIN_ORDERED_OP_S]
             for d in range(len(devices))]
    assert ([sorted(ops) for ops in order] or [[] for _ in devices]) == [sorted(ops) if len(ops) > 1 else []
                                                                          for ops in timed], \
        "exactly the ops long enough to order, on devices with two or more"
    step = simulate_step(built.problem, a, order=order)
    assert step.step_time_s == p.value
    ran: dict[int, list[int]] = {}
    for v, d, _, _ in step.timeline:  # in start order
        if any(v in ops for ops in order):
            ran.setdefault(d, []).append(v)
    assert all(tuple(ran.get(d, ())) == ops for d, ops in enumerate(order)), "each device runs its planned order"
    q = placer.solve(g, devices, algorithm=algorithm, baselines=())
    assert (q.assignment, q.op_order, q.value) == (p.assignment, p.op_order, p.value), "deterministic"
    assert placer.solve(g, devices, algorithm=algorithm, objective="throughput", baselines=()).op_order == {}
