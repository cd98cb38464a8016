"""k-device max-load placement as a CP-SAT model (OR-Tools).

Sections: data → variables → constraints → objective → solve → decode.

Two models, chosen by the objective's ``cpsat_model``: ``max_load`` (the
pipelined throughput objective; also the proxy searched for ``latency``) and
``traffic`` (the ``memory`` objective: least bytes crossing devices).

* ``x[v, d]`` — node ``v`` runs on device ``d`` (only for allowed pairs);
* ``send[t, d]`` ≥ ``x[src, d] - x[w, d]`` for each consumer ``w``: device
  ``d`` sends tensor ``t`` (once, however many devices receive it);
* ``recv[t, d]`` ≥ ``x[w, d] - x[src, d]``: device ``d`` receives ``t``;
* memory per device ≤ capacity; every node on exactly one device;
* minimise ``M`` ≥ every device's compute + send + receive time, or the
  bytes received summed over devices.

Costs are scaled to integers by rounding *down*, so the solver's bound is a
valid lower bound of the true objective; the returned objective is always
re-evaluated exactly by the objective. Transfers are costed on the cheapest
link, so the bound stays valid when links differ; the evaluation uses the
real links. A ``latency`` solve reports no CP-SAT bound (max-load does not
bound a makespan), only the critical-path bound.
The search runs in CP-SAT's deterministic mode (``interleave_search``) with
``max_deterministic_time`` as its budget, so the same problem and seed give
the same plan; a wall-clock cap of 8× the limit + 5 s is kept as a safety
net, and a warning says when it cut a search short (that plan may not repeat).
One deterministic second took 1.3–4.2 wall seconds on the 2-core reference
machine (CP-SAT 9.15, two interleaved workers, which overshoot the budget by
up to 2×; one worker keeps it but often failed to repair the hint).

**Process isolation.** OR-Tools and TensorFlow each bundle their own native
abseil/protobuf; with TensorFlow imported first, CP-SAT crashed the process
(segmentation fault in ``CpSolver.Solve``, TF 2.21 + OR-Tools 9.15). So when
TensorFlow is loaded in this process, the model is solved in a child Python
process (``placer.solvers._child``) that never imports TensorFlow;
the problem and the solution travel as pickles over pipes. The child imports
nothing from the current directory (:mod:`placer.core.processes`).
"""

from __future__ import annotations

import enum
import logging
import math
import pickle
import subprocess
import sys
import time
from dataclasses import dataclass

import numpy as np

from ..errors import SolverError
from ..core.objectives import get_objective
from ..core.processes import child_environment, python_module_command
from ..core.problem import PlacementProblem
from .base import Solution, SolveOptions, finish
from .registry import solver

log = logging.getLogger(__name__)

#: Integer resolution of the scaled objective.
_RESOLUTION = 1_000_000


class CpSatStatus(enum.Enum):
    """How a CP-SAT search ended (its ``CpSolverStatus``, named for people)."""

    OPTIMAL = "optimal"
    FEASIBLE = "feasible (time limit)"
    INFEASIBLE = "infeasible (no plan exists)"
    TIMED_OUT = "no feasible plan within the time limit"
    INVALID = "invalid model"


@dataclass(frozen=True)
class CpSatResult:
    """A CP-SAT outcome: its status and, when feasible, the scored solution."""

    status: CpSatStatus
    solution: Solution | None


def solve_cpsat(problem: PlacementProblem, options: SolveOptions) -> CpSatResult:
    """Solve the model with CP-SAT under ``options.time_limit_s`` (deterministic time).

    Runs in a child process when TensorFlow is loaded here (see the module docstring).

    Raises
    ------
    SolverError
        If CP-SAT calls its model invalid (a bug in this module: please report it).
    """
    result = _solve_in_child(problem, options) if "tensorflow" in sys.modules else _solve(problem, options)
    if result.status is CpSatStatus.INVALID:
        raise SolverError(f"CP-SAT rejected the model of {problem.n} nodes on {problem.k} devices as invalid; "
                          "this is a bug in autoplace, please report it")
    return result


@solver("cpsat")
def cpsat(problem: PlacementProblem, options: SolveOptions) -> Solution | None:
    """The registered CP-SAT solver: the solution, or ``None`` when none was found (status logged).

    Raises
    ------
    SolverError
        If CP-SAT calls its model invalid (a bug in this module: please report it).
    """
    result = solve_cpsat(problem, options)
    if result.solution is None:
        log.info("CP-SAT: %s", result.status.value)
    return result.solution


def _solve_in_child(problem: PlacementProblem, options: SolveOptions) -> CpSatResult:
    try:
        proc = subprocess.run(python_module_command("placer.solvers._child"), input=pickle.dumps((problem, options)),
                              capture_output=True, env=child_environment(), timeout=4 * options.time_limit_s + 120)
    except subprocess.TimeoutExpired as e:
        raise SolverError(f"the CP-SAT child process did not finish in {e.timeout:.0f} s") from e
    if proc.returncode != 0:
        raise SolverError(f"the CP-SAT child process failed (exit {proc.returncode}): "
                          f"{proc.stderr.decode(errors='replace')[-2000:]}")
    for line in proc.stderr.decode(errors="replace").splitlines():
        if line.strip():
            log.warning("CP-SAT child: %s", line)
    return pickle.loads(proc.stdout)


