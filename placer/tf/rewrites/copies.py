"""Rewrite (schedule): a forward pass as ``m`` micro-batch copies of the placed graph, each device's in order.

A plan that cuts a chain of layers into pipeline stages cannot speed up one
batch: every stage waits for the one before. Split the batch into ``m``
micro-batches and the stages work on different micro-batches at once
(GPipe's forward schedule). :func:`copy_microbatches` builds that graph from
the placed ``GraphDef`` (devices already on its nodes):

* every node is copied once per micro-batch (``mb{i}/…``), except the
  captured placeholders (variables, constants), which the copies share;
* each device's work is ordered by gates
  (:func:`placer.tf.rewrites.gates.add_gates`): a device finishes
  micro-batch ``i`` before it starts ``i + 1``.

The placed function (:func:`placer.tf.emit.import_function`) then splits
each input along the batch (sizes as even as the batch allows:
:func:`microbatch_sizes`, so a short last batch of ``predict`` works too),
feeds copy ``i`` its part and concatenates each output. Each micro-batch runs
the very kernels the unsplit model runs on a batch of that size, so the
outputs are bit-exact against the original model run on the same
micro-batches; against the whole batch they agree to rounding (a kernel may
sum in another order at another batch size). Applies to forward passes with
``context.microbatches > 1`` or data-parallel ``context.replicas``.

With ``R`` replicas (:class:`~placer.tf.rewrites.base.RewriteContext`'s
``replicas``: each group's devices) the graph is copied ``R × m`` times:
copy ``c`` runs on group ``c // m``, each node on its planned device's twin
there. The variables' reads are shared: a group's copies read a *mirror*
of each variable on the group's own device (``context.mirrored``: a
placeholder ``autoplace_mirror_{g}/…`` and its read, fed by the caller with
a copy of the variable it keeps equal to it, as each device holds its own
copy of the weights in data parallelism), or, for a variable not mirrored,
the variable where it lives (read once per step, sent to each group once).
Each device gates its own copies. This is data parallelism for
inference, emitted as what a micro-batch pipeline already is: the outputs
are each copy's rows, as exact as micro-batches. The simulator's twin is
:func:`placer.core.replicas.replicated_schedule`. Record: the nodes and gates added.

Examples
--------
>>> microbatch_sizes(10, 4)
[3, 3, 2, 2]
"""

from __future__ import annotations

from typing import Collection, Mapping, Sequence

import tensorflow as tf

from ...core.splits import is_split_node

from ...errors import GraphError
from ..graphdef import copy_name, mirror_name, source
from .base import Rewrite, RewriteContext, RewriteRecord
from .gates import add_gates


def microbatch_sizes(batch: int, m: int) -> list[int]:
    """``m`` sizes summing to ``batch``, the first ``batch % m`` one larger."""
    base, extra = divmod(batch, m)
    return [base + (i < extra) for i in range(m)]


def _renamed(name: str, shared: set[str], i: int, renames: Mapping[str, str]) -> str:
    node, suffix = source(name)
    new = renames[node] if node in renames else node if node in shared else copy_name(i, node)
    return "^" + new if suffix == "^" else new + suffix


def pipeline_graph_def(gd: tf.compat.v1.GraphDef, m: int, shared: Sequence[str],
                       inputs: Sequence[str] = (), homes: Sequence[Mapping[str, str]] = (),
                       renames: Sequence[Mapping[str, str]] = ()) -> int:
    """Replace the placed ``gd`` (in place) by ``m`` copies of it (``mb{i}/…``), gated per device between
    consecutive copies; returns the gates added.

    Parameters
    ----------
    gd : GraphDef
        The placed graph (every node has its device).
    m : int
        Micro-batches (≥ 1).
    shared : sequence of str
        Nodes kept once and shared by the copies (the captured placeholders).
    inputs : sequence of str
        The input placeholders (copied, and fed per micro-batch): an op that
        reads one starts a stage on its device, so it waits for the gate.
    homes : sequence of Mapping[str, str]
        Per copy (``m`` of them when given): device → the device that copy's nodes run on instead (a
        device not named stays). Empty: every copy on the planned devices.
    renames : sequence of Mapping[str, str]
        Per copy (when given): a shared node → the shared node that copy reads instead (a group's mirror).

    Raises
    ------
    GraphError
        A node without a device, or ``m`` below 1.

    Examples
    --------
    >>> gd = tf.compat.v1.GraphDef()
    >>> for name, inputs, device in [("x", [], "/CPU:0"), ("w", [], "/CPU:0"), ("a", ["x", "w"], "/CPU:0"),
    ...                              ("b", ["a"], "/CPU:1")]:
    ...     _ = gd.node.add(name=name, op="Placeholder" if not inputs else "MatMul", input=inputs, device=device)
    >>> pipeline_graph_def(gd, 2, shared=["w"], inputs=["x"])
    2
    >>> [n.name for n in gd.node if not n.name.startswith("autoplace_gate")]
    ['w', 'mb0/x', 'mb0/a', 'mb0/b', 'mb1/x', 'mb1/a', 'mb1/b']
    """
    if m < 1:
        raise GraphError(f"microbatches must be at least 1, got {m}")
    if homes and len(homes) != m:
        raise GraphError(f"{len(homes)} device maps for {m} copies")
    shared_set = set(shared)
    out = tf.compat.v1.GraphDef()
    key_of: dict[str, tuple[int, str]] = {}
    for n in gd.node:
        if n.name in shared_set:
            out.node.add().CopyFrom(n)
    for i in range(m):
        for n in gd.node:
            if n.name in shared_set:
                continue
            c = out.node.add()
            c.CopyFrom(n)
            c.name = copy_name(i, n.name)
            if homes:
                c.device = homes[i].get(n.device, n.device)
            del c.input[:]
            c.input.extend(_renamed(x, shared_set, i, renames[i] if renames else {}) for x in n.input)
            key_of[c.name] = (i, "forward")
    del gd.node[:]
    gd.node.extend(out.node)
    return add_gates(gd, key_of, fed=[copy_name(i, x) for i in range(m) for x in inputs])


