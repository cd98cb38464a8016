"""Per-op compute costs of a traced model: measured (cached on disk) or analytic.

For each device kind of the target devices:

* a kind named in ``hardware`` gets the roofline estimate of
  :mod:`cost_models.analytic` (planning for hardware that is not here);
* otherwise the kind must exist in this process and every op is profiled on
  it (:func:`cost_models.profile.profile_graph`), with results cached on
  disk by graph fingerprint, device kind, batch size and TF version
  (:mod:`cost_models.cache`).
"""

from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Hashable, Mapping, Sequence

import numpy as np
import tensorflow as tf

from cost_models.analytic import (
    HARDWARE,
    HardwareSpec,
    OpShapes,
    SpecError,
    estimate_graph,
)
from cost_models.cache import CacheKey, ProfileCache, default_cache_dir, fingerprint
from cost_models.pool import fed_weight_events, written_weight_events
from cost_models.profile import PIECE_BYTES, GraphProfiler, OpProfile, ProfileOutOfMemory

from ..core.devices import device_host, device_kind
from ..core.splits import Split
from ..core.validate import boolean, integer
from ..errors import CostError, WorkerError
from ..measure.health import probe_worker
from ..measure.hosts import clip_runtime_factor
from .remote import worker_addresses
from .graphdef import row_gathers, variable_bytes
from .rewrites.gathers import gather_rows
from .rewrites.split import split_graph_def
from .timing import runtime_factor
from .trace import TracedModel, index_bounds, traced_batch

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class ProfileOptions:
    """How op costs are obtained (keyword-only).

    Attributes
    ----------
    repeats : int
        Measured runs per op (after the warm-up runs).
    grappler : bool
        Profile ops with TensorFlow's graph optimizer on, as the placed
        function runs them (fused kernels are timed under one op's name);
        ``False`` times every traced op on its own.
    cache : bool, str or ProfileCache
        Reuse measured op times across runs: ``True`` caches in
        ``$AUTOPLACE_CACHE_DIR`` / ``~/.cache/autoplace``, a path (or a
        :class:`~cost_models.cache.ProfileCache`) caches there, ``False``
        always profiles.
    hardware : Mapping or None
        Device kind → analytic spec (a name in
        ``cost_models.analytic.HARDWARE``, a dict or a ``HardwareSpec``): ops
        of that kind are costed by the roofline model instead of measured.
    seed : int
        Seed of the random profiling inputs.
    runtime : bool
        Also time the forward pass as this process runs it (a
        ``tf.function`` on the profiled device, its fixed call cost taken
        off, its weights copied to the device), once the profiling session
        is closed, and scale every op of the kind by its ratio to the sum of
        the profiled op times (:func:`placer.tf.timing.runtime_factor`), so
        that the scaled ops add up to the runtime's step: ops are profiled in
        a TF1 session, which ran the demo's model 10–20% faster than the
        eager runtime that runs the plan on one VM and 35–45% slower on
        another. Inference traces only (a copy of a training step would
        update the variables). The factor is measured with the profile and
        cached with it, so a warm cache gives the same op times and the same
        plan; a cached profile without a cached factor (an older cache) is
        scaled by the runtime's step now over the cached ops' sum.
    """

    repeats: int = 5
    grappler: bool = True
    cache: bool | str | os.PathLike | ProfileCache = True
    hardware: Mapping[str, Any] | None = None
    seed: int = 0
    runtime: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "repeats", integer("profile_repeats", self.repeats, minimum=1, maximum=10**6,
                                                    error=CostError))
        boolean("profile_grappler", self.grappler, error=CostError)
        boolean("profile_runtime", self.runtime, error=CostError)

    def profile_cache(self) -> ProfileCache | None:
        """The cache these options name, or ``None`` for none."""
        if self.cache is False:
            return None
        if isinstance(self.cache, ProfileCache):
            return self.cache
        return ProfileCache(default_cache_dir() if self.cache is True else self.cache)


