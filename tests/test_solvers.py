"""Solvers on random DAGs: validity, bounds, brute-force optimality, errors."""

import itertools
import os
import subprocess
import sys

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cost_models import TensorEdge
from placer.errors import CostError, GraphError, NoFeasiblePlanError, SolverError
from placer.core.problem import PlacementProblem, dependencies, evaluate
from placer.solvers import SolveOptions, available_solvers, solve_problem

#: These tests check the max-load model (the throughput objective) exactly.
THROUGHPUT = SolveOptions(objective="throughput")
from placer.solvers.mincut import min_cut_assignment

FAST = ["single", "round_robin", "contiguous"]


def random_problem(seed, n, k, *, comm=1.0, capacity=np.inf, hetero=False, forbid=0.0, back=0.0):
    """A random DAG of ``n`` nodes on ``k`` devices; ``back`` > 0 adds tensors from a node to earlier
    ones with that probability per node (cycles, as colocation groups of a training graph have)."""
    rng = np.random.default_rng(seed)
    g = nx.gnp_random_graph(n, 0.3, seed=int(seed), directed=True)
    tensors = []
    for u in range(n):
        dsts = tuple(sorted(v for v in g.successors(u) if v > u))
        if dsts:
            tensors.append(TensorEdge(u, dsts, float(rng.uniform(0, 2e3 * comm))))
        if back and u and rng.random() < back:
            tensors.append(TensorEdge(u, (int(rng.integers(0, u)),), float(rng.uniform(0, 2e3 * comm))))
    compute = rng.uniform(0.1, 1.0, size=(n, 1)) * (rng.uniform(0.5, 2.0, size=(1, k)) if hetero else np.ones((1, k)))
    if forbid:
        mask = rng.random((n, k)) < forbid
        mask[np.arange(n), rng.integers(0, k, n)] = False  # every node keeps one device
        compute = np.where(mask, np.inf, compute)
    memory = rng.integers(0, 100, n).astype(float)
    return PlacementProblem.build(names=[f"n{i}" for i in range(n)], compute_s=compute, memory_bytes=memory,
                                  capacity_bytes=np.full(k, capacity), tensors=tensors,
                                  bandwidth=np.full((k, k), 1e3), latency=np.full((k, k), 1e-3))


def brute_force(problem, objective):
    best = None
    for a in itertools.product(range(problem.k), repeat=problem.n):
        ev = evaluate(problem, np.array(a))
        if not ev.feasible:
            continue
        val = objective(ev)
        if best is None or val < best:
            best = val
    return best


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 25), k=st.integers(1, 5), forbid=st.sampled_from([0.0, 0.3]))
def test_heuristics_place_every_node_validly(seed, n, k, forbid):
    p = random_problem(seed, n, k, forbid=forbid)
    for name in FAST:
        if name == "single" and not np.isfinite(p.compute_s).all(axis=0).any():
            with pytest.raises(NoFeasiblePlanError, match="single"):
                solve_problem(p, name, THROUGHPUT)
            continue
        s = solve_problem(p, name, THROUGHPUT)
        assert s.assignment.shape == (n,)
        assert ((0 <= s.assignment) & (s.assignment < k)).all()
        assert np.isfinite(p.compute_s[np.arange(n), s.assignment]).all(), "allowed kinds honoured"
        assert s.objective >= s.lower_bound - 1e-12
        assert s.objective == pytest.approx(evaluate(p, s.assignment).objective)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 8), forbid=st.sampled_from([0.0, 0.3]))
def test_mincut_equals_brute_force_total_time(seed, n, forbid):
    p = random_problem(seed, n, 2, hetero=True, forbid=forbid, comm=5.0)
    a = min_cut_assignment(p)
    total = evaluate(p, a).load_s.sum()
    assert total == pytest.approx(brute_force(p, lambda ev: ev.load_s.sum()), rel=1e-9)


@pytest.mark.parametrize("seed,n,k", [(1, 5, 2), (2, 6, 2), (3, 5, 3), (4, 4, 3), (5, 6, 2)])
def test_cpsat_equals_brute_force_max_load(seed, n, k):
    p = random_problem(seed, n, k, comm=50.0, hetero=seed % 2 == 0)
    s = solve_problem(p, "cpsat", SolveOptions(time_limit_s=5, objective="throughput"))
    assert s.status == "optimal"
    best = brute_force(p, lambda ev: ev.objective)
    assert s.objective == pytest.approx(best, rel=1e-4)
    assert s.lower_bound <= best + 1e-12


def test_auto_is_no_worse_than_any_baseline_and_deterministic():
    p = random_problem(7, 30, 4, comm=3.0)
    a1 = solve_problem(p, "auto", SolveOptions(time_limit_s=2, seed=3, objective="throughput"))
    a2 = solve_problem(p, "auto", SolveOptions(time_limit_s=2, seed=3, objective="throughput"))
    assert np.array_equal(a1.assignment, a2.assignment)
    for name in FAST:
        assert a1.objective <= solve_problem(p, name, THROUGHPUT).objective + 1e-12
    assert 0 <= a1.gap < 1


def test_capacity_is_respected_and_infeasible_raises():
    p = random_problem(11, 12, 3, capacity=300.0)
    s = solve_problem(p, "auto", SolveOptions(time_limit_s=2, objective="throughput"))
    mem = np.bincount(s.assignment, weights=p.memory_bytes, minlength=3)
    assert (mem <= 300.0).all()
    tight = random_problem(11, 12, 3, capacity=1.0)
    assert tight.memory_bytes.sum() > 3.0
    with pytest.raises(NoFeasiblePlanError, match="tried: single"):
        solve_problem(tight, "auto", SolveOptions(time_limit_s=1, objective="throughput"))


def test_cpsat_outcomes_are_typed():
    from placer.solvers.cpsat import CpSatStatus, solve_cpsat

    ok = solve_cpsat(random_problem(3, 6, 2), THROUGHPUT)
    assert ok.status in (CpSatStatus.OPTIMAL, CpSatStatus.FEASIBLE) and ok.solution is not None
    # the nodes need more memory than the two devices hold: CP-SAT proves there is no plan
    none = solve_cpsat(random_problem(3, 6, 2, capacity=1.0), THROUGHPUT)
    assert none.status is CpSatStatus.INFEASIBLE and none.solution is None
    with pytest.raises(NoFeasiblePlanError, match=r"tried: cpsat"):
        solve_problem(random_problem(3, 6, 2, capacity=1.0), "cpsat", THROUGHPUT)


def test_auto_logs_each_attempt_and_skips_solvers_by_their_preconditions():
    s = solve_problem(random_problem(5, 10, 3), "auto", SolveOptions(time_limit_s=1, objective="throughput"))
    assert s.log[0].startswith("single: ")
    assert "mincut: skipped (it places on exactly 2 devices, not 3)" in s.log
    assert any(line.startswith("cpsat: ") for line in s.log) or any("lower bound" in line for line in s.log)


def test_bad_solver_requests():
    p = random_problem(0, 4, 3)
    with pytest.raises(SolverError, match="unknown algorithm"):
        solve_problem(p, "simulated-annealing")
    with pytest.raises(SolverError, match="exactly 2 devices"):
        solve_problem(p, "mincut")
    assert "cpsat" in available_solvers() and "auto" in available_solvers()


@pytest.mark.parametrize("compute,match", [([[-1.0]], "invalid compute"), ([[float("nan")]], "invalid compute"),
                                           ([[float("inf")]], "allowed on no device")])
