"""Contiguous stages by dynamic programming: the best split into pipeline stages (no TensorFlow).

``contiguous_dp`` cuts the problem's nodes into at most ``k`` contiguous
stages, stage ``m`` on device ``m`` (a device may get none): each stage is
the difference of two ideals (sets closed under predecessors), over every
ideal when there are few (Tarnawski et al.'s exact DP), else over the
prefixes of one topological order. It minimises
the pipelined max load of the throughput objective: a stage's
compute on its device, plus the time to receive each tensor that enters it
and to send each tensor that leaves it (Tarnawski et al., NeurIPS'20). Stages respect each device's memory capacity and the
devices a node may use; colocation holds because the problem's nodes are
colocation groups already.

``layer_dp`` runs the same DP over the prefixes of the graph's layers in
order (``SolveOptions.layer_positions``), stages made of whole chunks of
layers, so that a training graph is cut between layers, each with its
gradient and update ops, at any size.

Transfers are priced at the mean off-diagonal link (exact when every link
is the same, as in the NeurIPS'20 workloads); the plan is then scored by
the caller's objective like every other solver's.

Cost: ``O(k N²)`` time and ``O(N²)`` memory in the ideals used (``N ≤ n + 1``
for one order), so it declines problems above :data:`MAX_NODES` nodes
(``auto`` then relies on its other heuristics).

Examples
--------
A chain of four 1 s nodes on two devices, tensors free: two stages of two.

>>> import numpy as np
>>> from cost_models import TensorEdge
>>> from placer.core.problem import PlacementProblem
>>> p = PlacementProblem.build(names=list("abcd"), compute_s=np.ones((4, 2)), memory_bytes=np.zeros(4),
...     capacity_bytes=np.full(2, np.inf), tensors=[TensorEdge(i, (i + 1,), 0.0) for i in range(3)],
...     bandwidth=np.full((2, 2), 1e9), latency=np.zeros((2, 2)))
>>> from placer.solvers.base import SolveOptions
>>> s = contiguous_dp(p, SolveOptions(objective="throughput"))
>>> s.assignment.tolist(), s.objective
([0, 0, 1, 1], 2.0)
"""

from __future__ import annotations

import time

import networkx as nx
import numpy as np

from ..core.objectives import get_objective
from ..core.problem import PlacementProblem, dependencies
from ..errors import SolverError
from .base import Solution, SolveOptions, finish
from .registry import solver

#: Largest problem (nodes) the DP takes: its cost matrices are ``(n + 1)²`` floats each.
MAX_NODES = 2500


def small_enough(problem: PlacementProblem) -> str | None:
    """Precondition: at most :data:`MAX_NODES` nodes (the DP is quadratic in them)."""
    return None if problem.n <= MAX_NODES else f"it is quadratic in nodes: {problem.n} > {MAX_NODES}"


def _tensor_costs(problem: PlacementProblem, traffic: bool) -> np.ndarray:
    """Per tensor edge: its bytes (``traffic``), else seconds to move it over the mean off-diagonal link."""
    if traffic:
        return np.array([float(t.nbytes) for t in problem.tensors])
    k = problem.k
    off = ~np.eye(k, dtype=bool)
    if k == 1:
        return np.zeros(len(problem.tensors))
    lat = float(np.mean(np.asarray(problem.latency)[off]))
    inv_bw = float(np.mean(1.0 / np.asarray(problem.bandwidth, dtype=float)[off]))
    return np.array([0.0 if t.nbytes <= 0 else t.count * lat + t.nbytes * inv_bw for t in problem.tensors])


