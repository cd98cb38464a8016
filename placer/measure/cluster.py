"""A TensorFlow gRPC cluster of worker processes on this machine.

:class:`LocalCluster` starts ``n`` worker processes (``tf.distribute.Server``),
each optionally pinned to one core with one intra- and one inter-op thread,
so that a two-worker run on a two-core machine is genuine parallel execution
with real transfers. It always stops them on exit, also when the body raises,
and (Linux) the workers get SIGKILL if the parent process dies (also when frozen).

**Security.** TensorFlow 2.21's gRPC servers listen on *all* interfaces
whatever host the cluster spec names, and the runtime has no
authentication. ``LocalCluster`` therefore refuses to start unless the
process sits in a network namespace whose only interface is loopback
(``unshare -rn sh -c 'ip link set lo up; python …'``), or the caller passes
``require_isolated_network=False`` to take that responsibility (e.g. on a
firewalled host).

Examples
--------
>>> network_isolated() in (True, False)
True
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import json
import logging
import os
import resource
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from collections import deque
from pathlib import Path
from types import TracebackType
from typing import Any, Callable, Mapping, Sequence

from ..core.devices import DeviceSpec
from ..core.processes import child_environment, python_module_command
from ..core.validate import integer
from ..errors import DeviceError, WorkerError
from .health import probe_worker
from .worker import READY

log = logging.getLogger(__name__)


def on_loopback(host: str) -> bool:
    """Whether ``host`` (of a ``host:port``) is this machine's loopback.

    >>> on_loopback("127.0.0.1"), on_loopback("localhost"), on_loopback("[::1]"), on_loopback("10.0.0.7")
    (True, True, True, False)
    """
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class SecurityWarning(UserWarning):
    """A set-up that exposes unauthenticated servers beyond this machine (said once per place it happens)."""


#: The most worker processes one LocalCluster starts (each loads TensorFlow: ~0.9 GB and ~4 s).
MAX_WORKERS = 64


def network_isolated() -> bool:
    """True when this process sees no network interface but loopback (``/proc/net/dev``)."""
    try:
        lines = Path("/proc/net/dev").read_text().splitlines()[2:]
    except OSError:
        return False
    names = {line.split(":", 1)[0].strip() for line in lines if ":" in line}
    return names <= {"lo"}


#: Link speeds :func:`shape_loopback` takes by name (bits per second), as clusters have between hosts.
LINK_RATES = {"100gbit": 100e9, "25gbit": 25e9, "10gbit": 10e9, "1gbit": 1e9, "100mbit": 100e6}


def shape_loopback(rate: str, *, latency_ms: float = 50.0) -> float:
    """Limit this namespace's loopback to ``rate`` (a :data:`LINK_RATES` name) with a token bucket
    (``tc qdisc replace dev lo root tbf``); returns the rate in bytes per second. ``"none"`` removes the limit
    (returns 0). The one bucket carries both directions: 16 MiB sent each way at once took 268 ms at
    1 Gbit/s, one way 135 ms (2026-12-07), where a full-duplex link between hosts takes the one-way time.
    (One ``htb`` class per worker's server port gave each direction its own rate, 134 ms both ways at once,
    but the link calibration's hops then came out 1.8x the rate: not used.)

    Only inside a loopback-only network namespace (:func:`network_isolated`: ``unshare -rn`` makes one, and
    you are root there): shaping the machine's own loopback would slow everything on it. The burst is 10 ms
    at the rate (at least 64 KiB), so that one timer tick does not cap the rate; ``latency_ms`` bounds the
    queue. ``netem`` delays are not used (not available on every kernel).

    Raises
    ------
    DeviceError
        Not in such a namespace, an unknown rate, ``tc`` missing, or the kernel refusing the queue
        discipline (the message has ``tc``'s own words).
    """
    if not network_isolated():
        raise DeviceError("shape_loopback changes loopback for every process that shares it: run it inside a "
                          "loopback-only namespace (unshare -rn; benchmarks re-run themselves in one)")
    tc = shutil.which("tc")
    if tc is None:
        raise DeviceError("shaping the loopback link needs `tc` (iproute2): install it, or run without a link rate")
    if rate == "none":
        subprocess.run([tc, "qdisc", "del", "dev", "lo", "root"], capture_output=True, check=False)
        return 0.0
    if rate not in LINK_RATES:
        raise DeviceError(f"unknown link rate {rate!r}: use one of {sorted(LINK_RATES)} or 'none'")
    bytes_per_s = LINK_RATES[rate] / 8
    burst = max(64 << 10, int(bytes_per_s * 0.01))
    cmd = [tc, "qdisc", "replace", "dev", "lo", "root", "tbf", "rate", rate, "burst", str(burst),
           "latency", f"{latency_ms:g}ms"]
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if r.returncode:
        raise DeviceError(f"the kernel refused to shape loopback to {rate} ({' '.join(cmd)}: "
                          f"{(r.stderr or r.stdout).strip()[:300]}); run without a link rate, or check that "
                          "the sch_tbf module is available")
    log.info("loopback shaped to %s (token bucket, burst %d B, queue %g ms)", rate, burst, latency_ms)
    return bytes_per_s


def rerun_in_loopback_namespace(argv: list[str]) -> int | None:
    """Run ``python argv…`` again inside a loopback-only network namespace, unless this process is in one.

    For scripts that start TensorFlow gRPC servers (they listen on all
    interfaces): ``code = rerun_in_loopback_namespace(sys.argv)``; ``None``
    means "already isolated, go on", a number is the re-run's exit status.

    Raises
    ------
    DeviceError
        ``unshare`` or ``ip`` is missing (util-linux, iproute2), so no namespace can be made.
    """
    if network_isolated():
        return None
    if not (shutil.which("unshare") and shutil.which("ip")):
        raise DeviceError("needs `unshare -rn` and `ip` (util-linux, iproute2) to keep the gRPC workers on loopback")
    cmd = ["unshare", "-rn", "sh", "-c", "ip link set lo up && exec \"$0\" \"$@\"", sys.executable, *argv]
    return subprocess.call(cmd)


#: The data memory (``VmData``: heap, thread stacks, private mappings) a one-thread worker's runtime holds
#: besides its tensors: measured 1.04 GiB at start, 0.17 GiB more once autoplace has calibrated its links
#: (gRPC buffers, glibc's heap; the same with oneDNN off), 1.16-1.24 GiB after placing and training the
#: recommender of ``benchmarks/splitting.py`` (its pool full), with a margin (TF 2.21): with 1.25 GiB two
#: runs of three crossed the limit outside TensorFlow's allocator and the worker died.
WORKER_RUNTIME_BYTES = 1408 << 20
#: The environment variable that caps the pool of TensorFlow's oneDNN CPU allocator (``mklcpu``, the one it
#: uses with oneDNN on: tensors of 256 KiB and more are carved from regions it keeps, each new region up to
#: twice the last). A limited worker's pool is capped at its limit less :data:`WORKER_RUNTIME_BYTES`, so a
#: tensor past it fails there cleanly: uncapped, a 360 MiB tensor reserved a 512 MiB region (``VmData`` +528 MB)
#: and crossed the OS limit where the tensor alone fit.
POOL_CAP_VARIABLE = "TF_MKL_ALLOC_MAX_BYTES"
#: What a limited worker without a replayed pool (oneDNN off) keeps for transfers that are no model's tensors
#: (link calibration sends payloads up to 16 MiB): :meth:`LocalCluster.device_specs` leaves it out of what a plan
#: may use there. With oneDNN's pool the plan's peak replays what the calibration and the profile left in the
#: pool (``DeviceSet.pool_history``), so a plan may use the pool's whole cap.
WORKER_TRANSFER_POOL_BYTES = 128 << 20
#: The least ``memory_limit_bytes`` of a worker: its runtime, the transfers' pool and 256 MiB for tensors.
MIN_WORKER_MEMORY_BYTES = WORKER_RUNTIME_BYTES + WORKER_TRANSFER_POOL_BYTES + (256 << 20)


def _die_with_parent() -> None:
    """In the child before exec: ask Linux to SIGKILL it when the parent dies (no orphaned servers)."""
    try:
        import ctypes

        # SIGKILL, not SIGTERM: a worker frozen with SIGSTOP acts on SIGTERM only once continued, and one
        # was left stopped (orphaned) when its parent died during a frozen-worker check
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _worker_setup(memory_limit_bytes: int | None) -> None:
    """In a worker before exec: :func:`_die_with_parent`, and its data memory limited (``RLIMIT_DATA``: the
    heap and private anonymous mappings, what TensorFlow's CPU allocator takes; an allocation over it fails,
    and TensorFlow reports a ``ResourceExhaustedError`` instead of being killed)."""
    _die_with_parent()
    if memory_limit_bytes is not None:
        resource.setrlimit(resource.RLIMIT_DATA, (memory_limit_bytes, memory_limit_bytes))


#: How many of a worker's last stderr lines :class:`LocalCluster` keeps (for error messages).
STDERR_TAIL_LINES = 200


def _drain(pipe: Any, keep: deque) -> None:
    """Read ``pipe`` line by line into ``keep`` (a bounded deque) until end of file."""
    for line in iter(pipe.readline, b""):
        keep.append(line)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _port_in_use(port: int) -> bool:
    """Whether ``port`` cannot be bound on all interfaces (where the workers' servers listen) right now."""
    with socket.socket() as s:
        try:
            s.bind(("", port))
        except OSError:
            return True
    return False


class LocalCluster:
    """``n`` gRPC worker processes on 127.0.0.1 (a context manager).

    Parameters
    ----------
    workers : int
        Number of worker processes (tasks of job ``worker``).
    pin_cores : bool
        Pin worker ``i`` to core ``i mod cores`` with ``taskset``.
    threads : int
        Intra- and inter-op threads of each worker.
    start_timeout_s : float
        How long to wait for every worker's port.
    require_isolated_network : bool
        Refuse to start outside a loopback-only network namespace (see above).
    env : Mapping[str, str], optional
        Extra environment of the worker processes (e.g.
        ``{"TF_CPU_ALLOCATOR_USE_BFC": "true"}`` so that the CPU allocator
        counts every allocation in its statistics).
    profiler : bool
        Also run TensorFlow's profiler server in each worker, at
        :attr:`profiler_addresses`, so that :meth:`trace` can record their ops
        (docs/costs.md, "How to look inside a worker"). Tracing slows the
        workers' steps (11-25% measured), so leave it off when timing.
    ports : sequence of int, optional
        The workers' ports (e.g. those a firewall opens); by default free
        ones are picked. A port in use is a :class:`~placer.errors.DeviceError`.
    trim_heap : bool
        Let each worker hand freed heap memory back to the system when it has
        been idle for a second (:func:`placer.measure.worker.start_heap_trimmer`,
        glibc only): without it, worker 0 grew ~1 GB per placement of ResNet50
        (profiling caches freed memory in glibc's arenas); with it, 0.6 to 1.1 GB
        over four placements, no trim while a step runs.
    memory_limit_bytes : int, optional
        An OS-enforced limit on each worker's data memory (``RLIMIT_DATA``, set before the worker starts; at
        least :data:`MIN_WORKER_MEMORY_BYTES`, what TensorFlow's runtime takes itself): an allocation over it
        fails with TensorFlow's ``ResourceExhaustedError`` (an ``InsufficientMemoryError`` in a placed call), not
        a kill. The worker's oneDNN allocator pool is capped at the limit less :data:`WORKER_RUNTIME_BYTES`
        (:data:`POOL_CAP_VARIABLE`), so a tensor past it fails in TensorFlow's allocator. :meth:`device_specs`
        gives each worker's device what is left for a model's tensors, so plans are made against the limit.
        ``None`` (default): no limit. An allocation outside TensorFlow's allocator that crosses the limit (gRPC
        receiving a message larger than what is left) kills the worker (SIGSEGV), not a clean error.
    """

    def __init__(self, workers: int = 2, *, pin_cores: bool = True, threads: int = 1, start_timeout_s: float = 90.0,
                 require_isolated_network: bool = True, env: Mapping[str, str] | None = None,
                 profiler: bool = False, trim_heap: bool = True, ports: Sequence[int] | None = None,
                 memory_limit_bytes: int | None = None) -> None:
        workers = integer("workers (the number of worker processes)", workers, minimum=1, maximum=MAX_WORKERS,
                          error=DeviceError)
        if ports is not None:
            ports = [integer("a worker port", p, minimum=1, maximum=65535, error=DeviceError) for p in ports]
            if len(ports) != workers or len(set(ports)) != workers:
                raise DeviceError(f"ports must be {workers} distinct port numbers, one per worker, got {ports!r}")
        threads = integer("threads", threads, minimum=1, error=DeviceError)
        if env is not None and not (isinstance(env, Mapping)
                                    and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
            raise DeviceError(f"env must map environment variable names to strings, got {env!r}")
        self.workers = workers
        self.pin_cores = pin_cores
        self.threads = threads
        self.start_timeout_s = start_timeout_s
        self.require_isolated_network = require_isolated_network
        self.env = dict(env or {})
        self.profiler = bool(profiler)
        self.trim_heap = bool(trim_heap)
        self.requested_ports = None if ports is None else list(ports)
        self.memory_limit_bytes = None if memory_limit_bytes is None else integer(
            "memory_limit_bytes", memory_limit_bytes, minimum=MIN_WORKER_MEMORY_BYTES, error=DeviceError)
        self.ports: list[int] = []
        self.profiler_ports: list[int] = []
        self.procs: list[subprocess.Popen] = []
        self.stderr_tails: list[deque[bytes]] = []
        self._drains: list[threading.Thread] = []

    @property
    def spec(self) -> dict[str, list[str]]:
        """The cluster spec (``{"worker": ["127.0.0.1:PORT", …]}``)."""
        return {"worker": [f"127.0.0.1:{p}" for p in self.ports]}

    def device_specs(self, devices: Sequence[str]) -> list[DeviceSpec]:
        """``devices`` (what :func:`connect` returned for this cluster) with the memory each may plan for (no
        limit: ``memory_bytes=None``). With a limit and oneDNN's allocator on in the workers (TensorFlow's default
        on x86; ``TF_ENABLE_ONEDNN_OPTS=0`` turns it off): ``memory_pool_bytes``, the cap of the BFC pool their
        tensors come from (:data:`POOL_CAP_VARIABLE`: the limit less :data:`WORKER_RUNTIME_BYTES`), whose chunks
        and regions a plan's peak then counts after what autoplace's own stages left in it
        (``DeviceSet.pool_history``), and ``memory_bytes`` the same cap. Without oneDNN: the limit less
        :data:`WORKER_RUNTIME_BYTES` and :data:`WORKER_TRANSFER_POOL_BYTES`.

        Examples
        --------
        >>> worker = "/job:worker/replica:0/task:1/device:CPU:0"
        >>> spec = LocalCluster(2, memory_limit_bytes=2 << 30).device_specs([worker])
        >>> spec[0].memory_bytes >> 20, spec[0].memory_pool_bytes >> 20
        (640, 640)
        >>> spec = LocalCluster(2, memory_limit_bytes=2 << 30, env={"TF_ENABLE_ONEDNN_OPTS": "0"}).device_specs([worker])
        >>> spec[0].memory_bytes >> 20, spec[0].memory_pool_bytes
        (512, None)
        """
        if self.memory_limit_bytes is None:
            return [DeviceSpec(d) for d in devices]
        onednn = {**os.environ, **self.env}.get("TF_ENABLE_ONEDNN_OPTS", "1").strip().lower() not in ("0", "false")
        if onednn:
            pool = self.memory_limit_bytes - WORKER_RUNTIME_BYTES
            return [DeviceSpec(d, memory_bytes=pool, memory_pool_bytes=pool) for d in devices]
        memory = self.memory_limit_bytes - WORKER_RUNTIME_BYTES - WORKER_TRANSFER_POOL_BYTES
        return [DeviceSpec(d, memory_bytes=memory) for d in devices]

    @property
    def profiler_addresses(self) -> str:
        """The workers' profiler servers as ``tf.profiler.experimental.client.trace`` takes them
        (``"grpc://127.0.0.1:P0,grpc://127.0.0.1:P1"``; empty without ``profiler=True``)."""
        return ",".join(f"grpc://127.0.0.1:{p}" for p in self.profiler_ports)

    def trace(self, step: Callable[[], object], logdir: str | os.PathLike, duration_ms: int) -> dict[int, Path]:
        """Record every worker's ops with its profiler server for ``duration_ms`` while calling ``step()`` in a
        loop (``tf.profiler.experimental.client.trace``); returns task index → that worker's trace under
        ``logdir`` (an ``XSpace`` proto, ``*.xplane.pb``; a worker that ran nothing may have none).

        Raises
        ------
        DeviceError
            The cluster was not started with ``profiler=True`` (or not started).
        """
        if not self.profiler_ports:
            raise DeviceError("this LocalCluster runs no profiler servers: start it with LocalCluster(..., "
                              "profiler=True) to trace its workers")
        import tensorflow as tf

        tracer = threading.Thread(target=tf.profiler.experimental.client.trace,
                                  args=(self.profiler_addresses, str(logdir), int(duration_ms)))
        tracer.start()
        while tracer.is_alive():
            step()
        tracer.join()
        task_of = {port: i for i, port in enumerate(self.profiler_ports)}
        out = {}
        for path in Path(logdir).rglob("*.xplane.pb"):  # named <host>_<profiler port>.xplane.pb
            port = path.name.split(".xplane")[0].rsplit("_", 1)[-1]
            if port.isdigit() and int(port) in task_of:
                out[task_of[int(port)]] = path
        return dict(sorted(out.items()))

    def device(self, task: int, kind: str = "CPU", index: int = 0) -> str:
        """Full name of a worker's device."""
        return f"/job:worker/replica:0/task:{task}/device:{kind}:{index}"

    def start(self) -> "LocalCluster":
        """Start the workers and wait until each has started its server; returns the cluster.

        Raises
        ------
        DeviceError
            Already started (call :meth:`stop` first), a network that is not loopback-only (see the module
            docstring), a port in use, or a worker that exits or does not start within ``start_timeout_s``.
        """
        if any(proc.poll() is None for proc in self.procs):
            raise DeviceError("this LocalCluster is already running; stop() it before starting it again")
        self.procs, self.stderr_tails = [], []
        if self.require_isolated_network and not network_isolated():
            raise DeviceError(
                "TensorFlow's gRPC servers listen on all interfaces without authentication; run inside a "
                "loopback-only network namespace (unshare -rn sh -c 'ip link set lo up; <command>') or pass "
                "require_isolated_network=False on a firewalled host")
        busy = [p for p in self.requested_ports or () if _port_in_use(p)]
        if busy:
            raise DeviceError(f"port(s) {busy} are in use by another process: give LocalCluster other ports, or "
                              "leave ports=None to have free ones picked")
        self.ports = self.requested_ports or [_free_port() for _ in range(self.workers)]
        self.profiler_ports = [_free_port() for _ in range(self.workers)] if self.profiler else []
        cores = os.cpu_count() or 1
        pool = {} if self.memory_limit_bytes is None else {
            POOL_CAP_VARIABLE: str(self.memory_limit_bytes - WORKER_RUNTIME_BYTES)}
        env = child_environment({"TF_CPP_MIN_LOG_LEVEL": "2", **pool, **self.env})
        env.pop("AUTOPLACE_CACHE_DIR", None)
        log.warning("starting %d TensorFlow gRPC workers (ports %s); they accept unauthenticated connections",
                    self.workers, self.ports)
        try:
            for i in range(self.workers):
                cmd = python_module_command("placer.measure.worker", json.dumps(self.spec), str(i), str(self.threads),
                                            *(["--profiler-port", str(self.profiler_ports[i])] if self.profiler else []),
                                            *([] if self.trim_heap else ["--no-heap-trim"]))
                if self.pin_cores and shutil.which("taskset"):
                    cmd = ["taskset", "-c", str(i % cores), *cmd]
                self.procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                   preexec_fn=functools.partial(_worker_setup,
                                                                                self.memory_limit_bytes)))
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        for proc in self.procs:  # from now on the pipes are drained: a worker that logs a lot never blocks on them
            tail: deque[bytes] = deque(maxlen=STDERR_TAIL_LINES)
            self.stderr_tails.append(tail)
            for pipe, keep in ((proc.stdout, deque(maxlen=1)), (proc.stderr, tail)):
                thread = threading.Thread(target=_drain, args=(pipe, keep), name="autoplace-worker-pipe", daemon=True)
                thread.start()
                self._drains.append(thread)
        return self

    def stderr_tail(self, task: int) -> str:
        """The last lines (at most :data:`STDERR_TAIL_LINES`) worker ``task`` wrote to stderr since it started."""
        lines = self.stderr_tails[task] if task < len(self.stderr_tails) else ()
        return b"".join(lines).decode(errors="replace")

    def _wait_ready(self) -> None:
        """Wait for each worker's ready line (:data:`placer.measure.worker.READY`, printed once its server has
        bound its port): a port that merely accepts connections may belong to another process."""
        deadline = time.monotonic() + self.start_timeout_s
        for i, (proc, port) in enumerate(zip(self.procs, self.ports)):
            line = b""
            while READY.encode() not in line:
                if time.monotonic() > deadline:
                    raise DeviceError(f"worker {i} did not start its server on port {port} within "
                                      f"{self.start_timeout_s:.0f} s")
                ready, _, _ = select.select([proc.stdout], [], [], 0.2)
                chunk = os.read(proc.stdout.fileno(), 4096) if ready else b""
                line += chunk
                if ready and not chunk:  # end of file: the worker exited
                    proc.wait()
                    err = proc.stderr.read().decode(errors="replace")[-2000:] if proc.stderr else ""
                    hint = " (its port is in use by another process?)" if "ddress already in use" in err or \
                        "Could not start" in err else ""
                    raise DeviceError(f"worker {i} exited with status {proc.returncode} while starting on port "
                                      f"{port}{hint}: {err}")

    def check(self, timeout_s: float = 5.0) -> None:
        """Probe every worker (:func:`placer.measure.health.probe_worker`).

        Raises
        ------
        WorkerError
            Naming each worker that exited, does not answer within ``timeout_s`` or refuses connections.
        """
        bad = []
        for i, (proc, address) in enumerate(zip(self.procs, self.spec["worker"])):
            if proc.poll() is not None:
                last = self.stderr_tail(i).strip().splitlines()[-3:]
                bad.append(f"worker {i} ({address}) exited with status {proc.returncode}"
                           + (": " + " | ".join(last) if last else ""))
                continue
            status = probe_worker(address, timeout_s=timeout_s)
            if not status.alive:
                bad.append(f"worker {i} ({address}) is {status.state.value} ({status.detail})")
        if bad:
            raise WorkerError("; ".join(bad) + ". Stop the cluster and start a new one")

    def stop(self) -> None:
        """Terminate every worker (kill after 10 s); safe to call twice; stopped (SIGSTOP) workers too."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
                with contextlib.suppress(ProcessLookupError):  # it exited since poll(): nothing to wake
                    os.kill(proc.pid, signal.SIGCONT)  # a stopped process acts on SIGTERM only once continued
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for thread in self._drains:  # the workers have exited: their pipes are at end of file
            thread.join(timeout=5)
        self._drains = []
        for proc in self.procs:
            for pipe in (proc.stdout, proc.stderr):
                if pipe:
                    pipe.close()

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def _cluster_spec(cluster: object) -> dict[str, list[str]]:
    """The ``{job: [host:port, …]}`` of ``cluster`` (see :func:`connect`)."""
    import tensorflow as tf

    if cluster is None:
        if not os.environ.get("TF_CONFIG"):
            raise DeviceError("no cluster given and TF_CONFIG is not set; pass a LocalCluster, a "
                              "tf.train.ClusterSpec, a dict like {'worker': ['host:port', ...]} or a cluster resolver")
        cluster = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if isinstance(cluster, LocalCluster):
        if not cluster.ports:
            raise DeviceError("the LocalCluster is not started; use it as a context manager (with LocalCluster(2) "
                              "as cluster: ...) or call start() first")
        cluster = cluster.spec
    if hasattr(cluster, "cluster_spec") and callable(cluster.cluster_spec):  # a cluster resolver
        cluster = cluster.cluster_spec()
    if isinstance(cluster, tf.train.ClusterSpec):
        cluster = cluster.as_dict()
    if not isinstance(cluster, Mapping) or not cluster:
        raise DeviceError(f"cannot read a cluster from {type(cluster).__name__}; pass a LocalCluster, a "
                          "tf.train.ClusterSpec, a dict like {'worker': ['host:port', ...]} or a cluster resolver")
    out: dict[str, list[str]] = {}
    for job, tasks in cluster.items():
        addresses = list(tasks.values()) if isinstance(tasks, Mapping) else list(tasks)
        for a in addresses:
            host, _, port = str(a).rpartition(":")
            if not host or not port.isdigit():
                raise DeviceError(f"job {job!r} has the address {a!r}; each task needs 'host:port'")
        out[str(job)] = [str(a) for a in addresses]
    return out


def connect(cluster: object = None, *, job: str = "worker", timeout_s: float = 10.0) -> list[str]:
    """Connect this process to a TensorFlow gRPC cluster; return the devices of its ``job`` tasks.

    Parameters
    ----------
    cluster : LocalCluster, tf.train.ClusterSpec, dict, cluster resolver or None
        The cluster; ``None`` reads ``TF_CONFIG``. The same code runs across
        machines: a spec naming other hosts' ``host:port``.
    job : str
        The job whose devices are returned (and probed).
    timeout_s : float
        How long each task may take to answer a health probe.

    Returns
    -------
    list of str
        Full device names (``/job:worker/replica:0/task:N/device:CPU:0``, …),
        to pass to :func:`placer.autoplace`.

    Raises
    ------
    DeviceError
        A spec that cannot be read or has no ``job``.
    WorkerError
        A task that does not answer (not started, wrong address, a port in use by something else).

    Notes
    -----
    TensorFlow's gRPC servers have **no authentication** and listen on all
    interfaces; connecting also starts one in this process. Run clusters
    only on networks you trust (or a loopback-only namespace, as
    :class:`LocalCluster` insists).

    Examples
    --------
    A spec is checked before anything is contacted (``with LocalCluster(2) as c:
    devices = connect(c)`` connects to a local cluster):

    >>> connect({"worker": ["no-port"]})
    Traceback (most recent call last):
    ...
    placer.errors.DeviceError: job 'worker' has the address 'no-port'; each task needs 'host:port'
    """
    import tensorflow as tf

    spec = _cluster_spec(cluster)
    if job not in spec:
        raise DeviceError(f"the cluster has no job {job!r} (jobs: {sorted(spec)}); pass job=")
    remote = sorted({host for addresses in spec.values() for a in addresses
                     if not on_loopback(host := a.rpartition(":")[0])})
    if remote:
        warnings.warn(f"placer.connect: the cluster's tasks run on {remote}. TensorFlow's gRPC servers (theirs, and "
                      "the one this call starts in this process) listen on every interface and run any graph a "
                      "client sends, without authentication: keep them on a network only you can reach (a "
                      "firewall, a private subnet, a VPN)", SecurityWarning, stacklevel=2)
    bad = []
    for task, address in enumerate(spec[job]):
        status = probe_worker(address, timeout_s=timeout_s)
        if not status.alive:
            bad.append(f"task {task} at {address} is {status.state.value} ({status.detail})")
    if bad:
        raise WorkerError("; ".join(bad) + f". Start every {job} task (e.g. python -m placer.measure.worker) "
                          "at the address the spec names, then connect again")
    log.warning("connecting to a TensorFlow cluster of %d %s task(s); its gRPC servers accept unauthenticated "
                "connections", len(spec[job]), job)
    tf.config.experimental_connect_to_cluster(tf.train.ClusterSpec(spec))
    prefix = f"/job:{job}/"
    return [d.name for d in tf.config.list_logical_devices() if d.name.startswith(prefix)]
