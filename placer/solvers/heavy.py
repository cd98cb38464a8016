"""Heavy-node enumeration: every way to spread a problem's few heaviest nodes over the devices, the other
nodes following them (no TensorFlow).

Where a handful of problem nodes hold most of the work, the decision that matters is which of them share a
device, and there are few such decisions: a layer-grouped LSTM seq2seq training step has two nodes (the
encoder's and the decoder's recurrent layers, each with its gradients and updates) with 94% of the work, a
two-branch CNN's six heaviest layers hold 92%. List schedulers place such nodes one op at a time (the
first op of a group pins it), descent moves one node at a time from a start that may already have put
two of them together; enumerating the heavy nodes' placements sees every combination. On the two-branch
CNN's training step (layer groups, 4 devices, links of 100 µs + 250 bytes/µs) the best of 15 plans
simulated 509.2 ms where ``auto``'s plan was 525.2.

Each other node follows the heavy node nearest to it in the tensor graph (fewest tensors between them,
ties to the heavier tensor, then to the heavier node); a node that may not run on its heavy node's device
goes to the first device it may. On interchangeable devices (same times, memory and links) two labelings that
differ by a renaming of devices give the same plan, so only set partitions of the heavy nodes into at most
``k`` blocks are tried (restricted growth strings: 15 for 4 heavy nodes on 4 devices, 187 for 6);
otherwise every ``k ** h`` labeling.
"""

from __future__ import annotations

import itertools
import time
from typing import Iterator

import numpy as np

from ..core.objectives import get_objective
from ..core.problem import PlacementProblem, dependencies
from .base import Solution, SolveOptions, finish
from .registry import solver

#: The most heavy nodes enumerated ...
MAX_HEAVY = 8
#: ... which must hold at least this share of the work (each node on its fastest device) for the
#: enumeration to run: below it the rest of the plan, placed by proximity alone, decides too much.
MIN_COVER = 0.8
#: The share of the time limit the plans' scoring may take (by estimate: the objective's µs per op per
#: plan): as many heavy nodes as fit, at least two.
SHARE = 0.2


def _work(problem: PlacementProblem) -> np.ndarray:
    """Per node: its time on its fastest device (0 where it may run nowhere, which validation forbids)."""
    c = np.where(np.isfinite(problem.compute_s), problem.compute_s, np.inf).min(axis=1) if problem.n else np.zeros(0)
    return np.where(np.isfinite(c), c, 0.0)


def _heaviest(problem: PlacementProblem) -> np.ndarray:
    return np.argsort(-_work(problem), kind="stable")


def few_heavy_nodes(problem: PlacementProblem) -> str | None:
    """Precondition: the :data:`MAX_HEAVY` heaviest nodes hold :data:`MIN_COVER` of the work, on 2+ devices."""
    if problem.k < 2:
        return "one device: nothing to enumerate"
    w = _work(problem)
    total = float(w.sum())
    top = float(w[_heaviest(problem)[:MAX_HEAVY]].sum())
    if total <= 0 or top < MIN_COVER * total:
        return (f"its {MAX_HEAVY} heaviest nodes hold {0 if total <= 0 else top / total:.0%} of the work, "
                f"less than {MIN_COVER:.0%}")
    return None


def interchangeable(problem: PlacementProblem) -> bool:
    """Whether renaming devices never changes a plan's value: the same times, memory and links everywhere,
    no processor shared by some of them.

    Examples
    --------
    >>> p = PlacementProblem.build(names=["a"], compute_s=np.ones((1, 3)), memory_bytes=np.zeros(1),
    ...     capacity_bytes=np.full(3, np.inf), tensors=[], bandwidth=np.ones((3, 3)), latency=np.zeros((3, 3)))
    >>> interchangeable(p)
    True
    """
    c, k = problem.compute_s, problem.k
    off = ~np.eye(k, dtype=bool)

    def same(x: np.ndarray) -> bool:
        return x.size == 0 or bool(np.all(x == x.flat[0]))

    return (not problem.shared and all(np.array_equal(c[:, 0], c[:, d]) for d in range(1, k))
            and same(np.asarray(problem.capacity_bytes)) and same(np.asarray(problem.bandwidth)[off])
            and same(np.asarray(problem.latency)[off]))


def plan_count(h: int, k: int, identical: bool) -> int:
    """How many labelings of ``h`` heavy nodes :func:`labelings` yields.

    Examples
    --------
    >>> plan_count(4, 4, True), plan_count(6, 4, True), plan_count(3, 2, False)
    (15, 187, 8)
    """
    if not identical:
        return k ** h
    # Stirling numbers of the second kind S(h, j), j <= k: set partitions into at most k blocks
    row = [1] + [0] * k  # S(0, j)
    for i in range(1, h + 1):
        row = [0] + [j * row[j] + row[j - 1] for j in range(1, k + 1)]
    return int(sum(row))


def labelings(h: int, k: int, identical: bool) -> Iterator[tuple[int, ...]]:
    """Every device labeling of ``h`` heavy nodes on ``k`` devices; on interchangeable devices one per set
    partition (restricted growth strings: node ``i`` takes a device already used or the next new one).

    Examples
    --------
    >>> list(labelings(3, 2, True))
    [(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1)]
    """
    if not identical:
        yield from itertools.product(range(k), repeat=h)
        return

    def grow(prefix: tuple[int, ...], used: int) -> Iterator[tuple[int, ...]]:
        if len(prefix) == h:
            yield prefix
            return
        for d in range(min(used + 1, k)):
            yield from grow(prefix + (d,), max(used, d + 1))

    yield from grow((), 0)


