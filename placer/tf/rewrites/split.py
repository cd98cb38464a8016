"""Rewrite: the plan's split ops as parts over devices, each reading a shard of its weight.

A plan may split an op by its weight's output columns (``Plan.splits``:
op → parts; the op graph it was made on split the same way,
:func:`placer.core.splits.split_graph`, and the plan places every part).
This rewrite makes the emitted graph match: part ``i`` of op ``n`` is a copy
of ``n`` named :func:`~placer.core.splits.split_name` ``(n, i)`` that reads
a new resource placeholder ``split_name(p, i)`` (the shard of ``n``'s weight
``p``: its columns ``[start, stop)``) through its own read; ``n`` becomes
the concatenation of the parts along the output's last axis, so its
consumers are unchanged. The caller feeds each shard's placeholder with a
variable on the part's device that holds those columns
(:meth:`placer.tf.placement.ReplicatedVariable.shard_on`): the weight is
sharded, no device reads it whole.

Which ops can be split, and how, is per-op knowledge: :data:`SPLIT_RULES`
(op type → :class:`SplitRule`). Dense products (``MatMul``) are split by
output columns: a part computes ``x @ W[:, start:stop]``, every output element
the same dot product as the whole op's (bit-exact where the kernel sums each
dot product the same way at the narrower width; oneDNN's blocking may
change the order, within float rounding).

Lookups (``GatherV2`` of whole rows: an ``Embedding``) are split by the table's
rows: part ``i`` (``split_name(n, i)``, helper nodes in its name scope:
:func:`~placer.core.splits.helper_owner`) gathers the ids in ``[start, stop)``
from its shard with ``ResourceGather`` (no read of the whole shard) and zeros for
the others; ``n`` becomes the ``AddN`` of the parts (each row from one part, the
others adding zeros: the same values). An id outside the table stays outside the
first or last shard, so the lookup fails as the unsplit one does. The table's
sparse updates in a training step (``ResourceScatterSub``/``Add``, SGD's) are
split with it: part ``i`` of update ``u`` updates shard ``i`` with the rows it
holds (zeros at a clipped index for the others: no change), in the same order;
``u`` becomes a ``NoOp`` after its parts.

A product in a training step (``MatMul``: a ``Dense`` kernel) splits with its
gradients and its weight's update (:class:`~placer.core.splits.Gradients`,
found by :func:`_gradients_of`): part ``i`` computes ``x^T @ dy_i`` and
``dy_i @ W_i^T`` (``dy_i`` its columns of ``dy``, sliced by a helper in its
scope; the input gradient becomes the ``AddN`` of the parts') and runs its
copy of the optimizer's element-wise update on shard ``i`` of the weight and of
each slot shaped as it (Adam's moments, momentum; AdamW's decay, a write not
computed from the gradient, too), each whole write a ``NoOp`` after its parts.
A table its optimizer updates densely (momentum, Adam: Keras sums the lookup's
sparse gradient into a table-sized one with ``UnsortedSegmentSum``, found by
:func:`_table_gradients_of`) splits the same way: part ``i``'s copy of each sum
takes the ids its rows hold (made local, the others ``-1``: dropped) into a
shard-sized gradient. Runs after the ``bypass`` rewrite (the update reads its
gradient, not Keras' ``IdentityN``).

Applies when ``context.splits`` names ops. Record detail: the shards
(:class:`Shard`) the caller feeds.
"""

from __future__ import annotations

from typing import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

import tensorflow as tf

from ...core.splits import Gradients, Pair, Split, axis_name, pair_ops, split_map, split_name
from ...errors import GraphError, PlanError
from ..graphdef import bypassable, source
from .base import Rewrite, RewriteContext, RewriteRecord, remove_nodes, splice, template
from .bypass import bypass_pass_through


@dataclass(frozen=True)
class Shard:
    """A shard of a variable that a split's part reads: the caller feeds ``placeholder`` with a variable on
    ``device`` holding ``variable[start:stop]`` along ``axis``.

    Attributes
    ----------
    placeholder : str
        The shard's resource placeholder (:func:`~placer.core.splits.split_name` of the variable's).
    variable : str
        The sharded variable's placeholder in the trace.
    device : str
        Where the part that reads it runs.
    start, stop : int
        The shard's slice of the variable along ``axis``.
    axis : int
        The axis of the variable that is sharded.
    pieces : bool
        Whether the shard travels between the client and its device in pieces of rows
        (:func:`placer.tf.remote.variable_on`: no transfer larger than a piece, so a worker under a memory
        limit never needs a whole shard's size again in its gRPC buffers). Every shard this rewrite makes does
        (:func:`~placer.tf.remote.write_rows` turns TensorFlow's copy-on-read mode off afterwards, so whole
        reads do not copy it); an export made before 2026-12-07 holds products' shards that travel whole.
    """

    placeholder: str
    variable: str
    device: str
    start: int
    stop: int
    axis: int
    pieces: bool = False

    def slice_of(self, value: tf.Tensor) -> tf.Tensor:
        """This shard's slice of ``value`` (the whole variable's value).

        >>> Shard("p", "w", "/CPU:0", 1, 3, axis=1).slice_of(tf.reshape(tf.range(8), (2, 4))).numpy().tolist()
        [[1, 2], [5, 6]]
        """
        begin, size = [0] * value.shape.rank, list(value.shape)
        begin[self.axis], size[self.axis] = self.start, self.stop - self.start
        return tf.slice(value, begin, size)


@dataclass(frozen=True)
class SplitRule:
    """How ops of one type are split (an entry of :data:`SPLIT_RULES`).

    Attributes
    ----------
    weight : callable
        ``weight(op) -> (input index, weight axis) or None``: which input is the weight read, and which of the
        weight's axes holds the output columns (``None``: this op cannot be split so).
    join_axis : int
        The axis of the op's output the parts are concatenated along (``-1``: the last).
    kind : str
        ``"columns"`` (parts concatenated) or ``"rows"`` (parts masked and summed):
        :data:`~placer.core.splits.SPLIT_KINDS`.
    updates : frozenset of str
        The op types that may update the weight in a training step and are split with it (each part updates the
        rows its shard holds); a weight updated otherwise (a dense optimizer update) is not split.
    """

    weight: Callable[[tf.Operation], tuple[int, int] | None]
    join_axis: int = -1
    kind: str = "columns"
    updates: frozenset[str] = frozenset()


def _matmul_weight(op: tf.Operation) -> tuple[int, int] | None:
    if op.get_attr("transpose_a"):
        return None
    return 1, 0 if op.get_attr("transpose_b") else 1


