"""Micro-batch pipelining of a placed graph: ``m`` copies of it in one function, each stage in order.

A plan that cuts a chain of layers into stages cannot speed up one batch:
every stage waits for the one before. Split the batch into ``m``
micro-batches and the stages work on different micro-batches at once
(GPipe's forward schedule). :func:`pipeline_graph_def` builds that graph
from the placed ``GraphDef`` (devices already on its nodes):

* every node is copied once per micro-batch (``mb{i}/…``), except the
  captured placeholders (variables, constants), which the copies share;
* TensorFlow's executor alone does not fill a pipeline reliably (a worker
  ran several micro-batches of its first stage before sending anything,
  and the same graph ranged 2.4–3.5 s across processes,
  ``../shared/notes/tf-facts.md``), so each device's work is ordered
  explicitly: a ``NoOp`` gate per device and micro-batch waits for that
  micro-batch's last ops on the device (those with no consumer there), and
  the next micro-batch's first ops on the device (those with no input from
  it) wait for the gate. A device thus finishes micro-batch ``i`` before it
  starts ``i + 1``, and can start ``i + 1`` as soon as it has.

:func:`pipelined_function` splits each input along the batch (sizes as
even as the batch allows, so a short last batch of ``predict`` works too)
and concatenates each output. Each micro-batch runs the very kernels the
unsplit model runs on a batch of that size, so the outputs are bit-exact
against the original model run on the same micro-batches; against the
whole batch they agree to rounding (a kernel may sum in another order at
another batch size).

Examples
--------
>>> microbatch_sizes(10, 4)
[3, 3, 2, 2]
"""

from __future__ import annotations

import contextlib
import re
from typing import Any, Callable, Iterable, Mapping, Sequence

import tensorflow as tf

from ..errors import GraphError, InputSignatureError

#: Name prefix of micro-batch ``i``'s copy of the graph, and of the gates.
COPY_PREFIX = "mb{}"
GATE_PREFIX = "autoplace_gate"
_COPY_HEAD = re.compile("^" + COPY_PREFIX.format(r"(\d+)") + "/")


def copy_name(i: int, name: str) -> str:
    """Micro-batch ``i``'s copy of the node ``name`` in a pipelined graph (``mb{i}/name``)."""
    return f"{COPY_PREFIX.format(i)}/{name}"


def copied(name: str) -> tuple[str, int | None]:
    """``(node, i)``: the node that ``name`` is micro-batch ``i``'s copy of; ``(name, None)`` for no copy.

    >>> copied("mb3/dense/MatMul"), copied("dense/MatMul")
    (('dense/MatMul', 3), ('dense/MatMul', None))
    """
    found = _COPY_HEAD.match(name)
    return (name, None) if found is None else (name[found.end():], int(found.group(1)))


def microbatch_sizes(batch: int, m: int) -> list[int]:
    """``m`` sizes summing to ``batch``, the first ``batch % m`` one larger."""
    base, extra = divmod(batch, m)
    return [base + (i < extra) for i in range(m)]


def _source(name: str) -> tuple[str, str]:
    """``(node, suffix)`` of an input string: ``"^a"`` → ``("a", "^")``, ``"a:1"`` → ``("a", ":1")``."""
    if name.startswith("^"):
        return name[1:], "^"
    node, _, port = name.partition(":")
    return node, (":" + port if port else "")


def _renamed(name: str, shared: set[str], i: int) -> str:
    node, suffix = _source(name)
    new = node if node in shared else copy_name(i, node)
    return "^" + new if suffix == "^" else new + suffix


def gate_name(phase: str, i: int, device: str) -> str:
    """The name of the gate after micro-batch ``i``'s ``phase`` on ``device``."""
    return f"{GATE_PREFIX}/{phase}/{COPY_PREFIX.format(i)}/{device.replace(':', '_').strip('/')}"