def test_invalid_costs_are_rejected(compute, match):
    with pytest.raises((CostError, GraphError), match=match):
        PlacementProblem.build(names=["a"], compute_s=np.array(compute), memory_bytes=np.zeros(1),
                               capacity_bytes=np.full(1, np.inf), tensors=[], bandwidth=np.ones((1, 1)),
                               latency=np.zeros((1, 1)))


def test_negative_tensor_size_rejected():
    with pytest.raises(CostError, match="invalid size"):
        PlacementProblem.build(names=["a", "b"], compute_s=np.ones((2, 1)), memory_bytes=np.zeros(2),
                               capacity_bytes=np.full(1, np.inf), tensors=[TensorEdge(0, (1,), -5.0)],
                               bandwidth=np.ones((1, 1)), latency=np.zeros((1, 1)))


#: The DP's objectives: what each minimises, from an evaluation.
DP_OBJECTIVES = {"throughput": lambda ev: ev.objective, "memory": lambda ev: float(ev.traffic_bytes.sum())}


def _contiguous_brute_force(problem, order=None, objective="throughput", cuts=None):
    """The least max load (or traffic) over every split of ``order`` (``problem.order``) into stages on
    devices 0..k-1 (some empty), cut at any of ``cuts`` (default every position)."""
    order, n, k = list(problem.order if order is None else order), problem.n, problem.k
    best = np.inf
    for chosen in itertools.combinations_with_replacement(range(n + 1) if cuts is None else cuts, k - 1):
        bounds = (0, *chosen, n)
        a = np.zeros(n, dtype=int)
        for m in range(k):
            a[order[bounds[m]:bounds[m + 1]]] = m
        ev = evaluate(problem, a)
        if ev.feasible:
            best = min(best, DP_OBJECTIVES[objective](ev))
    return best


def _monotone_brute_force(problem, edges=None, objective="throughput"):
    """The least max load (or traffic) over every contiguous split: assignments with ``a[u] <= a[v]`` on
    every dependency (on every one of ``edges`` where given)."""
    if edges is None:
        edges = [(t.src, d) for t in problem.tensors for d in t.dsts if d != t.src]
    best = np.inf
    for a in itertools.product(range(problem.k), repeat=problem.n):
        if all(a[u] <= a[v] for u, v in edges):
            ev = evaluate(problem, np.array(a))
            if ev.feasible:
                best = min(best, DP_OBJECTIVES[objective](ev))
    return best


def _check_dp(p, best, stages_follow_order, order=None, objective="throughput"):
    from placer.solvers.pipeline_stages import contiguous_dp, split_edges

    options = SolveOptions(objective=objective)
    sol = contiguous_dp(p, options)
    if not np.isfinite(best):
        assert sol is None
        return
    assert sol is not None and sol.assignment.shape == (p.n,)
    assert evaluate(p, sol.assignment).feasible  # capacity and allowed devices kept
    assert sol.objective == pytest.approx(best, rel=1e-9, abs=1e-12)
    assert sol.lower_bound <= sol.objective + 1e-12
    for u, v in split_edges(p):  # stages are contiguous: dependencies go to the same or a later device
        assert sol.assignment[u] <= sol.assignment[v]
    if stages_follow_order:
        pos = {v: i for i, v in enumerate(p.order if order is None else order)}
        stages = [pos[v] for v in sorted(range(p.n), key=lambda v: (sol.assignment[v], pos[v]))]
        assert stages == sorted(stages), "device m's stage comes before device m+1's in the order"
    again = contiguous_dp(p, options)
    assert np.array_equal(again.assignment, sol.assignment)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 9), k=st.integers(1, 4), levels=st.integers(1, 6),
       max_chunks=st.integers(1, 10), capacity=st.sampled_from([np.inf, 400.0, 150.0]),
       forbid=st.sampled_from([0.0, 0.3]), back=st.sampled_from([0.0, 0.5]),
       objective=st.sampled_from(sorted(DP_OBJECTIVES)))
def test_layer_dp_is_the_best_split_of_its_chunks(seed, n, k, levels, max_chunks, capacity, forbid, back, objective):
    """``layer_dp`` = the best split of the order by position at chunk boundaries (brute force); chunks keep
    equal positions together, follow the order and number at most ``max_chunks + 1``; every node placed once,
    capacity and allowed devices kept, the same plan twice."""
    import placer.solvers.pipeline_stages as stages

    p = random_problem(seed, n, k, capacity=capacity, forbid=forbid, back=back)
    positions = np.random.default_rng(seed).integers(0, levels, n).astype(float)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(stages, "MAX_CHUNKS", max_chunks)
        chunk = stages.layer_chunks(positions, max_chunks)
        order = np.lexsort((np.arange(n), positions))
        assert (np.diff(chunk[order]) >= 0).all() and chunk.max() + 1 <= max_chunks + 1
        for level in set(positions.tolist()):
            assert len(set(chunk[positions == level].tolist())) == 1
        cuts = [0] + [i for i in range(1, n) if chunk[order[i]] != chunk[order[i - 1]]] + [n]
        best = _contiguous_brute_force(p, order, objective, cuts)
        options = SolveOptions(objective=objective, layer_positions=tuple(positions.tolist()))
        sol = stages.layer_dp(p, options)
        if not np.isfinite(best):
            assert sol is None
            return
        assert sol is not None and sol.assignment.shape == (n,) and evaluate(p, sol.assignment).feasible
        assert sol.objective == pytest.approx(best, rel=1e-9, abs=1e-12)
        assert (np.diff(sol.assignment[order]) >= 0).all()  # device m's stage comes before device m+1's
        assert np.array_equal(stages.layer_dp(p, options).assignment, sol.assignment)


def test_layer_dp_declines_without_positions_and_refuses_the_wrong_count():
    from placer.solvers.pipeline_stages import layer_dp

    p = random_problem(3, 6, 2)
    assert layer_dp(p, SolveOptions(objective="memory")) is None
    with pytest.raises(SolverError, match="layer_positions has 5 entries for 6 nodes"):
        layer_dp(p, SolveOptions(objective="memory", layer_positions=(0.0,) * 5))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 7), k=st.integers(1, 4),
       capacity=st.sampled_from([np.inf, 400.0, 150.0]), forbid=st.sampled_from([0.0, 0.3]),
       objective=st.sampled_from(sorted(DP_OBJECTIVES)))
def test_contiguous_dp_over_ideals_is_the_best_contiguous_split(seed, n, k, capacity, forbid, objective):
    p = random_problem(seed, n, k, capacity=capacity, forbid=forbid)  # uniform links: the DP's costs are exact
    _check_dp(p, _monotone_brute_force(p, objective=objective), stages_follow_order=False, objective=objective)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 9), k=st.integers(1, 4),
       capacity=st.sampled_from([np.inf, 400.0, 150.0]), forbid=st.sampled_from([0.0, 0.3]),
       objective=st.sampled_from(sorted(DP_OBJECTIVES)))
def test_contiguous_dp_over_one_order_is_its_best_split(seed, n, k, capacity, forbid, objective):
    import placer.solvers.pipeline_stages as stages

    p = random_problem(seed, n, k, capacity=capacity, forbid=forbid)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(stages, "MAX_IDEAL_WORK", 0.0)  # too many ideals: the DP falls back to one order
        _check_dp(p, _contiguous_brute_force(p, objective=objective), stages_follow_order=True,
                  objective=objective)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(2, 7), k=st.integers(1, 3),
       capacity=st.sampled_from([np.inf, 400.0, 150.0]), one_order=st.booleans(),
       objective=st.sampled_from(sorted(DP_OBJECTIVES)))