@dataclass(frozen=True)
class ComputeCosts:
    """µs per op per device kind, and where each kind's numbers came from."""

    us: Mapping[str, Mapping[str, float]]
    source: Mapping[str, str]
    unknown_op_types: Mapping[str, tuple[str, ...]]
    #: Kind → the factor its measured op times were scaled by (:attr:`ProfileOptions.runtime`).
    runtime_factor: Mapping[str, float] = field(default_factory=dict)
    #: The fingerprint of the profiled graph (``cost_models.cache.fingerprint``), what its cache entries are keyed by.
    fingerprint: str = ""
    #: Table placeholder → the rows of the stand-in it was profiled by (:func:`compute_costs`' ``table_rows``).
    stand_ins: Mapping[str, int] = field(default_factory=dict)
    #: gRPC worker device profiled on now → what the profile left in its allocator pool
    #: (:func:`profile_pool_events`; ``placer.core.devices.DeviceSet.pool_history``).
    pool_events: Mapping[str, tuple[tuple[Hashable, float], ...]] = field(default_factory=dict)


def profile_pool_events(resources: Mapping[str, Any]) -> tuple[tuple[Hashable, float], ...]:
    """What profiling on a worker leaves in its allocator pool, as ``(key, bytes)`` events
    (``placer.core.devices.DeviceSet.pool_history``): each weight fed to the profiling session in turn (its
    value as it arrives, then the variable it is assigned to, then the fed value freed), and the variables
    freed when the session closes (:func:`cost_models.pool.fed_weight_events`). The step's own tensors are
    left out.

    >>> events = profile_pool_events({"w:0": np.zeros((1024, 64), np.float32)})
    >>> [(key[2], nbytes) for key, nbytes in events]
    [('fed', 262144.0), ('variable', 262144.0), ('fed', -1.0), ('variable', -1.0)]
    """
    return tuple(fed_weight_events("profile", {name: float(np.asarray(v).nbytes) for name, v in resources.items()}))


def weight_copy_events(label: str, traced: TracedModel) -> tuple[tuple[Hashable, float], ...]:
    """What copying ``traced``'s weights onto a worker and dropping them leaves in its allocator pool
    (:func:`placer.tf.timing.weight_copies`: each made there and written in pieces;
    :func:`cost_models.pool.written_weight_events`): the runtime factor's and the shared-capacity probe's."""
    sizes = {ph: float(variable_bytes(v)) for ph, v in traced.fixed_captures[0].items()}
    return tuple(written_weight_events(label, sizes, PIECE_BYTES))


def sample_inputs(traced: TracedModel, seed: int, table_rows: Mapping[str, int] | None = None
                  ) -> dict[str, np.ndarray]:
    """Random feeds for the fixed-batch trace (:func:`placer.tf.trace.traced_batch`: ids below their
    tables' rows, or below the rows of their tables' stand-ins, ``table_rows``), by input tensor name."""
    return dict(zip(traced.input_names, traced_batch(traced, seed, table_rows)))


def feeds_key(traced: TracedModel, table_rows: Mapping[str, int] | None = None) -> str:
    """How :func:`sample_inputs` feeds ``traced`` where not by default (the profile cache keys on it): each
    input fed random ids, with its bound (``"history:0<400000"``), and each table profiled by a stand-in of
    fewer rows (``"items/embeddings=100000 rows"``); empty where none is."""
    bounds = [f"{name}<{bound}" for name, bound in zip(traced.input_names, index_bounds(traced, table_rows))
              if bound is not None]
    return ",".join([*bounds, *(f"{ph}={rows} rows" for ph, rows in sorted((table_rows or {}).items()))])


def op_shapes(graph: tf.Graph) -> dict[str, OpShapes]:
    """Static shapes and attributes of every op, for the analytic model (unknown dims count as 1)."""

    def shape(t: tf.Tensor) -> tuple[int, ...]:
        if t.shape.rank is None:
            return ()
        return tuple(1 if d is None else int(d) for d in t.shape.as_list())

    def itemsize(t: tf.Tensor) -> int:
        return 0 if t.dtype in (tf.resource, tf.variant, tf.string) else t.dtype.size

    out = {}
    for op in graph.get_operations():
        attrs = {}
        for a in ("transpose_a", "transpose_b", "adj_x", "adj_y"):
            try:
                attrs[a] = bool(op.get_attr(a))
            except ValueError:
                pass
        out[op.name] = OpShapes(op.type, tuple(shape(t) for t in op.inputs), tuple(shape(t) for t in op.outputs),
                                tuple(itemsize(t) for t in op.inputs), tuple(itemsize(t) for t in op.outputs), attrs)
    return out


