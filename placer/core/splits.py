"""Operator splitting in the op graph (no TensorFlow): one op over several devices, its weight sharded.

A layer whose weight is read whole by one op (a dense layer's ``MatMul``)
runs on one device, however many there are: at small batch its time is the
time to stream the weight from memory, and a placement of whole ops cannot
shorten it. *Splitting* the op by its weight's output columns gives ``k``
ops, each reading ``1/k`` of the weight (its shard, a variable of its own)
and computing ``1/k`` of the output columns; a concatenation joins them
(Megatron-LM's column-parallel linear layer; Mesh-TensorFlow and GSPMD
annotate the same split).

:func:`split_graph` applies chosen :class:`Split`\\ s to a cost-annotated op
graph (``docs/graph-format.md``) *before* placement: each part, its shard's
placeholder and read become nodes of their own (a layer of their own, so
``group_by="layer"`` may put them apart), and the solver places them like
any op; parts placed together are one device's work again. The TensorFlow
rewrite that makes the same graph is :mod:`placer.tf.rewrites.split`; both
name the new nodes with :func:`split_name` so a plan made on this graph
names the emitted graph's nodes.

Costs, before any part is profiled: a part's compute is the op's measured
time times its share of the columns (a product's time is linear in its
output columns, and the weight streamed is that share); the join is a copy
of the output, timed at :data:`JOIN_BYTES_PER_S`. (:func:`placer.autoplace`
then profiles the split trace and uses its measured times: at batch 1 a
half-width matrix-vector product took 1.1-1.3× half the whole one's.) Ops
profiled with TensorFlow's graph optimizer on hold a fused kernel's time on
the last op it fused (:data:`~placer.core.attrs.FUSED_AFTER_PRODUCT_OP_TYPES`:
the bias and activation after a product): that time is the product's, so it
moves onto the parts, and those ops (no longer fused after the join) keep a
copy's time.

Examples
--------
>>> import networkx as nx
>>> g = nx.DiGraph()
>>> g.add_node("x", compute_us=1.0, op_type="Placeholder")
>>> g.add_node("w", compute_us=0.0, op_type="Placeholder", memory_bytes=4000, variable="d/kernel", colocation="w")
>>> g.add_node("r", compute_us=0.0, op_type="ReadVariableOp", colocation="w")
>>> g.add_node("d/MatMul", compute_us=100.0, op_type="MatMul", output_bytes=80)
>>> g.add_edge("x", "d/MatMul", bytes=40, tensors=("x:0",), tensor_bytes=(40,))
>>> g.add_edge("w", "r", bytes=0)
>>> g.add_edge("r", "d/MatMul", bytes=4000, tensors=("r:0",), tensor_bytes=(4000,))
>>> s = split_graph(g, [Split("d/MatMul", read="r", placeholder="w", columns=20, parts=2)])
>>> sorted(s.nodes)[:4]
['d/MatMul', 'd/MatMul/autoplace_split_0', 'd/MatMul/autoplace_split_1', 'd/MatMul/autoplace_split_axis']
>>> s.nodes["d/MatMul/autoplace_split_0"]["compute_us"], s.nodes["w/autoplace_split_1"]["memory_bytes"]
(50.0, 2000)
>>> s.nodes["d/MatMul"]["op_type"], "w" in s, "r" in s
('ConcatV2', False, False)
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace

import networkx as nx

from ..errors import GraphError
from .attrs import (
    BYTES,
    COLOCATION,
    COMPUTE_US,
    CONTROL,
    FUSED_AFTER_PRODUCT_OP_TYPES,
    FUSED_GELU_OP_TYPES,
    LAYER,
    MEMORY_BYTES,
    OP_TYPE,
    OUTPUT_BYTES,
    TENSOR_BYTES,
    TENSORS,
    VARIABLE,
)

#: The values of ``splits=`` (``placer.tf.options.SplitOptions``): split where predicted faster, never, always.
SPLITS = ("auto", "none", "all")
#: How a :class:`Split` cuts its op: ``"columns"``, a product by its weight's output columns (the parts'
#: outputs concatenated); ``"rows"``, a lookup by its table's rows (each part gathers the ids its rows hold
#: and zeros for the others; the parts' outputs summed).
SPLIT_KINDS = ("columns", "rows")
#: The scope suffix of the nodes a split adds (``{node}/autoplace_split_{i}``, ``{op}/autoplace_split_axis``).
SPLIT_SCOPE = "autoplace_split"
#: Bytes per second of the join (a concatenation copies the parts into one buffer): an assumed host-memory
#: copy speed, not a measurement.
JOIN_BYTES_PER_S = 5e9


def split_name(name: str, i: int) -> str:
    """The name of part ``i`` of node ``name`` (the op, its shard's read or placeholder).

    Examples
    --------
    >>> split_name("model/dense/MatMul", 1)
    'model/dense/MatMul/autoplace_split_1'
    """
    return f"{name}/{SPLIT_SCOPE}_{i}"


def axis_name(op: str) -> str:
    """The name of the join's axis constant of split ``op``."""
    return f"{op}/{SPLIT_SCOPE}_axis"


def helper_owner(name: str) -> str | None:
    """The split node a helper node runs with, or ``None`` where ``name`` is no split's helper.

    A split rewrite may add nodes that serve one part (a lookup's local ids and mask): they are named inside
    the part's scope, ``{split_name(op, i)}/…``, are not in the op graph (their time counts as the part's)
    and run on the part's device.

    Examples
    --------
    >>> helper_owner("emb/GatherV2/autoplace_split_1/local"), helper_owner("emb/GatherV2/autoplace_split_1")
    ('emb/GatherV2/autoplace_split_1', None)
    """
    head, sep, tail = name.partition(f"/{SPLIT_SCOPE}_")
    index, slash, _ = tail.partition("/")
    return f"{head}{sep}{index}" if sep and slash and index.isdigit() else None


def is_split_node(name: str) -> bool:
    """Whether ``name`` is a node a split added (:func:`split_name`, :func:`axis_name`)."""
    return f"/{SPLIT_SCOPE}_" in name


def split_origin(name: str) -> str:
    """The node a split's node was made from (``name`` itself for any other node).

    Examples
    --------
    >>> split_origin("model/dense/MatMul/autoplace_split_1"), split_origin("model/dense/Relu")
    ('model/dense/MatMul', 'model/dense/Relu')
    """
    return name.split(f"/{SPLIT_SCOPE}_", 1)[0]


def spread_parts(assignment: Mapping[str, str], splits: Iterable[Split], devices: Sequence[str]) -> dict[str, str]:
    """``assignment`` with part ``i`` of each split (its op, its shard's read and placeholder) on
    ``devices[i % len(devices)]``: the split's parts side by side, whatever else the plan does.

    Examples
    --------
    >>> a = dict.fromkeys(["m", "m/autoplace_split_0", "m/autoplace_split_1"], "/d:0")
    >>> out = spread_parts(a, [Split("m", read="r", placeholder="p", columns=4, parts=2)], ["/d:0", "/d:1"])
    >>> out["m"], out["m/autoplace_split_0"], out["m/autoplace_split_1"], out["p/autoplace_split_1"]
    ('/d:0', '/d:0', '/d:1', '/d:1')
    """
    out = dict(assignment)
    for s in splits:
        for i in range(s.parts):
            for name in s.part_nodes(i):
                out[name] = devices[i % len(devices)]
    return out


def rejoined(assignment: Mapping[str, str], together: Iterable[Split], nodes: Iterable[str]
             ) -> dict[str, str] | None:
    """``assignment`` (a plan of a graph with ``together`` split) for ``nodes``, the graph without them: each of
    their whole nodes (the op, its weight, read, reshape, its gradients', update's and unused gradient readers'
    ops; a pair's too) on the device of its join (a pair: its sum; the node that keeps the op's layer, which
    ``group_by="layer"`` keeps on one device with the layer's other ops), every other node where
    ``assignment`` put it; ``None`` where a node is in neither. The inverse of :func:`split_apart`.

    Examples
    --------
    >>> s = Split("b", read="r", placeholder="p", columns=4, parts=2)
    >>> plan = {"x": "/d:0", "b": "/d:1", "b/autoplace_split_0": "/d:0", "b/autoplace_split_1": "/d:1",
    ...         "p/autoplace_split_0": "/d:0", "r/autoplace_split_0": "/d:0"}
    >>> rejoined(plan, [s], ["x", "b", "p", "r"])
    {'x': '/d:0', 'b': '/d:1', 'p': '/d:1', 'r': '/d:1'}
    >>> rejoined(plan, [s], ["x", "y"]) is None
    True
    """
    whole: dict[str, str] = {}
    for s in together:
        device = assignment[s.ops[-1]]
        extra = (s.read, s.placeholder, *(() if s.reshape is None else (s.reshape,)),
                 *(() if s.grads is None else s.grads.unused))
        for name in (*extra, *(split_origin(n) for n in s.part_nodes(0))):
            whole[name] = device
    out = {}
    for name in nodes:
        device = whole.get(name, assignment.get(name))
        if device is None:
            return None
        out[name] = device
    return out


def split_apart(assignment: Mapping[str, str], splits: Iterable[Split], devices: Sequence[str],
                nodes: Iterable[str]) -> dict[str, str] | None:
    """``assignment`` (a plan of a graph without ``splits``) for ``nodes``, a graph with them applied: part ``i``
    of each on ``devices[i % len(devices)]`` (:func:`spread_parts`), its join (the op's name) and the join's
    axis where the whole op ran, every other node where ``assignment`` put it; ``None`` where a node is in
    neither. The inverse of :func:`rejoined`.

    Examples
    --------
    >>> s = Split("b", read="r", placeholder="p", columns=4, parts=2)
    >>> out = split_apart({"x": "/d:0", "b": "/d:0", "p": "/d:0", "r": "/d:0"}, [s], ["/d:0", "/d:1"],
    ...                   ["x", "b", "b/autoplace_split_1", "p/autoplace_split_1", "b/autoplace_split_axis"])
    >>> out["b"], out["b/autoplace_split_1"], out["p/autoplace_split_1"], out["b/autoplace_split_axis"]
    ('/d:0', '/d:1', '/d:1', '/d:0')
    """
    out = spread_parts(assignment, splits, devices)
    for s in splits:
        out.setdefault(axis_name(s.op), assignment.get(s.op))
    placed = {name: out.get(name) for name in nodes}
    return None if None in placed.values() else placed  # type: ignore[return-value]


def descend_splits(start: frozenset[int], start_s: float, n: int,
                   step_s: Callable[[frozenset[int], int], float | None], *, max_evaluations: int
                   ) -> tuple[frozenset[int], float, int]:
    """Which of ``n`` splittable layers to split, layer by layer: from ``start`` (the layers split; its
    predicted step ``start_s``), each round scores toggling each layer — splitting one more, or running one
    split layer whole — with ``step_s(current, i)`` (the step of ``current`` with layer ``i`` toggled, made from
    ``current``'s plan; ``None`` where that cannot be placed), and moves to the fastest toggle that is faster
    than ``current``; it stops where none is, or after ``max_evaluations`` scores (then at the fastest set
    scored). No layer set is scored twice and the empty one (every layer whole: the plan the splits are compared
    with) is never scored.

    Returns ``(layers split, its predicted step, evaluations)``: never slower than ``start`` or than any set it
    scored.

    Examples
    --------
    >>> gain = [3.0, -1.0, 2.0]  # splitting layer 0 or 2 saves time, layer 1 costs
    >>> step = lambda current, i: 10.0 - sum(gain[j] for j in current ^ {i})
    >>> descend_splits(frozenset({1}), 11.0, 3, step, max_evaluations=20)
    (frozenset({0, 2}), 5.0, 6)
    """
    current, best, evaluations = start, start_s, 0
    seen = {start}
    while True:
        move: tuple[float, frozenset[int]] | None = None
        for i in range(n):
            toggled = current ^ {i}
            if not toggled or toggled in seen:
                continue
            if evaluations >= max_evaluations:  # out of budget: the fastest toggle scored is already known
                return (current, best, evaluations) if move is None else (move[1], move[0], evaluations)
            seen.add(toggled)
            evaluations += 1
            s = step_s(current, i)
            if s is not None and s < best and (move is None or s < move[0]):
                move = (s, toggled)
        if move is None:
            return current, best, evaluations
        best, current = move


def even_parts(n: int, k: int) -> list[int]:
    """``k`` sizes summing to ``n``, the first ``n % k`` one larger.

    Examples
    --------
    >>> even_parts(10, 4)
    [3, 3, 2, 2]
    """
    if k < 1 or n < k:
        raise GraphError(f"cannot split {n} into {k} non-empty parts")
    base, extra = divmod(n, k)
    return [base + (i < extra) for i in range(k)]


def part_bounds(n: int, k: int) -> list[tuple[int, int]]:
    """``[start, stop)`` of each of :func:`even_parts` ``(n, k)``.

    Examples
    --------
    >>> part_bounds(5, 2)
    [(0, 3), (3, 5)]
    """
    out, start = [], 0
    for size in even_parts(n, k):
        out.append((start, start + size))
        start += size
    return out


def split_map(splits: Iterable["Split"]) -> dict[str, int]:
    """``Plan.splits`` of ``splits``: every op they split → its parts (a pair names both products).

    Examples
    --------
    >>> split_map([Split("a", read="r", placeholder="p", columns=4, parts=2, pair=Pair("b", "rb", "pb"))])
    {'a': 2, 'b': 2}
    """
    return {op: s.parts for s in splits for op in s.ops}


def pair_ops(splits: Iterable["Split"]) -> tuple[str, ...]:
    """``Plan.pairs`` of ``splits``: the first product of each pair (sorted).

    >>> pair_ops([Split("a", read="r", placeholder="p", columns=4, parts=2, pair=Pair("b", "rb", "pb"))])
    ('a',)
    """
    return tuple(sorted(s.op for s in splits if s.pair is not None))


@dataclass(frozen=True)
class Pair:
    """The product that takes a column split's parts as its input rows (Megatron-LM's MLP: a column-parallel
    layer, then a row-parallel one, and one sum).

    Part ``i`` of the column split runs ``chain`` (element-wise ops: a bias add with its bias's columns
    ``[start, stop)``, an activation) on its own columns, then multiplies them by rows ``[start, stop)`` of this
    product's weight; the product becomes the sum (``AddN``) of those partial products, so its consumers see
    the same tensor (the sum adds the parts in another order: equal to float rounding). The column split's
    join and the whole chain are gone: no part's output travels before the sum.

    Attributes
    ----------
    op : str
        The row-split product (its input 0 the chain's end, or the column split's op).
    read, placeholder : str
        Its weight's read and the weight variable's resource placeholder.
    chain : tuple of str
        The element-wise ops between the two products, in the graph's order: a chain (a bias add, an
        activation) or a small graph of them (GELU's ``0.5 * x * erfc(-x / √2)``, its constants scalars).
    bias_read, bias_placeholder : str or None
        The bias the chain's ``BiasAdd`` adds (split by the same columns), or ``None``.
    """

    op: str
    read: str
    placeholder: str
    chain: tuple[str, ...] = ()
    bias_read: str | None = None
    bias_placeholder: str | None = None

    def part_nodes(self, i: int) -> tuple[str, ...]:
        """The nodes of part ``i`` this pair adds (the chain's, the bias shard's, the product's and its shard's)."""
        bias = () if self.bias_placeholder is None else (self.bias_placeholder, self.bias_read)
        return tuple(split_name(n, i) for n in (*self.chain, *bias, self.placeholder, self.read, self.op))


@dataclass(frozen=True)
class Gradients:
    """A split weight's backward pass and update in a training step.

    *A product's* (``kind="columns"``): for ``y = x @ W`` split by ``W``'s columns into ``W_i``, the gradient ``dy``
    of ``y`` is cut the same way (``dy_i``, a slice each part takes); part ``i`` computes its weight's gradient
    ``x^T @ dy_i`` (a copy of the one op of ``weight_grads``), its share of the input's gradient ``dy_i @ W_i^T`` (a
    copy of ``input_grad``, which becomes the ``AddN`` of those: the sum adds the parts in another order, equal to
    float rounding) and the optimizer's element-wise update of ``W_i``.

    *A table's* (``kind="rows"``, a lookup whose optimizer updates the table densely: Adam, momentum): the
    lookup's sparse gradient (values and ids) is made dense by ``UnsortedSegmentSum`` ops (``weight_grads``: Adam
    sums the values and, apart, their squares); part ``i``'s copy of each sums only the ids its rows
    ``[start, stop)`` hold (the others dropped: id ``-1``) into a shard-sized gradient; no input gradient.

    Either way, part ``i`` then runs a copy of each op of ``update`` (its other inputs scalars shared by the
    parts: SGD's learning rate, Adam's bias corrections), reading and writing shard ``i`` of each of the
    optimizer's ``slots`` of ``W`` (Adam's moments, momentum) as it does of ``W``. No device holds the whole
    weight, its gradient or its slots.

    Attributes
    ----------
    weight_grads : tuple of str
        The ops whose outputs are the weight's gradient: a product's ``x^T @ dy`` (one ``MatMul`` with
        ``transpose_a``); a table's ``UnsortedSegmentSum`` ops summing its lookup's sparse gradient.
    input_grad : str or None
        The product ``dy @ W^T`` (``MatMul`` with ``transpose_b``) reading the weight's read, or ``None`` where
        ``x`` needs no gradient (a model input, a lookup's ids).
    update : tuple of str
        The ops from the gradient to the weight's write (``AssignSubVariableOp``), in the graph's order:
        element-wise ops on the gradient (their other inputs scalars), the write last among them. Each becomes a
        part per shard; a write's own node waits for its parts.
    unused : tuple of str
        Ops that read the gradient but lead to no write (Keras' ``Identity`` of each gradient): removed with it.
    slots : tuple of str
        The resource placeholders of the optimizer's variables shaped as ``W`` that ``update`` alone reads and
        writes (Adam's two moments): sharded as ``W`` is.
    """

    weight_grads: tuple[str, ...]
    input_grad: str | None
    update: tuple[str, ...]
    unused: tuple[str, ...] = ()
    slots: tuple[str, ...] = ()

    @property
    def nodes(self) -> tuple[str, ...]:
        """Every op this splits into parts."""
        return (*self.weight_grads, *(() if self.input_grad is None else (self.input_grad,)), *self.update)

    @property
    def ops(self) -> tuple[str, ...]:
        """Every op of the step this replaces or removes: :attr:`nodes` and :attr:`unused`."""
        return (*self.nodes, *self.unused)


@dataclass(frozen=True)
class Split:
    """One op split by its weight's output columns (or its table's rows).

    Attributes
    ----------
    op : str
        The op (a product whose second input is the weight's read, or a lookup whose first input is the
        table's read).
    read : str
        The weight's read (its only reader is ``op``).
    placeholder : str
        The weight variable's resource placeholder (read by ``read``, and otherwise only by reads nothing
        consumes).
    columns : int
        The size of the weight along the split axis: its output columns (``kind="rows"``: its rows).
    parts : int
        How many parts (2 … ``columns``).
    kind : str
        One of :data:`SPLIT_KINDS`.
    updates : tuple of str
        The sparse updates of the weight in a training step (``ResourceScatterSub``/``Add`` on its placeholder,
        ``kind="rows"``): each becomes one update per part, of the rows its shard holds, on the shard's device;
        the update's own node waits for them.
    reshape : str or None
        A ``Reshape`` between the read and the op that makes the weight 2-D (an ``EinsumDense`` kernel
        ``(c, heads, h)`` read as ``(c, heads · h)``, split along its axis 1: whole heads; or ``(heads, h, d)`` read
        as ``(heads · h, d)``, split along ``d``), or an ``ExpandDims`` (a ``Conv1D`` filter ``(k, in, out)`` read
        as ``(1, k, in, out)``); ``columns`` counts the split axis; each part reshapes its shard.
    pair : Pair or None
        The product that takes this column split's parts as its rows (no join between them), or ``None``.
    grads : Gradients or None
        In a training step: the product's gradients and its weight's update, split with it (a product read
        without a reshape, not paired); a lookup's dense gradients and its table's update (Adam, momentum).
    """

    op: str
    read: str
    placeholder: str
    columns: int
    parts: int
    kind: str = "columns"
    updates: tuple[str, ...] = ()
    reshape: str | None = None
    pair: Pair | None = None
    grads: Gradients | None = None

    def __post_init__(self) -> None:
        if self.kind not in SPLIT_KINDS:
            raise GraphError(f"{self.op}: split kind {self.kind!r} is not one of {SPLIT_KINDS}")
        if self.reshape is not None and self.kind != "columns":
            raise GraphError(f"{self.op}: only a product's weight is split through a reshape")
        if self.updates and (self.kind != "rows" or self.grads is not None):
            raise GraphError(f"{self.op}: only a lookup's table (kind='rows') is split with its sparse updates "
                             "(or its gradients' dense ones, not both)")
        if self.pair is not None and (self.kind != "columns" or self.reshape is not None):
            raise GraphError(f"{self.op}: only a product read without a reshape pairs with the next product")
        if self.grads is not None and (self.reshape is not None or self.pair is not None):
            raise GraphError(f"{self.op}: only an unpaired product read without a reshape (or a lookup) is split "
                             "with its gradients")
        if self.grads is not None and self.kind == "rows" and self.grads.input_grad is not None:
            raise GraphError(f"{self.op}: a lookup's ids have no gradient")
        if self.parts < 2 or self.parts > self.columns:
            raise GraphError(f"{self.op}: cannot split {self.columns} {self.kind} into {self.parts} parts")

    @property
    def ops(self) -> tuple[str, ...]:
        """The ops this split splits (the op, and its pair's product): the names ``Plan.splits`` holds."""
        return (self.op,) if self.pair is None else (self.op, self.pair.op)

    @property
    def placeholders(self) -> tuple[str, ...]:
        """The variables this split shards (its weight's; a pair's product weight and bias too; the optimizer's
        slots of the weight in a training step)."""
        if self.pair is None:
            return (self.placeholder, *(() if self.grads is None else self.grads.slots))
        bias = () if self.pair.bias_placeholder is None else (self.pair.bias_placeholder,)
        return (self.placeholder, self.pair.placeholder, *bias)

    @property
    def bounds(self) -> list[tuple[int, int]]:
        """Each part's columns (or rows) ``[start, stop)``."""
        return part_bounds(self.columns, self.parts)

    def part_nodes(self, i: int) -> tuple[str, ...]:
        """The nodes of part ``i``: its shard's placeholder, its read (a product's: a lookup's part gathers its
        rows from the shard itself), the part, and the part of each update (and of each gradient op).

        >>> Split("e", read="r", placeholder="p", columns=8, parts=2, kind="rows", updates=("u",)).part_nodes(1)
        ('p/autoplace_split_1', 'e/autoplace_split_1', 'u/autoplace_split_1')
        """
        reads = () if self.kind == "rows" else (self.read,) if self.reshape is None else (self.read, self.reshape)
        grads = () if self.grads is None else (*self.grads.slots, *self.grads.nodes)
        own = tuple(split_name(n, i) for n in (self.placeholder, *reads, self.op, *self.updates, *grads))
        return own if self.pair is None else own + self.pair.part_nodes(i)


def split_to_dict(s: Split) -> dict:
    """``s`` as JSON-ready data (:func:`split_from_dict` reads it back): how an export records the splits it
    can make again with another part count (:func:`resharded`).

    Examples
    --------
    >>> s = Split("e", read="r", placeholder="p", columns=8, parts=2, kind="rows", updates=("u",))
    >>> split_from_dict(split_to_dict(s)) == s
    True
    """
    out = asdict(s)
    out.pop("parts")  # the part count is the export's, chosen again at load
    return out


def split_from_dict(data: Mapping, parts: int = 2) -> Split:
    """The :class:`Split` of :func:`split_to_dict`'s ``data`` into ``parts`` parts.

    Raises
    ------
    GraphError
        ``data`` is not one (a field missing, unknown or of the wrong kind, or ``parts`` above its columns).
    """
    try:
        pair, grads = data.get("pair"), data.get("grads")
        fields = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k not in ("pair", "grads")}
        return Split(**fields, parts=parts,
                     pair=None if pair is None else Pair(**{k: tuple(v) if isinstance(v, list) else v
                                                            for k, v in pair.items()}),
                     grads=None if grads is None else Gradients(**{k: tuple(v) if isinstance(v, list) else v
                                                                  for k, v in grads.items()}))
    except (TypeError, AttributeError) as e:
        raise GraphError(f"not a recorded split ({e})") from None