def test_contiguous_dp_where_groups_form_cycles(seed, n, k, capacity, one_order, objective):
    """Cycles between nodes: the DP is the best split contiguous along :func:`split_edges` (every
    tensor still charged), over its ideals or over one topological order of it."""
    import placer.solvers.pipeline_stages as stages

    p = random_problem(seed, n, k, capacity=capacity, back=0.5)
    edges = stages.split_edges(p)
    assert nx.is_directed_acyclic_graph(nx.DiGraph(edges))
    with pytest.MonkeyPatch.context() as mp:
        if not one_order:
            _check_dp(p, _monotone_brute_force(p, edges, objective), stages_follow_order=False, objective=objective)
            return
        mp.setattr(stages, "MAX_IDEAL_WORK", 0.0)
        order = stages._split_order(p, edges)  # problem.order is not topological once edges go back
        _check_dp(p, _contiguous_brute_force(p, order, objective), stages_follow_order=True, order=order,
                  objective=objective)


def test_split_edges_mirror_what_runs_against_the_order():
    from placer.solvers.pipeline_stages import split_edges

    # a -> b -> c forward; c -> b and b -> a backward (a training graph's gradients); d hangs off c
    p = PlacementProblem.build(names=list("abcd"), compute_s=np.ones((4, 1)), memory_bytes=np.zeros(4),
                               capacity_bytes=np.full(1, np.inf), bandwidth=np.ones((1, 1)), latency=np.zeros((1, 1)),
                               tensors=[TensorEdge(0, (1,), 1.0), TensorEdge(1, (2,), 1.0), TensorEdge(2, (1, 3), 1.0),
                                        TensorEdge(1, (0,), 1.0)])
    assert split_edges(p) == [(0, 1), (1, 2), (2, 3)]
    acyclic = random_problem(5, 8, 2)
    assert split_edges(acyclic) == sorted({(t.src, d) for t in acyclic.tensors for d in t.dsts})  # its own edges


def test_ideals_of_a_diamond_and_of_a_cycle():
    from placer.solvers.pipeline_stages import ideals

    diamond = PlacementProblem.build(names=list("abcd"), compute_s=np.ones((4, 1)), memory_bytes=np.zeros(4),
                                     capacity_bytes=np.full(1, np.inf), bandwidth=np.ones((1, 1)),
                                     latency=np.zeros((1, 1)),
                                     tensors=[TensorEdge(0, (1, 2), 1.0), TensorEdge(1, (3,), 1.0),
                                              TensorEdge(2, (3,), 1.0)])
    sets = {frozenset(np.flatnonzero(row).tolist()) for row in ideals(diamond, 100)}
    assert sets == {frozenset(), frozenset({0}), frozenset({0, 1}), frozenset({0, 2}), frozenset({0, 1, 2}),
                    frozenset({0, 1, 2, 3})}
    assert ideals(diamond, 3) is None  # more than the limit
    cycle = PlacementProblem.build(names=list("ab"), compute_s=np.ones((2, 1)), memory_bytes=np.zeros(2),
                                   capacity_bytes=np.full(1, np.inf), bandwidth=np.ones((1, 1)),
                                   latency=np.zeros((1, 1)), tensors=[TensorEdge(0, (1,), 1.0)], control=[(1, 0)])
    # a cycle follows the order (a before b): the ideals of a -> b
    assert {frozenset(np.flatnonzero(row).tolist()) for row in ideals(cycle, 100)} == {
        frozenset(), frozenset({0}), frozenset({0, 1})}


def test_auto_runs_the_dp_only_where_it_fits_the_time_limit():
    p = random_problem(3, 120, 4)
    log = solve_problem(p, "auto", SolveOptions(objective="throughput", time_limit_s=2)).log
    assert any(line.startswith("contiguous_dp: ") and "skipped" not in line for line in log)
    log = solve_problem(p, "auto", SolveOptions(objective="throughput", time_limit_s=0.001)).log
    assert any(line.startswith("contiguous_dp: skipped (time limit") for line in log)
    tight = random_problem(3, 120, 4, capacity=2500.0)  # one device cannot hold it: no early stop at 0 bytes
    log = solve_problem(tight, "auto", SolveOptions(objective="memory", time_limit_s=2)).log
    assert any(line.startswith("contiguous_dp: ") and "skipped" not in line for line in log), log  # traffic too


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 30), k=st.integers(1, 5),
       capacity=st.sampled_from([np.inf, 900.0]), forbid=st.sampled_from([0.0, 0.3]),
       objective=st.sampled_from(["latency", "throughput"]))
def test_group_heft_places_every_group_validly_and_deterministically(seed, n, k, capacity, forbid, objective):
    from placer.solvers.listsched import group_heft

    p = random_problem(seed, n, k, capacity=capacity, forbid=forbid)
    options = SolveOptions(objective=objective)
    sol = group_heft(p, options)
    if sol is None:  # only when memory ran out: the whole graph must not fit one greedy packing
        assert np.isfinite(capacity)
        return
    assert sol.assignment.shape == (n,) and ((0 <= sol.assignment) & (sol.assignment < k)).all()
    assert evaluate(p, sol.assignment).feasible  # allowed devices and capacity kept
    assert sol.lower_bound <= sol.objective + 1e-12
    assert np.array_equal(group_heft(p, options).assignment, sol.assignment)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(2, 30), k=st.integers(2, 4), layers=st.integers(1, 6),
       capacity=st.sampled_from([np.inf, 900.0]))
def test_group_heft_with_layer_keys_is_valid_and_never_worse_than_by_groups(seed, n, k, layers, capacity):
    """With ``coarsen_keys`` it also places each key's nodes as one unit and keeps the better plan."""
    from placer.solvers.listsched import group_heft

    p = random_problem(seed, n, k, capacity=capacity)
    rng = np.random.default_rng(seed)
    keys = tuple(None if rng.random() < 0.2 else f"layer{rng.integers(layers)}" for _ in range(n))
    by_groups = group_heft(p, SolveOptions(objective="latency"))
    keyed = group_heft(p, SolveOptions(objective="latency", coarsen_keys=keys))
    if keyed is None:
        assert by_groups is None and np.isfinite(capacity)  # neither view fits the memory
        return
    assert evaluate(p, keyed.assignment).feasible
    assert np.array_equal(group_heft(p, SolveOptions(objective="latency", coarsen_keys=keys)).assignment,
                          keyed.assignment)
    if by_groups is not None:
        assert keyed.objective <= by_groups.objective * (1 + 1e-12)


def test_group_heft_keeps_groups_that_depend_on_each_other_together():
    """Colocation merges can make groups depend on each other both ways (a cycle): they become one unit."""
    from placer.core.problem import Schedule
    from placer.solvers.listsched import group_heft

    # fine ops a -> b -> c -> d, with a and c in group 0 and b and d in group 1: groups 0 <-> 1
    fine = (TensorEdge(0, (1,), 8.0), TensorEdge(1, (2,), 8.0), TensorEdge(2, (3,), 8.0))
    group = np.array([0, 1, 0, 1])
    schedule = Schedule(np.ones((4, 2)), fine, (), group)
    tensors = [TensorEdge(0, (1,), 16.0), TensorEdge(1, (0,), 8.0)]
    p = PlacementProblem.build(names=["g0", "g1"], compute_s=np.full((2, 2), 2.0), memory_bytes=np.zeros(2),
                               capacity_bytes=np.full(2, np.inf), tensors=tensors, bandwidth=np.full((2, 2), 1.0),
                               latency=np.zeros((2, 2)), order=[0, 1], schedule=schedule)
    sol = group_heft(p, SolveOptions(objective="latency"))
    assert sol.assignment[0] == sol.assignment[1]  # one unit: no 8-byte ping-pong over a 1 B/s link
    assert sol.objective == pytest.approx(4.0)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(2, 7), k=st.integers(2, 3),
       capacity=st.sampled_from([150.0, 250.0, 400.0]))
