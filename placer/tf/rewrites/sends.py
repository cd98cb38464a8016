"""Rewrite (schedule): a tensor that another process waits for leaves when it is computed (prompt sends).

TensorFlow's executor runs one ready successor of a finished op inline and
queues the others, ``_Send`` included; a worker with one inter-op thread
reaches its queue only when its inline chain ends. Measured on two pinned
one-thread gRPC workers (``benchmarks/send_deferral.py``): a tensor computed
first by a busy worker reached the other after 92-100% of the sender's
remaining work. A pipeline split then overlaps nothing: a chain of 8 dense
layers trained in two stages kept both workers busy at once 0-1% of the
time (``benchmarks/worker_trace.py --workload chain-train``).

:func:`prompt_sends` rewrites the placed ``GraphDef`` (in place) so that the
send is the only thing its producer's device can run next (applies where
``context.sends`` is given: ``sends="prompt"``, by default on one-thread
workers; after any copies and gates; record: the acknowledged transfers,
detail :class:`PromptSends`):

* an **acknowledgement** per awaited transfer: an ``Identity`` of the tensor
  on the receiving device (the tensor crosses once either way: TensorFlow
  sends a tensor once per receiving device), marked
  ``_grappler_do_not_remove`` (Grappler's dependency optimizer would
  otherwise fold a control-only node into a direct, same-device edge);
* every op on the sending device that consumes the producer (data or
  control), and every op there that would compete with the send — a
  *sibling*: it consumes an op the producer depends on, without depending on
  the producer (a layer's weight gradient beside the input gradient the
  previous stage waits for) — waits for the acknowledgement.

The executor then runs the ``_Send`` inline (nothing else is ready), the
receiving device starts as soon as the tensor is there, and the sender
continues after one round trip. A transfer is *awaited* when the work it
unblocks on the receiving device (its consumers there and their
descendants on that device, measured seconds) reaches ``min_work_s``:
a scalar for a metric does not get a round trip. Siblings are found
through ops that compute (not through placeholders, constants or variable
reads, which many unrelated ops consume). Every added edge leaves the
graph acyclic (a sibling never is an ancestor of the producer).

Examples
--------
``a`` on CPU:0 feeds ``far`` on CPU:1, which waits for it; ``w`` on CPU:0 (an
input gradient's sibling) and ``next`` (a local consumer) would otherwise
run before the send:

>>> gd = tf.compat.v1.GraphDef()
>>> d0, d1 = "/job:worker/task:0/device:CPU:0", "/job:worker/task:1/device:CPU:0"
>>> for name, inputs, device in [("x", [], d0), ("dy", ["x"], d0), ("a", ["dy"], d0), ("w", ["dy"], d0),
...                              ("next", ["a"], d0), ("far", ["a"], d1)]:
...     n = gd.node.add(name=name, op="Placeholder" if name == "x" else "Relu", input=inputs, device=device)
>>> rule = SendRule(seconds=lambda name: 1.0 if name == "far" else 0.0)
>>> result = prompt_sends(gd, lambda name, port: tf.float32, rule)
>>> result.acknowledged, result.control_edges
(1, 2)
>>> sorted(n.name for n in gd.node if "^autoplace_ack/a/0" in n.input)
['next', 'w']
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import AbstractSet, Any, Callable, Mapping

import networkx as nx
import tensorflow as tf

from ...core.attrs import COMPUTE_US
from ...core.devices import device_kind
from ...core.plan import Plan
from ...core.splits import split_origin
from ..graphdef import ACK_SCOPE, copied, copy_of, dependency_graph, source
from .base import Rewrite, RewriteContext, RewriteRecord, SendRule

log = logging.getLogger(__name__)

#: Values of ``PlacementOptions.sends``.
SENDS = ("auto", "prompt", "executor")
#: Ops that compute nothing a transfer waits for: fed, constant, ordering only, or a variable's read at the
#: step's start. Their transfers are not acknowledged, no siblings are found through them (many unrelated
#: ops consume them), and they do not make a receiver wait for more.
STRUCTURAL = frozenset({"Placeholder", "Const", "VarHandleOp", "NoOp", "ReadVariableOp"})
#: Op types whose output is there from the step's start, whatever waits before them: a variable's value, a
#: constant. Ops computed from these alone (:func:`parameter_nodes`) do not wait for a transfer either.
PARAMETER_OPS = frozenset({"Const", "VarHandleOp", "ReadVariableOp"})
#: At most this many transfers (the earliest) are considered for an acknowledgement: each costs a pass over
#: the graph.
MAX_CANDIDATES = 256


@dataclass(frozen=True)
class PromptSends:
    """What :func:`prompt_sends` added: the acknowledged transfers (tensor, receiving device), the ops that
    wait for each acknowledgement (aligned with ``transfers``) and how many control edges that makes."""

    transfers: tuple[tuple[str, str], ...] = ()
    control_edges: int = 0
    waiting: tuple[tuple[str, ...], ...] = ()

    @property
    def acknowledged(self) -> int:
        """How many transfers were acknowledged."""
        return len(self.transfers)


def prompt_sends(gd: tf.compat.v1.GraphDef, dtype_of: Callable[[str, int], Any], rule: SendRule) -> PromptSends:
    """Acknowledge each awaited cross-process transfer in the placed ``gd`` (in place; module docstring).

    A transfer is awaited when :class:`SendRule` allows it, it unblocks at least ``rule.min_work_s`` on the
    receiving device, and one of its consumers there needs nothing more from the sending device than what the
    producer depends on (a micro-batch's labels, sent early, wait for its activations anyway).

    Parameters
    ----------
    gd : GraphDef
        The placed graph (a device on every node), after any gates.
    dtype_of : callable
        ``(node, output index)`` → the output's ``tf.DType``, or ``None`` where unknown (that transfer is
        left as it is).
    rule : SendRule
        Which transfers qualify.
    """
    nodes = {n.name: n for n in gd.node}
    local_consumers: dict[str, list[Any]] = {}
    receivers: dict[tuple[str, str], list[str]] = {}  # (producer:port, device) -> consumers there
    for n in gd.node:
        for x in n.input:
            src, suffix = source(x)
            p = nodes.get(src)
            if p is None:
                continue
            if p.device == n.device:
                local_consumers.setdefault(src, []).append(n)
            elif suffix != "^" and p.op not in STRUCTURAL and p.device and n.device \
                    and rule.crosses(p.device, n.device) and rule.eligible(src):
                receivers.setdefault((src + suffix, n.device), []).append(n.name)
    candidates = [(tensor, device) for (tensor, device), names in receivers.items()
                  if _unblocked_s(names, device, nodes, local_consumers, rule.seconds, rule.min_work_s)
                  >= rule.min_work_s]
    if not candidates:
        return PromptSends()
    g = dependency_graph(gd)
    order = list(nx.topological_sort(g))
    rank = {v: i for i, v in enumerate(order)}
    parameters = parameter_nodes(gd, order)
    candidates.sort(key=lambda td: (rank[source(td[0])[0]], td))
    if len(candidates) > MAX_CANDIDATES:
        log.info("%d cross-process transfers could be acknowledged; the first %d are considered", len(candidates),
                 MAX_CANDIDATES)
    added: set[str] = set()  # the acknowledgements so far (an acknowledgement computes nothing)
    transfers: list[tuple[str, str]] = []
    waiting: list[tuple[str, ...]] = []
    edges = 0
    for tensor, device in candidates[:MAX_CANDIDATES]:
        src, suffix = source(tensor)
        dtype = dtype_of(src, int(suffix[1:] or 0))
        if dtype is None:
            continue
        here = nodes[src].device
        before = nx.ancestors(g, src)
        if _unblocked_s(receivers[tensor, device], device, nodes, local_consumers, rule.seconds, rule.min_work_s,
                        ready=before | added | {src}, always=parameters) < rule.min_work_s:
            continue  # its consumers wait for more (a micro-batch's labels wait for its activations)
        ack = gd.node.add(name=f"{ACK_SCOPE}/{src}/{len(added)}", op="Identity", input=[tensor], device=device)
        ack.attr["T"].type = tf.as_dtype(dtype).as_datatype_enum
        ack.attr["_grappler_do_not_remove"].b = True
        nodes[ack.name] = ack
        g.add_edge(src, ack.name)
        added.add(ack.name)
        transfers.append((tensor, device))
        siblings = {w.name for u in before | {src} if nodes[u].device == here and nodes[u].op not in
                    STRUCTURAL for w in local_consumers.get(u, ())}
        siblings -= before | nx.descendants(g, src) | {src}  # a descendant waits for a local consumer of src
        waits = tuple(sorted(siblings | {n.name for n in local_consumers.get(src, ())}))
        for w in waits:
            nodes[w].input.append(f"^{ack.name}")
            g.add_edge(ack.name, w)
        waiting.append(waits)
        edges += len(waits)
    return PromptSends(tuple(transfers), edges, tuple(waiting))


def parameter_nodes(gd: tf.compat.v1.GraphDef, order: list[str] | None = None) -> set[str]:
    """Nodes of ``gd`` whose outputs need nothing computed in the step: :data:`PARAMETER_OPS` and nodes whose
    every data input is such a node (a batch normalisation's scale, ``Rsqrt`` of its variance plus epsilon).
    ``order``: the nodes in a topological order (default: computed here).

    A transfer's receiver can run them before the tensor arrives, so they do not hold back the work the tensor
    lets start. Counted as waiting, they hid every stage boundary of a ResNet50 pipeline (each next stage
    begins with batch normalisations): none of its transfers was acknowledged (2026-12-05).

    Examples
    --------
    >>> gd = tf.compat.v1.GraphDef()
    >>> for name, op, inputs in [("var", "ReadVariableOp", ["h"]), ("eps", "Const", []), ("x", "Placeholder", []),
    ...                          ("add", "AddV2", ["var", "eps"]), ("scale", "Rsqrt", ["add", "^x"]),
    ...                          ("y", "Mul", ["x", "scale"])]:
    ...     _ = gd.node.add(name=name, op=op, input=inputs)
    >>> sorted(parameter_nodes(gd))
    ['add', 'eps', 'scale', 'var']
    """
    nodes = {n.name: n for n in gd.node}
    if order is None:
        order = list(nx.topological_sort(dependency_graph(gd)))
    out: set[str] = set()
    for name in order:
        node = nodes.get(name)
        if node is None:
            continue
        data = [source(x)[0] for x in node.input if not x.startswith("^")]
        if node.op in PARAMETER_OPS or (data and all(src in out for src in data)):
            out.add(name)
    return out


def _unblocked_s(names: list[str], device: str, nodes: Mapping[str, Any], local_consumers: Mapping[str, list[Any]],
                 seconds: Callable[[str], float], enough: float, ready: set[str] | None = None,
                 always: AbstractSet[str] = frozenset()) -> float:
    """Seconds of work on ``device`` that depend on the ops ``names`` there through ops on that device, counted
    until ``enough``. Given ``ready`` (what has run when the tensor arrives), only ops whose every data input
    is ready, in ``always`` (ready in any case: :func:`parameter_nodes`), structural or counted: the work the
    tensor lets start."""
    counted: set[str] = set()
    queued, todo, total = set(names), list(names), 0.0
    while todo and total < enough:
        v = todo.pop()
        queued.discard(v)  # an op not ready yet is queued again by its next counted input
        if ready is not None and not all(_available(x, counted, ready, always, nodes) for x in nodes[v].input):
            continue
        counted.add(v)
        total += float(seconds(v))
        for w in local_consumers.get(v, ()):
            if w.device == device and w.name not in counted and w.name not in queued:
                queued.add(w.name)
                todo.append(w.name)
    return total


def _available(x: str, counted: set[str], ready: set[str], always: AbstractSet[str], nodes: Mapping[str, Any]) -> bool:
    """Whether input ``x`` of an op is there: a control input (ordering only), or a tensor ready (in ``ready``
    or ``always``), structural or counted."""
    src, suffix = source(x)
    node = nodes.get(src)
    return (suffix == "^" or node is None or node.op in STRUCTURAL or src in ready or src in always
            or src in counted)


def acknowledged_nodes(built: Any, sends: PromptSends | None) -> tuple[tuple[int, int, tuple[int, ...]], ...]:
    """The acknowledged transfers of an emitted step (:class:`PromptSends`) as the simulator
    takes them (``cost_models.SimOptions.acknowledged``): fine node of the producer, device index, fine nodes
    that wait. Transfers from ops the plan does not name (rewrites, replicas) are left out.

    >>> from types import SimpleNamespace
    >>> built = SimpleNamespace(nodes=("a", "b", "c"), devices=SimpleNamespace(names=("/d:0", "/d:1")))
    >>> acknowledged_nodes(built, PromptSends(transfers=(("a:0", "/d:1"), ("x", "/d:1")), waiting=(("b",), ("c",))))
    ((0, 1, (1,)),)
    """
    if sends is None:
        return ()
    index = {name: i for i, name in enumerate(built.nodes)}
    column = {name: j for j, name in enumerate(built.devices.names)}
    return tuple((index[src], column[device], tuple(index[w] for w in waits if w in index))
                 for (tensor, device), waits in zip(sends.transfers, sends.waiting)
                 if (src := tensor.rsplit(":", 1)[0]) in index and device in column)


def send_rule(plan: Plan, graph: nx.DiGraph, copies: int = 0) -> SendRule:
    """Which awaited transfers of the plan's functions are acknowledged (:func:`placer.autoplace` and
    :func:`placer.load` both use it).

    A node's seconds are its op's measured time on its planned device in the op graph ``graph`` (a copy, ``mb{i}/…``
    of a micro-batch or ``replica_{i}/…`` of a replica, its share of the batch's: ``copies`` of them); 0 if
    unknown. Transfers of the first micro-batch of each group (or of no copy) are eligible.
    """
    per_group = max(plan.microbatches, 1)

    def seconds(name: str) -> float:
        op, index = copy_of(name)
        node, device = graph.nodes.get(op), plan.assignment.get(op)
        if node is None or device is None:
            return 0.0
        us = node.get(COMPUTE_US) or {}
        s = float(us.get(device_kind(device), max(us.values(), default=0.0))) * 1e-6
        return s / max(copies, plan.microbatches, 1) if index is not None else s

    def eligible(name: str) -> bool:
        index = copy_of(name)[1]
        return index is None or index % per_group == 0

    return SendRule(seconds=seconds, eligible=eligible)


def acknowledge_sends(gd: tf.compat.v1.GraphDef, context: RewriteContext) -> RewriteRecord:
    """:func:`prompt_sends` with the context's rule, dtypes from ``context.graph`` (a pipelined copy
    ``mb{i}/<op>`` has its op's; a node another rewrite added, a codec's, is left as it is)."""
    graph = context.graph

    def dtype_of(name: str, k: int) -> Any:
        name = split_origin(copied(name)[0])  # a split op's part has the op's dtype
        try:
            return graph.get_operation_by_name(name).outputs[k].dtype
        except (KeyError, IndexError, ValueError):
            return None  # a node the rewrites added (codecs): its transfer is left as it is

    if context.sends is None:  # sends left to TensorFlow's executor
        return RewriteRecord("sends")
    result = prompt_sends(gd, dtype_of, context.sends)
    return RewriteRecord("sends", changes=result.control_edges, detail=result,
                         summary=f"sends made prompt: {result.acknowledged} transfers acknowledged, "
                         f"{result.control_edges} ops wait for them")


REWRITE = Rewrite("sends", acknowledge_sends, applies=lambda context: context.sends is not None, schedule=True)
