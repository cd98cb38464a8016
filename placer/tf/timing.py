"""Timed copies of a traced model: what the devices and the runtime make of the model's own ops.

The measurement tools of :mod:`placer.measure` know nothing of traced models;
this module runs a :class:`~placer.tf.trace.TracedModel`'s forward graph with
them, for the stages that need the model's own ops timed:

* the *hosts* stage: how much work devices that share a processor do at once
  (:func:`measure_shared_capacity`, :func:`shared_processors`; the theory is
  in :mod:`placer.measure.hosts`);
* the *costs* stage: how much longer this process's runtime takes than the
  profiling session (:func:`runtime_factor`);
* the *calls* stage: the fixed cost of one call of a placement
  (:func:`call_interface`, :func:`plan_call_seconds`, over
  :func:`placer.measure.links.measure_call`).

Examples
--------
>>> import keras
>>> from placer.tf.trace import trace_model
>>> m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
>>> t = trace_model(m, batch_size=2)
>>> iface = call_interface(t, {op.name: "/CPU:0" for op in t.fixed.graph.get_operations()})
>>> [(x.shape, x.dtype) for x in iface.inputs], iface.variables
([((2, 4), 'float32')], (('/CPU:0', 2),))
"""

from __future__ import annotations

import gc
import logging
import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import tensorflow as tf

from ..core.devices import DeviceSet, SharedProcessor
from ..errors import CostError, DeviceError, WorkerError
from ..measure.hosts import (BUDGET_S, DEFAULT_ROUNDS, MAX_REFERENCE_ROUNDS, MAX_WARMUP, REFERENCE_MIN_S,
                             REFERENCE_ROUNDS, WARMUP, WARMUP_S, capacity_from_times, clip_runtime_factor,
                             compute_seconds, enough_rounds)
from ..measure.links import CallInterface, TensorAt, measure_call, on_caller, stand_in
from .graphdef import IMPORT_PREFIX, complete_assignment, layer_devices_of, tf_variable
from .remote import variable_on
from .trace import TracedModel, traced_batch

log = logging.getLogger(__name__)


def _copies_function(traced: TracedModel, devices: Sequence[str],
                     variables: Mapping[str, Mapping[str, Any]] | None = None) -> Any:
    """A ``tf.function`` running one copy of ``traced``'s fixed-batch forward graph per device, independently.

    ``variables``: device → (placeholder → the variable its copy reads instead of the model's own: a copy
    on a worker, so that a step does not fetch every weight from this process)."""
    base = traced.fixed.graph.as_graph_def()
    graph_defs = []
    for device in devices:
        gd = tf.compat.v1.GraphDef()
        gd.CopyFrom(base)
        for node in gd.node:
            node.device = device
        graph_defs.append(gd)
    captures = []
    for device in devices:
        fixed_variables, fixed_constants = traced.fixed_captures
        own = fixed_variables if variables is None or device not in variables else variables[device]
        captures.append([(ph, tf_variable(v).handle) for ph, v in own.items()] + list(fixed_constants.items()))

    def copies(*xs: tf.Tensor) -> list[tf.Tensor]:
        fg = tf.compat.v1.get_default_graph()
        outs: list[tf.Tensor] = []
        for i, gd in enumerate(graph_defs):
            captured = {f"{ph}:0": fg.capture(value) for ph, value in captures[i]}
            input_map = {**captured, **dict(zip(traced.input_names, xs))}
            outs += tf.graph_util.import_graph_def(gd, input_map=input_map, return_elements=list(traced.output_names),
                                                   name=f"{IMPORT_PREFIX}_copy{i}")
        return [on_caller(y) for y in outs]  # as placed functions and their stand-ins return them

    return tf.function(copies, autograph=False)