def resharded(splits: Iterable[Split], parts: int) -> list[Split]:
    """``splits`` into ``parts`` parts each (fewer where a weight has fewer columns or rows); a split left with
    one part is dropped (its op runs whole).

    Examples
    --------
    >>> s = [Split("a", read="r", placeholder="p", columns=4, parts=2), Split("b", read="q", placeholder="o",
    ...                                                                     columns=2, parts=2)]
    >>> [(x.op, x.parts) for x in resharded(s, 3)], resharded(s, 1)
    ([('a', 3), ('b', 2)], [])
    """
    return [replace(s, parts=min(parts, s.columns)) for s in splits if min(parts, s.columns) >= 2]


def _scaled(costs: object, share: float) -> object:
    if isinstance(costs, dict):
        return {kind: float(us) * share for kind, us in costs.items()}
    return float(costs) * share  # type: ignore[arg-type]


def split_graph(graph: nx.DiGraph, splits: Iterable[Split]) -> nx.DiGraph:
    """A copy of ``graph`` with each of ``splits`` applied (module docstring).

    Part ``i`` of a split op ``n`` reading weight read ``r`` of placeholder ``p``: the nodes
    ``split_name(p, i)`` (a shard of the variable: its share of ``p``'s memory, colocated with its read),
    ``split_name(r, i)`` and ``split_name(n, i)`` (its share of ``n``'s time and output), on a layer of their own
    (a lookup's part ``split_name(n, i)`` gathers from the shard itself, colocated with it: no read);
    ``n`` keeps its name and consumers and becomes the join (``ConcatV2`` of the parts, with the axis constant
    ``axis_name(n)``); ``r`` and ``p`` are removed (their control successors follow each shard's read).

    Raises
    ------
    GraphError
        A split whose op, read or placeholder is not in the graph, a read or placeholder with another
        consumer, or an op split twice.
    """
    g = graph.copy()
    seen: set[str] = set()
    for s in splits:
        if s.op in seen:
            raise GraphError(f"{s.op} is split twice")
        seen.add(s.op)
        for name in (s.op, s.read, s.placeholder):
            if name not in g:
                raise GraphError(f"cannot split {s.op}: {name} is not in the graph")
        reader = s.read
        if s.reshape is not None:
            if s.reshape not in g or _data_successors(g, s.read) != [s.reshape]:
                raise GraphError(f"cannot split {s.op}: its weight's read {s.read} does not feed {s.reshape} alone")
            reader = s.reshape
        data_out = _data_successors(g, reader)
        grads = () if s.grads is None else s.grads.ops
        for u in (*s.updates, *grads, *(() if s.grads is None else s.grads.slots)):
            if u not in g:
                raise GraphError(f"cannot split {s.op}: its update or gradient {u} is not in the graph")
        readers = [s.op] + ([s.grads.input_grad] if s.grads is not None and s.grads.input_grad else [])
        if sorted(data_out) != sorted(readers) or any(
                v != s.read and v not in s.updates and v not in grads and not _dead_read(g, v)
                for v in g.successors(s.placeholder)):
            raise GraphError(f"cannot split {s.op}: its weight {s.placeholder} is read by other ops too")
        if s.pair is not None:
            if s.pair.op in seen:
                raise GraphError(f"{s.pair.op} is split twice")
            seen.add(s.pair.op)
            _check_pair(g, s)
        _split_one(g, s)
        if s.pair is not None:
            _pair_one(g, s)
    return g


