"""Simulated descent for the latency objective: moves scored by the simulator itself (no TensorFlow).

Greedy refinement (:mod:`placer.solvers.refine`) and CP-SAT optimise device
*loads*, a proxy for a step's time. On training graphs whose parallel work
hangs off the critical path (the weight gradients of a convolutional
network, which need only their inputs and feed one update) the proxy is
poor: the densely connected CNN's training step stayed on one device
(205.9 ms) where moving its weight gradients to other devices simulates at
146.6 ms.

:func:`descend` moves one problem node at a time (or one *gathering set*: a node that sums many
inputs together with those that feed it alone, :func:`gathering_sets`) and keeps a move when the
simulated step gets shorter:

1. simulate the plan; from its timeline take each op's *slack* (how much
   later it could start without delaying the step, given the transfers the
   plan pays: a backward pass over the DAG from the step's end);
2. candidates, first the gathering sets holding at least :data:`MIN_GATHERED_SHARE` of the step where
   the budget affords :data:`SET_TRIALS` trials of each on every other device (else right after the
   critical chain's), then those of the step's *realized* critical chain, most held-up time first:
   its *detours* (:func:`detours`: the nodes of a stretch of the chain that left a device and came
   back to it, moved back as one) and (:func:`critical_moves`) the ops that kept a device busy while
   the chain waited for it and the transfers on the chain, as moves to the other end's device; then
   nodes whose every op has slack,
   heaviest first (a node on the critical path only moves the step's end
   with it);
3. try the next candidate on its device, or the least busy device it may
   use, with memory for it, that it has not been tried on, first the moves
   whose added transfers fit in the node's slack (:func:`added_transfer_s`),
   then the others (a move whose new transfers outlast the slack usually
   delays the step, and simulating it spends one of the budget's
   simulations); keep the first move that shortens the step, re-simulate and
   start again from 1; stop when no candidate improves or the budget of
   simulations is spent.

The chain's candidates come first because the executor takes a device's
ready ops in arrival order (FIFO), so an op with slack that runs first can
hold up the step: on the Transformer's training step on 4 devices they took
the descent from 181.9 to 171.1 ms within the same budget.

:func:`descend_starts` descends from several plans (``auto``: the best plan and the one-device plan),
each on a share of the budget, and goes on from the one that got shortest: the best plan by value is not
always the one that descends furthest (a scattered plan's transfers take many moves to undo, while a
one-device plan's weight gradients pay from the first move off it).

:func:`descend_ordered` makes the same moves with each plan simulated in the order it would fix: each
device runs its ready op of highest priority (the least time any plan needs after it ends:
:func:`~placer.core.objectives.step_priority`) where the executor would run the one that became ready
first; the plan carries the order the simulation ran (:mod:`placer.core.order`), and a move is kept
only if the plan also runs faster with that order emitted as control edges (ops under 20 µs are left out
of it, so the two can differ: on the LSTM seq2seq's training step, whose ops take ~10 µs, the priority
simulation kept moves the emitted order did not repeat). ``auto`` gives it half of the descent where
plans may fix their order.

Each trial continues the current plan's simulation from the last state
the move leaves intact (:func:`cost_models.simulate`'s ``resume``, with
:data:`SNAPSHOTS` states kept, fewer above :data:`SNAPSHOT_OPS` ops): a
move of a weight gradient late in the backward pass simulates only the
ops after its inputs' producers, not the whole step; and it stops as soon as an op's end plus the
least time any plan needs after it (:func:`placer.core.objectives.step_tails`) shows that it cannot
beat the current step. The budget counts simulated ops (in whole simulations' worth),
not seconds, so the same input gives the same plan on any machine. The
result is never worse than the input.
"""

from __future__ import annotations

from typing import Callable, Iterator, Sequence

import numpy as np

from cost_models import SimResult

from ..core.objectives import simulate_step, step_dependencies, step_priority
from ..core.order import simulated_order
from ..core.problem import Edge, PlacementProblem, dependencies
from ..errors import SolverError