def measure_shared_capacity(traced: TracedModel, devices: Sequence[str], *, rounds: int = DEFAULT_ROUNDS,
                            budget_s: float = BUDGET_S, seed: int = 0, work_s: float | None = None,
                            pooled: bool = True) -> float:
    """The capacity of ``devices`` (one process's logical CPUs, or with ``pooled=False`` the CPUs of
    worker processes on one machine) for ``traced``'s ops; see the module docstring.

    Parameters
    ----------
    traced : TracedModel
        A traced forward pass (``step == "predict"``): its variables are read, never written.
    devices : sequence of str
        Two or more devices that share a processor.
    rounds : int
        Interleaved timing rounds (fewer once ``budget_s`` is spent; at least 3).
    budget_s : float
        Seconds after which no further round starts.
    seed : int
        Seed of the random input batch.
    work_s : float, optional
        The profiled op times of ``traced`` summed (seconds): then the capacity is also at most what one
        copy realises by itself, ``work_s / (one copy − its fixed call cost)``: the model's own
        branches overlap on the shared processor no better than they do on one device (pooled only).
    pooled : bool
        ``False``: the devices are separate processes; each copy reads a copy of the weights on its
        own device, and ``work_s`` does not cap the capacity (each process runs its own ops).

    Raises
    ------
    DeviceError
        Fewer than two devices, or a training step (its copies would update the model's variables).
    WorkerError
        The probe failed on the workers twice (each time with new weight copies: the first failure is
        logged and retried, see the comment in the code); the message says how to skip the probe.
    """
    if len(devices) < 2:
        raise DeviceError(f"measuring a shared processor needs two or more devices, got {list(devices)}")
    if traced.step != "predict":
        raise DeviceError("the shared-processor capacity is measured with the forward pass, not a training step")
    placements = [devices[:1], devices]
    stand_ins = () if pooled else placements
    try:
        times = _interleaved(traced, placements, rounds, budget_s, seed,
                             None if pooled else weight_copies(traced, devices), stand_ins=stand_ins)
    except tf.errors.InvalidArgumentError as e:
        if pooled:
            raise
        # TensorFlow on gRPC workers: an op of the copies sometimes reads an empty weight copy ("Must provide as
        # many biases as the channel size: [0]"), about one probe in four on a 4 x 8192 GELU chain; the probe
        # run again at once with new copies ran every time (2 of 2, benchmarks/probe_empty_bias.py --retry)
        log.warning("the shared-capacity probe failed on the workers (%s); running it once more with new weight "
                    "copies (docs/limitations.md: empty tensors on gRPC workers)", str(e).strip().splitlines()[0])
        try:
            times = _interleaved(traced, placements, rounds, budget_s, seed, weight_copies(traced, devices),
                                 stand_ins=stand_ins)
        except tf.errors.InvalidArgumentError as again:
            raise WorkerError(f"the shared-capacity probe failed twice on the workers {list(devices)} "
                              f"({str(again).strip().splitlines()[0]}): run autoplace again, or pass "
                              f"shared_capacity=<a number from 1 to {len(devices)}> (how many of these workers "
                              "run at full speed at once; the number of cores they have) to skip the probe"
                              ) from again
    _free_copies()
    one_s, all_s = times[:2]
    capacity = capacity_from_times(one_s, all_s, len(devices))
    if not pooled:  # calling several processes costs more than one: compare the compute, not the calls
        one_c, all_c = compute_seconds(one_s, times[2]), compute_seconds(all_s, times[3])
        if one_c > 0 and all_c > 0:
            capacity = capacity_from_times([one_c], [all_c], len(devices))
    log.info("shared processor of %d devices: capacity %.2f (one copy %.2f ms, %d at once %.2f ms, %d rounds)",
             len(devices), capacity, 1e3 * float(np.median(one_s)), len(devices), 1e3 * float(np.median(all_s)),
             len(one_s))
    if pooled and work_s is not None and work_s > 0:
        compute_s = float(np.median(one_s)) - _call_seconds(traced, devices[0])
        if compute_s > 0:
            realised = round(float(min(max(work_s / compute_s, 1.0), len(devices))), 3)
            log.info("one copy realises %.2f ops' worth at once (ops %.2f ms, step less call %.2f ms)", realised,
                     work_s * 1e3, compute_s * 1e3)
            capacity = min(capacity, realised)
    return capacity