def _batch_matmul_weight(op: tf.Operation) -> tuple[int, int] | None:
    """A batched product with a 2-D weight (``x @ W`` for ``x`` of rank 3 and more: ``EinsumDense``)."""
    if op.get_attr("adj_x") or op.inputs[1].shape.rank != 2:
        return None
    return 1, 0 if op.get_attr("adj_y") else 1


def _gather_table(op: tf.Operation) -> tuple[int, int] | None:
    """A lookup of whole rows: ``GatherV2(table, ids, axis=0)`` of a 2-D table with ``batch_dims=0``."""
    axis = op.inputs[2].op
    if op.get_attr("batch_dims") != 0 or axis.type != "Const" or tf.make_ndarray(axis.get_attr("value")) != 0 or \
            op.inputs[0].shape.rank != 2:
        return None
    return 0, 0


def _conv_weight(op: tf.Operation) -> tuple[int, int] | None:
    """A convolution with its output channels last (``NHWC``/``NDHWC``) and one group: its filter
    ``(spatial…, in, out)`` split by ``out``."""
    x, f = op.inputs[0].shape, op.inputs[1].shape
    if not op.get_attr("data_format").decode().endswith("C") or f.rank is None or x.rank is None or \
            x[-1] is None or f[-2] is None or x[-1] != f[-2]:  # grouped: a part's channels would cross groups
        return None
    return 1, f.rank - 1


#: Op type → its split rule. Dense products (``MatMul``; ``BatchMatMulV2`` with a 2-D weight, read directly or
#: reshaped from an ``EinsumDense`` kernel) by output columns; convolutions (``Conv2D``, ``Conv3D``; a ``Conv1D``'s
#: filter through its ``ExpandDims``) by output channels; lookups (an ``Embedding``'s ``GatherV2``) by table rows.
#: Depthwise and grouped convolutions and ``Einsum`` ops (attention's scores) are not split
#: (``docs/limitations.md``).
SPLIT_RULES: Mapping[str, SplitRule] = {"MatMul": SplitRule(_matmul_weight),
                                        "BatchMatMulV2": SplitRule(_batch_matmul_weight),
                                        "Conv2D": SplitRule(_conv_weight),
                                        "Conv3D": SplitRule(_conv_weight),
                                        "GatherV2": SplitRule(_gather_table, kind="rows", updates=frozenset(
                                            {"ResourceScatterAdd", "ResourceScatterSub"}))}


@dataclass(frozen=True)
class _Weight:
    """Where a splittable op reads its weight: input ``index`` is ``read`` of ``placeholder`` (through
    ``reshape`` where an ``EinsumDense`` merges the kernel's trailing axes), split along the variable's ``axis``;
    ``updates``: the rule's sparse updates of it."""

    index: int
    read: tf.Operation
    placeholder: tf.Operation
    axis: int
    updates: tuple[tf.Operation, ...]
    reshape: tf.Operation | None = None
    grads: Gradients | None = None


def _expanded_axis(expand: tf.Operation, axis: int) -> int | None:
    """The variable's axis that ``expand`` (an ``ExpandDims`` of the weight's read, a ``Conv1D`` filter
    ``(k, in, out)`` → ``(1, k, in, out)``) moves to ``axis`` of its output, or ``None``."""
    dim = expand.inputs[1].op
    if dim.type != "Const":
        return None
    rank = expand.outputs[0].shape.rank
    at = int(tf.make_ndarray(dim.get_attr("value"))) % rank
    return None if at == axis else axis - (at < axis)


def _weight_of(op: tf.Operation, captured: Mapping[str, object]) -> _Weight | None:
    """The weight of a splittable ``op``: a captured variable read by it alone (and updated only by its rule's
    sparse updates), else ``None``."""
    rule = SPLIT_RULES.get(op.type)
    found = rule.weight(op) if rule is not None else None
    if found is None:
        return None
    index, axis = found
    read, reshape = op.inputs[index].op, None
    if rule.kind == "columns" and ((read.type == "Reshape" and axis == 1) or read.type == "ExpandDims"):
        reshape, read = read, read.inputs[0].op  # an EinsumDense kernel, its heads merged; a Conv1D's filter
        if [c.name for c in reshape.outputs[0].consumers()] != [op.name]:
            return None
    if read.type != "ReadVariableOp" or read.inputs[0].op.name not in captured:
        return None
    if reshape is not None and reshape.type == "ExpandDims":
        axis = _expanded_axis(reshape, axis)
        if axis is None:
            return None
    elif reshape is not None:  # (c, heads, h) → (c, heads·h): split whole heads; (heads, h, d) → (heads·h, d): d
        whole, merged = read.outputs[0].shape, reshape.outputs[0].shape
        if not (whole.is_fully_defined() and merged.is_fully_defined() and whole.rank >= 3):
            return None
        if merged.as_list() == [whole[0], whole[1:].num_elements()]:
            axis = 1
        elif merged.as_list() == [whole[:-1].num_elements(), whole[-1]]:
            axis = whole.rank - 1
        else:
            return None
    ph = read.inputs[0].op
    updates = tuple(c for c in ph.outputs[0].consumers() if c.type in rule.updates and c.inputs[0].op is ph)
    readers = [c.name for c in read.outputs[0].consumers()]
    grads = None
    if reshape is None and (readers != [op.name] or any(c.type in UPDATE_WRITES for c in ph.outputs[0].consumers())):
        # a training step's product (or table): its gradients and update split with it
        grads = _gradients_of(op, read, ph) if rule.kind == "columns" else _table_gradients_of(op, read, ph)
        if grads is None:
            return None
        readers = [r for r in readers if r != grads.input_grad]
        updates = ()
    ours = {u.name for u in updates} | set(() if grads is None else grads.ops)
    if readers != [(reshape or op).name] or \
            any(c is not read and c.name not in ours and not _dead_read(c) for c in ph.outputs[0].consumers()):
        return None
    return _Weight(index, read, ph, axis, updates, reshape, grads)


#: The writes that end a split product's weight update in a training step (:class:`~placer.core.splits.Gradients`).
UPDATE_WRITES = frozenset({"AssignSubVariableOp", "AssignAddVariableOp", "AssignVariableOp"})
#: Element-wise ops an optimizer's update of a split product's weight may run on the gradient's columns, each other
#: input a scalar (SGD: ``lr * grad``); besides these, :data:`PAIR_CHAIN_OPS` and :data:`PAIR_BINARY_OPS`.
UPDATE_OPS = frozenset({"Sqrt", "Rsqrt", "Cast", "Reciprocal", "Sign", "Pow", "SquaredDifference"})


def _through(t: tf.Tensor) -> tf.Tensor:
    """The tensor ``t`` forwards through pass-through ops (``IdentityN``: its output ``k`` is its input ``k``)."""
    while bypassable(t.op):
        t = t.op.inputs[t.value_index]
    return t


