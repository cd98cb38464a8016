"""``autoplace(model, devices)``: the stage runner, one declared list of stages on top of the back end.

============  ==========================================  ==============================  ============================
stage         function                                    takes                           returns (frozen)
============  ==========================================  ==============================  ============================
devices       :func:`~placer.core.devices.resolve_devices` the user's device list          ``DeviceSet``
trace         :func:`~placer.tf.trace.trace_model`         the Keras model                 ``TracedModel``
              (training: :func:`~placer.tf.training.
              trace_training`)
costs         :func:`~placer.tf.costs.compute_costs`       traced model, device kinds      ``ComputeCosts``
hosts         :func:`_hosts` (:mod:`placer.tf.timing`,     traced model, devices           ``DeviceSet`` with links and
              :mod:`placer.measure`)                                                       shared processors
graph         :func:`~placer.tf.opgraph.build_op_graph`    traced model, costs             ``OpGraph`` (a saved plan's
                                                                                           split ops split)
problem       :func:`~placer.core.build.build_problem`     op graph, devices, grouping     ``BuiltProblem``
solve         :func:`~placer.planner.plan_problem`         built problem, ``PlanOptions``  ``Plan`` (no whole-op plan
                                                           (or a saved plan)               fits: :func:`_split_to_fit`)
codecs        :func:`compression_policy`                   compression options, devices    ``CompressionPolicy``
microbatches  :func:`_microbatches`                        plan, model, policy's           ``Plan`` with its
              (:mod:`placer.core.microbatch`)              parameter codec                 micro-batches (or copies)
splits        :func:`_splits`                              plan, op graph, traced model    ``Plan``, ``OpGraph``,
              (:mod:`placer.core.splits`)                                                  ``BuiltProblem``: large
                                                                                           products split where it pays
order         :func:`_simulated_order`                     plan, op graph, traced model    ``Plan`` (its ops' order
                                                                                           fixed, or one device)
calls         :func:`_call_overhead`                       plan, traced model              ``Plan`` + the measured
                                                                                           fixed cost per call
emit          :func:`_emit` (:mod:`placer.tf.placement`,   traced model, plan              ``EmittedModel`` (and the
              :mod:`placer.tf.emit`)                                                       placed functions)
report        :func:`~placer.tf.report.build_report`       what the stages returned        ``Report``
============  ==========================================  ==============================  ============================

:data:`STAGES` declares them once: :class:`StageTimer` runs each (in that
order) as ``with timer.stage(name):``, times it, logs it, reports it to
``progress`` and puts its name on any error it raises
(``AutoplaceError.stage``: the message starts with ``[solve stage]``, say);
the CLI sizes its progress bar from it. The problem and solve stages are the
same code :func:`placer.solve` runs on a saved op graph. At the end the
shell gets one frozen :class:`~placer.tf.placement.Placement`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import warnings
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, Mapping, Sequence

import keras
import numpy as np
import tensorflow as tf

from cost_models import SimResult
from cost_models.cache import fingerprint
from cost_models.comm import Link, LinkFit
from cost_models.simulate import SimOptions

from ..core.build import BuiltProblem, build_problem, check_total_memory
from ..core.order import SIMULATED_ORDER_MIN_OP_S, timeline_order
from ..core.compression import CODECS, CompressionPolicy
from ..core.devices import DeviceSet, DeviceSpec, SharedProcessor, device_host, device_kind, resolve_devices
from ..core.microbatch import SmallBatchCosts, ParameterCodec, candidate_microbatches, simulate_pipeline
from ..core.plan import KEPT, Candidate, Plan
from ..core.attrs import COMPUTE_US, MEMORY_BYTES
from ..core.replicas import device_groups, simulate_replicas
from ..core.splits import (Split, descend_splits, helper_owner, pair_ops, rejoined, split_apart, split_graph,
                           split_map, split_saving_s, spread_parts,
                           with_measured_parts)
from ..errors import (AutoplaceError, InputSignatureError, InsufficientMemoryError, NoFeasiblePlanError, PlanError,
                      TrainingError)
from ..measure.hosts import executor_ready_order, sharing_groups
from ..measure.links import calibrate_links, with_calibration_history
from ..planner import DEFAULT_SOLVER, PlanOptions, pipeline_plan, plan_problem, replica_plan
from .codecs import measure_codec_costs
from .costs import ComputeCosts, compute_costs, weight_copy_events, worker_identity
from .emit import EmittedModel
from .graphdef import row_tables, tensor_bytes, variable_bytes
from .opgraph import OpGraph, build_op_graph
from .options import PlacementOptions
from .placed_model import PlacedModel
from .placement import PlacedFunctions, Placement, place_variables, predicted_acknowledgements
from .remote import Watchdog, worker_addresses
from .replicas import replica_groups
from .report import Report, build_report
from .rewrites.sends import acknowledged_nodes
from .rewrites.split import split_candidates
from .timing import plan_call_seconds, shared_processors
from .trace import TracedModel, check_model, index_bounds, signature_from_sample, trace_model, with_batch
from .training import check_replicable, trace_training

log = logging.getLogger(__name__)

#: The stages of :func:`autoplace`, in order; :func:`profile` runs :data:`PROFILE_STAGES`.
STAGES = ("devices", "trace", "costs", "hosts", "graph", "problem", "solve", "codecs", "microbatches", "splits",
          "order", "calls", "emit", "report")
PROFILE_STAGES = STAGES[:3]


@dataclass
class StageTimer:
    """Runs the stages of :data:`STAGES` in order: one timer, one log line each, the stage's name on its errors.

    ``progress(stage, seconds)`` (optional) hears each stage start (``None``) and end.

    Examples
    --------
    >>> timer = StageTimer()
    >>> with timer.stage("devices"):
    ...     pass
    >>> list(timer.seconds)
    ['devices']
    """

    progress: Callable[[str, float | None], None] | None = None
    seconds: dict[str, float] = field(default_factory=dict)

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Run the body as stage ``name``.

        Raises
        ------
        AutoplaceError
            Whatever the stage raised, its message starting with the stage's name;
            other exceptions get a note naming the stage.
        ValueError
            A stage that is not in :data:`STAGES`, or not after the stages run so far (a bug of the runner).
        """
        done = [STAGES.index(s) for s in self.seconds]
        if name not in STAGES or (done and STAGES.index(name) <= max(done)):
            raise ValueError(f"stage {name!r} is not in STAGES after {list(self.seconds)}")
        if self.progress is not None:
            self.progress(name, None)
        t = time.perf_counter()
        try:
            yield
        except AutoplaceError as e:
            raise e.in_stage(name)
        except Exception as e:
            if hasattr(e, "add_note"):  # Python 3.11+
                e.add_note(f"raised in autoplace's {name!r} stage")
            raise
        self.seconds[name] = time.perf_counter() - t
        log.info("%s: %.2f s", name, self.seconds[name])
        if self.progress is not None:
            self.progress(name, self.seconds[name])


def _data_parallel_groups(devices: DeviceSet, opts: PlacementOptions) -> list[tuple[str, ...]]:
    """The device groups of a training step's ``replicas=`` (one group: all devices; a forward pass plans on all
    devices and chooses its copies after: :func:`placer.planner.replica_plan`)."""
    replicas = opts.train.training_replicas
    if replicas == 1 or not opts.train.training:
        return [devices.names]
    try:
        return list(device_groups(devices.names, replicas))
    except PlanError as e:
        raise TrainingError(str(e)) from None


def compression_policy(compression: str, error_budget: float, devices: DeviceSet, *,
                       gradients: str = "none") -> CompressionPolicy:
    """The codec choice of one placement; ``auto`` (of either setting) or a codec of the parameter traffic (its
    time is in the copies' predicted step) measures each codec's cost on each device here."""
    if compression != "auto" and gradients == "none":
        return CompressionPolicy(compression, error_budget, gradients=gradients)
    names = devices.names
    links = {(names[i], names[j]): (link.bandwidth_bytes_per_s, link.latency_s)
             for (i, j), link in devices.links.items()}
    return CompressionPolicy(compression, error_budget, links, measure_codec_costs(names), gradients=gradients)


def parameter_codec(policy: CompressionPolicy, devices: DeviceSet) -> ParameterCodec | None:
    """The policy's codec of parameter traffic as the simulator reads it (bytes between device indices), or
    ``None`` where it sends them as they are."""
    if policy.gradients == "none":
        return None
    names = devices.names
    return lambda nbytes, src, dst: policy.parameter_codec(nbytes, names[src], names[dst])


def say_what_compression_did(policy: CompressionPolicy, emitted: EmittedModel) -> None:
    """Warn when compression was asked for and nothing was compressed, saying why."""
    if policy.gradients != "none" and not any(e.kind == "parameter" for e in emitted.compressed):
        why = ("no codec saves time on these links" if policy.gradients == "auto"
               else "no weight or gradient of float32 crosses devices in this placement (one device, or a "
                    "forward pass with no copies)")
        warnings.warn(f"gradient_compression={policy.gradients!r}: nothing compressed: {why}", stacklevel=3)
    if policy.compression == "none" or any(e.kind != "parameter" for e in emitted.compressed):
        return
    if policy.budget_excludes_all:
        why = (f"no codec meets the error budget compression_error={policy.error_budget:g} "
               f"(smallest error: {min(c.max_error for n, c in CODECS.items() if n != 'none'):.2g})")
    elif policy.compression == "auto":
        why = "no codec saves time on these links (or no cut edge carries a float tensor of rank >= 1)"
    else:
        why = ("no cut edge carries a tensor the codec may take (float32 of rank >= 1"
               + (", forward pass only" if CODECS[policy.compression].forward_only else "") + ")")
    warnings.warn(f"compression={policy.compression!r}: nothing compressed, every edge is sent as it is: {why}",
                  stacklevel=3)


