"""Stage 4 — emit a placed function: a rewritten GraphDef in a new ``tf.function``.

The same code places the forward pass, Keras' ``train_step`` and ``test_step``:

* every node of the traced (unknown-batch) graph gets its planned device;
* every captured variable is replaced by one the placed model created on
  its planned device (:mod:`placer.tf.placed_model`: TensorFlow moves reads
  to wherever a variable lives, so placing the reads alone would not move
  the weights); the user's variables are not touched;
* with compression, each float tensor that crosses devices is cast to a
  narrow dtype on the sending device and back on each receiving device, so
  the transfer carries the narrow dtype;
* the GraphDef is imported inside a new ``tf.function`` whose resource
  placeholders are mapped to the new variables.

This is "propose, then apply": the plan is data; only this module rewrites.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import tensorflow as tf

from ..core.compression import CompressionPolicy
from ..errors import GraphError
from .codecs import CompressedEdge, insert_codecs
from .opgraph import bypass_pass_through, layer_of
from .sends import PromptSends, SendRule, prompt_sends
from .trace import TracedModel

log = logging.getLogger(__name__)

#: Name scope of the imported graph inside the placed function.
IMPORT_PREFIX = "autoplace"
#: The policy of an uncompressed (bit-exact) placement.
NO_COMPRESSION = CompressionPolicy("none")


@dataclass(frozen=True)
class EmittedModel:
    """One placed function (forward pass, training or test step) and what it was built from.

    The variables it reads and updates belong to the placed model; the
    function captures their handles.
    """

    function: Any
    graph_def: tf.compat.v1.GraphDef
    compressed: tuple[CompressedEdge, ...]
    structured_outputs: Any
    step: str = "predict"
    input_names: tuple[str, ...] = ()
    output_names: tuple[str, ...] = ()
    variable_placeholders: tuple[str, ...] = ()
    variables: tuple[Any, ...] = ()
    constants: Mapping[str, Any] = field(default_factory=dict)
    input_specs: tuple[tf.TensorSpec, ...] = ()
    microbatches: int = 1
    #: The acknowledged transfers (:mod:`placer.tf.sends`); ``None``: sends left to TensorFlow's executor.
    sends: PromptSends | None = None
    #: The control edges ``(before, after)`` that run each device's ops in the plan's order (:func:`add_order`).
    order_edges: tuple[tuple[str, str], ...] = ()


def complete_assignment(graph: tf.Graph, op_devices: Mapping[str, str],
                        layer_devices: Mapping[str, str] | None = None) -> dict[str, str]:
    """Give every op of ``graph`` a device: the plan's, else its layer's, else a neighbour's.

    The plan names the ops of the trace it was made on. Another trace of the
    same model (unknown batch: extra shape computations; Keras' test step or
    the forward pass of a plan made on the training step) has ops the plan
    does not name: each takes the device of its Keras layer in the plan
    (``layer_devices``, keyed by :func:`~placer.tf.opgraph.layer_of`), else
    of its first placed producer, else of its first placed consumer. Plan
    entries for ops this graph lacks are ignored.

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
    """Layer (:func:`~placer.tf.opgraph.layer_of`) → the device of its first op in ``assignment``."""
    out: dict[str, str] = {}
    for op, device in assignment.items():
        out.setdefault(layer_of(op), device)
    return out


def tf_variable(variable: Any) -> tf.Variable:
    """The ``tf.Variable`` behind a Keras variable (its ``.value``), or ``variable`` itself."""
    return variable if isinstance(variable, tf.Variable) else variable.value


def _handle(variable: Any) -> Any:
    """The resource handle of a Keras variable or a ``tf.Variable``."""
    return tf_variable(variable).handle


