"""Rewrite: a replicated training step's micro-batches run in order on each device (``NoOp`` gates).

A training step traced in replicas (:func:`placer.tf.replicas.replicated_train_step`:
``replica_r/…`` forward, ``gradient_tape/replica_r/…`` backward) whose
replicas are micro-batches of one group of devices: each device runs its
forward and backward units in the pipeline's order (:func:`add_gates`,
``context.pipeline``), and each running gradient sum is held at the next
gate (:func:`hold_gradient_sums`). Applies when ``context.replica_groups``
is given. Record: the gates and the held sums.

:func:`add_gates` also orders a pipelined forward pass's copies
(:mod:`placer.tf.rewrites.copies`).
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

import networkx as nx
import tensorflow as tf

from ...core.microbatch import device_chains
from ...errors import GraphError
from ..graphdef import (GRADIENT_SCOPE, GRADIENT_SUM_SCOPE, REPLICA_SCOPE, constant_nodes, dependency_graph,
                        gate_name, scope_index, source)
from .base import Rewrite, RewriteContext, RewriteRecord


def add_gates(gd: tf.compat.v1.GraphDef, key_of: Mapping[str, tuple[int, str]], fed: Iterable[str] = (), *,
              order: str = "gpipe", stages: Sequence[str] = (), aliases: Mapping[str, str] | None = None) -> int:
    """Order each device's micro-batches in ``gd`` (in place).

    ``key_of`` gives the nodes that belong to a micro-batch their
    ``(micro-batch, phase)``: a *unit* per device (nodes computed from
    constants alone, :func:`~placer.tf.graphdef.constant_nodes`, belong to none). Each device runs its units
    in the chains of :func:`placer.core.microbatch.device_chains` (the rule the
    simulator follows): the next unit's first nodes there (no input from a
    node of the same unit; inputs from ``fed`` nodes do not count) wait for a
    ``NoOp`` that waits for the unit's last nodes there (no consumer among
    them). ``order="gpipe"``: the forward units in micro-batch order and,
    apart, the backward ones, without a forward waiting for a backward;
    ``"1f1b"``: one chain alternating after a warm-up that depends on the
    device's position in ``stages`` (device names in pipeline order; a device
    not named comes last; ``aliases`` maps a device to the pipeline stage it runs
    when it is not named itself: another data-parallel replica's device).
    Returns the number of gates.

    TensorFlow's executor alone does not fill a pipeline reliably (a worker
    ran several micro-batches of its first stage before sending anything,
    and the same graph ranged 2.4–3.5 s across processes,
    ``../shared/notes/tf-facts.md``): a device thus finishes micro-batch
    ``i`` before it starts ``i + 1``, and can start ``i + 1`` as soon as it has.

    Raises
    ------
    GraphError
        A keyed node without a device, or gates that would wait in a cycle (TensorFlow would hang).
    """
    fed_set = set(fed)
    by_name = {n.name: n for n in gd.node}
    constant = constant_nodes(gd)
    group: dict[str, tuple[int, str, str]] = {}
    for name, (i, phase) in key_of.items():
        node = by_name.get(name)
        if node is None or name in fed_set:  # a fed node is replaced by what feeds it: never run, never waited on
            continue
        if name in constant:  # computed from constants alone: nothing to order, and gating it would chain devices
            continue
        if not node.device:
            raise GraphError(f"node {name} has no device; place every node before gating micro-batches")
        group[name] = (i, phase, node.device)
    starts_here: dict[tuple[int, str, str], list[str]] = {}
    fed_inside: set[str] = set()
    for name, g in group.items():
        local = False
        for inp in by_name[name].input:
            src, _ = source(inp)
            if src not in fed_set and group.get(src) == g:
                local = True
                fed_inside.add(src)
        if not local:
            starts_here.setdefault(g, []).append(name)
    ends_here: dict[tuple[int, str, str], list[str]] = {}
    for name, g in group.items():
        if name not in fed_inside:
            ends_here.setdefault(g, []).append(name)
    m = 1 + max((i for i, _, _ in ends_here), default=-1)
    stages = list(stages)
    gates = 0
    for device in sorted({d for _, _, d in ends_here}):
        stage = (aliases or {}).get(device, device)
        position = stages.index(stage) if stage in stages else len(stages)
        for chain in device_chains(order, m, position, len(stages)):
            units = [(i, ph) for i, ph in chain if (i, ph, device) in ends_here]
            for (i, phase), (j, phase2) in zip(units, units[1:]):
                nxt = starts_here.get((j, phase2, device))
                if not nxt:
                    continue
                gate = gd.node.add()
                gate.name = gate_name(phase, i, device)
                gate.op = "NoOp"
                gate.device = device
                gate.input.extend(f"^{x}" for x in sorted(ends_here[(i, phase, device)]))
                for x in nxt:
                    by_name[x].input.append(f"^{gate.name}")
                gates += 1
    if order != "gpipe":
        _check_acyclic(gd, order)
    return gates


def _check_acyclic(gd: tf.compat.v1.GraphDef, order: str) -> None:
    """Raise ``GraphError`` where ``gd``'s nodes (gates included) wait on each other in a cycle."""
    g = dependency_graph(gd)
    if not nx.is_directed_acyclic_graph(g):
        cycle = [u for u, _ in nx.find_cycle(g)]
        shown = " -> ".join(cycle[:3] + ["…"] + cycle[-3:]) if len(cycle) > 6 else " -> ".join(cycle)
        raise GraphError(f"the {order} order's gates wait on each other in a cycle on this placement ({shown}); "
                         "use pipeline='gpipe'")


