"""A benchmark's Markdown output: each line printed as it comes, the whole written to a file at the end."""

from __future__ import annotations

import sys
from pathlib import Path


class MarkdownOut:
    """Call it with a line (``out("| a | b |")``, ``out()`` for a blank one); :meth:`write` saves them all.

    >>> out = MarkdownOut()
    >>> out("## Title")
    ## Title
    >>> out.lines
    ['## Title']
    """

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, line: str = "") -> None:
        print(line, flush=True)
        self.lines.append(line)

    def write(self, path: str | Path) -> Path:
        """Write the lines to ``path`` (its folder made if missing) and say so on stderr."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(self.lines) + "\n")
        print(f"written: {path}", file=sys.stderr)
        return path
