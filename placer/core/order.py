"""Planned execution order: each device runs its ops in an order the plan fixes (no TensorFlow).

TensorFlow's executor runs a device's ready ops in the order they became
ready (the simulator's ``"fifo"``; ``"lifo"`` on one-thread workers), not by
how urgent they are: an op with slack that became ready first holds up the
step's critical op. On the InceptionV3 training step on 4 devices with free
links, list scheduling that runs the most critical ready op first (critical
path priority) ends 0.5% above the lower bound, and the same scheduler in
ready order 8.9% above it (2026-12-04, ``docs/design.md``).

A plan's *order* fixes it: per device, the fine ops
(:meth:`~placer.core.problem.PlacementProblem.schedule_view`) in the order
they run. The emitted graph gets a control edge from each op to the next on
its device (:func:`order_edges`; :mod:`placer.tf.emit`), and the simulator
sees the same edges, so the predicted step is the step of the order that
runs. An order comes from a list schedule that places every op after its
inputs (:func:`placer.solvers.listsched.cp_heft`), so its edges keep the
graph acyclic; :func:`check_order` checks one read from a file.

Examples
--------
>>> order_edges(((0, 2, 3), (1,), ()))
[(0, 2), (2, 3)]
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import PlanError

#: Values of the ``execution_order`` option: ``"auto"`` (default) lets a plan fix each device's order of its ops
#: where that is predicted faster (the search keeps the better of both kinds of plan); ``"executor"`` leaves
#: the order to TensorFlow's executor in every plan.
EXECUTION_ORDERS = ("auto", "executor")
DEFAULT_EXECUTION_ORDER = "auto"


def order_edges(order: Sequence[Sequence[int]]) -> list[tuple[int, int]]:
    """The control edges that make each device run its ops in ``order``: each op to the next on its device."""
    return [(int(a), int(b)) for ops in order for a, b in zip(ops, ops[1:])]


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
                                "or solve again")
            seen.add(v)
