"""Rewrite: every node gets its planned device (``context.devices``, the plan completed for this trace).

A split's helper nodes (:func:`placer.core.splits.helper_owner`: a lookup part's local ids and mask, not in the
op graph) run on their part's device.

Record: how many nodes were placed.
"""

from __future__ import annotations

import tensorflow as tf

from ...core.splits import helper_owner
from ...errors import GraphError
from .base import Rewrite, RewriteContext, RewriteRecord


def assign_devices(gd: tf.compat.v1.GraphDef, context: RewriteContext) -> RewriteRecord:
    """Set each node's device to ``context.devices[node]`` (in place).

    Raises
    ------
    GraphError
        A node without a device in the context.

    Examples
    --------
    >>> gd = tf.compat.v1.GraphDef()
    >>> _ = gd.node.add(name="x", op="Placeholder")
    >>> assign_devices(gd, RewriteContext(graph=tf.Graph(), step="predict", devices={"x": "/CPU:1"})).changes
    1
    >>> gd.node[0].device
    '/CPU:1'
    """
    devices = dict(context.devices)
    for n in gd.node:
        owner = helper_owner(n.name) if n.name not in devices else None
        if owner in devices:
            devices[n.name] = devices[owner]
    missing = [n.name for n in gd.node if n.name not in devices]
    if missing:
        raise GraphError(f"{len(missing)} nodes have no planned device, e.g. {missing[:5]}")
    for node in gd.node:
        node.device = devices[node.name]
    return RewriteRecord("devices", changes=len(gd.node))


REWRITE = Rewrite("devices", assign_devices)