def _users(t: tf.Tensor) -> list[tf.Operation]:
    """The ops that read ``t``, looking through pass-through ops (as :mod:`.bypass` rewires them)."""
    out: dict[str, tf.Operation] = {}
    for c in t.consumers():
        if bypassable(c):
            for k, x in enumerate(c.inputs):
                if x.name == t.name:
                    out.update((u.name, u) for u in _users(c.outputs[k]))
        else:
            out[c.name] = c
    return list(out.values())


def _update_region(sources: Sequence[tf.Operation], ph: tf.Operation, read: tf.Operation
                   ) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]] | None:
    """The ops from ``sources`` (the ops whose outputs are a weight's gradient: a product's one, a table's sums)
    to the writes of its variable ``ph`` (``read``: the forward pass's read of it), in the graph's order; apart,
    those that lead to no write (Keras' ``Identity`` of a gradient); and the optimizer's slots of the weight.
    Every op reading the gradient or an op after it is element-wise (:data:`UPDATE_OPS`, :data:`PAIR_CHAIN_OPS`,
    :data:`PAIR_BINARY_OPS`), its other inputs scalars or reads of a variable shaped as the weight (a *slot*, such
    as Adam's moments, whose every read and write joins the region; or ``ph`` itself: AdamW's decay), or a write
    of ``ph`` or a slot (:data:`UPDATE_WRITES`; every write of ``ph`` joins the region); ``None`` where anything
    else reads them (a global norm's sum) or nothing writes ``ph``."""
    shape = read.outputs[0].shape
    region: dict[str, tf.Operation] = {}
    slots: dict[str, tf.Operation] = {}
    frontier = list(sources)
    grads = {op.name for op in sources}

    def add(op: tf.Operation) -> None:
        region[op.name] = op
        frontier.append(op)

    for write in ph.outputs[0].consumers():  # every write of the weight: also one not computed from the gradient
        if write.type in UPDATE_WRITES and write.inputs[0].op is ph:  # (AdamW's decay, w - w * lr * wd)
            add(write)

    while frontier:
        cur = frontier.pop()
        for t in cur.inputs:  # what the region reads besides the gradient and scalars
            src = _through(t).op
            if cur.name in grads or src.name in region or _scalar(t) or src is read:
                continue
            if src.type in UPDATE_OPS | PAIR_CHAIN_OPS | PAIR_BINARY_OPS and len(src.outputs) == 1:
                add(src)  # computed from a slot (momentum's m * 0.9): its inputs are checked in turn
                continue
            if src.type != "ReadVariableOp":
                continue  # refused below
            var = src.inputs[0].op  # a variable shaped as the weight is sharded with it
            if var.type != "Placeholder" or src.outputs[0].shape != shape:
                continue  # a scalar's read (the learning rate), or checked below
            if var is ph:
                add(src)
            elif var.name not in slots:
                slots[var.name] = var
                for c in var.outputs[0].consumers():
                    if c.type != "ReadVariableOp" and not (c.type in UPDATE_WRITES and c.inputs[0].op is var):
                        return None
                    if c.name not in region:
                        add(c)
        for user in (u for t in cur.outputs for u in _users(t)):
            if user.name in region:
                continue
            if user.type not in UPDATE_WRITES | UPDATE_OPS | PAIR_CHAIN_OPS | PAIR_BINARY_OPS or \
                    len(user.outputs) > 1:  # (a write's variable is checked below: a slot may be found later)
                return None
            add(user)
    variables = {ph.name, *slots}
    for user in region.values():
        for k, t in enumerate(user.inputs):
            t = _through(t)
            if t.op.name in grads or t.op.name in region or _scalar(t) or (
                    k == 0 and (user.type in UPDATE_WRITES or user.type == "ReadVariableOp") and
                    t.op.name in variables):
                continue
            return None
    leads = {u for u, op in region.items() if op.type in UPDATE_WRITES}  # the ops a write depends on
    if not any(op.inputs[0].op is ph for op in region.values() if op.type in UPDATE_WRITES):
        return None
    grown = True
    while grown:
        before = len(leads)
        leads |= {_through(t).op.name for u in list(leads) for t in region[u].inputs if _through(t).op.name in region}
        grown = len(leads) > before
    order = {o.name: i for i, o in enumerate(ph.graph.get_operations())}
    return (tuple(sorted(leads, key=order.__getitem__)), tuple(sorted(set(region) - leads, key=order.__getitem__)),
            tuple(sorted(slots)))


def _scalar(t: tf.Tensor) -> bool:
    """Whether ``t`` holds one number (it commutes with taking columns)."""
    return t.shape.is_fully_defined() and t.shape.num_elements() == 1


def _gradients_of(op: tf.Operation, read: tf.Operation, ph: tf.Operation) -> Gradients | None:
    """A training step's gradients of product ``op`` (``x @ W``, ``W`` read by ``read`` of ``ph``) that split with
    it (:class:`~placer.core.splits.Gradients`): ``x^T @ dy`` (whose update region writes ``ph``) and ``dy @ W^T``
    (the read's other reader, if any); ``None`` where they are not so or the update is not element-wise."""
    if op.type != "MatMul" or op.get_attr("transpose_a") or op.get_attr("transpose_b"):
        return None
    others = [c for c in read.outputs[0].consumers() if c is not op]
    gx = others[0] if len(others) == 1 else None
    if len(others) > 1 or (gx is not None and (
            gx.type != "MatMul" or gx.inputs[1].name != read.outputs[0].name or gx.get_attr("transpose_a") or
            not gx.get_attr("transpose_b"))):
        return None
    x = op.inputs[0]
    columns = read.outputs[0].shape[1]
    for gw in x.consumers():
        if gw is op or gw.type != "MatMul" or gw.inputs[0].name != x.name or not gw.get_attr("transpose_a") or \
                gw.get_attr("transpose_b") or gw.inputs[1].shape.rank != 2 or gw.inputs[1].shape[1] != columns or \
                (gx is not None and gw.inputs[1].name != gx.inputs[0].name):
            continue
        region = _update_region([gw], ph, read)
        if region is not None:
            return Gradients((gw.name,), None if gx is None else gx.name, *region)
    return None


def _sums_ids(op: tf.Operation, ids: tf.Tensor) -> bool:
    """Whether ``op`` is an ``UnsortedSegmentSum`` by ``ids`` (flattened, as a lookup's gradient holds them)."""
    if op.type != "UnsortedSegmentSum":
        return False
    seg = _through(op.inputs[1])
    return seg.name == ids.name or (
        seg.op.type == "Reshape" and _through(seg.op.inputs[0]).name == ids.name)