def replica_keys(gd: tf.compat.v1.GraphDef, scope: str, gradient_scope: str, per_group: int = 0
                 ) -> dict[str, tuple[int, str]]:
    """``(micro-batch, phase)`` of the nodes of a replicated training step (``scope_r/…`` forward,
    ``gradient_scope/scope_r/…`` backward); nodes outside the scopes (the sums, the update) get none.
    ``per_group``: replicas ``r`` are micro-batch ``r mod per_group`` of a group of devices (0: ``r``).

    Examples
    --------
    >>> gd = tf.compat.v1.GraphDef()
    >>> for name in ("replica_0/d/MatMul", "gradient_tape/replica_1/d/MatMul", "Adam/Add"):
    ...     _ = gd.node.add(name=name, op="NoOp")
    >>> sorted(replica_keys(gd, "replica", "gradient_tape").items())
    [('gradient_tape/replica_1/d/MatMul', (1, 'backward')), ('replica_0/d/MatMul', (0, 'forward'))]
    """
    out: dict[str, tuple[int, str]] = {}
    for n in gd.node:
        parts = n.name.split("/")
        phase, at = ("backward", 1) if parts[0] == gradient_scope and len(parts) > 2 else ("forward", 0)
        index = scope_index(parts[at], scope)
        if index is not None:
            out[n.name] = (index % per_group if per_group else index, phase)
    return out


def hold_gradient_sums(gd: tf.compat.v1.GraphDef, sum_scope: str, per_group: int = 0) -> tuple[int, int]:
    """Keep Grappler from merging a gated training step's running gradient sums into one ``AddN`` (in place).

    The step sums each variable's gradients as the micro-batches come
    (``sum_scope_r/…``: the running sum after micro-batch ``r``), so at most
    two of them are live, as the simulator assumes. Grappler's arithmetic
    optimizer rewrites such a chain of adds into one ``AddN`` after the last
    micro-batch (``ArithmeticOptimizer/AddOpsRewrite_*``), which keeps every
    micro-batch's gradients live until then. It does not absorb an add that
    drives a control dependency, so each running sum that feeds the next one
    becomes a control input of the gate after micro-batch ``r``'s backward
    pass on its device (:func:`~placer.tf.graphdef.gate_name`): that micro-batch's next unit
    there starts once the sum is done, which the sum's device would
    otherwise do first anyway. Only sums on the device of the gradient they
    add are held (elsewhere the gate would wait for a transfer); returns
    ``(held, running sums)``. ``per_group`` as in :func:`replica_keys` (the
    gates number each group's micro-batches from 0).

    Examples
    --------
    >>> gd = tf.compat.v1.GraphDef()
    >>> for name, inputs in [("gradient_tape/replica_0/g", []), ("gradient_tape/replica_1/g", []),
    ...                      ("gradient_tape/replica_2/g", []),
    ...                      ("sum_1/add", ["gradient_tape/replica_0/g", "gradient_tape/replica_1/g"]),
    ...                      ("sum_2/add", ["sum_1/add", "gradient_tape/replica_2/g"]),
    ...                      (gate_name("backward", 1, "/CPU:0"), [])]:
    ...     _ = gd.node.add(name=name, op="NoOp", input=inputs, device="/CPU:0")
    >>> hold_gradient_sums(gd, "sum")
    (1, 1)
    >>> list(gd.node[-1].input)
    ['^sum_1/add']
    """
    by_name = {n.name: n for n in gd.node}
    running = {n.name: r for n in gd.node if (r := scope_index(n.name.split("/")[0], sum_scope)) is not None}
    feeds_next = {source(x)[0] for n in gd.node if n.name in running for x in n.input
                  if running.get(source(x)[0]) == running[n.name] - 1}
    held = 0
    for name in sorted(feeds_next):
        node, r = by_name[name], running[name]
        added = [by_name[src] for src, suffix in map(source, node.input) if suffix != "^" and src not in running]
        gate = by_name.get(gate_name("backward", r % per_group if per_group else r, node.device))
        if gate is None or any(a.device != node.device for a in added):
            continue
        gate.input.append(f"^{name}")
        held += 1
    return held, len(feeds_next)


def gate_replicas(gd: tf.compat.v1.GraphDef, context: RewriteContext) -> RewriteRecord:
    """The gates of a replicated training step whose replicas are micro-batches, and its held gradient sums."""
    replica_groups = context.replica_groups
    groups = list(dict.fromkeys(tuple(g) for g in replica_groups))
    per_group = len(replica_groups) // len(groups)
    aliases = {d: first for g in groups for d, first in zip(g, groups[0])}  # a device -> its pipeline stage's name
    gates = add_gates(gd, replica_keys(gd, REPLICA_SCOPE, GRADIENT_SCOPE, per_group), order=context.pipeline,
                      stages=context.pipeline_devices, aliases=aliases)
    held, running = hold_gradient_sums(gd, GRADIENT_SUM_SCOPE, per_group)
    return RewriteRecord("gates", changes=gates + held,
                         summary=f"{gates} gates; gradient sums held at the next gate (no AddN rewrite): "
                         f"{held} of {running}")


REWRITE = Rewrite("gates", gate_replicas, applies=lambda context: bool(context.replica_groups), schedule=True)