#: Estimated µs per fine op of one simulation (and the slack pass after a kept move) on the 2-core
#: reference machine: 100 simulations from a one-device plan took 3.7 µs per op on the densely connected
#: CNN's training step (5,342 ops), 3.5 on LSTM seq2seq's (2,681), 2.9 on the two-branch CNN's (1,030).
#: Resumed trials cost more per simulated op (each copies its state, O(ops)): descents of 2 s' budget on
#: eight graphs (1k-16.5k ops, 3.26M simulated ops in all) took 5.9-6.1 µs per simulated op until the
#: simulator's loop was made leaner (2026-12-04), 3.8-4.4 since, which this estimate now covers.
US_PER_OP = 4.5
#: The same for :func:`descend_ordered` (priority pools, and a simulation of each kept move with its order
#: emitted): per budgeted simulation it took 1.1-1.3x descend's wall time on the InceptionV3 (8 devices),
#: ResNet50 and Transformer (4) training steps, 2026-12-05, once the order's dependencies were derived from
#: the graph's instead of rebuilt (1.8x before).
ORDERED_US_PER_OP = 6.0
#: States kept per simulation for trials to resume from (a trial re-runs at most 1/SNAPSHOTS of the ops
#: before its move's inputs) ...
SNAPSHOTS = 32
#: ... fewer on large graphs, so that states times ops stays under this: each state copies three lists of
#: the ops' size (8 bytes an entry), so ~100 MB for the current plan's simulation and as much for a trial's.
SNAPSHOT_OPS = 4_000_000
#: A kept move's slack pass, in simulations (it walks every op and edge once, backwards: about half a
#: simulation's time).
SLACK_PASS = 0.5
#: The walk of the realized critical chain (:func:`critical_moves`) each round, in simulations: 0.1-0.25 of
#: one on the densely connected CNN's and ResNet50's training steps (5.3k and 14.5k ops, 2026-12-04).
CRITICAL_PASS = 0.25
#: A node that gathers at least this many input nodes moves together with those that feed it alone
#: (:func:`gathering_sets`) ...
MIN_FAN_IN = 3
#: ... where their work is at least this share of the current step.
MIN_GATHERED_SHARE = 0.01
#: The sets are tried before the critical chain's moves where the budget affords this many simulations per
#: set and other device, else after them: a set's move can pay only over many later moves (the densely
#: connected CNN's training step under layer groups, 17 such sets on 4 devices, ordered descent: 446-449
#: ms after 30 simulations with the sets first, 436.5 after them; 407.6 after 100 with the sets first).
SET_TRIALS = 2
#: :func:`descend_starts` probes its starts on this share of the budget (an equal part each).
PROBE_SHARE = 0.5
#: ... where each probe gets this many simulations at least (else only the shortest start is descended).
MIN_PROBE = 3


def slack(problem: PlacementProblem, assignment: np.ndarray, result: SimResult) -> np.ndarray:
    """Per problem node: the least slack of its ops in ``result`` (how much later each could have
    started without delaying the step, counting the transfers ``assignment`` pays between devices,
    not the queues on devices and links).

    Examples
    --------
    Two independent ops of 1 s and 3 s on one device: the short one could start 2 s later.

    >>> from cost_models import TensorEdge
    >>> p = PlacementProblem.build(names=["a", "b"], compute_s=np.array([[1.0, 1.0], [3.0, 3.0]]),
    ...     memory_bytes=np.zeros(2), capacity_bytes=np.full(2, np.inf), tensors=[], bandwidth=np.ones((2, 2)),
    ...     latency=np.zeros((2, 2)))
    >>> a = np.array([0, 1])
    >>> slack(p, a, simulate_step(p, a)).tolist()
    [2.0, 0.0]
    """
    sched = problem.schedule_view()
    fine = np.asarray(assignment, dtype=int)[sched.group].tolist()
    start, end = [0.0] * sched.m, [0.0] * sched.m  # Python lists: this loop runs once per kept move
    for v, _, s, e in result.timeline:
        start[v], end[v] = s, e
    deps = step_dependencies(problem)
    control, produced, receivers, tensors = deps.control_successors, deps.produced, deps.receivers, sched.tensors
    step = result.step_time_s
    latency = np.asarray(problem.latency, dtype=float).tolist()

    latest = [step] * sched.m  # latest start
    for v in problem.schedule_order()[::-1].tolist():
        finish, here = step, fine[v]
        for w in control[v]:
            if latest[w] < finish:
                finish = latest[w]
        for ti in produced[v]:
            for w in receivers[ti]:
                there = fine[w]
                # a transfer as the simulator charges it: one latency per edge
                by = latest[w] if there == here else latest[w] - (
                    latency[here][there] + problem.occupancy_seconds(here, there, tensors[ti].nbytes))
                if by < finish:
                    finish = by
        latest[v] = finish - (end[v] - start[v])
    per_node = np.full(problem.n, np.inf)
    np.minimum.at(per_node, sched.group, np.array(latest) - np.array(start))
    return per_node


