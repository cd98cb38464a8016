"""Files written atomically: a temporary sibling, flushed and synced, renamed over the target.

A reader sees the old file or the new one, never a torn one; on a failure the
temporary file is removed and the old file (if any) is left as it was. The
profile cache writes its entries with it, and :mod:`placer.core.outputs` builds
the library's output checks on it.

Examples
--------
>>> import os, tempfile
>>> path = os.path.join(tempfile.mkdtemp(), "entry.json")
>>> write_atomic(path, "{}", mode=0o600)
>>> open(path).read(), oct(os.stat(path).st_mode & 0o777)
('{}', '0o600')
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def write_atomic(path: str | os.PathLike, text: str, *, mode: int = 0o644) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically; the file gets ``mode``.

    Raises
    ------
    OSError
        If the temporary file cannot be made, written or renamed (it is removed; ``path`` is unchanged).
    """
    p = Path(path)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
            os.fchmod(f.fileno(), mode)
        os.replace(tmp, p)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