def test_memory_bound_is_at_most_the_least_traffic(seed, n, k, capacity):
    from placer.core.objectives import balance_bound, cluster_bound, memory_bound, separation_bound, traffic_bytes
    from placer.core.spreading import spreading_bound

    p = random_problem(seed, n, k, capacity=capacity)
    least = min(traffic_bytes(p, np.array(a)) for a in itertools.product(range(k), repeat=n))
    for bound_of in (separation_bound, balance_bound, cluster_bound, spreading_bound, memory_bound):
        bound = bound_of(p)
        assert bound >= 0.0
        if np.isfinite(least):
            assert bound <= least * (1 + 1e-9) + 1e-9, bound_of.__name__
        if p.memory_bytes.sum() > capacity and np.isfinite(least) and len(p.tensors) == 0:
            assert bound == 0.0  # nothing connects the nodes: nothing has to cross


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(2, 8), k=st.integers(2, 3), wide=st.booleans())
def test_cut_bounds_are_at_most_the_least_traffic_with_many_readers(seed, n, k, wide):
    """Tensors read by several nodes (Lawler's gadget; a tensor read on q devices crossing q - 1 times),
    whole or fractional bytes, tight capacities."""
    from placer.core.objectives import balance_bound, cluster_bound, traffic_bytes
    from placer.core.spreading import spreading_bound

    rng = np.random.default_rng(seed)
    tensors = [TensorEdge(u, tuple(sorted(rng.choice(np.arange(u + 1, n), size=min(n - u - 1, 3), replace=False))),
                          float(rng.integers(1, 50)) + (0.5 if wide else 0.0)) for u in range(n - 1)]
    memory = rng.integers(1, 10, n).astype(float)
    cap = float(np.ceil(1.1 * memory.sum() / k)) + memory.max()
    p = PlacementProblem.build(names=[f"n{i}" for i in range(n)], compute_s=np.ones((n, k)), memory_bytes=memory,
                               capacity_bytes=np.full(k, cap if wide else memory.sum() / k + memory.max() / 2),
                               tensors=tensors, bandwidth=np.ones((k, k)), latency=np.zeros((k, k)))
    least = min(traffic_bytes(p, np.array(a)) for a in itertools.product(range(k), repeat=n))
    for bound in (balance_bound(p), cluster_bound(p), spreading_bound(p)):
        assert 0.0 <= bound
        if np.isfinite(least):
            assert bound <= least * (1 + 1e-9) + 1e-9


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(3, 14), zeros=st.floats(0.0, 0.8))
def test_spreading_reductions_keep_the_lp_optimum(seed, n, zeros):
    """The reduced hypergraph (leaves and series nodes that hold nothing removed, parallel tensors merged)
    gives the LP optimum of the graph as it is, for the same sources."""
    from placer.core.spreading import CutGraph, _first_sources, _solve_lp, cut_graph

    rng = np.random.default_rng(seed)
    tensors = []
    for u in range(n - 1):
        dsts = tuple(sorted({int(x) for x in rng.integers(u + 1, n, size=int(rng.integers(1, 3)))}))
        tensors.append(TensorEdge(u, dsts, float(rng.integers(0, 20))))
    memory = np.where(rng.random(n) < zeros, 0.0, rng.integers(1, 10, n).astype(float))
    memory[0] = max(memory[0], 1.0)
    cap = max(memory.sum() / 2, memory.max())
    p = PlacementProblem.build(names=[f"n{i}" for i in range(n)], compute_s=np.ones((n, 3)), memory_bytes=memory,
                               capacity_bytes=np.full(3, cap), tensors=tensors,
                               bandwidth=np.ones((3, 3)), latency=np.zeros((3, 3)))
    reduced = cut_graph(p)
    whole = CutGraph(np.arange(n), memory, tuple((t.src, tuple(sorted(set(t.dsts) - {t.src})), t.nbytes)
                                                 for t in tensors if t.nbytes > 0))
    if not whole.edges:
        return
    sources = [int(v) for v in np.flatnonzero(memory > 0)]
    index = {int(v): i for i, v in enumerate(reduced.nodes)}
    spread = memory.sum() - cap
    if not reduced.edges:  # every tensor could be cut away for free: the LP is 0 as well
        assert _solve_lp(whole, sources, spread)[0] == pytest.approx(0.0, abs=1e-6)
        return
    assert all(v in index for v in sources)  # nodes that hold memory are kept
    assert _solve_lp(reduced, [index[v] for v in sources], spread)[0] == pytest.approx(
        _solve_lp(whole, sources, spread)[0], rel=1e-6, abs=1e-6)
    assert _first_sources(p, reduced, 2) == sorted(set(_first_sources(p, reduced, 2)))


def test_spreading_bound_sees_more_than_one_cut_of_a_chain():
    """A chain of 40 one-byte nodes joined by tensors of 1-19 bytes on 4 devices of 12 bytes: each device's
    share of the chain ends at a cheap tensor, and the LP weighs all devices at once where the cut bounds
    take the best single threshold (8 bytes here); ``auto``'s plan (11 bytes) is within its reach."""
    from placer.core.objectives import balance_bound, cluster_bound, memory_bound, separation_bound
    from placer.core.spreading import spreading_bound

    n = 40
    sizes = np.random.default_rng(0).integers(1, 20, n - 1).astype(float)
    p = PlacementProblem.build(names=[f"n{i}" for i in range(n)], compute_s=np.ones((n, 4)),
                               memory_bytes=np.ones(n), capacity_bytes=np.full(4, 12.0),
                               tensors=[TensorEdge(i, (i + 1,), b) for i, b in enumerate(sizes)],
                               bandwidth=np.ones((4, 4)), latency=np.zeros((4, 4)))
    old = max(separation_bound(p), balance_bound(p), cluster_bound(p))
    lp = spreading_bound(p)
    assert old == 8.0 and lp == pytest.approx(9.6, rel=1e-5)
    assert memory_bound(p) == lp
    sol = solve_problem(p, "auto", SolveOptions(objective="memory", time_limit_s=1))
    assert sol.objective == 11.0 and lp <= sol.lower_bound <= sol.objective


def test_spreading_bound_raises_a_typed_error_when_the_lp_fails(monkeypatch):
    """An LP that GLOP does not solve to optimality is no bound: a SolverError saying what to report."""
    from ortools.linear_solver import pywraplp

    from placer.core.spreading import spreading_bound

    monkeypatch.setattr(pywraplp.Solver, "Solve", lambda self: pywraplp.Solver.ABNORMAL)
    chain = [TensorEdge(i, (i + 1,), 10.0) for i in range(3)]
    p = PlacementProblem.build(names=list("abcd"), compute_s=np.ones((4, 2)), memory_bytes=np.ones(4),
                               capacity_bytes=np.full(2, 2.0), tensors=chain, bandwidth=np.ones((2, 2)),
                               latency=np.zeros((2, 2)))
    with pytest.raises(SolverError, match="spreading LP.*not optimal; report this with the graph"):
        spreading_bound(p)


