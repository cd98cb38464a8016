"""Rewrite (schedule): each device runs its ops in the plan's order (``Plan.op_order``).

Each op waits for the one before it on its device: a control edge. Applies
when the plan carries an order (``execution_order="auto"`` and an ordering
heuristic won; never with micro-batches or replicas). Record: the control
edges added, ``(before, after)`` (detail), which :func:`placer.tf.export.load`
adds again after re-applying the plan.
"""

from __future__ import annotations

import logging
from typing import Mapping, Sequence

import networkx as nx
import tensorflow as tf

from ..graphdef import dependency_graph
from .base import Rewrite, RewriteContext, RewriteRecord

log = logging.getLogger(__name__)


def add_order(gd: tf.compat.v1.GraphDef, order: Mapping[str, Sequence[str]]) -> list[tuple[str, str]]:
    """Make each op of ``order`` (device → op names in the order they run there) wait for the one before it
    on its device: a control edge in ``gd`` (in place), skipping names ``gd`` lacks (an op of the plan's
    trace that this trace does not have) and placeholders (the inputs and captures the placed function
    feeds through ``input_map``: an edge from one would make it run, unfed); returns the edges added,
    ``(before, after)`` (not those ``gd`` had already).

    This trace may depend otherwise than the one the plan was made on (a batch of unknown size computes
    shapes that were constants), so an edge can close a cycle: the edges inside a strongly connected
    component of the result are taken out again (the graph's own edges are acyclic, so what is left is),
    and the log says how many.

    Examples
    --------
    >>> gd = tf.compat.v1.GraphDef()
    >>> for name, inputs in [("x", []), ("a", ["x"]), ("b", ["x"]), ("c", ["a"])]:
    ...     _ = gd.node.add(name=name, op="Identity" if inputs else "Placeholder", input=inputs)
    >>> edges = add_order(gd, {"/CPU:0": ("a", "c", "gone", "b")})
    >>> edges, list(gd.node[2].input)
    ([('a', 'c'), ('c', 'b')], ['x', '^c'])

    ``c`` depends on ``a`` here, so an order that puts ``c`` first keeps nothing of that pair:

    >>> add_order(gd, {"/CPU:0": ("c", "a"), "/CPU:1": ("b", "x")})
    []
    """
    nodes = {n.name: n for n in gd.node if n.op != "Placeholder"}
    added: list[tuple[str, str]] = []
    for ops in order.values():
        present = [name for name in ops if name in nodes]
        for before, after in zip(present, present[1:]):
            if f"^{before}" not in nodes[after].input:
                added.append((before, after))
    if not added:
        return added
    g = dependency_graph(gd)
    g.add_edges_from(added)
    component = {}
    for i, members in enumerate(nx.strongly_connected_components(g)):
        if len(members) > 1:
            component.update(dict.fromkeys(members, i))
    kept = [(b, a) for b, a in added if b not in component or component[b] != component.get(a)]
    if len(kept) < len(added):
        log.info("planned order: %d of %d control edges left out (this trace's dependencies contradict them)",
                 len(added) - len(kept), len(added))
    for before, after in kept:
        nodes[after].input.append(f"^{before}")
    return kept


def order_ops(gd: tf.compat.v1.GraphDef, context: RewriteContext) -> RewriteRecord:
    """:func:`add_order` with the plan's order; detail: the control edges added."""
    edges = tuple(add_order(gd, context.order))
    return RewriteRecord("order", changes=len(edges), detail=edges,
                         summary=f"planned order of each device's ops: {len(edges)} control edges")


REWRITE = Rewrite("order", order_ops, applies=lambda context: bool(context.order), schedule=True)
