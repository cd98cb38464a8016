"""Stage 2 — the cost-annotated op graph (a ``networkx.DiGraph``).

Node attributes (names are the module constants below):

``op_type``        TensorFlow op type.
``compute_us``     dict device kind → measured µs (median of profiled runs).
``output_bytes``   bytes of all outputs at the planning batch size.
``memory_bytes``   resident bytes (a variable's size on its placeholder).
``colocation``     key shared by ops that must sit on one device, or None.
``allowed_kinds``  device kinds with a registered kernel, or None (any).
``layer``          the Keras layer scope the op was traced in.
``variable``       on a variable's resource placeholder: the variable's path.

Edge attributes: ``bytes`` (tensor bytes moved if the edge is cut),
``tensors`` (names of the tensors behind the edge) and ``tensor_bytes``
(each one's bytes); control edges have ``bytes == 0`` and ``control=True``.

Colocation rules live in a registry (:data:`COLOCATION_RULES`): each rule
maps an op to the tensors/ops it must share a device with. The graph is in
the format of ``docs/graph-format.md``: :mod:`placer.core.build` turns it
into a placement problem exactly as it does a user's graph.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

import networkx as nx
import numpy as np
import tensorflow as tf
from tensorflow.python.framework import kernels

from ..core.attrs import (
    ALLOWED_KINDS,
    BYTES,
    COLOCATION,
    COMPUTE_US,
    CONTROL,
    LAYER,
    MEMORY_BYTES,
    OP_TYPE,
    OUTPUT_BYTES,
    PHASE,
    TENSOR_BYTES,
    TENSORS,
    VARIABLE,
)
from ..errors import GraphError
from .graphdef import (GRADIENT_SCOPE, PASS_THROUGH_OP_TYPES, bypassable, layer_of, row_gathers, tensor_bytes,
                       variable_bytes)
from .trace import TracedModel

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TensorInfo:
    """One tensor: producer op, consumer ops, size, dtype and rank."""

    name: str
    src: str
    dsts: tuple[str, ...]
    nbytes: int
    dtype: str
    rank: int | None


@dataclass(frozen=True)
class OpGraph:
    """The op DAG with costs, its tensors and the variables it reads."""

    graph: nx.DiGraph
    tensors: tuple[TensorInfo, ...]
    variables: Mapping[str, str]
    batch_size: int
    kinds: tuple[str, ...]


# --- colocation registry -----------------------------------------------------
ColocationRule = Callable[[tf.Operation], Iterable[str]]
COLOCATION_RULES: list[ColocationRule] = []


def colocation_rule(fn: ColocationRule) -> ColocationRule:
    """Register a rule returning names of ops ``op`` must share a device with."""
    COLOCATION_RULES.append(fn)
    return fn


@colocation_rule
def _with_resource_producers(op: tf.Operation) -> Iterable[str]:
    # Reads/updates of a resource run where the resource lives (TF moves them
    # there silently otherwise).
    return [t.op.name for t in op.inputs if t.dtype == tf.resource]


@colocation_rule
def _with_class_attr(op: tf.Operation) -> Iterable[str]:
    try:
        classes = op.get_attr("_class")
    except ValueError:
        return []
    return [c.decode()[5:] for c in classes if c.startswith(b"loc:@")]


def _kernel_kinds(op_type: str, unchecked: frozenset[str],
                  cache: dict[str, frozenset[str] | None]) -> frozenset[str] | None:
    """Device kinds ``op_type`` can run on, or None for "any".

    Only kinds this TensorFlow build can run (``tf.config`` physical device
    types) are checked against the kernel registry; kinds in ``unchecked``
    (planned for hardware not present) are assumed to have every kernel.
    """
    if op_type not in cache:
        # An op type with no registered kernel (a function call, an op of a library not linked in)
        # lists none: TensorFlow decides where it runs, so no kind is excluded.
        kinds = {k.device_type for k in kernels.get_registered_kernels_for_op(op_type).kernel}
        if not kinds or "DEFAULT" in kinds:  # DEFAULT kernels run on any device
            cache[op_type] = None
        else:
            cache[op_type] = frozenset(kinds) | unchecked
    return cache[op_type]


def phase_of(op_name: str, optimizer_scope: str | None) -> str:
    """The part of a training step an op belongs to by its name (:data:`placer.core.attrs.PHASES`):
    ``"backward"`` under the tape's scope, ``"update"`` under the optimizer's, else ``"forward"``
    (:func:`build_op_graph` then moves the forward ops the backward pass does not need, the metrics and
    the loss tracker, to ``"update"``).

    The placed training step in micro-batches (:func:`placer.tf.replicas.replicated_train_step`) copies
    the first two per micro-batch and runs the optimizer once.

    Examples
    --------
    >>> [phase_of(n, "adam") for n in ("m/d/MatMul", "gradient_tape/m/d/MatMul", "adam/AssignSubVariableOp")]
    ['forward', 'backward', 'update']
    """
    if op_name.startswith(GRADIENT_SCOPE + "/"):
        return "backward"
    if optimizer_scope and op_name.startswith(optimizer_scope + "/"):
        return "update"
    return "forward"


def optimizer_owners(graph: tf.Graph, scope: str, trainable: Iterable[str]) -> dict[str, str]:
    """Optimizer ops → the trainable variable (placeholder op) whose update they alone compute.

    Walks back from each op under ``scope/`` that takes a trainable
    variable's resource (its update, e.g. ``AssignSubVariableOp``) through
    the ops of the same scope. An op reached from exactly one variable
    belongs to it, and so does a slot variable's placeholder reached that
    way; shared state (the iteration counter, the learning rate) belongs to
    none.
    """
    prefix = scope + "/"
    trainable = set(trainable)
    reached: dict[str, set[str]] = {}
    for op in graph.get_operations():
        if not op.name.startswith(prefix):
            continue
        owners = [t.op.name for t in op.inputs if t.dtype == tf.resource and t.op.name in trainable]
        for var in owners:
            stack, seen = [op], set()
            while stack:
                cur = stack.pop()
                if cur.name in seen:
                    continue
                seen.add(cur.name)
                reached.setdefault(cur.name, set()).add(var)
                for t in cur.inputs:
                    while bypassable(t.op):  # IdentityN's output k is its input k
                        t = t.op.inputs[t.value_index]
                    if t.op.name.startswith(prefix):
                        stack.append(t.op)
    owned = {name: next(iter(vs)) for name, vs in reached.items() if len(vs) == 1}
    # A reader of shared state (each variable's own read of the learning rate) stays with that state.
    ops = {name: graph.get_operation_by_name(name) for name in owned}
    return {name: var for name, var in owned.items()
            if all(t.op.name == var or owned.get(t.op.name) == var
                   for t in ops[name].inputs if t.dtype == tf.resource)}


def passed_through(graph: tf.Graph) -> dict[str, list[tf.Tensor]]:
    """Tensor name → the outputs of pass-through ops that forward it (see :data:`PASS_THROUGH_OP_TYPES`)."""
    out: dict[str, list[tf.Tensor]] = {}
    for op in graph.get_operations():
        if bypassable(op):
            for inp, outp in zip(op.inputs, op.outputs):
                out.setdefault(inp.name, []).append(outp)
    return out


def build_op_graph(traced: TracedModel, compute_us: Mapping[str, Mapping[str, float]]) -> OpGraph:
    """Build the annotated op graph of the fixed-batch trace.

    Parameters
    ----------
    traced : TracedModel
    compute_us : Mapping[str, Mapping[str, float]]
        Device kind → op name → measured µs.

    Raises
    ------
    GraphError
        If the graph has a cycle or an op's cost is negative/NaN.
    """
    g = traced.fixed.graph
    batch = traced.batch_size or None  # a step traced with an unknown batch is sized at the planning batch
    dg = nx.DiGraph()
    cache: dict[str, frozenset[str] | None] = {}
    local = {d.device_type for d in tf.config.list_physical_devices()}
    unchecked = frozenset(k for k in compute_us if k not in local)
    uf = nx.utils.UnionFind()
    fixed_variables = traced.fixed_captures[0]
    variables = {ph: var.path for ph, var in fixed_variables.items()}
    ops = g.get_operations()
    for op in ops:
        costs = {}
        for kind, table in compute_us.items():
            c = float(table.get(op.name, 0.0))
            if not np.isfinite(c) or c < 0:
                raise GraphError(f"op {op.name!r} has invalid measured cost {c!r} on {kind}")
            costs[kind] = c
        mem = variable_bytes(fixed_variables[op.name]) if op.name in variables else 0
        dg.add_node(op.name, **{
            OP_TYPE: op.type, COMPUTE_US: costs, OUTPUT_BYTES: sum(tensor_bytes(t, batch) for t in op.outputs),
            MEMORY_BYTES: mem, ALLOWED_KINDS: _kernel_kinds(op.type, unchecked, cache), LAYER: layer_of(op.name),
            COLOCATION: None,
        })
        if op.name in variables:
            dg.nodes[op.name][VARIABLE] = variables[op.name]
        uf[op.name]
        for rule in COLOCATION_RULES:
            for other in rule(op):
                uf.union(op.name, other)
    for gather, resource in row_gathers(g).items():  # emitted as a ResourceGather of the variable
        uf.union(gather, g.get_tensor_by_name(resource).op.name)
    for op in ops:
        # An op outside every layer scope that reads one layer's outputs only (the tape's gradient sums,
        # AddN_k; the optimizer's per-gradient Identity_k) belongs to that layer: a layer's backward pass
        # stays on its device.
        if dg.nodes[op.name][LAYER] == op.name and op.inputs:
            layers = {dg.nodes[t.op.name][LAYER] for t in op.inputs}
            if len(layers) == 1 and next(iter(layers)) != op.inputs[0].op.name:
                dg.nodes[op.name][LAYER] = layers.pop()
    if traced.optimizer_scope:
        # The optimizer's update of a variable runs where the variable lives, and its slots live there too.
        trainable = [ph for ph, var in fixed_variables.items() if var.trainable
                     and not ph.startswith(traced.optimizer_scope + "/")]
        for name, var_ph in optimizer_owners(g, traced.optimizer_scope, trainable).items():
            dg.nodes[name][LAYER] = dg.nodes[var_ph][LAYER]
            if name in variables:
                uf.union(name, var_ph)
    tensors: list[TensorInfo] = []
    bypass = passed_through(g)
    for op in ops:
        for t in ([] if bypassable(op) else op.outputs):
            consumers = tuple(dict.fromkeys(c.name for u in [t, *bypass.get(t.name, ())] for c in u.consumers()
                                            if c.type not in PASS_THROUGH_OP_TYPES or not bypassable(c)))
            if not consumers:
                continue
            nb = tensor_bytes(t, batch)
            tensors.append(TensorInfo(t.name, op.name, consumers, nb, t.dtype.name, t.shape.rank))
            for c in consumers:
                if dg.has_edge(op.name, c):
                    dg.edges[op.name, c][BYTES] += nb
                    dg.edges[op.name, c][TENSORS] += (t.name,)
                    dg.edges[op.name, c][TENSOR_BYTES] += (nb,)
                else:
                    dg.add_edge(op.name, c, **{BYTES: nb, TENSORS: (t.name,), TENSOR_BYTES: (nb,), CONTROL: False})
        for c in op._control_outputs:  # noqa: SLF001  (no public accessor in TF 2.21)
            if not dg.has_edge(op.name, c.name):
                dg.add_edge(op.name, c.name, **{BYTES: 0, TENSORS: (), CONTROL: True})
    if not nx.is_directed_acyclic_graph(dg):
        raise GraphError("the traced graph has a cycle; control flow loops are not supported yet")
    if traced.step == "train":
        _mark_phases(dg, traced.optimizer_scope)
    for group in uf.to_sets():
        if len(group) > 1:
            key = min(group)
            for name in group:
                dg.nodes[name][COLOCATION] = key
    log.info("op graph: %d ops, %d edges, %d tensors, %d variables", dg.number_of_nodes(),
             dg.number_of_edges(), len(tensors), len(variables))
    return OpGraph(dg, tuple(tensors), variables, traced.batch_size, tuple(compute_us))


def _mark_phases(dg: nx.DiGraph, optimizer_scope: str | None) -> None:
    """Each op's :data:`~placer.core.attrs.PHASE` in a training step's graph: :func:`phase_of` by name, then
    the forward ops the backward pass does not need (the loss tracker, metrics, the step's outputs) join the
    update: the placed step in micro-batches runs them once, after the micro-batches."""
    for v in dg:
        dg.nodes[v][PHASE] = phase_of(v, optimizer_scope)
    needed: set[str] = set()
    todo = [v for v in dg if dg.nodes[v][PHASE] == "backward"]
    while todo:
        for u in dg.predecessors(todo.pop()):
            if u not in needed:
                needed.add(u)
                todo.append(u)
    for v in dg:
        if dg.nodes[v][PHASE] == "forward" and v not in needed:
            dg.nodes[v][PHASE] = "update"


def graph_summary(op_graph: OpGraph) -> dict[str, Any]:
    """Counts and totals for reports."""
    g = op_graph.graph
    return {
        "ops": g.number_of_nodes(),
        "edges": g.number_of_edges(),
        "variables": len(op_graph.variables),
        "resident_bytes": int(sum(d[MEMORY_BYTES] for _, d in g.nodes(data=True))),
        "compute_us": {k: float(sum(d[COMPUTE_US][k] for _, d in g.nodes(data=True))) for k in op_graph.kinds},
    }