def emit(traced: TracedModel, op_devices: Mapping[str, str], variables: Mapping[str, Any], *,
         compression: CompressionPolicy = NO_COMPRESSION, layer_devices: Mapping[str, str] | None = None,
         batch_size: int = 1, microbatches: int = 1, replica_groups: Sequence[Sequence[str]] = (),
         pipeline: str = "gpipe", stages: Sequence[str] = (),
         sends: SendRule | None = None, order: Mapping[str, Sequence[str]] | None = None) -> EmittedModel:
    """Build the placed function of one trace.

    Parameters
    ----------
    traced : TracedModel
        Its ``dynamic`` trace is what is placed.
    op_devices : Mapping[str, str]
        The plan: op name → device (see :func:`complete_assignment` for ops it does not name).
    variables : Mapping[str, keras.Variable or tf.Variable]
        Each captured resource placeholder of the trace → the variable that
        replaces it, already created on its planned device.
    compression : CompressionPolicy
        Which codec each cut edge gets (:mod:`placer.tf.codecs` inserts it).
    layer_devices : Mapping[str, str], optional
        Layer → device, for ops the plan does not name.
    batch_size : int
        Batch size the compressed edges' bytes are reported at.
    microbatches : int
        Run the placed graph as a pipeline of this many micro-batches
        (:mod:`placer.tf.microbatch`); 1: the batch in one go.
    replica_groups : sequence of sequence of str
        Non-empty when the trace is a replicated training step whose replicas
        are micro-batches: the devices of each replica
        (``PlacedModel.set_microbatches``), ``m`` consecutive replicas per
        group of devices (the micro-batches of that group's data-parallel
        replica; the first group's devices are the plan's). Each device's
        forward and backward micro-batches are then ordered
        (:func:`placer.tf.microbatch.add_gates`). Empty: no gates.
    pipeline, stages : str, sequence of str
        The order of those gates (``"gpipe"`` or ``"1f1b"``) and the devices in pipeline order
        (``Plan.pipeline``, ``Plan.stages``).
    sends : SendRule, optional
        Given, the awaited cross-process transfers are acknowledged
        (:func:`placer.tf.sends.prompt_sends`, after any gates); ``None``: sends run when TensorFlow's
        executor gets to them.
    order : Mapping[str, sequence of str], optional
        The plan's order of each device's ops (``Plan.op_order``): each op waits for the one before it
        on its device (:func:`add_order`); ``None`` or empty: the executor's order. Not with
        ``microbatches`` > 1 or ``replica_groups``.

    Raises
    ------
    GraphError
        If an op has no device or a captured variable has no replacement.
    """
    missing = sorted(set(traced.variables) - set(variables))
    if missing:
        raise GraphError(f"{len(missing)} captured variables have no placed copy, e.g. {missing[:3]}")
    graph = traced.dynamic.graph
    gd = graph.as_graph_def()
    bypass_pass_through(gd, graph)
    op_devices = complete_assignment(graph, op_devices, layer_devices)
    for node in gd.node:
        node.device = op_devices[node.name]
    ordered: list[tuple[str, str]] = []
    if order:
        if microbatches > 1 or replica_groups:
            raise GraphError("a planned order of each device's ops does not apply to a pipeline of micro-batches; "
                             "emit the plan's pipeline without it (Plan.op_order is empty for such plans)")
        ordered = add_order(gd, order)
        log.info("planned order of each device's ops: %d control edges", len(ordered))
    compressed = insert_codecs(gd, graph, op_devices, compression, batch_size=batch_size,
                               optimizer_scope=traced.optimizer_scope)
    if traced.step == "train":
        from .microbatch import update_after_reads

        log.info("variable updates ordered after the last reads of their variable: %d control edges",
                 update_after_reads(gd))
    if replica_groups:
        from .microbatch import add_gates, hold_gradient_sums, replica_keys
        from .opgraph import GRADIENT_SCOPE
        from .placed_model import GRADIENT_SUM_SCOPE, REPLICA_SCOPE

        groups = list(dict.fromkeys(tuple(g) for g in replica_groups))
        per_group = len(replica_groups) // len(groups)
        aliases = {d: first for g in groups for d, first in zip(g, groups[0])}  # a device -> its stage's name
        add_gates(gd, replica_keys(gd, REPLICA_SCOPE, GRADIENT_SCOPE, per_group), order=pipeline, stages=stages,
                  aliases=aliases)
        held, running = hold_gradient_sums(gd, GRADIENT_SUM_SCOPE, per_group)
        log.info("gradient sums held at the next gate (no AddN rewrite): %d of %d", held, running)

    done: list[PromptSends] = []
    placeholders = tuple(traced.variables)
    fn = import_function(gd, traced.input_names, traced.output_names,
                         [(ph, variables[ph]) for ph in placeholders] + list(traced.constants.items()),
                         traced.dynamic.structured_outputs, traced.input_specs, microbatches=microbatches,
                         rewrite=None if sends is None else _prompt_sends(graph, sends, done))
    log.info("emitted the placed %s function: %d ops on %d devices, %d compressed edges%s", traced.step,
             len(gd.node), len(set(op_devices.values())), len(compressed),
             f", {microbatches} micro-batches" if microbatches > 1 else "")
    return EmittedModel(fn, gd, tuple(compressed), traced.dynamic.structured_outputs, traced.step,
                        tuple(traced.input_names), tuple(traced.output_names), placeholders,
                        tuple(variables[ph] for ph in placeholders), dict(traced.constants),
                        tuple(traced.input_specs), microbatches, done[0] if done else None, tuple(ordered))