def _data_successors(g: nx.DiGraph, u: str) -> list[str]:
    """The nodes that consume ``u``'s outputs (not its control successors)."""
    return [v for v in g.successors(u) if not g.edges[u, v].get(CONTROL)]


def _check_pair(g: nx.DiGraph, s: Split) -> None:
    """That ``s``'s op feeds its pair's product through the chain alone (each of its ops read only by the chain or,
    one of them, by the product; no control edge leaves them), and each weight is read there alone."""
    p = s.pair
    assert p is not None
    for name in [*p.chain, p.op, p.read, p.placeholder] + ([p.bias_read, p.bias_placeholder] if p.bias_read else []):
        if name not in g:
            raise GraphError(f"cannot pair {s.op} with {p.op}: {name} is not in the graph")
    ours = {s.op, *p.chain}
    for u in ours:
        outside = [v for v in g.successors(u) if v not in ours and v != p.op]
        if outside or any(g.edges[u, v].get(CONTROL) for v in g.successors(u)):
            raise GraphError(f"cannot pair {s.op} with {p.op}: {u} feeds other ops than the chain "
                             f"{', '.join(map(str, outside[:3]))}")
    if sum(u in ours for u in g.predecessors(p.op)) != 1:
        raise GraphError(f"cannot pair {s.op} with {p.op}: the product takes no single tensor of the chain")
    for read, ph, user in ((p.read, p.placeholder, p.op), (p.bias_read, p.bias_placeholder, None)):
        if read is None:
            continue
        if len(_data_successors(g, read)) != 1 or (user is not None and _data_successors(g, read) != [user]) or \
                any(v != read and not _dead_read(g, v) for v in g.successors(ph)):
            raise GraphError(f"cannot pair {s.op} with {p.op}: the weight {ph} is read by other ops too")