def critical_moves(problem: PlacementProblem, assignment: np.ndarray, result: SimResult,
                   preds: list[list[Edge]] | None = None,
                   chain: list[tuple[int, int, float, bool]] | None = None) -> list[tuple[int, int]]:
    """Moves that may shorten the step ``result`` simulated, most promising first: ``(node, device)``,
    device ``-1`` where any other device may do.

    Walks the step's *realized* critical chain back from the op that ends last: at each op, if it
    started later than its last input arrived, it waited for its device, and the op just before it
    there held up the step for as long as it ran meanwhile (a *blocker*: its node should go elsewhere;
    the chain goes on at it, so a blocker that had waited too credits the one before it); otherwise the
    chain goes on at the input that arrived last, and where that input crossed devices, the op's node may
    go to the producer's device (or the producer's node to the op's) to save the transfer. Candidates are
    ranked by how long they held up the chain. With ops overlapping on one device (a shared processor's
    pool) it stays a ranking, no more.

    ``preds``: :func:`placer.core.problem.dependencies` of the fine DAG, when asked for many plans;
    ``chain``: the walk (:func:`critical_chain`) where the caller has it.

    Examples
    --------
    Two independent ops of 2 s and 1 s on one device, FIFO: the 2 s op runs first and holds up the
    other, so the first move is the 2 s op's node to any other device.

    >>> from cost_models import TensorEdge
    >>> p = PlacementProblem.build(names=["a", "b"], compute_s=np.array([[2.0, 2.0], [1.0, 1.0]]),
    ...     memory_bytes=np.zeros(2), capacity_bytes=np.full(2, np.inf), tensors=[], bandwidth=np.ones((2, 2)),
    ...     latency=np.zeros((2, 2)))
    >>> a = np.array([0, 0])
    >>> critical_moves(p, a, simulate_step(p, a))
    [(0, -1)]
    """
    chain = critical_chain(problem, assignment, result, preds) if chain is None else chain
    return [key for key, _ in _critical_weights(problem, assignment, result, chain)]


def _critical_weights(problem: PlacementProblem, assignment: np.ndarray, result: SimResult,
                      chain: list[tuple[int, int, float, bool]]) -> list[tuple[tuple[int, int], float]]:
    """:func:`critical_moves` with how long each held the step up."""
    weight: dict[tuple[int, int], float] = {}
    group = problem.schedule_view().group
    fine = np.asarray(assignment, dtype=int)[group]
    for u, v, held, crossed in chain:
        keys = [(int(group[u]), -1)] if not crossed else [(int(group[v]), int(fine[u])), (int(group[u]), int(fine[v]))]
        for key in keys:
            weight[key] = weight.get(key, 0.0) + held
    return _ranked(weight, result)


def _ranked(weight: dict, result: SimResult) -> list[tuple]:
    """``(key, held)`` of ``weight`` that held the step up, most first (ties by key)."""
    tol = 1e-9 * max(result.step_time_s, 1e-12)
    return [(key, held) for key, held in sorted(weight.items(), key=lambda kv: (-kv[1], kv[0])) if held > tol]


