"""Device specifications and their validation (no TensorFlow import).

A placement targets a :class:`DeviceSet`: an ordered tuple of
:class:`DeviceSpec` plus a link model between every ordered pair. Device
strings are canonicalised to TensorFlow's full form
(``/job:localhost/replica:0/task:0/device:CPU:1``) so that ``"/CPU:1"`` and
``"/device:CPU:1"`` name the same device.

Examples
--------
>>> canonical_device_name("/CPU:1")
'/job:localhost/replica:0/task:0/device:CPU:1'
>>> canonical_device_name("/job:worker/task:1/device:cpu:0")
'/job:worker/replica:0/task:1/device:CPU:0'
>>> ds = resolve_devices(["/CPU:0", "/CPU:1"], available=["/job:localhost/replica:0/task:0/device:CPU:0",
...                      "/job:localhost/replica:0/task:0/device:CPU:1"])
>>> [d.kind for d in ds.devices]
['CPU', 'CPU']
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Hashable, Iterable, Mapping, Sequence

import numpy as np

from cost_models.comm import Link, LinkFit
from cost_models.simulate import checked_ready_order

from ..errors import DeviceError
from .validate import MAX_BYTES, boolean, integer, real

#: Assumed link between two devices when nothing better is known: these are
#: planning defaults, not measurements (see ``docs/costs.md``).
DEFAULT_BANDWIDTH_BYTES_PER_S = 8e9
DEFAULT_LATENCY_S = 20e-6
#: Cross-process (gRPC) links are slower; measured on loopback in
#: ``../shared/notes/tf-facts.md``: ~1 ms per call, ~1.6 GB/s.
DEFAULT_REMOTE_BANDWIDTH_BYTES_PER_S = 1.6e9
DEFAULT_REMOTE_LATENCY_S = 1e-3
#: ... and each transfer between processes costs CPU on both ends (serialisation, RPC handling), which on a
#: one-thread worker queues with its ops: 28–92 µs measured between two pinned one-thread gRPC workers
#: (:func:`placer.measure.links.measure_transfer_cpu`). With it the simulator knows that a busy one-thread
#: worker defers its sends (a pipeline on gRPC workers planned with ``calibrate_links=False`` was predicted
#: 13–40% too fast without it, ``docs/costs.md``).
DEFAULT_REMOTE_TRANSFER_CPU_S = 50e-6

_FULL = re.compile(
    r"^/?(?:job:(?P<job>[A-Za-z0-9_]+))?/?(?:replica:(?P<replica>\d+))?/?"
    r"(?:task:(?P<task>\d+))?/?(?:device:)?(?P<type>[A-Za-z_]+):(?P<index>\d+)$"
)


def canonical_device_name(name: str) -> str:
    """Return the full TensorFlow name of a device string.

    Parameters
    ----------
    name : str
        ``"/CPU:0"``, ``"GPU:1"``, ``"/device:CPU:0"`` or a full
        ``/job:…/replica:…/task:…/device:TYPE:N`` string.

    Returns
    -------
    str
        ``/job:J/replica:R/task:T/device:TYPE:N`` with ``TYPE`` upper-case and
        defaults ``job=localhost``, ``replica=0``, ``task=0``.

    Raises
    ------
    DeviceError
        If the string is not a device name.

    Examples
    --------
    >>> canonical_device_name("gpu:0")
    '/job:localhost/replica:0/task:0/device:GPU:0'
    """
    if not isinstance(name, str):
        raise DeviceError(f"device {name!r} is not a string; pass e.g. '/CPU:0' or a DeviceSpec")
    m = _FULL.match(name.strip())
    if m is None:
        raise DeviceError(
            f"cannot parse device {name!r}; use '/CPU:0', '/GPU:1' or "
            "'/job:worker/replica:0/task:1/device:CPU:0'"
        )
    job = m.group("job") or "localhost"
    replica = m.group("replica") or "0"
    task = m.group("task") or "0"
    return f"/job:{job}/replica:{replica}/task:{task}/device:{m.group('type').upper()}:{m.group('index')}"


def device_kind(name: str) -> str:
    """Device type of a (canonical or short) device name, e.g. ``'GPU'``.

    Examples
    --------
    >>> device_kind("/job:worker/replica:0/task:3/device:GPU:1")
    'GPU'
    """
    return canonical_device_name(name).rsplit("/device:", 1)[1].split(":")[0]


def device_host(name: str) -> str:
    """The ``/job:…/replica:…/task:…`` part: devices sharing it share a process.

    Examples
    --------
    >>> device_host("/CPU:1")
    '/job:localhost/replica:0/task:0'
    """
    return canonical_device_name(name).rsplit("/device:", 1)[0]


@dataclass(frozen=True)
class DeviceSpec:
    """One target device.

    Parameters
    ----------
    name : str
        Device string; canonicalised on construction.
    memory_bytes : int or None
        Capacity available to the model's resident state (1 … 2**62 bytes); ``None`` = unlimited.
    speed : float
        Relative compute speed (2.0 runs every op in half the measured time).
    bandwidth_bytes_per_s, latency_s : float or None
        Link to every *other* device of the set, overriding the defaults.
    memory_pool_bytes : int or None
        The device's tensors come from a pool of regions TensorFlow's BFC allocator takes as it grows and
        keeps, capped at this many bytes (a CPU with oneDNN on under ``TF_MKL_ALLOC_MAX_BYTES``:
        :meth:`placer.LocalCluster.device_specs` says so for its limited workers). A step's peak is then what
        that pool holds in use, chunks and regions replayed (:mod:`cost_models.pool`), compared with
        ``memory_bytes`` as any peak is; a step the pool cannot serve under its cap does not fit. ``None``: the
        live tensors' bytes. The replay grows the pool from 2 MiB, as TensorFlow's CPU pools and GPUs under
        ``allow_growth`` do (a GPU without it takes all its memory in one region: not modelled).

    Examples
    --------
    >>> DeviceSpec("/GPU:0", memory_bytes=16 << 30).kind
    'GPU'
    """

    name: str
    memory_bytes: int | None = None
    speed: float = 1.0
    bandwidth_bytes_per_s: float | None = None
    latency_s: float | None = None
    memory_pool_bytes: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", canonical_device_name(self.name))
        for attr in ("memory_bytes", "memory_pool_bytes"):
            if getattr(self, attr) is not None:
                object.__setattr__(self, attr, integer(f"{self.name}: {attr}", getattr(self, attr), minimum=1,
                                                       maximum=MAX_BYTES, error=DeviceError))
        for attr in ("speed", "bandwidth_bytes_per_s", "latency_s"):
            v = getattr(self, attr)
            if v is not None:
                object.__setattr__(self, attr, real(f"{self.name}: {attr}", v, strict=attr != "latency_s",
                                                    error=DeviceError))

    # Parsed from the (canonical, frozen) name once: the problem builder asks per node and device.
    @cached_property
    def kind(self) -> str:
        """Device type (``CPU``, ``GPU``, …)."""
        return device_kind(self.name)

    @cached_property
    def host(self) -> str:
        """Process part of the name (``/job:…/replica:…/task:…``)."""
        return device_host(self.name)


#: Values of ``SharedProcessor.source``.
SHARE_SOURCES = ("measured", "given")


@dataclass(frozen=True)
class SharedProcessor:
    """Devices of a :class:`DeviceSet` that share one processor: logical CPU devices of one process
    (``pooled``), or the CPUs of worker processes on one machine (not ``pooled``).

    Parameters
    ----------
    devices : tuple of int
        Indices into the set's devices.
    capacity : float
        How many of them can do their profiled work at once (1 … ``len(devices)``):
        four logical CPUs over two cores whose ops each use both cores have about 1;
        two one-core workers on a 2-core machine that also runs their client, about 1.7.
    source : {"measured", "given"}
        Where the capacity came from.
    pooled : bool
        The devices draw on one runtime's thread pool, so one of them alone may use
        the whole capacity (logical devices of one process). ``False``: each device is
        its own runtime and does at most one device's work at a time (worker processes).

    Examples
    --------
    >>> SharedProcessor((0, 1, 2, 3), 1.1).capacity
    1.1
    >>> SharedProcessor((0, 1), 1.7, pooled=False).per_device
    1.0
    """

    devices: tuple[int, ...]
    capacity: float
    source: str = "given"
    pooled: bool = True

    @property
    def per_device(self) -> float:
        """How much of the capacity one device can use alone."""
        return self.capacity if self.pooled else 1.0

    def __post_init__(self) -> None:
        devs = tuple(integer("shared device index", d, minimum=0, error=DeviceError) for d in self.devices)
        if len(devs) < 2 or len(set(devs)) != len(devs):
            raise DeviceError(f"a shared processor needs two or more distinct devices, got {self.devices!r}")
        object.__setattr__(self, "devices", devs)
        cap = real("shared processor capacity", self.capacity, strict=True, error=DeviceError)
        if cap < 1:
            raise DeviceError(f"a shared processor's capacity is at least 1 (one device's work at a time), got {cap}")
        object.__setattr__(self, "capacity", float(min(cap, len(devs))))
        if self.source not in SHARE_SOURCES:
            raise DeviceError(f"source must be one of {SHARE_SOURCES}, got {self.source!r}")
        boolean("pooled", self.pooled, error=DeviceError)


@dataclass(frozen=True)
class DeviceSet:
    """Ordered target devices, the link between each ordered pair, and the processors devices share."""

    devices: tuple[DeviceSpec, ...]
    links: Mapping[tuple[int, int], Link] = field(default_factory=dict)
    shared: tuple[SharedProcessor, ...] = ()
    #: The ordered pairs whose links were measured, each with its fit (the rest are assumed defaults).
    fits: Mapping[tuple[int, int], LinkFit] = field(default_factory=dict)
    #: Which ready op the devices' executors run next: ``"fifo"`` (the earliest ready: several inter-op
    #: threads), ``"lifo"`` (depth first: TF workers with one inter-op thread run a finished op's
    #: successor inline), ``None``: ``"fifo"`` (``cost_models.SimOptions.ready_order``).
    ready_order: str | None = None
    #: Per device (empty: none recorded), what autoplace's own stages allocated and freed in its allocator pool
    #: before the placement (``(key, bytes)`` events, ``bytes < 0`` a free: :func:`cost_models.pool.replay_pool`'s
    #: ``before``): a pool keeps the regions it took, which decides where a later large tensor goes
    #: (:meth:`with_pool_events`; replayed for devices with ``memory_pool_bytes``).
    pool_history: tuple[tuple[tuple[Hashable, float], ...], ...] = ()

    def __post_init__(self) -> None:
        checked_ready_order(self.ready_order, DeviceError)
        if self.pool_history and len(self.pool_history) != len(self.devices):
            raise DeviceError(f"pool_history must be empty or one sequence of events per device, not "
                              f"{len(self.pool_history)} for {len(self.devices)} devices")
        seen: set[int] = set()
        for sp in self.shared:
            if max(sp.devices) >= len(self.devices) or seen & set(sp.devices):
                raise DeviceError(f"shared processors must name distinct devices among 0..{len(self.devices) - 1}, "
                                  f"got {[sp.devices for sp in self.shared]}")
            seen |= set(sp.devices)

    def with_shared(self, shared: Sequence[SharedProcessor]) -> "DeviceSet":
        """The same devices and links with these shared processors."""
        return replace(self, shared=tuple(shared))

    def with_pool_events(self, device: int, events: Sequence[tuple[Hashable, float]]) -> "DeviceSet":
        """The same set with ``events`` (allocations and frees, :attr:`pool_history`) appended to device
        ``device``'s pool history.

        Examples
        --------
        >>> ds = resolve_devices(["/CPU:0", "/CPU:1"]).with_pool_events(1, [("probe", 4096), ("probe", -1)])
        >>> ds.pool_history
        ((), (('probe', 4096.0), ('probe', -1.0)))
        """
        if not 0 <= device < len(self.devices):
            raise DeviceError(f"no device {device} among 0..{len(self.devices) - 1}")
        history = [list(h) for h in self.pool_history] or [[] for _ in self.devices]
        history[device] += [(key, float(b)) for key, b in events]
        return replace(self, pool_history=tuple(tuple(h) for h in history))

    def first(self, n: int) -> "DeviceSet":
        """The first ``n`` devices with the links between them, their fits, and the shared processors of two or
        more of them (capacity clipped to the devices left): the devices of one data-parallel group.

        Examples
        --------
        >>> ds = resolve_devices(["/CPU:0", "/CPU:1", "/CPU:2"]).with_shared([SharedProcessor((0, 1, 2), 2.5)])
        >>> sub = ds.first(2)
        >>> sub.names, sorted(sub.links), sub.shared[0].capacity
        (('/job:localhost/replica:0/task:0/device:CPU:0', '/job:localhost/replica:0/task:0/device:CPU:1'), \
[(0, 1), (1, 0)], 2.0)
        >>> ds.first(4)
        Traceback (most recent call last):
        ...
        placer.errors.DeviceError: a group of 1 to 3 devices (the first n of this set), got 4
        """
        if not 1 <= n <= len(self.devices):
            raise DeviceError(f"a group of 1 to {len(self.devices)} devices (the first n of this set), got {n}")
        shared = tuple(replace(sp, devices=kept) for sp in self.shared
                       if len(kept := tuple(d for d in sp.devices if d < n)) >= 2)
        return replace(self, devices=self.devices[:n],
                       links={ij: link for ij, link in self.links.items() if max(ij) < n},
                       fits={ij: fit for ij, fit in self.fits.items() if max(ij) < n}, shared=shared,
                       pool_history=self.pool_history[:n])

    @property
    def calibrated(self) -> frozenset[tuple[int, int]]:
        """The ordered pairs whose links were measured (keys of :attr:`fits`)."""
        return frozenset(self.fits)

    def host_groups(self, kind: str = "CPU") -> list[tuple[int, ...]]:
        """Indices of devices of ``kind`` that share a process (two or more), by process.

        Examples
        --------
        >>> resolve_devices(["/CPU:0", "/CPU:1", "/job:worker/task:1/device:CPU:0"]).host_groups()
        [(0, 1)]
        """
        by_host: dict[str, list[int]] = {}
        for i, d in enumerate(self.devices):
            if d.kind == kind:
                by_host.setdefault(d.host, []).append(i)
        return [tuple(g) for g in by_host.values() if len(g) > 1]

    @property
    def names(self) -> tuple[str, ...]:
        """Canonical device names, in order."""
        return tuple(d.name for d in self.devices)

    def __len__(self) -> int:
        return len(self.devices)

    def link(self, i: int, j: int) -> Link:
        """Link from device ``i`` to device ``j`` (``i != j``)."""
        return self.links[(i, j)]

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(bandwidth (k, k), latency (k, k), capacity (k,))`` for the solvers (``inf`` = unlimited)."""
        k = len(self.devices)
        bw = np.full((k, k), np.inf)
        lat = np.zeros((k, k))
        for (i, j), link in self.links.items():
            bw[i, j], lat[i, j] = link.bandwidth_bytes_per_s, link.latency_s
        cap = np.array([np.inf if d.memory_bytes is None else d.memory_bytes for d in self.devices], dtype=float)
        return bw, lat, cap

    def memory_pools(self) -> tuple[float | None, ...]:
        """Per device, the bytes its allocator pool may take (``cost_models.SimOptions.memory_pools``) where it
        has one (``DeviceSpec.memory_pool_bytes``), else ``None``; empty when none has.

        >>> resolve_devices([DeviceSpec("/CPU:0", memory_bytes=1 << 29, memory_pool_bytes=1 << 30), "/CPU:1"]
        ...                 ).memory_pools()
        (1073741824.0, None)
        """
        pools = tuple(None if d.memory_pool_bytes is None else float(d.memory_pool_bytes) for d in self.devices)
        return pools if any(p is not None for p in pools) else ()

    def memory_pool_history(self) -> tuple[tuple[tuple[Hashable, float], ...], ...]:
        """:attr:`pool_history` where a device's pool is replayed (``cost_models.SimOptions.memory_pool_history``):
        per device its events, or none for a device without ``memory_pool_bytes``; empty when no pooled device
        has any."""
        pools = self.memory_pools()
        if not pools or not self.pool_history:
            return ()
        history = tuple(h if p is not None else () for h, p in zip(self.pool_history, pools))
        return history if any(history) else ()

    def measured_links(self) -> tuple[tuple[tuple[int, int], Link], ...]:
        """The links whose transfer times were measured (``Link.points``): ``((i, j), link)`` pairs for
        ``PlacementProblem.build``."""
        return tuple(((i, j), link) for (i, j), link in sorted(self.links.items()) if link.points)

    def transfer_cpu(self) -> np.ndarray | None:
        """``(k, k)`` CPU seconds a transfer costs on each end (``Link.cpu_s``), or ``None`` when none is known."""
        k = len(self.devices)
        cpu = np.zeros((k, k))
        for (i, j), link in self.links.items():
            cpu[i, j] = link.cpu_s
        return cpu if cpu.any() else None