def _shard_placeholder(g: nx.DiGraph, placeholder: str, i: int, share: float, layer: str, where: str) -> str:
    """Part ``i``'s shard of variable ``placeholder``: its ``share`` of the memory, on ``layer``, its variable
    named with the slice ``where`` (``[a:b]``); returns its name."""
    ph = g.nodes[placeholder]
    p = split_name(placeholder, i)
    g.add_node(p, **{**ph, MEMORY_BYTES: int(round(ph.get(MEMORY_BYTES, 0) * share)), LAYER: layer, COLOCATION: p,
                     VARIABLE: f"{ph.get(VARIABLE, placeholder)}{where}"})
    return p


def _shard_read(g: nx.DiGraph, placeholder: str, read: str, i: int, layer: str) -> str:
    """Part ``i``'s copy of ``read`` reading its shard of ``placeholder`` (colocated with it); returns its name."""
    p, r = split_name(placeholder, i), split_name(read, i)
    g.add_node(r, **{**g.nodes[read], LAYER: layer, COLOCATION: p})
    g.add_edge(p, r, **dict(g.edges[placeholder, read]))
    return r


def _pair_one(g: nx.DiGraph, s: Split) -> None:
    """``s``'s column split (its join ``s.op``) joined by its pair instead: each part runs the chain on its
    columns and its share of the pair's product; the product becomes the ``AddN`` of those (:class:`Pair`)."""
    p = s.pair
    assert p is not None
    layer = g.nodes[s.op].get(LAYER, s.op)
    b = g.nodes[p.op]
    for v in fused_after(g, p.op):  # the pair's fused kernel's time is its product's
        b[COMPUTE_US] = _added(b.get(COMPUTE_US, 0.0), g.nodes[v].get(COMPUTE_US, 0.0))
        g.nodes[v][COMPUTE_US] = _copy_us(g.nodes[v].get(COMPUTE_US, 0.0), int(g.nodes[v].get(OUTPUT_BYTES, 0)))
    out_bytes = int(b.get(OUTPUT_BYTES, 0))
    weight_bytes = int(g.edges[p.read, p.op].get(BYTES, 0))
    ours = {s.op, *p.chain}
    last = next(u for u in g.predecessors(p.op) if u in ours)  # the region's end (or the split op itself)
    for i, (start, stop) in enumerate(s.bounds):
        share, part_layer = (stop - start) / s.columns, split_name(layer, i)
        for c in p.chain:  # in the graph's order: a chain, or a small graph of element-wise ops (GELU's)
            n = split_name(c, i)
            pb = int(round(int(g.nodes[c].get(OUTPUT_BYTES, 0)) * share))
            g.add_node(n, **{**g.nodes[c], COMPUTE_US: _scaled(g.nodes[c].get(COMPUTE_US, 0.0), share),
                             OUTPUT_BYTES: pb, LAYER: part_layer, COLOCATION: None})
            for u in list(g.predecessors(c)):
                if g.edges[u, c].get(CONTROL) or u == p.bias_read:
                    continue
                if u in ours:  # this part's copy of a region op (or the split op's part)
                    src = split_name(u, i)
                    xb = int(g.nodes[src].get(OUTPUT_BYTES, 0))
                    g.add_edge(src, n, **{BYTES: xb, TENSORS: (f"{src}:0",), TENSOR_BYTES: (xb,), CONTROL: False})
                else:  # a scalar constant, shared by the parts
                    g.add_edge(u, n, **dict(g.edges[u, c]))
            if p.bias_read is not None and p.bias_read in g.predecessors(c):
                _shard_placeholder(g, p.bias_placeholder, i, share, part_layer, f"[{start}:{stop}]")
                r = _shard_read(g, p.bias_placeholder, p.bias_read, i, part_layer)
                bb = int(round(int(g.edges[p.bias_read, c].get(BYTES, 0)) * share))
                g.add_edge(r, n, **{BYTES: bb, TENSORS: (f"{r}:0",), TENSOR_BYTES: (bb,), CONTROL: False})
        prev = split_name(last, i)
        n = split_name(p.op, i)
        g.add_node(n, **{**b, COMPUTE_US: _scaled(b.get(COMPUTE_US, 0.0), share), LAYER: part_layer,
                         COLOCATION: None})
        _shard_placeholder(g, p.placeholder, i, share, part_layer, f"[{start}:{stop}]")
        r = _shard_read(g, p.placeholder, p.read, i, part_layer)
        wb = int(round(weight_bytes * share))
        xb = int(g.nodes[prev].get(OUTPUT_BYTES, 0))
        g.add_edge(prev, n, **{BYTES: xb, TENSORS: (f"{prev}:0",), TENSOR_BYTES: (xb,), CONTROL: False})
        g.add_edge(r, n, **{BYTES: wb, TENSORS: (f"{r}:0",), TENSOR_BYTES: (wb,), CONTROL: False})
        g.add_edge(n, p.op, **{BYTES: out_bytes, TENSORS: (f"{n}:0",), TENSOR_BYTES: (out_bytes,), CONTROL: False})
    dead = [v for ph in (p.placeholder, p.bias_placeholder) if ph is not None for v in g.successors(ph)
            if v not in (p.read, p.bias_read)]
    for u in [u for u in g.predecessors(p.op) if not is_split_node(u)]:
        g.remove_edge(u, p.op)
    g.remove_nodes_from([s.op, axis_name(s.op), *p.chain, p.read, p.placeholder, *dead,
                         *([p.bias_read, p.bias_placeholder] if p.bias_read else [])])
    b[COMPUTE_US] = _copy_us(b.get(COMPUTE_US, 0.0), out_bytes * s.parts)
    b[OP_TYPE] = "AddN"