def critical_chain(problem: PlacementProblem, assignment: np.ndarray, result: SimResult,
                   preds: list[list[Edge]] | None = None) -> list[tuple[int, int, float, bool]]:
    """The step's realized critical chain, walked back from the op that ends last (see
    :func:`critical_moves`): per step ``(u, v, held, crossed)``, fine op ``u`` before ``v``, where ``u``
    either ran on ``v``'s device while ``v`` waited for it (``crossed`` false; ``held``: how long it ran
    meanwhile) or sent ``v``'s last input (``held``: the transfer's time where it ``crossed`` devices, else
    0). ``preds``: :func:`placer.core.problem.dependencies` of the fine DAG, when asked for many plans.

    Examples
    --------
    ``a`` (1 s) feeds ``b`` (1 s) over a 2 s transfer: the chain is ``b`` reached from ``a`` over it.

    >>> from cost_models import TensorEdge
    >>> p = PlacementProblem.build(names=["a", "b"], compute_s=np.ones((2, 2)), memory_bytes=np.zeros(2),
    ...     capacity_bytes=np.full(2, np.inf), tensors=[TensorEdge(0, (1,), 2000.0)],
    ...     bandwidth=np.full((2, 2), 1000.0), latency=np.zeros((2, 2)))
    >>> a = np.array([0, 1])
    >>> critical_chain(p, a, simulate_step(p, a))
    [(0, 1, 2.0, True)]
    """
    sched = problem.schedule_view()
    m = sched.m
    if m == 0:
        return []
    if preds is None:
        preds = dependencies(m, sched.tensors, sched.control)[0]
    fine = np.asarray(assignment, dtype=int)[sched.group].tolist()
    start, end = [0.0] * m, [0.0] * m
    on_device: list[list[int]] = [[] for _ in range(problem.k)]  # ops per device in start order
    where = [0] * m  # each op's index in its device's list
    for v, d, s, e in result.timeline:
        start[v], end[v] = s, e
        where[v] = len(on_device[d])
        on_device[d].append(v)
    arrival = {(ti, dst): e for ti, _, dst, _, e in result.transfers}
    tol = 1e-9 * max(result.step_time_s, 1e-12)
    steps = []
    v = max(range(m), key=end.__getitem__)
    for _ in range(m):  # each step goes to an op that started earlier: at most m steps
        ready, via, crossed = 0.0, -1, False
        for ti, u in preds[v]:
            apart = ti >= 0 and fine[u] != fine[v]
            t = arrival.get((ti, fine[v]), end[u]) if apart else end[u]
            if t > ready:
                ready, via, crossed = t, u, apart
        if start[v] > ready + tol:  # it waited for its device: the op before it there held it up
            ops, i = on_device[fine[v]], where[v]
            if i == 0:
                break
            u = ops[i - 1]
            steps.append((u, v, min(end[u], start[v]) - max(start[u], ready), False))
            v = u
        elif via >= 0:
            steps.append((via, v, ready - end[via] if crossed else 0.0, crossed))
            v = via
        else:
            break
    return steps


def detours(problem: PlacementProblem, assignment: np.ndarray, result: SimResult,
            chain: list[tuple[int, int, float, bool]]) -> list[tuple[np.ndarray, int, float]]:
    """Stretches of the realized critical ``chain`` (:func:`critical_chain`) that leave a device and come
    back to it: the problem nodes of the stretch's ops, the device it left and the transfers' time both
    ways, most first; only those whose nodes may all run on that device and whose other work there (beyond
    the stretch's own ops) is at most those transfers (a stretch through a layer whose weight gradient runs
    beside it would bring that along).
    Moved back as one, they save both transfers; moved one at a time, no single move does (the LSTM
    seq2seq's training step under layer groups, 4 devices: an Adam update of the encoder's kernel on another
    device sent 1 MB each way, 4.3 ms each, on the chain's way to its end).

    Examples
    --------
    ``a -> b -> c -> d``, 1 s each, 1 byte between, links of 1 byte/s; ``b`` and ``c`` on device 1: they are
    a detour of 2 s from device 0.

    >>> from cost_models import TensorEdge
    >>> p = PlacementProblem.build(names=list("abcd"), compute_s=np.ones((4, 2)), memory_bytes=np.zeros(4),
    ...     capacity_bytes=np.full(2, np.inf), tensors=[TensorEdge(i, (i + 1,), 1.0) for i in range(3)],
    ...     bandwidth=np.ones((2, 2)), latency=np.zeros((2, 2)))
    >>> a = np.array([0, 1, 1, 0])
    >>> r = simulate_step(p, a)
    >>> [(nodes.tolist(), d, held) for nodes, d, held in detours(p, a, r, critical_chain(p, a, r))]
    [([1, 2], 0, 2.0)]
    """
    sched = problem.schedule_view()
    group = sched.group
    fine = np.asarray(assignment, dtype=int)[group]
    found: dict[tuple[tuple[int, ...], int], float] = {}
    # the device the chain came back to, the transfer's time, the stretch's ops since
    back: tuple[int, float, list[int]] | None = None
    for u, v, held, crossed in chain:  # backwards in time
        if back is not None:
            back[2].append(u)
        if not crossed:
            continue
        if back is not None and fine[u] == back[0]:  # it had left the device it came back to
            ops, d = back[2][:-1], back[0]
            nodes = tuple(sorted({int(x) for x in group[ops]}))
            # the work the move adds beside the stretch itself must not outweigh the transfers it saves
            # (nor may a node be unable to run there)
            there = problem.compute_s[list(nodes), d]
            if np.isfinite(there).all() and there.sum() - sched.durations_s[ops, d].sum() <= back[1] + held:
                found[(nodes, d)] = max(found.get((nodes, d), 0.0), back[1] + held)
        back = (int(fine[v]), held, [u])
    return [(np.array(nodes, dtype=int), d, held) for (nodes, d), held in _ranked(found, result)]


