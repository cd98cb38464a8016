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
(:meth:`placer.tf.placement.ReplicatedVariable.view_on`): the weight is
sharded, no device reads it whole.

Which ops can be split, and how, is per-op knowledge: :data:`SPLIT_RULES`
(op type → :class:`SplitRule`). Dense products (``MatMul``) are split by
output columns: a part computes ``x @ W[:, start:stop]``, every output element
the same dot product as the whole op's (bit-exact where the kernel sums each
dot product the same way at the narrower width; oneDNN's blocking may
change the order, within float rounding).

Applies when ``context.splits`` names ops. Record detail: the shards
(:class:`Shard`) the caller feeds.
"""

from __future__ import annotations

from typing import Callable, Mapping
from dataclasses import dataclass

import tensorflow as tf

from ...core.splits import Split, axis_name, split_name
from ...errors import GraphError, PlanError
from ..graphdef import source
from .base import Rewrite, RewriteContext, RewriteRecord


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
    """

    placeholder: str
    variable: str
    device: str
    start: int
    stop: int
    axis: int

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
    """

    weight: Callable[[tf.Operation], tuple[int, int] | None]
    join_axis: int = -1


def _matmul_weight(op: tf.Operation) -> tuple[int, int] | None:
    if op.get_attr("transpose_a"):
        return None
    return 1, 0 if op.get_attr("transpose_b") else 1


#: Op type → its split rule. Dense products by output columns; embeddings, convolutions and
#: ``BatchMatMulV2``/``Einsum`` are not split yet (``docs/limitations.md``).
SPLIT_RULES: Mapping[str, SplitRule] = {"MatMul": SplitRule(_matmul_weight)}


def _weight_of(op: tf.Operation, captured: Mapping[str, object]
               ) -> tuple[int, tf.Operation, tf.Operation, int] | None:
    """``(input index, read, placeholder, weight axis)`` of a splittable ``op`` whose weight is a captured variable
    read by it alone, else ``None``."""
    rule = SPLIT_RULES.get(op.type)
    found = rule.weight(op) if rule is not None else None
    if found is None:
        return None
    index, axis = found
    read = op.inputs[index].op
    if read.type != "ReadVariableOp" or read.inputs[0].op.name not in captured:
        return None
    ph = read.inputs[0].op
    if [c.name for c in read.outputs[0].consumers()] != [op.name] or \
            [c.name for c in ph.outputs[0].consumers()] != [read.name]:
        return None
    return index, read, ph, axis


def splittable(graph: tf.Graph, op: str, captured: Mapping[str, object]) -> bool:
    """Whether ``graph`` has ``op`` and its rule can split it there (its weight a variable of ``captured`` that
    it alone reads)."""
    try:
        return _weight_of(graph.get_operation_by_name(op), captured) is not None
    except KeyError:
        return False


def split_candidates(graph: tf.Graph, captured: Mapping[str, object], parts: int | Mapping[str, int],
                     min_weight_bytes: int = 0) -> list[Split]:
    """The ops of ``graph`` that can be split ``parts`` ways (:data:`SPLIT_RULES`), whose weight (a captured
    variable of ``captured`` read by that op alone) holds at least ``min_weight_bytes``, as
    :class:`~placer.core.splits.Split`\\ s. ``parts`` may name the ops (op → parts, a saved plan's
    ``splits``): only those, each its way.

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
    out = []
    for op in graph.get_operations():
        if named is not None and op.name not in named:
            continue
        k = named[op.name] if named is not None else int(parts)  # type: ignore[arg-type]
        found = _weight_of(op, captured)
        shape = found[1].outputs[0].shape if found is not None else None
        if found is None or shape.rank != 2 or not shape.is_fully_defined():
            continue
        _, read, ph, axis = found
        columns = int(shape[axis])
        if shape.num_elements() * read.outputs[0].dtype.size < min_weight_bytes or columns < k:
            continue
        out.append(Split(op.name, read=read.name, placeholder=ph.name, columns=columns, parts=k))
    if named is not None and len(out) != len(named):
        missing = sorted(set(named) - {s.op for s in out})
        raise PlanError(f"the plan splits {missing[:3]}, which this model's trace does not have or cannot split "
                        "that many ways; solve again without plan=")
    return out


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
    renamed_controls: dict[str, list[str]] = {}
    for name, parts in sorted(context.splits.items()):
        try:
            op = graph.get_operation_by_name(name)
        except KeyError:
            raise GraphError(f"the plan splits {name}, which this trace does not have; place again without "
                             "plan= (or with splits='none')") from None
        found = _weight_of(op, dict.fromkeys(context.captured))
        if found is None:
            raise GraphError(f"the plan splits {name} ({op.type}), which cannot be split here: its weight is not "
                             "a captured variable read by it alone; place again without plan= (or with "
                             "splits='none')")
        index, read, ph, axis = found
        columns = int(read.outputs[0].shape[axis])
        s = Split(name, read=read.name, placeholder=ph.name, columns=columns, parts=parts)
        node = by_name[name]
        for i, (start, stop) in enumerate(s.bounds):
            p_name, r_name, n_name = split_name(ph.name, i), split_name(read.name, i), split_name(name, i)
            missing = [x for x in (p_name, r_name, n_name) if x not in context.devices]
            if missing:
                raise GraphError(f"the plan splits {name} but places none of {missing}; solve again")
            p = gd.node.add()
            p.CopyFrom(by_name[ph.name])
            p.name = p_name
            r = gd.node.add()
            r.CopyFrom(by_name[read.name])
            r.name = r_name
            del r.input[:]
            r.input.append(p_name)
            part = gd.node.add()
            part.CopyFrom(node)
            part.name = n_name
            part.input[index] = r_name
            shards.append(Shard(p_name, ph.name, context.devices[p_name], start, stop, axis))
            renamed_controls.setdefault("^" + read.name, []).append("^" + r_name)
        rank = op.outputs[0].shape.rank
        join_axis = SPLIT_RULES[op.type].join_axis % (rank if rank else 2)
        a = gd.node.add()
        a.name, a.op = axis_name(name), "Const"
        a.attr["dtype"].type = tf.int32.as_datatype_enum
        a.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(join_axis, tf.int32))
        controls = [x for x in node.input if x.startswith("^")]
        node.op = "ConcatV2"
        dtype = node.attr["T"].type
        node.ClearField("attr")
        node.attr["T"].type = dtype
        node.attr["N"].i = parts
        node.attr["Tidx"].type = tf.int32.as_datatype_enum
        del node.input[:]
        node.input.extend([split_name(name, i) for i in range(parts)] + [a.name] + controls)
        drop |= {read.name, ph.name}
    for n in gd.node:
        if any(x in renamed_controls for x in n.input):
            new = [y for x in n.input for y in renamed_controls.get(x, [x])]
            del n.input[:]
            n.input.extend(new)
    left = [n.name for n in gd.node if n.name not in drop and any(source(x)[0] in drop for x in n.input)]
    if left:
        raise GraphError(f"split weights are still read by {left[:3]}")
    keep = [n for n in gd.node if n.name not in drop]
    del gd.node[:]
    gd.node.extend(keep)
    return RewriteRecord("split", changes=len(shards), summary=f"{len(context.splits)} ops split into "
                         f"{len(shards)} parts, each reading its weight's shard", detail=tuple(shards))