def hardware_spec(value: Any) -> HardwareSpec:
    """A :class:`HardwareSpec`, a name in :data:`HARDWARE`, or a dict of the spec's fields."""
    if isinstance(value, HardwareSpec):
        return value
    if isinstance(value, str):
        if value not in HARDWARE:
            raise CostError(f"unknown hardware {value!r}; choose one of {sorted(HARDWARE)} or pass a HardwareSpec")
        return HARDWARE[value]
    if isinstance(value, Mapping):
        try:
            return HardwareSpec.from_dict(value)
        except SpecError as e:
            raise CostError(str(e)) from None
    raise CostError(f"cannot use {value!r} as a hardware spec; pass a name, a dict or a HardwareSpec")


def _profiled(*, gd: tf.compat.v1.GraphDef, feeds: Mapping[str, np.ndarray], resources: Mapping[str, np.ndarray],
              fetches: Sequence[str], constants: Mapping[str, np.ndarray], device: str, target: str,
              grappler: bool, repeats: int) -> OpProfile:
    """``repeats`` rounds of :class:`~cost_models.profile.GraphProfiler` on ``device`` (of ``target``): its
    result."""
    with GraphProfiler(gd, feeds, resources, fetches, constants=constants, device=device, target=target,
                       grappler=grappler, measure_step=True, warmup=2) as prof:
        for _ in range(repeats):
            prof.round()
        return prof.result()