def boundary_costs(problem: PlacementProblem, pos: np.ndarray, traffic: bool = False,
                   size: int | None = None) -> np.ndarray:
    """``C[i, j]``: receive + send seconds of the stage holding order positions ``i … j-1`` (shape ``(N+1, N+1)``,
    ``N = size`` positions, default one per node), or with ``traffic`` the bytes it receives. Nodes may share
    a position (a chunk of the order that stages take whole).

    A tensor is received once by a stage that holds one of its consumers
    but not its producer, and sent once by a stage that holds its producer
    and not all of its consumers (consumers may sit before the producer in
    the order where groups form cycles). Built as a 2-D difference array:
    each tensor adds one rectangle of ``(i, j)`` per consumer and two for its producer.
    """
    n = problem.n if size is None else size
    tau = _tensor_costs(problem, traffic)
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []

    def rect(r0: int, r1: int, c0: int, c1: int, v: float) -> None:  # rows [r0, r1) x cols [c0, c1)
        if r0 < r1 and c0 < c1:
            rows.extend((r0, r1, r0, r1))
            cols.extend((c0, c0, c1, c1))
            vals.extend((v, -v, -v, v))

    for t, cost in zip(problem.tensors, tau):
        s = int(pos[t.src])
        dsts = sorted({int(pos[d]) for d in t.dsts} - {s})
        if cost <= 0 or not dsts:
            continue
        # received: stage [i, j) without s whose first consumer is d (i in (prev, d], j past d)
        prev = -1
        for d in (x for x in dsts if x < s):  # stages ending at or before s
            rect(prev + 1, d + 1, d + 1, s + 1, cost)
            prev = d
        prev = s
        for d in (x for x in dsts if x > s):  # stages starting after s
            rect(prev + 1, d + 1, d + 1, n + 1, cost)
            prev = d
        if traffic:
            continue
        # sent: every stage holding s (i <= s < j) but those that hold every consumer too
        rect(0, s + 1, s + 1, n + 1, cost)
        rect(0, min(dsts[0], s) + 1, max(dsts[-1], s) + 1, n + 1, -cost)
    diff = np.zeros((n + 2, n + 2))
    if vals:
        np.add.at(diff, (np.asarray(rows), np.asarray(cols)), np.asarray(vals))
    return np.cumsum(np.cumsum(diff, axis=0), axis=1)[: n + 1, : n + 1]


def split_edges(problem: PlacementProblem) -> list[tuple[int, int]]:
    """The dependencies a contiguous split keeps (sorted).

    Every edge between two nodes, except inside a cycle (a strongly connected
    set of groups, such as a training graph's groups that each hold a layer's
    forward and gradient ops), where an edge against ``problem.order`` is
    mirrored: ``u -> v`` with ``v`` earlier in the order becomes ``v -> u``.
    This is Tarnawski et al.'s rule for training graphs: the forward graph
    stays contiguous, a gradient op follows its layer, and a gradient op with
    no layer of its own (its colour class has no forward node) sits between
    the layers it connects. The result is acyclic: between cycles the edges
    follow their condensation, inside one they follow the order.

    Examples
    --------
    Two groups that feed each other (``a`` first in the order): ``a -> b`` twice.

    >>> import numpy as np
    >>> from cost_models import TensorEdge
    >>> p = PlacementProblem.build(names=["a", "b"], compute_s=np.ones((2, 1)), memory_bytes=np.zeros(2),
    ...     capacity_bytes=np.full(1, np.inf), tensors=[TensorEdge(0, (1,), 1.0), TensorEdge(1, (0,), 1.0)],
    ...     bandwidth=np.ones((1, 1)), latency=np.zeros((1, 1)))
    >>> split_edges(p)
    [(0, 1)]
    """
    preds, _ = dependencies(problem.n, problem.tensors, problem.control)
    edges = sorted({(u, v) for v in range(problem.n) for _, u in preds[v]})
    g = nx.DiGraph(edges)
    g.add_nodes_from(range(problem.n))
    if nx.is_directed_acyclic_graph(g):
        return edges
    comp = {v: i for i, c in enumerate(nx.strongly_connected_components(g)) for v in c}
    rank = np.empty(problem.n, dtype=np.int64)
    rank[np.asarray(problem.order, dtype=int)] = np.arange(problem.n)
    kept = {(u, v) if comp[u] != comp[v] or rank[u] < rank[v] else (v, u) for u, v in edges}
    return sorted(kept)


#: Largest ``ideals² × (nodes + tensors)`` the exact DP over every ideal takes (its cost matrices are
#: ``ideals²``); above it the DP runs over the prefixes of one topological order only. At the cap it takes
#: ~0.13 s on the 2-core reference machine (2.5 ns per unit), more than ``auto`` charges it (the one-order
#: estimate), which stays within its time-limit slack.
MAX_IDEAL_WORK = 5e7