def test_spreading_bound_runs_beside_tensorflow():
    """GLOP solves the LP in a process that imported TensorFlow first (CP-SAT crashes there: it runs in a
    child process; the bound does not)."""
    code = ("import tensorflow, numpy as np\n"
            "from cost_models import TensorEdge\n"
            "from placer.core.problem import PlacementProblem\n"
            "from placer.core.spreading import spreading_bound\n"
            "p = PlacementProblem.build(names=list('abcd'), compute_s=np.ones((4, 2)), memory_bytes=np.ones(4),\n"
            "    capacity_bytes=np.full(2, 2.0), tensors=[TensorEdge(i, (i + 1,), 10.0) for i in range(3)],\n"
            "    bandwidth=np.ones((2, 2)), latency=np.zeros((2, 2)))\n"
            "print(round(spreading_bound(p), 3))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "10.0"


def test_balance_bound_counts_the_split_capacities_force():
    """A chain of twenty 5-byte nodes on two devices of 60 bytes: each device takes 40 or more, so the
    3-byte tensor in the middle must cross (the 1-byte one near the end leaves too little behind it).
    Eleven nodes outweigh a device, too many for the heavy-node separation (0); the bisection bound
    proves the plan optimal (its dual, 2.4, rounded up to whole bytes)."""
    from placer.core.objectives import balance_bound, memory_bound, separation_bound

    sizes = [100.0] * 19
    sizes[9], sizes[17] = 3.0, 1.0
    p = PlacementProblem.build(names=[f"n{i}" for i in range(20)], compute_s=np.ones((20, 2)),
                               memory_bytes=np.full(20, 5.0), capacity_bytes=np.full(2, 60.0),
                               tensors=[TensorEdge(i, (i + 1,), b) for i, b in enumerate(sizes)],
                               bandwidth=np.ones((2, 2)), latency=np.zeros((2, 2)))
    assert separation_bound(p) == 0.0
    assert balance_bound(p) == memory_bound(p) == 3.0
    sol = solve_problem(p, "auto", SolveOptions(objective="memory", time_limit_s=1))
    assert sol.objective == 3.0 and sol.lower_bound == 3.0 and sol.status == "optimal"


def test_max_load_of_a_shared_machine_and_of_a_shared_pool():
    """Two workers on one machine of capacity 1.7 (not pooled): one device alone does its own work at
    full speed and no faster; a pooled group's device may use the whole capacity."""
    def problem(alone):
        return PlacementProblem.build(names=["a", "b"], compute_s=np.ones((2, 2)), memory_bytes=np.zeros(2),
                                      capacity_bytes=np.full(2, np.inf), tensors=[], bandwidth=np.full((2, 2), 1e9),
                                      latency=np.zeros((2, 2)), shared=[((0, 1), 1.7, alone)])
    machine, pool = problem(1.0), problem(1.7)
    assert evaluate(machine, np.array([0, 0])).objective == pytest.approx(2.0)
    assert evaluate(machine, np.array([0, 1])).objective == pytest.approx(2 / 1.7)
    assert evaluate(pool, np.array([0, 0])).objective == pytest.approx(2 / 1.7)
    assert problem(1.0).shared == (((0, 1), 1.7, 1.0),)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 8), back=st.sampled_from([0.0, 0.5]))
def test_stage_costs_are_what_a_stage_sends_and_receives(seed, n, back):
    """Every stage's cost in the DP's matrices, against a count over the tensors: seconds received and
    sent (max load), or bytes received (traffic), over one order and over the ideals."""
    from placer.solvers.pipeline_stages import _split_order, _tensor_costs, boundary_costs, ideal_costs, ideals, split_edges

    p = random_problem(seed, n, 3, back=back)
    edges = split_edges(p)
    order = _split_order(p, edges)
    pos = np.empty(n, dtype=int)
    pos[order] = np.arange(n)

    def direct(stage, traffic):
        cost = _tensor_costs(p, traffic)
        total = 0.0
        for t, c in zip(p.tensors, cost):
            readers = set(t.dsts) - {t.src}
            if not readers:
                continue
            if t.src not in stage and readers & stage:
                total += c  # received once
            if not traffic and t.src in stage and readers - stage:
                total += c  # sent once
        return total

    member = ideals(p, 10_000, edges)
    for traffic in (False, True):
        c = boundary_costs(p, pos, traffic)
        for i in range(n + 1):
            for j in range(i, n + 1):
                assert c[i, j] == pytest.approx(direct(set(order[i:j]), traffic), abs=1e-9)
        comm, subset = ideal_costs(p, member, traffic)
        for a, b in zip(*np.nonzero(subset)):
            stage = set(np.flatnonzero(member[b] & ~member[a]).tolist())
            assert comm[a, b] == pytest.approx(direct(stage, traffic), abs=1e-9)


def test_partition_balances_memory_for_the_memory_objective():
    """For the memory objective METIS balances memory (shares as the capacities): on this random DAG the
    compute-balanced partition left more memory on a device than repair could move (no plan); the
    memory-balanced one fits, and cuts fewer bytes than the compute-balanced one on most such graphs
    (random_problem seeds 0-39, 14 nodes, 3 devices of 300 bytes: fewer on 25 of the 36 both place, more on 9;
    262 kB against 298 kB in all)."""
    p = random_problem(9, 14, 3, capacity=300.0)
    s = solve_problem(p, "partition", SolveOptions(objective="memory"))
    assert evaluate(p, s.assignment).feasible
    assert np.bincount(s.assignment, weights=p.memory_bytes, minlength=3).max() <= 300.0
    with pytest.raises(NoFeasiblePlanError):  # the same graph, balanced by compute
        solve_problem(p, "partition", THROUGHPUT)


def test_coarsening_merges_whole_keys_only_when_asked():
    """Keys (layer scopes) merge first, under the work cap per coarse node; ``whole_keys`` merges each key
    whole (the 2-device search's layer view), still under the memory cap."""
    from placer.solvers.multilevel import coarsen_problem

    n = 12
    p = PlacementProblem.build(names=[f"n{i}" for i in range(n)], compute_s=np.ones((n, 2)),
                               memory_bytes=np.array([1.0] * 11 + [50.0]), capacity_bytes=np.full(2, 200.0),
                               tensors=[TensorEdge(i, (i + 1,), 1.0) for i in range(n - 1)],
                               bandwidth=np.ones((2, 2)), latency=np.zeros((2, 2)))
    keys = ["a"] * 6 + ["b"] * 6  # node 11 (50 bytes) is over the memory cap (200 / 8) with any other
    capped = coarsen_problem(p, 6, keys=keys)
    whole = coarsen_problem(p, 6, keys=keys, whole_keys=True)
    assert np.bincount(capped.coarse_of).max() < 6  # the work cap (2 x 12 / 6 = 4 ops) splits each key
    assert len(set(whole.coarse_of[:6])) == 1 and len(set(whole.coarse_of[6:11])) == 1
    assert whole.coarse.memory_bytes[whole.coarse_of[11]] == 50.0  # the memory cap still holds: alone


