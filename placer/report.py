"""Stage 5a — the placement report (JSON; HTML comes later)."""

from __future__ import annotations

import json
import math
import os
from typing import Any

import numpy as np

from cost_models import SimResult

from .devices import DeviceSet
from .errors import AutoplaceError
from .opgraph import COMPUTE_US, MEMORY_BYTES, OP_TYPE, OpGraph, graph_summary
from .plan import Plan

REPORT_VERSION = 1


def _clean(x: Any) -> Any:
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


def build_report(plan: Plan, op_graph: OpGraph, devset: DeviceSet, sim: SimResult,
                 stage_seconds: dict[str, float]) -> dict[str, Any]:
    """Everything a person needs to judge a plan, as plain data."""
    g = op_graph.graph
    names = list(devset.names)
    idx = {d: i for i, d in enumerate(names)}
    resident = np.zeros(len(names))
    for op, dev in plan.assignment.items():
        resident[idx[dev]] += g.nodes[op][MEMORY_BYTES]
    devices = []
    for i, d in enumerate(devset.devices):
        devices.append({
            "name": d.name, "kind": d.kind, "memory_capacity_bytes": d.memory_bytes, "speed": d.speed,
            "ops": plan.ops_per_device()[d.name], "resident_bytes": resident[i],
            "simulated_busy_s": sim.busy_s[i], "predicted_peak_memory_bytes": sim.peak_memory_bytes[i],
        })
    ops = [{"name": op, "type": g.nodes[op][OP_TYPE], "device": plan.assignment[op],
            "compute_us": g.nodes[op][COMPUTE_US]} for op in op_graph.topological_ops()]
    timeline = [{"op": ops[v]["name"], "device": names[d], "start_s": s, "end_s": e}
                for v, d, s, e in sim.timeline]
    return _clean({
        "report_version": REPORT_VERSION,
        "plan": {k: v for k, v in plan.to_dict().items() if k != "assignment"},
        "graph": graph_summary(op_graph),
        "devices": devices,
        "traffic_bytes": {"devices": names, "matrix": sim.link_bytes},
        "simulation": {"step_time_s": sim.step_time_s, "timeline": timeline},
        "stage_seconds": stage_seconds,
        "cost_model": {
            "compute": "measured per op (TF step stats), median of repeats",
            "links": {f"{names[i]}->{names[j]}": {"bandwidth_bytes_per_s": link.bandwidth_bytes_per_s,
                                                   "latency_s": link.latency_s}
                      for (i, j), link in devset.links.items()},
            "links_note": "link costs are planning defaults or user DeviceSpec values, not calibrated",
        },
        "ops": ops,
    })


def write_report(data: dict[str, Any], path: str | os.PathLike) -> str:
    """Write ``data`` as JSON to ``path`` (``.json``); returns the path.

    Raises
    ------
    AutoplaceError
        For a suffix other than ``.json`` (HTML reports are not built yet).
    """
    path = os.fspath(path)
    if not path.endswith(".json"):
        raise AutoplaceError(f"report path {path!r}: only .json reports exist so far; use a .json path")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)
    return path
