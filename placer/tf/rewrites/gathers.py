"""Rewrite: a gather of rows from a whole read of a sparsely updated variable reads the rows alone.

Keras' ``Embedding`` reads its table whole (``ReadVariableOp``) and gathers
rows from the read (``GatherV2``). A training step that updates the table
sparsely (SGD's ``ResourceScatterSub``) puts the variable in TensorFlow's
copy-on-read mode, in which every whole read copies it: each step copied the
whole table (a 100 MB table: 12 ms of a 20 ms step on one worker, and a
second table's worth of memory while the copy lives). ``ResourceGather``
reads the same rows from the variable without the copy. Which gathers qualify
is :func:`placer.tf.graphdef.row_gathers` (the variable is updated by row ops
in the same step, and read by nothing else); each keeps its name, so the plan
places it, and the op graph puts it with its variable. The values are the
same to the bit. The costs stage profiles the trace with this rewrite made
(:func:`placer.tf.costs.compute_costs`), so the prediction sees what runs.
Record: the gathers rewritten.
"""

from __future__ import annotations

from typing import Mapping

import tensorflow as tf

from ..graphdef import row_gathers, source
from .base import Rewrite, RewriteContext, RewriteRecord, remove_nodes


def gather_rows(gd: tf.compat.v1.GraphDef, gathers: Mapping[str, str]) -> list[str]:
    """Turn each node of ``gathers`` (:func:`~placer.tf.graphdef.row_gathers`) that is still a ``GatherV2`` of a
    ``ReadVariableOp`` into a ``ResourceGather`` of that read's variable, and drop the reads nothing reads any
    more (in place). Returns the nodes rewritten.

    Examples
    --------
    >>> g = tf.Graph()
    >>> with g.as_default():
    ...     h = tf.raw_ops.VarHandleOp(dtype=tf.float32, shape=[4, 2], name="table")
    ...     rows = tf.gather(tf.raw_ops.ReadVariableOp(resource=h, dtype=tf.float32, name="read"), [1, 3],
    ...                      name="rows")
    ...     upd = tf.raw_ops.ResourceScatterSub(resource=h, indices=[1], updates=tf.ones((1, 2)), name="upd")
    >>> gd = g.as_graph_def()
    >>> gather_rows(gd, row_gathers(g))
    ['rows']
    >>> node = next(n for n in gd.node if n.name == "rows")
    >>> node.op, list(node.input), any(n.name == "read" for n in gd.node)
    ('ResourceGather', ['table', 'rows/indices'], False)
    """
    nodes = {n.name: n for n in gd.node}
    gathered: dict[str, str] = {}  # gather → the read it gathered from
    for node in gd.node:
        if node.name not in gathers or node.op != "GatherV2":
            continue
        read = nodes.get(source(node.input[0])[0])
        if read is None or read.op != "ReadVariableOp":
            continue
        controls = [i for i in node.input if i.startswith("^")]
        dtype, index = node.attr["Tparams"].type, node.attr["Tindices"].type
        resource, ids = read.input[0], node.input[1]
        node.op = "ResourceGather"
        del node.input[:]
        node.input.extend([resource, ids, *controls])
        for name in ("Tparams", "Taxis", "_class"):
            if name in node.attr:
                del node.attr[name]
        node.attr["dtype"].type = dtype
        node.attr["Tindices"].type = index
        node.attr["batch_dims"].i = 0
        node.attr["validate_indices"].b = True
        gathered[node.name] = read.name
    if gathered:  # the reads no one reads now go: what waited for one waits for its gathers, a colocation with
        # one names its variable
        resources = {source(nodes[name].input[0])[0] for name in gathered}
        referenced = {source(i)[0] for n in gd.node for i in n.input if not i.startswith("^")}
        dropped = {n.name: source(n.input[0])[0] for n in gd.node if n.op == "ReadVariableOp"
                   and n.name not in referenced and n.input and source(n.input[0])[0] in resources}
        remove_nodes(gd, dropped, {r: [g for g, read in gathered.items() if read == r] for r in dropped},
                     colocate=dropped)
    return list(gathered)


def rewrite_gathers(gd: tf.compat.v1.GraphDef, context: RewriteContext) -> RewriteRecord:
    """:func:`gather_rows` of the gathers :func:`~placer.tf.graphdef.row_gathers` finds in ``context.graph``."""
    done = gather_rows(gd, row_gathers(context.graph))
    return RewriteRecord("gathers", changes=len(done), detail=tuple(done),
                         summary=f"{len(done)} row gathers read their sparsely updated variable directly "
                                 "(no copy of the whole table per step)")


REWRITE = Rewrite("gathers", rewrite_gathers, applies=lambda context: context.step == "train")