def _as_plan(plan: Plan | str | os.PathLike | None) -> Plan | None:
    if plan is None or isinstance(plan, Plan):
        return plan
    if isinstance(plan, (str, os.PathLike)):
        return Plan.load(plan)
    raise PlanError(f"plan must be a Plan or the path of a saved plan, got {type(plan).__name__}")


def _solve(built: BuiltProblem, options: PlanOptions, given: Plan | None, batch_size: int, compression: str) -> Plan:
    """The solve stage: search, or re-apply ``given`` (on the devices it was made for)."""
    if given is not None and tuple(given.devices) != built.devices.names:
        raise PlanError(f"the plan was made for devices {list(given.devices)}, not {list(built.devices.names)}; "
                        "pass the devices it was made for, or solve again")
    if given is not None and given.replicas > 1:
        first = set(device_groups(given.devices, given.replicas)[0])
        outside = sorted(set(given.assignment.values()) - first)
        if outside:
            raise PlanError(f"the plan runs replicas={given.replicas} copies, and places the first copy's ops; it "
                            f"places ops on {outside[:3]}, outside the first copy's devices {sorted(first)}: set "
                            "replicas=1 in a plan that spreads one copy over all devices")
    plan = plan_problem(built, options, given=None if given is None else given.assignment,
                        given_order=None if given is None else given.op_order)
    return replace(plan, batch_size=batch_size, compression=compression)


@dataclass(frozen=True)
class _Graphs:
    """The op graph and problem a plan was made on (the splits stage may replace both)."""

    op_graph: OpGraph
    built: BuiltProblem


def _split(op_graph: OpGraph, splits: Sequence[Split]) -> OpGraph:
    """``op_graph`` with ``splits`` applied (:func:`placer.core.splits.split_graph`)."""
    return replace(op_graph, graph=split_graph(op_graph.graph, splits))


def _holds_whole(traced: TracedModel, devset: DeviceSet) -> list[bool]:
    """Per device of ``devset``: whether it holds what profiling and measuring a shared capacity put on one
    device: the trace's variables together and, on a gRPC worker (a process whose memory limit bites,
    ``LocalCluster(memory_limit_bytes=)``), the whole step's predicted peak (:func:`_one_device_peak`).

    So a worker that holds the weights but not the step is never asked to run it: a profile that ran out of a
    worker's memory left its allocations in the worker's pool (the Adam recommender's worker 0 then trained
    with 1,894 of its 1,936 MiB in use, ``benchmarks/results/splitting_adam_table_peak.md``), and was tried
    again on every placement. Its kind is profiled in this process instead, as a model no device holds is."""
    need = sum(variable_bytes(v) for v in traced.fixed_captures[0].values())
    caps = devset.arrays()[2]
    fits = [need <= c for c in caps]
    remote = worker_addresses(devset.names)
    limited = [i for i, d in enumerate(devset.devices)
               if fits[i] and np.isfinite(caps[i]) and device_host(d.name) in remote]
    if not limited:
        return fits
    # an upper bound first: the weights and every tensor of the step live at once (not for a device whose
    # allocator pool is replayed: its chunks and regions can hold more than the tensors)
    bound = need + sum(tensor_bytes(t, traced.batch_size or None)
                       for op in traced.fixed.graph.get_operations() for t in op.outputs)
    peaks: dict[tuple[str, int | None], float] = {}
    for i in limited:
        device = devset.devices[i]
        if bound <= caps[i] and device.memory_pool_bytes is None:
            continue
        key = (device.kind, device.memory_pool_bytes)
        if key not in peaks:
            peaks[key] = _one_device_peak(traced, devset, i)
        if peaks[key] > caps[i]:
            fits[i] = False
            log.info("costs: %s holds the model's weights (%s B) but not its step's predicted peak (%s of %s B); "
                     "the step is not profiled there", devset.names[i], f"{need:,}", f"{int(peaks[key]):,}",
                     f"{int(caps[i]):,}")
    return fits


def _one_device_peak(traced: TracedModel, devset: DeviceSet, device: int) -> float:
    """The trace's step simulated whole on ``devset``'s device ``device``: its predicted peak memory (resident
    weights and live tensors, the memory model the solve's check uses), before any op is profiled. Every op
    takes 1 µs: on one device the ops run one after another in the executor's ready order, so their times
    barely change which tensors are live together."""
    names = [op.name for op in traced.fixed.graph.get_operations()]
    unit = {kind: dict.fromkeys(names, 1.0) for kind in {d.kind for d in devset.devices}}
    built = build_problem(build_op_graph(traced, unit).graph, devset)
    return float(built.simulate(np.full(built.problem.n, device)).peak_memory_bytes[device])


def _profile_devices(traced: TracedModel, devset: DeviceSet, *, again: bool = False) -> list[str]:
    """The devices :func:`~placer.tf.costs.compute_costs` may profile ``traced`` on: each kind's devices that
    hold its variables whole (:func:`_holds_whole`). Where none does (a model that runs only split), that kind
    is profiled in this process. ``again``: a later stage's profile (the micro-batch and splits stages), never
    on a device whose allocator pool is replayed (:func:`_profiled_again_here`)."""
    return [d.name for d, fits in zip(devset.devices, _holds_whole(traced, devset))
            if fits and not (again and _profiled_again_here(d))]


def _profiled_again_here(device: DeviceSpec) -> bool:
    """Whether a later stage profiles in this process rather than on ``device``: a device whose allocator pool
    the plan's memory replays (``memory_pool_bytes``: a memory-limited worker). Its pool keeps the regions of
    every profile and weight copy made there; the costs and hosts stages' are in its replayed history
    (``DeviceSet.pool_history``), and further profiles filled a limited worker's pool until it ran out of memory
    or was killed (``benchmarks/results/pool_history.md``)."""
    return device.memory_pool_bytes is not None


def _note_unprofiled(devset: DeviceSet, devices: Sequence[str]) -> None:
    """Log each kind of ``devset`` that none of ``devices`` (those profiled on) is: profiled in this process."""
    for kind in sorted({d.kind for d in devset.devices} - {device_kind(n) for n in devices}):
        log.info("costs: no %s device of the plan is profiled on (the model's weights fit none, or a later stage "
                 "does not fill a limited worker's pool again); its ops are profiled in this process's %s instead",
                 kind, kind)


#: The tables profiled by stand-ins of fewer rows (:func:`_profiling`) take at most this share of the memory the
#: device profiled on has left beside the other weights (the rest: the step's activations and transfers), ...
STAND_IN_SHARE = 0.5
#: ... and at most this many bytes in all: each is fed to the profiling session, which holds copies of a feed
#: while it arrives (a 200 MiB stand-in on a worker limited to 400 MiB of data hung the session, 2026-12-06);
#: 64 MiB is still far larger than a CPU's caches, so a gather's rows miss them as the whole table's would.
STAND_IN_MAX_BYTES = 64 << 20


def _profiling(traced: TracedModel, devset: DeviceSet, *, again: bool = False) -> tuple[list[str], dict[str, int]]:
    """Where and how the costs stage profiles ``traced``: the devices it may profile on, and the stand-ins of its
    tables (resource placeholder → rows; :func:`~placer.tf.costs.compute_costs`' ``table_rows``).

    Each kind's devices that hold the variables whole (:func:`_profile_devices`). Where none of a kind does, its
    devices are gRPC workers, and the trace's tables are touched by rows alone
    (:func:`~placer.tf.graphdef.row_tables`: an embedding table trained by SGD, or a forward pass), each table
    is profiled by its first rows, as many as leave the variables fitting that kind's largest device
    (:data:`STAND_IN_SHARE` of what the other weights leave, at most :data:`STAND_IN_MAX_BYTES` in all), on that
    device: a worker's op times rather than this process's (the split trace's parts are still profiled here,
    whole: :func:`_measured_parts`). A kind of this process is profiled here whole. ``again``: a later
    stage's profile, never on a device whose pool is replayed (:func:`_profiled_again_here`)."""
    devices = _profile_devices(traced, devset, again=again)
    missing = {d.kind for d in devset.devices} - {device_kind(n) for n in devices}
    variables = traced.fixed_captures[0]
    tables = sorted(row_tables(traced.fixed.graph) & set(variables))
    if not missing or not tables:
        _note_unprofiled(devset, devices)
        return devices, {}
    caps = devset.arrays()[2]
    other = sum(variable_bytes(v) for ph, v in variables.items() if ph not in tables)
    whole = sum(variable_bytes(variables[ph]) for ph in tables)
    remote = worker_addresses(devset.names)
    rows: dict[str, int] = {}
    for kind in sorted(missing):
        # a kind of this process is profiled here whole (its memory is the plan's promise, not a limit)
        workers = [i for i, d in enumerate(devset.devices) if d.kind == kind and device_host(d.name) in remote
                   and not (again and _profiled_again_here(d))]
        if not workers:
            continue
        largest = max(workers, key=lambda i: caps[i])
        keep = min(STAND_IN_SHARE * (float(caps[largest]) - other), STAND_IN_MAX_BYTES) / whole
        if not np.isfinite(keep) or keep <= 0:
            continue
        for ph in tables:
            n = max(1, int(int(variables[ph].shape[0]) * min(keep, 1.0)))
            rows[ph] = min(rows.get(ph, n), n)
        devices.append(devset.devices[largest].name)
        log.info("costs: %s devices hold the model's weights with its tables cut to %.1f%% of their rows: profiled "
                 "on %s with those (%s)", kind, 100 * min(keep, 1.0), devset.devices[largest].name,
                 ", ".join(f"{ph}: {rows[ph]:,} rows" for ph in tables))
    _note_unprofiled(devset, devices)
    return devices, rows