def _table_gradients_of(op: tf.Operation, read: tf.Operation, ph: tf.Operation) -> Gradients | None:
    """A training step's dense gradients of lookup ``op``'s table (``read`` of ``ph``) and the table's update
    (:class:`~placer.core.splits.Gradients`): the ``UnsortedSegmentSum``\\ s by the lookup's ids that the writes
    of ``ph`` are computed from (through element-wise ops and the optimizer's table-shaped slots: Adam sums the
    sparse gradient's values and their squares); ``None`` where there are none or the update is not
    element-wise on them (:func:`_update_region`)."""
    ids, shape = op.inputs[1], read.outputs[0].shape
    sums: dict[str, tf.Operation] = {}
    seen: set[str] = set()
    stack = [c for c in ph.outputs[0].consumers() if c.type in UPDATE_WRITES and c.inputs[0].op is ph]
    while stack:  # back from the table's writes to the sums (the region's checks come after)
        cur = stack.pop()
        if cur.name in seen:
            continue
        seen.add(cur.name)
        for t in (_through(x) for x in cur.inputs):
            src = t.op
            if _scalar(t) or src.name in seen:
                continue
            if _sums_ids(src, ids) and t.shape == shape:
                sums[src.name] = src
            elif src.type == "ReadVariableOp" and t.shape == shape and src.inputs[0].op is not ph:
                var = src.inputs[0].op  # a slot: what it is written from leads back too
                stack += [c for c in var.outputs[0].consumers() if c.type in UPDATE_WRITES and c.inputs[0].op is var]
            elif src.type in UPDATE_OPS | PAIR_CHAIN_OPS | PAIR_BINARY_OPS:
                stack.append(src)
    if not sums:
        return None
    region = _update_region(list(sums.values()), ph, read)
    if region is None:
        return None
    order = {o.name: i for i, o in enumerate(ph.graph.get_operations())}
    return Gradients(tuple(sorted(sums, key=order.__getitem__)), None, *region)


#: Element-wise ops a column split's parts may run on their own columns before the product that takes them as
#: its input rows (:class:`~placer.core.splits.Pair`): a bias add (its bias split by the same columns) and
#: ops of one input (activations; GELU's ``Neg`` and ``Erfc``) ...
PAIR_CHAIN_OPS = frozenset({"BiasAdd", "Relu", "Relu6", "Elu", "Selu", "Tanh", "Sigmoid", "Softplus", "Softsign",
                            "LeakyRelu", "Identity", "Neg", "Erf", "Erfc", "Exp", "Square", "Abs"})
#: ... and of two inputs, each the region's own tensor or a scalar constant (GELU: ``0.5 * x * erfc(-x / √2)``;
#: a scalar commutes with taking columns, a vector would not).
PAIR_BINARY_OPS = frozenset({"Mul", "AddV2", "Add", "Sub", "RealDiv", "Maximum", "Minimum"})


def _scalar_constant(t: tf.Tensor) -> bool:
    return t.op.type == "Const" and t.shape.is_fully_defined() and t.shape.num_elements() == 1


def _pair_region(op: tf.Operation, captured: Mapping[str, object]
                 ) -> tuple[list[tf.Operation], tf.Operation, tuple[tf.Operation, tf.Operation] | None] | None:
    """The element-wise ops between ``op``'s output and the one ``MatMul`` they feed (in the graph's order), that
    product, and the ``(read, placeholder)`` of a ``BiasAdd``'s bias among them; ``None`` where anything else
    reads them (another consumer, a control edge), an op is not in :data:`PAIR_CHAIN_OPS`/:data:`PAIR_BINARY_OPS`,
    a second input is not a scalar constant, or more than one product (or bias add) takes them."""
    inside = {op.name}
    region: list[tf.Operation] = []
    product, bias = None, None
    frontier = [op]
    while frontier:
        cur = frontier.pop()
        if len(cur.outputs) != 1 or cur._control_outputs:  # (no public accessor of control successors)
            return None
        for user in cur.outputs[0].consumers():
            if user.name in inside or (product is not None and user is product):
                continue
            sources = [t for t in user.inputs if t.op.name in inside]
            if user.type == "MatMul" and user.inputs[0].op.name in inside and len(sources) == 1:
                if product is not None:
                    return None
                product = user
                continue
            if user.type == "BiasAdd":
                if bias is not None or user.inputs[0].op.name not in inside:
                    return None
                bias = _bias_of(user, captured)
                if bias is None:
                    return None
            elif user.type in PAIR_BINARY_OPS:
                if len(user.inputs) != 2 or not all(t.op.name in inside or _scalar_constant(t) for t in user.inputs):
                    return None
            elif user.type not in PAIR_CHAIN_OPS or len(user.inputs) != 1:
                return None
            inside.add(user.name)
            region.append(user)
            frontier.append(user)
    if product is None:
        return None
    order = {o.name: i for i, o in enumerate(op.graph.get_operations())}
    return sorted(region, key=lambda o: order[o.name]), product, bias


def _bias_of(op: tf.Operation, captured: Mapping[str, object]) -> tuple[tf.Operation, tf.Operation] | None:
    """The ``(read, placeholder)`` of a ``BiasAdd``'s bias, a 1-D captured variable read by it alone."""
    read = op.inputs[1].op
    if op.get_attr("data_format") != b"NHWC" or read.type != "ReadVariableOp" or \
            read.inputs[0].op.name not in captured or op.inputs[1].shape.rank != 1:
        return None
    ph = read.inputs[0].op
    if [c.name for c in read.outputs[0].consumers()] != [op.name] or \
            any(c is not read and not _dead_read(c) for c in ph.outputs[0].consumers()):
        return None
    return read, ph


def _pair_of(op: tf.Operation, captured: Mapping[str, object]) -> Pair | None:
    """The product that can take ``op``'s column parts as its input rows (:class:`~placer.core.splits.Pair`):
    ``op`` (a ``MatMul``) feeds it through element-wise ops alone (:func:`_pair_region`: a chain, or a small
    graph such as GELU's), it multiplies them (untransposed) by a weight of as many rows as ``op`` has output
    columns, a captured variable it alone reads; else ``None``."""
    if op.type != "MatMul":
        return None
    found = _pair_region(op, captured)
    if found is None:
        return None
    chain, nxt, bias = found
    if nxt.get_attr("transpose_a"):
        return None
    w = _weight_of(nxt, captured)
    if w is None or w.reshape is not None or w.grads is not None or \
            w.read.outputs[0].shape[1 - w.axis] != op.outputs[0].shape[-1]:
        return None
    return Pair(nxt.name, read=w.read.name, placeholder=w.placeholder.name, chain=tuple(c.name for c in chain),
                bias_read=None if bias is None else bias[0].name,
                bias_placeholder=None if bias is None else bias[1].name)