def add_order(gd: tf.compat.v1.GraphDef, order: Mapping[str, Sequence[str]]) -> list[tuple[str, str]]:
    """Make each op of ``order`` (device → op names in the order they run there) wait for the one before it
    on its device: a control edge in ``gd`` (in place), skipping names ``gd`` lacks (an op of the plan's
    trace that this trace does not have) and placeholders (the inputs and captures the placed function
    feeds through ``input_map``: an edge from one would make it run, unfed); returns the edges added,
    ``(before, after)`` (not those ``gd`` had already: :func:`remove_edges` takes them out again).

    This trace may depend otherwise than the one the plan was made on (a batch of unknown size computes
    shapes that were constants), so an edge can close a cycle: the edges inside a strongly connected
    component of the result are taken out again (the graph's own edges are acyclic, so what is left is),
    and the log says how many.

    Examples
    --------
    >>> gd = tf.compat.v1.GraphDef()
    >>> for name, inputs in [("x", []), ("a", ["x"]), ("b", ["x"]), ("c", ["a"])]:
    ...     _ = gd.node.add(name=name, op="Identity" if inputs else "Placeholder", input=inputs)
    >>> edges = add_order(gd, {"/CPU:0": ("a", "c", "gone", "b")})
    >>> edges, list(gd.node[2].input)
    ([('a', 'c'), ('c', 'b')], ['x', '^c'])
    >>> remove_edges(gd, edges); list(gd.node[2].input)
    ['x']

    ``c`` depends on ``a`` here, so an order that puts ``c`` first keeps nothing of that pair:

    >>> add_order(gd, {"/CPU:0": ("c", "a"), "/CPU:1": ("b", "x")})
    []
    """
    import networkx as nx

    from .microbatch import dependency_graph

    nodes = {n.name: n for n in gd.node if n.op != "Placeholder"}
    added: list[tuple[str, str]] = []
    for ops in order.values():
        present = [name for name in ops if name in nodes]
        for before, after in zip(present, present[1:]):
            if f"^{before}" not in nodes[after].input:
                added.append((before, after))
    if not added:
        return added
    g = dependency_graph(gd)
    g.add_edges_from(added)
    component = {}
    for i, members in enumerate(nx.strongly_connected_components(g)):
        if len(members) > 1:
            component.update(dict.fromkeys(members, i))
    kept = [(b, a) for b, a in added if b not in component or component[b] != component.get(a)]
    if len(kept) < len(added):
        log.info("planned order: %d of %d control edges left out (this trace's dependencies contradict them)",
                 len(added) - len(kept), len(added))
    for before, after in kept:
        nodes[after].input.append(f"^{before}")
    return kept