def shared_reads(gd: tf.compat.v1.GraphDef, captured: Sequence[str]) -> list[str]:
    """The ``ReadVariableOp`` nodes of ``gd`` that read a ``captured`` placeholder (and nothing else)."""
    captured_set = set(captured)
    return [n.name for n in gd.node if n.op == "ReadVariableOp" and n.input
            and all(source(x)[0] in captured_set for x in n.input)]


def copy_count(context: RewriteContext) -> int:
    """How many copies the ``copies`` rewrite makes of ``context``'s graph: micro-batches × replicas."""
    return context.microbatches * max(len(context.replicas), 1)


def add_mirrors(gd: tf.compat.v1.GraphDef, reads: Sequence[str], mirrored: Collection[str],
                homes: Sequence[Mapping[str, str]]) -> tuple[list[dict[str, str]], tuple[tuple[str, str, str], ...]]:
    """Per data-parallel group after the first (``homes``: per group, a first-group device → its twin there):
    a placeholder for each ``mirrored`` variable read by ``reads`` and a read of it, on the group's twin of the
    variable's device (added to ``gd``). Returns, per group, the read → its mirror's read, and the mirrors
    ``(placeholder, variable placeholder, device)``."""
    by_name = {n.name: n for n in gd.node}
    renames: list[dict[str, str]] = [{}]
    mirrors: list[tuple[str, str, str]] = []
    for g, home in enumerate(homes[1:], start=1):
        made: dict[str, str] = {}
        renames.append({})
        for r in reads:
            read = by_name[r]
            ph = source(read.input[0])[0]
            if ph not in mirrored:
                continue
            device = home.get(read.device, read.device)
            if ph not in made:
                p = gd.node.add()
                p.CopyFrom(by_name[ph])
                p.name, p.device = mirror_name(g, ph), device
                made[ph] = p.name
                mirrors.append((p.name, ph, device))
            c = gd.node.add()
            c.CopyFrom(read)
            c.name, c.device = mirror_name(g, r), device
            del c.input[:]
            c.input.extend(made[ph] if source(x)[0] == ph else x for x in read.input)
            renames[g][r] = c.name
    return renames, tuple(mirrors)


def copy_microbatches(gd: tf.compat.v1.GraphDef, context: RewriteContext) -> RewriteRecord:
    """:func:`pipeline_graph_def` with the context's micro-batches, replicas (and their mirrors), captures and
    inputs. Record detail: the mirrors ``(placeholder, variable placeholder, device)`` the caller feeds."""
    before = len(gd.node)
    m, groups = context.microbatches, context.replicas
    # the weight shards of split ops (the split rewrite's placeholders) are captured too
    shared: list[str] = [*context.captured,
                         *(n.name for n in gd.node if n.op == "Placeholder" and is_split_node(n.name))]
    homes: list[dict[str, str]] = []
    renames: list[dict[str, str]] = []
    mirrors: tuple[tuple[str, str, str], ...] = ()
    if len(groups) > 1:
        group_homes = [dict(zip(groups[0], g)) for g in groups]
        reads = shared_reads(gd, shared)
        by_group, mirrors = add_mirrors(gd, reads, context.mirrored, group_homes)
        shared += reads + [ph for ph, _, _ in mirrors] + [r for rn in by_group for r in rn.values()]
        homes = [group_homes[c // m] for c in range(m * len(groups))]
        renames = [by_group[c // m] for c in range(m * len(groups))]
    gates = pipeline_graph_def(gd, copy_count(context), shared, inputs=[source(x)[0] for x in context.inputs],
                               homes=homes, renames=renames)
    what = f"{len(groups)} data-parallel groups × " if len(groups) > 1 else ""
    return RewriteRecord("copies", changes=len(gd.node) - before,
                         summary=f"{what}{m} micro-batch copies, {gates} gates"
                         + (f", {len(mirrors)} mirrored variables" if mirrors else ""), detail=mirrors)


REWRITE = Rewrite("copies", copy_microbatches,
                  applies=lambda context: context.step == "predict" and copy_count(context) > 1, schedule=True)
