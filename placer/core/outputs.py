"""Every file autoplace writes: checked before the work, written whole or not at all (no TensorFlow).

* :func:`check_output` validates a destination *before* tracing, profiling
  and solving: its folder exists (or can be made) and is writable, a file is
  not going where a folder is (or the reverse), it is not one of the
  command's inputs, and nothing but a regular file (or an empty folder, for a
  SavedModel) is there: a symbolic link, a FIFO, a socket or a device is
  refused, never replaced (an atomic rename would put a regular file in its
  place, or write through the link).
* :func:`write_text` writes to a temporary sibling created with ``O_EXCL``
  (``tempfile.mkstemp``: never through a planted symlink), flushes it to
  disk and renames it into place; on any failure (a full disk, say) the old
  file is intact and the temporary one removed.
* :func:`new_directory` does the same for a directory (a SavedModel): it is
  built in a temporary sibling and renamed into place, or removed.

Failures are :class:`~placer.errors.OutputError` with the path and the reason.

Examples
--------
>>> import os, tempfile
>>> path = os.path.join(tempfile.mkdtemp(), "plan.json")
>>> write_text(path, '{"a": 1}')
>>> open(path).read(), sorted(os.listdir(os.path.dirname(path)))
('{"a": 1}', ['plan.json'])
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from cost_models.files import write_atomic

from ..errors import OutputError

#: The report formats ``placed.report(path)`` writes, by the path's suffix.
REPORT_SUFFIXES = (".json", ".html")


def _nearest_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_output(path: str | os.PathLike, *, directory: bool = False, suffixes: Iterable[str] = (),
                 inputs: Iterable[str | os.PathLike] = ()) -> Path:
    """Validate an output path before any work is done; returns it as an absolute ``Path``.

    Parameters
    ----------
    path
        Where a file (or, with ``directory=True``, a new directory) will be written.
    suffixes
        Allowed file suffixes (e.g. ``(".json",)``); empty: any.
    inputs
        Paths the same command reads; writing over one of them is refused.

    Raises
    ------
    OutputError
        Saying what is wrong with the path and what to pass instead.
    """
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise OutputError(f"an output path must be a non-empty string or path, got {path!r}")
    p = Path(os.path.abspath(os.fspath(path)))
    suffixes = tuple(suffixes)
    if suffixes and p.suffix not in suffixes:
        raise OutputError(f"{os.fspath(path)!r}: the file name must end in {' or '.join(suffixes)}")
    if os.path.islink(p):
        raise OutputError(f"{os.fspath(path)!r} is a symbolic link (to {os.readlink(p)!r}); autoplace writes only "
                          "regular files and new folders: give the real path, or remove the link")
    if p.exists() and not (p.is_file() or p.is_dir()):
        kind = ("a FIFO" if stat.S_ISFIFO(p.stat().st_mode) else "a socket" if stat.S_ISSOCK(p.stat().st_mode)
                else "a device" if stat.S_ISCHR(p.stat().st_mode) or stat.S_ISBLK(p.stat().st_mode)
                else "not a regular file")
        raise OutputError(f"{os.fspath(path)!r} is {kind}; autoplace writes only regular files (replacing it "
                          "would destroy it): give a file path")
    for other in inputs:
        if os.path.realpath(os.fspath(other)) == os.path.realpath(p):
            raise OutputError(f"{os.fspath(path)!r} is also an input of this command; writing it would destroy "
                              "the input: choose another output path")
    if directory:
        if p.exists() and not p.is_dir():
            raise OutputError(f"{os.fspath(path)!r} is a file; a SavedModel is a directory: choose a new path")
        if p.is_dir() and any(p.iterdir()):
            raise OutputError(f"export directory {os.fspath(path)!r} exists and is not empty; choose a new path "
                              "(nothing is ever exported over existing files)")
    elif p.is_dir():
        raise OutputError(f"{os.fspath(path)!r} is a directory; give a file path inside it")
    parent = _nearest_existing(p.parent)
    if not parent.is_dir():
        raise OutputError(f"cannot write {os.fspath(path)!r}: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"cannot write {os.fspath(path)!r}: the folder {parent} is not writable; choose another "
                          "output path")
    return p


def _reason(e: OSError) -> str:
    return e.strerror or str(e)


def write_text(path: str | os.PathLike, text: str, *, mode: int = 0o644) -> None:
    """Write ``text`` to ``path`` atomically (see the module docstring); the file gets ``mode``.

    Raises
    ------
    OutputError
        If the folder cannot be made or the file cannot be written (the old file, if any, is intact).
    """
    p = check_output(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError(f"cannot write {os.fspath(path)!r}: {_reason(e)}") from e
    try:
        write_atomic(p, text, mode=mode)
    except OSError as e:
        raise OutputError(f"cannot write {os.fspath(path)!r}: {_reason(e)}; the previous file (if any) is "
                          "unchanged") from e


@contextlib.contextmanager
def new_directory(path: str | os.PathLike) -> Iterator[str]:
    """Yield a temporary sibling of ``path`` to fill; rename it to ``path`` on success, remove it on failure.

    ``path`` must not exist or be an empty directory (:func:`check_output` with ``directory=True``).

    Raises
    ------
    OutputError
        If the directory cannot be made or renamed; the body's own exception passes through
        (after the temporary directory is removed).
    """
    p = check_output(path, directory=True)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = tempfile.mkdtemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
    except OSError as e:
        raise OutputError(f"cannot create {os.fspath(path)!r}: {_reason(e)}") from e
    try:
        yield tmp
        os.chmod(tmp, 0o755)
        os.rename(tmp, p)  # replaces an empty directory; fails (and cleans up) on a non-empty one
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def json_ready(x: Any) -> Any:
    """``x`` as JSON-ready data: numpy → Python, non-finite floats → ``None``, keys → ``str``.

    >>> import numpy as np
    >>> json_ready({1: np.float32(0.5), "b": [float("inf"), np.int64(3)]})
    {'1': 0.5, 'b': [None, 3]}
    """
    import numpy as np

    if isinstance(x, Mapping):
        return {str(k): json_ready(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_ready(v) for v in x]
    if isinstance(x, np.ndarray):
        return json_ready(x.tolist())
    if isinstance(x, (np.floating, float)):
        return float(x) if math.isfinite(x) else None
    if isinstance(x, np.integer):
        return int(x)
    return x
