"""On-disk cache of measured per-op times (no TensorFlow).

An entry is keyed by the graph's fingerprint, the device kind, the batch
size, the TensorFlow version and, for a gRPC worker, that worker process; the key is stored inside the entry too, so
a file that was copied, renamed or written by another version is detected
and ignored with a warning — never silently used.

Examples
--------
>>> import tempfile
>>> cache = ProfileCache(tempfile.mkdtemp())
>>> key = CacheKey("abc123", "CPU", 8, "2.21.0")
>>> cache.get(key) is None
True
>>> cache.put(key, {"MatMul": 12.5}, {"MatMul": 0.4})
True
>>> cache.get(key).median_us
{'MatMul': 12.5}
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Collection, Mapping

from .files import write_atomic

log = logging.getLogger(__name__)

#: Bumped when the entry layout changes; older entries are ignored.
CACHE_FORMAT = 2  # 2: op times include the executor's per-op overhead


def default_cache_dir() -> Path:
    """``$AUTOPLACE_CACHE_DIR``, else ``$XDG_CACHE_HOME/autoplace``, else ``~/.cache/autoplace``."""
    if os.environ.get("AUTOPLACE_CACHE_DIR"):
        return Path(os.environ["AUTOPLACE_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "autoplace"


def fingerprint(data: bytes) -> str:
    """SHA-256 hex digest of a deterministic serialisation of the graph."""
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class CacheKey:
    """What a measurement depends on."""

    graph: str
    device_kind: str
    batch_size: int
    tf_version: str
    grappler: bool = False
    #: The worker process the times were measured on, as its server identifies itself (each device's
    #: incarnation, new at every start: an entry serves that process only); empty for this process.
    worker: str = ""
    #: How the inputs were fed where not the default (standard normal floats, integer zeros): e.g. the
    #: bounds of random ids (``"ids<400000"``), which change what a gather costs.
    feeds: str = ""

    def filename(self) -> str:
        digest = fingerprint(json.dumps(asdict(self), sort_keys=True).encode())[:32]
        return f"profile-{self.device_kind}-{digest}.json"


@dataclass(frozen=True)
class CachedProfile:
    median_us: Mapping[str, float]
    spread_us: Mapping[str, float]


def _times(value: object, what: str) -> dict[str, float]:
    """A ``{op name: finite non-negative µs}`` mapping, or ValueError saying what is wrong."""
    if not isinstance(value, dict):
        raise ValueError(f"{what} is a {type(value).__name__}, not an object of op times")
    out = {}
    for k, v in value.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ValueError(f"{what}[{k!r}] = {v!r} is not a finite non-negative number of µs")
        out[str(k)] = float(v)
    return out


def _key(value: object) -> CacheKey:
    types = {"graph": str, "device_kind": str, "batch_size": int, "tf_version": str, "grappler": bool, "worker": str,
             "feeds": str}
    if not isinstance(value, dict) or set(value) != set(types):
        raise ValueError(f"the key is not an object with the fields {sorted(types)}")
    for name, kind in types.items():
        v = value[name]
        if not isinstance(v, kind) or (kind is int and isinstance(v, bool)):
            raise ValueError(f"key field {name!r} = {v!r} is not a {kind.__name__}")
    return CacheKey(**value)


class ProfileCache:
    """A directory of JSON entries, one per :class:`CacheKey`.

    The cache is *trusted input*: its times decide the plan. Entries are
    checked (layout, types, finite non-negative times, every op present)
    and a bad one is ignored with a warning, but a well-formed entry with
    plausible times is believed. The directory is created ``0700`` and each
    entry ``0600``; point ``$AUTOPLACE_CACHE_DIR`` only at a folder you own.
    A failed write is logged and the placement goes on (the cache only saves
    profiling time).
    """

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)

    def get(self, key: CacheKey, required_ops: Collection[str] = ()) -> CachedProfile | None:
        """The entry for ``key``, or None (missing, corrupt, stale or foreign entries: warned and ignored).

        ``required_ops``: op names the entry must time (those a fresh profile would); an entry lacking
        one is ignored.
        """
        path = self.directory / key.filename()
        if not path.exists():
            return None
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(doc, dict):
                raise ValueError("the entry is not a JSON object")
            fmt = doc.get("format")
            if fmt != CACHE_FORMAT:
                raise ValueError(f"it has format {fmt!r}, this autoplace writes {CACHE_FORMAT}")
            stored = _key(doc.get("key"))
            if stored != key:
                raise ValueError(f"it was written for {stored}, not {key}")
            median = _times(doc.get("median_us"), "median_us")
            spread = _times(doc.get("spread_us"), "spread_us")
            missing = [op for op in required_ops if op not in median]
            if missing:
                raise ValueError(f"it times no {len(missing)} of the graph's ops (e.g. {sorted(missing)[:3]})")
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
            log.warning("ignoring profile cache entry %s: %s; re-profiling", path, e)
            return None
        return CachedProfile(median, spread)

    def put(self, key: CacheKey, median_us: Mapping[str, float], spread_us: Mapping[str, float]) -> bool:
        """Write the entry atomically (``0600``, in a ``0700`` directory); False (and a warning) if it failed."""
        return self._write(key.filename(), {"format": CACHE_FORMAT, "key": asdict(key), "median_us": dict(median_us),
                                            "spread_us": dict(spread_us)}, "profile cache entry")

    def get_figures(self, key: Mapping[str, Any]) -> dict[str, Any] | None:
        """The measured figures stored under ``key`` (:meth:`put_figures`), or None (missing, or an entry whose
        stored key differs or whose layout is not this version's: warned and ignored).

        What a plan depends on besides op times (a runtime factor, shared capacities, calibrated links) is
        kept beside the profile it was measured with, so that a warm cache gives the same plan again.

        Examples
        --------
        >>> import tempfile
        >>> cache = ProfileCache(tempfile.mkdtemp())
        >>> cache.put_figures({"of": "hosts", "devices": ["/CPU:0"]}, {"capacity": 1.25})
        True
        >>> cache.get_figures({"of": "hosts", "devices": ["/CPU:0"]}), cache.get_figures({"of": "other"})
        ({'capacity': 1.25}, None)
        """
        path = self.directory / _figures_filename(key)
        if not path.exists():
            return None
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(doc, dict) or doc.get("format") != FIGURES_FORMAT:
                raise ValueError(f"it is not a figures entry of format {FIGURES_FORMAT}")
            if doc.get("key") != json.loads(json.dumps(dict(key))):
                raise ValueError("it was written for another key")
            if not isinstance(doc.get("figures"), dict):
                raise ValueError("its figures are not an object")
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
            log.warning("ignoring cache entry %s: %s; measuring again", path, e)
            return None
        return doc["figures"]

    def put_figures(self, key: Mapping[str, Any], figures: Mapping[str, Any]) -> bool:
        """Store ``figures`` (JSON-ready) under ``key``; False (and a warning) if the write failed."""
        return self._write(_figures_filename(key), {"format": FIGURES_FORMAT, "key": dict(key),
                                                    "figures": dict(figures)}, "figures cache entry")

    def _write(self, name: str, doc: Mapping[str, Any], what: str) -> bool:
        try:
            if not self.directory.exists():
                self.directory.mkdir(parents=True, mode=0o700)
            write_atomic(self.directory / name, json.dumps(doc), mode=0o600)
        except OSError as e:
            log.warning("could not write the %s in %s (%s); going on without caching it", what, self.directory, e)
            return False
        return True


#: The layout of a figures entry (:meth:`ProfileCache.put_figures`).
FIGURES_FORMAT = 1


def _figures_filename(key: Mapping[str, Any]) -> str:
    return f"figures-{fingerprint(json.dumps(dict(key), sort_keys=True).encode())[:32]}.json"
