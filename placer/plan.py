"""The plan: what was decided, why, and what it is predicted to cost."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping


@dataclass(frozen=True)
class BaselineResult:
    """A baseline placement scored with the same cost model."""

    value: float
    predicted_step_time_s: float


@dataclass(frozen=True)
class Scored:
    """What every solved placement reports about its quality.

    Attributes
    ----------
    objective, unit : str
        What the solver minimised (``latency``, ``throughput``, ``memory``;
        see :mod:`placer.objectives`) and its unit (``s`` or ``bytes``).
    value, lower_bound, gap : float
        The plan's objective value, a proven lower bound of it, and
        ``(value - lower_bound) / value``.
    solver, status : str
        Which algorithm produced the plan; ``optimal``/``feasible``/``heuristic``.
    """

    objective: str
    unit: str
    value: float
    lower_bound: float
    gap: float
    solver: str
    status: str


@dataclass(frozen=True)
class Plan(Scored):
    """A placement of every op, with its objective, bound and prediction.

    The quality fields (objective, unit, value, lower_bound, gap, solver,
    status) are those of :class:`Scored`.

    Attributes
    ----------
    devices : tuple of str
        Target devices (canonical names) in the user's order.
    assignment : Mapping[str, str]
        Op name → device name, for every op of the traced graph.
    solve_time_s : float
    predicted_step_time_s : float
        Simulated one-step latency of the plan.
    baselines : Mapping[str, BaselineResult]
        Single-device, round-robin and contiguous placements, same cost model.
    compression : str
        Cast pair used on cut float edges (``none``, ``bf16``, ``fp16``).
    compressed_edges : int
        Number of (tensor, receiving device) pairs that travel compressed.
    batch_size : int
        Batch size the costs were measured at.
    groups : int
        Nodes the solver saw after coarsening.
    """

    devices: tuple[str, ...] = ()
    assignment: Mapping[str, str] = field(default_factory=dict)
    solve_time_s: float = 0.0
    predicted_step_time_s: float = 0.0
    baselines: Mapping[str, BaselineResult] = field(default_factory=dict)
    compression: str = "none"
    compressed_edges: int = 0
    batch_size: int = 0
    groups: int = 0

    def ops_per_device(self) -> dict[str, int]:
        """Number of ops on each device (devices with none included)."""
        c = Counter(self.assignment.values())
        return {d: c.get(d, 0) for d in self.devices}

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dictionary."""
        d = asdict(self)
        d["assignment"] = dict(self.assignment)
        d["baselines"] = {k: asdict(v) for k, v in self.baselines.items()}
        return d

    def _fmt(self, x: float) -> str:
        return f"{x * 1e3:.3f} ms" if self.unit == "s" else f"{x / 1e6:.3f} MB"

    def to_json(self, **kwargs: Any) -> str:
        """The plan as JSON text."""
        return json.dumps(self.to_dict(), **kwargs)

    def summary(self) -> str:
        """A few human-readable lines about the plan."""
        lines = [
            f"placed {len(self.assignment)} ops ({self.groups} groups) on {len(self.devices)} devices "
            f"with {self.solver} [{self.status}] in {self.solve_time_s:.2f} s",
            f"{self.objective} {self._fmt(self.value)} (lower bound {self._fmt(self.lower_bound)}, "
            f"gap {100 * self.gap:.1f}%), predicted step {self.predicted_step_time_s * 1e3:.3f} ms "
            f"at batch {self.batch_size}",
        ]
        for dev, n in self.ops_per_device().items():
            lines.append(f"  {dev}: {n} ops")
        for name, b in self.baselines.items():
            ratio = b.value / self.value if self.value > 0 else float("nan")
            lines.append(f"  baseline {name}: {self.objective} {self._fmt(b.value)} ({ratio:.2f}x ours), "
                         f"step {b.predicted_step_time_s * 1e3:.3f} ms")
        if self.compression != "none":
            lines.append(f"  {self.compressed_edges} cut edges travel as {self.compression}")
        return "\n".join(lines)