def runtime_factor(traced: TracedModel, device: str, reference_s: float, *, rounds: int = REFERENCE_ROUNDS,
                   min_s: float = REFERENCE_MIN_S, budget_s: float = BUDGET_S, seed: int = 0) -> float:
    """How much longer this process's runtime takes for ``traced``'s step on ``device`` than its profiled op
    times add up to: the factor those op times are scaled by.

    ``reference_s`` is the sum of the op times the factor will scale (the
    profiling session's calibrated op times,
    :meth:`cost_models.profile.OpProfile.calibrated_us`: its untraced step
    less its fixed cost over the profiling rounds). Here one copy of the
    forward graph runs as a ``tf.function``
    with every op (and a copy of every weight) on ``device``, ``rounds`` times and more until
    ``min_s`` has passed (:func:`enough_rounds`);
    the factor is its median step less its fixed call cost
    (:func:`placer.tf.timing.plan_call_seconds`, timed after the rounds) over ``reference_s``, clipped
    to ``1 / MAX_RUNTIME_FACTOR … MAX_RUNTIME_FACTOR``, so that the scaled op times add up to the
    runtime's step. Below 1 the runtime beat the
    session (its optimizer fused more, or a device's threads overlapped ops); the
    simulator runs a device's ops one at a time, so scaling them down is what makes
    its one-device step right.

    The reference was a block of the session's untraced steps timed after the
    profiling rounds until 2026-12-07; where that block ran faster than the
    rounds (a half batch of the two-worker demo's decoder: 53.6 ms against
    61.0 ms), the scaled ops added up to 14% more than the runtime's step
    (its data-parallel copies predicted +15.7 to +20.7%).

    The call cost is timed apart here, not in the rounds as :func:`measure_shared_capacity`
    does for worker processes: timed in the rounds (on logical devices) it came out larger, and
    the demo's predictions dropped below its measurements (2.09-2.16 ms predicted in four runs,
    2.28-2.55 ms in six with the call timed apart; measured 2.35-3.7 ms).

    Call it with the session *closed*: while a TF1 session was open (and had run),
    this process's ``tf.function`` steps ran 1.3–1.8× slower on a 2-core VM with AMX
    (oneDNN's ops on), and the factor, timed interleaved with the session's steps,
    came out 1.3–1.8 where the two timed apart gave 0.57–0.65 (the demo's predicted
    step was then 13–140% above the measurement).

    Raises
    ------
    DeviceError
        A training step (one copy would update the model's variables).

    Examples
    --------
    >>> clip_runtime_factor(10.0), clip_runtime_factor(0.5)
    (3.0, 0.5)
    """
    if traced.step != "predict":
        raise DeviceError("the runtime factor is measured with the forward pass, not a training step")
    copies = weight_copies(traced, [device])
    (one_s,) = _interleaved(traced, [[device]], rounds, budget_s, seed, copies, min_s=min_s)
    del copies
    _free_copies()
    compute_s = float(np.median(one_s)) - _call_seconds(traced, device)
    factor = clip_runtime_factor(compute_s / reference_s if reference_s > 0 else 1.0)
    log.info("runtime on %s: one step less its call %.3f ms, the profiled ops' sum %.3f ms: factor %.3f",
             device, 1e3 * compute_s, 1e3 * reference_s, factor)
    return factor


def _free_copies() -> None:
    """Free the weight copies a probe made on the devices now, not at the next garbage collection: the timed
    functions that read them hold them in reference cycles, and until collected they stay in the workers'
    memory, beside the plan's weights (a 4 x 4096 chain's probe copies doubled what its placed step held on a
    limited worker, ``benchmarks/results/pool_history.md``; the plan's memory replay counts them as freed)."""
    gc.collect()


def weight_copies(traced: TracedModel, devices: Sequence[str]) -> dict[str, dict[str, Any]]:
    """device → (placeholder → a non-trainable copy of that weight on the device): where a plan puts
    them, so that a timed copy does not read its weights across processes. Each copy travels in pieces of rows
    (:func:`~placer.tf.remote.variable_on`: a whole table sent at once killed a worker under a memory limit)."""
    return {device: {ph: variable_on(device, tf_variable(v).read_value())
                     for ph, v in traced.fixed_captures[0].items()} for device in devices}