def test_a_coarse_problem_simulates_as_the_fine_one():
    """The coarse problem keeps the devices' simulation settings (a shared processor, transfer CPU, the ready
    order): a coarse plan's simulated step is its expansion's on the fine problem. Before 2026-12-05 the
    coarse problem dropped them, and warm starts scored on it ignored the processor both devices share."""
    from placer.core.objectives import makespan
    from placer.solvers.multilevel import coarsen_problem

    n = 12
    p = PlacementProblem.build(names=[f"n{i}" for i in range(n)], compute_s=np.ones((n, 2)),
                               memory_bytes=np.zeros(n), capacity_bytes=np.full(2, np.inf),
                               tensors=[TensorEdge(0, tuple(range(1, n)), 10.0)],
                               bandwidth=np.full((2, 2), 100.0), latency=np.full((2, 2), 0.01),
                               shared=[((0, 1), 1.0)], transfer_cpu=np.array([[0.0, 0.2], [0.2, 0.0]]),
                               ready_order="lifo")
    c = coarsen_problem(p, 4)
    assert (c.coarse.shared, c.coarse.ready_order) == (p.shared, p.ready_order)
    assert np.array_equal(c.coarse.transfer_cpu, p.transfer_cpu)
    split = np.arange(c.coarse.n) % 2
    fine = split[c.coarse_of]
    assert len(set(fine.tolist())) == 2
    # one processor for both devices: 12 s of work however it is split, plus the transfers' CPU
    assert makespan(c.coarse, split) == pytest.approx(makespan(p, fine))
    assert makespan(p, fine) >= n


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 25), k=st.integers(2, 4),
       capacity=st.sampled_from([np.inf, 900.0]), forbid=st.sampled_from([0.0, 0.3]), comm=st.sampled_from([0.1, 3.0]))
def test_descent_keeps_every_constraint_never_worsens_and_is_deterministic(seed, n, k, capacity, forbid, comm):
    from placer.core.objectives import makespan, simulate_step
    from placer.solvers.descent import descend, slack

    p = random_problem(seed, n, k, capacity=capacity, forbid=forbid, comm=comm)
    try:
        start = solve_problem(p, "heft", SolveOptions(objective="latency")).assignment
    except NoFeasiblePlanError:
        return  # nothing feasible to start from (capacity)
    moved = descend(p, start, simulations=30)
    assert moved.shape == (n,) and ((0 <= moved) & (moved < k)).all()
    assert evaluate(p, moved).feasible  # allowed devices and capacity kept
    assert makespan(p, moved) <= makespan(p, start) * (1 + 1e-12)
    assert np.array_equal(descend(p, start, simulations=30), moved)
    # slack as the simulator ran it: no op starts later than its latest start
    assert (slack(p, moved, simulate_step(p, moved)) >= -1e-9).all()


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 25), k=st.integers(2, 4),
       capacity=st.sampled_from([np.inf, 900.0]), forbid=st.sampled_from([0.0, 0.3]), comm=st.sampled_from([0.1, 3.0]),
       simulations=st.sampled_from([4, 30]))
def test_descent_from_several_starts_is_feasible_no_worse_than_any_and_deterministic(seed, n, k, capacity, forbid,
                                                                                    comm, simulations):
    """From HEFT's plan and the one-device plan (where feasible): every node placed once on a device it may
    use, within capacity, no worse than the better start, the same plan and start index again."""
    from placer.core.objectives import makespan
    from placer.solvers.descent import descend_starts

    p = random_problem(seed, n, k, capacity=capacity, forbid=forbid, comm=comm)
    starts = []
    for name in ("heft", "single"):
        try:
            starts.append(solve_problem(p, name, SolveOptions(objective="latency")).assignment)
        except NoFeasiblePlanError:
            pass
    if not starts:
        return  # nothing feasible to start from
    moved, which = descend_starts(p, starts, simulations)
    assert moved.shape == (n,) and 0 <= which < len(starts)
    assert evaluate(p, moved).feasible  # allowed devices and capacity kept
    assert makespan(p, moved) <= min(makespan(p, s) for s in starts) * (1 + 1e-12)
    again, which_again = descend_starts(p, starts, simulations)
    assert np.array_equal(again, moved) and which_again == which
    known = descend_starts(p, starts, simulations, steps=[makespan(p, s) for s in starts])[0]  # none simulated
    with pytest.raises(SolverError, match="one per start"):
        descend_starts(p, starts, simulations, steps=[1.0] * (len(starts) + 1))
    with pytest.raises(SolverError, match="at least one start plan"):
        descend_starts(p, [], simulations)
    assert evaluate(p, known).feasible and makespan(p, known) <= min(makespan(p, s) for s in starts) * (1 + 1e-12)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 25), k=st.integers(2, 4),
       capacity=st.sampled_from([np.inf, 900.0]), forbid=st.sampled_from([0.0, 0.3]), comm=st.sampled_from([0.1, 3.0]))
def test_ordered_descent_keeps_every_constraint_and_its_order_runs_as_simulated(seed, n, k, capacity, forbid, comm):
    """Moves scored with each device running its most urgent ready op: feasible, never worse than the start
    so simulated nor with the order each would emit, deterministic; the order lists each long enough op
    once, on its device, in the order the simulation ran it."""
    from placer.core.objectives import critical_path_bound, makespan, simulate_step, step_priority
    from placer.core.order import MIN_ORDERED_OP_S, check_order
    from placer.solvers.descent import descend_ordered

    p = random_problem(seed, n, k, capacity=capacity, forbid=forbid, comm=comm)
    try:
        start = solve_problem(p, "heft", SolveOptions(objective="latency")).assignment
    except NoFeasiblePlanError:
        return  # nothing feasible to start from (capacity)
    priority = step_priority(p)
    moved, order = descend_ordered(p, start, simulations=30)
    assert evaluate(p, moved).feasible  # allowed devices and capacity kept
    ran = simulate_step(p, moved, priority=priority)
    assert ran.step_time_s <= simulate_step(p, start, priority=priority).step_time_s * (1 + 1e-12)
    again = descend_ordered(p, start, simulations=30)
    assert np.array_equal(again[0], moved) and again[1] == order
    sched = p.schedule_view()
    fine = moved[sched.group]
    check_order(order, fine)  # each op at most once, on its device
    seconds = sched.durations_s[np.arange(sched.m), fine]
    in_order = [[v for v, d, *_ in ran.timeline if d == e and seconds[v] >= MIN_ORDERED_OP_S] for e in range(k)]
    assert [list(ops) for ops in order] == [ops if len(ops) > 1 else [] for ops in in_order]
    # a move is kept only where the plan also runs faster with the order it would emit
    first = simulate_step(p, start, priority=priority)
    start_order = [[v for v, d, *_ in first.timeline if d == e and sched.durations_s[v, start[sched.group][v]]
                    >= MIN_ORDERED_OP_S] for e in range(k)]
    start_order = [ops if len(ops) > 1 else [] for ops in start_order]
    assert makespan(p, moved, order) <= makespan(p, start, start_order) * (1 + 1e-12)  # finite: acyclic
    assert makespan(p, moved, order) >= critical_path_bound(p) * (1 - 1e-9)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 25), k=st.integers(2, 4), comm=st.sampled_from([0.0, 0.1, 3.0]))