def split_graph_def(graph: tf.Graph, captured: Mapping[str, object], splits: Mapping[str, int],
                    device: str = "") -> tuple[tf.compat.v1.GraphDef, tuple[Shard, ...]]:
    """``graph``'s GraphDef with ``splits`` applied, every part (and its shard) on ``device``: the split graph
    as the costs stage profiles it (:func:`placer.tf.costs.compute_costs` with ``splits``).

    Examples
    --------
    >>> import keras
    >>> from placer.tf.trace import trace_model
    >>> t = trace_model(keras.Sequential([keras.Input((8,)), keras.layers.Dense(6)]), batch_size=2)
    >>> gd, shards = split_graph_def(t.fixed.graph, t.variables, {s.op: 2 for s in split_candidates(
    ...     t.fixed.graph, t.variables, 2)})
    >>> [(s.start, s.stop) for s in shards], sum(n.op == "ConcatV2" for n in gd.node)
    ([(0, 3), (3, 6)], 1)
    """
    found = split_candidates(graph, captured, splits)
    devices = {op.name: device for op in graph.get_operations()}
    for s in found:
        devices[axis_name(s.op)] = device
        for i in range(s.parts):
            devices.update((split_name(n, i), device) for n in (s.op, s.read, s.placeholder))
    context = RewriteContext(graph=graph, step="predict", devices=devices, captured=tuple(captured), splits=splits)
    gd = graph.as_graph_def()
    return gd, split_ops(gd, context).detail


REWRITE = Rewrite("split", split_ops, applies=lambda context: bool(context.splits))
