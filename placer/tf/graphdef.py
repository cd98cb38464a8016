"""The bottom of the TensorFlow back end: facts about GraphDefs that every other TF module builds on.

Nothing here rewrites a graph on its own behalf or imports another module of
:mod:`placer.tf`; the rewrites (:mod:`placer.tf.rewrites`), the emitter, the
export and the measurements read and name graphs through these:

* **names and scopes**: where an emitted function's graph is imported
  (:data:`IMPORT_PREFIX`), the tape's scope (:data:`GRADIENT_SCOPE`), the
  scopes the rewrites add (micro-batch copies ``mb{i}/``, replicas
  ``replica_{i}/``, running gradient sums, gates, acknowledgements) and how to
  read them back (:func:`copied`, :func:`copy_of`, :func:`scope_index`,
  :func:`layer_of`);
* **inputs and dependencies**: a node's input string (:func:`source`), the
  GraphDef as a ``networkx`` graph (:func:`dependency_graph`), nodes computed
  from constants alone (:func:`constant_nodes`);
* **variables**: the ``tf.Variable`` and resource handle behind a Keras
  variable (:func:`tf_variable`, :func:`variable_handle`), the op types that
  write one in place (:data:`VARIABLE_WRITES`) or touch its rows
  (:data:`SPARSE_VARIABLE_OPS`), the gathers that can read rows directly
  (:func:`row_gathers`);
* **devices**: every op of a trace given a device from a plan that names
  only some (:func:`complete_assignment`), and whether two devices are in one
  process (:func:`other_process`);
* **tensors**: a tensor's bytes (:func:`tensor_bytes`) and the ops that only
  pass tensors through (:data:`PASS_THROUGH_OP_TYPES`, :func:`bypassable`).

Examples
--------
>>> source("^a"), source("a:1"), source("a")
(('a', '^'), ('a', ':1'), ('a', ''))
>>> copy_name(2, "dense/MatMul"), copied("mb2/dense/MatMul")
('mb2/dense/MatMul', ('dense/MatMul', 2))
"""

from __future__ import annotations

import re
from typing import Any, Mapping

import networkx as nx
import numpy as np
import tensorflow as tf

from ..errors import GraphError

#: Name scope of an emitted graph inside its placed ``tf.function`` (``autoplace/<node>``).
IMPORT_PREFIX = "autoplace"
#: Name scope TensorFlow gives the ops of ``GradientTape.gradient``.
GRADIENT_SCOPE = "gradient_tape"
#: Name prefix of micro-batch ``i``'s copy of a pipelined forward graph (``mb{i}/<node>``).
COPY_PREFIX = "mb{}"
#: Name scope of replica ``r`` of a replicated training step (``replica_{r}/``, also under the tape's scope).
REPLICA_SCOPE = "replica"
#: Name scope of the running gradient sums after replica ``r`` (``autoplace_gradient_sum_{r}/…``) ...
GRADIENT_SUM_SCOPE = "autoplace_gradient_sum"
#: ... and of the sum of the groups' sums, group ``r``'s added under ``autoplace_gradient_total_{r}/``.
GRADIENT_TOTAL_SCOPE = "autoplace_gradient_total"
#: Name scope of the ``NoOp`` gates that order each device's micro-batches.
GATE_PREFIX = "autoplace_gate"
#: Name scope of the acknowledgements of awaited transfers (:mod:`placer.tf.rewrites.sends`).
ACK_SCOPE = "autoplace_ack"
#: Name scope of data-parallel group ``g``'s copies of the variables and their reads (``autoplace_mirror_{g}/…``).
MIRROR_SCOPE = "autoplace_mirror"

_COPY_HEAD = re.compile("^" + COPY_PREFIX.format(r"(\d+)") + "/")
#: A micro-batch's or replica's name scope anywhere in a name (``mb{i}/`` or ``replica_{i}/``).
_COPY_SCOPE = re.compile(r"(^|/)(?:" + COPY_PREFIX.format("") + "|" + REPLICA_SCOPE + r"_)(\d+)/")

#: Ops that write a resource variable in place: TensorFlow copies the variable first when a read of it is
#: still live (copy-on-write), which the simulator's memory model does not count.
VARIABLE_WRITES = frozenset({"AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp"})
#: Op types that only pass tensors through (``IdentityN`` gathers *every* gradient in Keras' optimizer:
#: kept, it would pull them all onto one device). Planned and emitted as if each consumer read the input.
PASS_THROUGH_OP_TYPES = frozenset({"IdentityN"})