def gathering_sets(problem: PlacementProblem) -> list[np.ndarray]:
    """Sets of problem nodes that :func:`descend` also moves as one, heaviest first: each node with at least
    :data:`MIN_FAN_IN` input nodes, together with those of its inputs whose every tensor goes to it alone.

    The weight gradients of an unrolled recurrent layer are one per time step, off the critical path, and
    summed by one node: moved alone, each sends a weight-sized tensor back to the sum, so no single move
    pays, while the gradients and their sum moved together send the sum once. On the LSTM seq2seq's
    training step (4 devices, links of 100 µs + 250 bytes/µs) moving its two such sets of 33 nodes took a
    plan from 106.3 to 84.1 ms.

    Examples
    --------
    ``a``, ``b`` and ``c`` feed ``d`` alone; ``e`` feeds ``d`` and ``f``:

    >>> from cost_models import TensorEdge
    >>> p = PlacementProblem.build(names=list("abcdef"), compute_s=np.ones((6, 2)), memory_bytes=np.zeros(6),
    ...     capacity_bytes=np.full(2, np.inf), tensors=[TensorEdge(0, (3,), 1.0), TensorEdge(1, (3,), 1.0),
    ...     TensorEdge(2, (3,), 1.0), TensorEdge(4, (3, 5), 1.0)], bandwidth=np.ones((2, 2)), latency=np.zeros((2, 2)))
    >>> [s.tolist() for s in gathering_sets(p)]
    [[0, 1, 2, 3]]
    """
    def compute() -> list[np.ndarray]:
        preds, succs = dependencies(problem.n, problem.tensors)
        weight = problem.compute_s.min(axis=1)
        sets = []
        for r in range(problem.n):
            inputs = {u for _, u in preds[r]} - {r}
            if len(inputs) < MIN_FAN_IN:
                continue
            alone = sorted(u for u in inputs if {w for _, w in succs[u]} == {r})
            if alone:
                members = np.array(sorted([r, *alone]), dtype=int)
                sets.append((-float(weight[members].sum()), r, members))
        return [members for _, _, members in sorted(sets, key=lambda x: x[:2])]

    return problem.memo("descent/gathering_sets", compute)


def added_transfer_s(problem: PlacementProblem, assignment: np.ndarray, v: int, dest: int,
                     edges: tuple[list[list[Edge]], list[list[Edge]]] | None = None) -> float:
    """How much longer node ``v``'s inputs take to reach it, plus its outputs to reach their readers, if it
    moved to device ``dest`` (each the largest increase over the tensors, without link queues; 0 when
    the move makes every transfer shorter). ``edges``: :func:`placer.core.problem.dependencies` of the
    problem's nodes and tensors, when asked for many moves.

    Examples
    --------
    ``b`` reads 1000 bytes from ``a`` and sends 10 to ``c``, all on device 0, links of 1000 bytes/s:
    moving ``b`` to device 1 adds 1 s before it and 0.01 s after it.

    >>> from cost_models import TensorEdge
    >>> p = PlacementProblem.build(names=list("abc"), compute_s=np.ones((3, 2)), memory_bytes=np.zeros(3),
    ...     capacity_bytes=np.full(2, np.inf), tensors=[TensorEdge(0, (1,), 1000.0), TensorEdge(1, (2,), 10.0)],
    ...     bandwidth=np.full((2, 2), 1000.0), latency=np.zeros((2, 2)))
    >>> added_transfer_s(p, np.array([0, 0, 0]), 1, 1)
    1.01
    """
    preds, succs = edges if edges is not None else dependencies(problem.n, problem.tensors)
    src, ts, cost = int(assignment[v]), problem.tensors, problem.transfer_s
    before = max((cost(ts[ti], int(assignment[u]), dest) - cost(ts[ti], int(assignment[u]), src)
                  for ti, u in preds[v]), default=0.0)
    after = max((cost(ts[ti], dest, int(assignment[w])) - cost(ts[ti], src, int(assignment[w]))
                 for ti, w in succs[v]), default=0.0)
    return float(max(before, 0.0) + max(after, 0.0))


