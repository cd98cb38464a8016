"""Stage emit — a placed function: the traced GraphDef, rewritten, imported into a new ``tf.function``.

The same code places the forward pass, Keras' ``train_step`` and ``test_step``
(and :func:`placer.tf.export.load` re-places an export):

1. :func:`rewrite_context` gathers what the plan, the devices and the options
   say about one trace into a frozen :class:`~placer.tf.rewrites.RewriteContext`
   (every op's device: the plan's, completed for this trace);
2. :func:`rewrite_graph_def` runs the declared rewrites
   (:data:`placer.tf.rewrites.REWRITES`: devices, codecs, update order,
   planned order, gates, micro-batch copies, acknowledged sends) on a copy of
   the GraphDef, keeping the placed graph (before the schedule's rewrites) for
   exports;
3. :func:`import_function` imports the result inside a new ``tf.function``
   whose captured placeholders are mapped to the variables the placed model
   created on their devices (TensorFlow moves reads to wherever a variable
   lives, so placing the reads alone would not move the weights); with
   micro-batches it splits the inputs and joins the outputs. One import path
   serves plain and pipelined functions.

This is "propose, then apply": the plan is data; only the rewrites change a graph.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import tensorflow as tf

from ..errors import GraphError, InputSignatureError
from ..core.splits import is_split_node
from ..measure.links import on_caller
from .codecs import CompressedEdge
from .graphdef import IMPORT_PREFIX, complete_assignment, copy_name, variable_handle
from . import rewrites as declared
from .rewrites import Rewrite, RewriteContext, RewriteRecord, find_record, run_rewrites, schedule_split
from .rewrites.copies import copy_count
from .rewrites.sends import PromptSends
from .rewrites.split import Shard
from .trace import TracedModel

log = logging.getLogger(__name__)

#: A placed ``tf.function`` (what ``tf.function`` returns).
PlacedFunction = tf.types.experimental.PolymorphicFunction


@dataclass(frozen=True)
class EmittedModel:
    """One placed function (forward pass, training or test step) and what it was built from.

    The variables it reads and updates belong to the placed model; the
    function captures their handles.

    Attributes
    ----------
    function : tf.function
        The placed function (positional inputs: the trace's flat inputs).
    graph_def : GraphDef
        The graph it runs: every rewrite applied.
    placed_graph_def : GraphDef
        The placed graph before the schedule's rewrites (planned order, gates, micro-batch copies,
        acknowledgements): what an export stores and :func:`placer.tf.export.load` places again.
    records : tuple of RewriteRecord
        What each rewrite that applied did, in order.
    source_graph_def : GraphDef or None
        Where a forward pass's ops were split (:attr:`shards`): the trace's graph before any rewrite, each node
        with its outputs' shapes (``_output_shapes``: imported again, a variable's read has no shape without
        them, and the split rules read shapes); an export keeps it, so that :func:`placer.tf.export.load` can
        split the same ops into another number of parts. ``None`` elsewhere (a training step, nothing split).
    """

    function: PlacedFunction
    graph_def: tf.compat.v1.GraphDef
    placed_graph_def: tf.compat.v1.GraphDef
    records: tuple[RewriteRecord, ...]
    structured_outputs: Any
    step: str = "predict"
    input_names: tuple[str, ...] = ()
    output_names: tuple[str, ...] = ()
    variable_placeholders: tuple[str, ...] = ()
    variables: tuple[Any, ...] = ()
    constants: Mapping[str, tf.Tensor] = field(default_factory=dict)
    input_specs: tuple[tf.TensorSpec, ...] = ()
    microbatches: int = 1
    replicas: int = 1
    mirror_variables: tuple[Any, ...] = ()
    shard_variables: tuple[Any, ...] = ()
    source_graph_def: tf.compat.v1.GraphDef | None = None

    def record(self, rewrite: str) -> RewriteRecord | None:
        """The record of the rewrite named ``rewrite``, or ``None`` where it did not apply."""
        return find_record(self.records, rewrite)

    @property
    def compressed(self) -> tuple[CompressedEdge, ...]:
        """The edges that travel through a codec (the ``codecs`` rewrite's)."""
        r = self.record("codecs")
        return () if r is None else r.detail

    @property
    def sends(self) -> PromptSends | None:
        """The acknowledged transfers (the ``sends`` rewrite's); ``None``: sends left to TensorFlow's executor."""
        r = self.record("sends")
        return None if r is None else r.detail

    @property
    def mirrors(self) -> tuple[tuple[str, str, str], ...]:
        """The data-parallel groups' copies of variables ``(placeholder, variable placeholder, device)`` the
        function captures (the ``copies`` rewrite's)."""
        return mirrors_in(self.records)

    @property
    def shards(self) -> tuple[Shard, ...]:
        """The shards of split ops' weights the function captures (the ``split`` rewrite's)."""
        return shards_in(self.records)

    @property
    def order_edges(self) -> tuple[tuple[str, str], ...]:
        """The control edges ``(before, after)`` that run each device's ops in the plan's order."""
        r = self.record("order")
        return () if r is None else r.detail


def rewrite_context(traced: TracedModel, op_devices: Mapping[str, str], *,
                    layer_devices: Mapping[str, str] | None = None, **options: Any) -> RewriteContext:
    """The :class:`~placer.tf.rewrites.RewriteContext` of one trace: its graph, step, inputs and captures,
    every op's device (``op_devices`` completed: :func:`~placer.tf.graphdef.complete_assignment` with
    ``layer_devices``, and the devices of the nodes split ops add, :func:`~placer.core.splits.is_split_node`),
    and ``options`` (the context's other fields: compression, order, micro-batches, splits, …).

    Raises
    ------
    GraphError
        An op with no device and no placed neighbour, or options that contradict each other.
    """
    graph = traced.dynamic.graph
    devices = complete_assignment(graph, op_devices, layer_devices)
    if options.get("splits"):
        devices.update((name, d) for name, d in op_devices.items() if is_split_node(name))
    return RewriteContext(graph=graph, step=traced.step, devices=devices,
                          inputs=tuple(traced.input_names),
                          captured=(*traced.variables, *traced.constants),
                          optimizer_scope=traced.optimizer_scope, **options)


def rewrite_graph_def(gd: tf.compat.v1.GraphDef, context: RewriteContext, rewrites: Sequence[Rewrite] | None = None
                      ) -> tuple[tf.compat.v1.GraphDef, tf.compat.v1.GraphDef, tuple[RewriteRecord, ...]]:
    """Run ``rewrites`` (default: the declared :data:`placer.tf.rewrites.REWRITES`, read at each call) on ``gd``
    (changed in place): ``(placed graph, graph that runs, records)``.

    The placed graph is ``gd`` after the rewrites of the placed graph; the schedule's rewrites
    (:func:`~placer.tf.rewrites.schedule_split`) run on a copy of it when any applies, else the two are one.
    """
    rewrites = declared.REWRITES if rewrites is None else tuple(rewrites)
    split = schedule_split(rewrites)
    records = run_rewrites(gd, context, rewrites[:split])
    schedule = [r for r in rewrites[split:] if r.applies(context)]
    if not schedule:
        return gd, gd, records
    running = tf.compat.v1.GraphDef()
    running.CopyFrom(gd)
    return gd, running, records + run_rewrites(running, context, schedule)


def mirrors_in(records: Sequence[RewriteRecord]) -> tuple[tuple[str, str, str], ...]:
    """The mirrors ``(placeholder, variable placeholder, device)`` the ``copies`` rewrite added (none without it)."""
    r = find_record(records, "copies")
    return () if r is None or r.detail is None else r.detail


def shards_in(records: Sequence[RewriteRecord]) -> tuple[Shard, ...]:
    """The weight shards the ``split`` rewrite added (none without it)."""
    r = find_record(records, "split")
    return () if r is None else r.detail


def copies_in(records: Sequence[RewriteRecord], context: RewriteContext) -> int:
    """How many micro-batch copies of the graph the rewrites made (the ``copies`` rewrite's; 1 without it): what
    :func:`import_function` splits the inputs into."""
    return copy_count(context) if find_record(records, "copies") is not None else 1


def emit(traced: TracedModel, variables: Mapping[str, Any], context: RewriteContext,
         rewrites: Sequence[Rewrite] | None = None, mirror: Callable[[Any, str], Any] | None = None,
         shard: Callable[[Any, Shard], Any] | None = None) -> EmittedModel:
    """Build the placed function of one trace.

    Parameters
    ----------
    traced : TracedModel
        Its ``dynamic`` trace is what is placed.
    variables : Mapping[str, keras.Variable or tf.Variable]
        Each captured resource placeholder of the trace → the variable that
        replaces it, already created on its planned device.
    context : RewriteContext
        What the rewrites read (:func:`rewrite_context` of this trace).
    rewrites : sequence of Rewrite, optional
        The rewrites to run, in order (default: the declared :data:`placer.tf.rewrites.REWRITES`).
    mirror : callable, optional
        ``mirror(variable, device)`` → the copy of ``variable`` on ``device`` that a data-parallel group reads
        (``context.mirrored``); the caller keeps it equal to the variable.
    shard : callable, optional
        ``shard(variable, Shard)`` → a variable on the shard's device holding the shard's slice of ``variable``
        (``context.splits``); the caller keeps it equal to that slice.

    Raises
    ------
    GraphError
        If a captured variable has no replacement, or a rewrite fails (named in the message).
    """
    missing = sorted(set(traced.variables) - set(variables))
    if missing:
        raise GraphError(f"{len(missing)} captured variables have no placed copy, e.g. {missing[:3]}")
    placed, running, records = rewrite_graph_def(traced.dynamic.graph.as_graph_def(), context, rewrites)
    placeholders = tuple(traced.variables)
    microbatches = copies_in(records, context)
    mirrors = mirrors_in(records)
    if mirrors and mirror is None:
        raise GraphError(f"{len(mirrors)} variables are mirrored on data-parallel groups and no mirror was given")
    mirror_variables = tuple(mirror(variables[ph], device) for _, ph, device in mirrors)
    shards = shards_in(records)
    if shards and shard is None:
        raise GraphError(f"{len(shards)} weight shards of split ops are read and no shard was given")
    shard_variables = tuple(shard(variables[s.variable], s) for s in shards)  # type: ignore[misc]
    present = {n.name for n in running.node}  # a split weight's placeholder is gone: its shards are read
    fn = import_function(running, traced.input_names, traced.output_names,
                         [(ph, variables[ph]) for ph in placeholders if ph in present]
                         + list(traced.constants.items())
                         + [(name, v) for (name, _, _), v in zip(mirrors, mirror_variables)]
                         + [(s.placeholder, v) for s, v in zip(shards, shard_variables)],
                         traced.dynamic.structured_outputs, traced.input_specs, microbatches=microbatches)
    emitted = EmittedModel(fn, running, placed, records, traced.dynamic.structured_outputs, traced.step,
                           tuple(traced.input_names), tuple(traced.output_names), placeholders,
                           tuple(variables[ph] for ph in placeholders), dict(traced.constants),
                           tuple(traced.input_specs), microbatches, max(len(context.replicas), 1), mirror_variables,
                           shard_variables,
                           traced.dynamic.graph.as_graph_def(add_shapes=True)
                           if shards and traced.step == "predict" else None)
    log.info("emitted the placed %s function: %d ops on %d devices, %d compressed edges%s", traced.step,
             len(placed.node), len(set(context.devices.values())), len(emitted.compressed),
             f", {microbatches} copies (micro-batches × data-parallel groups)" if microbatches > 1 else "")
    return emitted


def import_function(gd: tf.compat.v1.GraphDef, input_names: Sequence[str], output_names: Sequence[str],
                    captures: Sequence[tuple[str, Any]], structured: Any,
                    input_specs: Sequence[tf.TensorSpec], *, microbatches: int = 1) -> PlacedFunction:
    """A ``tf.function`` that runs the placed GraphDef ``gd`` (devices already on its nodes).

    ``captures`` maps each captured placeholder of ``gd`` to what feeds it: a
    variable (its resource handle is captured) or an eager tensor.
    ``microbatches`` > 1: ``gd`` holds that many copies of the graph (the ``copies`` rewrite); each input is
    split along its first axis into :func:`~placer.tf.rewrites.copies.microbatch_sizes`, copy ``i`` is fed
    part ``i``, and each output is the copies' outputs concatenated. An output made on a gRPC worker is received
    on the caller inside the function (:func:`placer.measure.links.on_caller`: fetched after the call, it moved
    2-3 times as slowly). :func:`emit` and :func:`placer.tf.export.load` build their functions here.

    Raises
    ------
    InputSignatureError
        Micro-batches of an input without a batch dimension, or of a scalar output.
    """
    m = microbatches
    if m > 1:
        for spec in input_specs:
            if spec.shape.rank is None or spec.shape.rank < 1:
                raise InputSignatureError(f"input {spec.name or ''} has no batch dimension to split into "
                                          "micro-batches")
    captures = list(captures)
    input_names, output_names = list(input_names), list(output_names)

    def placed_step(*xs: tf.Tensor) -> Any:
        fg = tf.compat.v1.get_default_graph()
        input_map: dict[str, Any] = {}
        if m == 1:
            input_map.update(zip(input_names, xs))
        for ph, value in captures:
            input_map[f"{ph}:0"] = fg.capture(value if isinstance(value, tf.Tensor) else variable_handle(value))
        if m == 1:
            outs = tf.graph_util.import_graph_def(gd, input_map=input_map, return_elements=output_names,
                                                  name=IMPORT_PREFIX)
            return tf.nest.pack_sequence_as(structured, [on_caller(y) for y in outs])
        n = tf.shape(xs[0], out_type=tf.int64)[0]
        sizes = n // m + tf.cast(tf.range(m, dtype=tf.int64) < n % m, tf.int64)
        parts = [tf.split(x, sizes, axis=0, num=m) for x in xs]
        for i in range(m):
            for name, part in zip(input_names, parts):
                input_map[copy_name(i, name)] = part[i]
        wanted = [copy_name(i, o) for i in range(m) for o in output_names]
        outs = tf.graph_util.import_graph_def(gd, input_map=input_map, return_elements=wanted, name=IMPORT_PREFIX)
        k = len(output_names)
        joined = []
        for j in range(k):
            pieces = [outs[i * k + j] for i in range(m)]
            if pieces[0].shape.rank == 0:
                raise InputSignatureError(f"output {output_names[j]} is a scalar: micro-batches cannot be joined; "
                                          "use microbatches=1 for this model")
            # where the pieces are: a pipeline's last stage; pieces from several devices (data-parallel
            # copies) are joined by the caller, each sent once (not all through one copy's device)
            where = {p.device for p in pieces}
            with tf.device(pieces[-1].device) if len(where) == 1 and pieces[-1].device else contextlib.nullcontext():
                joined.append(tf.concat(pieces, axis=0))
        return tf.nest.pack_sequence_as(structured, [on_caller(y) for y in joined])

    return tf.function(placed_step, input_signature=list(input_specs), autograph=False)


#: Ops the runtime adds to partition graphs (transfers, function arguments); not the plan's.
_RUNTIME_OPS = frozenset({"_Send", "_Recv", "_HostSend", "_HostRecv", "_Arg", "_Retval", "_DeviceArg",
                          "_DeviceRetval"})


def observed_devices(function: PlacedFunction, args: Sequence[Any]) -> dict[str, str]:
    """Run a placed ``function`` once on ``args``; return node name → device where it *actually* ran.

    Read from the runtime's partition graphs (names without :data:`~placer.tf.graphdef.IMPORT_PREFIX`);
    ops Grappler fused or folded away do not appear. The runtime reports partition graphs only when a
    function is instantiated, so this traces a fresh copy of ``function`` for the run.
    """
    from tensorflow.python.eager import context  # TensorFlow's run metadata has no public API

    fresh = tf.function(function.python_function, input_signature=function.input_signature, autograph=False)
    ctx = context.context()
    ctx.enable_run_metadata()
    try:
        fresh(*args)
        md = ctx.export_run_metadata()
    finally:
        ctx.disable_run_metadata()
    placed: dict[str, str] = {}
    prefix = IMPORT_PREFIX + "/"
    graphs = [pg for fg in md.function_graphs for pg in fg.partition_graphs] + list(md.partition_graphs)
    for pg in graphs:
        for node in pg.node:
            if node.name.startswith(prefix) and node.op not in _RUNTIME_OPS:
                placed[node.name[len(prefix):]] = tf.DeviceSpec.from_string(node.device).to_string()
    return placed
