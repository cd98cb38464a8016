"""The solver registry (filled at import by ``@solver`` decorators)."""

from __future__ import annotations

from .base import SolverFn, register

SOLVERS: dict[str, SolverFn] = {}


def solver(name: str):
    """Register a solver function under ``name``."""
    return register(name, SOLVERS)