def _required_splits(traced: TracedModel, devset: DeviceSet, opts: PlacementOptions) -> list[Split]:
    """The splits without which no placement of whole ops fits: each weight larger than every device's memory
    (or, with the optimizer's slots it is sharded with, Adam's moments, larger together), split into one part
    per device (``splits="none"``: none; the solve then fails naming it)."""
    cap = float(np.max(devset.arrays()[2]))
    if opts.split.splits == "none" or len(devset) < 2 or not np.isfinite(cap):
        return []
    variables = traced.fixed_captures[0]
    if sum(variable_bytes(v) for v in variables.values()) <= cap:  # every weight with its slots fits any device
        return []
    large = {ph for ph, v in variables.items() if variable_bytes(v) > cap}
    candidates = split_candidates(traced.fixed.graph, variables, len(devset), pairs=opts.split.split_pairs)
    large |= {s.placeholder for s in candidates if sum(variable_bytes(variables[ph]) for ph in s.placeholders) > cap}
    if not large:
        return []
    # paired where a pair can be (Plan.pairs records which)
    found = [s for s in candidates if large & set(s.placeholders)]
    whole = sorted(large - {ph for s in found for ph in s.placeholders})
    if whole:
        log.info("operator splits: %s exceed every device's memory but no split rule takes them (read by other ops "
                 "too, or, in a training step, updated other than element by element: a global-norm clip, weight "
                 "decay)",
                 ", ".join(variables[ph].name for ph in whole))
    return found


def _profiled_split(traced: TracedModel, op_graph: OpGraph, splits: Sequence[Split], costs: ComputeCosts,
                    devset: DeviceSet, opts: PlacementOptions) -> OpGraph:
    """``op_graph`` with ``splits`` applied and their parts profiled (:func:`_measured_parts`). Where the costs
    stage profiled stand-in tables (no device holds the model whole), the other ops keep those times and the
    parts' come from this process (the split trace holds the whole table)."""
    split = _split(op_graph, splits)
    measured = _measured_parts(traced, split, splits, costs, devset, opts)
    if not costs.stand_ins:
        return measured
    return replace(measured, graph=with_measured_parts(split.graph, measured.graph, op_graph.graph, splits))