def descend(problem: PlacementProblem, assignment: np.ndarray, simulations: float) -> np.ndarray:
    """Improve a feasible ``assignment``'s simulated step by single-node moves (see the module docstring),
    within ``simulations`` simulations' worth of simulated ops (a trial that resumes after half the ops
    counts one half).

    Deterministic; never worse than ``assignment`` (returned as it is when no move helps).

    Examples
    --------
    A 3 s op with slack beside a chain of two 1 s ops, all on device 0, free links: moving it to device
    1 shortens the step from 5 s to 3 s.

    >>> from cost_models import TensorEdge
    >>> p = PlacementProblem.build(names=list("abc"), compute_s=np.array([[1.0, 1.0], [1.0, 1.0], [3.0, 3.0]]),
    ...     memory_bytes=np.zeros(3), capacity_bytes=np.full(2, np.inf), tensors=[TensorEdge(0, (1,), 1.0)],
    ...     bandwidth=np.full((2, 2), np.inf), latency=np.zeros((2, 2)))
    >>> descend(p, np.array([0, 0, 0]), simulations=10).tolist()
    [0, 0, 1]
    """
    return _descend(problem, assignment, simulations, None)[0]


def descend_starts(problem: PlacementProblem, starts: Sequence[np.ndarray], simulations: float,
                   steps: Sequence[float] | None = None) -> tuple[np.ndarray, int]:
    """:func:`descend` from the best of several feasible ``starts``: each is descended on an equal part of
    :data:`PROBE_SHARE` of the budget, and the one that got shortest goes on with what is left (what a probe
    did not spend, stopping where no move helped, included). Where each probe would get fewer than
    :data:`MIN_PROBE` simulations, only the shortest start is descended (``steps``: the starts' simulated
    steps where the caller knows them, else they are simulated). Returns the assignment and the index of
    the start it came from.

    Which start descends further is not known beforehand: on the densely connected CNN's training step (4
    devices, op groups, links of 100 µs + 250 bytes/µs) 20 simulations took the best heuristic plan (refined
    CP-SAT on two devices, 461.4 ms) to 386.8 ms and the one-device plan (535.5 ms) to 299.4: moving weight
    gradients off one device pays from the first move, while undoing a scattered plan's transfers takes many.

    Deterministic; never worse than the best start.

    Examples
    --------
    A 3 s op with slack beside a chain of two 1 s ops, free links: from the plan that splits the chain and
    from one device (5 s) both probes reach 3 s, and on equal steps the first start goes on.

    >>> from cost_models import TensorEdge
    >>> p = PlacementProblem.build(names=list("abc"), compute_s=np.array([[1.0, 1.0], [1.0, 1.0], [3.0, 3.0]]),
    ...     memory_bytes=np.zeros(3), capacity_bytes=np.full(2, np.inf), tensors=[TensorEdge(0, (1,), 1.0)],
    ...     bandwidth=np.full((2, 2), np.inf), latency=np.zeros((2, 2)))
    >>> a, which = descend_starts(p, [np.array([0, 1, 0]), np.array([0, 0, 0])], simulations=10)
    >>> a.tolist(), which
    ([1, 1, 0], 0)
    """
    if not starts:
        raise SolverError("descend_starts needs at least one start plan")
    if steps is not None and len(steps) != len(starts):
        raise SolverError(f"descend_starts got {len(steps)} steps for {len(starts)} starts; pass one per start "
                          "(or none, to simulate them)")
    if len(starts) == 1:
        return descend(problem, starts[0], simulations), 0
    share = simulations * PROBE_SHARE / len(starts)
    if share < MIN_PROBE:  # too little to probe: the shortest start, descended on what is left
        if steps is None:
            steps, simulations = [simulate_step(problem, np.asarray(s)).step_time_s for s in starts], \
                simulations - len(starts)
        which = int(np.argmin(steps))
        return descend(problem, starts[which], simulations), which
    probes = [_descend(problem, s, share, None) for s in starts]
    left = simulations - sum(spent for _, _, spent, _ in probes)
    scored = [(np.inf if r is None else r.step_time_s, i) for i, (_, r, _, _) in enumerate(probes)]
    which = min(scored)[1]
    a, result, spent, tried = probes[which]
    if result is None or spent < share:  # nothing to descend, or no move helped
        return a, which
    return _descend(problem, a, left, None, first=result, tried=tried)[0], which