def _default_link(a: DeviceSpec, b: DeviceSpec) -> Link:
    remote = a.host != b.host
    bws = [x.bandwidth_bytes_per_s for x in (a, b) if x.bandwidth_bytes_per_s is not None]
    lats = [x.latency_s for x in (a, b) if x.latency_s is not None]
    bw = min(bws) if bws else (DEFAULT_REMOTE_BANDWIDTH_BYTES_PER_S if remote else DEFAULT_BANDWIDTH_BYTES_PER_S)
    lat = max(lats) if lats else (DEFAULT_REMOTE_LATENCY_S if remote else DEFAULT_LATENCY_S)
    return Link(bw, lat, DEFAULT_REMOTE_TRANSFER_CPU_S if remote else 0.0)


def resolve_devices(
    devices: Sequence[object] | Iterable[object],
    available: Sequence[str] | None = None,
) -> DeviceSet:
    """Validate a user's device list and build a :class:`DeviceSet`.

    Parameters
    ----------
    devices : sequence
        Strings, :class:`DeviceSpec` objects, or objects with a ``name``
        attribute holding a device string (``tf.config.LogicalDevice``).
    available : sequence of str, optional
        Full names of the devices that exist; ``None`` skips the check (for
        offline planning on hardware that is not present).

    Raises
    ------
    DeviceError
        Empty list, unparsable entry, duplicate device, or a device that is
        not in ``available``.

    Examples
    --------
    >>> resolve_devices([])
    Traceback (most recent call last):
    ...
    placer.errors.DeviceError: the device list is empty; pass at least one device, e.g. ['/CPU:0']
    """
    if isinstance(devices, (str, bytes)):
        raise DeviceError(f"devices must be a list of devices, not the string {devices!r}; wrap it: [{devices!r}]")
    try:
        items = list(devices)
    except TypeError:
        raise DeviceError(f"devices must be a list, got {type(devices).__name__}") from None
    if not items:
        raise DeviceError("the device list is empty; pass at least one device, e.g. ['/CPU:0']")
    specs: list[DeviceSpec] = []
    for item in items:
        if isinstance(item, DeviceSpec):
            specs.append(item)
        elif isinstance(item, str):
            specs.append(DeviceSpec(item))
        elif isinstance(getattr(item, "name", None), str):
            specs.append(DeviceSpec(item.name))
        else:
            raise DeviceError(f"cannot use {item!r} as a device; pass a string, a DeviceSpec or a tf.config.LogicalDevice")
    seen: dict[str, int] = {}
    for i, s in enumerate(specs):
        if s.name in seen:
            raise DeviceError(
                f"device {s.name} is listed twice (entries {seen[s.name]} and {i}); list each device once"
            )
        seen[s.name] = i
    if available is not None:
        avail = {canonical_device_name(a) for a in available}
        missing = [s.name for s in specs if s.name not in avail]
        if missing:
            raise DeviceError(
                f"device(s) {missing} are not available in this process; available: {sorted(avail)}. "
                "Create logical devices before TensorFlow initialises "
                "(tf.config.set_logical_device_configuration) or connect to the cluster first "
                "(tf.config.experimental_connect_to_cluster)."
            )
    links = {(i, j): _default_link(a, b) for i, a in enumerate(specs) for j, b in enumerate(specs) if i != j}
    return DeviceSet(tuple(specs), links)