def compute_costs(traced: TracedModel, kinds: Sequence[str], options: ProfileOptions = ProfileOptions(),
                  devices: Sequence[str] = (), splits: Sequence[Split] = (),
                  table_rows: Mapping[str, int] | None = None) -> ComputeCosts:
    """µs of every op of ``traced.fixed`` on each device kind.

    ``splits``: the trace with those ops split (:func:`placer.tf.rewrites.split.split_graph_def`,
    each shard fed its slice of the weight) is profiled instead, so a split op's parts and join have measured
    times of their own (analytic kinds estimate the unsplit trace).

    ``table_rows``: resource placeholder → rows: each such table (one touched by rows alone,
    :func:`placer.tf.graphdef.row_tables`) is fed its first rows only, and the ids below them, so that a model
    whose tables fit no device whole is still profiled on a device of the kind it runs on (a worker's one
    thread and core; this process's CPU ran a split recommender's products 3-6× faster than the worker,
    2026-12-06). Every op on such a table handles as many rows as it would on the whole; no runtime factor
    is measured (it would copy the whole table).

    A kind whose first device among ``devices`` lives on a remote gRPC task
    (a cluster this process connected to) is profiled *there*, through a
    session on that task, so the op times are the worker's (its threads,
    its core); such profiles are cached for that worker *process* only
    (:func:`worker_identity`: a restarted worker, or another cluster's, may be
    configured otherwise), so placing again on a live cluster skips the
    profiling rounds. Other kinds are profiled in this process.

    With ``options.grappler`` (the default) ops are profiled as the placed function
    runs them, TensorFlow's graph optimizer on: a fused kernel's time lands on
    the op whose name it keeps and folded ops cost 0 (see
    :func:`cost_models.profile.profile_graph`). In the fidelity benchmark of
    2026-11-30 this predicted measured steps with a median error of 8.3%
    against 24.3% for profiles with the optimizer off, in the same session.
    Each op's time is its median kernel time plus the executor's per-op
    overhead, so that the ops add up to an untraced step less its fixed
    cost (:meth:`cost_models.profile.OpProfile.calibrated_us`).

    Raises
    ------
    CostError
        A kind that is neither present here nor described in ``hardware``,
        a bad hardware spec, or an op that fails to profile (named with its device).
    """
    hardware = dict(options.hardware or {})
    cache = options.profile_cache()
    repeats, seed, grappler = options.repeats, options.seed, options.grappler
    local = {d.device_type for d in tf.config.list_logical_devices()}
    us: dict[str, Mapping[str, float]] = {}
    source: dict[str, str] = {}
    unknown: dict[str, tuple[str, ...]] = {}
    factors: dict[str, float] = {}
    shapes = None
    fixed_variables, fixed_constants = traced.fixed_captures
    gd, shards = (split_graph_def(traced.fixed.graph, fixed_variables, splits) if splits
                  else (traced.fixed.graph.as_graph_def(), ()))
    gather_rows(gd, row_gathers(traced.fixed.graph))  # as the emitted step gathers them
    if table_rows and any(s.variable in table_rows for s in shards):
        raise CostError("a split table cannot be profiled by a stand-in of fewer rows: each part clamps the ids "
                        "outside its shard to the shard's last row; profile it whole (table_rows without it)")
    fp = fingerprint(gd.SerializeToString(deterministic=True))
    feeds, fed = sample_inputs(traced, seed, table_rows), feeds_key(traced, table_rows)  # the same for every kind
    remote_of: dict[str, tuple[str, str]] = {}  # kind -> (device, grpc address) of its first device on a worker
    pool_events: dict[str, tuple[tuple[Hashable, float], ...]] = {}
    addresses = worker_addresses(devices)
    for name in devices:
        task, kind = device_host(name), device_kind(name)
        if task in addresses and kind not in remote_of:
            remote_of[kind] = (name, addresses[task])
    for kind in kinds:
        if kind in hardware:
            spec = hardware_spec(hardware[kind])
            shapes = shapes or op_shapes(traced.fixed.graph)
            est = estimate_graph(shapes, spec)
            us[kind], source[kind], unknown[kind] = dict(est.us), f"analytic:{spec.name}", est.unknown_op_types
            if est.unknown_op_types:
                log.info("analytic %s: no formula for %d op types (bytes-based estimate): %s", spec.name,
                         len(est.unknown_op_types), ", ".join(est.unknown_op_types[:8]))
            continue
        if kind not in local and kind not in remote_of:
            raise CostError(
                f"no {kind} device in this process to profile on; plan with an analytic model instead: "
                f"hardware={{{kind!r}: one of {sorted(HARDWARE)} or a HardwareSpec}}")
        device, target = (remote_of[kind][0], f"grpc://{remote_of[kind][1]}") if kind in remote_of else (
            f"/device:{kind}:0", "")
        worker = worker_identity(remote_of[kind][1]) if target and cache is not None else ""
        key = CacheKey(fp, kind, int(traced.batch_size), tf.__version__, grappler, worker, fed)
        mapped = {n.split(":", 1)[0] for n in (*feeds, *fixed_variables, *fixed_constants)} | {
            s.placeholder for s in shards}
        hit = cache.get(key, {n.name for n in gd.node} - mapped) if cache is not None else None
        runtime = options.runtime and traced.step == "predict" and not table_rows
        factor_key = {"of": "runtime_factor", **asdict(key)}
        if hit is not None:
            log.info("profile of %d ops on %s from the cache%s", len(hit.median_us), kind,
                     f" (this worker process, {target})" if target else "")
            us[kind], source[kind], unknown[kind] = dict(hit.median_us), "measured (cached)", ()
            if not runtime:
                continue
            cached = cache.get_figures(factor_key) if cache is not None else None
            if cached is not None and _usable_factor(cached.get("factor")):
                # measured with the profile and kept with it: the same op times, so the same plan, from a warm
                # cache (measured again when the profile is, or with profile_cache=False)
                factors[kind] = float(cached["factor"])
                us[kind] = {name: t * factors[kind] for name, t in us[kind].items()}
                log.info("%s: runtime factor %.3f from the cache", kind, factors[kind])
                continue
        try:
            if hit is None:
                sharded = {s.variable for s in shards}
                resources = {f"{ph}:0": var.value[:table_rows[ph]].numpy() if ph in (table_rows or {})
                             else var.value.numpy() for ph, var in fixed_variables.items() if ph not in sharded}
                for s in shards:  # each shard of a split op's weight: its slice
                    resources[f"{s.placeholder}:0"] = s.slice_of(
                        fixed_variables[s.variable].value.read_value()).numpy()
                constants = {f"{ph}:0": t.numpy() for ph, t in fixed_constants.items()}
                profile = dict(gd=gd, feeds=feeds, resources=resources, fetches=traced.output_names,
                               constants=constants, grappler=grappler, repeats=repeats)
                try:
                    result = _profiled(device=device, target=target, **profile)
                except ProfileOutOfMemory as e:
                    if not target or kind not in local:
                        raise
                    # the worker holds the weights but not the step's peak: the plan's memory check (next
                    # stages) decides what fits it; the op times come from this process
                    log.info("costs: %s; %s ops profiled in this process instead", e, kind)
                    device, target = f"/device:{kind}:0", ""
                    key = replace(key, worker="")  # what is cached from here on is this process's
                    factor_key = {"of": "runtime_factor", **asdict(key)}
                    result = _profiled(device=device, target=target, **profile)
                calibrated = result.calibrated_us()
                log.info("%s: executor overhead %.1f µs per op (untraced step %.2f ms, kernels %.2f ms)", kind,
                         result.overhead_us or 0.0, (result.step_s or 0.0) * 1e3, result.op_sum_s * 1e3)
                if cache is not None:
                    cache.put(key, calibrated, result.spread_us)
                if target:
                    log.info("%s ops profiled on %s (%s)", kind, device, target)
                    pool_events[device] = profile_pool_events(resources)
                us[kind], source[kind], unknown[kind] = calibrated, "measured", ()
            if runtime:  # the runtime's step against the op times it scales, with the session closed (runtime_factor)
                run_on = device if target else _local_device(kind, devices)
                try:
                    factor = runtime_factor(traced, run_on, sum(us[kind].values()) * 1e-6, seed=seed)
                except tf.errors.ResourceExhaustedError as e:
                    if not target:
                        raise
                    # a worker under a memory limit whose pool the earlier stages' copies left too fragmented for
                    # another copy of the weights (benchmarks/pool_history.py): its op times stay as profiled
                    log.warning("%s: the runtime factor's copy of the weights ran out of %s's memory (%s); the "
                                "profiled op times are used unscaled", kind, run_on, str(e).strip().splitlines()[0])
                    continue
                finally:
                    if target:  # its weight copies on the worker (dropped after, or what it made before failing)
                        pool_events[run_on] = pool_events.get(run_on, ()) + weight_copy_events("runtime factor",
                                                                                               traced)
                factors[kind] = factor
                us[kind] = {name: t * factor for name, t in us[kind].items()}
                if cache is not None:
                    cache.put_figures(factor_key, {"factor": factor})
        except ValueError as e:
            raise CostError(str(e)) from e
    return ComputeCosts(us, source, unknown, factors, fp, dict(table_rows or {}), pool_events)


def _usable_factor(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and clip_runtime_factor(float(value)) == float(value))


def worker_identity(address: str) -> str:
    """The worker process at ``host:port`` as its server identifies itself: ``"address|digest"``, the digest of
    its ``GetStatus`` reply (its devices' attributes, among them each device's *incarnation*, a random number
    drawn when the server starts).

    So the identity of a restarted worker (or of another process on the same port) differs, and profiles
    cached under it serve this process only.

    Raises
    ------
    WorkerError
        The worker does not answer.
    """
    status = probe_worker(address)
    if not status.alive:
        raise WorkerError(f"worker {address} is {status.state.value} ({status.detail}); check the cluster")
    return f"{address}|{fingerprint(status.reply)[:24]}"


def _local_device(kind: str, devices: Sequence[str]) -> str:
    """The first of ``devices`` of ``kind`` (the planned ones), else this process's first device of it."""
    return next((d for d in devices if device_kind(d) == kind), f"/device:{kind}:0")
