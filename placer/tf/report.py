"""Stage report — the placement report, built from what the stages did.

:func:`build_report` takes the stages' own results (the plan, the op graph,
the built problem, where each device kind's costs came from, the emitted
model and the stage timings) and returns a frozen :class:`Report`; nothing
is added to it afterwards. Every time in it is *predicted* by the cost
model, and labelled so; the cost source says whether op times were
measured here, read from the profile cache, or estimated analytically.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from cost_models import SimResult

from ..core.attrs import BYTES, COMPUTE_US, MEMORY_BYTES, OP_TYPE, OUTPUT_BYTES
from ..core.build import BuiltProblem
from ..core.plan import Plan
from ..core.splits import Split
from ..core.outputs import json_ready
from ..reporting import REPORT_FORMAT, REPORT_VERSION, write_report
from .costs import ComputeCosts
from .emit import EmittedModel
from .graphdef import copy_name, layer_of
from .opgraph import OpGraph, graph_summary


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
    runtime_factor : Mapping[str, float]
        Per measured kind, the factor its op times were scaled by to match a timed step of the
        runtime that runs the plan (:attr:`placer.tf.costs.ProfileOptions.runtime`; absent: not measured).
    """

    compute: Mapping[str, str]
    profiled_with_grappler: bool
    analytic_unknown_op_types: Mapping[str, tuple[str, ...]]
    runtime_factor: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Report:
    """Everything a person needs to judge a plan (all times predicted; ``measurements`` is measured)."""

    plan: Plan
    graph: Mapping[str, Any]
    devices: tuple[Mapping[str, Any], ...]
    traffic_bytes: np.ndarray
    simulation: SimResult
    costs: CostSource
    links: tuple[Mapping[str, Any], ...]
    ops: tuple[Mapping[str, Any], ...]
    edges: tuple[Mapping[str, Any], ...]
    compressed_edges: tuple[Mapping[str, Any], ...]
    stage_seconds: Mapping[str, float]
    model: Mapping[str, str]
    measurements: tuple[Mapping[str, Any], ...] = ()
    shared_processors: tuple[Mapping[str, Any], ...] = ()
    #: The simulated step as it runs: the pipeline of ``plan.microbatches`` copies (``None``: ``simulation``).
    pipeline_simulation: SimResult | None = None
    #: The order the simulated executors ran ready ops in (``cost_models.SimOptions.ready_order``).
    ready_order: str = "fifo"
    #: The placed step's acknowledged transfers (:mod:`placer.tf.rewrites.sends`): ``None`` where TensorFlow's executor
    #: orders the sends.
    prompt_sends: tuple[Mapping[str, str], ...] | None = None
    #: The shards of split ops' weights the placed step reads (:class:`placer.tf.rewrites.split.Shard`, as dicts).
    shards: tuple[Mapping[str, Any], ...] = ()
    #: Each split (:class:`placer.core.splits.Split`): its op, parts, kind, the product paired with it, and the
    #: variables it shards.
    splits: tuple[Mapping[str, Any], ...] = ()

    @property
    def copies(self) -> int:
        """The copies of the graph the step runs: micro-batches × data-parallel replicas."""
        return self.plan.microbatches * self.plan.replicas

    @property
    def step_simulation(self) -> SimResult:
        """The simulation of the step as it runs (pipelined when the plan has micro-batches)."""
        return self.simulation if self.pipeline_simulation is None else self.pipeline_simulation

    def _op_name(self, v: int) -> str:
        """Node ``v`` of the step simulation: an op, or micro-batch ``v // ops``'s copy of it (``mb{i}/op``)."""
        n = len(self.ops)
        if self.copies <= 1:
            return self.ops[v]["name"]
        return copy_name(v // n, self.ops[v % n]["name"])

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data (schema: :mod:`placer.reporting.schema`, ``docs/report-format.md``)."""
        names = list(self.plan.devices)
        timeline = [{"op": self._op_name(v), "device": names[d], "start_s": s, "end_s": e}
                    for v, d, s, e in self.step_simulation.timeline if v < self.copies * len(self.ops)]
        plan = {k: v for k, v in self.plan.to_dict().items()
                if k not in ("assignment", "op_order", "format", "version")}
        return json_ready({
            "format": REPORT_FORMAT, "report_version": REPORT_VERSION, "source": "placement",
            "model": dict(self.model),
            "plan": {**plan, "compressed_edges": len(self.compressed_edges)},
            "graph": dict(self.graph),
            "devices": list(self.devices),
            "links": list(self.links),
            "shared_processors": list(self.shared_processors),
            "traffic_bytes": {"devices": names, "matrix": self.traffic_bytes},
            "simulation": {"predicted_step_time_s": self.step_simulation.step_time_s, "timeline": timeline,
                           "microbatches": self.copies, "ready_order": self.ready_order},
            "measurements": list(self.measurements),
            "stage_seconds": dict(self.stage_seconds),
            "cost_model": {"compute": dict(self.costs.compute),
                           "profiled_with_grappler": self.costs.profiled_with_grappler,
                           "analytic_unknown_op_types": {k: list(v) for k, v in
                                                         self.costs.analytic_unknown_op_types.items() if v},
                           "runtime_factor": dict(self.costs.runtime_factor)},
            "ops": list(self.ops),
            "edges": list(self.edges),
            "compressed_edges": list(self.compressed_edges),
            "sends": {"prompt": self.prompt_sends is not None,
                      "acknowledged": list(self.prompt_sends or ())},
            "shards": list(self.shards),
            "splits": list(self.splits),
        })

    def write(self, path: str | os.PathLike) -> str:
        """Write the report to ``path``: ``.json`` data, a self-contained ``.html`` page or ``.trace.json``
        trace events (:func:`placer.reporting.write_report`); returns the path.

        Raises
        ------
        OutputError
            For another suffix, or a path that cannot be written (an existing report there is left as it was).
        """
        return write_report(self.to_dict(), path)


def _fit_quality(fit: Any) -> dict[str, Any] | None:
    """A link calibration's fit quality as the report stores it (``None`` for an assumed link)."""
    if fit is None:
        return None
    return {"r2": fit.r2, "max_rel_error": fit.max_rel_error, "points": fit.points}


def build_report(plan: Plan, op_graph: OpGraph, built: BuiltProblem, sim: SimResult, costs: ComputeCosts,
                 grappler: bool, emitted: EmittedModel, stage_seconds: Mapping[str, float],
                 model_name: str = "model", pipeline_sim: SimResult | None = None,
                 splits: Sequence[Split] = ()) -> Report:
    """The report of one placement; ``sim`` is ``built.simulate`` of the plan, ``pipeline_sim`` the pipelined
    step when the plan has micro-batches (:func:`placer.core.microbatch.simulate_pipeline`)."""
    g = op_graph.graph
    devset = built.devices
    names = list(devset.names)
    counts = plan.ops_per_device()
    devices = tuple({
        "name": d.name, "kind": d.kind, "memory_capacity_bytes": d.memory_bytes,
        "memory_pool_bytes": d.memory_pool_bytes, "speed": d.speed,
        "ops": counts[d.name], "resident_bytes": plan.device_memory_bytes[i],
        "predicted_busy_s": sim.busy_s[i], "predicted_peak_memory_bytes": sim.peak_memory_bytes[i],
        "predicted_load_s": plan.predicted_device_load_s[i],
    } for i, d in enumerate(devset.devices))
    kind_of = {d.name: d.kind for d in devset.devices}
    ops = tuple({"name": op, "type": g.nodes[op][OP_TYPE], "layer": layer_of(op), "device": plan.assignment[op],
                 "compute_us": g.nodes[op][COMPUTE_US], "compute_source": costs.source.get(kind_of[plan.assignment[op]],
                                                                                         "unknown"),
                 "memory_bytes": int(g.nodes[op][MEMORY_BYTES]), "output_bytes": int(g.nodes[op].get(OUTPUT_BYTES, 0))}
                for op in built.nodes)
    codec = {(e.tensor.rsplit(":", 1)[0], e.dst_device): e.codec for e in emitted.compressed}
    edges = tuple({"src": u, "dst": v, "bytes": b, "cut": plan.assignment[u] != plan.assignment[v],
                   "codec": codec.get((u, plan.assignment[v])) if plan.assignment[u] != plan.assignment[v] else None}
                  for u, v, b in g.edges(data=BYTES, default=0) if u in plan.assignment and v in plan.assignment)
    links = tuple({"src": names[i], "dst": names[j], "bandwidth_bytes_per_s": link.bandwidth_bytes_per_s,
                   "latency_s": link.latency_s, "source": "calibrated" if (i, j) in devset.fits else "assumed",
                   "fit": _fit_quality(devset.fits.get((i, j)))}
                  for (i, j), link in devset.links.items())
    source = CostSource(dict(costs.source), grappler, dict(costs.unknown_op_types), dict(costs.runtime_factor))
    shared = tuple({"devices": [names[i] for i in sp.devices], "capacity": sp.capacity, "source": sp.source,
                    "pooled": sp.pooled} for sp in devset.shared)
    return Report(plan, graph_summary(op_graph), devices, sim.link_bytes, sim, source, links, ops, edges,
                  tuple(asdict(e) for e in emitted.compressed), dict(stage_seconds),
                  {"name": model_name, "step": emitted.step}, shared_processors=shared,
                  pipeline_simulation=pipeline_sim, ready_order=built.problem.ready_order or "fifo",
                  prompt_sends=None if emitted.sends is None else tuple(
                      {"tensor": tensor, "to": device} for tensor, device in emitted.sends.transfers),
                  shards=tuple(asdict(s) for s in emitted.shards),
                  splits=tuple({"op": s.op, "parts": s.parts, "kind": s.kind,
                                "paired_with": None if s.pair is None else s.pair.op,
                                "variables": list(s.placeholders)} for s in splits))