def _interleaved(traced: TracedModel, placements: Sequence[Sequence[str]], rounds: int, budget_s: float, seed: int,
                 variables: Mapping[str, Mapping[str, Any]] | None = None, *,
                 stand_ins: Sequence[Sequence[str]] = (), min_s: float = 0.0) -> list[list[float]]:
    """Seconds per call of one copy of ``traced`` per device of each placement, the placements interleaved
    (warm-up rounds first: :data:`WARMUP`, and more until :data:`WARMUP_S` has passed; at least 3 timed
    rounds, ``rounds`` and more until ``min_s`` has passed (:func:`enough_rounds`), no new round after
    ``budget_s``).

    ``stand_ins``: placements whose fixed call cost is timed in the same rounds (a stand-in of their
    copies' interface, :func:`_copies_stand_in`), listed after the placements' times: a call cost
    subtracted from a copy's time of the same round cancels the machine's slow spells (see
    :data:`DEFAULT_ROUNDS`)."""
    xs = [tf.constant(x) for x in traced_batch(traced, seed)]
    copies = [_copies_function(traced, devices, variables) for devices in placements]
    fns = [lambda fn=fn: fn(*xs) for fn in copies] + [_copies_stand_in(traced, devices) for devices in stand_ins]
    warm = time.perf_counter()
    for r in range(MAX_WARMUP):
        if r >= WARMUP and time.perf_counter() - warm >= WARMUP_S:
            break
        for fn in fns:
            _fetch(fn())
    out: list[list[float]] = [[] for _ in fns]
    start = time.perf_counter()
    for r in range(MAX_REFERENCE_ROUNDS):
        if r >= 3 and (time.perf_counter() - start > budget_s or enough_rounds(r, start, rounds, min_s)):
            break
        for fn, times in zip(fns, out):
            t = time.perf_counter()
            _fetch(fn())
            times.append(time.perf_counter() - t)
    return out


def _copies_stand_in(traced: TracedModel, devices: Sequence[str]) -> Callable[[], Any]:
    """A stand-in (:func:`placer.measure.links.stand_in`) of one call of :func:`_copies_function` over
    ``devices``: each copy's inputs fed from this process, its outputs fetched, its captured variables and
    an op on its device, next to no compute."""
    one = call_interface(traced, {op.name: devices[0] for op in traced.fixed.graph.get_operations()})
    return stand_in(replicated_interface(one, [(d,) for d in devices], split_rows=False))


def _call_seconds(traced: TracedModel, device: str) -> float:
    return plan_call_seconds(traced, {op.name: device for op in traced.fixed.graph.get_operations()})


def _fetch(outs: Any) -> None:
    for t in tf.nest.flatten(outs):
        t.numpy()


def shared_processors(traced: TracedModel, devset: DeviceSet, groups: Sequence[tuple[tuple[int, ...], bool]], *,
                      given: float | None = None, seed: int = 0, work_s: float | None = None) -> DeviceSet:
    """``devset`` with a :class:`~placer.core.devices.SharedProcessor` per ``(devices, pooled)`` group
    (:func:`sharing_groups`).

    ``given``: that capacity for every such group instead of measuring (``source == "given"``).
    ``work_s``: the forward pass's profiled op times summed (see :func:`measure_shared_capacity`).
    GPUs are separate processors and get none.
    """
    shared = []
    for group, pooled in groups:
        names = [devset.names[i] for i in group]
        if given is not None:
            shared.append(SharedProcessor(group, given, "given", pooled))
        else:
            capacity = measure_shared_capacity(traced, names, seed=seed, work_s=work_s, pooled=pooled)
            shared.append(SharedProcessor(group, capacity, "measured", pooled))
    return devset.with_shared(shared)