def descend_ordered(problem: PlacementProblem, assignment: np.ndarray, simulations: float
                    ) -> tuple[np.ndarray, tuple[tuple[int, ...], ...]]:
    """:func:`descend` with each plan simulated in the order it would fix: every device runs its ready op
    of highest :func:`~placer.core.objectives.step_priority` first (the least time any plan needs after it
    ends), where the executor would take them as they became ready. Returns the assignment and
    that order (:func:`placer.core.order.simulated_order`), to be emitted with it. Only where
    :func:`~placer.core.objectives.orders_by_priority`.

    The executor's order can hide what a move is worth: on the densely connected CNN's training step
    (4 devices, layer groups, links of 100 µs + 250 bytes/µs) moving one convolution's layer to another
    device simulated 577.7 ms in ready order, its weight gradient (61 ms) holding up the input gradient
    the step waits for, against 535.5 ms on one device; by priority it is 487.7 ms.

    Examples
    --------
    A 2 s op ``a`` feeding a 2 s ``c``, and a 3 s ``b`` with no successor, on one device (7 s): moving ``b``
    to device 1 ends the step at 4 s, ``a`` (2 s after it) then ``c`` on device 0.

    >>> from cost_models import TensorEdge
    >>> p = PlacementProblem.build(names=list("abc"), compute_s=np.array([[2.0, 2.0], [3.0, 3.0], [2.0, 2.0]]),
    ...     memory_bytes=np.zeros(3), capacity_bytes=np.full(2, np.inf), tensors=[TensorEdge(0, (2,), 1.0)],
    ...     bandwidth=np.full((2, 2), np.inf), latency=np.zeros((2, 2)))
    >>> a, order = descend_ordered(p, np.array([0, 0, 0]), simulations=10)
    >>> a.tolist(), order
    ([0, 1, 0], ((0, 2), ()))
    """
    priority = step_priority(problem)
    a, result, _, _ = _descend(problem, assignment, simulations, priority, realized=lambda a, r: simulate_step(
        problem, a, order=_order_of(problem, a, r)).step_time_s)
    if result is None:
        result = simulate_step(problem, a, priority=priority)
    return a, _order_of(problem, a, result)


def _order_of(problem: PlacementProblem, assignment: np.ndarray, result: SimResult) -> tuple[tuple[int, ...], ...]:
    """The order a plan fixes from its simulation ``result`` (:func:`placer.core.order.simulated_order`)."""
    sched = problem.schedule_view()
    return simulated_order(result.timeline, sched.durations_s, np.asarray(assignment)[sched.group])