def _largest_first(splits: Sequence[Split], whole: OpGraph) -> list[list[Split]]:
    """The subsets of ``splits`` the splits search tries: the one, the half and all of them whose weights (with
    the slots they shard, bytes of ``whole``'s placeholders) are largest (ties: by op)."""
    g = whole.graph
    ranked = sorted(splits, key=lambda s: (-sum(int(g.nodes[ph].get(MEMORY_BYTES, 0)) for ph in s.placeholders),
                                           s.op))
    return [ranked[:n] for n in sorted({1, (len(ranked) + 1) // 2, len(ranked)})]


def _subset_graphs(measured: OpGraph, whole: OpGraph, subset: Sequence[Split], devset: DeviceSet,
                   opts: PlacementOptions) -> _Graphs:
    """``whole`` with ``subset`` split, the ops the splits change timed as in ``measured`` (a profile of a
    graph with at least these splits, :func:`~placer.core.splits.with_measured_parts`), and its problem."""
    graph = replace(measured, graph=with_measured_parts(split_graph(whole.graph, subset), measured.graph,
                                                        whole.graph, subset))
    return _Graphs(graph, build_problem(graph.graph, devset, group_by=opts.solve.group_by))


def _split_to_fit(traced: TracedModel, op_graph: OpGraph, devset: DeviceSet, opts: PlacementOptions,
                  costs: ComputeCosts, error: InsufficientMemoryError
                  ) -> tuple[list[Split], OpGraph, BuiltProblem, Plan]:
    """The solve stage's answer to a step whose weights fit a device but whose predicted peak (weights,
    gradients, live tensors) fits no placement of whole ops: the splittable products and lookups, largest
    weight first, split one part per device (each part holds its shard, its gradient and its share of the
    output), the first of the largest one, the largest half and all of them whose plan fits.

    Returns ``(splits, op graph, problem, plan)``. Raises :class:`InsufficientMemoryError`: ``error`` on one
    device; with a hint where splits are off (``splits="none"``, ``algorithm="single"``, ``replicas=R`` asked
    for), nothing can be split, or no subset fits (saying what was tried)."""
    off = ("splits='none'" if opts.split.splits == "none" else "algorithm='single'"
           if opts.solve.algorithm == "single" else f"replicas={opts.train.training_replicas}"
           if opts.train.training_replicas > 1 else None)
    if len(devset) < 2:
        raise error
    if off is not None:
        raise InsufficientMemoryError(f"{error}; with {off} no layer is split: without it, autoplace tries "
                                      "splitting the largest weights over the devices") from error
    variables = traced.fixed_captures[0]
    found = split_candidates(traced.fixed.graph, variables, len(devset), pairs=opts.split.split_pairs)
    if not found:
        raise InsufficientMemoryError(f"{error}. No op can be split to lower the peak (no dense product, "
                                      "convolution or lookup reads a weight no other op reads)") from error
    log.info("operator splits: no placement of whole ops fits the devices' memory; profiling %d splittable "
             "ops split %d ways", len(found), len(devset))
    measured = _profiled_split(traced, op_graph, found, costs, devset, opts)
    last: InsufficientMemoryError = error
    for subset in _largest_first(found, op_graph):
        split = _subset_graphs(measured, op_graph, subset, devset, opts)
        try:
            return subset, split.op_graph, split.built, _solve(split.built, opts.solve, None, traced.batch_size,
                                                               opts.emit.compression)
        except InsufficientMemoryError as e:
            log.info("operator splits: %d of %d split ops do not fit either", len(subset), len(found))
            last = e
    raise InsufficientMemoryError(f"{last}. Tried: the {len(found)} splittable ops' weights split "
                                  f"{len(devset)} ways (the largest one, half and all of them)") from error


def _kept(plan: Plan) -> str:
    """Why ``plan`` runs the strategy it does, in words (its kept candidate's note, else the candidate)."""
    kept = plan.kept
    if kept is None:
        return f"{plan.replicas} data-parallel copies"
    return kept.note or kept.describe()


def _prompt_sends(opts: PlacementOptions, devset: DeviceSet) -> bool:
    """Whether the placed functions acknowledge awaited transfers (:mod:`placer.tf.rewrites.sends`)."""
    return opts.emit.sends == "prompt" or (opts.emit.sends == "auto" and devset.ready_order == "lifo")


def _orders(opts: PlacementOptions, devset: DeviceSet, plan: Plan) -> bool:
    """Whether the order stage fixes ``plan``'s simulated order (:func:`_simulated_order`)."""
    return (opts.solve.execution_order == "simulated" and devset.ready_order == "lifo" and plan.microbatches == 1
            and plan.replicas == 1 and opts.train.training_replicas == 1 and not plan.op_order
            and len(set(plan.assignment.values())) > 1)


def _as_emitted(traced: TracedModel, plan: Plan, graphs: _Graphs, prompt: bool) -> tuple[np.ndarray, SimOptions]:
    """``plan``'s group assignment and the simulation options of its step as emitted: the transfers prompt sends
    acknowledge (where ``prompt``)."""
    acks = predicted_acknowledgements(traced, plan, graphs.op_graph, graphs.built) if prompt else ()
    return graphs.built.group_assignment(plan.assignment), SimOptions(acknowledged=acks)


def _ordered(traced: TracedModel, plan: Plan, graphs: _Graphs, prompt: bool
             ) -> tuple[np.ndarray, SimResult, tuple[tuple[int, ...], ...], SimResult]:
    """``plan`` simulated as emitted (:func:`_as_emitted`), the order that simulation ran each device's ops of
    :data:`~placer.core.order.SIMULATED_ORDER_MIN_OP_S` or more in, and the plan simulated again in that order:
    ``(group assignment, free, order, ordered)``."""
    a, options = _as_emitted(traced, plan, graphs, prompt)
    free = graphs.built.simulate(a, options)
    order = timeline_order(free.timeline, len(graphs.built.devices))
    return a, free, order, graphs.built.simulate(a, options, order=order)


def _step_with_sends(traced: TracedModel, plan: Plan, graphs: _Graphs, prompt: bool, ordered: bool = False
                     ) -> float:
    """``plan``'s simulated step (its ``predicted_step_time_s`` where pipelined or copied) with the transfers its
    emitted function would acknowledge (prompt sends) and, where ``ordered`` (:func:`_orders`), in the order the
    order stage will fix: what the emit stage will predict."""
    if ordered:
        return _ordered(traced, plan, graphs, prompt)[-1].step_time_s
    if not prompt or plan.microbatches > 1 or plan.replicas > 1:
        return plan.predicted_step_time_s
    return graphs.built.simulate(*_as_emitted(traced, plan, graphs, prompt)).step_time_s


def _measured_parts(traced: TracedModel, op_graph: OpGraph, splits: Sequence[Split], costs: ComputeCosts,
                    devset: DeviceSet, opts: PlacementOptions) -> OpGraph:
    """``op_graph`` (split) with the op times of the split trace, profiled as the costs stage profiles the trace
    (:func:`~placer.tf.costs.compute_costs` with ``splits``; scaled by the trace's runtime factors), for each
    kind that was measured: what :func:`~placer.core.splits.with_measured_parts` takes each subset's changed
    ops' times from (the other ops keep the trace's profile)."""
    kinds = sorted({d.kind for d in devset.devices})
    # a split table's parts clamp ids to its shard: no stand-ins; a limited worker's pool is not filled again
    devices = _profile_devices(traced, devset, again=True)
    _note_unprofiled(devset, devices)
    measured = compute_costs(traced, kinds, replace(opts.costs, runtime=False), devices, splits=splits)
    g = op_graph.graph.copy()
    for kind in kinds:
        if not measured.source[kind].startswith("measured"):
            continue
        factor = costs.runtime_factor.get(kind, 1.0)
        table = dict(measured.us[kind])
        for name, us in measured.us[kind].items():  # a part's helpers (its ids and mask) are its work
            owner = helper_owner(name)
            if owner is not None and owner in table:
                table[owner] += us
        for name in g:
            if name in table and isinstance(g.nodes[name][COMPUTE_US], dict):
                g.nodes[name][COMPUTE_US] = {**g.nodes[name][COMPUTE_US], kind: table[name] * factor}
    return replace(op_graph, graph=g)


def _splits(traced: TracedModel, graphs: _Graphs, plan: Plan, devset: DeviceSet, opts: PlacementOptions,
            costs: ComputeCosts, notes: Sequence[str] = ()) -> tuple[Plan, _Graphs]:
    """The splits stage: the large dense products of a forward pass or a training step (with their gradients and
    update, :class:`~placer.core.splits.Gradients`; not where ``replicas=R`` asks for copies or ``algorithm="single"``
    for one device) split into one part per device, their weights sharded (:mod:`placer.core.splits`), in two
    families where products can pair (consecutive products paired, and each by columns; ``splits="all"``: the
    first): each family's split trace profiled once, then the largest one, the largest half and all of them split
    (:func:`~placer.core.splits.with_measured_parts`; ``splits="all"``: all), each split graph placed twice: by the
    same solver, and with each split's parts side by side (:func:`~placer.core.splits.spread_parts`; the solver's
    simulation does not see the acknowledged transfers that let parts overlap on one-thread workers). The best of
    them, scored
    as it will be emitted (prompt sends and the order stage's order included: :func:`_step_with_sends`),
    replaces ``plan`` (with the
    micro-batches and copies the stage before chose) where ``splits="auto"`` predicts it ``split_margin``
    faster (``"all"``: kept; ``"none"``: not tried). ``notes``: the log lines the solve stage added to
    ``plan``'s (a split plan gets them too)."""
    mode = opts.split.splits
    if mode == "none" or len(devset) < 2:
        return plan, graphs
    if opts.solve.algorithm == "single":  # one device asked for: its parts would spread over the others
        log.info("operator splits: not tried for algorithm='single' (one device)")
        return plan, graphs
    if opts.train.training_replicas > 1:
        # replicas=R given (or chosen on a training step's full batch): each copy holds its weights whole
        log.info("operator splits: not tried for %d copies asked for (replicas=)", opts.train.training_replicas)
        return plan, graphs
    if mode == "auto" and len({device_host(n) for n in devset.names}) == 1 and \
            {device_kind(n) for n in devset.names} == {"CPU"}:
        # one process's logical CPUs run their ops on one pool of threads: parts side by side there are
        # predicted faster only by a noisy shared-capacity measurement, and a split may round differently
        line = "operator splits: not tried (the devices are one process's CPUs, sharing its threads)"
        log.info(line)
        return replace(plan, log=(*plan.log, line)), graphs
    found = split_candidates(traced.fixed.graph, traced.fixed_captures[0], len(devset), opts.split.split_min_bytes,
                             pairs=opts.split.split_pairs)
    if mode == "auto":  # a lookup's every part gathers all ids: split for memory (_required_splits), never for speed
        found = [s for s in found if s.kind == "columns"]
    if not found:
        log.info("operator splits: no dense product reads a weight of %d bytes or more", opts.split.split_min_bytes)
        return plan, graphs
    families = [found]  # with pairs where they can be, and (auto) each product by columns: the search picks
    if mode == "auto" and any(s.pair is not None for s in found):
        families.append([s for s in split_candidates(traced.fixed.graph, traced.fixed_captures[0], len(devset),
                                                     opts.split.split_min_bytes) if s.kind == "columns"])
    whole = graphs.op_graph.graph
    prompt = _prompt_sends(opts, devset)
    whole_s = _step_with_sends(traced, plan, graphs, prompt, _orders(opts, devset, plan))
    margin = opts.solve.split_margin or 0.0
    if mode == "auto":  # before profiling (a whole trace): only splits that could save more than they send
        families, line = _splits_that_could_pay(families, whole, devset, margin * whole_s)
        if not families:
            log.info(line)
            return replace(plan, log=(*plan.log, line)), graphs
    scored: list[tuple[float, int, Plan, _Graphs]] = []
    starts = []  # per family: its measured graph, its splits, and its best greedy plan's scored entry and subset
    for family in families:  # one profile of each family's splits; the largest weights first: 1, half, all
        measured = _measured_parts(traced, _split(graphs.op_graph, family), family, costs, devset, opts)
        tried = _largest_first(family, graphs.op_graph)
        here = []
        for subset in (tried[-1:] if mode == "all" else tried):
            split = _subset_graphs(measured, graphs.op_graph, subset, devset, opts)
            for p in _split_plans(traced, split, subset, devset, opts):
                entry = (_step_with_sends(traced, p, split, prompt, _orders(opts, devset, p)), len(scored), p, split)
                scored.append(entry)
                here.append((entry, subset))
        starts.append((measured, family, min(here, key=lambda t: t[0][:2])))
    moved = ""
    if mode == "auto":  # then layer by layer, from the best greedy plan, in its family
        measured, family, ((start_s, start_i, start, start_split), subset) = min(starts, key=lambda t: t[2][0][:2])
        moved, toggles = _descend_splits(traced, graphs, measured, family, subset, start, start_split, start_s,
                                         devset, opts, prompt)
        for step_s, p, split in toggles:  # where it moved, its plan first: a toggle as fast comes later
            scored.append((step_s, len(scored), p, split))
    best_s, best_i, best, split = min(scored, key=lambda t: t[:2])
    assert split is not None  # the descent's other toggles are no faster than where it ended
    faster = best_s < whole_s * (1.0 - margin)
    what = (f"{len(best.splits)} of {len(split_map(found))} products split {len(devset)} ways ("
            f"{len(best.pairs)} column-then-row pairs, of {len(scored)} split plans scored: the largest weights"
            f"{moved}, sharded; {best.solver}) predicted {1e3 * best_s:.3f} ms against {1e3 * whole_s:.3f} ms whole"
            + (" (both with the transfers prompt sends acknowledge)" if prompt else ""))
    keep = mode == "all" or faster
    line = f"operator splits: {what}: " + (("split" + ("" if faster else " (splits='all')")) if keep else
                                           f"kept whole (a split must be predicted {100 * margin:.0f}% faster)")
    log.info(line)
    out = replace(best, log=(*best.log, *notes), candidates=plan.candidates) if keep else plan
    for step_s, i, p, _ in scored:
        cand = p.as_candidate(step_s, note=line if i == best_i else "")
        if i != best_i:
            cand = cand.with_outcome(f"slower than the best split ({1e3 * best_s:.3f} ms)")
        elif not keep:
            cand = cand.with_outcome(f"not {100 * margin:.0f}% (split_margin) faster than whole ops "
                                     f"({1e3 * whole_s:.3f} ms as emitted)")
        out = out.scored(cand, kept=keep and i == best_i)
    return replace(out, log=(*out.log, line)), (split if keep else graphs)


def _split_plans(traced: TracedModel, split: _Graphs, subset: Sequence[Split], devset: DeviceSet,
                 opts: PlacementOptions) -> list[Plan]:
    """The plans the splits stage scores for ``subset`` split (``split``, its graphs): the solver's, and the same
    with each split's parts side by side (:func:`~placer.core.splits.spread_parts`; left out where that exceeds
    a device's memory)."""
    splits, pairs = split_map(subset), pair_ops(subset)
    solved = replace(_solve(split.built, opts.solve, None, traced.batch_size, opts.emit.compression),
                     splits=splits, pairs=pairs)
    plans = [solved]
    parts_apart = replace(solved, assignment=spread_parts(solved.assignment, subset, devset.names), op_order={})
    try:
        plans.append(replace(_solve(split.built, opts.solve, parts_apart, traced.batch_size, opts.emit.compression),
                             splits=splits, pairs=pairs, solver=f"{solved.solver}, parts spread"))
    except PlanError as e:  # the parts side by side exceed a device's memory: the solver's plan alone
        log.info("operator splits: %d parts side by side do not fit (%s)", len(subset), e)
    return plans


def _descend_splits(traced: TracedModel, graphs: _Graphs, measured: OpGraph, family: Sequence[Split],
                    subset: Sequence[Split], start: Plan, start_split: _Graphs, start_s: float, devset: DeviceSet,
                    opts: PlacementOptions, prompt: bool) -> tuple[str, list[tuple[float, Plan, _Graphs | None]]]:
    """The splits stage's choice layer by layer (:func:`~placer.core.splits.descend_splits`): from ``start`` (the
    best plan of the greedy subsets, ``subset`` of ``family`` split), each layer of ``family`` toggled — split
    one more (its parts side by side, :func:`~placer.core.splits.split_apart`) or a split one whole where its
    join ran (:func:`~placer.core.splits.rejoined`) — the rest of the plan kept, each scored as emitted
    (:func:`_step_with_sends`), the fastest faster one moved to, at most ``split_toggles`` scores (each a
    problem built and a plan simulated as emitted: tenths of a second on a wide MLP's graph).

    Returns ``(words for the log line, [(step, plan, graphs)])``: the plan it ended at first where it moved (its
    graphs with it), then every other toggle scored (graphs ``None``: each is slower than the first or as fast,
    and listed among the plan's candidates only)."""
    current = frozenset(family.index(s) for s in subset)
    plans = {current: (start, start_split)}
    tried: dict[frozenset[int], float] = {}

    def step_s(current: frozenset[int], i: int) -> float | None:
        plan, split = plans[current]
        toggled = current ^ {i}
        chosen = [family[j] for j in sorted(toggled)]
        new = _subset_graphs(measured, graphs.op_graph, chosen, devset, opts)
        nodes = new.op_graph.graph.nodes
        a = (rejoined(plan.assignment, [family[i]], nodes) if i in current else
             split_apart(plan.assignment, [family[i]], devset.names, nodes))
        if a is None:
            return None
        try:
            p = replace(_solve(new.built, opts.solve, replace(plan, assignment=a, op_order={}), traced.batch_size,
                               opts.emit.compression),
                        splits=split_map(chosen), pairs=pair_ops(chosen),
                        solver=f"{plan.solver.removesuffix(', layer by layer')}, layer by layer")
        except PlanError as e:  # e.g. a layer whole no longer fits its device
            log.info("operator splits: layer %s toggled does not fit (%s)", family[i].op, e)
            return None
        plans[toggled] = (p, new)
        tried[toggled] = _step_with_sends(traced, p, new, prompt, _orders(opts, devset, p))
        return tried[toggled]

    chosen, best_s, evaluations = descend_splits(current, start_s, len(family), step_s,
                                                 max_evaluations=opts.split.split_toggles)
    out: list[tuple[float, Plan, _Graphs | None]] = [(best_s, *plans[chosen])] if chosen != current else []
    out += [(s, plans[t][0], None) for t, s in tried.items() if t != chosen]
    words = (f", then {evaluations} layers toggled one at a time"
             + (f" ({len(chosen)} split, {1e3 * best_s:.3f} ms against {1e3 * start_s:.3f} ms)" if chosen != current
                else " (none faster)"))
    log.info("operator splits: layer by layer from %d of %d split: %d toggles scored, %s", len(current), len(family),
             evaluations, "moved" if chosen != current else "none faster")
    return words, out


def _simulated_order(traced: TracedModel, plan: Plan, graphs: _Graphs, devset: DeviceSet,
                     opts: PlacementOptions) -> Plan:
    """The order stage (``execution_order="simulated"``, autoplace's default): where the devices' executors run
    one op at a time depth first (one-thread workers: ready order ``"lifo"``), a plan of one copy in one
    micro-batch over several devices gets the order its own simulation (its prompt sends' acknowledgements
    included) ran its ops of :data:`~placer.core.order.SIMULATED_ORDER_MIN_OP_S` or more in
    (:func:`~placer.core.order.timeline_order`; ``Plan.op_order``, control edges in the placed graph), and is
    predicted in that order. TensorFlow's executor chooses among ready ops by the order of the graph's edges,
    which nothing predicts: on two workers it ran layers' weight gradients before the input gradients the other
    worker waited for (``docs/costs.md``). Where the ordered plan of the default solver is no longer
    ``split_margin`` faster than one device, the one-device plan replaces it (a solver asked for by name keeps
    its plan, and so does a plan with splits: the splits stage compared it with whole ops in this order)."""
    if not _orders(opts, devset, plan):
        return plan
    built = graphs.built
    a, free, order, ordered = _ordered(traced, plan, graphs, _prompt_sends(opts, devset))
    single = None  # one device replaces a plan only where the default solver chose it (as in pipeline_plan)
    # and not a split plan: the splits stage compared it, in this order, with whole ops (one device included);
    # one device of the split graph would run every part there, never faster than whole ops
    if opts.solve.algorithm == DEFAULT_SOLVER and not plan.splits:
        try:
            single = _solve(built, replace(opts.solve, algorithm="single"), None, traced.batch_size,
                            opts.emit.compression)
        except (InsufficientMemoryError, NoFeasiblePlanError):  # no device holds it: the ordered plan stands
            pass
    margin = opts.solve.split_margin or 0.0
    keep = single is None or ordered.step_time_s < single.predicted_step_time_s * (1.0 - margin)
    line = (f"execution order: {sum(map(len, order))} ops of {1e3 * SIMULATED_ORDER_MIN_OP_S:g} ms or more fixed "
            f"in the plan's simulated order: predicted {1e3 * ordered.step_time_s:.3f} ms (executor's order: "
            f"{1e3 * free.step_time_s:.3f} ms)"
            + ("" if single is None else f"; one device {1e3 * single.predicted_step_time_s:.3f} ms") + ": "
            + ("kept" if keep else f"one device (the ordered plan is not {100 * margin:.0f}% (split_margin) "
                                   "faster)"))
    log.info(line)
    if not keep:
        one = Candidate("one device", "single", 1, 1, 1, len(plan.splits), single.predicted_step_time_s,
                        max(single.predicted_peak_memory_bytes, default=None), KEPT, line)
        return replace(single, log=(*single.log, line), candidates=plan.candidates).scored(one, kept=True)
    unacked = built.simulate(a, order=order).step_time_s  # the emit stage adds the acknowledgements' change
    out = replace(plan, op_order=built.op_order(order), predicted_step_time_s=unacked, log=(*plan.log, line))
    return out.scored(out.as_candidate(ordered.step_time_s, note=line), kept=True)


def _splits_that_could_pay(families: list[list[Split]], whole: Any, devset: DeviceSet, needed_s: float
                           ) -> tuple[list[list[Split]], str]:
    """Each family's splits whose optimistic saving (:func:`~placer.core.splits.split_saving_s`, at the devices'
    slowest link) is positive, and the families whose splits together could save ``needed_s``; with a log
    line where none can (profiling a split trace is a whole trace's profile: on ResNet50 it was most of a
    placement)."""
    bw, lat, _ = devset.arrays()
    off = ~np.eye(len(devset), dtype=bool)
    bandwidth, latency = float(np.min(bw[off])), float(np.max(lat[off]))
    kept, best = [], 0.0
    for family in families:
        saving = {s.op: split_saving_s(whole, s, bandwidth, latency) for s in family}
        paying = [s for s in family if saving[s.op] > 0]
        total = sum(saving[s.op] for s in paying)
        best = max(best, total)
        if paying and total >= needed_s:
            kept.append(paying)
    line = (f"operator splits: not tried: the {len(families[0])} candidates could save at most "
            f"{1e3 * best:.3f} ms (their ops' time shared perfectly, less their inputs and outputs sent at "
            f"{bandwidth / 1e9:.2f} GB/s), below the {1e3 * needed_s:.3f} ms a split must save (split_margin)")
    return kept, line


def _trace(shell: PlacedModel, model: keras.Model, opts: PlacementOptions, batch_size: int | None,
           replicas: int = 1) -> tuple[TracedModel, tuple[tf.TensorSpec, ...]]:
    """The trace stage: the planned trace (the training step on ``shell``, or the forward pass) and the
    model's input specs."""
    t = opts.train
    if t.training:
        return trace_training(shell, model, batch_size=batch_size, input_signature=opts.trace.input_signature,
                              targets=t.targets, optimizer=t.optimizer, loss=t.loss, metrics=t.metrics,
                              loss_weights=t.loss_weights, replicas=replicas, split_batch_norm=t.split_batch_norm)
    traced = trace_model(model, batch_size=batch_size, input_signature=opts.trace.input_signature)
    return traced, traced.input_specs


def _microbatches(model: keras.Model, built: BuiltProblem, plan: Plan, devset: DeviceSet, opts: PlacementOptions,
                  microbatches: int | str, fallback: bool, order: str = "auto", replicas: int | str = 1,
                  parameter_codec: ParameterCodec | None = None, group_plan: Callable[[int], Plan] | None = None
                  ) -> tuple[Plan, SmallBatchCosts | None]:
    """The microbatches stage: how many micro-batches the plan runs as, and its pipelined predicted step; for a
    forward pass, also whether a copy of the model per device (data parallelism, ``replicas``) replaces it.

    Op times on a micro-batch are not the batch's divided by ``m``: the ops are profiled again at the
    smallest micro-batch (or data-parallel copy) tried and at half the batch
    (:class:`placer.core.microbatch.SmallBatchCosts`). With
    ``fallback``, one device at its best count replaces the plan where it is predicted faster
    (:func:`placer.planner.pipeline_plan`); then the copies where they are (:func:`placer.planner.replica_plan`).
    Returns the plan and those costs (``None`` where nothing was profiled again). ``parameter_codec``: the
    codec of the copies' weights and gradients (:func:`parameter_codec`); ``group_plan``: a copy placed over
    the first ``size`` devices (:func:`_group_plan`), for copies of several devices each.
    """
    batch = int(plan.batch_size or 1)
    split_margin = opts.solve.split_margin or 0.0  # None: the solver's plan unless one device is faster
    training_replicas = opts.train.training_replicas
    if microbatches != 1 and microbatches != "auto" and batch % int(microbatches):
        rows = (f"each replica's {batch} rows (batch size {batch * training_replicas} over "
                f"replicas={training_replicas})" if training_replicas > 1 else f"the batch size {batch}")
        raise InputSignatureError(f"microbatches={microbatches} does not divide {rows}; pick a divisor of {batch} "
                                  "or microbatches='auto'")
    candidates = candidate_microbatches(batch) if microbatches == "auto" else [int(microbatches)]
    # split_batch_norm lets batch normalization run in parts where the parts are asked for; a search does not try
    # them: its prediction of them is not validated (ResNet50's copies were predicted 40% short, docs/results.md)
    split_bn = opts.train.split_batch_norm
    if opts.train.training:  # the micro-batches must give the full-batch step
        allowed = []
        for m in candidates:
            try:
                check_replicable(model, m, batch, what="microbatches",
                                 split_batch_norm=split_bn and microbatches != "auto")
                allowed.append(m)
            except TrainingError:
                if microbatches != "auto":
                    raise
        candidates = allowed
    # replicas="auto" is the default solver's search, as the one-device fallback is; replicas=R is always honoured
    # (a training step's R groups are traced and planned as such: _first_stages)
    searched = replicas == "auto" and fallback
    # (a training step traced as one replica's was asked for its copies: they are planned already)
    asked = replicas != "auto" and replicas != 1 and (not opts.train.training or opts.train.training_replicas == 1)
    copies = len(devset) if len(devset) > 1 and (searched or asked) else 1
    if copies > 1 and opts.train.training:
        try:  # one micro-batch per replica: the replicas' parts must give the full-batch step
            check_replicable(model, copies, batch, split_batch_norm=split_bn and asked)
        except TrainingError as e:
            if asked:
                raise
            log.info("data parallelism is not an alternative for this training step: %s", e)
            copies = 1
    per_copy = ([1] if opts.train.training else [m for m in candidates if copies * m <= batch]) if copies > 1 else []
    smallest = min([batch // max(candidates)] + ([batch // (copies * max(per_copy))] if per_copy else []))
    # the smallest part tried, and half the batch where it lies between (two copies' or micro-batches' rows): op
    # times are not affine in the rows between the smallest part and the batch (SmallBatchCosts)
    profiled = sorted({b for b in (smallest, batch // 2) if smallest <= b < batch})
    # half the batch measures its own runtime factor; the smallest part, mostly its call's fixed cost, takes it
    durations: dict[int, np.ndarray] = {}
    factor: Mapping[str, float] | None = None
    for b in reversed(profiled):
        durations[b], factor = _durations_at(model, built, devset, opts, b, batch, factor)
    small = SmallBatchCosts(tuple(profiled), tuple(durations[b] for b in profiled)) if profiled else None
    out = pipeline_plan(built, plan, opts.solve, batch, candidates, small=small, fallback=fallback,
                        split_margin=split_margin, order=order)
    if len(candidates) > 1 or candidates[0] > 1:
        log.info("%d micro-batches per batch%s: predicted step %.3f ms (%.3f ms without; ops profiled again at "
                 "batch %s)", out.microbatches, " (1F1B)" if out.pipeline == "1f1b" else "",
                 1e3 * out.predicted_step_time_s, 1e3 * plan.predicted_step_time_s,
                 " and ".join(map(str, profiled)))
    if copies > 1:
        out = replica_plan(built, out, opts.solve, batch, replicas, candidates, small=small,
                           parameter_codec=parameter_codec, group_plan=group_plan)
    return out, small


def _group_plan(op_graph: OpGraph, devset: DeviceSet, size: int, options: PlanOptions) -> Plan:
    """One data-parallel copy placed over the first ``size`` devices (a group of copies over several devices
    each: :func:`placer.planner.replica_plan`), solved as any plan is."""
    log.info("placing one data-parallel copy over %d devices", size)
    return plan_problem(build_problem(op_graph.graph, devset.first(size), group_by=options.group_by), options)


def _durations_at(model: keras.Model, built: BuiltProblem, devset: DeviceSet, opts: PlacementOptions, rows: int,
                  batch: int, runtime_factor: Mapping[str, float] | None) -> tuple[np.ndarray, Mapping[str, float]]:
    """``built``'s ``(fine nodes, devices)`` op seconds with the model traced and profiled again at ``rows`` rows
    (``built`` is at ``batch``; an op that trace lacks keeps its time scaled by the rows), and the runtime
    factor per kind they carry.

    ``runtime_factor=None``: the profile measures its own (:func:`placer.tf.timing.runtime_factor`, for a
    forward pass). Else it is scaled by the one given: a small step is mostly its call's fixed cost, and the
    factor of a 4-tower MLP's 32-row step (its step less its call, over the session's) came out 0.33 and 0.81
    in two placements a minute apart, its 8 micro-batches predicted 4.3 and 11.7 ms; with the 256-row
    batch's factor instead, 18-21 ms, steadily too high (measured 14.4-16.6 ms: the factor falls with the
    rows), and its 2 micro-batches went from -0.3% to +23.9% off (2026-12-06). So the half batch measures its
    own and the smaller part takes that (:func:`_microbatches`)."""
    traced, _ = _trace(PlacedModel(model), model, opts, rows)
    profile_on, table_rows = _profiling(traced, devset, again=True)
    kinds = sorted({d.kind for d in devset.devices})
    if runtime_factor is None:
        costs = compute_costs(traced, kinds, opts.costs, profile_on, table_rows=table_rows)
        us, factor = costs.us, dict(costs.runtime_factor)
    else:
        costs = compute_costs(traced, kinds, replace(opts.costs, runtime=False), profile_on, table_rows=table_rows)
        us = {kind: {name: t * runtime_factor.get(kind, 1.0) for name, t in times.items()}
              for kind, times in costs.us.items()}
        factor = dict(runtime_factor)
    other = build_problem(build_op_graph(traced, us).graph, devset, group_by=opts.solve.group_by)
    row = {name: i for i, name in enumerate(other.nodes)}
    durations = built.schedule.durations_s * (rows / batch)
    for i, name in enumerate(built.nodes):
        if name in row:
            durations[i] = other.schedule.durations_s[row[name]]
    return durations, factor


def _with_sample(model: keras.Model, opts: PlacementOptions) -> PlacementOptions:
    """``opts`` with the input signature, batch size and (training) targets of ``sample=``, where not given."""
    sample = opts.trace.sample
    if sample is None:
        return opts
    x, y = sample, None
    if opts.train.training:
        if not (isinstance(sample, tuple) and len(sample) == 2):
            raise InputSignatureError("for training, sample= is one batch (x, y): the inputs and their labels")
        x, y = sample
    signature, batch = signature_from_sample(model, x)
    changes: dict[str, Any] = {}
    if opts.trace.input_signature is None:
        changes["input_signature"] = signature
    if opts.trace.batch_size is None:
        changes["batch_size"] = batch
    if y is not None and opts.train.targets is None:
        changes["targets"] = tf.nest.map_structure(
            lambda a: with_batch(tf.TensorSpec.from_tensor(tf.convert_to_tensor(a)), None), y)
    return opts.replace(**changes)


@dataclass(frozen=True)
class _FirstStages:
    """What :data:`PROFILE_STAGES` give :func:`autoplace` and :func:`profile`."""

    options: PlacementOptions                # the options, with what ``sample=`` says filled in
    devices: DeviceSet                       # the devices planned on (the first data-parallel group's)
    groups: tuple[tuple[str, ...], ...]      # the data-parallel groups of devices (one: all of them)
    shell: PlacedModel
    traced: TracedModel
    input_specs: tuple[tf.TensorSpec, ...]
    costs: ComputeCosts


def _first_stages(model: Any, devices: Sequence[Any], opts: PlacementOptions, timer: StageTimer) -> _FirstStages:
    """The stages :data:`PROFILE_STAGES` (devices, trace, costs) that :func:`autoplace` and :func:`profile`
    share."""
    available = [d.name for d in tf.config.list_logical_devices()]
    with timer.stage("devices"):
        all_devices = resolve_devices(devices, available=available)
    groups = _data_parallel_groups(all_devices, opts)
    devset = all_devices if len(groups) == 1 else resolve_devices(list(devices)[:len(groups[0])], available)
    with timer.stage("trace"):
        check_model(model)  # before the shell wraps it
        opts = _with_sample(model, opts)
        shell = PlacedModel(model)
        traced, input_specs = _trace(shell, model, opts, opts.trace.batch_size, opts.train.training_replicas)
        # refused before anything runs on the devices (profiling puts every weight on one of them)
        check_total_memory([(v.path, variable_bytes(v)) for v in traced.fixed_captures[0].values()],
                           devset.arrays()[2], "the model")
    with timer.stage("costs"):
        profile_on, table_rows = _profiling(traced, devset)
        costs = compute_costs(traced, sorted({d.kind for d in devset.devices}), opts.costs, profile_on,
                              table_rows=table_rows)
        for name, events in costs.pool_events.items():  # what the profile left in that worker's pool
            if name in devset.names:
                devset = devset.with_pool_events(devset.names.index(name), events)
    return _FirstStages(opts, devset, tuple(groups), shell, traced, tuple(input_specs), costs)


def _hosts(model: keras.Model, traced: TracedModel, devset: DeviceSet, opts: PlacementOptions,
           costs: ComputeCosts | None = None) -> tuple[DeviceSet, str]:
    """The hosts stage: the links between processes, calibrated (``calibrate_links``), and the processors
    ``devset``'s devices share (``shared_capacity``), and their executors' ready order (``ready_order``).

    The measured figures are kept in the profile cache beside the op times they were measured with, and read
    back while the profile is (a warm cache gives the same figures, so the same plan); they are measured again
    when the op times are. Returns the devices and a line for the plan's log saying where the figures came
    from."""
    hosts = opts.hosts
    order = hosts.ready_order
    if order == "detect":
        order, why = executor_ready_order(devset)
        log.info("executors' ready order: %s (%s)", order, why)
    devset = replace(devset, ready_order=order)
    calibrate = hosts.calibrate_links and len({d.host for d in devset.devices}) > 1
    groups = sharing_groups(devset) if hosts.shared_capacity is not None else []
    if hosts.shared_capacity == "measure":  # measuring runs the model whole on each device of a group
        fits = _holds_whole(traced, devset)
        unfit = [g for g in groups if not all(fits[i] for i in g[0])]
        for group, _ in unfit:
            log.info("devices %s: their shared capacity is not measured (the model does not fit one of them "
                     "whole); planned as separate processors", [devset.names[i] for i in group])
        groups = [g for g in groups if g not in unfit]
    measure_shared = bool(groups) and hosts.shared_capacity == "measure"
    cache = opts.costs.profile_cache() if calibrate or measure_shared else None
    key = _host_key(traced, devset, calibrate, measure_shared, costs) if cache is not None else None
    fresh_profile = costs is None or any(src == "measured" for src in costs.source.values())
    what = ", ".join(w for w, on in (("calibrated links", calibrate), ("shared capacities", measure_shared)) if on)
    if key is not None and not fresh_profile:
        cached = cache.get_figures(key)
        if cached is not None:
            try:
                out = _with_host_figures(devset, cached)
            except (AutoplaceError, KeyError, TypeError, ValueError, IndexError) as e:
                log.warning("ignoring the cached host figures (%s); measuring them again", e)
            else:  # the cache keys them by worker process: those processes were calibrated, their pools show it
                calibrated = [(i, j) for i, j in out.fits if i < j and (i, j) not in devset.fits]
                out = with_calibration_history(out, calibrated)
                return out, f"host figures ({what}) from the profile cache"
    if calibrate:
        devset = calibrate_links(devset, cross_process_only=True, transfer_cpu=True)[0]
    if groups:
        given = None if hosts.shared_capacity == "measure" else float(hosts.shared_capacity)
        forward = traced
        if given is None and traced.step != "predict":  # a training step's copies would update the variables
            forward = trace_model(model, batch_size=traced.batch_size, input_signature=opts.trace.input_signature)
        work_s = None
        if costs is not None and forward is traced and "CPU" in costs.us:
            work_s = sum(costs.us["CPU"].values()) * 1e-6
        devset = shared_processors(forward, devset, groups, given=given, seed=hosts.seed, work_s=work_s)
        if given is None:  # the probe's weight copies on each worker process, dropped after
            for i in sorted({i for group, pooled in groups if not pooled for i in group}):
                devset = devset.with_pool_events(i, weight_copy_events("shared-capacity probe", forward))
        for sp in devset.shared:
            log.info("devices %s share one %s: capacity %.2f (%s)", [devset.names[i] for i in sp.devices],
                     "processor" if sp.pooled else "machine", sp.capacity, sp.source)
    if key is not None:
        cache.put_figures(key, _host_figures(devset))
    return devset, (f"host figures ({what}) measured now" if what else "")


def _host_key(traced: TracedModel, devset: DeviceSet, calibrate: bool, shared: bool,
              costs: ComputeCosts | None) -> dict[str, Any]:
    """What the host figures depend on: the model's graph (the fingerprint its profile is keyed by), the devices
    (and each worker *process*: a restarted worker is measured again), TensorFlow, what is measured."""
    workers = worker_addresses(devset.names)
    graph = costs.fingerprint if costs is not None and costs.fingerprint else fingerprint(
        traced.fixed.graph.as_graph_def().SerializeToString(deterministic=True))
    return {"of": "hosts", "graph": graph, "batch": int(traced.batch_size), "devices": list(devset.names),
            "workers": [worker_identity(a) for _, a in sorted(workers.items())], "tf": tf.__version__,
            "calibrate": calibrate, "shared": shared, "ready_order": devset.ready_order,
            "figures": 2}  # 2: links keep their measured times (Link.points)


def _host_figures(devset: DeviceSet) -> dict[str, Any]:
    """The measured host figures of ``devset``, JSON-ready (:func:`_with_host_figures` reads them back)."""
    return {"links": [[i, j, f.link.bandwidth_bytes_per_s, f.link.latency_s, devset.links[i, j].cpu_s, f.r2,
                       f.max_rel_error, f.points, [list(p) for p in devset.links[i, j].points]]
                      for (i, j), f in sorted(devset.fits.items())],
            "shared": [[list(sp.devices), sp.capacity, sp.pooled] for sp in devset.shared]}


def _with_host_figures(devset: DeviceSet, figures: Mapping[str, Any]) -> DeviceSet:
    """``devset`` with the links and shared processors of cached ``figures``."""
    links, fits = dict(devset.links), dict(devset.fits)
    for i, j, bandwidth, latency, cpu_s, r2, max_rel, points, measured in figures["links"]:
        fit = Link(float(bandwidth), float(latency), points=tuple((float(b), float(t)) for b, t in measured))
        links[i, j] = replace(fit, cpu_s=float(cpu_s))  # as calibrate_links makes them
        fits[i, j] = LinkFit(fit, float(r2), float(max_rel), int(points))
    shared = tuple(SharedProcessor(tuple(d), float(capacity), "measured", bool(pooled))
                   for d, capacity, pooled in figures["shared"])
    return replace(devset, links=links, fits=fits, shared=shared or devset.shared)


def _inputs_note(costs: ComputeCosts, hosts_note: str) -> tuple[str, ...]:
    """The plan's log lines saying which measured figures it was made with, and where they came from."""
    kinds = ", ".join(f"{kind} {src}" + (f" × runtime factor {costs.runtime_factor[kind]:.3f}"
                                         if kind in costs.runtime_factor else "")
                      for kind, src in sorted(costs.source.items()))
    return (f"op times: {kinds}",) + ((hosts_note,) if hosts_note else ())


def _call_overhead(traced: TracedModel, plan: Plan) -> Plan:
    """The calls stage: the plan's fixed cost per call, measured (a stand-in with the placement's inputs,
    outputs, captured variables and devices and no compute: :func:`placer.tf.timing.plan_call_seconds`),
    added to its predicted step."""
    groups = device_groups(plan.devices, plan.replicas) if plan.replicas > 1 else ()
    call_s = plan_call_seconds(traced, plan.assignment, groups=groups)
    log.info("fixed cost of one call of the plan: %.3f ms (measured)", call_s * 1e3)
    return replace(plan, call_overhead_s=call_s, predicted_step_time_s=plan.predicted_step_time_s + call_s)


@dataclass(frozen=True)
class _Emitted:
    """What the emit stage gives the report stage and the placement record."""

    plan: Plan                     # its predicted step that of the step as emitted
    functions: PlacedFunctions
    planned: EmittedModel
    variables: Mapping[int, Any]
    simulation: SimResult          # the step as emitted, simulated once


def _emit(first: _FirstStages, plan: Plan, op_graph: OpGraph, devset: DeviceSet, built: BuiltProblem,
          policy: CompressionPolicy, groups: tuple[tuple[str, ...], ...], opts: PlacementOptions) -> _Emitted:
    """The emit stage: every variable on its planned device, the planned function emitted, then the step as
    emitted simulated once (its acknowledged transfers, :mod:`placer.tf.rewrites.sends`, where it is neither
    pipelined nor replicated): the plan's predicted step changes by what they change."""
    shell, traced = first.shell, first.traced
    prompt = _prompt_sends(opts, devset)
    variables = place_variables(traced, plan, devset, shell.known_variables(), shell.source_model().variables)
    functions = PlacedFunctions(plan=plan, op_graph=op_graph, compression=policy, replica_groups=groups,
                                prompt_sends=prompt, variables=variables, tracer=shell, input_specs=first.input_specs)
    planned = (functions.forward(False) if traced.step == "predict"
               else functions.step(traced.step, traced.data_structure))
    say_what_compression_did(policy, planned)
    acks = acknowledged_nodes(built, planned.sends) if plan.microbatches == 1 and plan.replicas == 1 and \
        opts.train.training_replicas == 1 else ()
    a = built.group_assignment(plan.assignment)
    order = built.order_of(plan.op_order, a) if plan.microbatches == 1 else ()
    sim = built.simulate(a, SimOptions(acknowledged=acks), order=order)
    if acks:  # their round trips, and the sends that no longer wait
        change = sim.step_time_s - built.simulate(a, order=order).step_time_s
        log.info("predicted step with %d acknowledged transfers: %+.3f ms", len(acks), change * 1e3)
        plan = replace(plan, predicted_step_time_s=plan.predicted_step_time_s + change)
    return _Emitted(plan, functions, planned, variables, sim)


def _plan_splits(traced: TracedModel, plan: Plan) -> list[Split]:
    """``plan``'s splits as found on ``traced`` (``Plan.splits`` names their ops; none: ``[]``)."""
    return split_candidates(traced.fixed.graph, traced.fixed_captures[0], plan.splits,
                            pairs=plan.pairs) if plan.splits else []


def _report(first: _FirstStages, emitted: _Emitted, op_graph: OpGraph, built: BuiltProblem,
            small: SmallBatchCosts | None, opts: PlacementOptions, seconds: Mapping[str, float],
            model_name: str, parameter_codec: ParameterCodec | None = None) -> Report:
    """The report stage (:func:`placer.tf.report.build_report`), with the pipelined step simulated where the
    plan has micro-batches."""
    plan = emitted.plan
    piped = None
    if plan.replicas > 1:
        piped = simulate_replicas(built, built.group_assignment(plan.assignment), plan.replicas, plan.microbatches,
                                  small=small, batch_size=plan.batch_size, parameter_codec=parameter_codec)
    elif plan.microbatches > 1:
        piped = simulate_pipeline(built, built.group_assignment(plan.assignment), plan.microbatches, small=small,
                                  batch_size=plan.batch_size, order=plan.pipeline)
    return build_report(plan, op_graph, built, emitted.simulation, first.costs, opts.costs.grappler,
                        emitted.planned, dict(seconds), model_name, pipeline_sim=piped,
                        splits=_plan_splits(first.traced, plan))


@dataclass(frozen=True)
class ModelProfile:
    """What :func:`profile` measured: the op times of one model's trace on each device kind.

    Attributes
    ----------
    costs : ComputeCosts
        µs per op per device kind, and each kind's source (measured, cached or analytic).
    op_types : Mapping[str, str]
        Op name → TensorFlow op type.
    step : str
        The traced step (``predict`` or ``train``).
    batch_size : int
        The batch size the ops were timed at.
    stage_seconds : Mapping[str, float]
        Wall seconds of the devices, trace and costs stages.
    """

    costs: ComputeCosts
    op_types: Mapping[str, str]
    step: str
    batch_size: int
    stage_seconds: Mapping[str, float]


def profile(model: Any, devices: Sequence[Any], **options: Any) -> ModelProfile:
    """Trace ``model`` and time its ops on each kind of ``devices`` (filling the profile cache), without placing.

    Runs the first stages of :func:`autoplace` with the same options (``batch_size``, ``training``,
    ``profile_repeats``, ``profile_cache``, ...); a later ``autoplace`` with the same options reads
    these times from the cache.

    Examples
    --------
    >>> import keras, placer
    >>> from placer.tf.runner import profile
    >>> m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    >>> prof = profile(m, ["/CPU:0"], batch_size=2, profile_cache=False)
    >>> prof.costs.source["CPU"], prof.step, prof.batch_size
    ('measured', 'predict', 2)
    """
    opts = PlacementOptions(**options)
    timer = StageTimer(progress=opts.progress)
    first = _first_stages(model, devices, opts, timer)
    types = {op.name: op.type for op in first.traced.fixed.graph.get_operations()}
    return ModelProfile(first.costs, types, first.traced.step, int(first.traced.batch_size), dict(timer.seconds))


def autoplace(model: Any, devices: Sequence[Any], *, plan: Plan | str | os.PathLike | None = None,
              **options: Any) -> PlacedModel:
    """Place a Keras model's ops on ``devices`` and return a placed model.

    Parameters
    ----------
    model : keras.Model
        A built Keras 3 model (TensorFlow backend). It is never modified.
    devices : sequence
        Device strings (``"/CPU:1"``, ``"/GPU:0"``,
        ``"/job:worker/replica:0/task:1/device:CPU:0"``),
        ``tf.config.LogicalDevice`` objects or :class:`placer.DeviceSpec`.
    plan : Plan or path, optional
        A plan saved from an earlier placement of the same model
        (``placed.plan.save(path)``): it is re-applied without solving (and
        re-scored with this run's costs). It runs as the micro-batches it was
        made with unless ``microbatches=`` is given; ``group_by=`` or
        ``objective=`` other than the plan's raise :class:`PlanError`.
    **options
        The options of :class:`~placer.tf.options.PlacementOptions`, flat (``batch_size=``, ``objective=``,
        ``training=``, ``microbatches=``, …; each group's docstring says what they do).

    Returns
    -------
    PlacedModel

    Raises
    ------
    ModelError, InputSignatureError, DeviceError, InsufficientMemoryError,
    NoFeasiblePlanError, PlanError, AutoplaceError
        Each with a message that starts with the stage that raised it and says what to change.

    Examples
    --------
    >>> import keras, numpy as np, placer
    >>> m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    >>> placed = placer.autoplace(m, ["/CPU:0"], batch_size=2, time_limit_s=1)
    >>> x = np.ones((2, 4), "float32")
    >>> bool(np.array_equal(placed(x).numpy(), m(x).numpy()))
    True
    >>> again = placer.autoplace(m, ["/CPU:0"], batch_size=2, plan=placed.plan)
    >>> again.plan.assignment == placed.plan.assignment, again.plan.solver
    (True, 'given')
    """
    return _autoplace(model, devices, plan, options)


def _autoplace(model: Any, devices: Sequence[Any], plan: Plan | str | os.PathLike | None, options: Mapping[str, Any],
               chosen: Plan | None = None, asked: int | None = None) -> PlacedModel:
    """:func:`autoplace`. ``chosen``: the decision of ``replicas="auto"`` (or of ``asked``) for a training step
    (made on the full batch's trace, with the data-parallel step predicted there), re-planned here with
    ``replicas=R``: its log line and predicted step replace those of one replica's plan. ``asked``: a training
    step's ``replicas=R`` with one device per copy, traced whole (``options`` say ``replicas="auto"``) so that its
    copies' step is predicted with their gradients' traffic, then re-planned as one replica's step."""
    opts = PlacementOptions(**options)
    given = _as_plan(plan)
    if (asked is None and chosen is None and given is None and opts.train.training
            and opts.train.training_replicas > 1 and opts.train.training_replicas == len(devices)):
        # one replica's trace holds neither the other copies nor the gradients they send: decide on the whole
        return _autoplace(model, devices, None, {**options, "replicas": "auto"}, asked=opts.train.training_replicas)
    if given is not None:  # a re-applied plan is grouped and scored as it was made
        for name in ("group_by", "objective"):
            if name in options and options[name] != getattr(given, name):
                raise PlanError(f"the plan was made with {name}={getattr(given, name)!r}, not "
                                f"{options[name]!r}; drop {name}= to re-apply it, or solve again without plan=")
        opts = opts.replace(group_by=given.group_by, objective=given.objective)
    timer = StageTimer(progress=opts.progress)
    first = _first_stages(model, devices, opts, timer)
    traced, opts = first.traced, first.options
    with timer.stage("hosts"):
        devset, hosts_note = _hosts(model, traced, first.devices, opts, first.costs)
    with timer.stage("graph"):
        op_graph = whole = build_op_graph(traced, first.costs.us)
        required = _required_splits(traced, devset, opts) if given is None else []
        if given is not None and given.splits:  # a saved plan places the parts of its split ops
            op_graph = _split(op_graph, split_candidates(traced.fixed.graph, traced.fixed_captures[0], given.splits,
                                                         pairs=given.pairs))
        elif required:  # weights no device holds whole: split before the solve, parts profiled
            op_graph = _profiled_split(traced, op_graph, required, first.costs, devset, opts)
    with timer.stage("problem"):
        built = build_problem(op_graph.graph, devset, group_by=opts.solve.group_by)
    with timer.stage("solve"):
        why = "their weights (with their optimizer slots) exceed every device's memory (no other split tried)"
        try:
            placed_plan = _solve(built, opts.solve, given, traced.batch_size, opts.emit.compression)
        except InsufficientMemoryError as e:
            if given is not None or required:
                raise
            required, op_graph, built, placed_plan = _split_to_fit(traced, op_graph, devset, opts, first.costs, e)
            why = ("no placement of whole ops keeps every device's predicted peak under its memory (the largest "
                   "weights split first)")
        notes = _inputs_note(first.costs, hosts_note)
        splits = dict(given.splits) if given is not None else split_map(required)
        pairs = tuple(given.pairs) if given is not None else pair_ops(required)
        if required:
            line = f"operator splits: {', '.join(sorted(splits))} split {len(devset)} ways: {why}"
            log.info(line)
            notes = (*notes, line)
        placed_plan = replace(placed_plan, log=(*placed_plan.log, *notes), splits=splits, pairs=pairs)
    with timer.stage("codecs"):  # before the copies are scored: their weights' and gradients' codec
        policy = compression_policy(opts.emit.compression, opts.emit.compression_error, devset,
                                    gradients=opts.emit.gradient_compression)
        wire = parameter_codec(policy, devset)
    with timer.stage("microbatches"):
        small = None
        if required:  # neither one device nor a copy per device holds the model; its parts run in one go
            log.info("micro-batches and replicas: not tried for a plan that must split (one micro-batch, one copy)")
            placed_plan = placed_plan.scored(placed_plan.as_candidate(placed_plan.predicted_step_time_s), kept=True)
        else:
            placed_plan, small = _microbatches(
                model, built, placed_plan, devset, opts,
                opts.microbatch.microbatches if given is None or "microbatches" in options else given.microbatches,
                given is None and opts.solve.algorithm == DEFAULT_SOLVER,
                opts.microbatch.pipeline if given is None or "pipeline" in options else given.pipeline,
                asked or (opts.train.replicas if given is None or "replicas" in options else given.replicas),
                wire, lambda size: _group_plan(op_graph, devset, size, opts.solve))
    with timer.stage("splits"):
        if given is None and not required and asked is None:  # (asked: replicas=R given, honoured as copies)
            placed_plan, graphs = _splits(traced, _Graphs(op_graph, built), placed_plan, devset, opts, first.costs,
                                          notes)
            if placed_plan.splits:  # made on the split graph, in one micro-batch
                op_graph, built, small = graphs.op_graph, graphs.built, None
    if traced.step == "train" and placed_plan.replicas > 1 and opts.train.replicas == "auto":
        # auto chose (or asked took) data parallelism: trace and plan one replica's step
        log.info("replicas=%s: %s; tracing and planning one replica's step", asked or "'auto'", _kept(placed_plan))
        return _autoplace(model, devices, None, {**options, "replicas": placed_plan.replicas}, chosen=placed_plan)
    if chosen is not None:  # one replica's plan, with the data-parallel step predicted on all devices
        placed_plan = replace(placed_plan, log=(*placed_plan.log, f"chosen on the full batch's trace: "
                                                                  f"{_kept(chosen)}"),
                              predicted_step_time_s=chosen.predicted_step_time_s, candidates=chosen.candidates)
    with timer.stage("order"):
        if given is None:
            placed_plan = _simulated_order(traced, placed_plan, _Graphs(op_graph, built), devset, opts)
    if opts.hosts.measure_call:
        with timer.stage("calls"):
            placed_plan = _call_overhead(traced, placed_plan)
    groups = replica_groups(first.groups, placed_plan.microbatches) if opts.train.training else ()
    with timer.stage("emit"):
        emitted = _emit(first, placed_plan, op_graph, devset, built, policy, groups, opts)
    with timer.stage("report"):
        report = _report(first, emitted, op_graph, built, small, opts, timer.seconds, model.name, wire)
    first.shell.attach(Placement(
        plan=emitted.plan, op_graph=op_graph, devices=devset, input_specs=first.input_specs,
        training=traced.step == "train", data_structure=traced.data_structure, replica_groups=groups,
        variables=emitted.variables, functions=emitted.functions, planned=emitted.planned, report=report,
        watchdog=Watchdog(worker_addresses(devset.names), opts.emit.worker_timeout_s), plan_options=opts.solve,
        index_bounds=index_bounds(traced), whole_op_graph=whole if emitted.plan.splits else None,
        split_ops=tuple(_plan_splits(traced, emitted.plan))))
    log.info("autoplace %s: %s", model.name, " ".join(f"{k}={v:.2f}s" for k, v in timer.seconds.items()))
    return first.shell