def _solve(problem: PlacementProblem, options: SolveOptions) -> CpSatResult:
    from ortools.sat.python import cp_model

    t0 = time.perf_counter()
    p = problem
    n, k = p.n, p.k
    model_kind = get_objective(options.objective).cpsat_model
    # --- data
    allowed = np.isfinite(p.compute_s)
    comp = np.where(allowed, p.compute_s, 0.0)
    off = [(i, j) for i in range(k) for j in range(k) if i != j]
    if model_kind == "traffic":
        w = np.array([t.nbytes for t in p.tensors], dtype=float)
        upper = w.sum() * max(k - 1, 1)
    else:  # the cheapest link, so that the model's bound stays a bound with uneven links
        w = np.array([min(p.transfer_s(t, i, j) for i, j in off) if off else 0.0 for t in p.tensors])
        upper = comp.max(axis=1).sum() + 2 * w.sum()
    unit = max(upper / _RESOLUTION, 1e-12)
    c_int = np.floor(comp / unit).astype(np.int64)
    w_int = np.floor(w / unit).astype(np.int64)

    # --- variables
    m = cp_model.CpModel()
    x: dict[tuple[int, int], cp_model.IntVar] = {}
    for v in range(n):
        for d in range(k):
            if allowed[v, d]:
                x[v, d] = m.NewBoolVar(f"x_{v}_{d}")

    def xv(v: int, d: int):
        return x.get((v, d), 0)

    # --- constraints
    for v in range(n):
        m.AddExactlyOne(x[v, d] for d in range(k) if allowed[v, d])
    for d in range(k):
        if math.isfinite(p.capacity_bytes[d]):
            m.Add(sum(int(p.memory_bytes[v]) * x[v, d] for v in range(n)
                      if allowed[v, d] and p.memory_bytes[v] > 0) <= int(p.capacity_bytes[d]))
    load_terms: list[list] = [[] for _ in range(k)]
    if model_kind == "max_load":
        for d in range(k):
            load_terms[d].extend(int(c_int[v, d]) * x[v, d] for v in range(n) if allowed[v, d] and c_int[v, d])
    traffic_terms = []
    for ti, t in enumerate(p.tensors):
        dsts = [u for u in dict.fromkeys(t.dsts) if u != t.src]
        if not dsts or w_int[ti] == 0:
            continue
        for d in range(k):
            r_var = m.NewBoolVar(f"recv_{ti}_{d}")
            for u in dsts:
                m.Add(r_var >= xv(u, d) - xv(t.src, d))
            if model_kind == "traffic":
                traffic_terms.append(int(w_int[ti]) * r_var)
                continue
            s_var = m.NewBoolVar(f"send_{ti}_{d}")
            for u in dsts:
                m.Add(s_var >= xv(t.src, d) - xv(u, d))
            load_terms[d].append(int(w_int[ti]) * s_var)
            load_terms[d].append(int(w_int[ti]) * r_var)
    if p.symmetric and n:
        m.Add(x[p.order[0], 0] == 1)  # devices are interchangeable: break the symmetry

    # --- objective
    if model_kind == "traffic":
        m.Minimize(sum(traffic_terms))
    else:
        horizon = int(sum(int(c) for c in c_int.max(axis=1)) + 2 * int(w_int.sum())) + 1
        makespan = m.NewIntVar(0, horizon, "max_load")
        for d in range(k):
            m.Add(sum(load_terms[d]) <= makespan)
        m.Minimize(makespan)
    if options.warm_start is not None:
        ws = np.asarray(options.warm_start, dtype=int)
        if p.symmetric and n:  # relabel so that the hint satisfies the symmetry break
            first = ws[p.order[0]]
            ws = np.where(ws == first, 0, np.where(ws == 0, first, ws))
        for (v, d), var in x.items():
            m.AddHint(var, int(ws[v] == d))

    # --- solve
    cp = cp_model.CpSolver()
    cp.parameters.max_deterministic_time = float(options.time_limit_s)
    # a safety net only: one deterministic second took up to ~4 wall seconds on the reference machine
    cp.parameters.max_time_in_seconds = 8.0 * float(options.time_limit_s) + 5.0
    cp.parameters.num_workers = max(1, int(options.workers))
    cp.parameters.interleave_search = True
    cp.parameters.random_seed = int(options.seed)
    status = cp.Solve(m)
    log.debug("CP-SAT: %.2f s deterministic, %.2f s wall", cp.deterministic_time, cp.wall_time)
    if cp.wall_time >= cp.parameters.max_time_in_seconds and cp.deterministic_time < options.time_limit_s:
        log.warning("CP-SAT stopped at its wall-clock safety cap (%.0f s) before its deterministic budget; "
                    "this plan may differ from a run on an idle machine", cp.parameters.max_time_in_seconds)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        named = {cp_model.INFEASIBLE: CpSatStatus.INFEASIBLE, cp_model.UNKNOWN: CpSatStatus.TIMED_OUT,
                 cp_model.MODEL_INVALID: CpSatStatus.INVALID}
        return CpSatResult(named[status], None)

    # --- decode
    a = np.array([next(d for d in range(k) if allowed[v, d] and cp.Value(x[v, d])) for v in range(n)], dtype=int)
    exact_for_objective = model_kind == "traffic" or options.objective == "throughput"
    bound = cp.BestObjectiveBound() * unit if exact_for_objective else 0.0
    optimal = status == cp_model.OPTIMAL and exact_for_objective
    return CpSatResult(CpSatStatus.OPTIMAL if status == cp_model.OPTIMAL else CpSatStatus.FEASIBLE,
                       finish(p, a, "cpsat", t0, options, "optimal" if optimal else "feasible", bound))