def source(name: str) -> tuple[str, str]:
    """``(node, suffix)`` of a node's input string: ``"^a"`` → ``("a", "^")``, ``"a:1"`` → ``("a", ":1")``."""
    if name.startswith("^"):
        return name[1:], "^"
    node, _, port = name.partition(":")
    return node, (":" + port if port else "")


def copy_name(i: int, name: str) -> str:
    """Micro-batch ``i``'s copy of the node ``name`` in a pipelined graph (``mb{i}/name``)."""
    return f"{COPY_PREFIX.format(i)}/{name}"


def mirror_name(group: int, name: str) -> str:
    """Data-parallel group ``group``'s copy of the node ``name`` (a variable's placeholder or its read).

    >>> mirror_name(1, "dense/kernel")
    'autoplace_mirror_1/dense/kernel'
    """
    return f"{MIRROR_SCOPE}_{group}/{name}"


def copied(name: str) -> tuple[str, int | None]:
    """``(node, i)``: the node that ``name`` is micro-batch ``i``'s copy of; ``(name, None)`` for no copy.

    >>> copied("mb3/dense/MatMul"), copied("dense/MatMul")
    (('dense/MatMul', 3), ('dense/MatMul', None))
    """
    found = _COPY_HEAD.match(name)
    return (name, None) if found is None else (name[found.end():], int(found.group(1)))


def copy_of(name: str) -> tuple[str, int | None]:
    """``(op, i)``: the op of the plan that an emitted node copies, without its micro-batch or replica scopes, and
    the index of its copy (``None``: not a copy).

    >>> copy_of("gradient_tape/replica_1/d/MatMul"), copy_of("mb0/d/MatMul"), copy_of("Adam/Add")
    (('gradient_tape/d/MatMul', 1), ('d/MatMul', 0), ('Adam/Add', None))
    """
    found = _COPY_SCOPE.search(name)
    if found is None:
        return name, None
    return _COPY_SCOPE.sub(r"\1", name), int(found.group(2))


def scope_index(part: str, scope: str) -> int | None:
    """``r`` of a name part ``scope_r``, else ``None``.

    >>> scope_index("replica_3", REPLICA_SCOPE), scope_index("replica", REPLICA_SCOPE)
    (3, None)
    """
    head, _, index = part.rpartition("_")
    return int(index) if head == scope and index.isdigit() else None


def gate_name(phase: str, i: int, device: str) -> str:
    """The name of the gate after micro-batch ``i``'s ``phase`` on ``device``.

    >>> gate_name("forward", 1, "/CPU:0")
    'autoplace_gate/forward/mb1/CPU_0'
    """
    return f"{GATE_PREFIX}/{phase}/{COPY_PREFIX.format(i)}/{device.replace(':', '_').strip('/')}"


def layer_of(op_name: str) -> str:
    """The Keras layer scope of an op (``model/layer``), or the op name itself.

    A gradient op belongs to the layer of the forward op it differentiates
    (TensorFlow names it ``gradient_tape/<forward op>/...``), so grouping by
    layer keeps a layer's backward pass on the layer's device.

    Examples
    --------
    >>> layer_of("resnet50_1/conv1_conv_1/convolution")
    'resnet50_1/conv1_conv_1'
    >>> layer_of("gradient_tape/resnet50_1/conv1_conv_1/convolution/Conv2DBackpropFilter")
    'resnet50_1/conv1_conv_1'
    >>> layer_of("Identity")
    'Identity'
    """
    parts = op_name.split("/")
    if parts[0] == GRADIENT_SCOPE and len(parts) > 1:
        parts = parts[1:]
    return "/".join(parts[:2]) if len(parts) >= 3 else "/".join(parts)


def dependency_graph(gd: tf.compat.v1.GraphDef) -> nx.DiGraph:
    """``gd`` as a ``networkx.DiGraph``: a node per node, an edge per data or control input.

    Examples
    --------
    >>> gd = tf.compat.v1.GraphDef()
    >>> _ = gd.node.add(name="a", op="Const")
    >>> _ = gd.node.add(name="b", op="Identity", input=["a:0", "^a"])
    >>> sorted(dependency_graph(gd).edges)
    [('a', 'b')]
    """
    g = nx.DiGraph()
    g.add_nodes_from(n.name for n in gd.node)
    g.add_edges_from((source(x)[0], n.name) for n in gd.node for x in n.input)
    return g