def _dead_read(g: nx.DiGraph, v: str) -> bool:
    """Whether ``v`` reads a variable for control only (nothing consumes its value: Keras' shape reads)."""
    return g.nodes[v].get(OP_TYPE) == "ReadVariableOp" and not _data_successors(g, v)


def fused_after(g: nx.DiGraph, op: str) -> list[str]:
    """The ops after ``op`` that the graph optimizer fuses into it: a chain of single-consumer ops
    (:data:`~placer.core.attrs.FUSED_AFTER_PRODUCT_OP_TYPES`: the bias add, an activation), then a GELU's
    element-wise graph (:func:`_gelu_after`) where one follows; in the graph's order, the last the one that
    holds the fused kernel's time.

    Examples
    --------
    >>> g = nx.DiGraph()
    >>> for v, t in [("m", "MatMul"), ("b", "BiasAdd"), ("h", "Mul"), ("n", "Neg"), ("s", "Mul"), ("e", "Erfc"),
    ...              ("y", "Mul"), ("c", "Const"), ("next", "MatMul")]:
    ...     g.add_node(v, op_type=t)
    >>> g.add_edges_from([("m", "b"), ("b", "h"), ("b", "n"), ("n", "s"), ("c", "s"), ("s", "e"), ("h", "y"),
    ...                   ("e", "y"), ("y", "next")])
    >>> fused_after(g, "m")
    ['b', 'h', 'n', 's', 'e', 'y']
    """
    chain, cur = [], op
    while True:
        data = _data_successors(g, cur)
        if len(data) != 1 or g.nodes[data[0]].get(OP_TYPE) not in FUSED_AFTER_PRODUCT_OP_TYPES:
            return chain + _gelu_after(g, cur)
        if [u for u in g.predecessors(data[0]) if not g.edges[u, data[0]].get(CONTROL)
                and g.nodes[u].get(OP_TYPE) not in ("ReadVariableOp", "Const")] != [cur]:
            return chain
        chain.append(cur := data[0])


