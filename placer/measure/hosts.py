"""How much work devices that share a processor can do at once, measured with the model's own ops.

Logical CPU devices of one process (``tf.config.set_logical_device_configuration``)
share its cores: each op's profiled time was measured with every core to
itself (TensorFlow's intra-op threads), so four logical devices on two cores
do not run four ops at the speed of one. Measured here (2 cores, 4 logical
devices, 20 chained matmuls per device): 64×64 matmuls ran 2.1× as much
work at once, 256×256 1.7×, 512×512 1.08× — it depends on the ops, so the
capacity is measured with the placed model's own forward pass.

:func:`measure_shared_capacity` runs one copy of the traced forward graph
with every op on the group's first device, and one copy per device of the
group at once, interleaved; the capacity is
``len(group) × median(one copy) / median(all copies)``, clipped to
``1 … len(group)``, and at most what one copy realises by itself (its
profiled op times over its step less the call's fixed cost): the demo's
4 copies did 1.2–1.3 ops' worth at once, but the model's own towers
overlapped on one device no better than ~1.0, and a placement spreads
*that* work. The simulator (``cost_models.SimOptions.shared``)
then runs a group's concurrent ops at ``min(1, capacity / running)`` each.

Worker processes on one machine share it too, even pinned to distinct
cores: caches, memory bandwidth and the client process. Measured here
(2 cores, two workers pinned to one each): one forward pass on both
workers at once took 1.16–1.18× as long as on either alone (ResNet50 at
4 rows, an MLP at 64), so the pair does ~1.7 workers' worth at once, and
plans that keep both busy (a pipeline) ran 9–27% slower than predicted
without it. :func:`machine_groups` finds such processes (the machine's boot
id, read by a TF op on each process's CPU) and
:func:`measure_shared_capacity` times one copy on the first worker against
one copy per worker at once, each copy reading a copy of the weights on
its own worker; the group is not ``pooled`` (each worker still runs its
own ops one at a time) and its capacity is not capped by what one copy
realises. Calling several processes costs more than calling one, so the
two are compared without their fixed call costs: a stand-in of each
(:func:`placer.measure.links.stand_in`) is timed in the same rounds and
subtracted round by round.

Examples
--------
>>> capacity_from_times([0.010, 0.011, 0.009], [0.040, 0.041, 0.039], 4)
1.0
>>> capacity_from_times([0.010], [0.010], 2)
2.0
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import replace
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import tensorflow as tf

from ..core.devices import DeviceSet, SharedProcessor, device_host
from ..errors import DeviceError
from .worker import threads_from_command_line

log = logging.getLogger(__name__)

#: Interleaved timing rounds (one copy, all copies and, for worker processes, their stand-ins) per group,
#: and the warm-up calls of each. On two one-core workers (the 8-tower MLP, 6 measurements each) the
#: capacity ranged 1.61-1.72 with 31 rounds and the stand-ins in the rounds, 1.41-1.85 with 31 rounds and
#: the stand-ins timed apart, 1.31-1.85 with 7 rounds.
DEFAULT_ROUNDS = 31
#: Steps of the profiling session timed for :func:`runtime_factor`'s reference (one block, session open),
#: and the runtime's rounds it is compared with ...
REFERENCE_ROUNDS = 7
#: ... at least, and more until each side has run this long (at most :data:`MAX_REFERENCE_ROUNDS`): 7 steps
#: of the demo's model are ~25 ms, and this VM's speed drifts more than 20% over such windows (the
#: demo's step, predicted from them, came out 2-30% below the measurement in five of six runs).
REFERENCE_MIN_S = 0.5
MAX_REFERENCE_ROUNDS = 500


def enough_rounds(done: int, started: float, rounds: int = REFERENCE_ROUNDS, min_s: float = REFERENCE_MIN_S,
                  most: int = MAX_REFERENCE_ROUNDS) -> bool:
    """Whether ``done`` rounds since ``started`` (``time.perf_counter``) are enough: ``rounds`` of them and
    ``min_s`` seconds, or ``most`` rounds.

    Examples
    --------
    >>> now = time.perf_counter()
    >>> enough_rounds(7, now, min_s=0.0), enough_rounds(7, now, min_s=60.0), enough_rounds(500, now, min_s=60.0)
    (True, False, True)
    """
    return done >= most or (done >= rounds and time.perf_counter() - started >= min_s)
WARMUP = 2
#: ... and warm-up goes on until this long has passed (at most :data:`MAX_WARMUP` rounds): right after a
#: profiling session closed, a new function's first ~10 calls of the demo's model took 3.0-5.4 ms and
#: the next ones 2.3 ms (2-core VM with AMX), which two warm-up calls left in the timed median.
WARMUP_S = 0.3
MAX_WARMUP = 50
#: Stop adding rounds once a group's measurement has taken this long (at least 3 rounds run).
BUDGET_S = 20.0
#: The most :func:`runtime_factor` scales op times by, either way (a larger ratio is a broken measurement
#: more likely than a runtime that different from its own profile).
MAX_RUNTIME_FACTOR = 3.0


def capacity_from_times(one_s: Sequence[float], all_s: Sequence[float], size: int) -> float:
    """``size × median(one_s) / median(all_s)``, clipped to ``1 … size`` (rounded to 3 digits)."""
    ratio = size * float(np.median(one_s)) / max(float(np.median(all_s)), 1e-12)
    return round(float(min(max(ratio, 1.0), size)), 3)


def _copies_function(traced: Any, devices: Sequence[str],
                     variables: Mapping[str, Mapping[str, Any]] | None = None) -> Any:
    """A ``tf.function`` running one copy of ``traced``'s fixed-batch forward graph per device, independently.

    ``variables``: device → (placeholder → the variable its copy reads instead of the model's own: a copy
    on a worker, so that a step does not fetch every weight from this process)."""
    from ..tf.emit import IMPORT_PREFIX, tf_variable

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
        own = traced.variables if variables is None or device not in variables else variables[device]
        captures.append([(ph, tf_variable(v).handle) for ph, v in own.items()] + list(traced.constants.items()))

    def copies(*xs: tf.Tensor) -> list[tf.Tensor]:
        fg = tf.compat.v1.get_default_graph()
        outs: list[tf.Tensor] = []
        for i, gd in enumerate(graph_defs):
            captured = {f"{ph}:0": fg.capture(value) for ph, value in captures[i]}
            input_map = {**captured, **dict(zip(traced.input_names, xs))}
            outs += tf.graph_util.import_graph_def(gd, input_map=input_map, return_elements=list(traced.output_names),
                                                   name=f"{IMPORT_PREFIX}_copy{i}")
        return outs

    return tf.function(copies, autograph=False)


def measure_shared_capacity(traced: Any, devices: Sequence[str], *, rounds: int = DEFAULT_ROUNDS,
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
    """
    if len(devices) < 2:
        raise DeviceError(f"measuring a shared processor needs two or more devices, got {list(devices)}")
    if traced.step != "predict":
        raise DeviceError("the shared-processor capacity is measured with the forward pass, not a training step")
    local = None if pooled else weight_copies(traced, devices)
    placements = [devices[:1], devices]
    times = _interleaved(traced, placements, rounds, budget_s, seed, local, stand_ins=() if pooled else placements)
    one_s, all_s = times[:2]
    capacity = capacity_from_times(one_s, all_s, len(devices))
    if not pooled:  # calling several processes costs more than one: compare the compute, not the calls
        one_c, all_c = _compute_seconds(one_s, times[2]), _compute_seconds(all_s, times[3])
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