def call_interface(traced: TracedModel, op_devices: Mapping[str, str]) -> CallInterface:
    """The :class:`CallInterface` of ``traced`` placed by ``op_devices`` (fixed-batch op name → device).
    A step traced for any batch (Keras' training step) is sized at ``traced.batch_size``.

    Raises
    ------
    CostError
        If ``op_devices`` lacks an op of the fixed-batch trace, or an input or output has an unknown size
        other than the batch.
    """
    fixed = traced.fixed.graph
    missing = [op.name for op in fixed.get_operations() if op.name not in op_devices]
    if missing:
        raise CostError(f"op_devices names no device for {len(missing)} ops of the traced graph, e.g. "
                        f"{missing[:3]}; pass a device for every op (a plan's assignment has them all)")

    def at(name: str) -> TensorAt:  # a training step is traced for any batch: sized at the plan's batch
        t = fixed.get_tensor_by_name(name)
        dims = t.shape.as_list() if t.shape.rank is not None else None
        if dims is None or None in dims[1:] or (dims and dims[0] is None and not traced.batch_size):
            raise CostError(f"tensor {t.name} of the traced graph has an unknown shape {t.shape}: the fixed cost "
                            "of a call needs every input's and output's size; pass batch_size and an "
                            "input_signature whose other dimensions are known, and outputs of a known shape")
        return TensorAt(op_devices[t.op.name], tuple(traced.batch_size if d is None else d for d in dims),
                        t.dtype.name)

    inputs = tuple(at(n) for n in traced.input_names)
    outputs = tuple(at(n) for n in traced.output_names)
    per_device: dict[str, int] = {}
    for ph in traced.fixed_captures[0]:
        per_device[op_devices[ph]] = per_device.get(op_devices[ph], 0) + 1
    return CallInterface(inputs, outputs, tuple(sorted(per_device.items())),
                         tuple(sorted(set(op_devices[op.name] for op in fixed.get_operations()))))


def replicated_interface(interface: CallInterface, groups: Sequence[Sequence[str]], *,
                         split_rows: bool = True) -> CallInterface:
    """``interface`` (of the first group's copy) for data-parallel copies on ``groups``: each input and output
    split by rows between the groups (``split_rows``; else whole on each), each on the group's twin of its
    device, and the captures (the variables and their mirrors) on every group. Split outputs are joined on the
    caller inside the call, as the placed copies join them (``CallInterface.joined``).

    Examples
    --------
    >>> one = CallInterface((TensorAt("a", (8, 2), "float32"),), (TensorAt("a", (8, 3), "float32"),),
    ...                     (("a", 4),), ("a",))
    >>> two = replicated_interface(one, [("a",), ("b",)])
    >>> [(t.device, t.shape) for t in two.outputs], two.variables
    ([('a', (4, 3)), ('b', (4, 3))], (('a', 4), ('b', 4)))
    """
    maps = [dict(zip(groups[0], g)) for g in groups]
    r = len(groups) if split_rows else 1

    def split(ts: Sequence[TensorAt]) -> tuple[TensorAt, ...]:
        return tuple(TensorAt(m.get(t.device, t.device), (-(-t.shape[0] // r), *t.shape[1:]) if t.shape else t.shape,
                              t.dtype) for m in maps for t in ts)

    variables: dict[str, int] = {}
    for m in maps:
        for device, count in interface.variables:
            variables[m.get(device, device)] = variables.get(m.get(device, device), 0) + count
    return CallInterface(split(interface.inputs), split(interface.outputs), tuple(sorted(variables.items())),
                         tuple(sorted({m.get(d, d) for m in maps for d in interface.devices})),
                         joined=len(groups) if split_rows else 1)


def plan_call_seconds(traced: TracedModel, assignment: Mapping[str, str], repeats: int = 9,
                      groups: Sequence[Sequence[str]] = ()) -> float:
    """:func:`measure_call` of ``traced`` placed by ``assignment`` (a plan's op → device; the fixed-batch
    trace's other ops take their layer's or a neighbour's device: :func:`placer.tf.graphdef.complete_assignment`);
    with data-parallel ``groups`` (two or more), of its copies (:func:`replicated_interface`)."""
    op_devices = complete_assignment(traced.fixed.graph, assignment, layer_devices_of(assignment))
    interface = call_interface(traced, op_devices)
    if len(groups) > 1:
        interface = replicated_interface(interface, groups)
    return measure_call(interface, repeats=repeats)