def _gelu_after(g: nx.DiGraph, op: str) -> list[str]:
    """The element-wise graph of at least three ops after ``op`` (:data:`~placer.core.attrs.FUSED_GELU_OP_TYPES`,
    their other inputs constants) that ends in one op every other one leads to, in a topological order; ``[]``
    where anything else reads ``op`` or them, or they are fewer (a lone ``Mul`` is not a fused activation)."""
    region: set[str] = set()
    frontier = [op]
    while frontier:
        for v in _data_successors(g, frontier.pop()):
            if v != op and v not in region and g.nodes[v].get(OP_TYPE) in FUSED_GELU_OP_TYPES:
                region.add(v)
                frontier.append(v)
    pruned = True
    while pruned:  # an op that reads anything but the graph, ``op`` or a constant is not the activation's
        bad = {v for v in region for u in g.predecessors(v) if not g.edges[u, v].get(CONTROL)
               and u != op and u not in region and g.nodes[u].get(OP_TYPE) != "Const"}
        region -= bad
        pruned = bool(bad)
    inside = region | {op}
    if any(w not in inside for w in _data_successors(g, op)):
        return []
    exits = [v for v in region if not _data_successors(g, v) or any(w not in inside for w in _data_successors(g, v))]
    if len(region) < 3 or len(exits) != 1:
        return []
    return [v for v in nx.topological_sort(g.subgraph(inside)) if v != op]


def _copy_us(costs: object, nbytes: int) -> object:
    us = 1e6 * nbytes / JOIN_BYTES_PER_S
    return {k: us for k in costs} if isinstance(costs, dict) else us


def _added(a: object, b: object) -> object:
    if isinstance(a, dict):
        return {k: float(v) + float(b[k] if isinstance(b, dict) else b) for k, v in a.items()}  # type: ignore
    return float(a) + float(b)  # type: ignore[arg-type]


