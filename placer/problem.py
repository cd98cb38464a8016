"""The placement problem handed to solvers: plain arrays, no TensorFlow.

A :class:`PlacementProblem` is what every solver takes; :func:`evaluate`
computes the pipelined *max-load* objective of Tarnawski et al.
(NeurIPS'20) for any assignment: a device's load is the compute of its ops
plus the transfer time of every tensor it sends to another device (charged
once per tensor) and of every tensor it receives (charged once per receiving
device).

Examples
--------
>>> import numpy as np
>>> from cost_models import TensorEdge
>>> p = PlacementProblem.build(
...     names=["a", "b"], compute_s=np.array([[1.0, 1.0], [1.0, 1.0]]),
...     memory_bytes=np.zeros(2), capacity_bytes=np.full(2, np.inf),
...     tensors=[TensorEdge(0, (1,), 1e3)], bandwidth=np.full((2, 2), 1e6),
...     latency=np.zeros((2, 2)))
>>> evaluate(p, np.array([0, 0])).objective
2.0
>>> evaluate(p, np.array([0, 1])).objective   # 1 s compute + 1 ms send / receive
1.001
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from cost_models import TensorEdge

from .errors import CostError, GraphError


def _frozen(a: np.ndarray) -> np.ndarray:
    a = np.array(a, dtype=float)
    a.setflags(write=False)
    return a


@dataclass(frozen=True)
class PlacementProblem:
    """Nodes × devices costs, memory and tensors of one placement problem.

    Attributes
    ----------
    names : tuple of str
        Node names (coarse groups or ops).
    compute_s : numpy.ndarray
        ``(n, k)`` seconds of node ``v`` on device ``d``; ``inf`` = not allowed.
    memory_bytes : numpy.ndarray
        ``(n,)`` resident bytes of each node.
    capacity_bytes : numpy.ndarray
        ``(k,)`` device capacities (``inf`` = unlimited).
    tensors : tuple of TensorEdge
        Data moving between nodes.
    bandwidth, latency : numpy.ndarray
        ``(k, k)`` link bandwidth (bytes/s) and latency (s).
    order : tuple of int
        A topological order of the nodes (for contiguous splits).
    symmetric : bool
        Devices are interchangeable (same costs, capacity and links).
    """

    names: tuple[str, ...]
    compute_s: np.ndarray
    memory_bytes: np.ndarray
    capacity_bytes: np.ndarray
    tensors: tuple[TensorEdge, ...]
    bandwidth: np.ndarray
    latency: np.ndarray
    order: tuple[int, ...]
    symmetric: bool

    @property
    def n(self) -> int:
        """Number of nodes."""
        return len(self.names)

    @property
    def k(self) -> int:
        """Number of devices."""
        return self.compute_s.shape[1]

    @classmethod
    def build(
        cls,
        names: Sequence[str],
        compute_s: np.ndarray,
        memory_bytes: np.ndarray,
        capacity_bytes: np.ndarray,
        tensors: Sequence[TensorEdge],
        bandwidth: np.ndarray,
        latency: np.ndarray,
        order: Sequence[int] | None = None,
    ) -> "PlacementProblem":
        """Validate the arrays and build a frozen problem.

        Raises
        ------
        CostError
            On NaN or negative costs, memory or bandwidth.
        GraphError
            On shapes that disagree or tensor endpoints out of range.
        """
        c = np.asarray(compute_s, dtype=float)
        n = len(names)
        if c.ndim != 2 or c.shape[0] != n or c.shape[1] < 1:
            raise GraphError(f"compute_s must have shape (n={n}, k>=1), got {c.shape}")
        k = c.shape[1]
        bad = np.argwhere(np.isnan(c) | (c < 0))
        if bad.size:
            v, d = bad[0]
            raise CostError(f"node {names[v]!r} has invalid compute cost {c[v, d]!r} on device {d}")
        unplaceable = np.flatnonzero(~np.isfinite(c).any(axis=1))
        if unplaceable.size:
            raise GraphError(f"node {names[unplaceable[0]]!r} is allowed on no device (infinite cost everywhere)")
        mem = np.asarray(memory_bytes, dtype=float)
        if mem.shape != (n,) or not np.isfinite(mem).all() or (mem < 0).any():
            raise CostError("memory_bytes must be finite, non-negative, one per node")
        cap = np.asarray(capacity_bytes, dtype=float)
        if cap.shape != (k,) or np.isnan(cap).any() or (cap <= 0).any():
            raise CostError("capacity_bytes must be positive (inf for unlimited), one per device")
        bw = np.asarray(bandwidth, dtype=float)
        lat = np.asarray(latency, dtype=float)
        if bw.shape != (k, k) or lat.shape != (k, k):
            raise GraphError(f"bandwidth and latency must be ({k}, {k})")
        off = ~np.eye(k, dtype=bool)
        if (bw[off] <= 0).any() or np.isnan(bw).any() or (lat < 0).any() or np.isnan(lat).any():
            raise CostError("link bandwidths must be positive and latencies non-negative")
        for t in tensors:
            if not (0 <= t.src < n) or any(not (0 <= v < n) for v in t.dsts):
                raise GraphError(f"tensor {t} names a node outside 0..{n - 1}")
            if not np.isfinite(t.nbytes) or t.nbytes < 0:
                raise CostError(f"tensor from node {names[t.src]!r} has invalid size {t.nbytes!r}")
        order_t = tuple(range(n)) if order is None else tuple(int(i) for i in order)
        if sorted(order_t) != list(range(n)):
            raise GraphError("order must be a permutation of the nodes")
        symmetric = bool(
            np.allclose(c, c[:, :1]) and np.allclose(cap, cap[0])
            and (k < 2 or (np.allclose(bw[off], bw[off][0]) and np.allclose(lat[off], lat[off][0])))
        )
        return cls(tuple(names), _frozen(c), _frozen(mem), _frozen(cap), tuple(tensors),
                   _frozen(bw), _frozen(lat), order_t, symmetric)

    def transfer_s(self, t: TensorEdge, i: int, j: int) -> float:
        """Seconds to move tensor edge ``t`` from device ``i`` to ``j``."""
        if i == j or t.nbytes <= 0:
            return 0.0
        return t.count * self.latency[i, j] + t.nbytes / self.bandwidth[i, j]


@dataclass(frozen=True)
class Evaluation:
    """Objective and per-device breakdown of one assignment."""

    objective: float
    compute_s: np.ndarray
    comm_s: np.ndarray
    memory_bytes: np.ndarray
    traffic_bytes: np.ndarray
    feasible: bool

    @property
    def load_s(self) -> np.ndarray:
        """Compute plus communication seconds per device."""
        return self.compute_s + self.comm_s


def evaluate(problem: PlacementProblem, assignment: np.ndarray) -> Evaluation:
    """Max-load objective of ``assignment`` (device index per node).

    ``feasible`` is False where a node sits on a device it may not use or a
    device's memory is over capacity; ``objective`` is then ``inf``.
    """
    a = np.asarray(assignment, dtype=int)
    p = problem
    if a.shape != (p.n,) or (a < 0).any() or (a >= p.k).any():
        raise GraphError(f"assignment must give a device index in 0..{p.k - 1} for each of {p.n} nodes")
    per_node = p.compute_s[np.arange(p.n), a]
    comp = np.bincount(a, weights=np.where(np.isfinite(per_node), per_node, 0.0), minlength=p.k)
    mem = np.bincount(a, weights=p.memory_bytes, minlength=p.k)
    comm = np.zeros(p.k)
    traffic = np.zeros((p.k, p.k))
    for t in p.tensors:
        s = a[t.src]
        recv = {int(a[v]) for v in t.dsts} - {int(s)}
        if not recv:
            continue
        comm[s] += max(p.transfer_s(t, s, r) for r in recv)
        for r in recv:
            comm[r] += p.transfer_s(t, s, r)
            traffic[s, r] += t.nbytes
    feasible = bool(np.isfinite(per_node).all() and (mem <= p.capacity_bytes * (1 + 1e-9)).all())
    obj = float((comp + comm).max()) if feasible else float("inf")
    return Evaluation(obj, comp, comm, mem, traffic, feasible)


def trivial_lower_bound(problem: PlacementProblem) -> float:
    """max(largest single node, total work / devices), communication free."""
    best = problem.compute_s.min(axis=1)
    if best.size == 0:
        return 0.0
    return float(max(best.max(), best.sum() / problem.k))