def constant_nodes(gd: tf.compat.v1.GraphDef) -> set[str]:
    """Nodes of ``gd`` computed from constants alone: ``Const`` nodes and nodes all of whose inputs (control
    inputs included) are such nodes.

    The gates leave them out of every micro-batch
    (:func:`placer.tf.rewrites.gates.add_gates`). A replicated training
    step's gradient seed (``replica_r/ones``, a ``Const``) and its scaling by
    the replica's share (``gradient_tape/replica_r/mul/Mul``) sit on whatever
    device the plan gave the unreplicated step's seed; gated there, every
    micro-batch's backward pass on the loss's device waited for the previous
    micro-batch's backward pass on the seed's device, and a two-stage
    training pipeline overlapped nothing (measured,
    ``benchmarks/results/pipeline_orders.md``). The simulator likewise leaves
    sources that take no time ungated (:func:`placer.core.microbatch.pipelined_schedule`).

    Examples
    --------
    >>> gd = tf.compat.v1.GraphDef()
    >>> _ = gd.node.add(name="one", op="Const")
    >>> _ = gd.node.add(name="x", op="Placeholder")
    >>> _ = gd.node.add(name="two", op="AddV2", input=["one", "one"])
    >>> _ = gd.node.add(name="y", op="Mul", input=["x", "two"])
    >>> sorted(constant_nodes(gd))
    ['one', 'two']
    """
    g = dependency_graph(gd)
    op = {n.name: n.op for n in gd.node}
    out: set[str] = set()
    for name in nx.topological_sort(g):
        preds = list(g.predecessors(name))
        if (all(p in out for p in preds) if preds else op.get(name) == "Const"):
            out.add(name)
    return out


def tf_variable(variable: Any) -> tf.Variable:
    """The ``tf.Variable`` behind a Keras variable (its ``.value``), or ``variable`` itself."""
    return variable if isinstance(variable, tf.Variable) else variable.value


def variable_handle(variable: Any) -> Any:
    """The resource handle of a Keras variable or a ``tf.Variable``."""
    return tf_variable(variable).handle


def variable_bytes(variable: Any) -> int:
    """Bytes a Keras variable or a ``tf.Variable`` holds.

    >>> variable_bytes(tf.Variable(tf.zeros((4, 3))))
    48
    """
    return int(np.prod(variable.shape, dtype=np.int64)) * tf.as_dtype(variable.dtype).size


def tensor_bytes(t: Any, batch: int | None = None) -> int:
    """Bytes of a tensor with a static shape; 0 for resources, strings, variants.

    With ``batch``, unknown dimensions count as ``batch`` (a trace with an
    unknown batch dimension, sized at the planning batch); without it, a
    tensor of unknown shape has 0 bytes.

    Examples
    --------
    >>> tensor_bytes(tf.zeros((2, 3)))
    24
    >>> tensor_bytes(tf.TensorSpec((None, 3)), batch=8)
    96
    """
    if t.dtype in (tf.resource, tf.variant, tf.string) or t.shape.rank is None:
        return 0
    dims = t.shape.as_list()
    if any(d is None for d in dims):
        if batch is None:
            return 0
        dims = [batch if d is None else d for d in dims]
    return int(np.prod(dims, dtype=np.int64)) * t.dtype.size


def bypassable(op: tf.Operation) -> bool:
    """Whether ``op`` only passes its inputs through (:data:`PASS_THROUGH_OP_TYPES`, no control inputs)."""
    return op.type in PASS_THROUGH_OP_TYPES and not op.control_inputs


#: Op types that read or write rows of a resource variable. Any of them puts the variable in TensorFlow's
#: copy-on-read mode (``EnsureSparseVariableAccess``), after which every whole read (``ReadVariableOp``) copies it.
SPARSE_VARIABLE_OPS = frozenset({
    "ResourceGather", "ResourceGatherNd", "ResourceScatterAdd", "ResourceScatterSub", "ResourceScatterMul",
    "ResourceScatterDiv", "ResourceScatterMin", "ResourceScatterMax", "ResourceScatterUpdate",
    "ResourceScatterNdAdd", "ResourceScatterNdSub", "ResourceScatterNdUpdate", "ResourceScatterNdMax",
    "ResourceScatterNdMin", "ResourceSparseApplyAdagrad", "ResourceSparseApplyAdagradV2",
    "ResourceSparseApplyAdadelta", "ResourceSparseApplyAdam", "ResourceSparseApplyFtrl",
    "ResourceSparseApplyFtrlV2", "ResourceSparseApplyMomentum", "ResourceSparseApplyKerasMomentum",
    "ResourceSparseApplyRMSProp", "ResourceSparseApplyCenteredRMSProp", "ResourceSparseApplyProximalAdagrad",
    "ResourceSparseApplyProximalGradientDescent"})