def add_gates(gd: tf.compat.v1.GraphDef, key_of: Mapping[str, tuple[int, str]], fed: Iterable[str] = (), *,
              order: str = "gpipe", stages: Sequence[str] = (), aliases: Mapping[str, str] | None = None) -> int:
    """Order each device's micro-batches in ``gd`` (in place): the gates of the module docstring.

    ``key_of`` gives the nodes that belong to a micro-batch their
    ``(micro-batch, phase)``: a *unit* per device (nodes computed from
    constants alone, :func:`constant_nodes`, belong to none). Each device runs its units
    in the chains of :func:`placer.core.microbatch.device_chains` (the rule the
    simulator follows): the next unit's first nodes there (no input from a
    node of the same unit; inputs from ``fed`` nodes do not count) wait for a
    ``NoOp`` that waits for the unit's last nodes there (no consumer among
    them). ``order="gpipe"``: the forward units in micro-batch order and,
    apart, the backward ones, without a forward waiting for a backward;
    ``"1f1b"``: one chain alternating after a warm-up that depends on the
    device's position in ``stages`` (device names in pipeline order; a device
    not named comes last; ``aliases`` maps a device to the stage it runs
    when it is not named itself: another data-parallel replica's device).
    Returns the number of gates.

    Raises
    ------
    GraphError
        A keyed node without a device, or gates that would wait in a cycle (TensorFlow would hang).
    """
    from ..core.microbatch import device_chains

    fed_set = set(fed)
    by_name = {n.name: n for n in gd.node}
    constant = constant_nodes(gd)
    group: dict[str, tuple[int, str, str]] = {}
    for name, (i, phase) in key_of.items():
        node = by_name.get(name)
        if node is None or name in fed_set:  # a fed node is replaced by what feeds it: never run, never waited on
            continue
        if name in constant:  # computed from constants alone: nothing to order, and gating it would chain devices
            continue
        if not node.device:
            raise GraphError(f"node {name} has no device; place every node before gating micro-batches")
        group[name] = (i, phase, node.device)
    starts_here: dict[tuple[int, str, str], list[str]] = {}
    fed_inside: set[str] = set()
    for name, g in group.items():
        local = False
        for inp in by_name[name].input:
            src, _ = _source(inp)
            if src not in fed_set and group.get(src) == g:
                local = True
                fed_inside.add(src)
        if not local:
            starts_here.setdefault(g, []).append(name)
    ends_here: dict[tuple[int, str, str], list[str]] = {}
    for name, g in group.items():
        if name not in fed_inside:
            ends_here.setdefault(g, []).append(name)
    m = 1 + max((i for i, _, _ in ends_here), default=-1)
    stages = list(stages)
    gates = 0
    for device in sorted({d for _, _, d in ends_here}):
        stage = (aliases or {}).get(device, device)
        position = stages.index(stage) if stage in stages else len(stages)
        for chain in device_chains(order, m, position, len(stages)):
            units = [(i, ph) for i, ph in chain if (i, ph, device) in ends_here]
            for (i, phase), (j, phase2) in zip(units, units[1:]):
                nxt = starts_here.get((j, phase2, device))
                if not nxt:
                    continue
                gate = gd.node.add()
                gate.name = gate_name(phase, i, device)
                gate.op = "NoOp"
                gate.device = device
                gate.input.extend(f"^{x}" for x in sorted(ends_here[(i, phase, device)]))
                for x in nxt:
                    by_name[x].input.append(f"^{gate.name}")
                gates += 1
    if order != "gpipe":
        _check_acyclic(gd, order)
    return gates


