"""k-device max-load placement as a CP-SAT model (OR-Tools).

Sections: data → variables → constraints → objective → solve → decode.

* ``x[v, d]`` — node ``v`` runs on device ``d`` (only for allowed pairs);
* ``send[t, d]`` ≥ ``x[src, d] - x[w, d]`` for each consumer ``w``: device
  ``d`` sends tensor ``t`` (once, however many devices receive it);
* ``recv[t, d]`` ≥ ``x[w, d] - x[src, d]``: device ``d`` receives ``t``;
* memory per device ≤ capacity; every node on exactly one device;
* minimise ``M`` ≥ every device's compute + send + receive time.

Costs are scaled to integers by rounding *down*, so the solver's bound is a
valid lower bound of the true objective; the returned objective is always
re-evaluated exactly with :func:`placer.problem.evaluate`. Links are taken as
uniform (mean off-diagonal cost); the exact evaluation uses the real links.
The search runs in CP-SAT's deterministic mode (``interleave_search``) with
``max_deterministic_time`` as its budget, so the same problem and seed give
the same plan; a wall-clock cap of twice the limit is kept as a safety net.

**Process isolation.** OR-Tools and TensorFlow each bundle their own native
abseil/protobuf; with TensorFlow imported first, CP-SAT crashed the process
(segmentation fault in ``CpSolver.Solve``, TF 2.21 + OR-Tools 9.15). So when
TensorFlow is loaded in this process, the model is solved in a child Python
process (``python -m placer.solvers._child``) that never imports TensorFlow;
the problem and the solution travel as pickles over pipes.
"""

from __future__ import annotations

import math
import os
import pickle
import subprocess
import sys
import time

import numpy as np

from ..errors import SolverError
from ..problem import PlacementProblem, evaluate, trivial_lower_bound
from .base import SolveOptions, Solution
from .registry import solver

#: Integer resolution of the scaled objective.
_RESOLUTION = 1_000_000


@solver("cpsat")
def cpsat(problem: PlacementProblem, options: SolveOptions) -> Solution | None:
    """Solve the max-load model with CP-SAT under ``options.time_limit_s``.

    Returns ``None`` when no feasible assignment was found in time (or none
    exists); the caller turns that into :class:`NoFeasiblePlanError`.
    """
    if "tensorflow" in sys.modules:
        return _solve_in_child(problem, options)
    return _solve(problem, options)


def _solve_in_child(problem: PlacementProblem, options: SolveOptions) -> Solution | None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    try:
        proc = subprocess.run([sys.executable, "-m", "placer.solvers._child"], input=pickle.dumps((problem, options)),
                              capture_output=True, env=env, timeout=4 * options.time_limit_s + 120)
    except subprocess.TimeoutExpired as e:
        raise SolverError(f"the CP-SAT child process did not finish in {e.timeout:.0f} s") from e
    if proc.returncode != 0:
        raise SolverError(f"the CP-SAT child process failed (exit {proc.returncode}): "
                          f"{proc.stderr.decode(errors='replace')[-2000:]}")
    return pickle.loads(proc.stdout)


def _solve(problem: PlacementProblem, options: SolveOptions) -> Solution | None:
    from ortools.sat.python import cp_model

    t0 = time.perf_counter()
    p = problem
    n, k = p.n, p.k
    # --- data
    allowed = np.isfinite(p.compute_s)
    comp = np.where(allowed, p.compute_s, 0.0)
    off = [(i, j) for i in range(k) for j in range(k) if i != j]
    w_s = np.array([np.mean([p.transfer_s(t, i, j) for i, j in off]) if off else 0.0 for t in p.tensors])
    upper = comp.max(axis=1).sum() + 2 * w_s.sum()
    unit = max(upper / _RESOLUTION, 1e-12)
    c_int = np.floor(comp / unit).astype(np.int64)
    w_int = np.floor(w_s / unit).astype(np.int64)

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
    for d in range(k):
        load_terms[d].extend(int(c_int[v, d]) * x[v, d] for v in range(n) if allowed[v, d] and c_int[v, d])
    send: dict[tuple[int, int], cp_model.IntVar] = {}
    recv: dict[tuple[int, int], cp_model.IntVar] = {}
    for ti, t in enumerate(p.tensors):
        dsts = [w for w in dict.fromkeys(t.dsts) if w != t.src]
        if not dsts or w_int[ti] == 0:
            continue
        for d in range(k):
            s_var = m.NewBoolVar(f"send_{ti}_{d}")
            r_var = m.NewBoolVar(f"recv_{ti}_{d}")
            for w in dsts:
                m.Add(s_var >= xv(t.src, d) - xv(w, d))
                m.Add(r_var >= xv(w, d) - xv(t.src, d))
            send[ti, d], recv[ti, d] = s_var, r_var
            load_terms[d].append(int(w_int[ti]) * s_var)
            load_terms[d].append(int(w_int[ti]) * r_var)
    horizon = int(sum(int(c) for c in c_int.max(axis=1)) + 2 * int(w_int.sum())) + 1
    makespan = m.NewIntVar(0, horizon, "max_load")
    for d in range(k):
        m.Add(sum(load_terms[d]) <= makespan)
    if p.symmetric and n:
        m.Add(x[p.order[0], 0] == 1)  # devices are interchangeable: break the symmetry

    # --- objective
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
    cp.parameters.max_time_in_seconds = 2.0 * float(options.time_limit_s) + 1.0
    cp.parameters.num_workers = max(1, int(options.workers))
    cp.parameters.interleave_search = True
    cp.parameters.random_seed = int(options.seed)
    status = cp.Solve(m)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None

    # --- decode
    a = np.array([next(d for d in range(k) if allowed[v, d] and cp.Value(x[v, d])) for v in range(n)], dtype=int)
    ev = evaluate(p, a)
    if not ev.feasible:
        return None
    lb = float(max(trivial_lower_bound(p), cp.BestObjectiveBound() * unit))
    return Solution(a, ev.objective, min(lb, ev.objective), "cpsat", time.perf_counter() - t0,
                    "optimal" if status == cp_model.OPTIMAL else "feasible")