def _dead_read(op: tf.Operation) -> bool:
    """A read whose value nothing consumes (Keras' shape reads; at most control inputs of others)."""
    return op.type == "ReadVariableOp" and not op.outputs[0].consumers()


def splittable(graph: tf.Graph, op: str, captured: Mapping[str, object]) -> bool:
    """Whether ``graph`` has ``op`` and its rule can split it there (its weight a variable of ``captured`` that
    it alone reads)."""
    try:
        return _weight_of(graph.get_operation_by_name(op), captured) is not None
    except KeyError:
        return False


def _split_of(op: tf.Operation, w: _Weight, parts: int, pair: Pair | None = None) -> Split:
    """The :class:`~placer.core.splits.Split` of ``op`` (its weight ``w``) into ``parts`` (with ``pair``)."""
    return Split(op.name, read=w.read.name, placeholder=w.placeholder.name,
                 columns=int(w.read.outputs[0].shape[w.axis]), parts=parts, kind=SPLIT_RULES[op.type].kind,
                 updates=tuple(u.name for u in w.updates), reshape=None if w.reshape is None else w.reshape.name,
                 pair=pair, grads=w.grads)


def split_candidates(graph: tf.Graph, captured: Mapping[str, object], parts: int | Mapping[str, int],
                     min_weight_bytes: int = 0, *, pairs: bool | Collection[str] = False) -> list[Split]:
    """The ops of ``graph`` that can be split ``parts`` ways (:data:`SPLIT_RULES`), whose weight (a captured
    variable of ``captured`` read by that op alone) holds at least ``min_weight_bytes``, as
    :class:`~placer.core.splits.Split`\\ s. ``parts`` may name the ops (op → parts, a saved plan's
    ``splits``): only those, each its way. ``pairs``: ``True``, each product that can, paired with the product
    after it (:func:`_pair_of`; in graph order, the paired product not split otherwise); with named ops, the
    first products of the pairs (a saved plan's ``pairs``), whose pair must be named the same ways.

    Raises
    ------
    PlanError
        ``parts`` names an op this graph lacks or cannot split so.

    Examples
    --------
    >>> import keras
    >>> from placer.tf.trace import trace_model
    >>> m = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32), keras.layers.Dense(4)])
    >>> t = trace_model(m, batch_size=2)
    >>> [(s.columns, s.parts) for s in split_candidates(t.fixed.graph, t.variables, 2, 4096)]  # 64×32, not 32×4
    [(32, 2)]
    """
    named = parts if isinstance(parts, Mapping) else None
    out: list[Split] = []
    paired: set[str] = set()
    for op in graph.get_operations():
        if (named is not None and op.name not in named) or op.name in paired:
            continue
        k = named[op.name] if named is not None else int(parts)  # type: ignore[arg-type]
        w = _weight_of(op, captured)
        shape = w.read.outputs[0].shape if w is not None else None
        if w is None or not shape.is_fully_defined():
            continue
        columns = int(shape[w.axis])
        if shape.num_elements() * w.read.outputs[0].dtype.size < min_weight_bytes or columns < k:
            continue
        wanted = pairs is True or (not isinstance(pairs, bool) and op.name in pairs)
        pair = _pair_of(op, captured) if wanted and w.grads is None else None
        if wanted and not isinstance(pairs, bool) and (pair is None or named is None or named.get(pair.op) != k):
            raise PlanError(f"the plan pairs {op.name} with the product after it, which this model's trace does "
                            f"not have or splits otherwise; solve again without plan=")
        if pair is not None:
            paired.add(pair.op)
        out.append(_split_of(op, w, k, pair))
    if named is not None and len(split_map(out)) != len(named):
        missing = sorted(set(named) - set(split_map(out)))
        raise PlanError(f"the plan splits {missing[:3]}, which this model's trace does not have or cannot split "
                        "that many ways; solve again without plan=")
    return out


def _rows_part(start: int, stop: int, first: bool, last: bool, dtype: tf.DType
               ) -> Callable[[tf.Tensor, tf.Tensor], tf.Tensor]:
    """A lookup's part over rows ``[start, stop)`` of the table as a :func:`~.base.template` ``(ids, shard) ->
    rows`` (``shard``: the shard variable's handle): the rows of the ids it holds, gathered from the shard
    (``ResourceGather``: no read of the whole shard, which a variable with sparse updates would copy), zeros for
    the others. Ids outside the whole table stay outside the first part's (below) or last part's (above) shard,
    so the lookup fails as the unsplit one does."""
    def part(ids: tf.Tensor, shard: tf.Tensor) -> tf.Tensor:
        local = ids - tf.constant(start, ids.dtype, name="start") if start else ids
        if not first:
            local = tf.maximum(local, tf.constant(0, ids.dtype), name="above")
        if not last:
            local = tf.minimum(local, tf.constant(stop - start - 1, ids.dtype), name="below")
        got = tf.raw_ops.ResourceGather(resource=shard, indices=tf.identity(local, name="local"), dtype=dtype,
                                        name="gather")
        held = ([] if first else [ids >= start]) + ([] if last else [ids < stop])
        inside = held[0] if len(held) == 1 else tf.logical_and(*held)
        return tf.where(tf.expand_dims(inside, -1), got, tf.zeros_like(got), name="out")
    return part


def _rows_update(start: int, stop: int, extra_rank: int) -> Callable[[tf.Tensor, tf.Tensor], list[tf.Tensor]]:
    """A sparse update's part over rows ``[start, stop)`` as a :func:`~.base.template` ``(indices, updates) ->
    [local indices, updates]``: the updates of rows another shard holds become zeros (added to a row of this
    shard: no change), so each part updates exactly its rows, in the order the whole update does."""
    def part(indices: tf.Tensor, updates: tf.Tensor) -> list[tf.Tensor]:
        local = tf.clip_by_value(indices - tf.constant(start, indices.dtype, name="start"),
                                 tf.constant(0, indices.dtype), tf.constant(stop - start - 1, indices.dtype))
        inside = tf.logical_and(indices >= start, indices < stop)
        for _ in range(extra_rank):
            inside = tf.expand_dims(inside, -1)
        return [tf.identity(local, name="local"), tf.where(inside, updates, tf.zeros_like(updates), name="rows")]
    return part


def _split_update(gd: tf.compat.v1.GraphDef, node: tf.compat.v1.NodeDef, update: tf.Operation, s: Split, i: int,
                  start: int, stop: int) -> None:
    """Part ``i`` of sparse ``update`` (``node``): the same update of shard ``i``'s rows, on its device."""
    indices, values = update.inputs[1], update.inputs[2]
    if indices.shape.rank is None or values.shape.rank is None:
        raise GraphError(f"cannot split the update {update.name} of {s.placeholder}: its indices or updates have "
                         "an unknown rank; place with splits='none'")
    name = split_name(update.name, i)
    specs = [tf.TensorSpec(indices.shape, indices.dtype), tf.TensorSpec(values.shape, values.dtype)]
    nodes, phs, outs = template(_rows_update(start, stop, values.shape.rank - indices.shape.rank), specs)
    local, rows = splice(gd, nodes, phs, [node.input[1], node.input[2]], outs, name, "")
    _copy_node(gd, node, name, [split_name(s.placeholder, i), local, rows])