def _row_gather(op: tf.Operation, read: tf.Operation) -> bool:
    """Whether ``op`` gathers whole rows of ``read``'s output: ``GatherV2(read, ids, axis=0)``, ``batch_dims=0``."""
    if op.type != "GatherV2" or op.inputs[0].op is not read or op.inputs[1].op is read:
        return False
    axis = op.inputs[2].op
    return (axis.type == "Const" and op.get_attr("batch_dims") == 0
            and int(tf.make_ndarray(axis.get_attr("value"))) == 0)


def _ancestors(op: tf.Operation) -> set[str]:
    """The names of ``op`` and every op it depends on (data or control)."""
    seen, todo = {op.name}, [op]
    while todo:
        cur = todo.pop()
        for p in [t.op for t in cur.inputs] + list(cur.control_inputs):
            if p.name not in seen:
                seen.add(p.name)
                todo.append(p)
    return seen


def row_gathers(graph: tf.Graph) -> dict[str, str]:
    """``GatherV2`` op name → the resource tensor it can gather its rows from directly (``ResourceGather``).

    TensorFlow copies a whole variable on every ``ReadVariableOp`` once a sparse op has touched it (its
    copy-on-read mode): Keras' ``Embedding`` reads its table whole and gathers the rows (``ops.take``), so a
    training step that updates the table sparsely (SGD's ``ResourceScatterSub``) copies the whole table every
    step (a 100 MB table: 12 ms of a 20 ms step on one core). Listed here: the gathers of a variable that
    the step itself updates sparsely (:data:`SPARSE_VARIABLE_OPS`), whose every whole read is read by row
    gathers alone (or by nothing), and that nothing else writes or reads: ``ResourceGather`` gives the same rows
    without the copy (:mod:`placer.tf.rewrites.gathers`). A variable also read or written whole is left as it is.

    Examples
    --------
    >>> g = tf.Graph()
    >>> with g.as_default():
    ...     h = tf.raw_ops.VarHandleOp(dtype=tf.float32, shape=[4, 2], name="table")
    ...     rows = tf.gather(tf.raw_ops.ReadVariableOp(resource=h, dtype=tf.float32), [1, 3], name="rows")
    ...     upd = tf.raw_ops.ResourceScatterSub(resource=h, indices=[1], updates=tf.ones((1, 2)), name="upd")
    >>> row_gathers(g)
    {'rows': 'table:0'}
    """
    gathers: dict[str, str] = {}
    by_resource: dict[str, list[tf.Operation]] = {}
    for op in graph.get_operations():
        for t in op.inputs:
            if t.dtype == tf.resource:
                by_resource.setdefault(t.name, []).append(op)
    for resource, users in by_resource.items():
        if not any(u.type in SPARSE_VARIABLE_OPS for u in users):
            continue
        found: dict[str, str] = {}
        for u in users:
            if u.type in SPARSE_VARIABLE_OPS or u.type == "VariableShape":
                continue
            consumers = [c for t in u.outputs for c in t.consumers()]
            if u.type != "ReadVariableOp" or not all(_row_gather(c, u) for c in consumers):
                break  # read or written whole: the copies stay, and so does the graph
            waiting = {c.name for c in u._control_outputs}  # noqa: SLF001  (no public accessor in TF 2.21)
            if waiting and any(waiting & _ancestors(c.inputs[1].op) for c in consumers):
                break  # an op ordered after the read feeds the ids: it cannot wait for the gather instead
            found.update({c.name: resource for c in consumers})
        else:
            gathers.update(found)
    return gathers


#: Ops that touch a variable by rows alone, one variable each (a stand-in table of fewer rows serves them:
#: :func:`row_tables`).
ROW_VARIABLE_OPS = frozenset({"ResourceGather", "ResourceScatterAdd", "ResourceScatterSub", "ResourceScatterMul",
                              "ResourceScatterDiv", "ResourceScatterMin", "ResourceScatterMax",
                              "ResourceScatterUpdate", "VariableShape"})


