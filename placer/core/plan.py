"""The plan: what was decided, why, and what it is predicted to cost (no TensorFlow).

One type serves both paths: :func:`placer.solve` returns a :class:`Plan`
of a graph's nodes, :func:`placer.autoplace` keeps one of the model's ops
(``PlacedModel.plan``). A plan saves to versioned JSON and loads back
(:meth:`Plan.to_dict` / :meth:`Plan.from_dict`, :meth:`Plan.save` /
:meth:`Plan.load`), and ``autoplace(model, devices, plan=...)`` re-applies
a saved plan without solving.

Every time in a plan is *predicted* by the cost model (the field names say
so); nothing in it was measured on the devices.

Examples
--------
>>> p = Plan(devices=("/CPU:0", "/CPU:1"), assignment={"a": "/CPU:0", "b": "/CPU:1"}, objective="latency",
...          unit="s", value=0.003, lower_bound=0.002, gap=1 / 3, solver="auto/etf", status="heuristic")
>>> Plan.from_dict(p.to_dict()) == p
True
>>> p.ops_per_device()
{'/CPU:0': 1, '/CPU:1': 1}
"""

from __future__ import annotations

import json
import math
import numbers
import os
from collections import Counter
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Hashable, Mapping

from ..errors import PlanError
from .outputs import write_text
from .validate import MAX_BATCH_SIZE, integer, real

#: The pipeline orders a plan may name (``placer.core.microbatch.PIPELINE_ORDERS``).
_PIPELINES = ("gpipe", "1f1b")

#: Identifies the JSON written by :meth:`Plan.to_dict`.
PLAN_FORMAT = "autoplace-plan"
#: Version of that format; :meth:`Plan.from_dict` reads this and older versions. Version 2 adds ``replicas``,
#: version 3 ``splits``, version 4 ``pairs``; a plan with one copy and no split op is still written as version 1
#: (an older reader places it the same).
PLAN_VERSION = 4


@dataclass(frozen=True)
class BaselineResult:
    """A baseline placement scored by the same cost model (both figures predicted)."""

    value: float
    predicted_step_time_s: float


#: What a :class:`Candidate` runs: the solver's placement of whole ops; every op on one device; a copy of the
#: model per device (data parallelism); the solver's placement with large ops split over devices.
STRATEGIES = ("placement", "one device", "copies", "split")
#: :attr:`Candidate.outcome` of the candidate a plan runs (every other says why it lost).
KEPT = "kept"


@dataclass(frozen=True)
class Candidate:
    """One strategy the search scored for a plan (every figure predicted by the cost model).

    Attributes
    ----------
    strategy : str
        One of :data:`STRATEGIES`.
    solver : str
        The placement's solver (``single`` for one device).
    devices_used : int
        Devices that run ops of one copy.
    replicas, microbatches : int
        Data-parallel copies, and micro-batches per copy.
    splits : int
        Ops split over devices.
    predicted_step_time_s : float or None
        Its simulated step (pipelined or copied where it is; without the plan's measured ``call_overhead_s``;
        ``None``: not scored, see ``outcome``).
    predicted_peak_memory_bytes : float or None
        The largest device's simulated peak (``None``: not simulated; simulated only where it could win).
    outcome : str
        :data:`KEPT`, or why it lost ("slower than …", "over memory", …).
    note : str
        The plan log's sentence on the decision this candidate won or lost (empty: none).

    Examples
    --------
    >>> c = Candidate("copies", "single", 1, 2, 4, 0, 0.010, 2e6, KEPT)
    >>> c.describe()
    'copies: 2 copies × 4 micro-batches, predicted 10.000 ms, peak 1.9 MiB: kept'
    """

    strategy: str
    solver: str
    devices_used: int
    replicas: int
    microbatches: int
    splits: int
    predicted_step_time_s: float | None
    predicted_peak_memory_bytes: float | None
    outcome: str
    note: str = ""

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise PlanError(f"candidate strategy {self.strategy!r} is not one of {STRATEGIES}")
        for name in ("predicted_step_time_s", "predicted_peak_memory_bytes"):  # numpy scalars as JSON numbers
            value = getattr(self, name)
            if isinstance(value, numbers.Real) and not isinstance(value, bool):
                object.__setattr__(self, name, float(value))

    def describe(self) -> str:
        """One line: what ran, its predicted step and peak, and its outcome."""
        shape = (f"{self.replicas} copies × " if self.replicas > 1 else
                 f"{self.devices_used} device{'s' if self.devices_used != 1 else ''} ({self.solver}), ")
        shape += f"{self.microbatches} micro-batch{'es' if self.microbatches != 1 else ''}"
        shape += f", {self.splits} ops split" if self.splits else ""
        peak = ("" if self.predicted_peak_memory_bytes is None else
                f", peak {self.predicted_peak_memory_bytes / 2**20:.1f} MiB")
        step = "" if self.predicted_step_time_s is None else f", predicted {1e3 * self.predicted_step_time_s:.3f} ms"
        return f"{self.strategy}: {shape}{step}{peak}: {self.outcome}"

    def with_outcome(self, outcome: str) -> "Candidate":
        """This candidate with another outcome."""
        return replace(self, outcome=outcome)


