"""One TensorFlow gRPC worker process, started by :class:`placer.measure.cluster.LocalCluster`.

``python -m placer.measure.worker CLUSTER_JSON TASK_INDEX THREADS [--profiler-port P] [--no-heap-trim]``

With ``--profiler-port`` the worker also runs TensorFlow's profiler server there
(``tf.profiler.experimental.server.start``), so that a client can trace its
ops (``tf.profiler.experimental.client.trace``; docs/costs.md, "How to look
inside a worker").

On glibc (unless ``--no-heap-trim``), a thread of the worker hands freed heap memory back to the system
(``malloc_trim``) whenever the process has been idle for
:data:`IDLE_TRIM_S` and its resident memory grew by :data:`TRIM_GROWTH_BYTES`
since the last trim: profiling one model after another left freed blocks
cached in glibc's arenas, and worker 0 grew from 0.6 to 5.2 GB over four
placements of ResNet50 (64 px, batch 8). Trimming after every free instead
(``MALLOC_TRIM_THRESHOLD_=0``) made a ResNet50 training step 40% slower, so
the trim waits until the worker has nothing to run.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import os
import sys
import threading
import time

#: The line a worker prints on stdout once its server has bound its port and started (what
#: :class:`~placer.measure.cluster.LocalCluster` waits for: a port that accepts connections may be
#: another process's).
READY = "autoplace-worker-ready"

#: Seconds without CPU use after which the worker trims its heap ...
IDLE_TRIM_S = 1.0
#: ... when its resident memory grew by this many bytes since the last trim.
TRIM_GROWTH_BYTES = 64 << 20
#: Below this share of one core over :data:`IDLE_TRIM_S`, the worker counts as idle.
IDLE_CPU_SHARE = 0.02


def _resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _trim_when_idle(trim) -> None:
    """Forever: every :data:`IDLE_TRIM_S`, call ``trim`` if the process was idle and grew (module docstring)."""
    last_cpu, trimmed_at = time.process_time(), _resident_bytes()
    while True:
        time.sleep(IDLE_TRIM_S)
        cpu = time.process_time()
        idle = cpu - last_cpu < IDLE_CPU_SHARE * IDLE_TRIM_S
        last_cpu = cpu
        if idle and _resident_bytes() > trimmed_at + TRIM_GROWTH_BYTES:
            trim(0)
            trimmed_at = _resident_bytes()
            last_cpu = time.process_time()  # the trim's own CPU time is not work


def start_heap_trimmer() -> bool:
    """Start :func:`_trim_when_idle` in a daemon thread where glibc's ``malloc_trim`` and ``/proc`` exist.

    Returns whether it started (``False`` elsewhere, e.g. macOS or musl: nothing is trimmed there).
    """
    libc = ctypes.util.find_library("c")
    trim = getattr(ctypes.CDLL(libc), "malloc_trim", None) if libc else None
    if trim is None or not os.path.exists("/proc/self/statm"):
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    threading.Thread(target=_trim_when_idle, args=(trim,), name="autoplace-heap-trim", daemon=True).start()
    return True


#: This module's name as it appears on a worker's command line (``-m MODULE`` or LocalCluster's bootstrap).
MODULE = "placer.measure.worker"


def threads_from_command_line(argv: list[str]) -> int | None:
    """The inter-op threads of a worker process with command line ``argv`` (``/proc/PID/cmdline`` split at NULs):
    the third argument after this module's name (the usage in the module docstring), or ``None`` when the
    process was not started by this module or that argument is not a positive integer.

    Examples
    --------
    >>> threads_from_command_line(["python3", "-m", MODULE, '{"worker": ["h:1"]}', "0", "1"])
    1
    >>> threads_from_command_line(["python3", "my_server.py", "--threads", "1"]) is None
    True
    """
    if MODULE not in argv:
        return None
    rest = argv[argv.index(MODULE) + 1:]
    if len(rest) < 3 or not rest[2].isdigit() or int(rest[2]) < 1:
        return None
    return int(rest[2])


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m placer.measure.worker")
    parser.add_argument("cluster", type=json.loads, help="the cluster spec as JSON")
    parser.add_argument("task", type=int, help="this worker's task index in job 'worker'")
    parser.add_argument("threads", type=int, help="intra- and inter-op threads")
    parser.add_argument("--profiler-port", type=int, default=None, help="also serve TensorFlow's profiler here")
    parser.add_argument("--no-heap-trim", dest="heap_trim", action="store_false",
                        help="do not hand freed heap memory back when idle")
    args = parser.parse_args(argv)
    cluster, task, threads, profiler_port = args.cluster, args.task, args.threads, args.profiler_port
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    cfg = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=threads, inter_op_parallelism_threads=threads)
    server = tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name="worker", task_index=task, config=cfg,
                                  start=True)
    if profiler_port is not None:
        tf.profiler.experimental.server.start(profiler_port)
    if args.heap_trim:
        start_heap_trimmer()
    print(f"{READY} {task}", flush=True)
    server.join()


if __name__ == "__main__":
    main(sys.argv[1:])
