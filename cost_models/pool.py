"""TensorFlow's BFC allocator, replayed: what a device's memory pool holds for a sequence of allocations.

TensorFlow's CPU allocator with oneDNN on (``mklcpu``, the default on x86) and its GPU allocator carve tensors
from regions they take from the system and keep (``BFCAllocator``, best-fit with coalescing). Two things make
a device hold more than the tensors it has live, and both depend only on the order of allocations:

* **chunks**: a tensor gets a whole free chunk unless the chunk is at least twice its size or would waste
  :data:`MAX_INTERNAL_FRAGMENTATION` or more (then the chunk is split); the allocator counts the chunk's size
  as in use. Three 53.3 MiB shards placed on a fresh worker took chunks of 64, 64 and 53.3 MiB: 181.3 MiB in
  use, measured so by the worker's allocator (``benchmarks/results/splitting_adam_table_peak.md``);
* **regions**: when no free chunk fits, the pool takes a new region: the next region size (from
  :data:`FIRST_REGION`, doubled until the request fits, and doubled again after a region of the size it
  already had), at most what its limit leaves. A tensor never spans two regions, so a pool can refuse a
  request with enough free bytes in all (628 MiB free in three chunks, below): a table Adam trained (275 MiB
  shards with two moments) ran out of a 1,728 MiB pool where the step's tensors needed 1,373 MiB.

:func:`replay_pool` runs the algorithm on a sequence of allocations and frees (TF's ``bfc_allocator.cc``,
without its garbage collection, which CPU pools leave off, and its timestamped chunks, which only GPU streams
use). Requests under :data:`SMALL_ALLOCATION` bytes go to ``malloc`` in oneDNN's allocator: counted at their
size, outside the pool. Chunks of the same size are taken in the order of their addresses, which the replay
approximates by (newest region first, as ``mmap`` places them, then offset).

Examples
--------
>>> MiB = 1 << 20
>>> shards = [("table", 53.3 * MiB), ("m", 53.3 * MiB), ("v", 53.3 * MiB)]
>>> use = replay_pool(shards)
>>> round(use.peak_bytes / MiB, 1), round(use.reserved_bytes / MiB), use.failed
(181.3, 256, None)
>>> tight = replay_pool([(f"w{i}", 275 * MiB) for i in range(5)], limit=1728 * MiB)
>>> tight.failed, round(tight.reserved_bytes / MiB)  # four fit; the fifth finds no chunk and no room
(4, 1728)
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Hashable, Iterable, Mapping

__all__ = ["FIRST_REGION", "MAX_INTERNAL_FRAGMENTATION", "MIN_ALLOCATION", "SMALL_ALLOCATION", "BFCPool",
           "PoolUse", "fed_weight_events", "paired_payload_events", "replay_pool", "written_weight_events"]

#: Every chunk is a multiple of this many bytes (``kMinAllocationSize``).
MIN_ALLOCATION = 256
#: The first region a growing pool takes (``allow_growth``: 2 MiB, or its limit if smaller).
FIRST_REGION = 2 << 20
#: A free chunk is split for a request when the rest would be at least the request, or at least this many
#: bytes (``kMaxInternalFragmentation``).
MAX_INTERNAL_FRAGMENTATION = 128 << 20
#: oneDNN's CPU allocator serves requests below this many bytes with ``malloc`` (``kSmallAllocationsThreshold``).
SMALL_ALLOCATION = 4096


def _rounded(nbytes: float) -> int:
    return MIN_ALLOCATION * max(1, math.ceil(nbytes / MIN_ALLOCATION))


@dataclass(frozen=True)
class PoolUse:
    """What :func:`replay_pool` found.

    Attributes
    ----------
    peak_bytes : float
        The most bytes in use at once: the pool's chunks (what TensorFlow's allocator reports in use) plus
        the small requests served outside it.
    reserved_bytes : float
        The regions the pool holds at the end (or when it failed).
    failed : int or None
        Index of the first allocation the pool could not serve under its limit (``None``: all served). The
        replay stops there.
    failed_bytes : float
        That allocation's bytes (0 when none failed).
    """

    peak_bytes: float
    reserved_bytes: float
    failed: int | None = None
    failed_bytes: float = 0.0


class BFCPool:
    """One growing BFC pool (:mod:`cost_models.pool`): :meth:`allocate` and :meth:`free` by key.

    Examples
    --------
    >>> pool = BFCPool()
    >>> pool.allocate("a", 3 << 20), pool.in_use, pool.reserved
    (True, 4194304, 4194304)
    >>> pool.free("a"); pool.in_use
    0
    """

    def __init__(self, limit: float = math.inf, first_region: int = FIRST_REGION) -> None:
        if not limit > 0:
            raise ValueError(f"a pool's limit must be positive, not {limit!r}")
        self.limit = limit
        self.in_use = 0           # bytes of chunks handed out
        self.small = 0.0          # bytes of small requests (served outside the pool)
        self.reserved = 0         # bytes of the regions taken
        self._next_region = _rounded(min(first_region, limit))
        self._regions: list[list[list]] = []       # per region: chunks [offset, size, key or None], by offset
        self._free: list[tuple[int, int, int]] = []  # (size, -region, offset) of free chunks, sorted
        self._held: dict[Hashable, tuple[int, int] | float] = {}  # key -> (region, offset), or small bytes

    def allocate(self, key: Hashable, nbytes: float) -> bool:
        """Serve ``nbytes`` for ``key`` (not held now); ``False`` when the pool cannot under its limit."""
        if key in self._held:
            raise ValueError(f"{key!r} is allocated already")
        if nbytes < SMALL_ALLOCATION:
            self._held[key] = float(nbytes)
            self.small += nbytes
            return True
        rounded = _rounded(nbytes)
        found = self._best_fit(rounded)
        if found is None:
            if not self._extend(rounded):
                return False
            found = self._best_fit(rounded)
        region, offset = found
        self._held[key] = (region, offset)
        self.in_use += self._take(region, offset, rounded)
        return True

    def free(self, key: Hashable) -> None:
        """Give back what ``key`` holds (its chunk merges with free neighbours)."""
        held = self._held.pop(key)
        if isinstance(held, float):
            self.small -= held
            return
        region, offset = held
        chunks = self._regions[region]
        i = self._index(chunks, offset)
        chunk = chunks[i]
        self.in_use -= chunk[1]
        chunk[2] = None
        if i + 1 < len(chunks) and chunks[i + 1][2] is None:  # the next chunk is free: merge it in
            nxt = chunks.pop(i + 1)
            self._unlist(region, nxt)
            chunk[1] += nxt[1]
        if i > 0 and chunks[i - 1][2] is None:  # the previous chunk is free: merge into it
            prev = chunks[i - 1]
            self._unlist(region, prev)
            prev[1] += chunk[1]
            chunks.pop(i)
            chunk = prev
        self._list(region, chunk)

    @property
    def bytes(self) -> float:
        """Bytes in use now: chunks and small requests."""
        return self.in_use + self.small

    @staticmethod
    def _index(chunks: list[list], offset: int) -> int:
        return bisect.bisect_left(chunks, offset, key=lambda c: c[0])

    def _list(self, region: int, chunk: list) -> None:
        bisect.insort(self._free, (chunk[1], -region, chunk[0]))

    def _unlist(self, region: int, chunk: list) -> None:
        del self._free[bisect.bisect_left(self._free, (chunk[1], -region, chunk[0]))]

    def _best_fit(self, rounded: int) -> tuple[int, int] | None:
        i = bisect.bisect_left(self._free, (rounded, -math.inf, -math.inf))
        if i == len(self._free):
            return None
        _, neg_region, offset = self._free[i]
        return -neg_region, offset

    def _take(self, region: int, offset: int, rounded: int) -> int:
        """Hand out the free chunk at ``offset`` for ``rounded`` bytes, split where BFC splits; its size."""
        chunks = self._regions[region]
        i = self._index(chunks, offset)
        chunk = chunks[i]
        self._unlist(region, chunk)
        if chunk[1] >= 2 * rounded or chunk[1] - rounded >= MAX_INTERNAL_FRAGMENTATION:
            rest = [offset + rounded, chunk[1] - rounded, None]
            chunk[1] = rounded
            chunks.insert(i + 1, rest)
            self._list(region, rest)
        chunk[2] = True
        return chunk[1]

    def _extend(self, rounded: int) -> bool:
        available = self.limit - self.reserved
        if math.isfinite(available):
            available = (int(available) // MIN_ALLOCATION) * MIN_ALLOCATION
        if rounded > available:
            return False
        increased = False
        while rounded > self._next_region:
            self._next_region *= 2
            increased = True
        size = int(min(self._next_region, available))
        if not increased:
            self._next_region *= 2
        self.reserved += size
        chunk = [0, size, None]
        self._regions.append([chunk])
        self._list(len(self._regions) - 1, chunk)
        return True


def replay_pool(events: Iterable[tuple[Hashable, float]], limit: float = math.inf,
                first_region: int = FIRST_REGION, *, before: Iterable[tuple[Hashable, float]] = ()) -> PoolUse:
    """Replay allocations and frees on a fresh :class:`BFCPool` under ``limit`` bytes of regions.

    Parameters
    ----------
    events : iterable of (key, bytes)
        In order: ``bytes >= 0`` allocates that many bytes for ``key``; ``bytes < 0`` frees ``key``.
    limit : float
        The most bytes of regions the pool may take (TensorFlow's ``TF_MKL_ALLOC_MAX_BYTES`` on a CPU).
    before : iterable of (key, bytes)
        What the pool served earlier, replayed first in the same form: the regions it took stay, and what it
        did not free stays in use (and counts from the start); its own peak is not counted, nor is it in
        ``failed`` (an allocation of it that the pool cannot serve is passed over: it failed where it ran).

    Examples
    --------
    >>> MiB = 1 << 20
    >>> use = replay_pool([("a", 3 * MiB), ("a", -1), ("b", 3 * MiB)])  # b reuses a's chunk
    >>> use.peak_bytes / MiB, use.reserved_bytes / MiB
    (4.0, 4.0)

    A 360 MiB tensor in a pool capped at 528 MiB: a fresh pool takes a 512 MiB region and splits it (152 MiB
    left over is more than :data:`MAX_INTERNAL_FRAGMENTATION`); after regions of 62 MiB for two 16 MiB tensors
    at once, the new region is the 466 MiB the cap leaves, and the tensor takes it whole (106 MiB left over):

    >>> shard = [("shard", 360 * MiB)]
    >>> round(replay_pool(shard, 528 * MiB).peak_bytes / MiB)
    360
    >>> earlier = [(("t", size, i), size) for size in (MiB, 4 * MiB, 16 * MiB) for i in (0, 1)]
    >>> earlier += [(key, -1) for key, _ in list(earlier)]
    >>> round(replay_pool(shard, 528 * MiB, before=earlier).peak_bytes / MiB)
    466
    """
    pool = BFCPool(limit, first_region)
    served = set()
    for key, nbytes in before:
        if nbytes >= 0:
            if pool.allocate(key, nbytes):
                served.add(key)
        elif key in served:
            served.discard(key)
            pool.free(key)
    peak = pool.bytes
    for i, (key, nbytes) in enumerate(events):
        if nbytes < 0:
            pool.free(key)
            continue
        if not pool.allocate(key, nbytes):
            return PoolUse(peak, float(pool.reserved), i, float(nbytes))
        peak = max(peak, pool.bytes)
    return PoolUse(peak, float(pool.reserved))


# What a worker's pool served before a placement, as events for ``replay_pool(before=)`` (each pattern measured
# on a worker whose pool was capped at 528 MiB: a 360 MiB tensor placed after it, its allocator's bytes in use
# read from the profiler's events, 2026-12-08; ``docs/costs.md``, memory).

def paired_payload_events(label: Hashable, sizes: Iterable[float]) -> list[tuple[Hashable, float]]:
    """Two tensors of each size at once, size after size, each pair freed before the next: a link
    calibration's payloads (a hop's input and its product). Measured: after the default calibration
    (4 KiB .. 16 MiB) the 360 MiB tensor took a whole 466 MiB region, as replayed.

    >>> paired_payload_events("link", [4096])
    [(('link', 4096, 0), 4096.0), (('link', 4096, 1), 4096.0), (('link', 4096, 0), -1.0), (('link', 4096, 1), -1.0)]
    """
    out: list[tuple[Hashable, float]] = []
    for size in sizes:
        keys = [(label, int(size), i) for i in range(2)]
        out += [(key, float(size)) for key in keys] + [(key, -1.0) for key in keys]
    return out


def fed_weight_events(label: Hashable, sizes: Mapping[str, float]) -> list[tuple[Hashable, float]]:
    """Weights fed to a session in turn (each value as it arrives, the variable it is assigned to, the value
    freed), the variables freed at the end: a profile's. Measured: after a profile that fed a 64 MiB table,
    the 360 MiB tensor took a whole 400 MiB region, as replayed.

    >>> [(key[2], b) for key, b in fed_weight_events("profile", {"w": 1 << 20})]
    [('fed', 1048576.0), ('variable', 1048576.0), ('fed', -1.0), ('variable', -1.0)]
    """
    out: list[tuple[Hashable, float]] = []
    for name, nbytes in sizes.items():
        fed, variable = (label, name, "fed"), (label, name, "variable")
        out += [(fed, float(nbytes)), (variable, float(nbytes)), (fed, -1.0)]
    return out + [((label, name, "variable"), -1.0) for name in sizes]


def written_weight_events(label: Hashable, sizes: Mapping[str, float], piece_bytes: float
                          ) -> list[tuple[Hashable, float]]:
    """Weights copied onto the device as variables made there and written in pieces of at most ``piece_bytes``
    (each piece arriving and freed in turn; ``placer.tf.remote.variable_on``), the variables freed at the end:
    the weight copies a shared-capacity probe or a runtime factor times. Measured: after a 40 MiB weight so
    copied and dropped, the 360 MiB tensor took a whole 400 MiB region; after a 100 MiB one the pool could not
    serve it at all (regions of 128 and 128 MiB left 272 MiB under the cap), both as replayed.

    >>> [(key[2], b) for key, b in written_weight_events("copy", {"w": 40 << 20}, 16 << 20)][:4]
    [('variable', 41943040.0), (('piece', 0), 16777216.0), (('piece', 0), -1.0), (('piece', 1), 16777216.0)]
    """
    if not piece_bytes > 0:
        raise ValueError(f"piece_bytes must be positive, not {piece_bytes!r}")
    out: list[tuple[Hashable, float]] = []
    for name, nbytes in sizes.items():
        out.append(((label, name, "variable"), float(nbytes)))
        left, i = float(nbytes), 0
        while left > 0:
            piece = (label, name, ("piece", i))
            out += [(piece, float(min(piece_bytes, left))), (piece, -1.0)]
            left -= piece_bytes
            i += 1
    return out + [((label, name, "variable"), -1.0) for name in sizes]