def test_critical_moves_name_only_what_held_up_the_step(seed, n, k, comm):
    """Each move is a node to another device (or any, ``-1``), once; none at all only where the step is a
    path of the DAG at its ops' times (nothing waited for a device or a transfer)."""
    from placer.core.objectives import simulate_step
    from placer.solvers.descent import critical_moves

    p = random_problem(seed, n, k, comm=comm)
    a = np.random.default_rng(seed).integers(0, k, n)
    result = simulate_step(p, a)
    moves = critical_moves(p, a, result)
    assert len(set(moves)) == len(moves)
    assert all(0 <= v < n and (d == -1 or (0 <= d < k and d != a[v])) for v, d in moves)
    sched = p.schedule_view()
    own = sched.durations_s[np.arange(sched.m), a[sched.group]]
    longest = np.zeros(sched.m)  # latest end of a path ending at each op, at its own device's time
    preds = dependencies(sched.m, sched.tensors, sched.control)[0]
    for v in p.schedule_order().tolist():
        longest[v] = own[v] + max((longest[u] for _, u in preds[v]), default=0.0)
    assert result.step_time_s >= longest.max() * (1 - 1e-9)
    if not moves:
        assert result.step_time_s == pytest.approx(longest.max(), rel=1e-9)


def test_critical_moves_follow_the_chain_through_devices_and_links():
    """``a`` (1 s) feeds ``b`` (1 s) over a 2 s transfer; ``c`` (4 s) reads nothing."""
    from placer.core.objectives import simulate_step
    from placer.solvers.descent import critical_moves

    p = PlacementProblem.build(names=["a", "b", "c"], compute_s=np.array([[1.0] * 2, [1.0] * 2, [4.0] * 2]),
                               memory_bytes=np.zeros(3), capacity_bytes=np.full(2, np.inf),
                               tensors=[TensorEdge(0, (1,), 2000.0)], bandwidth=np.full((2, 2), 1000.0),
                               latency=np.zeros((2, 2)))

    def moves(*assignment):
        a = np.array(assignment)
        return simulate_step(p, a).step_time_s, critical_moves(p, a, simulate_step(p, a))

    # c runs 0-4 on b's device; b's input arrives at 3 and waits for c: c held the step up 1 s
    assert moves(0, 1, 1) == (pytest.approx(5.0), [(2, -1)])
    # c after a on device 0 (FIFO, lower index first): a held c up 1 s
    assert moves(0, 1, 0) == (pytest.approx(5.0), [(0, -1)])
    # without c: the 2 s transfer is the chain's, and either end may join the other
    p2 = PlacementProblem.build(names=["a", "b"], compute_s=np.ones((2, 2)), memory_bytes=np.zeros(2),
                                capacity_bytes=np.full(2, np.inf), tensors=[TensorEdge(0, (1,), 2000.0)],
                                bandwidth=np.full((2, 2), 1000.0), latency=np.zeros((2, 2)))
    a = np.array([0, 1])
    result = simulate_step(p2, a)
    assert result.step_time_s == pytest.approx(4.0)
    assert critical_moves(p2, a, result) == [(0, 1), (1, 0)]


def _gradients_summed(steps: int = 6) -> PlacementProblem:
    """A chain of ``steps`` 1 s ops on which per-step 1 s "gradients" hang, each sending a large tensor to one
    sum (an unrolled recurrent layer's weight gradients): links of 10 bytes/s, 100 bytes along the chain and
    per gradient, 1 byte into each gradient."""
    chain, grads, total = list(range(steps)), list(range(steps, 2 * steps)), 2 * steps
    tensors = [TensorEdge(c, (c + 1,), 100.0) for c in chain[:-1]]
    tensors += [TensorEdge(c, (steps + c,), 1.0) for c in chain]
    tensors += [TensorEdge(g, (total,), 100.0) for g in grads]
    compute = np.ones((total + 1, 2))
    compute[total] = 0.1
    return PlacementProblem.build(names=[f"n{i}" for i in range(total + 1)], compute_s=compute,
                                  memory_bytes=np.zeros(total + 1), capacity_bytes=np.full(2, np.inf),
                                  tensors=tensors, bandwidth=np.full((2, 2), 10.0), latency=np.zeros((2, 2)))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 30))
def test_gathering_sets_are_a_sum_and_what_feeds_it_alone(seed, n):
    from placer.solvers.descent import MIN_FAN_IN, gathering_sets

    p = random_problem(seed, n, 2)
    preds, succs = dependencies(p.n, p.tensors)
    sets = gathering_sets(p)
    weights = [p.compute_s.min(axis=1)[members].sum() for members in sets]
    assert weights == sorted(weights, reverse=True)
    for members in sets:
        roots = [r for r in members if len({u for _, u in preds[r]} - {r}) >= MIN_FAN_IN
                 and all({w for _, w in succs[u]} == {r} for u in members if u != r)]
        assert len(roots) == 1 and len(members) >= 2 and len(set(members.tolist())) == len(members)


def test_descent_moves_gradients_and_their_sum_as_one(monkeypatch):
    """No single move pays where each gradient would send its large tensor back to the sum; the gradients and
    their sum moved together (:func:`~placer.solvers.descent.gathering_sets`) run beside the chain."""
    import placer.solvers.descent as descent_module
    from placer.core.objectives import makespan
    from placer.solvers.descent import descend, descend_ordered, gathering_sets

    p = _gradients_summed()
    assert [s.tolist() for s in gathering_sets(p)] == [list(range(6, 13))]
    start = np.zeros(p.n, dtype=int)
    moved = descend(p, start, simulations=20)
    assert moved[:6].tolist() == [0] * 6 and moved[6:].tolist() == [1] * 7
    assert makespan(p, moved) < 7.5 < 12.1 == pytest.approx(makespan(p, start))
    a, order = descend_ordered(p, start, simulations=20)
    assert makespan(p, a, order=order) < 7.5
    monkeypatch.setattr(descent_module, "MIN_GATHERED_SHARE", np.inf)  # single moves only
    assert makespan(p, descend(p, start, simulations=20)) > 10.0