def remove_edges(gd: tf.compat.v1.GraphDef, edges: Sequence[tuple[str, str]]) -> None:
    """Take the control edges ``(before, after)`` (e.g. :func:`add_order`'s) out of ``gd``, in place."""
    nodes = {n.name: n for n in gd.node}
    for before, after in edges:
        node = nodes.get(after)
        if node is not None and f"^{before}" in node.input:
            node.input.remove(f"^{before}")


def _prompt_sends(graph: tf.Graph, rule: SendRule, done: list[PromptSends]) -> Callable[[tf.compat.v1.GraphDef], None]:
    """The rewrite that acknowledges a placed GraphDef's awaited transfers (what it did goes to ``done``);
    dtypes from ``graph`` (the trace; a pipelined copy ``mb{i}/<op>`` has its op's)."""
    from .microbatch import copied

    def dtype_of(name: str, k: int) -> Any:
        name = copied(name)[0]
        try:
            return graph.get_operation_by_name(name).outputs[k].dtype
        except (KeyError, IndexError, ValueError):
            return None  # a node the rewrites added (codecs): its transfer is left as it is

    def rewrite(gd: tf.compat.v1.GraphDef) -> None:
        result = prompt_sends(gd, dtype_of, rule)
        done.append(result)
        log.info("sends made prompt: %d transfers acknowledged, %d ops wait for them", result.acknowledged,
                 result.control_edges)

    return rewrite


def import_function(gd: tf.compat.v1.GraphDef, input_names: Sequence[str], output_names: Sequence[str],
                    captures: Sequence[tuple[str, Any]], structured: Any,
                    input_specs: Sequence[tf.TensorSpec], *, microbatches: int = 1,
                    rewrite: Callable[[tf.compat.v1.GraphDef], Any] | None = None) -> Any:
    """A ``tf.function`` that runs the placed GraphDef ``gd`` (devices already on its nodes).

    ``captures`` maps each captured placeholder of ``gd`` to what feeds it: a
    variable (its resource handle is captured) or an eager tensor.
    ``microbatches`` > 1: as a pipeline (:func:`placer.tf.microbatch.pipelined_function`). ``rewrite`` (if
    given) changes the graph that runs, in place, before it is imported: ``gd``, or a pipeline's copied and
    gated graph.
    :func:`emit` and :func:`placer.tf.export.load` build their functions here.
    """
    if microbatches > 1:
        from .microbatch import pipelined_function

        return pipelined_function(gd, microbatches, input_names, output_names, captures, structured, input_specs,
                                  rewrite=rewrite)
    if rewrite is not None:
        rewrite(gd)
    captures = list(captures)
    input_names, output_names = list(input_names), list(output_names)

    def placed_step(*xs: tf.Tensor) -> Any:
        fg = tf.compat.v1.get_default_graph()
        input_map: dict[str, Any] = dict(zip(input_names, xs))
        for ph, value in captures:
            input_map[f"{ph}:0"] = fg.capture(value if isinstance(value, tf.Tensor) else _handle(value))
        outs = tf.graph_util.import_graph_def(gd, input_map=input_map, return_elements=output_names,
                                              name=IMPORT_PREFIX)
        return tf.nest.pack_sequence_as(structured, outs)

    return tf.function(placed_step, input_signature=list(input_specs), autograph=False)


#: Ops the runtime adds to partition graphs (transfers, function arguments); not the plan's.
_RUNTIME_OPS = frozenset({"_Send", "_Recv", "_HostSend", "_HostRecv", "_Arg", "_Retval", "_DeviceArg",
                          "_DeviceRetval"})


def observed_devices(function: Any, args: Sequence[Any]) -> dict[str, str]:
    """Run a placed ``function`` once on ``args``; return node name → device where it *actually* ran.

    Read from the runtime's partition graphs (names without :data:`IMPORT_PREFIX`); ops Grappler
    fused or folded away do not appear. The runtime reports partition graphs only when a function
    is instantiated, so this traces a fresh copy of ``function`` for the run.
    """
    from tensorflow.python.eager import context

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