def _reshaped(gd: tf.compat.v1.GraphDef, reshape: tf.compat.v1.NodeDef, w: _Weight, i: int, read: str,
              size: int) -> str:
    """Part ``i``'s copy of the kernel's ``reshape`` applied to its shard's ``read`` (``size`` entries of the
    variable's split axis): ``(c, size · the rest)`` or ``(the leading axes, size)``; an ``ExpandDims`` at the
    same axis; returns its name."""
    r = gd.node.add()
    r.CopyFrom(reshape)
    r.name = split_name(w.reshape.name, i)
    shape = gd.node.add()
    shape.op = "Const"  # a helper of the part's reshape (its scope): on its device
    if reshape.op == "ExpandDims":
        shape.name, dtype = f"{r.name}/dim", tf.as_dtype(reshape.attr["Tdim"].type)
        value = tf.make_ndarray(w.reshape.inputs[1].op.get_attr("value"))
    else:
        whole = w.read.outputs[0].shape
        value = [int(whole[0]), size * int(whole[2:].num_elements())] if w.axis == 1 else [
            int(whole[:-1].num_elements()), size]
        shape.name, dtype = f"{r.name}/shape", tf.as_dtype(reshape.attr["Tshape"].type)
    shape.attr["dtype"].type = dtype.as_datatype_enum
    shape.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value, dtype))
    del r.input[:]
    r.input.extend([read, shape.name])
    return r.name


def _add_shard(gd: tf.compat.v1.GraphDef, by_name: Mapping[str, tf.compat.v1.NodeDef], placeholder: str,
               read: str | None, i: int) -> str | None:
    """Part ``i``'s copy of the weight's ``placeholder`` (its shard) and, given the weight's ``read``, a copy of
    that reading the shard; returns the read's name (``None``: no read, a lookup's part gathers from the shard)."""
    p = gd.node.add()
    p.CopyFrom(by_name[placeholder])
    p.name = split_name(placeholder, i)
    if read is None:
        return None
    r = gd.node.add()
    r.CopyFrom(by_name[read])
    r.name = split_name(read, i)
    del r.input[:]
    r.input.append(p.name)
    return r.name


def _join(node: tf.compat.v1.NodeDef, op_type: str, dtype: int, parts: Sequence[str],
          extra: Sequence[str] = ()) -> None:
    """``node`` turned, in place, into the join ``op_type`` (``AddN`` or ``ConcatV2``) of ``parts`` (then
    ``extra``: a concatenation's axis) of type ``dtype``; its control inputs kept."""
    controls = [x for x in node.input if x.startswith("^")]
    node.op = op_type
    node.ClearField("attr")
    node.attr["T"].type = dtype
    node.attr["N"].i = len(parts)
    del node.input[:]
    node.input.extend([*parts, *extra, *controls])


def _named_pairs(graph: tf.Graph, context: RewriteContext) -> dict[str, Pair]:
    """The pairs of ``context`` (its ``pairs``: first products of ``splits``), each checked: its next product
    named in ``splits`` the same ways."""
    out = {}
    for name in context.pairs:
        try:
            op = graph.get_operation_by_name(name)
        except KeyError:
            raise GraphError(f"the plan pairs {name}, which this trace does not have; place again without plan= "
                             "(or with splits='none')") from None
        captured = dict.fromkeys(context.captured)
        pair = _pair_of(op, captured) if _weight_of(op, captured) is not None else None
        if pair is None or context.splits.get(pair.op) != context.splits.get(name):
            raise GraphError(f"the plan pairs {name} with the product after it, which this trace does not have or "
                             "splits otherwise; place again without plan= (or with splits='none')")
        out[name] = pair
    return out


def _paired_nodes(graph: tf.Graph, s: Split) -> tuple[set[str], set[str]]:
    """What a pair's parts replace: the column split's join and axis, the chain, the pair's weight and bias
    reads and placeholders; and, apart, Keras' dead reads of those weights."""
    p = s.pair
    assert p is not None
    replaced = {s.op, axis_name(s.op), *p.chain, p.read, p.placeholder}
    if p.bias_read is not None:
        replaced |= {p.bias_read, p.bias_placeholder}
    dead = {c.name for ph in (p.placeholder, p.bias_placeholder) if ph is not None
            for c in graph.get_operation_by_name(ph).outputs[0].consumers()} - replaced
    return replaced, dead


def _after_parts(node: tf.compat.v1.NodeDef, parts: int) -> None:
    """A split update's whole ``node`` turned, in place, into a ``NoOp`` after its ``parts`` (what waited for it
    still does)."""
    node.op = "NoOp"
    node.ClearField("attr")
    del node.input[:]
    node.input.extend("^" + split_name(node.name, i) for i in range(parts))


def _copy_node(gd: tf.compat.v1.GraphDef, node: tf.compat.v1.NodeDef, name: str, inputs: list[str]) -> None:
    """A copy of ``node`` named ``name`` reading ``inputs`` (its control inputs kept)."""
    n = gd.node.add()
    n.CopyFrom(node)
    n.name = name
    controls = [x for x in node.input if x.startswith("^")]
    del n.input[:]
    n.input.extend(inputs + controls)


def _pair_parts(gd: tf.compat.v1.GraphDef, by_name: Mapping[str, tf.compat.v1.NodeDef], graph: tf.Graph, s: Split,
                context: RewriteContext) -> list[Shard]:
    """``s``'s pair in ``gd``: part ``i`` runs the chain on part ``i`` of the column split (the bias's columns
    from its shard) and multiplies it by its rows of the pair's weight; the pair's product becomes the ``AddN``
    of those (its consumers unchanged). Returns the shards the parts read (bias, pair's weight)."""
    p = s.pair
    assert p is not None
    b = graph.get_operation_by_name(p.op)
    rows_axis = 1 if b.get_attr("transpose_b") else 0
    out = []
    ours = {s.op, *p.chain}
    for i, (start, stop) in enumerate(s.bounds):
        for c in p.chain:
            node = by_name[c]
            if node.op == "BiasAdd":
                data = [split_name(source(node.input[0])[0], i), _add_shard(gd, by_name, p.bias_placeholder,
                                                                          p.bias_read, i)]
                out.append(Shard(split_name(p.bias_placeholder, i), p.bias_placeholder,
                                 context.devices[split_name(p.bias_placeholder, i)], start, stop, 0, pieces=True))
            else:  # the region's own inputs from this part's copies; a scalar constant shared
                data = [split_name(source(x)[0], i) if source(x)[0] in ours else x
                        for x in node.input if not x.startswith("^")]
            _copy_node(gd, node, split_name(c, i), data)
        last = by_name[p.op].input[0]
        _copy_node(gd, by_name[p.op], split_name(p.op, i), [split_name(source(last)[0], i),
                                                            _add_shard(gd, by_name, p.placeholder, p.read, i)])
        out.append(Shard(split_name(p.placeholder, i), p.placeholder, context.devices[split_name(p.placeholder, i)],
                         start, stop, rows_axis, pieces=True))
    node = by_name[p.op]
    _join(node, "AddN", node.attr["T"].type, [split_name(p.op, i) for i in range(s.parts)])
    return out