def constant_nodes(gd: tf.compat.v1.GraphDef) -> set[str]:
    """Nodes of ``gd`` computed from constants alone: ``Const`` nodes and nodes all of whose inputs (control
    inputs included) are such nodes.

    :func:`add_gates` leaves them out of every micro-batch. A replicated
    training step's gradient seed (``replica_r/ones``, a ``Const``) and its
    scaling by the replica's share (``gradient_tape/replica_r/mul/Mul``) sit
    on whatever device the plan gave the unreplicated step's seed; gated
    there, every micro-batch's backward pass on the loss's device waited for
    the previous micro-batch's backward pass on the seed's device, and a
    two-stage training pipeline overlapped nothing (measured,
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
    import networkx as nx

    g = dependency_graph(gd)
    op = {n.name: n.op for n in gd.node}
    out: set[str] = set()
    for name in nx.topological_sort(g):
        preds = list(g.predecessors(name))
        if (all(p in out for p in preds) if preds else op.get(name) == "Const"):
            out.add(name)
    return out


#: Ops that write a resource variable in place: TensorFlow copies the variable first when a read of it is
#: still live (copy-on-write), which the simulator's memory model does not count.
VARIABLE_WRITES = frozenset({"AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp"})


def update_after_reads(gd: tf.compat.v1.GraphDef) -> int:
    """Make each in-place write of a variable (:data:`VARIABLE_WRITES`) wait for every consumer of the reads
    of that variable that does not depend on the write (in place; returns the control edges added, some
    of them redundant: a consumer the write depends on anyway).

    A resource variable written while a read of it is still live is copied
    first: a placed training step whose SGD update ran before the layer's
    input-gradient matmul (which reads the kernel) held a copy of the
    weight, up to 2x the simulated step memory on a worker
    (``benchmarks/results/pipeline_orders.md``). Waiting for the readers
    keeps the update in place, as the simulator models it; the values are
    the same (the reads saw the old value either way).

    Examples
    --------
    >>> gd = tf.compat.v1.GraphDef()
    >>> for name, op, inputs in [("v", "Placeholder", []), ("read", "ReadVariableOp", ["v"]),
    ...                          ("use", "MatMul", ["read", "read"]), ("g", "Const", []),
    ...                          ("update", "AssignSubVariableOp", ["v", "g"])]:
    ...     _ = gd.node.add(name=name, op=op, input=inputs)
    >>> update_after_reads(gd), list(gd.node[-1].input)
    (1, ['v', 'g', '^use'])
    """
    import networkx as nx

    reads: dict[str, list[str]] = {}
    consumers: dict[str, list[str]] = {}
    for n in gd.node:
        if n.op == "ReadVariableOp" and n.input:
            reads.setdefault(_source(n.input[0])[0], []).append(n.name)
        for x in n.input:
            src, suffix = _source(x)
            if suffix != "^":
                consumers.setdefault(src, []).append(n.name)
    writes = [n for n in gd.node if n.op in VARIABLE_WRITES and n.input and _source(n.input[0])[0] in reads]
    if not writes:
        return 0
    g = dependency_graph(gd)
    added = 0
    for w in writes:
        # a write has few descendants (a step ends with its updates): only those would close a cycle. A
        # reader that precedes the write already gets a redundant edge (cheaper than finding its ancestors)
        after = nx.descendants(g, w.name) | {w.name}
        inputs = {_source(x)[0] for x in w.input}
        readers = {c for r in reads[_source(w.input[0])[0]] for c in consumers.get(r, ())}
        for r in sorted(readers - after - inputs):
            w.input.append(f"^{r}")
            g.add_edge(r, w.name)
            added += 1
    return added


def dependency_graph(gd: tf.compat.v1.GraphDef) -> Any:
    """``gd`` as a ``networkx.DiGraph``: a node per node, an edge per data or control input.

    Examples
    --------
    >>> gd = tf.compat.v1.GraphDef()
    >>> _ = gd.node.add(name="a", op="Const")
    >>> _ = gd.node.add(name="b", op="Identity", input=["a:0", "^a"])
    >>> sorted(dependency_graph(gd).edges)
    [('a', 'b')]
    """
    import networkx as nx

    g = nx.DiGraph()
    g.add_nodes_from(n.name for n in gd.node)
    g.add_edges_from((_source(x)[0], n.name) for n in gd.node for x in n.input)
    return g


def _check_acyclic(gd: tf.compat.v1.GraphDef, order: str) -> None:
    """Raise ``GraphError`` where ``gd``'s nodes (gates included) wait on each other in a cycle."""
    import networkx as nx

    g = dependency_graph(gd)
    if not nx.is_directed_acyclic_graph(g):
        cycle = [u for u, _ in nx.find_cycle(g)]
        shown = " -> ".join(cycle[:3] + ["…"] + cycle[-3:]) if len(cycle) > 6 else " -> ".join(cycle)
        raise GraphError(f"the {order} order's gates wait on each other in a cycle on this placement ({shown}); "
                         "use pipeline='gpipe'")


