"""Planned execution order: each device runs its ops in an order the plan fixes (no TensorFlow).

TensorFlow's executor runs a device's ready ops in the order they became
ready (the simulator's ``"fifo"``; ``"lifo"`` on one-thread workers), not by
how urgent they are: an op with slack that became ready first holds up the
step's critical op. On the InceptionV3 training step on 4 devices with free
links, ``cp_etf``'s plan (the most critical arrived op first) simulates 1.1%
above the lower bound in its own order and 10.8% above it in ready order
(2026-12-04, ``benchmarks/results/execution_order.md``).

A plan's *order* fixes it: per device, the fine ops
(:meth:`~placer.core.problem.PlacementProblem.schedule_view`) in the order
they run. The emitted graph gets a control edge from each op to the next on
its device (:func:`order_edges`; :mod:`placer.tf.emit`), and the simulator
sees the same edges, so the predicted step is the step of the order that
runs. An order comes from a list schedule that places every op after its
inputs (:func:`placer.solvers.listsched.cp_heft`, ``cp_etf``), or from a
simulation that runs each device's ready ops by priority
(:func:`simulated_order`; :mod:`placer.solvers.descent`), so its edges keep
the graph acyclic; :func:`check_order` checks one read from a file.

Examples
--------
>>> order_edges(((0, 2, 3), (1,), ()))
[(0, 2), (2, 3)]
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import PlanError

#: Values of the ``execution_order`` option: ``"auto"`` lets a plan fix each device's order of its ops where that
#: is predicted faster (the search keeps the better of both kinds of plan); ``"executor"`` leaves the order to
#: TensorFlow's executor in every plan; ``"simulated"`` searches as ``"executor"``, then (``placer.autoplace``
#: only) fixes the order the plan's own simulation ran its longer ops in, where the devices' executors run one
#: op at a time depth first (one-thread workers, ready order ``"lifo"``): :func:`timeline_order`.
EXECUTION_ORDERS = ("auto", "executor", "simulated")
#: ``placer.solve``'s default: a graph's plan is judged by the simulator alone.
DEFAULT_EXECUTION_ORDER = "auto"
#: ``placer.autoplace``'s default: a model runs on real devices, and there a planned order has not been seen to
#: pay yet. On two one-thread gRPC workers (``benchmarks/results/order_measured.md``, 2026-12-04) cp_etf's
#: ordered plans against the same assignments in the executor's order measured -3% to +4% (InceptionV3
#: inference 54.11 against 52.66 ms, as predicted; a Transformer training step 20.47 against 21.13); the
#: predicted gains are on devices that run one op at a time in ready order (GPUs' streams), where none was
#: at hand to measure.
#: Since 2026-12-07 it is ``"simulated"``: on two one-thread gRPC workers the order of a one-copy plan's own
#: simulation, fixed (or one worker where the ordered plan is no longer faster), measured 0.93-1.21x as fast as
#: the executor's order of the same plans over two runs of five workloads (median 1.04x) and was predicted with
#: a median |error| of 4.9% against 15.4% (``benchmarks/results/order_training.md``, ``order_training_run2.md``):
#: the executor ran a layer's weight gradient before the input gradient the other worker waited for, as the
#: graph's edge order had it, which no ready order predicts.
MODEL_EXECUTION_ORDER = "simulated"
#: Ops shorter than this (seconds, on their device) are left out of an order: they run when the executor gets
#: to them. They are what Grappler rewrites (a fused partner's time lands on its fused op, so it profiles at
#: ~0; shape computations and duplicates it merges), and an order through ops that Grappler merges can close a
#: cycle in the graph it optimises: a Transformer training step ordered through every op failed Grappler's
#: topological sort on two gRPC workers (2026-12-04), which then skipped its optimisations.
MIN_ORDERED_OP_S = 20e-6
#: Ops shorter than this are left out of a simulated order (:func:`timeline_order`). Ordering the ops of 1 ms or
#: more made the 105M-parameter MLP's and 4-tower MLP's steps follow their simulation, but left InceptionV3's
#: split (22 of 2,217 ops ordered) predicted -10.7%; its ops of 50 µs or more (120) -5.5%, and the Transformer's
#: training step -0.2% (150 ops; 2026-12-07, ``benchmarks/results/order_training.md``).
SIMULATED_ORDER_MIN_OP_S = 50e-6


def order_edges(order: Sequence[Sequence[int]]) -> list[tuple[int, int]]:
    """The control edges that make each device run its ops in ``order``: each op to the next on its device."""
    return [(int(a), int(b)) for ops in order for a, b in zip(ops, ops[1:])]


def timed_only(order: Sequence[Sequence[int]], durations_s: np.ndarray, fine_assignment: np.ndarray,
               min_s: float = MIN_ORDERED_OP_S) -> tuple[tuple[int, ...], ...]:
    """``order`` without the ops that take less than ``min_s`` on their device (``durations_s``: ``(ops,
    devices)`` seconds; ``fine_assignment``: each op's device); a device left with one op or none has no order.

    Examples
    --------
    >>> timed_only(((0, 1, 2), (3, 4)), np.array([1e-3, 0.0, 2e-3, 1e-3, 1e-6])[:, None], np.zeros(5, dtype=int))
    ((0, 2), ())
    """
    fine = np.asarray(fine_assignment, dtype=int)
    seconds = durations_s[np.arange(fine.size), fine] if fine.size else np.zeros(0)
    out = []
    for ops in order:
        kept = tuple(int(v) for v in ops if seconds[v] >= min_s)
        out.append(kept if len(kept) > 1 else ())
    return tuple(out)


def simulated_order(timeline: Sequence[tuple[int, int, float, float]], durations_s: np.ndarray,
                    fine_assignment: np.ndarray) -> tuple[tuple[int, ...], ...]:
    """Each device's ops in the order a simulation ran them (``timeline``: ``(op, device, start, end)`` in
    start order, :class:`cost_models.SimResult`), less those too short to order (:func:`timed_only`). Every
    op starts after its inputs end, so the order's edges keep the graph acyclic.

    Examples
    --------
    >>> simulated_order([(0, 0, 0.0, 1.0), (2, 1, 0.0, 1.0), (1, 0, 1.0, 2.0), (3, 1, 1.0, 2.0)], np.ones((4, 2)),
    ...                 np.array([0, 0, 1, 1]))
    ((0, 1), (2, 3))
    """
    order: list[list[int]] = [[] for _ in range(durations_s.shape[1])]
    for v, d, *_ in timeline:
        order[d].append(int(v))
    return timed_only(order, durations_s, fine_assignment)


def check_order(order: Sequence[Sequence[int]], fine_assignment: np.ndarray) -> None:
    """Check that ``order`` lists each op at most once, on the device ``fine_assignment`` gives it (one
    sequence per device).

    Raises
    ------
    PlanError
        Names what is wrong: the plan's order does not belong to its assignment.

    Examples
    --------
    >>> check_order(((0, 1), (2,)), np.array([0, 0, 1]))
    >>> check_order(((0, 2), (1,)), np.array([0, 0, 1]))
    Traceback (most recent call last):
    ...
    placer.errors.PlanError: the plan's op order puts op 2 on device 0, its assignment on device 1; ...
    """
    fine = np.asarray(fine_assignment, dtype=int)
    seen: set[int] = set()
    for d, ops in enumerate(order):
        for v in ops:
            v = int(v)
            if not 0 <= v < fine.size:
                raise PlanError(f"the plan's op order names op {v}, which the graph (of {fine.size} ops) lacks; "
                                "solve again")
            if v in seen:
                raise PlanError(f"the plan's op order lists op {v} twice; solve again")
            if fine[v] != d:
                raise PlanError(f"the plan's op order puts op {v} on device {d}, its assignment on device "
                                f"{int(fine[v])}; re-apply the order with the assignment it was made with, "
                                "drop the order of a changed assignment (op_order={} in the plan) or solve again")
            seen.add(v)


def timeline_order(timeline: Sequence[tuple[int, int, float, float]], k: int,
                   min_s: float = SIMULATED_ORDER_MIN_OP_S) -> tuple[tuple[int, ...], ...]:
    """Per device of ``k``, the nodes of a simulated ``timeline`` (``(node, device, start, end)``) that ran
    ``min_s`` or longer, in the order they started there (ties: in the timeline's order, which lists an op
    after its inputs' producers): the order that makes a run follow its simulation where the executor would
    choose otherwise (``execution_order="simulated"``). Every edge of the order, like every input, goes from an
    op to one that started no earlier, so the graph stays acyclic.

    Examples
    --------
    >>> timeline_order([(0, 0, 0.0, 2.0), (3, 1, 0.0, 1.0), (1, 0, 2.0, 2.0), (2, 0, 2.0, 5.0)], 2, min_s=0.5)
    ((0, 2), (3,))
    """
    out: list[list[int]] = [[] for _ in range(k)]
    for v, d, s, e in sorted(timeline, key=lambda t: t[2]):  # stable
        if e - s >= min_s:
            out[d].append(int(v))
    return tuple(tuple(ops) for ops in out)