def test_descent_spends_its_budget_where_simulations_cannot_resume(monkeypatch):
    """Devices sharing a processor are simulated from the start each time: every trial counts whole."""
    import placer.solvers.descent as descent_module
    from placer.solvers.descent import descend

    base = random_problem(7, 20, 3, comm=0.1)
    p = PlacementProblem.build(names=list(base.names), compute_s=base.compute_s, memory_bytes=base.memory_bytes,
                               capacity_bytes=base.capacity_bytes, tensors=list(base.tensors),
                               bandwidth=base.bandwidth, latency=base.latency, shared=[((0, 1, 2), 1.5)])
    calls = []
    real = descent_module.simulate_step
    monkeypatch.setattr(descent_module, "simulate_step", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    descend(p, np.zeros(20, dtype=int), simulations=6)
    assert 1 < len(calls) <= 6


@pytest.mark.parametrize("k", [2, 4])
def test_auto_for_latency_descends_instead_of_refining_and_cpsat(k):
    p = random_problem(3, 30, k, comm=0.2)
    sol = solve_problem(p, "auto", SolveOptions(objective="latency", time_limit_s=2))
    assert any(line.startswith("descent ") for line in sol.log), sol.log
    assert any(line.startswith("descent ") and " / single (" in line for line in sol.log), sol.log  # both starts
    assert any(line.startswith("refine, cpsat: skipped") for line in sol.log), sol.log
    assert not any(line.startswith(("cpsat", "refine ")) for line in sol.log), sol.log
    assert any(line.startswith("ordered descent ") for line in sol.log), sol.log  # plans may fix their order
    executor = solve_problem(p, "auto", SolveOptions(objective="latency", time_limit_s=2, ordered=False))
    assert not any(line.startswith("ordered descent ") for line in executor.log) and not executor.order
    throughput = solve_problem(p, "auto", SolveOptions(objective="throughput", time_limit_s=2))
    assert not any(line.startswith("descent ") for line in throughput.log)  # loads need no simulation
    assert any(line.startswith("cpsat") for line in throughput.log), throughput.log


def test_auto_for_latency_still_runs_cpsat_where_no_heuristic_plan_fits():
    """Three devices of 20 bytes and nine nodes of 60 bytes in all (packed as 9+11, 2+8+2+8, 4+9+7): no
    heuristic finds a plan that fits, so CP-SAT (a feasibility search too) runs for latency as well, and
    its plan is descended."""
    from placer.solvers.auto import HEURISTICS
    from placer.solvers.registry import SOLVERS

    memory = np.array([9.0, 2.0, 4.0, 8.0, 11.0, 9.0, 2.0, 8.0, 7.0])
    n = memory.size
    p = PlacementProblem.build(names=[f"n{i}" for i in range(n)], compute_s=np.ones((n, 3)), memory_bytes=memory,
                               capacity_bytes=np.full(3, 20.0),
                               tensors=[TensorEdge(i, (i + 1,), 1.0) for i in range(n - 1)],
                               bandwidth=np.full((3, 3), 1e3), latency=np.full((3, 3), 1e-3))
    options = SolveOptions(objective="latency", time_limit_s=2)
    for name in HEURISTICS:
        if SOLVERS[name].unmet(p) is not None:  # mincut: two devices only; path_runs: a path in one run
            continue
        with pytest.raises(NoFeasiblePlanError):
            solve_problem(p, name, options)
    sol = solve_problem(p, "auto", options)
    assert sol.solver.startswith("auto/cpsat") and evaluate(p, sol.assignment).feasible, sol.log
    assert any(line.startswith("descent cpsat") for line in sol.log), sol.log


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 6), k=st.integers(2, 3), hetero=st.booleans(),
       capacity=st.sampled_from([np.inf, 250.0]))
def test_heavy_enum_equals_brute_force_where_every_node_is_heavy(seed, n, k, hetero, capacity):
    """Up to MAX_HEAVY nodes every node is heavy: the set partitions (interchangeable devices) or labelings
    it tries hold an optimum of the simulated step."""
    from placer.core.objectives import makespan
    from placer.solvers import heavy

    p = random_problem(seed, n, k, hetero=hetero, capacity=capacity)
    assert heavy.interchangeable(p) == (not hetero or k == 1)
    best = min((makespan(p, np.array(a)) for a in itertools.product(range(k), repeat=n)), default=np.inf)
    if not np.isfinite(best):
        with pytest.raises(NoFeasiblePlanError):
            solve_problem(p, "heavy_enum", SolveOptions(objective="latency"))
        return
    s = solve_problem(p, "heavy_enum", SolveOptions(objective="latency"))
    assert s.objective == pytest.approx(best, rel=1e-12)
    assert s.objective >= s.lower_bound - 1e-12


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 30), k=st.integers(2, 4), forbid=st.sampled_from([0.0, 0.3]),
       capacity=st.sampled_from([np.inf, 900.0]), objective=st.sampled_from(["latency", "throughput"]))
def test_heavy_enum_keeps_every_constraint_and_is_deterministic(seed, n, k, forbid, capacity, objective):
    from placer.solvers import heavy

    p = random_problem(seed, n, k, forbid=forbid, capacity=capacity)
    reason = heavy.few_heavy_nodes(p)
    w = p.compute_s.min(axis=1)
    assert (reason is None) == (np.sort(w)[::-1][:heavy.MAX_HEAVY].sum() >= heavy.MIN_COVER * w.sum())
    if reason is not None:
        return
    options = SolveOptions(objective=objective)
    owner = heavy.followers(p, np.argsort(-w, kind="stable")[:heavy.heavy_count(p, options)])
    assert owner.shape == (n,) and owner.min() >= 0
    try:
        s = solve_problem(p, "heavy_enum", options)
    except NoFeasiblePlanError:
        return
    assert s.assignment.shape == (n,) and ((0 <= s.assignment) & (s.assignment < k)).all()
    assert evaluate(p, s.assignment).feasible  # kernels and memory kept
    assert s.objective >= s.lower_bound - 1e-12
    assert np.array_equal(solve_problem(p, "heavy_enum", options).assignment, s.assignment)


@pytest.mark.parametrize("identical", [True, False])
def test_heavy_labelings_are_counted_distinct_and_cover_every_split(identical):
    from placer.solvers.heavy import labelings, plan_count

    for h in range(0, 7):
        for k in range(1, 5):
            labels = list(labelings(h, k, identical))
            assert len(labels) == len(set(labels)) == plan_count(h, k, identical)
            # every labeling is some listed one with its devices renamed (identical) or listed itself
            canon = {tuple(list(dict.fromkeys(a)).index(x) for x in a)  # devices renamed by first use
                     for a in itertools.product(range(k), repeat=h)}
            assert (canon <= set(labels)) if identical else len(labels) == k ** h


def test_heavy_enum_refuses_work_spread_over_many_nodes_saying_what_to_use():
    """Twenty equal nodes: the 8 heaviest hold 40% of the work, under MIN_COVER; the typed error names the
    share and the algorithm to use instead; on one device there is nothing to enumerate."""
    n = 20
    p = PlacementProblem.build(names=[f"n{i}" for i in range(n)], compute_s=np.ones((n, 2)), memory_bytes=np.zeros(n),
                               capacity_bytes=np.full(2, np.inf), tensors=[], bandwidth=np.ones((2, 2)),
                               latency=np.zeros((2, 2)))
    with pytest.raises(SolverError, match=r"heavy_enum cannot place this problem: its 8 heaviest nodes hold 40% "
                                          r"of the work, less than 80%; choose another algorithm \(e.g. 'auto'\)"):
        solve_problem(p, "heavy_enum", SolveOptions(objective="latency"))
    one = PlacementProblem.build(names=["a"], compute_s=np.ones((1, 1)), memory_bytes=np.zeros(1),
                                 capacity_bytes=np.full(1, np.inf), tensors=[], bandwidth=np.ones((1, 1)),
                                 latency=np.zeros((1, 1)))
    with pytest.raises(SolverError, match="one device: nothing to enumerate"):
        solve_problem(one, "heavy_enum", SolveOptions(objective="latency"))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 25), k=st.integers(2, 4), comm=st.sampled_from([0.1, 3.0]))
def test_detours_leave_a_device_and_come_back_to_it(seed, n, k, comm):
    """Each detour of a random plan's critical chain: nodes all on other devices than the one it names
    (which the chain left and came back to), sorted and distinct, a positive time saved, most first; none
    exactly where the chain came back to a device it left (nodes are single ops here: no detour brings
    other work along)."""
    from placer.core.objectives import simulate_step
    from placer.solvers.descent import critical_chain, detours

    p = random_problem(seed, n, k, comm=comm)
    a = np.random.default_rng(seed).integers(0, k, n)
    result = simulate_step(p, a)
    chain = critical_chain(p, a, result)
    found = detours(p, a, result, chain)
    for nodes, d, held in found:
        assert nodes.size and (np.diff(nodes) > 0).all() and (a[nodes] != d).all() and held > 0
    assert [held for *_, held in found] == sorted((held for *_, held in found), reverse=True)
    crossings = [(a[u], a[v]) for u, v, _, crossed in chain if crossed]
    assert bool(found) == any(earlier[0] == later[1] for earlier, later in zip(crossings[1:], crossings))