def _int_const(gd: tf.compat.v1.GraphDef, name: str, value: Sequence[int]) -> str:
    c = gd.node.add()
    c.name, c.op = name, "Const"
    c.attr["dtype"].type = tf.int32.as_datatype_enum
    c.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(list(value), tf.int32))
    return name


def _columns_of(gd: tf.compat.v1.GraphDef, dy: str, owner: str, dtype: int, start: int, stop: int) -> str:
    """A helper of part ``owner`` (its scope: on its device) slicing columns ``[start, stop)`` of the 2-D ``dy``."""
    n = gd.node.add()
    n.name, n.op = f"{owner}/dy", "Slice"
    n.attr["T"].type = dtype
    n.attr["Index"].type = tf.int32.as_datatype_enum
    n.input.extend([dy, _int_const(gd, f"{n.name}/begin", [0, start]), _int_const(gd, f"{n.name}/size",
                                                                                  [-1, stop - start])])
    return n.name


def _shard_ids(gd: tf.compat.v1.GraphDef, uss: tf.compat.v1.NodeDef, owner: str, start: int, stop: int
               ) -> list[str]:
    """Helpers of part ``owner`` of ``uss`` (an ``UnsortedSegmentSum`` of a lookup's gradient by its ids): the ids
    of rows ``[start, stop)`` made local to the shard, ``-1`` for the others (a negative id's value is dropped
    by the sum), and the shard's row count; returns the two inputs the part's sum takes after its values."""
    ids_type, rows_type = tf.as_dtype(uss.attr["Tindices"].type), tf.as_dtype(uss.attr["Tnumsegments"].type)

    def local(ids: tf.Tensor) -> list[tf.Tensor]:
        inside = tf.logical_and(ids >= tf.constant(start, ids_type), ids < tf.constant(stop, ids_type))
        return [tf.where(inside, ids - tf.constant(start, ids_type), tf.constant(-1, ids_type), name="local"),
                tf.constant(stop - start, rows_type, name="rows")]
    nodes, phs, outs = template(local, [tf.TensorSpec(None, ids_type)])
    return splice(gd, nodes, phs, [uss.input[1]], outs, f"{owner}/ids", "")


def _gradient_parts(gd: tf.compat.v1.GraphDef, by_name: Mapping[str, tf.compat.v1.NodeDef], s: Split,
                    dead: Collection[str], waits: dict[str, list[str]], devices: Mapping[str, str],
                    shards: list[Shard]) -> set[str]:
    """``s``'s gradients and update in parts (:class:`~placer.core.splits.Gradients`): part ``i`` slices its
    columns of ``dy`` and computes its weight's gradient, its share of the input's (the whole one becomes their
    ``AddN``) (a table's part: sums the ids its rows hold, :func:`_shard_ids`) and its copy of the update,
    reading and writing shard ``i`` of the weight and of each slot (``shards`` gains the slots' shards, on
    ``devices``); each whole write becomes a no-op after its parts (in ``gd``, in place; ``waits`` gains what
    replaces each removed node). Returns the nodes to remove."""
    gr = s.grads
    assert gr is not None
    region = set(gr.update)
    sharded = {s.placeholder, *gr.slots}
    rows = s.kind == "rows"

    def mapped(x: str, i: int) -> str:
        src, suffix = source(x)
        if src in sharded:
            new = split_name(src, i)
        elif src == s.read or src in dead:  # (a lookup's part reads its shard itself: no read)
            new = split_name(s.op if rows else s.read, i)
        elif src in gr.weight_grads or src in region:
            new = split_name(src, i)
        else:
            return x
        return f"^{new}" if suffix == "^" else new + suffix

    for i, (start, stop) in enumerate(s.bounds):
        for slot in gr.slots:
            _add_shard(gd, by_name, slot, None, i)
            shards.append(Shard(split_name(slot, i), slot, devices[split_name(slot, i)], start, stop,
                                0 if rows else 1, pieces=True))
        for name in gr.weight_grads:
            gw, part = by_name[name], split_name(name, i)
            if rows:  # the sum of the ids this shard's rows hold
                _copy_node(gd, gw, part, [gw.input[0], *_shard_ids(gd, gw, part, start, stop)])
            else:
                _copy_node(gd, gw, part, [gw.input[0], _columns_of(gd, gw.input[1], part, gw.attr["T"].type,
                                                                   start, stop)])
        if gr.input_grad is not None:
            gx, part = by_name[gr.input_grad], split_name(gr.input_grad, i)
            _copy_node(gd, gx, part, [_columns_of(gd, gx.input[0], part, gx.attr["T"].type, start, stop),
                                      split_name(s.read, i)])
        for name in gr.update:
            node = gd.node.add()
            node.CopyFrom(by_name[name])
            node.name = split_name(name, i)
            inputs = list(dict.fromkeys(mapped(x, i) for x in by_name[name].input))
            del node.input[:]
            node.input.extend(inputs)
    if gr.input_grad is not None:
        gx = by_name[gr.input_grad]
        _join(gx, "AddN", gx.attr["T"].type, [split_name(gr.input_grad, i) for i in range(s.parts)])
    writes = {u for u in gr.update if by_name[u].op in UPDATE_WRITES}
    for u in writes:
        _after_parts(by_name[u], s.parts)
    gone = {*gr.weight_grads, *(region - writes)}
    for u in gone:
        waits.setdefault(u, []).extend(split_name(u, i) for i in range(s.parts))
    for u in gr.unused:  # read the gradient, lead nowhere: what waits for one waits for the gradient's parts
        waits.setdefault(u, []).extend(split_name(g, i) for g in gr.weight_grads for i in range(s.parts))
    return gone | set(gr.unused) | set(gr.slots)