def _split_one(g: nx.DiGraph, s: Split) -> None:
    op, layer = g.nodes[s.op], g.nodes[s.op].get(LAYER, s.op)
    rows = s.kind == "rows"
    for v in [] if rows else fused_after(g, s.op):  # the fused kernel's time is the product's
        op[COMPUTE_US] = _added(op.get(COMPUTE_US, 0.0), g.nodes[v].get(COMPUTE_US, 0.0))
        g.nodes[v][COMPUTE_US] = _copy_us(g.nodes[v].get(COMPUTE_US, 0.0), int(g.nodes[v].get(OUTPUT_BYTES, 0)))
    weight_in = s.read if s.reshape is None else s.reshape  # what the op reads its weight from
    into = [(u, dict(d)) for u, _, d in g.in_edges(s.op, data=True) if u != weight_in]
    mine = {*s.updates, *(() if s.grads is None else s.grads.ops)}
    dead = [v for v in g.successors(s.placeholder) if v != s.read and v not in mine]
    controls = [(v, dict(d)) for r in (s.read, *dead) for v, d in g.adj[r].items()
                if v not in (s.op, s.reshape) and v not in mine]
    out_bytes = int(op.get(OUTPUT_BYTES, 0))
    weight = g.edges[weight_in, s.op]
    shape_consts = [] if s.reshape is None else [
        u for u in g.predecessors(s.reshape) if u != s.read and list(g.successors(u)) == [s.reshape]]
    for i, (start, stop) in enumerate(s.bounds):
        share = (stop - start) / s.columns
        # a lookup's part gathers every id (zeros where another part holds the row): its time and output whole
        work = 1.0 if rows else share
        part_layer = split_name(layer, i)
        n = split_name(s.op, i)
        p = _shard_placeholder(g, s.placeholder, i, share, part_layer,
                               f"[{start}:{stop}]" if rows else f"[:, {start}:{stop}]")
        g.add_node(n, **{**op, COMPUTE_US: _scaled(op.get(COMPUTE_US, 0.0), work), LAYER: part_layer,
                         OUTPUT_BYTES: int(round(out_bytes * work)), COLOCATION: p if rows else None})
        if rows:  # the part gathers its rows from its shard (a resource op: on the shard's device)
            r = n
            g.add_edge(p, n, **dict(g.edges[s.placeholder, s.read]))
        else:
            r = _shard_read(g, s.placeholder, s.read, i, part_layer)
            wb = int(round(weight.get(BYTES, 0) * share))
            src = r
            if s.reshape is not None:  # the shard's read, reshaped as the whole weight was
                src = split_name(s.reshape, i)
                g.add_node(src, **{**g.nodes[s.reshape], LAYER: part_layer, COLOCATION: None})
                g.add_edge(r, src, **{BYTES: wb, TENSORS: (f"{r}:0",), TENSOR_BYTES: (wb,), CONTROL: False})
            g.add_edge(src, n, **{BYTES: wb, TENSORS: (f"{src}:0",), TENSOR_BYTES: (wb,), CONTROL: False})
        for u, d in into:
            g.add_edge(u, n, **d)
        pb = int(round(out_bytes * work))
        g.add_edge(n, s.op, **{BYTES: pb, TENSORS: (f"{n}:0",), TENSOR_BYTES: (pb,), CONTROL: False})
        for v, d in controls:
            g.add_edge(r, v, **d)
        for u in s.updates:  # the rows of each update this shard holds (the others add zeros): on its device
            un = split_name(u, i)
            g.add_node(un, **{**g.nodes[u], LAYER: part_layer, COLOCATION: p})
            g.add_edge(p, un, **dict(g.edges[s.placeholder, u]))
            for w, _, d in list(g.in_edges(u, data=True)):
                if w != s.placeholder and not is_split_node(w):
                    g.add_edge(w if w not in (s.read, *dead) else r, un, **d)
            g.add_edge(un, u, **{BYTES: 0, CONTROL: True})
    if s.grads is not None:
        _split_grads(g, s, [split_name(s.op if rows else s.read, i) for i in range(s.parts)], dead)
    for u in s.updates:
        _after_parts(g, u)
    if not rows:
        axis = axis_name(s.op)
        g.add_node(axis, **{OP_TYPE: "Const", COMPUTE_US: _scaled(op.get(COMPUTE_US, 0.0), 0.0), OUTPUT_BYTES: 4,
                            MEMORY_BYTES: 0, LAYER: layer, COLOCATION: None})
        g.add_edge(axis, s.op, **{BYTES: 4, TENSORS: (f"{axis}:0",), TENSOR_BYTES: (4,), CONTROL: False})
    for u, _ in into:
        g.remove_edge(u, s.op)
    g.remove_nodes_from([s.read, s.placeholder, *dead, *([s.reshape] if s.reshape else []), *shape_consts])
    op[COMPUTE_US] = _copy_us(op.get(COMPUTE_US, 0.0), out_bytes * (s.parts if rows else 1))
    op[OP_TYPE] = "AddN" if rows else "ConcatV2"


def _after_parts(g: nx.DiGraph, u: str) -> None:
    """A split update's whole node ``u`` made a no-op that only waits for its parts (their control edges into it,
    added by the caller, are what it keeps of its inputs; what waited for it still does)."""
    for w in [w for w in g.predecessors(u) if not is_split_node(w)]:
        g.remove_edge(w, u)
    g.nodes[u].update({OP_TYPE: "NoOp", COMPUTE_US: _scaled(g.nodes[u].get(COMPUTE_US, 0.0), 0.0),
                       OUTPUT_BYTES: 0, MEMORY_BYTES: 0, COLOCATION: None})


def _renamed(d: Mapping, name: str, i: int, share: float) -> dict:
    """Edge data ``d`` out of ``name`` as out of its part ``i`` (its tensors renamed, its bytes scaled)."""
    out = dict(d)
    if not d.get(CONTROL):
        out[BYTES] = int(round(int(d.get(BYTES, 0)) * share))
        out[TENSORS] = tuple(split_name(name, i) + t[len(name):] for t in d.get(TENSORS, ()))
        out[TENSOR_BYTES] = tuple(int(round(int(b) * share)) for b in d.get(TENSOR_BYTES, ()))
    return out


