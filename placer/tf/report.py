"""Stage 5a — the placement report, built from what the stages did (JSON; HTML comes later).

:func:`build_report` takes the stages' own results (the plan, the op graph,
the built problem, where each device kind's costs came from, the emitted
model and the stage timings) and returns a frozen :class:`Report`; nothing
is added to it afterwards. Every time in it is *predicted* by the cost
model, and labelled so; the cost source says whether op times were
measured here, read from the profile cache, or estimated analytically.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass
from typing import Any, Mapping

import numpy as np

from cost_models import SimResult

from ..core.attrs import COMPUTE_US, MEMORY_BYTES, OP_TYPE
from ..core.build import BuiltProblem
from ..core.plan import Plan
from ..core.outputs import REPORT_SUFFIXES, check_output, write_text
from .costs import ComputeCosts
from .emit import EmittedModel
from .opgraph import OpGraph, graph_summary

#: Version of the report's JSON layout.
REPORT_VERSION = 3


def _clean(x: Any) -> Any:
    """JSON-ready: numpy → Python, non-finite floats → None, keys → str."""
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, np.ndarray):
        return _clean(x.tolist())
    if isinstance(x, (np.floating, float)):
        return float(x) if math.isfinite(x) else None
    if isinstance(x, np.integer):
        return int(x)
    return x


@dataclass(frozen=True)
class CostSource:
    """Where the cost model's numbers came from.

    Attributes
    ----------
    compute : Mapping[str, str]
        Device kind → ``measured``, ``measured (cached)`` or ``analytic:<spec>``.
    profiled_with_grappler : bool
        Whether measured op times were taken with TensorFlow's optimizer on.
    analytic_unknown_op_types : Mapping[str, tuple of str]
        Per analytic kind, op types without a formula (bytes-based estimate).
    links : str
        What the link model is (planning defaults or user values; not calibrated by autoplace).
    """

    compute: Mapping[str, str]
    profiled_with_grappler: bool
    analytic_unknown_op_types: Mapping[str, tuple[str, ...]]
    links: str = "planning defaults or DeviceSpec values, not calibrated"


@dataclass(frozen=True)
class Report:
    """Everything a person needs to judge a plan (all times predicted)."""

    plan: Plan
    graph: Mapping[str, Any]
    devices: tuple[Mapping[str, Any], ...]
    traffic_bytes: np.ndarray
    simulation: SimResult
    costs: CostSource
    links: Mapping[str, Mapping[str, float]]
    ops: tuple[Mapping[str, Any], ...]
    compressed_edges: tuple[Mapping[str, Any], ...]
    stage_seconds: Mapping[str, float]

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data (``report_version`` names its layout)."""
        names = list(self.plan.devices)
        timeline = [{"op": self.ops[v]["name"], "device": names[d], "start_s": s, "end_s": e}
                    for v, d, s, e in self.simulation.timeline]
        plan = {k: v for k, v in self.plan.to_dict().items() if k != "assignment"}
        return _clean({
            "report_version": REPORT_VERSION,
            "plan": {**plan, "compressed_edges": len(self.compressed_edges)},
            "compressed_edges": list(self.compressed_edges),
            "graph": dict(self.graph),
            "devices": list(self.devices),
            "traffic_bytes": {"devices": names, "matrix": self.traffic_bytes},
            "simulation": {"predicted_step_time_s": self.simulation.step_time_s, "timeline": timeline},
            "stage_seconds": dict(self.stage_seconds),
            "cost_model": {"compute": dict(self.costs.compute),
                           "profiled_with_grappler": self.costs.profiled_with_grappler,
                           "analytic_unknown_op_types": {k: list(v) for k, v in
                                                         self.costs.analytic_unknown_op_types.items() if v},
                           "links": dict(self.links), "links_source": self.costs.links},
            "ops": list(self.ops),
        })

    def write(self, path: str | os.PathLike) -> str:
        """Write the report as JSON to ``path`` (``.json``); returns the path.

        Raises
        ------
        OutputError
            For a suffix other than ``.json`` (HTML reports are not built yet), or a path that cannot be
            written (an existing report there is left as it was).
        """
        check_output(path, suffixes=REPORT_SUFFIXES)
        write_text(path, json.dumps(self.to_dict(), indent=1))
        return os.fspath(path)


def build_report(plan: Plan, op_graph: OpGraph, built: BuiltProblem, sim: SimResult, costs: ComputeCosts,
                 grappler: bool, emitted: EmittedModel, stage_seconds: Mapping[str, float]) -> Report:
    """The report of one placement; ``sim`` is ``built.simulate`` of the plan."""
    g = op_graph.graph
    devset = built.devices
    names = list(devset.names)
    counts = plan.ops_per_device()
    devices = tuple({
        "name": d.name, "kind": d.kind, "memory_capacity_bytes": d.memory_bytes, "speed": d.speed,
        "ops": counts[d.name], "resident_bytes": plan.device_memory_bytes[i],
        "predicted_busy_s": sim.busy_s[i], "predicted_peak_memory_bytes": sim.peak_memory_bytes[i],
        "predicted_load_s": plan.predicted_device_load_s[i],
    } for i, d in enumerate(devset.devices))
    ops = tuple({"name": op, "type": g.nodes[op][OP_TYPE], "device": plan.assignment[op],
                 "compute_us": g.nodes[op][COMPUTE_US], "memory_bytes": g.nodes[op][MEMORY_BYTES]}
                for op in built.nodes)
    links = {f"{names[i]}->{names[j]}": {"bandwidth_bytes_per_s": link.bandwidth_bytes_per_s,
                                          "latency_s": link.latency_s}
             for (i, j), link in devset.links.items()}
    source = CostSource(dict(costs.source), grappler, dict(costs.unknown_op_types))
    return Report(plan, graph_summary(op_graph), devices, sim.link_bytes, sim, source, links, ops,
                  tuple(asdict(e) for e in emitted.compressed), dict(stage_seconds))
