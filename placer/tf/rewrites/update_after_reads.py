"""Rewrite: a training step's in-place variable writes wait for the readers of that variable.

A resource variable written while a read of it is still live is copied
first: a placed training step whose SGD update ran before the layer's
input-gradient matmul (which reads the kernel) held a copy of the weight, up
to 2x the simulated step memory on a worker
(``benchmarks/results/pipeline_orders.md``). Waiting for the readers keeps
the update in place, as the simulator models it; the values are the same
(the reads saw the old value either way). Applies to training steps.
Record: the control edges added.
"""

from __future__ import annotations

import networkx as nx
import tensorflow as tf

from ..graphdef import VARIABLE_WRITES, dependency_graph, source
from .base import Rewrite, RewriteContext, RewriteRecord


def update_after_reads(gd: tf.compat.v1.GraphDef) -> int:
    """Make each in-place write of a variable (:data:`~placer.tf.graphdef.VARIABLE_WRITES`) wait for every
    consumer of the reads of that variable that does not depend on the write (in place; returns the control
    edges added, some of them redundant: a consumer the write depends on anyway).

    Examples
    --------
    >>> gd = tf.compat.v1.GraphDef()
    >>> for name, op, inputs in [("v", "Placeholder", []), ("read", "ReadVariableOp", ["v"]),
    ...                          ("use", "MatMul", ["read", "read"]), ("g", "Const", []),
    ...                          ("update", "AssignSubVariableOp", ["v", "g"])]:
    ...     _ = gd.node.add(name=name, op=op, input=inputs)
    >>> update_after_reads(gd), list(gd.node[-1].input)
    (1, ['v', 'g', '^use'])
    """
    reads: dict[str, list[str]] = {}
    consumers: dict[str, list[str]] = {}
    for n in gd.node:
        if n.op == "ReadVariableOp" and n.input:
            reads.setdefault(source(n.input[0])[0], []).append(n.name)
        for x in n.input:
            src, suffix = source(x)
            if suffix != "^":
                consumers.setdefault(src, []).append(n.name)
    writes = [n for n in gd.node if n.op in VARIABLE_WRITES and n.input and source(n.input[0])[0] in reads]
    if not writes:
        return 0
    g = dependency_graph(gd)
    added = 0
    for w in writes:
        # a write has few descendants (a step ends with its updates): only those would close a cycle. A
        # reader that precedes the write already gets a redundant edge (cheaper than finding its ancestors)
        after = nx.descendants(g, w.name) | {w.name}
        inputs = {source(x)[0] for x in w.input}
        readers = {c for r in reads[source(w.input[0])[0]] for c in consumers.get(r, ())}
        for r in sorted(readers - after - inputs):
            w.input.append(f"^{r}")
            g.add_edge(r, w.name)
            added += 1
    return added


def order_updates(gd: tf.compat.v1.GraphDef, context: RewriteContext) -> RewriteRecord:
    """:func:`update_after_reads` on a training step."""
    added = update_after_reads(gd)
    return RewriteRecord("update-after-reads", changes=added, summary="variable updates ordered after the last "
                         f"reads of their variable: {added} control edges")


REWRITE = Rewrite("update-after-reads", order_updates, applies=lambda context: context.step == "train")