def _plan_s(problem: PlacementProblem, options: SolveOptions) -> float:
    """Estimated seconds to score one plan: the objective's µs per fine op."""
    return 1e-6 * get_objective(options.objective).score_us_per_op * max(problem.schedule_view().m, 1)


def heavy_count(problem: PlacementProblem, options: SolveOptions) -> int:
    """How many heavy nodes are enumerated: the most, up to :data:`MAX_HEAVY` and ``problem.n``, whose plans
    fit :data:`SHARE` of the time limit by estimate, at least two (one where the problem has one node)."""
    identical = interchangeable(problem)
    per_plan = _plan_s(problem, options)
    h = min(2, problem.n)
    while (h < min(MAX_HEAVY, problem.n)
           and plan_count(h + 1, problem.k, identical) * per_plan <= SHARE * options.time_limit_s):
        h += 1
    return h


def estimated_s(problem: PlacementProblem, options: SolveOptions) -> float:
    """Estimated seconds of :func:`heavy_enum` (scoring its plans), for ``auto``'s budget."""
    return plan_count(heavy_count(problem, options), problem.k, interchangeable(problem)) * _plan_s(problem, options)


def followers(problem: PlacementProblem, heavy: np.ndarray) -> np.ndarray:
    """Per node, the index in ``heavy`` of the heavy node it follows: the nearest in the (undirected) tensor
    graph by hops, ties to the heavier connecting tensor, then to the earlier heavy node; nodes no tensor
    connects to a heavy one follow the first.

    Examples
    --------
    A chain a - b - c - d with heavy a and d: b follows a, c follows d.

    >>> from cost_models import TensorEdge
    >>> p = PlacementProblem.build(names=list("abcd"), compute_s=np.ones((4, 2)), memory_bytes=np.zeros(4),
    ...     capacity_bytes=np.full(2, np.inf), tensors=[TensorEdge(i, (i + 1,), 1.0) for i in range(3)],
    ...     bandwidth=np.ones((2, 2)), latency=np.zeros((2, 2)))
    >>> followers(p, np.array([0, 3])).tolist()
    [0, 0, 1, 1]
    """
    n = problem.n
    into, out = dependencies(n, problem.tensors)
    nbrs: list[dict[int, float]] = [{} for _ in range(n)]  # per node: bytes exchanged with each neighbour
    for v in range(n):
        for ti, u in into[v] + out[v]:
            nbrs[v][u] = nbrs[v].get(u, 0.0) + problem.tensors[ti].nbytes
    owner = np.full(n, -1)
    owner[heavy] = np.arange(len(heavy))
    frontier = sorted(int(v) for v in heavy)
    while frontier:
        reached: dict[int, tuple[float, int]] = {}  # node -> (-bytes, owner): the best claim this round
        for u in frontier:
            for v, b in nbrs[u].items():
                if owner[v] < 0:
                    claim = (-b, int(owner[u]))
                    if v not in reached or claim < reached[v]:
                        reached[v] = claim
        for v, (_, o) in reached.items():
            owner[v] = o
        frontier = sorted(reached)
    owner[owner < 0] = 0
    return owner


@solver("heavy_enum", requires=(few_heavy_nodes,))
def heavy_enum(problem: PlacementProblem, options: SolveOptions) -> Solution | None:
    """Every placement of the few heaviest nodes, the others following the nearest of them (see the module
    docstring); the best feasible plan by ``options.objective`` (the first of equal ones), or ``None``.

    Examples
    --------
    Two heavy 2 s nodes reading one source, 1 s nodes after each, on two devices with free links: one
    heavy node (and its follower) per device.

    >>> from cost_models import TensorEdge
    >>> p = PlacementProblem.build(names=["src", "a", "b", "a2", "b2"],
    ...     compute_s=np.array([[0.0] * 2, [2.0] * 2, [2.0] * 2, [1.0] * 2, [1.0] * 2]), memory_bytes=np.zeros(5),
    ...     capacity_bytes=np.full(2, np.inf), tensors=[TensorEdge(0, (1, 2), 8.0), TensorEdge(1, (3,), 8.0),
    ...     TensorEdge(2, (4,), 8.0)], bandwidth=np.full((2, 2), np.inf), latency=np.zeros((2, 2)))
    >>> s = heavy_enum(p, SolveOptions(objective="latency"))
    >>> s.assignment[[1, 3]].tolist() != s.assignment[[2, 4]].tolist(), round(s.objective, 6)
    (True, 3.0)
    """
    t0 = time.perf_counter()
    obj = get_objective(options.objective)
    heavy = _heaviest(problem)[:heavy_count(problem, options)]
    owner = followers(problem, heavy)
    allowed = np.isfinite(problem.compute_s)
    first_allowed = np.argmax(allowed, axis=1)
    capacity = problem.capacity_bytes * (1 + 1e-9)
    best, best_value = None, np.inf
    for labels in labelings(len(heavy), problem.k, interchangeable(problem)):
        a = np.asarray(labels)[owner]
        a = np.where(allowed[np.arange(problem.n), a], a, first_allowed)
        if (np.bincount(a, weights=problem.memory_bytes, minlength=problem.k) > capacity).any():
            continue
        value = obj.value(problem, a)
        if value < best_value:
            best, best_value = a, value
    return None if best is None else finish(problem, best, "heavy_enum", t0, options)