def pipeline_graph_def(gd: tf.compat.v1.GraphDef, m: int, shared: Sequence[str],
                       inputs: Sequence[str] = ()) -> tf.compat.v1.GraphDef:
    """``m`` copies of the placed ``gd`` (``mb{i}/…``), gated per device between consecutive copies.

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

    Raises
    ------
    GraphError
        A node without a device, or ``m`` below 1.
    """
    if m < 1:
        raise GraphError(f"microbatches must be at least 1, got {m}")
    shared_set = set(shared)
    out = tf.compat.v1.GraphDef()
    out.versions.CopyFrom(gd.versions)
    out.library.CopyFrom(gd.library)
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
            del c.input[:]
            c.input.extend(_renamed(x, shared_set, i) for x in n.input)
            key_of[c.name] = (i, "forward")
    add_gates(out, key_of, fed=[copy_name(i, x) for i in range(m) for x in inputs])
    return out


def replica_keys(gd: tf.compat.v1.GraphDef, scope: str, gradient_scope: str, per_group: int = 0
                 ) -> dict[str, tuple[int, str]]:
    """``(micro-batch, phase)`` of the nodes of a replicated training step (``scope_r/…`` forward,
    ``gradient_scope/scope_r/…`` backward); nodes outside the scopes (the sums, the update) get none.
    ``per_group``: replicas ``r`` are micro-batch ``r mod per_group`` of a group of devices (0: ``r``).

    Examples
    --------
    >>> gd = tf.compat.v1.GraphDef()
    >>> for name in ("replica_0/d/MatMul", "gradient_tape/replica_1/d/MatMul", "Adam/Add"):
    ...     _ = gd.node.add(name=name, op="NoOp")
    >>> sorted(replica_keys(gd, "replica", "gradient_tape").items())
    [('gradient_tape/replica_1/d/MatMul', (1, 'backward')), ('replica_0/d/MatMul', (0, 'forward'))]
    """
    out: dict[str, tuple[int, str]] = {}
    for n in gd.node:
        parts = n.name.split("/")
        phase, at = ("backward", 1) if parts[0] == gradient_scope and len(parts) > 2 else ("forward", 0)
        index = _scope_index(parts[at], scope)
        if index is not None:
            out[n.name] = (index % per_group if per_group else index, phase)
    return out


def _scope_index(part: str, scope: str) -> int | None:
    """``r`` of a name part ``scope_r``, else ``None``."""
    head, _, index = part.rpartition("_")
    return int(index) if head == scope and index.isdigit() else None


def hold_gradient_sums(gd: tf.compat.v1.GraphDef, sum_scope: str, per_group: int = 0) -> tuple[int, int]:
    """Keep Grappler from merging a gated training step's running gradient sums into one ``AddN`` (in place).

    The step sums each variable's gradients as the micro-batches come
    (``sum_scope_r/…``: the running sum after micro-batch ``r``), so at most
    two of them are live, as the simulator assumes. Grappler's arithmetic
    optimizer rewrites such a chain of adds into one ``AddN`` after the last
    micro-batch (``ArithmeticOptimizer/AddOpsRewrite_*``), which keeps every
    micro-batch's gradients live until then. It does not absorb an add that
    drives a control dependency, so each running sum that feeds the next one
    becomes a control input of the gate after micro-batch ``r``'s backward
    pass on its device (:func:`gate_name`): that micro-batch's next unit
    there starts once the sum is done, which the sum's device would
    otherwise do first anyway. Only sums on the device of the gradient they
    add are held (elsewhere the gate would wait for a transfer); returns
    ``(held, running sums)``. ``per_group`` as in :func:`replica_keys` (the
    gates number each group's micro-batches from 0).

    Examples
    --------
    >>> gd = tf.compat.v1.GraphDef()
    >>> for name, inputs in [("gradient_tape/replica_0/g", []), ("gradient_tape/replica_1/g", []),
    ...                      ("gradient_tape/replica_2/g", []),
    ...                      ("sum_1/add", ["gradient_tape/replica_0/g", "gradient_tape/replica_1/g"]),
    ...                      ("sum_2/add", ["sum_1/add", "gradient_tape/replica_2/g"]),
    ...                      (gate_name("backward", 1, "/CPU:0"), [])]:
    ...     _ = gd.node.add(name=name, op="NoOp", input=inputs, device="/CPU:0")
    >>> hold_gradient_sums(gd, "sum")
    (1, 1)
    >>> list(gd.node[-1].input)
    ['^sum_1/add']
    """
    by_name = {n.name: n for n in gd.node}
    running = {n.name: r for n in gd.node if (r := _scope_index(n.name.split("/")[0], sum_scope)) is not None}
    feeds_next = {_source(x)[0] for n in gd.node if n.name in running for x in n.input
                  if running.get(_source(x)[0]) == running[n.name] - 1}
    held = 0
    for name in sorted(feeds_next):
        node, r = by_name[name], running[name]
        added = [by_name[src] for src, suffix in map(_source, node.input) if suffix != "^" and src not in running]
        gate = by_name.get(gate_name("backward", r % per_group if per_group else r, node.device))
        if gate is None or any(a.device != node.device for a in added):
            continue
        gate.input.append(f"^{name}")
        held += 1
    return held, len(feeds_next)


