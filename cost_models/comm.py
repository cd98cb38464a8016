"""Communication cost model: latency + bytes / bandwidth per ordered link."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Link:
    """Latency + bytes / bandwidth model of one ordered device pair.

    Examples
    --------
    >>> Link(1e9, 1e-3).seconds(1e6)
    0.002
    >>> Link(1e9, 1e-3).seconds(0)
    0.0
    """

    bandwidth_bytes_per_s: float
    latency_s: float

    def seconds(self, nbytes: float) -> float:
        """Transfer time of ``nbytes``; zero bytes cost nothing."""
        return 0.0 if nbytes <= 0 else self.latency_s + nbytes / self.bandwidth_bytes_per_s
