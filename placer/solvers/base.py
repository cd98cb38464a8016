"""The options every solver takes, the result every solver returns, and the solver registry's decorator."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Protocol

import numpy as np

from ..core.objectives import DEFAULT_OBJECTIVE, get_objective
from ..core.problem import PlacementProblem
from ..errors import SolverError

#: Search budget (seconds of estimated work) when none is given, for every entry point.
DEFAULT_TIME_LIMIT_S = 5.0
#: ``auto`` coarsens problems with more nodes than this before CP-SAT.
DEFAULT_MAX_NODES = 1500


@dataclass(frozen=True, kw_only=True)
class SolveOptions:
    """Knobs shared by all solvers.

    Attributes
    ----------
    time_limit_s : float
        Budget of the search (estimated work, see :mod:`placer.solvers.auto`).
    seed : int
        Random seed; same problem + options + seed gives the same plan.
    workers : int
        Search threads for CP-SAT (deterministic mode is used either way).
    warm_start : numpy.ndarray or None
        An assignment to start from (hint).
    objective : str
        Name in :data:`placer.core.objectives.OBJECTIVES` that solutions are scored by.
    max_nodes : int
        ``auto`` coarsens problems with more nodes than this before searching.
    coarsen_keys : tuple or None
        A hashable per problem node (e.g. its layer scope); nodes sharing one
        are merged first when ``auto`` coarsens.
    layer_positions : tuple of float or None
        Per problem node, its position along the forward pass, shared by a
        layer's forward, gradient and update nodes
        (:meth:`placer.core.build.BuiltProblem.layer_positions`): the order
        ``layer_dp`` splits; ``None`` (not a training graph with layers): it declines.
    ordered : bool
        Whether plans may fix each device's order of its ops (:mod:`placer.core.order`; ``auto`` then runs
        the ordering heuristics and ordered descent too). ``False``: every plan runs in the executor's order.
    bounded : bool
        Whether solutions carry the objective's own lower bound; ``auto``
        turns it off for the auxiliary problems it searches (coarsened, or on
        fewer devices), whose bounds do not bound the problem itself and can
        take seconds (the memory objective's LP).
    """

    time_limit_s: float = DEFAULT_TIME_LIMIT_S
    seed: int = 0
    workers: int = 2
    warm_start: np.ndarray | None = None
    objective: str = DEFAULT_OBJECTIVE
    max_nodes: int = DEFAULT_MAX_NODES
    coarsen_keys: tuple | None = None
    layer_positions: tuple[float, ...] | None = None
    ordered: bool = True
    bounded: bool = True


@dataclass(frozen=True)
class Solution:
    """An assignment with its objective, a proven lower bound and provenance.

    ``status`` is ``"optimal"`` (gap proven zero), ``"feasible"`` (a search
    solver stopped at the time limit) or ``"heuristic"`` (no proof attempted).
    ``log`` lists what a composite solver (``auto``) tried, with outcomes;
    ``scored`` maps each algorithm it ran on the full problem to the value of
    that algorithm's plan (so baselines it already scored are not solved again),
    and each it skipped for lack of time to ``None``. ``order`` is empty where each
    device runs its ops in the executor's order, else per device the fine ops
    (:meth:`~placer.core.problem.PlacementProblem.schedule_view`) in the order
    the plan runs them (:mod:`placer.core.order`; a simulated objective's value
    counts it).
    """

    assignment: np.ndarray
    objective: float
    lower_bound: float
    solver: str
    wall_s: float
    status: str
    log: tuple[str, ...] = ()
    scored: Mapping[str, float | None] = field(default_factory=dict)
    order: tuple[tuple[int, ...], ...] = ()

    @property
    def gap(self) -> float:
        """Relative gap ``(objective - lower_bound) / objective`` (0 if optimal)."""
        if self.objective <= 0 or not np.isfinite(self.objective):
            return 0.0 if self.objective == self.lower_bound else float("inf")
        return float(max(0.0, (self.objective - self.lower_bound) / self.objective))


def finish(problem: PlacementProblem, assignment: np.ndarray, name: str, t0: float, options: SolveOptions,
           status: str = "heuristic", bound: float = 0.0, order: tuple[tuple[int, ...], ...] = ()
           ) -> Solution | None:
    """Score ``assignment`` (with each device's ``order`` of its ops, for a simulated objective: others
    drop it) by ``options.objective``; ``None`` if it is infeasible.

    The lower bound is the larger of the objective's own bound (unless
    ``options.bounded`` is off) and ``bound`` (e.g. one proven by a search
    solver), capped at the value.
    """
    obj = get_objective(options.objective)
    a = np.asarray(assignment, dtype=int)
    order = order if obj.simulated and options.ordered else ()
    value = obj.score(problem, a, order)
    if not np.isfinite(value):
        return None
    lb = min(max(obj.bound(problem) if options.bounded else 0.0, bound), value)
    return Solution(a, value, lb, name, time.perf_counter() - t0, status, order=order)


class SolverFn(Protocol):
    def __call__(self, problem: PlacementProblem, options: SolveOptions) -> Solution | None: ...


#: A precondition: ``None`` when a solver can place ``problem``, else the reason it cannot.
Precondition = Callable[[PlacementProblem], "str | None"]


@dataclass(frozen=True)
class RegisteredSolver:
    """A solver function with the preconditions declared at its registration."""

    name: str
    fn: SolverFn
    requires: tuple[Precondition, ...] = ()

    def __call__(self, problem: PlacementProblem, options: SolveOptions) -> Solution | None:
        return self.fn(problem, options)

    def unmet(self, problem: PlacementProblem) -> str | None:
        """Why this solver cannot place ``problem`` (the first unmet precondition), or ``None``."""
        for check in self.requires:
            reason = check(problem)
            if reason is not None:
                return reason
        return None


def register(name: str, registry: dict[str, RegisteredSolver],
             requires: tuple[Precondition, ...] = ()) -> Callable[[SolverFn], SolverFn]:
    """Decorator adding a solver to ``registry`` under ``name``, with its preconditions."""

    def deco(fn: SolverFn) -> SolverFn:
        if name in registry:
            raise SolverError(f"solver {name!r} registered twice")
        registry[name] = RegisteredSolver(name, fn, tuple(requires))
        return fn

    return deco
