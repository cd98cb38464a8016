"""The latency bound's split of the heaviest path as a plan (no TensorFlow).

:func:`~placer.core.objectives.critical_path_bound` bounds a step from below by splitting the graph's
heaviest path into *runs*, stretches of it whose problem nodes share a device, the next run on another
device after its input crossed a link. The split it settles on is the cheapest it could not rule out:
where hops are expensive (a densely connected block sends every earlier layer's features to the next
layer), that is a few long runs, and those runs placed on devices in turn are a plan no single-node move
reaches. On the densely connected CNN's forward pass (layer groups, 4 devices, links of 100 µs +
250 bytes/µs) the bound's split put the stem and the first two layers on one device and the rest on
another: 152.5 ms, where every other heuristic and the descent from them ended at 160.2 ms (2026-12-05).

Each run's nodes go to the device, other than the previous run's, with the least work so far (its nodes'
work on it included; a node already placed by an earlier run keeps its device); every other node follows
the nearest path node in the tensor graph (:func:`~placer.solvers.heavy.followers`).
"""

from __future__ import annotations

import time

import numpy as np

from ..core.objectives import RUNS_MAX_PATH, critical_path_split
from ..core.problem import PlacementProblem
from .base import Solution, SolveOptions, finish
from .heavy import followers
from .registry import solver


def runs_plan(problem: PlacementProblem, split: tuple[tuple[int, ...], ...]) -> np.ndarray:
    """A device per problem node from a split of a path of fine ops into runs (see the module docstring).

    Examples
    --------
    A chain a -> b -> c -> d split after b, on two devices: a and b on one, c and d on the other.

    >>> from cost_models import TensorEdge
    >>> p = PlacementProblem.build(names=list("abcd"), compute_s=np.ones((4, 2)), memory_bytes=np.zeros(4),
    ...     capacity_bytes=np.full(2, np.inf), tensors=[TensorEdge(i, (i + 1,), 1.0) for i in range(3)],
    ...     bandwidth=np.ones((2, 2)), latency=np.zeros((2, 2)))
    >>> runs_plan(p, ((0, 1), (2, 3))).tolist()
    [0, 0, 1, 1]
    """
    group = problem.schedule_view().group
    cost = problem.compute_s  # inf where a node may not run
    device: dict[int, int] = {}
    load = np.zeros(problem.k)
    prev = -1
    for run in split:
        nodes = list(dict.fromkeys(int(v) for v in group[list(run)]))
        placed = [device[v] for v in nodes if v in device and device[v] != prev]
        new = [v for v in nodes if v not in device]
        if placed:
            d = placed[0]
        else:
            total = load + cost[new].sum(axis=0)
            if prev >= 0:
                total[prev] = np.inf
            d = int(np.argmin(total))
        for v in new:
            device[v] = d
        load[d] += cost[new, d].sum()
        prev = d
    anchors = np.array(sorted(device), dtype=int)
    a = np.array([device[v] for v in anchors.tolist()])[followers(problem, anchors)]
    allowed = np.isfinite(problem.compute_s)
    return np.where(allowed[np.arange(problem.n), a], a, np.argmax(allowed, axis=1))


def split_path(problem: PlacementProblem) -> str | None:
    """Precondition: the latency bound split the heaviest path into two runs or more.

    Examples
    --------
    A two-op chain: the bound keeps it on one device (that plan is ``single``'s).

    >>> from cost_models import TensorEdge
    >>> p = PlacementProblem.build(names=list("ab"), compute_s=np.ones((2, 2)), memory_bytes=np.zeros(2),
    ...     capacity_bytes=np.full(2, np.inf), tensors=[TensorEdge(0, (1,), 1.0)], bandwidth=np.ones((2, 2)),
    ...     latency=np.zeros((2, 2)))
    >>> split_path(p)
    'the latency bound keeps its heaviest path on one device'
    """
    split = critical_path_split(problem)
    if not split:
        return (f"the latency bound did not split a path (one device, devices sharing a processor, or a path "
                f"of more than {RUNS_MAX_PATH} ops)")
    return "the latency bound keeps its heaviest path on one device" if len(split) < 2 else None


@solver("path_runs", requires=(split_path,))
def path_runs(problem: PlacementProblem, options: SolveOptions) -> Solution | None:
    """The latency bound's split of the heaviest path, its runs on devices in turn (see the module
    docstring); ``None`` where the plan does not fit the devices' memory.

    Examples
    --------
    Node X holds ``x1`` (2 s), which feeds ``y1`` (2 s) of node Y, and ``x2`` (1.5 s), which feeds nothing:
    one device takes 5.5 s; the bound's split of the path ``x1 -> y1`` puts Y on the other device, and ``x2``
    runs beside ``y1``: 4 s, the critical path.

    >>> from cost_models import TensorEdge
    >>> from placer.core.problem import Schedule
    >>> sched = Schedule(np.array([[2.0] * 2, [1.5] * 2, [2.0] * 2]), (TensorEdge(0, (2,), 0.0),), (),
    ...     np.array([0, 0, 1]))
    >>> p = PlacementProblem.build(names=["X", "Y"], compute_s=np.array([[3.5] * 2, [2.0] * 2]),
    ...     memory_bytes=np.zeros(2), capacity_bytes=np.full(2, np.inf), tensors=[], bandwidth=np.ones((2, 2)),
    ...     latency=np.zeros((2, 2)), schedule=sched)
    >>> s = path_runs(p, SolveOptions(objective="latency"))
    >>> s.assignment.tolist(), s.objective
    ([0, 1], 4.0)
    """
    t0 = time.perf_counter()
    return finish(problem, runs_plan(problem, critical_path_split(problem)), "path_runs", t0, options)