def runtime_factor(traced: Any, device: str, reference_s: float, *, rounds: int = REFERENCE_ROUNDS,
                   min_s: float = REFERENCE_MIN_S, budget_s: float = BUDGET_S, seed: int = 0) -> float:
    """How much longer this process's runtime takes for ``traced``'s step on ``device`` than the profiling
    session did: the factor the session's op times are scaled by.

    ``reference_s`` is the session's median untraced step less its fixed cost
    (:meth:`cost_models.profile.GraphProfiler.step_compute_s`, timed in a block
    just before). Here one copy of the forward graph runs as a ``tf.function``
    with every op (and a copy of every weight) on ``device``, ``rounds`` times and more until
    ``min_s`` has passed (:func:`enough_rounds`);
    the factor is its median step less its fixed call cost
    (:func:`placer.measure.links.plan_call_seconds`, timed after the rounds) over ``reference_s``, clipped
    to ``1 / MAX_RUNTIME_FACTOR … MAX_RUNTIME_FACTOR``. Below 1 the runtime beat the
    session (its optimizer fused more, or a device's threads overlapped ops); the
    simulator runs a device's ops one at a time, so scaling them down is what makes
    its one-device step right.

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
    compute_s = float(np.median(one_s)) - _call_seconds(traced, device)
    factor = clip_runtime_factor(compute_s / reference_s if reference_s > 0 else 1.0)
    log.info("runtime on %s: one step less its call %.3f ms, the profiling session's %.3f ms: factor %.3f",
             device, 1e3 * compute_s, 1e3 * reference_s, factor)
    return factor


def weight_copies(traced: Any, devices: Sequence[str]) -> dict[str, dict[str, Any]]:
    """device → (placeholder → a non-trainable copy of that weight on the device): where a plan puts
    them, so that a timed copy does not read its weights across processes."""
    from ..tf.emit import tf_variable

    out = {}
    for device in devices:
        with tf.device(device):
            out[device] = {ph: tf.Variable(tf_variable(v).read_value(), trainable=False)
                           for ph, v in traced.variables.items()}
    return out


def clip_runtime_factor(factor: float) -> float:
    """``factor`` within ``1 / MAX_RUNTIME_FACTOR … MAX_RUNTIME_FACTOR``."""
    return min(max(factor, 1 / MAX_RUNTIME_FACTOR), MAX_RUNTIME_FACTOR)


def _interleaved(traced: Any, placements: Sequence[Sequence[str]], rounds: int, budget_s: float, seed: int,
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
    from ..tf.costs import random_batch

    xs = [tf.constant(x) for x in random_batch(traced.input_specs, traced.batch_size, seed)]
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


def _copies_stand_in(traced: Any, devices: Sequence[str]) -> Callable[[], Any]:
    """A stand-in (:func:`placer.measure.links.stand_in`) of one call of :func:`_copies_function` over
    ``devices``: each copy's inputs fed from this process, its outputs fetched, its captured variables and
    an op on its device, next to no compute."""
    from .links import CallInterface, call_interface, stand_in

    one = call_interface(traced, {op.name: devices[0] for op in traced.fixed.graph.get_operations()})

    def on_each(tensors: Sequence[Any]) -> tuple[Any, ...]:
        return tuple(replace(t, device=d) for d in devices for t in tensors)

    return stand_in(CallInterface(inputs=on_each(one.inputs), outputs=on_each(one.outputs),
                                  variables=tuple((d, n) for d in devices for _, n in one.variables),
                                  devices=tuple(devices)))


def _call_seconds(traced: Any, device: str) -> float:
    from .links import plan_call_seconds

    return plan_call_seconds(traced, {op.name: device for op in traced.fixed.graph.get_operations()})


def _compute_seconds(copies_s: Sequence[float], calls_s: Sequence[float]) -> float:
    """Median over rounds of a copy's time less its stand-in's time of the same round.

    A slow spell that hits both calls of a round cancels (the second round here):

    >>> round(_compute_seconds([0.010, 0.020, 0.011], [0.002, 0.012, 0.003]), 6)
    0.008
    """
    return float(np.median(np.asarray(copies_s, dtype=float) - np.asarray(calls_s, dtype=float)))


def _fetch(outs: Any) -> None:
    for t in tf.nest.flatten(outs):
        t.numpy()


#: Read on each process's CPU to tell which processes share a machine (Linux: one id per boot of a kernel).
MACHINE_ID_FILE = "/proc/sys/kernel/random/boot_id"
#: Read on a worker's CPU: its command line, which names its inter-op threads when it was started by
#: ``python -m placer.measure.worker`` (:func:`placer.measure.worker.threads_from_command_line`).
COMMAND_LINE_FILE = "/proc/self/cmdline"


def _read_on(host: str, path: str) -> tuple[str | None, str]:
    """``(the text of the file at path, "")`` read by a TF op on ``host``'s CPU (so a worker's file, on its
    machine), or ``(None, why)`` where that process cannot read it (no such file, no ``/proc``)."""
    try:
        with tf.device(f"{host}/device:CPU:0"):
            return tf.io.read_file(path).numpy().decode(errors="replace"), ""
    except (tf.errors.NotFoundError, tf.errors.PermissionDeniedError, tf.errors.UnimplementedError) as e:
        return None, str(e).splitlines()[0]


def inter_op_threads(host: str) -> int | None:
    """The inter-op threads of the process ``host`` (``/job:…/replica:…/task:…``), or ``None`` if it cannot be
    told.

    This process: its setting (``tf.config.threading``; TF's default is one per core it may run on). A gRPC
    worker: the threads on its command line (:data:`COMMAND_LINE_FILE`) when it was started by ``python -m
    placer.measure.worker`` (as :class:`~placer.measure.cluster.LocalCluster` starts them); a worker started
    any other way cannot be told, since a remote process's thread pools are not visible to TensorFlow's
    client.
    """
    if host == device_host("/CPU:0"):
        n = tf.config.threading.get_inter_op_parallelism_threads()
        return n if n > 0 else len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    text, _ = _read_on(host, COMMAND_LINE_FILE)
    return None if text is None else threads_from_command_line(text.rstrip("\0").split("\0"))


def executor_ready_order(devset: DeviceSet) -> tuple[str, str]:
    """The order in which the executors of ``devset``'s processes run ready ops, for the simulator
    (``cost_models.SimOptions.ready_order``), and why, for the log.

    ``"lifo"`` (depth first) when every process that holds one of the devices runs one inter-op thread:
    TensorFlow's executor then runs a finished op's successor inline and puts other ready ops at the front of
    its one thread's queue (a profiler trace of two such workers, docs/costs.md). ``"fifo"`` otherwise,
    including when some process's threads cannot be told (:func:`inter_op_threads`; the reason says so).
    """
    threads = {host: inter_op_threads(host) for host in dict.fromkeys(d.host for d in devset.devices)}
    unknown = sorted(h for h, n in threads.items() if n is None)
    if unknown:
        return "fifo", (f"the inter-op threads of {unknown} cannot be told (not started by python -m "
                        f"placer.measure.worker): pass ready_order='lifo' if each runs one")
    if all(n == 1 for n in threads.values()):
        return "lifo", "every process runs one inter-op thread"
    return "fifo", "inter-op threads " + ", ".join(f"{h}: {n}" for h, n in threads.items())


def machine_groups(devset: DeviceSet, kind: str = "CPU") -> list[tuple[int, ...]]:
    """Indices of ``kind`` devices of two or more processes that run on one machine, by machine.

    A process's machine is the boot id its own CPU reads (:data:`MACHINE_ID_FILE`, a ``tf.io.read_file``
    placed there); a process that cannot read it is taken as a machine of its own (logged). Machines
    where some process holds two or more such devices are left to :meth:`DeviceSet.host_groups`
    (logged): a group is either one process's logical devices or one device per process.
    """
    by_process: dict[str, list[int]] = {}
    for i, d in enumerate(devset.devices):
        if d.kind == kind:
            by_process.setdefault(d.host, []).append(i)
    if len(by_process) < 2:
        return []
    by_machine: dict[str, list[str]] = {}
    for host in by_process:
        text, why = _read_on(host, MACHINE_ID_FILE)
        if text is None:
            log.info("cannot tell which machine %s runs on (%s): taken as a machine of its own", host, why)
        by_machine.setdefault(host if text is None else text.strip(), []).append(host)
    groups = []
    for hosts in by_machine.values():
        if len(hosts) < 2:
            continue
        if any(len(by_process[h]) > 1 for h in hosts):
            log.info("processes %s share a machine, but some hold several %s devices: only those are grouped",
                     hosts, kind)
            continue
        groups.append(tuple(sorted(by_process[h][0] for h in hosts)))
    return groups


def sharing_groups(devset: DeviceSet) -> list[tuple[tuple[int, ...], bool]]:
    """``(devices, pooled)`` of each group of CPUs that share a processor: one process's logical CPUs
    (pooled), then one CPU per process of a machine that runs several (:func:`machine_groups`)."""
    return [(g, True) for g in devset.host_groups("CPU")] + [(g, False) for g in machine_groups(devset)]


def shared_processors(traced: Any, devset: DeviceSet, groups: Sequence[tuple[tuple[int, ...], bool]], *,
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