def ideals(problem: PlacementProblem, limit: int, edges: list[tuple[int, int]] | None = None) -> np.ndarray | None:
    """Every ideal (set of nodes closed under predecessors along ``edges``, default :func:`split_edges`)
    as rows of an ``(N, n)`` bool matrix, or ``None`` when there are more than ``limit``.

    Found breadth-first from the empty set, adding one node whose predecessors
    are all in; rows come in order of size, then of discovery (deterministic).
    """
    n = problem.n
    preds = [0] * n
    for u, v in split_edges(problem) if edges is None else edges:
        preds[v] |= 1 << u
    found = [0]
    seen = {0}
    frontier = [0]
    while frontier:
        nxt = []
        for ideal in frontier:
            for v in range(n):
                if not (ideal >> v) & 1 and not preds[v] & ~ideal:
                    grown = ideal | (1 << v)
                    if grown not in seen:
                        if len(found) >= limit:
                            return None
                        seen.add(grown)
                        found.append(grown)
                        nxt.append(grown)
        frontier = nxt
    bits = np.array([[(i >> v) & 1 for v in range(n)] for i in found], dtype=bool)
    return bits.reshape(len(found), n)


def ideal_costs(problem: PlacementProblem, member: np.ndarray,
                traffic: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``(comm, subset)`` over pairs of ideals ``(a, b)``: the stage ``b \\ a``'s receive + send seconds
    (with ``traffic``: the bytes it receives), and whether ``a ⊆ b`` (only those pairs are stages).

    A tensor is received by the stage iff its producer is outside it and a
    consumer inside, and sent iff its producer is inside and a consumer
    outside (the rule of :func:`boundary_costs`); with ``a ⊆ b`` the producer
    is inside iff it is in ``b`` and not ``a``, and the stage holds
    ``count[b] - count[a]`` of its consumers.
    """
    tau = _tensor_costs(problem, traffic)
    keep = [i for i, c in enumerate(tau) if c > 0 and set(problem.tensors[i].dsts) - {problem.tensors[i].src}]
    N, n = member.shape
    f = member.astype(np.float64)
    subset = (f @ (~member).T.astype(np.float64)) == 0
    comm = np.zeros((N, N))
    if keep:
        tensors = [problem.tensors[i] for i in keep]
        cost = tau[keep]
        src = np.array([t.src for t in tensors])
        consumers = np.zeros((n, len(tensors)))
        for j, t in enumerate(tensors):
            consumers[list(set(t.dsts) - {t.src}), j] = 1.0
        total = consumers.sum(axis=0)
        has_src = member[:, src]  # (N, T)
        count = f @ consumers  # consumers of each tensor inside each ideal
        for a in range(N):
            b = np.flatnonzero(subset[a])  # the stages b \ a
            inside = has_src[b] & ~has_src[a]
            held = count[b] - count[a]
            crossing = ~inside & (held > 0.5) if traffic else np.where(inside, held < total - 0.5, held > 0.5)
            comm[a, b] = crossing @ cost
    return comm, subset


def _node_sums(p: PlacementProblem) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per node: its memory, its work on each device (0 where not allowed), and 1 per device it may not run
    on (``(n,)``, ``(n, k)``, ``(n, k)``): what a stage's totals add up."""
    compute = np.asarray(p.compute_s, dtype=float)
    finite = np.isfinite(compute)
    return np.asarray(p.memory_bytes, dtype=float), np.where(finite, compute, 0.0), (~finite).astype(np.float64)


def _ideal_sums(p: PlacementProblem, member: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per ideal (rows of ``member``): :func:`_node_sums` added over its nodes."""
    f = member.astype(np.float64)
    return tuple(f @ x for x in _node_sums(p))  # type: ignore[return-value]


def _best_stages(p: PlacementProblem, sums: tuple[np.ndarray, np.ndarray, np.ndarray], comm: np.ndarray,
                 subset: np.ndarray, traffic: bool = False) -> list[tuple[int, int]] | None:
    """Devices ``0 … k-1`` in turn each take the stage ``b \\ a`` between two ideals (possibly empty),
    minimising the max load (with ``traffic``: the bytes received, summed over stages); per device its
    ``(a, b)``, or ``None`` when no split fits. ``sums`` are :func:`_ideal_sums` (ideal 0 empty, the last
    every node)."""
    mem, work_all, bad_all = sums
    N = mem.shape[0]
    k = p.k
    seg_mem = mem[None, :] - mem[:, None]
    best = np.full(N, np.inf)
    best[0] = 0.0  # ideal 0 is the empty set: before any device, nothing is placed
    choices = np.zeros((k, N), dtype=int)
    for m in range(k):
        work, bad = work_all[:, m], bad_all[:, m]
        cost = comm if traffic else work[None, :] - work[:, None] + comm
        ok = subset & (np.abs(bad[None, :] - bad[:, None]) < 0.5) & (seg_mem <= p.capacity_bytes[m] * (1 + 1e-9))
        cost = np.where(ok, cost, np.inf)
        np.fill_diagonal(cost, 0.0)  # device m takes nothing
        total = best[:, None] + cost if traffic else np.maximum(best[:, None], cost)
        choices[m] = np.argmin(total, axis=0)
        best = total[choices[m], np.arange(N)]
    full = N - 1  # the last ideal is every node
    if not np.isfinite(best[full]):
        return None
    stages = []
    j = full
    for m in range(k - 1, -1, -1):
        i = int(choices[m, j])
        stages.append((i, j))
        j = i
    return stages[::-1]


def _split_order(problem: PlacementProblem, edges: list[tuple[int, int]]) -> list[int]:
    """A topological order of ``edges`` (acyclic), ties by position in ``problem.order``: that order
    itself where it is topological."""
    g = nx.DiGraph(edges)
    g.add_nodes_from(range(problem.n))
    rank = {v: i for i, v in enumerate(problem.order)}
    return list(nx.lexicographical_topological_sort(g, key=rank.__getitem__))


@solver("contiguous_dp", requires=(small_enough,))
def contiguous_dp(problem: PlacementProblem, options: SolveOptions) -> Solution | None:
    """The best split into contiguous stages on devices ``0 … k-1``, by dynamic programming: the least max
    load, or for the ``memory`` objective the least bytes crossing devices (each stage under its device's
    memory either way).

    Over every ideal of the nodes' dependency order (:func:`split_edges`) when there are few
    enough (``ideals² × (nodes + tensors)`` at most :data:`MAX_IDEAL_WORK`:
    Tarnawski et al.'s DP, exact over all contiguous splits), else over the
    prefixes of one topological order of :func:`split_edges` (``problem.order`` where that is one).
    """
    t0 = time.perf_counter()
    p = problem
    n = p.n
    traffic = get_objective(options.objective).cpsat_model == "traffic"
    limit = int(np.sqrt(MAX_IDEAL_WORK / max(1, n + len(p.tensors))))
    edges = split_edges(p)
    member = ideals(p, limit, edges) if limit > n + 1 else None
    if member is not None:
        comm, subset = ideal_costs(p, member, traffic)
    else:
        order = np.asarray(_split_order(p, edges), dtype=int)
        pos = np.empty(n, dtype=int)
        pos[order] = np.arange(n)
        member = np.zeros((n + 1, n), dtype=bool)  # prefix i of the order: its first i nodes
        member[:, order] = np.tri(n + 1, n, -1, dtype=bool)
        comm = boundary_costs(p, pos, traffic)
        subset = np.triu(np.ones((n + 1, n + 1), dtype=bool))
    stages = _best_stages(p, _ideal_sums(p, member), comm, subset, traffic)
    if stages is None:
        return None
    a = np.zeros(n, dtype=int)
    for m, (i, j) in enumerate(stages):
        a[member[j] & ~member[i]] = m
    return finish(p, a, "contiguous_dp", t0, options)


#: The most chunks ``layer_dp`` cuts its order into (its cost matrices are ``(chunks + 1)²``; a chunk holds
#: whole positions, so a layer is cut from its gradient and update ops only when one position outgrows it).
MAX_CHUNKS = 500


def layer_chunks(positions: np.ndarray, max_chunks: int = MAX_CHUNKS) -> np.ndarray:
    """Per node, its chunk of the order sorted by ``positions`` (ties by index): runs of equal position stay in
    one chunk, consecutive runs merged while a chunk holds fewer than ``n / max_chunks`` nodes (so at most
    ``max_chunks + 1`` chunks).

    >>> layer_chunks(np.array([2.0, 0.0, 1.0, 0.0, 2.0]), max_chunks=5).tolist()
    [2, 0, 1, 0, 2]
    >>> layer_chunks(np.array([2.0, 0.0, 1.0, 0.0, 2.0]), max_chunks=2).tolist()
    [1, 0, 0, 0, 1]
    """
    positions = np.asarray(positions, dtype=float)
    n = len(positions)
    order = np.lexsort((np.arange(n), positions))
    run = np.concatenate([[0], np.cumsum(positions[order][1:] != positions[order][:-1])]).astype(int)
    sizes = np.bincount(run)
    target = n / max(max_chunks, 1)
    chunk_of_run = np.zeros(len(sizes), dtype=int)
    chunk, held = 0, 0
    for r, size in enumerate(sizes):
        if held >= target:
            chunk, held = chunk + 1, 0
        chunk_of_run[r] = chunk
        held += size
    out = np.empty(n, dtype=int)
    out[order] = chunk_of_run[run]
    return out


@solver("layer_dp")
def layer_dp(problem: PlacementProblem, options: SolveOptions) -> Solution | None:
    """The best split of the layer order into contiguous stages on devices ``0 … k-1`` (the objective of
    :func:`contiguous_dp`: max load, or bytes crossing for ``memory``); ``None`` without
    ``options.layer_positions`` or when no split fits.

    The order sorts nodes by ``options.layer_positions`` (a layer's forward, gradient and update nodes share
    one, :func:`placer.core.build.layer_positions`): a split between positions cuts the model between layers
    and never parts a layer from its gradients, which a topological order of a training graph does (its
    forward pass comes before every gradient). Stages take whole chunks (:func:`layer_chunks`), so any
    problem size costs at most ``(MAX_CHUNKS + 1)²`` per device.

    Examples
    --------
    Four 1 s nodes, tensors free, two layers (positions 0 and 1): one layer per device.

    >>> from cost_models import TensorEdge
    >>> p = PlacementProblem.build(names=list("abcd"), compute_s=np.ones((4, 2)), memory_bytes=np.zeros(4),
    ...     capacity_bytes=np.full(2, np.inf), tensors=[TensorEdge(i, (i + 1,), 0.0) for i in range(3)],
    ...     bandwidth=np.full((2, 2), 1e9), latency=np.zeros((2, 2)))
    >>> s = layer_dp(p, SolveOptions(objective="throughput", layer_positions=(1.0, 0.0, 1.0, 0.0)))
    >>> s.assignment.tolist(), s.objective
    ([1, 0, 1, 0], 2.0)

    Raises
    ------
    SolverError
        ``layer_positions`` does not give one position per node.
    """
    t0 = time.perf_counter()
    if options.layer_positions is None:
        return None
    positions = np.asarray(options.layer_positions, dtype=float)
    if positions.shape != (problem.n,):
        raise SolverError(f"layer_positions has {positions.size} entries for {problem.n} nodes; pass one per "
                          "problem node (BuiltProblem.layer_positions) or None")
    chunk = layer_chunks(positions)
    count = int(chunk.max()) + 1 if problem.n else 0
    traffic = get_objective(options.objective).cpsat_model == "traffic"

    def prefix(values: np.ndarray) -> np.ndarray:  # per prefix i (the chunks before i): the sum of ``values``
        per_chunk = np.zeros((count,) + values.shape[1:])
        np.add.at(per_chunk, chunk, values)
        return np.concatenate([np.zeros((1,) + values.shape[1:]), np.cumsum(per_chunk, axis=0)])

    sums = tuple(prefix(x) for x in _node_sums(problem))
    comm = boundary_costs(problem, chunk, traffic, size=count)
    subset = np.triu(np.ones((count + 1, count + 1), dtype=bool))
    stages = _best_stages(problem, sums, comm, subset, traffic)
    if stages is None:
        return None
    a = np.zeros(problem.n, dtype=int)
    for m, (i, j) in enumerate(stages):
        a[(chunk >= i) & (chunk < j)] = m
    return finish(problem, a, "layer_dp", t0, options)
