"""Tools for what devices that share a processor can do at once, and what each process runs.

The theory and the figures: the measurement itself runs the traced model's
own ops and lives on the TensorFlow side (:mod:`placer.tf.timing`); this
module holds what it is built from and what needs no traced model (the
capacity from timed rounds, round counts, which processes share a machine,
each process's inter-op threads and so its executor's ready order).

Logical CPU devices of one process (``tf.config.set_logical_device_configuration``)
share its cores: each op's profiled time was measured with every core to
itself (TensorFlow's intra-op threads), so four logical devices on two cores
do not run four ops at the speed of one. Measured here (2 cores, 4 logical
devices, 20 chained matmuls per device): 64×64 matmuls ran 2.1× as much
work at once, 256×256 1.7×, 512×512 1.08× — it depends on the ops, so the
capacity is measured with the placed model's own forward pass.

:func:`placer.tf.timing.measure_shared_capacity` runs one copy of the traced forward graph
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
:func:`~placer.tf.timing.measure_shared_capacity` times one copy on the first worker against
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
from typing import Sequence

import numpy as np
import tensorflow as tf

from ..core.devices import DeviceSet, device_host
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


def clip_runtime_factor(factor: float) -> float:
    """``factor`` within ``1 / MAX_RUNTIME_FACTOR … MAX_RUNTIME_FACTOR``."""
    return min(max(factor, 1 / MAX_RUNTIME_FACTOR), MAX_RUNTIME_FACTOR)


def compute_seconds(copies_s: Sequence[float], calls_s: Sequence[float]) -> float:
    """Median over rounds of a copy's time less its stand-in's time of the same round.

    A slow spell that hits both calls of a round cancels (the second round here):

    >>> round(compute_seconds([0.010, 0.020, 0.011], [0.002, 0.012, 0.003]), 6)
    0.008
    """
    return float(np.median(np.asarray(copies_s, dtype=float) - np.asarray(calls_s, dtype=float)))


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


