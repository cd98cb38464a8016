"""Rewrite: consumers of a pass-through op (``IdentityN``) read its inputs, and the op is dropped.

Keras' optimizer gathers *every* gradient in one ``IdentityN``; kept, it
would pull them all onto one device. The op graph plans as if each consumer
read the input (:data:`placer.tf.graphdef.PASS_THROUGH_OP_TYPES`), and this
rewrite makes the emitted graph do so. Record: the ops bypassed.
"""

from __future__ import annotations

import tensorflow as tf

from ..graphdef import bypassable
from .base import Rewrite, RewriteContext, RewriteRecord


def bypass_pass_through(gd: tf.compat.v1.GraphDef, context: RewriteContext) -> RewriteRecord:
    """Rewire ``gd`` so that consumers of a pass-through op of ``context.graph`` read its inputs; drop the op.

    Examples
    --------
    >>> g = tf.Graph()
    >>> with g.as_default():
    ...     a, b = tf.constant(1.0, name="a"), tf.constant(2.0, name="b")
    ...     pair = tf.identity_n([a, b], name="pair")
    ...     c = tf.add(pair[0], pair[1], name="c")
    >>> gd = g.as_graph_def()
    >>> record = bypass_pass_through(gd, RewriteContext(graph=g, step="predict", devices={}))
    >>> record.changes, [n.name for n in gd.node], list(gd.node[-1].input)
    (1, ['a', 'b', 'c'], ['a', 'b'])
    """
    bypassed = {op.name for op in context.graph.get_operations() if bypassable(op)}
    if not bypassed:
        return RewriteRecord("bypass")
    alias: dict[str, str] = {}  # input reference as written in the GraphDef → what the op forwards there
    for node in gd.node:
        if node.name in bypassed:
            for k, src in enumerate(i for i in node.input if not i.startswith("^")):
                alias[f"{node.name}:{k}"] = src
                if k == 0:
                    alias[node.name] = src
    for node in gd.node:
        for i, inp in enumerate(node.input):
            if inp in alias:
                node.input[i] = alias[inp]
    # Drop the bypassed ops (unless a control edge names them): left in, each would still pull every
    # tensor it forwards onto its own device before TensorFlow prunes it.
    held = {i[1:] for n in gd.node for i in n.input if i.startswith("^")}
    keep = [n for n in gd.node if n.name not in bypassed or n.name in held]
    del gd.node[:]
    gd.node.extend(keep)
    return RewriteRecord("bypass", changes=len(bypassed))


REWRITE = Rewrite("bypass", bypass_pass_through)