def row_tables(graph: tf.Graph) -> set[str]:
    """The resource placeholders (op names) of ``graph`` whose variable is only ever touched by rows: read by row
    gathers (a whole read whose every consumer is ``GatherV2`` on axis 0, or its ``Shape``), gathered or
    updated by row ops (:data:`ROW_VARIABLE_OPS`), and nothing else: an embedding table trained by SGD, or in
    a forward pass.

    Such a table can be profiled with fewer rows (ids below them) where the whole does not fit the device
    profiled on: every op on it handles as many rows as before. A table updated whole (Adam's dense step) is
    not one.

    Examples
    --------
    >>> g = tf.Graph()
    >>> with g.as_default():
    ...     t = tf.raw_ops.Placeholder(dtype=tf.resource, shape=[], name="table")
    ...     w = tf.raw_ops.Placeholder(dtype=tf.resource, shape=[], name="weight")
    ...     rows = tf.gather(tf.raw_ops.ReadVariableOp(resource=t, dtype=tf.float32), [1, 3], name="rows")
    ...     upd = tf.raw_ops.ResourceScatterSub(resource=t, indices=[1], updates=tf.ones((1, 2)), name="upd")
    ...     out = tf.raw_ops.ReadVariableOp(resource=w, dtype=tf.float32) + 1.0
    >>> sorted(row_tables(g))
    ['table']
    """
    out = set()
    for op in graph.get_operations():
        if op.type != "Placeholder" or op.get_attr("dtype") != tf.resource:
            continue
        users = op.outputs[0].consumers()
        if users and all(u.type in ROW_VARIABLE_OPS or (
                u.type == "ReadVariableOp" and all(_row_gather(c, u) or c.type == "Shape"
                                                   for c in u.outputs[0].consumers())) for u in users):
            out.add(op.name)
    return out


def other_process(a: str, b: str) -> bool:
    """Whether devices ``a`` and ``b`` (full names) belong to different processes (job, replica or task).

    >>> other_process("/job:worker/replica:0/task:0/device:CPU:0", "/job:worker/replica:0/task:1/device:CPU:0")
    True
    >>> other_process("/job:localhost/replica:0/task:0/device:CPU:0", "/job:localhost/replica:0/task:0/device:CPU:1")
    False
    """
    return a.rpartition("/device:")[0] != b.rpartition("/device:")[0]


def complete_assignment(graph: tf.Graph, op_devices: Mapping[str, str],
                        layer_devices: Mapping[str, str] | None = None) -> dict[str, str]:
    """Give every op of ``graph`` a device: the plan's, else its layer's, else a neighbour's.

    The plan names the ops of the trace it was made on. Another trace of the
    same model (unknown batch: extra shape computations; Keras' test step or
    the forward pass of a plan made on the training step) has ops the plan
    does not name: each takes the device of its Keras layer in the plan
    (``layer_devices``, keyed by :func:`layer_of`), else of its first placed
    producer, else of its first placed consumer. Plan entries for ops this
    graph lacks are ignored.

    Raises
    ------
    GraphError
        If some op has no planned device and no placed neighbour at all.
    """
    ops = graph.get_operations()
    out = {op.name: op_devices[op.name] for op in ops if op.name in op_devices}
    if layer_devices:
        for op in ops:
            if op.name not in out and layer_of(op.name) in layer_devices:
                out[op.name] = layer_devices[layer_of(op.name)]
    for _ in range(2):
        for op in ops:
            if op.name in out:
                continue
            for t in op.inputs:
                if t.op.name in out:
                    out[op.name] = out[t.op.name]
                    break
        for op in reversed(ops):
            if op.name in out:
                continue
            for c in (c for t in op.outputs for c in t.consumers()):
                if c.name in out:
                    out[op.name] = out[c.name]
                    break
    missing = [op.name for op in ops if op.name not in out]
    if missing:
        raise GraphError(f"{len(missing)} ops have no planned device and no placed neighbour, e.g. {missing[:5]}")
    return out


def layer_devices_of(assignment: Mapping[str, str]) -> dict[str, str]:
    """Layer (:func:`layer_of`) → the device of its first op in ``assignment``."""
    out: dict[str, str] = {}
    for op, device in assignment.items():
        out.setdefault(layer_of(op), device)
    return out