def split_ops(gd: tf.compat.v1.GraphDef, context: RewriteContext) -> RewriteRecord:
    """Split each op of ``context.splits`` (module docstring) in ``gd`` (in place).

    Raises
    ------
    GraphError
        A split op that is not in the trace or that its rule cannot split (its weight read elsewhere), or a
        part or shard without a planned device.
    """
    graph = context.graph
    by_name = {n.name: n for n in gd.node}
    shards: list[Shard] = []
    drop: set[str] = set()
    waits: dict[str, list[str]] = {}  # a removed node → what replaces it for those that wait for it
    pairs = _named_pairs(graph, context)
    paired = {p.op for p in pairs.values()}
    for name, parts in sorted(context.splits.items()):
        if name in paired:  # split with the product it pairs with
            continue
        try:
            op = graph.get_operation_by_name(name)
        except KeyError:
            raise GraphError(f"the plan splits {name}, which this trace does not have; place again without "
                             "plan= (or with splits='none')") from None
        w = _weight_of(op, dict.fromkeys(context.captured))
        if w is None:
            raise GraphError(f"the plan splits {name} ({op.type}), which cannot be split here: its weight is not "
                             "a captured variable read by it alone; place again without plan= (or with "
                             "splits='none')")
        index, read, ph, axis, updates = w.index, w.read, w.placeholder, w.axis, w.updates
        rule = SPLIT_RULES[op.type]
        s = _split_of(op, w, parts, pairs.get(name))
        ours = set(updates) | set(() if s.grads is None else s.grads.ops)
        dead = [c.name for c in ph.outputs[0].consumers() if c is not read and c not in ours and c.name not in ours]
        node = by_name[name]
        for i, (start, stop) in enumerate(s.bounds):
            p_name, n_name = split_name(ph.name, i), split_name(name, i)
            missing = [x for x in s.part_nodes(i) if x not in context.devices]
            if missing:
                raise GraphError(f"the plan splits {name} but places none of {missing}; solve again")
            r_name = _add_shard(gd, by_name, ph.name, None if rule.kind == "rows" else read.name, i) or n_name
            if rule.kind == "rows":
                nodes, phs, outs = template(_rows_part(start, stop, i == 0, i == parts - 1, read.outputs[0].dtype),
                                            [tf.TensorSpec(op.inputs[1].shape, op.inputs[1].dtype),
                                             tf.TensorSpec((), tf.resource)])
                out = splice(gd, nodes, phs, [node.input[1], p_name], outs, n_name, "")[0].partition(":")[0]
                next(n for n in gd.node if n.name == out).name = n_name
            else:
                part = gd.node.add()
                part.CopyFrom(node)
                part.name = n_name
                part.input[index] = r_name if w.reshape is None else _reshaped(gd, by_name[w.reshape.name], w, i,
                                                                              r_name, stop - start)
            for u in updates:
                _split_update(gd, by_name[u.name], u, s, i, start, stop)
            shards.append(Shard(p_name, ph.name, context.devices[p_name], start, stop, axis, pieces=True))
            for r in (read.name, *dead):
                waits.setdefault(r, []).append(r_name)
        for u in updates:
            _after_parts(by_name[u.name], parts)
        joined = [split_name(name, i) for i in range(parts)]
        if rule.kind == "rows":  # one part holds each id's row, the others zeros
            _join(node, "AddN", node.attr["Tparams"].type, joined)
        else:
            rank = op.outputs[0].shape.rank
            a = gd.node.add()
            a.name, a.op = axis_name(name), "Const"
            a.attr["dtype"].type = tf.int32.as_datatype_enum
            a.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(rule.join_axis % (rank if rank else 2), tf.int32))
            _join(node, "ConcatV2", node.attr["T"].type, joined, [a.name])
            node.attr["Tidx"].type = tf.int32.as_datatype_enum
        drop |= {read.name, ph.name, *dead}
        if s.grads is not None:
            drop |= _gradient_parts(gd, by_name, s, dead, waits, context.devices, shards)
        if s.pair is not None:
            shards += _pair_parts(gd, by_name, graph, s, context)
            replaced, dead_reads = _paired_nodes(graph, s)
            drop |= replaced | dead_reads
            pr = s.pair
            bias = () if pr.bias_read is None else (pr.bias_read,)
            for whole in (s.op, *pr.chain, pr.read, *bias):  # what waited for a replaced node waits for its parts
                waits.setdefault(whole, []).extend(split_name(whole, i) for i in range(parts))
            for dead_read in dead_reads:
                waits.setdefault(dead_read, []).extend(split_name(pr.read, i) for i in range(parts))
        if w.reshape is not None:  # the whole kernel's reshape, and its shape where nothing else reads it
            drop.add(w.reshape.name)
            shape = w.reshape.inputs[1].op
            if shape.type == "Const" and [c.name for c in shape.outputs[0].consumers()] == [w.reshape.name]:
                drop.add(shape.name)
    # a colocation with a removed read (a gradient's shape constant) goes with it
    left = remove_nodes(gd, drop, waits)
    if left:
        raise GraphError(f"split weights are still read by {left[:3]}")
    return RewriteRecord("split", changes=len(shards), summary=f"{len(context.splits)} ops split into "
                         f"{len(shards)} parts, each reading its weight's shard", detail=tuple(shards))


def split_graph_def(graph: tf.Graph, captured: Mapping[str, object], splits: Sequence[Split],
                    device: str = "") -> tuple[tf.compat.v1.GraphDef, tuple[Shard, ...]]:
    """``graph``'s GraphDef with ``splits`` applied, every part (and its shard) on ``device``: the split graph
    as the costs stage profiles it (:func:`placer.tf.costs.compute_costs` with ``splits``).

    Examples
    --------
    >>> import keras
    >>> from placer.tf.trace import trace_model
    >>> t = trace_model(keras.Sequential([keras.Input((8,)), keras.layers.Dense(6)]), batch_size=2)
    >>> gd, shards = split_graph_def(t.fixed.graph, t.variables, split_candidates(t.fixed.graph, t.variables, 2))
    >>> [(s.start, s.stop) for s in shards], sum(n.op == "ConcatV2" for n in gd.node)
    ([(0, 3), (3, 6)], 1)
    """
    devices = {op.name: device for op in graph.get_operations()}
    for s in splits:
        devices[axis_name(s.op)] = device
        for i in range(s.parts):
            devices.update((n, device) for n in s.part_nodes(i))
    context = RewriteContext(graph=graph, step="predict", devices=devices, captured=tuple(captured),
                             splits=split_map(splits), pairs=frozenset(pair_ops(splits)))
    gd = graph.as_graph_def()
    bypass_pass_through(gd, context)  # as emit runs it first: a training step's updates read their gradients
    return gd, split_ops(gd, context).detail


REWRITE = Rewrite("split", split_ops, applies=lambda context: bool(context.splits))