def _split_grads(g: nx.DiGraph, s: Split, reads: Sequence[str], dead: Sequence[str]) -> None:
    """``s``'s backward pass and update in parts (:class:`Gradients`): part ``i``'s copy of the weight's gradient
    (its inputs whole: the part slices ``dy``, or a table's part picks its ids, itself) and of the input's
    gradient (reading shard read ``reads[i]``; the whole one becomes their ``AddN``), and its copy of each update
    op (its write on shard ``i``, the whole write a no-op after its parts)."""
    gr = s.grads
    assert gr is not None
    region = set(gr.update)
    sharded = {s.placeholder, *gr.slots}
    layer = g.nodes[s.op].get(LAYER, s.op)
    for i, (start, stop) in enumerate(s.bounds):
        share, part_layer = (stop - start) / s.columns, split_name(layer, i)
        for slot in gr.slots:
            _shard_placeholder(g, slot, i, share, part_layer,
                               f"[{start}:{stop}]" if s.kind == "rows" else f"[:, {start}:{stop}]")
        for name in gr.nodes:
            d = g.nodes[name]
            whole_out = name == gr.input_grad  # a partial sum of the whole input gradient
            resource = next((u for u in g.predecessors(name) if u in sharded), None)  # a read's or a write's
            group = resource if resource is not None else d.get(COLOCATION) if d.get(COLOCATION) in sharded else None
            out_bytes = int(d.get(OUTPUT_BYTES, 0))
            g.add_node(split_name(name, i), **{
                **d, COMPUTE_US: _scaled(d.get(COMPUTE_US, 0.0), share), LAYER: part_layer,
                OUTPUT_BYTES: out_bytes if whole_out else int(round(out_bytes * share)),
                COLOCATION: split_name(group, i) if group is not None else d.get(COLOCATION)})
        for name in gr.nodes:
            n = split_name(name, i)
            for u, _, d in list(g.in_edges(name, data=True)):
                if u in sharded:
                    g.add_edge(split_name(u, i), n, **dict(d))
                elif u == s.read or u in dead:
                    if d.get(CONTROL):
                        g.add_edge(reads[i], n, **dict(d))
                    else:  # the input gradient reads the shard
                        g.add_edge(reads[i], n, **_renamed(d, u, i, share) | {TENSORS: (f"{reads[i]}:0",)})
                elif u in gr.weight_grads or u in region:
                    g.add_edge(split_name(u, i), n, **_renamed(d, u, i, share))
                elif not is_split_node(u):  # x and dy (whole: the part slices dy), a shared scalar
                    g.add_edge(u, n, **dict(d))
            for v, d in g.adj[name].items():
                if d.get(CONTROL) and v not in region and not is_split_node(v):
                    g.add_edge(n, v, **dict(d))
            if name == gr.input_grad:
                ob = int(g.nodes[name].get(OUTPUT_BYTES, 0))
                g.add_edge(n, name, **{BYTES: ob, TENSORS: (f"{n}:0",), TENSOR_BYTES: (ob,), CONTROL: False})
    if gr.input_grad is not None:  # the whole input gradient: the sum of the parts'
        x = g.nodes[gr.input_grad]
        for u in [u for u in g.predecessors(gr.input_grad) if not is_split_node(u)]:
            g.remove_edge(u, gr.input_grad)
        x[COMPUTE_US] = _copy_us(x.get(COMPUTE_US, 0.0), int(x.get(OUTPUT_BYTES, 0)) * s.parts)
        x[OP_TYPE] = "AddN"
    writes = [u for u in gr.update if sharded & set(g.predecessors(u)) and not _data_successors(g, u)]
    for u in writes:
        for i in range(s.parts):
            g.add_edge(split_name(u, i), u, **{BYTES: 0, CONTROL: True})
        _after_parts(g, u)
    g.remove_nodes_from([*gr.weight_grads, *(u for u in gr.update if u not in writes), *gr.unused, *gr.slots])


def _slowest_us(costs: object) -> float:
    return max((float(v) for v in costs.values()), default=0.0) if isinstance(costs, dict) else float(costs)


def split_saving_s(graph: nx.DiGraph, s: Split, bandwidth_bytes_per_s: float, latency_s: float) -> float:
    """An optimistic bound, before any part is profiled, of the step time that splitting ``s`` over ``s.parts``
    devices can save: its op's time (and the fused ops' after it; a pair: both products') shared perfectly
    between the parts, less the transfers every split makes — the op's other inputs sent to ``parts - 1``
    devices and the parts' outputs gathered (a pair's partial sums are the whole output each) at
    ``bandwidth_bytes_per_s``, two transfers' ``latency_s``. Negative: the split cannot pay. A lookup split
    by rows saves nothing (each part gathers every id).

    Examples
    --------
    >>> g = nx.DiGraph()
    >>> g.add_node("x", compute_us=0.0, output_bytes=4096)
    >>> g.add_node("m", compute_us=1000.0, output_bytes=4096)
    >>> g.add_edge("x", "m", bytes=4096)
    >>> g.add_edge("r", "m", bytes=10**6)
    >>> s = Split("m", read="r", placeholder="p", columns=8, parts=2)
    >>> round(split_saving_s(g, s, 1e9, 1e-4) * 1e6)  # 500 µs saved, 4096 + 2048 bytes and 2 latencies spent
    294
    >>> split_saving_s(g, s, 1e6, 1e-4) < 0  # at 1 MB/s the transfers cost more
    True
    """
    if s.kind == "rows":
        return 0.0
    k = s.parts
    ops = [s.op, *fused_after(graph, s.op)]
    if s.pair is not None:
        ops += [s.pair.op, *fused_after(graph, s.pair.op)]
    if s.grads is not None:
        ops += [n for n in s.grads.nodes if n in graph]
    work_s = 1e-6 * sum(_slowest_us(graph.nodes[n].get(COMPUTE_US, 0.0)) for n in ops)
    weight_in = s.reshape if s.reshape is not None else s.read
    inputs = sum(int(d.get(BYTES, 0)) for u, _, d in graph.in_edges(s.op, data=True)
                 if u != weight_in and not d.get(CONTROL))
    out = int(graph.nodes[s.pair.op if s.pair is not None else s.op].get(OUTPUT_BYTES, 0))
    gathered = out * (k - 1) if s.pair is not None else out * (k - 1) / k
    return work_s * (1 - 1 / k) - (inputs * (k - 1) + gathered) / bandwidth_bytes_per_s - 2 * latency_s


def with_measured_parts(split: nx.DiGraph, measured: nx.DiGraph, whole: nx.DiGraph, splits: Iterable[Split]
                        ) -> nx.DiGraph:
    """``split`` (``whole`` with ``splits`` applied) with the op times of ``measured`` (a graph with at least
    these splits applied, its times profiled) on what the splits changed: their parts and shards' reads, their
    joins and the ops fused after them in ``whole``; every other op keeps ``whole``'s time. So one profile
    of every candidate split serves each subset of them.

    Examples
    --------
    >>> g = nx.DiGraph()
    >>> g.add_node("w", compute_us=0.0, op_type="Placeholder", memory_bytes=64)
    >>> g.add_node("r", compute_us=0.0, op_type="ReadVariableOp")
    >>> g.add_node("m", compute_us=8.0, op_type="MatMul", output_bytes=8)
    >>> g.add_node("other", compute_us=5.0, op_type="Softmax")
    >>> g.add_edges_from([("w", "r"), ("r", "m"), ("m", "other")], bytes=8)
    >>> s = [Split("m", read="r", placeholder="w", columns=4, parts=2)]
    >>> profiled = split_graph(g, s)
    >>> for v in profiled:
    ...     profiled.nodes[v]["compute_us"] = 1.0
    >>> out = with_measured_parts(split_graph(g, s), profiled, g, s)
    >>> out.nodes["m/autoplace_split_0"]["compute_us"], out.nodes["m"]["compute_us"], out.nodes["other"]["compute_us"]
    (1.0, 1.0, 5.0)
    """
    out = split.copy()
    changed: set[str] = set()
    for s in splits:
        changed |= {s.op, axis_name(s.op), *s.updates, *([] if s.kind == "rows" else fused_after(whole, s.op)),
                    *(() if s.grads is None else s.grads.nodes)}
        if s.pair is not None:
            changed |= {s.pair.op, *fused_after(whole, s.pair.op)}
        changed |= {n for i in range(s.parts) for n in s.part_nodes(i)}
    for v in changed:
        if v in out and v in measured:
            out.nodes[v][COMPUTE_US] = measured.nodes[v][COMPUTE_US]
    return out
