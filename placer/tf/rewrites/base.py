"""The contract of a rewrite: ``rewrite(graph_def, context) -> record``, run in a declared order.

Every change :func:`placer.tf.emit.emit` makes to a traced graph is a
*rewrite*: one function in one file of this folder that takes the GraphDef
(changed in place) and one frozen :class:`RewriteContext` — everything the
plan, the devices and the options say about this function, built once per
emitted function — and returns a small :class:`RewriteRecord` of what it did
(the log, the report, the export read the records). A :class:`Rewrite`
names the function, says when it applies and whether it is part of the
*placed graph* (what an export stores) or of the *schedule* (how the placed
graph runs on these devices: the planned order, micro-batch copies,
acknowledged sends), which :func:`placer.tf.export.load` applies again for
the devices it loads on. :func:`run_rewrites` runs a list in order and puts
the failing rewrite's name on its error.

The list that runs is declared once, :data:`placer.tf.rewrites.REWRITES`;
adding a rewrite is one new file with a :class:`Rewrite` and one line there.

Examples
--------
A rewrite that changes nothing and records its visit:

>>> import tensorflow as tf
>>> def visit(gd, ctx):
...     return RewriteRecord("visit", changes=0, summary=f"saw {len(gd.node)} nodes")
>>> gd = tf.compat.v1.GraphDef()
>>> _ = gd.node.add(name="x", op="Placeholder")
>>> ctx = RewriteContext(graph=tf.Graph(), step="predict", devices={"x": "/CPU:0"})
>>> run_rewrites(gd, ctx, (Rewrite("visit", visit),))[0].summary
'saw 1 nodes'
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Mapping, Sequence

import tensorflow as tf

from ...core.compression import CompressionPolicy
from ...errors import AutoplaceError, GraphError
from ..graphdef import other_process, source

log = logging.getLogger(__name__)

#: The policy of an uncompressed (bit-exact) placement.
NO_COMPRESSION = CompressionPolicy("none")
#: Default least seconds of work a transfer must unblock on its receiving device to be acknowledged: several
#: times a round trip between two workers on one machine (0.17 ms latency each way, calibrated,
#: ``benchmarks/results/fidelity.md``).
MIN_WORK_S = 1e-3


@dataclass(frozen=True, kw_only=True)
class SendRule:
    """Which transfers the sends rewrite acknowledges (:mod:`placer.tf.rewrites.sends`; keyword-only).

    Parameters
    ----------
    seconds : callable
        Node name → measured seconds of that op on its device (0 where unknown).
    eligible : callable
        Node name → whether a transfer from that node may be acknowledged (default: every one). A pipeline
        acknowledges its first micro-batch's only: later ones arrive while the receiver works on the one before,
        where an acknowledgement makes the sender wait for it (``docs/costs.md``).
    min_work_s : float
        Least work a transfer must unblock on its receiving device.
    crosses : callable
        ``(device, device)`` → whether a transfer between them can be deferred (default: between processes;
        within one process the executor's other threads serve the queue).
    """

    seconds: Callable[[str], float]
    eligible: Callable[[str], bool] = lambda name: True  # noqa: E731
    min_work_s: float = MIN_WORK_S
    crosses: Callable[[str, str], bool] = other_process


@dataclass(frozen=True, kw_only=True)
class RewriteContext:
    """What every rewrite may read about the function being emitted (built once per function; keyword-only).

    Attributes
    ----------
    graph : tf.Graph
        The traced graph the GraphDef was taken from: dtypes, shapes and op types of its tensors.
    step : str
        ``"predict"`` (a forward pass), ``"train"`` or ``"test"`` (Keras' steps).
    devices : Mapping[str, str]
        Every op of ``graph`` → its device (the plan's, completed:
        :func:`placer.tf.graphdef.complete_assignment`).
    inputs : tuple of str
        The input tensors (``name:0``), fed by the caller.
    captured : tuple of str
        The captured placeholders (variables, constants), shared by micro-batch copies.
    batch_size : int
        The batch the compressed edges' bytes are reported at.
    optimizer_scope : str or None
        A training step's optimizer name scope (its update ops).
    compression : CompressionPolicy
        Which codec each cut edge gets.
    order : Mapping[str, tuple of str]
        The plan's order of each device's ops (``Plan.op_order``); empty: the executor's order. Not with
        micro-batches or replicas.
    microbatches : int
        Run a forward pass as this many micro-batch copies (1: the batch in one go).
    replica_groups : tuple of tuple of str
        A training step traced in replicas whose micro-batches are gated: the devices of each replica
        (``m`` consecutive replicas per data-parallel group; the first group's devices are the plan's).
        Empty: no gates.
    replicas : tuple of tuple of str
        A forward pass copied per data-parallel group (``Plan.replicas``): each group's devices, the first
        group's the plan's; each group runs ``microbatches`` copies. Empty: one copy.
    mirrored : frozenset of str
        With ``replicas``: the captured variable placeholders that every other group reads from a copy on
        its own device (a mirror the caller keeps equal to the variable); the others are read where they
        live, once per step.
    pipeline : str
        The order of the gates of a training pipeline: ``"gpipe"`` or ``"1f1b"`` (``Plan.pipeline``).
    pipeline_devices : tuple of str
        The devices in pipeline order (``Plan.stages``).
    sends : SendRule or None
        Given: the awaited cross-process transfers are acknowledged; ``None``: sends run when TensorFlow's
        executor gets to them.
    splits : Mapping[str, int]
        Ops split by their weight's output columns (``Plan.splits``: op → parts; :mod:`~placer.tf.rewrites.split`);
        ``devices`` names every part's device.
    pairs : frozenset of str
        Those of ``splits`` whose next product, split the same ways, takes their parts as its rows (``Plan.pairs``).

    Raises
    ------
    GraphError
        A planned order together with micro-batches or replicas (the plan drops its order for those).
    """

    graph: tf.Graph
    step: str
    devices: Mapping[str, str]
    inputs: tuple[str, ...] = ()
    captured: tuple[str, ...] = ()
    batch_size: int = 1
    optimizer_scope: str | None = None
    compression: CompressionPolicy = NO_COMPRESSION
    order: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    microbatches: int = 1
    replica_groups: tuple[tuple[str, ...], ...] = ()
    replicas: tuple[tuple[str, ...], ...] = ()
    mirrored: frozenset[str] = frozenset()
    pipeline: str = "gpipe"
    pipeline_devices: tuple[str, ...] = ()
    sends: SendRule | None = None
    splits: Mapping[str, int] = field(default_factory=dict)
    pairs: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.replicas and (self.step != "predict" or len({len(g) for g in self.replicas}) != 1):
            raise GraphError("replicas= copies a forward pass onto groups of one size; a training step is "
                             "replicated as it is traced (replica_groups)")
        if self.order and (self.microbatches > 1 or self.replica_groups or len(self.replicas) > 1):
            raise GraphError("a planned order of each device's ops does not apply to a pipeline of micro-batches; "
                             "emit the plan's pipeline without it (Plan.op_order is empty for such plans)")
        if self.microbatches < 1:
            raise GraphError(f"microbatches must be at least 1, got {self.microbatches}")


@dataclass(frozen=True)
class RewriteRecord:
    """What one rewrite did to one function (for the log, the report and the export).

    Attributes
    ----------
    rewrite : str
        The rewrite's name.
    changes : int
        Nodes or edges it added or changed (0: nothing).
    summary : str
        One line for the log.
    detail : object
        What the rewrite reports beyond the count, documented by each rewrite (the compressed edges, the
        acknowledged transfers, the order's control edges), or ``None``.
    """

    rewrite: str
    changes: int = 0
    summary: str = ""
    detail: Any = None


def find_record(records: Sequence[RewriteRecord], rewrite: str) -> RewriteRecord | None:
    """The record of the rewrite named ``rewrite`` among ``records``, or ``None`` where it did not apply.

    >>> find_record([RewriteRecord("devices", 3)], "devices").changes, find_record([], "order")
    (3, None)
    """
    return next((r for r in records if r.rewrite == rewrite), None)


@dataclass(frozen=True)
class Rewrite:
    """One rewrite of the emitted graph.

    Attributes
    ----------
    name : str
        Its name in the log and in errors.
    run : callable
        ``run(graph_def, context) -> RewriteRecord``: changes ``graph_def`` in place.
    applies : callable
        ``applies(context) -> bool``: whether it has anything to do for this function (default: always).
    schedule : bool
        Part of the schedule (how the placed graph runs on these devices) rather than of the placed graph:
        an export stores the graph before every schedule rewrite, and ``placer.load`` applies them again.
        Schedule rewrites come after every other in the declared list.
    """

    name: str
    run: Callable[[tf.compat.v1.GraphDef, RewriteContext], RewriteRecord]
    applies: Callable[[RewriteContext], bool] = lambda context: True  # noqa: E731
    schedule: bool = False


def run_rewrites(gd: tf.compat.v1.GraphDef, context: RewriteContext,
                 rewrites: Sequence[Rewrite]) -> tuple[RewriteRecord, ...]:
    """Run each rewrite that applies to ``context`` on ``gd`` (in place), in order; returns their records.

    Raises
    ------
    AutoplaceError
        What a rewrite raised, its message starting with the rewrite's name (``[codecs rewrite] …``);
        any other exception passes through with a note naming the rewrite.
    """
    records = []
    for rewrite in rewrites:
        if not rewrite.applies(context):
            continue
        try:
            record = rewrite.run(gd, context)
        except AutoplaceError as e:
            e.args = (f"[{rewrite.name} rewrite] {e.args[0] if e.args else ''}", *e.args[1:])
            raise
        except Exception as e:
            if hasattr(e, "add_note"):  # Python 3.11+
                e.add_note(f"raised by the {rewrite.name!r} rewrite of the emitted graph")
            raise
        if record.summary:
            log.info("%s: %s", rewrite.name, record.summary)
        records.append(record)
    return tuple(records)


def schedule_split(rewrites: Sequence[Rewrite]) -> int:
    """The index of the first schedule rewrite in ``rewrites`` (``len(rewrites)`` for none).

    Raises
    ------
    GraphError
        A rewrite of the placed graph listed after a schedule rewrite.

    Examples
    --------
    >>> noop = lambda gd, ctx: RewriteRecord("noop")
    >>> schedule_split([Rewrite("a", noop), Rewrite("b", noop, schedule=True)])
    1
    """
    split = next((i for i, r in enumerate(rewrites) if r.schedule), len(rewrites))
    late = [r.name for r in rewrites[split:] if not r.schedule]
    if late:
        raise GraphError(f"rewrites {late} change the placed graph but are listed after the schedule's "
                         f"{rewrites[split].name!r}; list every schedule rewrite last")
    return split


def template(fn: Callable[..., list[tf.Tensor] | tf.Tensor],
              specs: Sequence[tf.TensorSpec]) -> tuple[list, list[str], list[str]]:
    """Trace ``fn`` on placeholders of ``specs``: (its nodes, the placeholders' names, the output tensors' names):
    a piece of graph a rewrite copies in with :func:`splice`."""
    g = tf.Graph()
    with g.as_default():
        phs = [tf.compat.v1.placeholder(s.dtype, s.shape, name=f"in{i}") for i, s in enumerate(specs)]
        outs = fn(*phs)
        outs = outs if isinstance(outs, list) else [outs]
    return list(g.as_graph_def().node), [p.op.name for p in phs], [o.name for o in outs]


def splice(gd: tf.compat.v1.GraphDef, nodes: list, placeholders: list[str], inputs: Sequence[str],
            outputs: list[str], prefix: str, device: str) -> list[str]:
    """Copy :func:`template` ``nodes`` into ``gd`` under ``prefix`` on ``device`` (``""``: the devices rewrite
    places them), its ``placeholders`` bound to ``inputs``; returns the new output refs.

    Examples
    --------
    >>> gd = tf.compat.v1.GraphDef()
    >>> nodes, phs, outs = template(lambda x: [tf.negative(x, name="neg")], [tf.TensorSpec((2,), tf.float32)])
    >>> splice(gd, nodes, phs, ["x:0"], outs, "y", "/CPU:0"), [(n.name, list(n.input)) for n in gd.node]
    (['y/neg'], [('y/neg', ['x:0'])])
    """
    bound = dict(zip(placeholders, inputs))

    def ref(name: str) -> str:
        ctrl = name.startswith("^")
        op, _, idx = name.lstrip("^").partition(":")
        if op in bound:
            return bound[op] if not idx or idx == "0" else f"{bound[op]}:{idx}"
        new = f"{prefix}/{op}" + (f":{idx}" if idx and idx != "0" else "")
        return ("^" if ctrl else "") + new

    for n in nodes:
        if n.name in bound:
            continue
        c = gd.node.add()
        c.CopyFrom(n)
        c.name, c.device = f"{prefix}/{n.name}", device
        del c.input[:]
        c.input.extend(ref(i) for i in n.input)
    return [ref(o) for o in outputs]


def remove_nodes(gd: tf.compat.v1.GraphDef, drop: Collection[str], waits: Mapping[str, Sequence[str]],
                 colocate: Mapping[str, str] | None = None) -> list[str]:
    """Remove the nodes named in ``drop`` from ``gd`` (in place), as a rewrite that replaced them does: a control
    input on a removed node becomes control inputs on the nodes ``waits`` names for it (its replacements; ``[]``:
    the wait goes), and a colocation with one (``_class``) moves to ``colocate``'s node for it, or goes (a
    ``_class`` left empty goes too). Returns the nodes that would still take a tensor from a removed one, or wait
    for one ``waits`` does not name: then nothing is changed (the caller's error).

    Examples
    --------
    >>> gd = tf.compat.v1.GraphDef()
    >>> for name, inputs in [("v", []), ("read", ["v"]), ("rows", ["v"]), ("upd", ["v", "^read"])]:
    ...     _ = gd.node.add(name=name, op="NoOp", input=inputs)
    >>> remove_nodes(gd, {"read"}, {"read": ["rows"]}), [(n.name, list(n.input)) for n in gd.node]
    ([], [('v', []), ('rows', ['v']), ('upd', ['v', '^rows'])])
    >>> remove_nodes(gd, {"rows"}, {})
    ['upd']
    """
    drop, colocate = set(drop), colocate or {}
    left = [n.name for n in gd.node if n.name not in drop and any(
        source(x)[0] in drop and not (x.startswith("^") and x[1:] in waits) for x in n.input)]
    if left:
        return left
    for n in gd.node:
        if any(x.startswith("^") and x[1:] in drop for x in n.input):
            new = [y for x in n.input for y in (["^" + w for w in waits[x[1:]] if w != n.name]
                                                 if x.startswith("^") and x[1:] in drop else [x])]
            del n.input[:]
            n.input.extend(dict.fromkeys(new))
        if "_class" in n.attr:
            classes = [c.decode() for c in n.attr["_class"].list.s]
            moved = [c if not c.startswith("loc:@") or c[5:] not in drop else
                     f"loc:@{colocate[c[5:]]}" if c[5:] in colocate else None for c in classes]
            moved = list(dict.fromkeys(c for c in moved if c is not None))
            if moved != classes:
                if moved:
                    n.attr["_class"].list.s[:] = [c.encode() for c in moved]
                else:
                    del n.attr["_class"]
    keep = [n for n in gd.node if n.name not in drop]
    del gd.node[:]
    gd.node.extend(keep)
    return []