def _descend(problem: PlacementProblem, assignment: np.ndarray, simulations: float,
             priority: list[float] | None,
             realized: Callable[[np.ndarray, SimResult], float] | None = None,
             first: SimResult | None = None, tried: set[tuple] | None = None
             ) -> tuple[np.ndarray, SimResult | None, float, set[tuple]]:
    """:func:`descend`'s moves, each plan simulated in the executor's order or (``priority``) by priority:
    the assignment, its simulation (``None`` where there was nothing to descend), the simulations spent and
    the moves tried (``(node, device)``; ``(-1 - set index, device)`` for gathering sets, ``(nodes, device)`` for
    detours).
    With ``realized`` (the step a plan and its simulation give when run as they would be emitted; one
    simulation's worth each), a move that shortens the simulated step is kept only if it shortens that step
    too. To go on with a descent: ``first``, the assignment's own simulation (with snapshots, in the same
    order), and ``tried``, the moves it tried (not tried again; updated in place)."""
    a = np.array(assignment, dtype=int)
    if problem.k < 2 or problem.n == 0 or simulations < 2:
        return a, None, 0.0, set() if tried is None else tried
    allowed = np.isfinite(problem.compute_s)
    weight = problem.compute_s.min(axis=1)  # on its fastest device (forbidden ones are inf)
    heaviest = np.argsort(-weight, kind="stable")
    memory = np.bincount(a, weights=problem.memory_bytes, minlength=problem.k)
    capacity = problem.capacity_bytes * (1 + 1e-9)
    ops = max(problem.schedule_view().m, 1)
    snapshots = int(min(SNAPSHOTS, max(2, SNAPSHOT_OPS // ops)))
    result, spent = (simulate_step(problem, a, snapshots=snapshots, priority=priority), 1.0) if first is None \
        else (first, 0.0)
    if realized is not None:
        real, spent = realized(a, result), spent + 1.0
    tried = set() if tried is None else tried
    edges = dependencies(problem.n, problem.tensors)  # the nodes' tensors, for added_transfer_s
    sched = problem.schedule_view()
    fine_preds = dependencies(sched.m, sched.tensors, sched.control)[0]  # for critical_moves
    gathered = gathering_sets(problem)
    set_work = np.array([weight[members].sum() for members in gathered])  # decreasing
    heavy_sets = int(np.sum(set_work >= MIN_GATHERED_SHARE * result.step_time_s))
    sets_first = simulations >= SET_TRIALS * (problem.k - 1) * heavy_sets
    while spent < simulations:
        free = slack(problem, a, result)
        chain = critical_chain(problem, a, result, fine_preds)
        # the chain's moves, most held-up time first: single nodes (critical_moves) and detours
        critical = sorted([(-held, 0, (key, np.array([key[0]]), key[1]))
                           for key, held in _critical_weights(problem, a, result, chain)]
                          + [(-held, 1, ((tuple(nodes.tolist()), d), nodes, d))
                             for nodes, d, held in detours(problem, a, result, chain)], key=lambda c: c[:2])
        spent += CRITICAL_PASS
        step = result.step_time_s
        moved = False
        least_busy = np.argsort(result.busy_s, kind="stable").tolist()

        def open_dests(v: int) -> list[int]:
            return [d for d in least_busy if d != a[v] and allowed[v, d] and (v, d) not in tried
                    and memory[d] + problem.memory_bytes[v] <= capacity[d]]

        def set_fits(nodes: np.ndarray, d: int) -> bool:
            """Whether ``nodes`` may all run on device ``d`` and its memory holds those not there yet."""
            return bool(allowed[nodes, d].all()) and \
                memory[d] + problem.memory_bytes[nodes][a[nodes] != d].sum() <= capacity[d]

        def gathering() -> Iterator[tuple[tuple[int, int], np.ndarray, int]]:
            """The gathering sets (:func:`gathering_sets`) that hold enough work, each to the least busy
            device it may go to and has not been tried on."""
            for i, members in enumerate(gathered):
                if set_work[i] < MIN_GATHERED_SHARE * step:
                    break
                key = -1 - i  # apart from the single nodes'
                d = next((d for d in least_busy if (key, d) not in tried and not (a[members] == d).all()
                          and set_fits(members, d)), -1)
                if d >= 0:
                    yield (key, d), members, d

        def moves() -> Iterator[tuple[tuple[int, int], np.ndarray, int]]:
            """Candidate moves ``(key, nodes, device)``: the gathering sets (first where the budget affords
            :data:`SET_TRIALS` trials of each, else after the critical chain's), those of the step's
            realized critical chain (:func:`detours` and :func:`critical_moves`, most held-up time first),
            then single nodes whose added transfers fit
            their slack, heaviest first, then (once those are spent) the rest, each to the least busy device
            it may go to."""
            if sets_first:
                yield from gathering()
            for _, is_detour, (key, nodes, d) in critical:
                if is_detour:
                    if key not in tried and set_fits(nodes, d):
                        yield key, nodes, d
                    continue
                v = key[0]
                dests = open_dests(v)
                if d < 0:
                    d = next((e for e in dests if added_transfer_s(problem, a, v, e, edges) <= free[v]),
                             dests[0] if dests else -1)
                if d in dests:
                    yield (v, d), nodes, d
            if not sets_first:
                yield from gathering()
            later = []
            for v in heaviest[(free[heaviest] > 1e-9 * step) & (weight[heaviest] > 0)].tolist():
                dests = open_dests(v)
                fits = next((d for d in dests if added_transfer_s(problem, a, v, d, edges) <= free[v]), None)
                if fits is not None:
                    yield (v, fits), np.array([v]), fits
                elif dests:
                    later.append(((v, dests[0]), np.array([v]), dests[0]))
            yield from later

        for key, nodes, dest in moves():
            src = a[nodes]  # a copy (fancy indexing)
            tried.add(key)
            a[nodes] = dest
            # a trial that will not end before the current step stops as soon as that shows (inf)
            trial = simulate_step(problem, a, snapshots=snapshots, resume=result, stop_above=step * (1 - 1e-9),
                                  priority=priority)
            spent += trial.simulated_ops / ops
            if trial.step_time_s < step * (1 - 1e-9) and realized is not None:
                value, spent = realized(a, trial), spent + 1.0
                if value < real * (1 - 1e-9):
                    real = value
                else:  # shorter as simulated, not as it would run: not kept
                    trial = result
            if trial.step_time_s < step * (1 - 1e-9):
                np.subtract.at(memory, src, problem.memory_bytes[nodes])
                memory[dest] += problem.memory_bytes[nodes].sum()
                result, moved = trial, True
                spent += SLACK_PASS
                break
            a[nodes] = src
            if spent >= simulations:
                break
        if not moved:
            break
    return a, result, spent, tried
