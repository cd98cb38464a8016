"""Coarsening: merge ops into groups the solver places as one (no TensorFlow).

Groups are the connected components of "same group key" ∪ "same
colocation key", so a variable, its reads and its layer always move
together. The group key comes from a registry of groupings chosen by name
(``"layer"`` by default: the Keras layer scope; ``"op"``: no merging beyond
colocation).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import networkx as nx
import numpy as np

from cost_models import TensorEdge

from .errors import GraphError
from .opgraph import (
    ALLOWED_KINDS,
    COLOCATION,
    COMPUTE_US,
    LAYER,
    MEMORY_BYTES,
    TOPO,
    OpGraph,
)
from .problem import group_tensors

GROUPINGS: dict[str, Callable[[str, Mapping], str]] = {
    "layer": lambda name, attrs: attrs[LAYER],
    "op": lambda name, attrs: name,
}


@dataclass(frozen=True)
class Coarsening:
    """Groups of ops with summed costs and the tensors between groups."""

    groups: tuple[tuple[str, ...], ...]
    group_of: Mapping[str, int]
    names: tuple[str, ...]
    compute_us: Mapping[str, np.ndarray]
    memory_bytes: np.ndarray
    allowed_kinds: tuple[frozenset[str] | None, ...]
    tensors: tuple[TensorEdge, ...]
    order: tuple[int, ...]


def coarsen(op_graph: OpGraph, group_by: str = "layer") -> Coarsening:
    """Merge ops by ``group_by`` and colocation.

    Raises
    ------
    GraphError
        Unknown grouping, or a group whose ops share no device kind.
    """
    if group_by not in GROUPINGS:
        raise GraphError(f"unknown group_by {group_by!r}; choose one of {sorted(GROUPINGS)}")
    key = GROUPINGS[group_by]
    g = op_graph.graph
    uf = nx.utils.UnionFind()
    first_by_key: dict[str, str] = {}
    first_by_coloc: dict[str, str] = {}
    for name, attrs in g.nodes(data=True):
        uf[name]
        k = key(name, attrs)
        uf.union(first_by_key.setdefault(k, name), name)
        c = attrs[COLOCATION]
        if c is not None:
            uf.union(first_by_coloc.setdefault(c, name), name)
    sets = [sorted(s, key=lambda n: g.nodes[n][TOPO]) for s in uf.to_sets()]
    sets.sort(key=lambda s: g.nodes[s[0]][TOPO])
    group_of = {name: i for i, s in enumerate(sets) for name in s}
    names = []
    for s in sets:
        layers = {g.nodes[n][LAYER] for n in s}
        names.append(next(iter(layers)) if len(layers) == 1 else f"{g.nodes[s[0]][LAYER]}+{len(layers) - 1}")
    compute = {kind: np.array([sum(g.nodes[n][COMPUTE_US][kind] for n in s) for s in sets]) for kind in op_graph.kinds}
    memory = np.array([sum(g.nodes[n][MEMORY_BYTES] for n in s) for s in sets], dtype=float)
    allowed: list[frozenset[str] | None] = []
    for s in sets:
        kinds: frozenset[str] | None = None
        for n in s:
            a = g.nodes[n][ALLOWED_KINDS]
            if a is not None:
                kinds = a if kinds is None else kinds & a
        if kinds is not None and not kinds:
            raise GraphError(f"ops {s[:5]} must share a device but have no device kind in common")
        allowed.append(kinds)
    index = {name: i for i, name in enumerate(g.nodes)}
    fine = [TensorEdge(index[t.src], tuple(index[d] for d in t.dsts), float(t.nbytes)) for t in op_graph.tensors]
    tensors = tuple(group_tensors(fine, [group_of[name] for name in g.nodes]))
    return Coarsening(tuple(tuple(s) for s in sets), group_of, tuple(names), compute, memory,
                      tuple(allowed), tensors, tuple(range(len(sets))))
