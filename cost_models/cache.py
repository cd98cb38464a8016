"""On-disk cache of measured per-op times (no TensorFlow).

An entry is keyed by the graph's fingerprint, the device kind, the batch
size and the TensorFlow version; the key is stored inside the entry too, so
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
from typing import Mapping

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

    def filename(self) -> str:
        digest = fingerprint(json.dumps(asdict(self), sort_keys=True).encode())[:32]
        return f"profile-{self.device_kind}-{digest}.json"


@dataclass(frozen=True)
class CachedProfile:
    median_us: Mapping[str, float]
    spread_us: Mapping[str, float]


class ProfileCache:
    """A directory of JSON entries, one per :class:`CacheKey`."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)

    def get(self, key: CacheKey) -> CachedProfile | None:
        """The entry for ``key``, or None (missing, corrupt, stale or foreign entries: warned and ignored)."""
        path = self.directory / key.filename()
        if not path.exists():
            return None
        try:
            doc = json.loads(path.read_text())
            stored = CacheKey(**doc["key"])
            fmt = doc["format"]
            median = {str(k): float(v) for k, v in doc["median_us"].items()}
            spread = {str(k): float(v) for k, v in doc["spread_us"].items()}
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("ignoring unreadable profile cache entry %s (%s); re-profiling", path, e)
            return None
        if fmt != CACHE_FORMAT or stored != key:
            log.warning("ignoring profile cache entry %s: it was written for %s (format %s), not %s; re-profiling",
                        path, stored, fmt, key)
            return None
        if any(not math.isfinite(v) or v < 0 for v in median.values()):
            log.warning("ignoring profile cache entry %s: it holds negative or non-finite times", path)
            return None
        return CachedProfile(median, spread)

    def put(self, key: CacheKey, median_us: Mapping[str, float], spread_us: Mapping[str, float]) -> None:
        """Write the entry atomically (a temporary file renamed into place)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / key.filename()
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({"format": CACHE_FORMAT, "key": asdict(key), "median_us": dict(median_us),
                                   "spread_us": dict(spread_us)}))
        os.replace(tmp, path)