@dataclass(frozen=True, kw_only=True)
class Plan:
    """A placement of every node, with its objective, bound and predictions.

    Attributes
    ----------
    devices : tuple of str
        Target devices (canonical names) in the user's order.
    assignment : Mapping
        Node (op name, for a model) → device name, for every node.
    objective, unit : str
        What the solver minimised (``latency``, ``throughput``, ``memory``;
        see :mod:`placer.core.objectives`) and its unit (``s`` or ``bytes``).
    value, lower_bound, gap : float
        The plan's objective value (predicted), a proven lower bound of it,
        and ``(value - lower_bound) / value``.
    solver, status : str
        Which algorithm produced the plan; ``optimal`` / ``feasible`` /
        ``heuristic``, or ``given`` for a re-applied plan.
    solve_time_s : float
        Wall seconds of the solve stage (building the problem, searching, scoring).
    group_by : str
        The grouping the solver placed (see :data:`placer.core.build.GROUPINGS`).
    groups : int
        Problem nodes the solver saw (groups).
    predicted_step_time_s, predicted_max_load_s : float
        The plan under the other objectives: one simulated step, and the
        pipelined maximum device load.
    traffic_bytes : float
        Bytes crossing devices per step.
    predicted_device_load_s, device_memory_bytes : tuple of float
        Per device: compute + communication load, and resident bytes.
    predicted_peak_memory_bytes : tuple of float
        Per device: the simulated step's peak (resident bytes + live tensors;
        for a training step, parameters, optimizer slots, gradients and the
        activations kept for the backward pass). The planner keeps it under
        each device's capacity.
    baselines : Mapping[str, BaselineResult]
        Single-device, round-robin and contiguous placements, same cost model
        (a baseline with no feasible plan is absent, and named in ``log``).
    log : tuple of str
        What the solver tried, in order, with each outcome.
    compression : str
        Cast pair for cut float edges (``none``, ``bf16``, ``fp16``; models only).
    batch_size : int or None
        Batch size the costs were measured at (models only).
    microbatches : int
        Micro-batches each batch runs as (1: no pipeline).
    pipeline : str
        How a pipelined training step orders each device's micro-batches (``gpipe`` or ``1f1b``;
        :data:`placer.core.microbatch.PIPELINE_ORDERS`).
    stages : tuple of str
        The devices in pipeline order, for ``1f1b`` (its warm-up depends on the position).
    replicas : int
        Data-parallel copies of the plan (a forward pass): the devices split in order into this many equal
        groups, each running the plan's placement (mapped from the first group's devices) on its part of the
        batch, as ``microbatches`` micro-batches; the variables live on the first group's devices and each
        other group reads a mirror of them on its own (:mod:`placer.core.replicas`). 1: one copy.
    call_overhead_s : float
        Measured fixed cost of one call of the placed function (in ``predicted_step_time_s``; 0: not measured).
    op_order : Mapping[str, tuple of str]
        Device → its nodes in the order the plan runs them (control edges from each to the next;
        :mod:`placer.core.order`); empty where each device runs its ops in the executor's order. A plan
        run as a pipeline of micro-batches has none.
    splits : Mapping[str, int]
        Ops split over devices (op → parts, :mod:`placer.core.splits`: products by their weight's output columns,
        lookups by their table's rows): the assignment
        places each part, its weight shard and the join; empty: every op whole.
    pairs : tuple of str
        The split products whose next product takes their parts as its input rows (:class:`placer.core.splits.Pair`,
        both named in ``splits``; empty: none).
    candidates : tuple of Candidate
        The strategies :func:`placer.autoplace`'s search scored, in the order scored: the one this plan runs
        has outcome :data:`KEPT`, every other says why it lost (empty: a plan made otherwise).
    """

    devices: tuple[str, ...]
    assignment: Mapping[Hashable, str]
    objective: str
    unit: str
    value: float
    lower_bound: float
    gap: float
    solver: str
    status: str
    solve_time_s: float = 0.0
    group_by: str = "op"
    groups: int = 0
    predicted_step_time_s: float = 0.0
    predicted_max_load_s: float = 0.0
    traffic_bytes: float = 0.0
    predicted_device_load_s: tuple[float, ...] = ()
    device_memory_bytes: tuple[float, ...] = ()
    predicted_peak_memory_bytes: tuple[float, ...] = ()
    baselines: Mapping[str, BaselineResult] = field(default_factory=dict)
    log: tuple[str, ...] = ()
    compression: str = "none"
    batch_size: int | None = None
    microbatches: int = 1
    #: Measured fixed cost of one call of the placed function (included in ``predicted_step_time_s``; 0: not measured).
    call_overhead_s: float = 0.0
    pipeline: str = "gpipe"
    stages: tuple[str, ...] = ()
    op_order: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    replicas: int = 1
    splits: Mapping[str, int] = field(default_factory=dict)
    pairs: tuple[str, ...] = ()
    candidates: tuple[Candidate, ...] = ()

    def scored(self, candidate: Candidate, *, kept: bool) -> "Plan":
        """This plan with ``candidate`` added to :attr:`candidates`; ``kept``: it replaces the kept one (whose
        outcome then names it and both steps), else its outcome stands.

        >>> p = Plan(devices=("/d:0",), assignment={}, objective="latency", unit="s", value=0.0, lower_bound=0.0,
        ...          gap=0.0, solver="x", status="heuristic")
        >>> p = p.scored(Candidate("placement", "x", 2, 1, 1, 0, 0.02, None, KEPT), kept=True)
        >>> p = p.scored(Candidate("copies", "single", 1, 2, 1, 0, 0.01, 1e6, KEPT), kept=True)
        >>> [c.outcome for c in p.candidates]
        ['replaced: copies predicted 10.000 ms against 20.000 ms', 'kept']
        """
        cands = self.candidates
        if kept:
            why = f"replaced by {candidate.strategy}"
            if candidate.predicted_step_time_s is not None:
                why = f"replaced: {candidate.strategy} predicted {1e3 * candidate.predicted_step_time_s:.3f} ms"
            cands = tuple(c.with_outcome(why + ("" if c.predicted_step_time_s is None else
                                                f" against {1e3 * c.predicted_step_time_s:.3f} ms"))
                          if c.outcome == KEPT else c for c in cands)
            candidate = candidate.with_outcome(KEPT)
        return replace(self, candidates=(*cands, candidate))

    def as_candidate(self, step_s: float, *, microbatches: int = 1, note: str = "") -> Candidate:
        """This plan (whole ops, or with :attr:`splits`) as a candidate of the search, predicted at ``step_s``
        in ``microbatches`` (its peak: the simulated one of one micro-batch; not simulated otherwise).

        >>> p = Plan(devices=("/d:0", "/d:1"), assignment={"a": "/d:0", "b": "/d:1"}, objective="latency",
        ...          unit="s", value=0.0, lower_bound=0.0, gap=0.0, solver="x", status="heuristic",
        ...          predicted_peak_memory_bytes=(2e6, 3e6))
        >>> p.as_candidate(0.01).describe()
        'placement: 2 devices (x), 1 micro-batch, predicted 10.000 ms, peak 2.9 MiB: kept'
        """
        peak = max(self.predicted_peak_memory_bytes, default=None) if microbatches == 1 else None
        return Candidate("split" if self.splits else "placement", self.solver, len(set(self.assignment.values())),
                         1, microbatches, len(self.splits), step_s, peak, KEPT, note)

    @property
    def kept(self) -> Candidate | None:
        """The candidate this plan runs (``None``: none recorded)."""
        return next((c for c in reversed(self.candidates) if c.outcome == KEPT), None)

    def ops_per_device(self) -> dict[str, int]:
        """Number of nodes on each device (devices with none included)."""
        c = Counter(self.assignment.values())
        return {d: c.get(d, 0) for d in self.devices}

    # -- JSON ----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (node keys as strings; non-finite numbers as ``None``)."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["devices"] = list(self.devices)
        d["assignment"] = {str(k): v for k, v in self.assignment.items()}
        d["baselines"] = {k: asdict(v) for k, v in self.baselines.items()}
        d["predicted_device_load_s"] = list(self.predicted_device_load_s)
        d["device_memory_bytes"] = list(self.device_memory_bytes)
        d["predicted_peak_memory_bytes"] = list(self.predicted_peak_memory_bytes)
        d["log"] = list(self.log)
        d["stages"] = list(self.stages)
        d["op_order"] = {dev: list(ops) for dev, ops in self.op_order.items()}
        for k, v in d.items():
            if isinstance(v, float) and not math.isfinite(v):
                d[k] = None
        d["splits"] = dict(self.splits)
        d["candidates"] = [asdict(c) for c in self.candidates]
        if not self.candidates:
            del d["candidates"]
        if self.replicas == 1:
            del d["replicas"]
        if not self.splits:
            del d["splits"]
        d["pairs"] = list(self.pairs)
        if not self.pairs:
            del d["pairs"]
        version = 4 if self.pairs else 3 if self.splits else 2 if self.replicas > 1 else 1
        return {"format": PLAN_FORMAT, "version": version, **d}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Plan":
        """The plan written by :meth:`to_dict`.

        Raises
        ------
        PlanError
            Not a plan, a newer format version, or missing / malformed fields (named).
        """
        if not isinstance(data, Mapping) or data.get("format") != PLAN_FORMAT:
            raise PlanError(f"not an autoplace plan (expected \"format\": \"{PLAN_FORMAT}\")")
        if not isinstance(data.get("version"), int) or data["version"] > PLAN_VERSION:
            raise PlanError(f"plan format version {data.get('version')!r}; this autoplace reads up to {PLAN_VERSION}")
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        try:
            values["devices"] = tuple(values["devices"])
            values["assignment"] = dict(values["assignment"])
            values["baselines"] = {k: BaselineResult(**v) for k, v in values.get("baselines", {}).items()}
            for name in ("predicted_device_load_s", "device_memory_bytes", "predicted_peak_memory_bytes", "log",
                         "stages"):
                values[name] = tuple(values.get(name, ()))
            values["op_order"] = {str(dev): tuple(str(v) for v in ops)
                                  for dev, ops in values.get("op_order", {}).items()}
            values["splits"] = dict(values.get("splits", {}))
            values["pairs"] = tuple(values.get("pairs", ()))
            values["candidates"] = tuple(Candidate(**c) for c in values.get("candidates", ()))
            for name in ("value", "lower_bound", "gap"):
                values[name] = math.inf if values.get(name) is None else float(values[name])
            plan = cls(**values)
        except (KeyError, TypeError, ValueError, PlanError) as e:
            raise PlanError(f"malformed plan: {e!r}; write plans with Plan.save or Plan.to_dict") from None
        plan = _checked_fields(plan)
        bad = sorted({d for d in plan.assignment.values() if d not in plan.devices}
                     | set(plan.op_order) - set(plan.devices) | set(plan.stages) - set(plan.devices))
        if bad:
            raise PlanError(f"the plan places nodes on {bad}, which its device list {list(plan.devices)} lacks")
        return plan

    def to_json(self, **kwargs: Any) -> str:
        """The plan as JSON text (:meth:`to_dict`)."""
        return json.dumps(self.to_dict(), **kwargs)

    def save(self, path: str | os.PathLike) -> str:
        """Write the plan as JSON to ``path``; returns the path."""
        write_text(path, self.to_json(indent=1))
        return os.fspath(path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Plan":
        """Read a plan written by :meth:`save`.

        Raises
        ------
        PlanError
            The file cannot be read, is not JSON, or is not a plan.
        """
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
            why = "nested too deeply" if isinstance(e, RecursionError) else e
            raise PlanError(f"cannot read plan file {os.fspath(path)!r}: {why}") from None
        return cls.from_dict(data)

    # -- for people ----------------------------------------------------------
    def _fmt(self, x: float) -> str:
        return f"{x * 1e3:.3f} ms" if self.unit == "s" else f"{x / 1e6:.3f} MB"

    def summary(self) -> str:
        """A few human-readable lines about the plan (every time is predicted)."""
        lines = [
            f"placed {len(self.assignment)} ops ({self.groups} groups) on {len(self.devices)} devices "
            f"with {self.solver} [{self.status}] in {self.solve_time_s:.2f} s",
            f"{self.objective} {self._fmt(self.value)} predicted (lower bound {self._fmt(self.lower_bound)}, "
            f"gap {100 * self.gap:.1f}%), predicted step {self.predicted_step_time_s * 1e3:.3f} ms"
            + (f" at batch {self.batch_size}" if self.batch_size is not None else "")
            + (f" (simulated {(self.predicted_step_time_s - self.call_overhead_s) * 1e3:.3f} ms + "
               f"{self.call_overhead_s * 1e3:.3f} ms measured fixed cost per call)" if self.call_overhead_s else ""),
        ]
        used = {d for d in self.assignment.values()}
        if self.replicas > 1:
            lines.append(f"  runs as {self.replicas} data-parallel copies (the devices in {self.replicas} groups, "
                         "the batch split between them; the ops below are the first copy's; a forward pass "
                         "reads a copy of the weights on each group's devices)")
        elif len(self.devices) > 1 and len(used) == 1:
            lines.append(f"  the best plan found uses one device ({next(iter(used))}): spreading the model over "
                         "these devices is predicted not to pay")
        peaks = dict(zip(self.devices, self.predicted_peak_memory_bytes))
        for dev, n in self.ops_per_device().items():
            peak = f", predicted peak memory {peaks[dev] / 2**20:.1f} MiB" if dev in peaks else ""
            lines.append(f"  {dev}: {n} ops{peak}")
        for name, b in self.baselines.items():
            ratio = b.value / self.value if self.value > 0 else float("nan")
            lines.append(f"  baseline {name}: {self.objective} {self._fmt(b.value)} predicted ({ratio:.2f}x ours), "
                         f"predicted step {b.predicted_step_time_s * 1e3:.3f} ms"
                         + (" simulated" if self.call_overhead_s else ""))
        if self.op_order:
            lines.append(f"  each device runs its ops in the planned order ({sum(map(len, self.op_order.values()))} "
                         "ops ordered; control edges in the placed graph)")
        if self.microbatches > 1:
            order = " in the 1F1B order" if self.pipeline == "1f1b" else ""
            lines.append(f"  runs as a pipeline of {self.microbatches} micro-batches per batch{order}")
        if self.splits:
            named = ", ".join(f"{op} ({k} parts)" for op, k in list(self.splits.items())[:4])
            lines.append(f"  {len(self.splits)} ops split over devices (products by output columns, a product "
                         "after another split one by input rows: a pair of products column then row, one sum; "
                         f"lookups by table rows), each part reading its shard of the weight: {named}"
                         + (" …" if len(self.splits) > 4 else ""))
        if len(self.candidates) > 1:
            lines.append("  strategies scored (predicted):")
            lines += [f"    {c.describe()}" for c in self.candidates]
        if self.compression != "none":
            lines.append(f"  compression of cut float edges: {self.compression} (the report lists each compressed edge)")
        return "\n".join(lines)


def _checked_fields(plan: "Plan") -> "Plan":
    """``plan`` (read from a file) with each field of its type and in range, integers as ``int``.

    Raises
    ------
    PlanError
        Naming the field that is not.
    """
    if not plan.devices or not all(isinstance(d, str) and d for d in plan.devices) \
            or len(set(plan.devices)) != len(plan.devices):
        raise PlanError(f"malformed plan: devices must be distinct device names, got {list(plan.devices)[:8]}")
    if not all(isinstance(d, str) for d in plan.assignment.values()):
        raise PlanError("malformed plan: assignment must map each node to a device name")
    for name in ("objective", "unit", "solver", "status", "group_by", "compression"):
        if not isinstance(getattr(plan, name), str):
            raise PlanError(f"malformed plan: {name} must be a string, got {getattr(plan, name)!r}")
    if plan.pipeline not in _PIPELINES:
        raise PlanError(f"malformed plan: pipeline must be one of {list(_PIPELINES)}, got {plan.pipeline!r}")
    microbatches = integer("plan microbatches", plan.microbatches, minimum=1, maximum=MAX_BATCH_SIZE,
                           error=PlanError)
    replicas = integer("plan replicas", plan.replicas, minimum=1, maximum=len(plan.devices), error=PlanError)
    if len(plan.devices) % replicas:
        raise PlanError(f"malformed plan: replicas={replicas} does not divide its {len(plan.devices)} devices")
    batch = None if plan.batch_size is None else integer("plan batch_size", plan.batch_size, minimum=1,
                                                         maximum=MAX_BATCH_SIZE, error=PlanError)
    for name in ("solve_time_s", "predicted_step_time_s", "predicted_max_load_s", "traffic_bytes",
                 "call_overhead_s"):
        real(f"plan {name}", getattr(plan, name), error=PlanError)
    for name in ("predicted_device_load_s", "device_memory_bytes", "predicted_peak_memory_bytes"):
        for x in getattr(plan, name):
            real(f"plan {name} entry", x, error=PlanError)
    for c in plan.candidates:
        for name in ("devices_used", "replicas", "microbatches", "splits"):
            integer(f"plan candidate {name}", getattr(c, name), minimum=0, maximum=MAX_BATCH_SIZE, error=PlanError)
        for name in ("predicted_step_time_s", "predicted_peak_memory_bytes"):
            if getattr(c, name) is not None:
                real(f"plan candidate {name}", getattr(c, name), error=PlanError)
        if not isinstance(c.solver, str) or not isinstance(c.outcome, str) or not isinstance(c.note, str):
            raise PlanError(f"malformed plan: a candidate's solver, outcome and note must be strings, got {c!r}")
    splits = {}
    for op, parts in plan.splits.items():
        if not isinstance(op, str):
            raise PlanError(f"malformed plan: splits must map op names to parts, got {op!r}")
        splits[op] = integer(f"plan splits of {op}", parts, minimum=2, maximum=1 << 16, error=PlanError)
    bad_pairs = [op for op in plan.pairs if not isinstance(op, str) or op not in splits]
    if bad_pairs:
        raise PlanError(f"malformed plan: pairs names {bad_pairs[:3]}, which splits does not split")
    return replace(plan, microbatches=microbatches, batch_size=batch, replicas=replicas, splits=splits)
