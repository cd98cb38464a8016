"""The solver registry (filled at import by ``@solver`` decorators) and the preconditions solvers declare."""

from __future__ import annotations

from typing import Callable

from ..core.problem import PlacementProblem
from ..errors import GraphError
from .base import Precondition, RegisteredSolver, SolverFn, register

SOLVERS: dict[str, RegisteredSolver] = {}


def solver(name: str, requires: tuple[Precondition, ...] = ()) -> Callable[[SolverFn], SolverFn]:
    """Register a solver function under ``name``; ``requires`` are checked before it is run."""
    return register(name, SOLVERS, requires)


def two_devices(problem: PlacementProblem) -> str | None:
    """Precondition: exactly two devices (an s-t cut has two sides)."""
    return None if problem.k == 2 else f"it places on exactly 2 devices, not {problem.k}"


def acyclic_schedule(problem: PlacementProblem) -> str | None:
    """Precondition: the fine graph is a DAG (list schedulers walk it in topological order)."""
    try:
        problem.schedule_order()
    except GraphError as e:
        return str(e)
    return None