def pipelined_function(gd: tf.compat.v1.GraphDef, m: int, input_names: Sequence[str], output_names: Sequence[str],
                       captures: Sequence[tuple[str, Any]], structured: Any,
                       input_specs: Sequence[tf.TensorSpec],
                       rewrite: Callable[[tf.compat.v1.GraphDef], Any] | None = None) -> Any:
    """A ``tf.function`` running the placed ``gd`` as a pipeline of ``m`` micro-batches.

    Arguments as :func:`placer.tf.emit.import_function`; ``gd`` is the
    placed (not yet copied) graph; ``rewrite`` (optional) changes the copied
    and gated graph in place. Each input is split along its first
    axis into :func:`microbatch_sizes`, each output concatenated.

    Raises
    ------
    InputSignatureError
        An input or output without a batch dimension.
    """
    from .emit import IMPORT_PREFIX, _handle

    for spec in input_specs:
        if spec.shape.rank is None or spec.shape.rank < 1:
            raise InputSignatureError(f"input {spec.name or ''} has no batch dimension to split into micro-batches")
    captures = list(captures)
    names = [ph for ph, _ in captures]
    piped = pipeline_graph_def(gd, m, names, inputs=[_source(x)[0] for x in input_names])
    if rewrite is not None:
        rewrite(piped)
    input_names, output_names = list(input_names), list(output_names)

    def placed_step(*xs: tf.Tensor) -> Any:
        fg = tf.compat.v1.get_default_graph()
        input_map: dict[str, Any] = {}
        for ph, value in captures:
            input_map[f"{ph}:0"] = fg.capture(value if isinstance(value, tf.Tensor) else _handle(value))
        n = tf.shape(xs[0], out_type=tf.int64)[0]
        sizes = n // m + tf.cast(tf.range(m, dtype=tf.int64) < n % m, tf.int64)
        parts = [tf.split(x, sizes, axis=0, num=m) for x in xs]
        for i in range(m):
            for name, part in zip(input_names, parts):
                input_map[copy_name(i, name)] = part[i]
        wanted = [copy_name(i, o) for i in range(m) for o in output_names]
        outs = tf.graph_util.import_graph_def(piped, input_map=input_map, return_elements=wanted, name=IMPORT_PREFIX)
        k = len(output_names)
        joined = []
        for j in range(k):
            pieces = [outs[i * k + j] for i in range(m)]
            if pieces[0].shape.rank == 0:
                raise InputSignatureError(f"output {output_names[j]} is a scalar: micro-batches cannot be joined; "
                                          "use microbatches=1 for this model")
            with tf.device(pieces[-1].device) if pieces[-1].device else contextlib.nullcontext():
                joined.append(tf.concat(pieces, axis=0))
        return tf.nest.pack_sequence_as(structured, joined)

    return tf.function(placed_step, input_signature=list(input_specs), autograph=False)
