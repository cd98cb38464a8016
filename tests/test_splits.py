"""Operator splitting: a dense product split by output columns over devices, each part reading a weight shard.

The op-graph transform (:mod:`placer.core.splits`, no TensorFlow) on random layer chains; the GraphDef
rewrite (:mod:`placer.tf.rewrites.split`) against the unsplit op on random shapes and part counts, forward
and gradient; then real Keras models placed with ``splits=`` on logical CPUs: outputs, where each part runs,
the shards' devices and values, writes reaching the shards, saved plans re-applying their splits, and the
typed refusals.
"""

import json

import networkx as nx
import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

import keras
import tensorflow as tf

import placer
from tests.models import dense_chain, recommender
from placer.core.attrs import COMPUTE_US, MEMORY_BYTES
from placer.core.plan import Plan
from placer.core.splits import (Gradients, Pair, Split, axis_name, descend_splits, even_parts, fused_after,
                                 helper_owner, is_split_node, pair_ops, part_bounds, rejoined, resharded, split_apart,
                                 split_from_dict, split_graph, split_map, split_name, split_to_dict, spread_parts,
                                 with_measured_parts)
from placer.errors import AutoplaceError, GraphError, InsufficientMemoryError, PlanError
from placer.tf.emit import emit, rewrite_context
from placer.tf.placement import ReplicatedVariable
from placer.tf.opgraph import build_op_graph
from placer.tf.rewrites.split import Shard, split_candidates, split_graph_def
from placer.tf.trace import trace_model, trace_training_step


# --- the op-graph transform (no TensorFlow) ----------------------------------------------------------------

def _chain(layers: int, widths: list[int], batch: int) -> tuple[nx.DiGraph, list[Split]]:
    """A chain of dense layers as an op graph: x → (read w_i → MatMul_i → BiasAdd_i → Relu_i)*."""
    g = nx.DiGraph()
    g.add_node("x", compute_us=0.0, op_type="Placeholder", output_bytes=4 * batch * widths[0])
    prev, splits = "x", []
    for i in range(layers):
        rows, cols = widths[i], widths[i + 1]
        ph, r, mm, b, a = f"l{i}/w", f"l{i}/read", f"l{i}/MatMul", f"l{i}/BiasAdd", f"l{i}/Relu"
        g.add_node(ph, compute_us=0.0, op_type="Placeholder", memory_bytes=4 * rows * cols, variable=f"l{i}/kernel",
                   colocation=ph, layer=f"l{i}")
        g.add_node(r, compute_us=1.0, op_type="ReadVariableOp", colocation=ph, layer=f"l{i}")
        g.add_node(mm, compute_us=0.0, op_type="MatMul", output_bytes=4 * batch * cols, layer=f"l{i}")
        g.add_node(b, compute_us=2.0, op_type="BiasAdd", output_bytes=4 * batch * cols, layer=f"l{i}")
        g.add_node(a, compute_us=float(rows * cols) / 100, op_type="Relu", output_bytes=4 * batch * cols,
                   layer=f"l{i}")
        g.add_edge(ph, r, bytes=0)
        g.add_edge(r, mm, bytes=4 * rows * cols)
        g.add_edge(prev, mm, bytes=4 * batch * rows)
        g.add_edge(mm, b, bytes=4 * batch * cols)
        g.add_edge(b, a, bytes=4 * batch * cols)
        prev = a
        splits.append(Split(mm, read=r, placeholder=ph, columns=cols, parts=min(cols, 2 + i % 3)))
    return g, splits


@settings(max_examples=30, deadline=None)
@given(layers=st.integers(1, 4), widths=st.lists(st.integers(4, 64), min_size=5, max_size=5),
       batch=st.integers(1, 8))
def test_split_graph_keeps_the_work_the_memory_and_the_consumers(layers, widths, batch):
    g, splits = _chain(layers, widths, batch)
    s = split_graph(g, splits)
    assert nx.is_directed_acyclic_graph(s)
    for sp in splits:
        k = sp.parts
        parts = [split_name(sp.op, i) for i in range(k)]
        # the fused kernel's time (profiled on the activation) moves onto the parts, in their column shares
        fused = g.nodes[sp.op][COMPUTE_US] + g.nodes[sp.op.replace("MatMul", "BiasAdd")][COMPUTE_US] \
            + g.nodes[sp.op.replace("MatMul", "Relu")][COMPUTE_US]
        assert sum(s.nodes[p][COMPUTE_US] for p in parts) == pytest.approx(fused)
        shares = [s.nodes[p][COMPUTE_US] / fused for p in parts] if fused else []
        if fused:
            assert shares == pytest.approx([n / sp.columns for n in even_parts(sp.columns, k)])
        # the shards hold the weight's bytes between them, each with its part's layer
        shards = [split_name(sp.placeholder, i) for i in range(k)]
        assert sum(s.nodes[p][MEMORY_BYTES] for p in shards) == pytest.approx(g.nodes[sp.placeholder][MEMORY_BYTES],
                                                                              abs=k)
        assert all(s.nodes[split_name(sp.read, i)]["colocation"] == shards[i] for i in range(k))
        assert len({s.nodes[p]["layer"] for p in parts}) == k
        # the op keeps its name and consumers and joins the parts
        assert s.nodes[sp.op]["op_type"] == "ConcatV2"
        assert set(s.predecessors(sp.op)) == set(parts) | {axis_name(sp.op)}
        assert list(s.successors(sp.op)) == list(g.successors(sp.op))
        assert sp.read not in s and sp.placeholder not in s


@settings(max_examples=30, deadline=None)
@given(layers=st.integers(2, 5), widths=st.lists(st.integers(4, 64), min_size=6, max_size=6),
       batch=st.integers(1, 8), parts=st.integers(2, 4))
def test_pairs_in_the_op_graph_keep_the_memory_and_sum_the_second_products_parts(layers, widths, batch, parts):
    g, _ = _chain(layers, widths, batch)
    splits = []
    for i in range(0, layers - 1, 2):  # l0+l1, l2+l3, …: each first product by columns, the next by rows
        k = min(parts, widths[i + 1])
        pair = Pair(f"l{i + 1}/MatMul", f"l{i + 1}/read", f"l{i + 1}/w", chain=(f"l{i}/BiasAdd", f"l{i}/Relu"))
        splits.append(Split(f"l{i}/MatMul", read=f"l{i}/read", placeholder=f"l{i}/w", columns=widths[i + 1], parts=k,
                            pair=pair))
    s = split_graph(g, splits)
    assert nx.is_directed_acyclic_graph(s)
    assert sum(s.nodes[v].get(MEMORY_BYTES, 0) for v in s) == pytest.approx(
        sum(g.nodes[v].get(MEMORY_BYTES, 0) for v in g), abs=4 * len(splits) * parts)
    for sp in splits:
        nodes = {n for i in range(sp.parts) for n in sp.part_nodes(i)}
        assert nodes <= set(s) and len(nodes) == sp.parts * 8
        gone = {sp.op, axis_name(sp.op), *sp.pair.chain, sp.read, sp.placeholder, sp.pair.read, sp.pair.placeholder}
        assert not gone & set(s)
        b = sp.pair.op
        assert s.nodes[b]["op_type"] == "AddN" and set(s.predecessors(b)) == {split_name(b, i) for i in range(sp.parts)}
        assert list(s.successors(b)) == list(g.successors(b))
        for i in range(sp.parts):  # each part's chain runs on its own columns: no edge between parts
            chain = [split_name(n, i) for n in (sp.op, *sp.pair.chain, b)]
            assert all(s.has_edge(u, v) for u, v in zip(chain, chain[1:]))
            assert {p for v in chain[1:] for p in s.predecessors(v)} <= set(chain) | set(sp.part_nodes(i))
    assert split_map(splits) == {n: sp.parts for sp in splits for n in (sp.op, sp.pair.op)}


def test_split_graph_refuses_a_shared_weight_and_a_twice_split_op():
    g, splits = _chain(1, [8, 8], 2)
    g.add_node("other", compute_us=1.0, op_type="Identity")
    g.add_edge("l0/read", "other", bytes=256)
    with pytest.raises(GraphError, match="read by other ops"):
        split_graph(g, splits)
    g, splits = _chain(1, [8, 8], 2)
    with pytest.raises(GraphError, match="split twice"):
        split_graph(g, splits + splits)
    with pytest.raises(GraphError, match="cannot split 3 columns into 4"):
        Split("m", read="r", placeholder="p", columns=3, parts=4)


def test_a_subset_of_splits_takes_the_profiled_times_of_its_parts_only():
    g, splits = _chain(3, [8, 8, 8, 8], 2)
    profiled = split_graph(g, splits)
    for v in profiled:
        profiled.nodes[v][COMPUTE_US] = 7.0
    one = split_graph(g, splits[1:2])
    out = with_measured_parts(one, profiled, g, splits[1:2])
    assert nx.is_directed_acyclic_graph(out)
    sp = splits[1]
    changed = {sp.op, "l1/BiasAdd", "l1/Relu", axis_name(sp.op)} | {
        split_name(n, i) for i in range(sp.parts) for n in (sp.op, sp.read, sp.placeholder)}
    for v in out:
        expected = 7.0 if v in changed else g.nodes[v][COMPUTE_US]
        assert out.nodes[v][COMPUTE_US] == expected, v
    assert "l0/MatMul" in out and "l0/w" in out and "l2/read" in out  # the other layers are whole


def test_spread_parts_puts_each_part_on_its_device():
    g, splits = _chain(2, [8, 8, 8], 2)
    s = split_graph(g, splits)
    spread = spread_parts(dict.fromkeys(s, "/d:0"), splits, ["/d:0", "/d:1"])
    for sp in splits:
        for i in range(sp.parts):
            assert {spread[split_name(n, i)] for n in (sp.op, sp.read, sp.placeholder)} == {["/d:0", "/d:1"][i % 2]}



def _check_rejoined(whole: nx.DiGraph, splits: list[Split], draw) -> None:
    """Every split applied and its graph's nodes put on random devices: running some of the layers whole
    (:func:`rejoined`) gives a plan of every node of the graph without them, those layers where their join
    (a pair: its sum) ran and the rest where they were; splitting them again (:func:`split_apart`) gives a plan of every
    node of the graph with all split, their parts side by side."""
    every = split_graph(whole, splits)
    devices = ["/d:0", "/d:1", "/d:2"]
    a = {v: devices[draw(st.integers(0, 2))] for v in sorted(every)}
    together = [sp for sp in splits if draw(st.booleans())]
    kept = [sp for sp in splits if sp not in together]
    fewer = split_graph(whole, kept)
    out = rejoined(a, together, fewer.nodes)
    assert out is not None and set(out) == set(fewer)  # a plan of every node of the graph with fewer splits
    for sp in kept:  # the splits kept keep their parts where the plan put them
        assert all(out[n] == a[n] for i in range(sp.parts) for n in sp.part_nodes(i))
    for sp in together:  # the others run whole where their join (a pair: its sum) ran
        d = a[sp.ops[-1]]
        assert {out[n] for n in (sp.op, sp.read, sp.placeholder, *(sp.pair.chain if sp.pair else ()))} == {d}
    assert all(out[v] == a[v] for v in fewer if v in every)
    assert rejoined(a, together, [*fewer.nodes, "not-a-node"]) is None
    back = split_apart(out, together, devices, every.nodes)
    assert back is not None and set(back) == set(every)
    for sp in together:
        assert all(back[n] == devices[i % 3] for i in range(sp.parts) for n in sp.part_nodes(i))
        assert back[sp.ops[-1]] == out[sp.ops[-1]]  # the join (a pair: its sum) where the whole op ran
    assert all(back[v] == out[v] for v in fewer if v in every)


@settings(max_examples=40, deadline=None)
@given(layers=st.integers(1, 5), widths=st.lists(st.integers(4, 64), min_size=6, max_size=6),
       batch=st.integers(1, 8), data=st.data())
def test_the_layers_a_plan_of_every_split_spreads_are_split_and_the_others_run_whole_on_their_device(
        layers, widths, batch, data):
    whole, splits = _chain(layers, widths, batch)
    _check_rejoined(whole, splits, data.draw)


@settings(max_examples=30, deadline=None)
@given(layers=st.integers(2, 6), widths=st.lists(st.integers(4, 64), min_size=7, max_size=7),
       batch=st.integers(1, 8), parts=st.integers(2, 3), data=st.data())
def test_pairs_a_plan_keeps_together_run_whole_on_their_device(layers, widths, batch, parts, data):
    whole, _ = _chain(layers, widths, batch)
    pairs = [Split(f"l{i}/MatMul", read=f"l{i}/read", placeholder=f"l{i}/w", columns=widths[i + 1],
                   parts=min(parts, widths[i + 1]),
                   pair=Pair(f"l{i + 1}/MatMul", f"l{i + 1}/read", f"l{i + 1}/w",
                             chain=(f"l{i}/BiasAdd", f"l{i}/Relu")))
             for i in range(0, layers - 1, 2)]
    _check_rejoined(whole, pairs, data.draw)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 7), data=st.data(), budget=st.integers(0, 40))
def test_the_layer_by_layer_descent_ends_where_no_toggle_is_faster(n, data, budget):
    """A step whose time depends on the layers split (each layer's saving, and pairs of layers interacting):
    the descent never returns a slower set, returns the step of the set it returns, scores no set twice and
    never the empty one, keeps to its budget, and within it stops only where no single toggle is faster."""
    gains = data.draw(st.lists(st.floats(-5, 5), min_size=n, max_size=n))
    pairs = data.draw(st.dictionaries(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), st.floats(-3, 3),
                                      max_size=6))

    def time_of(layers: frozenset[int]) -> float:
        return 100.0 - sum(gains[i] for i in layers) - sum(v for (i, j), v in pairs.items()
                                                          if i != j and i in layers and j in layers)

    start = frozenset(data.draw(st.sets(st.integers(0, n - 1), min_size=1)))
    fixed = data.draw(st.sets(st.integers(0, n - 1), max_size=2))  # toggles that cannot be placed: None
    scored = []

    def step_s(current, i):
        scored.append(current ^ {i})
        return None if i in fixed else time_of(current ^ {i})

    chosen, best, evaluations = descend_splits(start, time_of(start), n, step_s, max_evaluations=budget)
    assert best <= time_of(start) and best == time_of(chosen) and chosen
    # where the budget ends mid-round, the fastest set already scored is taken (the runner lists every set
    # scored as a candidate, and keeps the graphs of the one returned only)
    assert all(best <= time_of(t) for t in scored if not (t ^ start) & fixed or t == chosen)
    assert evaluations == len(scored) <= budget and len(set(scored)) == len(scored) and frozenset() not in scored
    assert (chosen ^ start) <= set(range(n)) - fixed or chosen == start  # never through a toggle it could not place
    if evaluations < budget:  # a local optimum: no single toggle it can place (but to no split at all) is faster
        assert all(time_of(chosen ^ {i}) >= best for i in range(n) if chosen ^ {i} and i not in fixed)

# --- the GraphDef rewrite, forward and gradient ---------------------------------------------------------------

def _split_emitted(model: keras.Model, batch: int, parts: int, pairs: bool = False):
    """``model`` traced at ``batch`` with its one splittable op (``pairs``: or pair) split ``parts`` ways, part
    ``i`` on logical CPU ``i % 2``: (the split, the emitted graph, the variables it reads, the model's own
    variable of each placeholder)."""
    traced = trace_model(model, batch_size=batch)
    found = split_candidates(traced.fixed.graph, traced.variables, parts, pairs=pairs)
    assert len(found) == 1
    sp = found[0]
    devices = {op.name: "/CPU:0" for op in traced.dynamic.graph.get_operations()}
    for i in range(parts):
        devices.update({n: f"/CPU:{i % 2}" for n in sp.part_nodes(i)})
    devices[axis_name(sp.op)] = "/CPU:0"
    variables = {ph: ReplicatedVariable(v.value.read_value(), name=v.name) for ph, v in traced.variables.items()}
    emitted = emit(traced, variables, rewrite_context(traced, devices, splits=split_map([sp]),
                                                      pairs=frozenset(pair_ops([sp]))),
                   shard=lambda v, s: v.shard_on(s))
    return sp, emitted, variables, dict(traced.variables)  # …, placeholder → the model's own variable


def _assert_split_equals_model(model: keras.Model, emitted, owners, x: tf.Tensor, rtol: float = 1e-6) -> None:
    """``emitted`` (:func:`_split_emitted`) against ``model`` on ``x``: the outputs (within ``rtol``), the input's
    gradient of a random weighting of them, and each shard's gradient — its slice of its whole weight's (the
    shards are not trainable variables of their own: watched here)."""
    out_shape = model(x).shape
    weights = tf.constant(np.random.default_rng(1).standard_normal(out_shape).astype("float32"))
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        for v in emitted.shard_variables:
            tape.watch(v)
        ours, theirs = emitted.function(x), model(x)
        loss_ours, loss_theirs = tf.reduce_sum(ours * weights), tf.reduce_sum(theirs * weights)
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=rtol, atol=rtol)
    np.testing.assert_allclose(tape.gradient(loss_ours, x).numpy(), tape.gradient(loss_theirs, x).numpy(),
                               rtol=1e-5, atol=1e-5)
    for shard, v in zip(emitted.shards, emitted.shard_variables):
        whole = tf.convert_to_tensor(tape.gradient(loss_theirs, owners[shard.variable].value))
        np.testing.assert_allclose(tape.gradient(loss_ours, v).numpy(), shard.slice_of(whole).numpy(),
                                   rtol=1e-5, atol=1e-5)


@settings(max_examples=8, deadline=None)
@given(batch=st.integers(1, 5), rows=st.integers(1, 24), cols=st.integers(2, 24), parts=st.integers(2, 4),
       seed=st.integers(0, 1000))
def test_the_split_rewrite_equals_the_unsplit_op_forward_and_backward(batch, rows, cols, parts, seed):
    parts = min(parts, cols)
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((rows,)), keras.layers.Dense(cols, name="d")])
    sp, emitted, variables, owners = _split_emitted(model, batch, parts)
    assert len(emitted.shards) == parts and {s.device for s in emitted.shards} == {"/CPU:0", "/CPU:1"}
    bounds = [(s.start, s.stop) for s in emitted.shards]
    assert bounds[0][0] == 0 and bounds[-1][1] == cols and all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    _assert_split_equals_model(model, emitted, owners, tf.constant(
        np.random.default_rng(seed).standard_normal((batch, rows)).astype("float32")))


@settings(max_examples=6, deadline=None)
@given(batch=st.integers(1, 3), seq=st.integers(1, 4), c=st.integers(1, 12), heads=st.integers(2, 6),
       h=st.integers(1, 5), parts=st.integers(2, 4), seed=st.integers(0, 1000))
def test_an_einsum_dense_split_by_heads_equals_the_unsplit_layer_forward_and_backward(batch, seq, c, heads, h, parts,
                                                                                      seed):
    # EinsumDense traces to Reshape(kernel (c, heads, h) → (c, heads·h)) and BatchMatMulV2: split by whole heads
    parts = min(parts, heads)
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((seq, c)), keras.layers.EinsumDense(
        "abc,cde->abde", output_shape=(seq, heads, h), bias_axes="de", name="proj")])
    sp, emitted, variables, owners = _split_emitted(model, batch, parts)
    assert (sp.kind, sp.columns, sp.reshape is not None) == ("columns", heads, True)
    assert [(s.start, s.stop, s.axis) for s in emitted.shards] == [(a, b, 1) for a, b in part_bounds(heads, parts)]
    _assert_split_equals_model(model, emitted, owners, tf.constant(
        np.random.default_rng(seed).standard_normal((batch, seq, c)).astype("float32")))


@settings(max_examples=8, deadline=None)
@given(batch=st.integers(1, 5), length=st.integers(1, 6), rows=st.integers(2, 40), dim=st.integers(1, 8),
       parts=st.integers(2, 4), seed=st.integers(0, 1000))
def test_the_lookup_split_equals_the_unsplit_lookup_forward_and_backward(batch, length, rows, dim, parts, seed):
    parts = min(parts, rows)
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((length,), dtype="int32"), keras.layers.Embedding(rows, dim, name="e")])
    sp, emitted, variables, owners = _split_emitted(model, batch, parts)
    assert sp.kind == "rows" and sp.columns == rows
    table = next(iter(variables.values()))
    assert [(s.start, s.stop, s.axis) for s in emitted.shards] == [(a, b, 0) for a, b in part_bounds(rows, parts)]
    # every part of the lookup, its ids and mask run where its shard is
    placed = {n.name: n.device for n in emitted.graph_def.node}
    for i in range(parts):
        helpers = [n for n in placed if n.startswith(split_name(sp.op, i) + "/")]
        assert helpers and {placed[n] for n in helpers} == {placed[split_name(sp.op, i)]}
    rng = np.random.default_rng(seed)
    ids = tf.constant(rng.integers(-rows, rows, (batch, length)).astype("int32"))  # Keras maps negative ids
    weights = tf.constant(rng.standard_normal((batch, length, dim)).astype("float32"))
    with tf.GradientTape(persistent=True) as tape:
        for v in table.shards:
            tape.watch(v)
        ours = emitted.function(ids)
        theirs = model(ids)
        loss_ours = tf.reduce_sum(ours * weights)
        loss_theirs = tf.reduce_sum(theirs * weights)
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())  # one part holds each row, the others add zeros
    whole = tf.convert_to_tensor(tape.gradient(loss_theirs, model.layers[0].embeddings.value)).numpy()
    for shard, v in zip(emitted.shards, table.shards):
        grad = tape.gradient(loss_ours, v)
        assert isinstance(grad, tf.IndexedSlices)  # sparse, as the unsplit lookup's
        np.testing.assert_allclose(tf.convert_to_tensor(grad).numpy(), whole[shard.start:shard.stop],
                                   rtol=1e-6, atol=1e-6)
    with pytest.raises(tf.errors.InvalidArgumentError):  # an id past the table fails as the unsplit lookup does
        emitted.function(tf.fill((batch, length), rows))


@settings(max_examples=8, deadline=None)
@given(dims=st.sampled_from([1, 2, 3]), batch=st.integers(1, 3), size=st.integers(3, 6), cin=st.integers(1, 4),
       cout=st.integers(2, 12), kernel=st.integers(1, 3), parts=st.integers(2, 4), seed=st.integers(0, 1000))
def test_a_convolution_split_by_output_channels_equals_the_unsplit_one_forward_and_backward(
        dims, batch, size, cin, cout, kernel, parts, seed):
    parts = min(parts, cout)
    keras.utils.set_random_seed(seed)
    conv = {1: keras.layers.Conv1D, 2: keras.layers.Conv2D, 3: keras.layers.Conv3D}[dims]
    model = keras.Sequential([keras.Input((size,) * dims + (cin,)), conv(cout, kernel, padding="same", name="c")])
    sp, emitted, variables, owners = _split_emitted(model, batch, parts)
    assert sp.columns == cout and (sp.reshape is not None) == (dims == 1)  # Conv1D: its filter's ExpandDims
    assert [(s.start, s.stop, s.axis) for s in emitted.shards] == [(a, b, dims + 1) for a, b in
                                                                     part_bounds(cout, parts)]
    _assert_split_equals_model(model, emitted, owners, tf.constant(np.random.default_rng(seed).standard_normal(
        (batch,) + (size,) * dims + (cin,)).astype("float32")), rtol=1e-5)


@settings(max_examples=8, deadline=None)
@given(batch=st.integers(1, 4), rows=st.integers(1, 12), hidden=st.integers(2, 16), cols=st.integers(1, 12),
       parts=st.integers(2, 4), activation=st.sampled_from([None, "relu", "tanh", "sigmoid", "gelu"]),
       bias=st.booleans(), seed=st.integers(0, 1000))
def test_a_megatron_pair_equals_the_two_unsplit_layers_forward_and_backward(batch, rows, hidden, cols, parts,
                                                                             activation, bias, seed):
    # Dense(hidden, activation) → Dense(cols): the first by columns (its bias too), the second by rows, one sum
    parts = min(parts, hidden)
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((rows,)),
                              keras.layers.Dense(hidden, activation=activation, use_bias=bias, name="a"),
                              keras.layers.Dense(cols, use_bias=False, name="b")])
    sp, emitted, variables, owners = _split_emitted(model, batch, parts, pairs=True)
    # GELU is five element-wise ops (0.5 * x * erfc(-x * c), two scalar constants): a graph, not a chain
    assert sp.pair is not None and len(sp.pair.chain) == int(bias) + {None: 0, "gelu": 5}.get(activation, 1)
    bounds = part_bounds(hidden, parts)
    assert [(s.start, s.stop, s.axis) for s in emitted.shards if s.variable == sp.placeholder] == [
        (a, b, 1) for a, b in bounds]
    assert [(s.start, s.stop, s.axis) for s in emitted.shards if s.variable == sp.pair.placeholder] == [
        (a, b, 0) for a, b in bounds]
    types = {n.name: n.op for n in emitted.graph_def.node}
    assert types[sp.pair.op] == "AddN" and sp.op not in types and not any(c in types for c in sp.pair.chain)
    _assert_split_equals_model(model, emitted, owners, tf.constant(
        np.random.default_rng(seed).standard_normal((batch, rows)).astype("float32")), rtol=1e-5)


def test_a_fused_gelu_after_a_product_moves_its_time_onto_the_parts():
    # profiled with the graph optimizer on, a product's fused bias add and exact GELU hold the kernel's time on
    # the GELU's last op; split, that time is the parts' (it stayed on the GELU and was counted twice: a GELU
    # MLP's split plans were predicted 50-89% slow on two workers)
    def gelu_graph(extra_reader: bool = False) -> nx.DiGraph:
        g = nx.DiGraph()
        for v, t, us in [("x", "Placeholder", 0.0), ("w", "Placeholder", 0.0), ("r", "ReadVariableOp", 0.0),
                         ("m", "MatMul", 0.0), ("b", "BiasAdd", 0.0), ("h", "Mul", 0.0), ("n", "Neg", 0.0),
                         ("c", "Const", 0.0), ("s", "Mul", 0.0), ("e", "Erfc", 0.0), ("y", "Mul", 800.0),
                         ("out", "Identity", 1.0)]:
            g.add_node(v, op_type=t, compute_us=us, output_bytes=64)
        g.nodes["w"].update(memory_bytes=4096, variable="d/kernel", colocation="w")
        g.nodes["r"]["colocation"] = "w"
        edges = [("x", "m"), ("w", "r"), ("r", "m"), ("m", "b"), ("b", "h"), ("b", "n"), ("n", "s"), ("c", "s"),
                 ("s", "e"), ("h", "y"), ("e", "y"), ("y", "out")] + ([("b", "out")] if extra_reader else [])
        g.add_edges_from(edges, bytes=64)
        return g

    g = gelu_graph()
    assert fused_after(g, "m") == ["b", "h", "n", "s", "e", "y"]
    split = split_graph(g, [Split("m", read="r", placeholder="w", columns=16, parts=2)])
    parts = [split.nodes[f"m/autoplace_split_{i}"]["compute_us"] for i in range(2)]
    assert parts == [400.0, 400.0] and split.nodes["y"]["compute_us"] < 1.0
    assert fused_after(gelu_graph(extra_reader=True), "m") == ["b"]   # its input read elsewhere: not fused


def test_a_gelu_between_two_products_pairs_them_and_a_vector_constant_or_a_second_reader_does_not():
    keras.utils.set_random_seed(0)

    def traced_pairs(between):
        inp = keras.Input((8,))
        h = keras.layers.Dense(16, name="a")(inp)
        out = keras.layers.Dense(4, use_bias=False, name="b")(between(h))
        traced = trace_model(keras.Model(inp, out), batch_size=2)
        return [s.pair for s in split_candidates(traced.fixed.graph, traced.variables, 2, pairs=True)
                if s.pair is not None], traced

    (pair,), traced = traced_pairs(keras.activations.gelu)
    types = [traced.fixed.graph.get_operation_by_name(c).type for c in pair.chain]
    assert types[0] == "BiasAdd" and "Erfc" in types and pair.bias_read is not None
    scale = keras.ops.convert_to_tensor(np.linspace(1, 2, 16).astype("float32"))
    assert traced_pairs(lambda h: h * scale)[0] == []      # a vector would have to be split by the columns too
    assert traced_pairs(lambda h: keras.ops.relu(h) * 2.0)[0] != []   # a scalar commutes with them
    assert traced_pairs(lambda h: keras.ops.relu(h) + keras.ops.mean(h, axis=-1, keepdims=True))[0] == []
    # the parts compute the GELU on their own columns: forward and every gradient equal the two unsplit layers
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(12, activation="gelu", name="a"),
                              keras.layers.Dense(5, use_bias=False, name="b")])
    sp, emitted, _, owners = _split_emitted(model, 3, 3, pairs=True)
    assert sp.pair is not None and len(sp.pair.chain) == 6
    _assert_split_equals_model(model, emitted, owners, tf.constant(
        np.random.default_rng(1).standard_normal((3, 6)).astype("float32")), rtol=1e-5)


def test_products_pair_only_through_element_wise_ops_and_saved_plans_pair_what_they_name():
    keras.utils.set_random_seed(0)
    inp = keras.Input((8,))
    h = keras.layers.Dense(16, activation="relu", name="a")(inp)
    branch = keras.layers.Dense(16, name="b")(h)  # h feeds two products: no pair
    out = keras.layers.Dense(4, name="c")(keras.layers.Add()([branch, keras.layers.Dense(16, name="d")(h)]))
    traced = trace_model(keras.Model(inp, out), batch_size=2)
    found = split_candidates(traced.fixed.graph, traced.variables, 2, pairs=True)
    assert all(s.pair is None for s in found) and len(found) == 4
    model = dense_chain(8, 16, 4, "chain")  # d1 → d2 pair; the head alone
    traced = trace_model(model, batch_size=2)
    found = split_candidates(traced.fixed.graph, traced.variables, 2, pairs=True)
    assert [s.pair is not None for s in found] == [True, False]
    named, pairs = split_map(found), pair_ops(found)
    assert len(named) == 3 and pairs == (found[0].op,)
    again = split_candidates(traced.fixed.graph, traced.variables, named, pairs=pairs)  # a saved plan: the pair
    assert [s.pair for s in again] == [s.pair for s in found]
    alone = split_candidates(traced.fixed.graph, traced.variables, named)  # the same ops, not paired: by columns
    assert [s.pair for s in alone] == [None, None, None]
    d1, d2 = found[0].op, found[0].pair.op
    with pytest.raises(PlanError, match=f"pairs {d1}"):  # a pair split two ways and three
        split_candidates(traced.fixed.graph, traced.variables, {d1: 2, d2: 3}, pairs=pairs)
    g, _ = _chain(2, [8, 8, 8], 2)  # l0 → BiasAdd → Relu → l1, the BiasAdd's bias not a variable
    pair = Pair("l1/MatMul", "l1/read", "l1/w", chain=("l0/BiasAdd", "l0/Relu"))
    ok = split_graph(g, [Split("l0/MatMul", read="l0/read", placeholder="l0/w", columns=8, parts=2, pair=pair)])
    assert ok.nodes["l1/MatMul"]["op_type"] == "AddN" and "l0/MatMul" not in ok and "l0/Relu" not in ok
    g.add_edge("l0/Relu", "elsewhere", bytes=64)
    with pytest.raises(GraphError, match="cannot pair l0/MatMul with l1/MatMul: l0/Relu feeds other ops"):
        split_graph(g, [Split("l0/MatMul", read="l0/read", placeholder="l0/w", columns=8, parts=2, pair=pair)])


def test_grouped_and_depthwise_convolutions_are_not_split():
    for layer in (keras.layers.Conv2D(8, 3, groups=2), keras.layers.DepthwiseConv2D(3),
                  keras.layers.Conv2DTranspose(6, 3)):
        traced = trace_model(keras.Sequential([keras.Input((8, 8, 4)), layer]), batch_size=2)
        assert split_candidates(traced.fixed.graph, traced.variables, 2) == [], layer


# --- real models placed with splits -------------------------------------------------------------------------

def _wide() -> keras.Model:
    return dense_chain(48, 96, 6, "wide")


@pytest.fixture(scope="module")
def split_placed(devices):
    model = _wide()
    placed = placer.autoplace(model, devices[:2], batch_size=4, splits="all", split_min_bytes=4096, time_limit_s=1)
    return model, placed


def test_a_gelu_mlp_placed_with_its_pair_split_equals_the_model(devices):
    # a Transformer's feed-forward block (Dense(gelu) → Dense): the op graph's pair (each part's GELU graph on
    # its columns, shared constants) is placed and emitted; the outputs equal the model's
    keras.utils.set_random_seed(0)
    inp = keras.Input((48,))
    h = keras.layers.Dense(96, activation="gelu", name="up")(inp)
    model = keras.Model(inp, keras.layers.Dense(48, name="down")(h), name="ffn")
    placed = placer.autoplace(model, devices[:2], batch_size=4, splits="all", split_min_bytes=4096, time_limit_s=1)
    assert placed.plan.pairs and "column then row" in placed.plan.summary()
    x = np.random.default_rng(2).standard_normal((4, 48)).astype("float32")
    np.testing.assert_allclose(placed(x).numpy(), model(x).numpy(), rtol=1e-5, atol=1e-6)
    # each part's GELU (Grappler may fuse it with the part's product, named by its last op) runs where planned
    ran = placed.observed_placement(x)
    gelu = {op: d for op, d in ran.items() if op.startswith("ffn") and "/Gelu/" in op and "autoplace_split_" in op}
    assert {op.rsplit("_", 1)[-1] for op in gelu} == {"0", "1"}, sorted(ran)
    full = {d: tf.DeviceSpec.from_string("/job:localhost/replica:0/task:0/device:" + d.strip("/")).to_string()
            for d in devices[:2]}
    assert all(d == full.get(placed.plan.assignment[op], placed.plan.assignment[op]) for op, d in gelu.items()
               if op in placed.plan.assignment)


def test_split_placement_equals_the_model_and_runs_each_part_on_its_device(split_placed, devices):
    model, placed = split_placed
    plan = placed.plan
    # the two wide layers are split (the head's 96×6 weight is under split_min_bytes)
    assert sorted(op.split("/")[-2].split("_")[0] for op in plan.splits) == ["d1", "d2"]
    assert set(plan.splits.values()) == {2}
    assert "products by output columns" in plan.summary() and "column then row" in plan.summary()
    assert any("operator splits:" in line for line in plan.log)
    x = np.random.default_rng(1).standard_normal((4, 48)).astype("float32")
    np.testing.assert_allclose(placed(x).numpy(), model(x).numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(placed.predict(x, batch_size=2, verbose=0), model(x).numpy(), rtol=1e-6, atol=1e-6)
    emitted = placed.placement.functions.forward(False)
    full = {d: tf.DeviceSpec.from_string("/job:localhost/replica:0/task:0/device:" + d.strip("/")).to_string()
            for d in devices[:2]}
    observed = placed.observed_placement(x)
    for op, k in plan.splits.items():
        for i in range(k):
            part = split_name(op, i)
            # Grappler fuses the first product's part with its bias add and ReLU (named after the ReLU)
            ran = observed.get(part) or observed[split_name(op.replace("MatMul", "Relu"), i)]
            assert ran == tf.DeviceSpec.from_string(plan.assignment[part]).to_string()
    # no whole kernel of a split layer is read; each shard lives where its part runs and holds its columns
    reads = {n.name for n in emitted.graph_def.node if n.op == "ReadVariableOp"}
    for op in plan.splits:
        whole_read = op.rsplit("/", 1)[0] + "/Cast/ReadVariableOp"
        assert whole_read not in reads and split_name(whole_read, 1) in reads
    for shard, v in zip(emitted.shards, emitted.shard_variables):
        assert tf.DeviceSpec.from_string(v.device).to_string() == tf.DeviceSpec.from_string(shard.device).to_string()
        assert shard.device == plan.assignment[shard.placeholder]
    sharded = [(w, theirs) for w, theirs in zip(placed.weights, model.weights)
               if isinstance(w, ReplicatedVariable) and w.shards]
    # d1 and d2 are a Megatron pair: d1's kernel and bias by columns, d2's kernel by rows; no join between them
    assert len(sharded) == 3
    axes = {(s.variable, s.axis) for s in emitted.shards}
    assert sorted(a for _, a in axes) == [0, 0, 1]
    for w, theirs in sharded:
        axis = 1 if len(w.shape) == 2 and w.shards[0].shape[0] == w.shape[0] else 0
        assert np.array_equal(np.concatenate([s.numpy() for s in w.shards], axis=axis), theirs.numpy())
        assert {tf.DeviceSpec.from_string(s.device).to_string() for s in w.shards} <= set(full.values())
    d1, d2 = sorted(plan.splits)
    types = {n.name: n.op for n in emitted.graph_def.node}
    assert types[d2] == "AddN" and d1 not in types  # d2 sums its parts; d1's join is gone
    assert all(types[split_name(d1.replace("MatMul", op), i)] == op for op in ("BiasAdd", "Relu") for i in (0, 1))


def test_the_report_says_which_ops_are_split_how_and_where_their_shards_are(split_placed, tmp_path):
    from placer.reporting import validate_report

    _, placed = split_placed
    data = placed.report_data
    validate_report(data)
    d1, d2 = sorted(placed.plan.splits)
    assert [(s["op"], s["parts"], s["kind"], s["paired_with"]) for s in data["splits"]] == [(d1, 2, "columns", d2)]
    assert len(data["splits"][0]["variables"]) == 3  # d1's kernel and bias, d2's kernel
    assert sorted((s["start"], s["stop"]) for s in data["shards"]) == [(0, 48), (0, 48), (0, 48), (48, 96),
                                                                       (48, 96), (48, 96)]
    page = (tmp_path / "r.html")
    placed.report(page)
    text = page.read_text(encoding="utf-8")
    assert "Split operators" in text and f"input rows of {d2}" in text and "Weight shards" in text


def test_a_cnn_placed_with_its_convolutions_split_equals_the_model(devices):
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((12, 12, 3)), keras.layers.Conv2D(16, 3, activation="relu", name="c1"),
                              keras.layers.Conv2D(24, 3, activation="relu", name="c2"),
                              keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(5, name="head")])
    placed = placer.autoplace(model, devices[:2], batch_size=2, splits="all", split_min_bytes=1024, time_limit_s=1)
    split = {op.split("/")[1].rsplit("_", 1)[0]: k for op, k in placed.plan.splits.items()}
    assert split == {"c1": 2, "c2": 2}  # the head's 24×5 kernel is under split_min_bytes
    x = np.random.default_rng(2).standard_normal((2, 12, 12, 3)).astype("float32")
    np.testing.assert_allclose(placed(x).numpy(), model(x).numpy(), rtol=1e-5, atol=1e-5)
    emitted = placed.placement.functions.forward(False)
    assert [s.axis for s in emitted.shards] == [3] * 4
    assert all(s.device == placed.plan.assignment[s.placeholder] for s in emitted.shards)  # where the plan put them
    for w, theirs in zip(placed.weights, model.weights):  # the kernels sharded by output channels, whole again
        if isinstance(w, ReplicatedVariable) and w.shards:
            assert np.array_equal(np.concatenate([s.numpy() for s in w.shards], axis=3), theirs.numpy())


def test_writes_reach_the_shards(devices):
    model = _wide()
    placed = placer.autoplace(model, devices[:2], batch_size=4, splits="all", split_min_bytes=4096, time_limit_s=1)
    x = np.random.default_rng(5).standard_normal((4, 48)).astype("float32")
    placed(x)
    rng = np.random.default_rng(6)
    new = [rng.standard_normal(w.shape).astype("float32") for w in model.get_weights()]
    placed.set_weights(new)
    model.set_weights(new)
    # (d1 and d2 are a pair: d2 sums its parts' partial products in another order, equal within 1e-5 relative)
    np.testing.assert_allclose(placed(x).numpy(), model(x).numpy(), rtol=1e-5, atol=1e-5)
    i = next(i for i, w in enumerate(placed.weights) if isinstance(w, ReplicatedVariable) and w.shards)
    placed.weights[i].assign_add(tf.ones_like(placed.weights[i]))
    model.weights[i].assign_add(tf.ones_like(model.weights[i]))
    np.testing.assert_allclose(placed(x).numpy(), model(x).numpy(), rtol=1e-5, atol=1e-5)


def test_a_saved_split_plan_is_reapplied(split_placed, devices, tmp_path):
    model, placed = split_placed
    path = placed.plan.save(tmp_path / "plan.json")
    again = Plan.load(path)
    assert again.splits == placed.plan.splits and again.pairs == placed.plan.pairs and len(again.pairs) == 1
    assert again.to_dict()["version"] == 4  # pairs: an older autoplace refuses it instead of splitting otherwise
    replaced = placer.autoplace(model, devices[:2], batch_size=4, plan=path)
    assert replaced.plan.splits == placed.plan.splits and replaced.plan.assignment == placed.plan.assignment
    x = np.random.default_rng(2).standard_normal((4, 48)).astype("float32")
    np.testing.assert_array_equal(replaced(x).numpy(), placed(x).numpy())


def test_without_pairs_each_product_is_split_by_columns(devices):
    model = _wide()
    placed = placer.autoplace(model, devices[:2], batch_size=4, splits="all", split_min_bytes=4096,
                              split_pairs=False, time_limit_s=1)
    assert len(placed.plan.splits) == 2 and placed.plan.pairs == ()
    types = {n.name: n.op for n in placed.placement.functions.forward(False).graph_def.node}
    assert sorted(types[op] for op in placed.plan.splits) == ["ConcatV2", "ConcatV2"]  # each joins its columns
    x = np.random.default_rng(7).standard_normal((4, 48)).astype("float32")
    np.testing.assert_allclose(placed(x).numpy(), model(x).numpy(), rtol=1e-6, atol=1e-6)


def test_splits_none_and_auto_on_shared_cores_keep_ops_whole(devices):
    model = _wide()
    whole = placer.autoplace(model, devices[:2], batch_size=4, splits="none", split_min_bytes=4096, time_limit_s=1)
    assert whole.plan.splits == {}
    # logical CPUs share this process's threads: splits are not tried for speed there, and the log says so
    auto = placer.autoplace(model, devices[:2], batch_size=4, split_min_bytes=4096, time_limit_s=1)
    said = [line for line in auto.plan.log if line.startswith("operator splits:")]
    assert auto.plan.splits == {} and len(said) == 1 and "one process's CPUs" in said[0], said


def test_a_training_step_is_split_for_speed_but_not_for_single_or_for_copies_asked_for(devices):
    model = _sgd_chain(16, 64, 64)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    common = dict(batch_size=4, training=True, splits="all", split_min_bytes=4096, time_limit_s=1)
    split = placer.autoplace(model, devices[:2], replicas=1, **common)
    assert len(split.plan.splits) == 2 and any("operator splits:" in line for line in split.plan.log)
    x, y = np.ones((8, 16), "float32"), np.ones((8, 64), "float32")
    reference = keras.models.clone_model(model)
    reference.set_weights(model.get_weights())
    reference.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    np.testing.assert_allclose(split.fit(x, y, batch_size=4, shuffle=False, verbose=0).history["loss"],
                               reference.fit(x, y, batch_size=4, shuffle=False, verbose=0).history["loss"], rtol=1e-6)
    single = placer.autoplace(model, devices[:2], algorithm="single", **common)  # one device, as asked
    assert single.plan.splits == {} and len(set(single.plan.assignment.values())) == 1
    copies = placer.autoplace(model, devices[:2], replicas=2, **common)  # two copies, as asked
    assert copies.plan.splits == {} and len(copies.placement.replica_groups) == 2


def test_a_split_placement_exports_serves_and_loads_on_its_devices_and_on_fewer(split_placed, devices, tmp_path):
    from placer.tf.export import LOAD_OPTIONS

    model, placed = split_placed
    x = np.random.default_rng(4).standard_normal((4, 48)).astype("float32")
    expected = placed(x).numpy()
    path = placed.export(tmp_path / "export")
    # TensorFlow serves it alone: each shard a saved variable on its device
    served = tf.saved_model.load(path, options=LOAD_OPTIONS).signatures["serving_default"]
    (arg,) = served.structured_input_signature[1]
    np.testing.assert_array_equal(served(**{arg: tf.constant(x)})["output_0"].numpy(), expected)
    loaded = placer.load(path)
    assert not loaded.remapped and loaded.plan.splits == placed.plan.splits
    np.testing.assert_array_equal(loaded(x).numpy(), expected)
    assert {s.device for s in loaded.shards} == {s.device for s in placed.placement.functions.forward(False).shards}
    # the logical weights: each split kernel whole again, equal to the model's
    logical = loaded.logical_weights()
    assert len(logical) == 3  # the pair's two kernels and the first one's bias
    for value in logical.values():
        assert any(w.shape == value.shape and np.array_equal(w.numpy(), value) for w in model.weights)
    # re-mapped onto one device: the split ops whole again, their weights the shards concatenated
    one = placer.load(path, devices=devices[:1])
    assert one.remapped and not one.resharded and one.plan.splits == {} and one.shards == ()
    assert len(set(one.op_devices.values())) == 1
    np.testing.assert_allclose(one(x).numpy(), expected, rtol=1e-6, atol=1e-6)
    manifest = tmp_path / "export" / "assets.extra" / "autoplace" / "manifest.json"  # an edited shard: refused
    edited = json.loads(manifest.read_text())
    edited["shards"][0]["placeholder"] = "nowhere"
    manifest.write_text(json.dumps(edited))
    with pytest.raises(placer.ExportError, match="shards/0 'nowhere' is not a saved variable.*export it again"):
        placer.load(path)
    again = placer.load(one.export(tmp_path / "again"))  # saved again whole, loaded whole
    assert again.shards == () and again.plan.splits == {}
    np.testing.assert_allclose(again(x).numpy(), expected, rtol=1e-6, atol=1e-6)


def test_a_split_export_is_resharded_for_another_number_of_devices(split_placed, devices, tmp_path):
    """Loaded on three devices, the export's split ops are split three ways (each shard the logical weight's
    slice, no whole copy anywhere); saved so and loaded on two, two ways again; loaded on one, whole (above)."""
    model, placed = split_placed
    x = np.random.default_rng(4).standard_normal((4, 48)).astype("float32")
    expected = placed(x).numpy()
    path = placed.export(tmp_path / "export")
    three = placer.load(path, devices=devices[:3])
    assert three.resharded and set(three.plan.splits) == set(placed.plan.splits)
    assert set(three.plan.splits.values()) == {3} and three.plan.pairs == placed.plan.pairs
    by_weight: dict[str, list] = {}
    for shard in three.shards:
        by_weight.setdefault(shard.variable, []).append((shard.start, shard.stop))
    logical = three.logical_weights()
    assert set(by_weight) == set(logical) and len(logical) == 3  # the pair's two kernels, the first one's bias
    for name, bounds in by_weight.items():
        axis = next(s.axis for s in three.shards if s.variable == name)
        assert sorted(bounds) == part_bounds(logical[name].shape[axis], 3)
        assert any(w.shape == logical[name].shape and np.array_equal(w.numpy(), logical[name]) for w in model.weights)
    graph_nodes = {n.name for n in three.graph_def.node}
    assert set(logical).isdisjoint(graph_nodes)  # no op reads a split weight whole
    np.testing.assert_allclose(three(x).numpy(), expected, rtol=1e-6, atol=1e-6)
    two = placer.load(three.export(tmp_path / "three"), devices=devices[2:])
    assert two.resharded and set(two.plan.splits.values()) == {2}
    np.testing.assert_allclose(two(x).numpy(), expected, rtol=1e-6, atol=1e-6)


def test_a_resharded_load_spreads_the_parts_that_only_fit_apart(devices, tmp_path):
    """A training placement whose wide kernel fits no device (split four ways) loads on three such devices as
    three parts, one on each (a third of the kernel and its gradient fit; two would not), with the model's
    outputs; on two of them no plan fits: a typed error before anything runs."""
    devs = [placer.DeviceSpec(d, memory_bytes=700_000) for d in devices]
    model = _wide_sgd(keras.optimizers.SGD(0.05))
    placed = placer.autoplace(model, devs, batch_size=8, training=True, time_limit_s=1)
    assert list(placed.plan.splits.values()) == [4]
    path = placed.export(tmp_path / "export")
    x = np.random.default_rng(0).standard_normal((8, 32)).astype("float32")
    three = placer.load(path, devices=devs[:3])
    assert list(three.plan.splits.values()) == [3] and len({s.device for s in three.shards}) == 3
    np.testing.assert_allclose(three(x).numpy(), model(x).numpy(), rtol=1e-6, atol=1e-6)
    with pytest.raises(InsufficientMemoryError, match="no plan keeps every device's predicted peak"):
        placer.load(path, devices=devs[:2])


def test_an_edited_resplit_record_is_refused(split_placed, tmp_path):
    _, placed = split_placed
    path = placed.export(tmp_path / "export")
    extra = tmp_path / "export" / "assets.extra" / "autoplace"
    whole_gd, whole_ops = (extra / "whole_graph_def.pb").read_bytes(), (extra / "whole_ops.json").read_bytes()
    gd = tf.compat.v1.GraphDef()
    gd.ParseFromString(whole_gd)
    stray = gd.node.add()  # a variable the export has no value for
    stray.name, stray.op = "stray_variable", "Placeholder"
    stray.attr["dtype"].type = tf.resource.as_datatype_enum
    (extra / "whole_graph_def.pb").write_bytes(gd.SerializeToString())
    with pytest.raises(placer.ExportError, match=r"whole_graph_def.pb: the graph's variables \['stray_variable'\] "
                                                 "have no saved value or shards; export it again"):
        placer.load(path)
    (extra / "whole_graph_def.pb").write_bytes(whole_gd)
    (extra / "whole_ops.json").unlink()
    with pytest.raises(placer.ExportError, match="whole_ops.json: cannot read graph file.*export it again"):
        placer.load(path)
    (extra / "whole_ops.json").write_bytes(whole_ops)
    manifest = json.loads((extra / "manifest.json").read_text())
    manifest["resplit"]["splits"][0]["kind"] = "diagonal"
    (extra / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(placer.ExportError, match="manifest.json: resplit: .*split kind 'diagonal'.*export it again"):
        placer.load(path)
    manifest["resplit"]["splits"][0]["kind"] = "columns"
    (extra / "manifest.json").write_text(json.dumps(manifest))
    (extra / "whole_graph_def.pb").unlink()
    with pytest.raises(placer.ExportError, match="whole_graph_def.pb: not a GraphDef"):
        placer.load(path)


def test_a_recorded_split_reads_back_with_its_pair_and_gradients():
    pair = Pair("b", "rb", "pb", chain=("add", "relu"), bias_read="r2", bias_placeholder="p2")
    grads = Gradients(("g",), "ig", ("u1", "u2"), unused=("i",), slots=("m",))
    for s in (Split("a", read="r", placeholder="p", columns=6, parts=2, pair=pair),
              Split("c", read="r", placeholder="p", columns=6, parts=3, grads=grads)):
        data = json.loads(json.dumps(split_to_dict(s)))  # through JSON, as an export stores it
        assert split_from_dict(data, s.parts) == s
        assert [x.parts for x in resharded([split_from_dict(data, 2)], 4)] == [4]
    with pytest.raises(GraphError, match="not a recorded split"):
        split_from_dict({"op": "a", "shape": 3})


def test_bad_split_requests_are_typed(split_placed, devices, tmp_path):
    model, placed = split_placed
    traced = trace_model(model, batch_size=4)
    everywhere = {op.name: "/CPU:0" for op in traced.dynamic.graph.get_operations()}
    variables = dict(traced.variables)
    for splits, said in (({"wide_1/nowhere/MatMul": 2}, "which this trace does not have"),
                         ({"Identity": 2}, "cannot be split here")):
        with pytest.raises(GraphError, match=f"split rewrite.*{said}.*place again without plan="):
            emit(traced, variables, rewrite_context(traced, everywhere, splits=splits))
    d1, d2 = sorted(placed.plan.splits)
    for pairs, splits, said in (({"wide_1/nowhere/MatMul"}, {d1: 2, d2: 2}, "pairs wide_1/nowhere/MatMul, which"),
                                ({d1}, {d1: 2, d2: 3}, f"pairs {d1} with the product after it")):
        with pytest.raises(GraphError, match=f"split rewrite.*{said}.*place again without plan="):
            emit(traced, variables, rewrite_context(traced, everywhere, splits=splits, pairs=frozenset(pairs)))
    with pytest.raises(AutoplaceError, match="splits must be one of"):
        placer.autoplace(model, devices[:2], batch_size=4, splits="rows")
    with pytest.raises(AutoplaceError, match="split_pairs"):
        placer.autoplace(model, devices[:2], batch_size=4, split_pairs="yes")
    with pytest.raises(AutoplaceError, match="split_toggles"):
        placer.autoplace(model, devices[:2], batch_size=4, split_toggles=-1)
    data = placed.plan.to_dict()
    with pytest.raises(PlanError, match="pairs names"):  # a pair whose products the plan does not split
        Plan.from_dict({**data, "splits": {"wide_1/nowhere/MatMul": 2}})
    data["pairs"] = []
    data["splits"] = {"wide_1/nowhere/MatMul": 2}
    with pytest.raises(PlanError, match="nowhere"):
        placer.autoplace(model, devices[:2], batch_size=4, plan=Plan.from_dict(data))
    data["splits"] = {next(iter(placed.plan.splits)): 1}
    with pytest.raises(PlanError, match="splits of"):
        Plan.from_dict(data)


# --- a product in a training step: its gradients and SGD's update split with it --------------------------------

def _sgd_chain(rows: int, hidden: int, cols: int) -> keras.Model:
    return keras.Sequential([keras.Input((rows,)), keras.layers.Dense(hidden, activation="tanh", name="first"),
                             keras.layers.Dense(cols, name="second")])


OPTIMIZERS = {"sgd": lambda: keras.optimizers.SGD(0.1), "momentum": lambda: keras.optimizers.SGD(0.1, momentum=0.9),
              "adam": lambda: keras.optimizers.Adam(0.01), "adamw": lambda: keras.optimizers.AdamW(0.01, 0.1)}


@settings(max_examples=8, deadline=None)
@given(batch=st.integers(1, 4), rows=st.integers(1, 8), hidden=st.integers(2, 12), cols=st.integers(2, 10),
       parts=st.integers(2, 4), seed=st.integers(0, 1000), optimizer=st.sampled_from(sorted(OPTIMIZERS)))
@example(batch=3, rows=5, hidden=8, cols=6, parts=3, seed=7, optimizer="adamw")  # decay: a write not from the grad
def test_a_training_step_split_equals_the_unsplit_step(batch, rows, hidden, cols, parts, seed, optimizer):
    """Both products of a two-layer step split (the first reads the model's input: no input gradient; the second's
    input gradient is the sum of its parts'), each part on its own logical CPU: one step gives the same loss and
    the same updated weights, the split ones gathered from their shards (Adam's and momentum's slots sharded
    too; the optimizer's state compared too)."""
    parts = min(parts, hidden, cols)
    keras.utils.set_random_seed(seed)
    model = _sgd_chain(rows, hidden, cols)
    reference = keras.models.clone_model(model)
    reference.set_weights(model.get_weights())
    traced = trace_training_step(model, batch_size=batch, optimizer=OPTIMIZERS[optimizer]())
    found = split_candidates(traced.fixed.graph, traced.variables, parts)
    assert [s.grads is not None for s in found] == [True, True]
    assert found[0].grads.input_grad is None and found[1].grads.input_grad is not None
    emitted, variables = _emitted_step(traced, found)
    nodes = {n.name for n in emitted.graph_def.node}
    assert not {s.variable for s in emitted.shards} & nodes  # no whole kernel in the step
    rng = np.random.default_rng(seed)
    x = tf.constant(rng.standard_normal((batch, rows)).astype("float32"))
    y = tf.constant(rng.standard_normal((batch, cols)).astype("float32"))
    _same_step(traced, reference, emitted, variables, optimizer, (x, y))


def _table_model(length: int, rows: int, dim: int) -> keras.Model:
    inp = keras.Input((length,), dtype="int32")
    e = keras.layers.Embedding(rows, dim, name="table")(inp)
    return keras.Model(inp, keras.layers.Dense(1, name="head")(keras.layers.Flatten()(e)))


def _emitted_step(traced, found: list[Split]):
    """``traced``'s step emitted with ``found`` split, part ``i`` on logical CPU ``i % 4``, the rest on CPU 0:
    (the emitted step, its variables by placeholder)."""
    devices = {op.name: "/CPU:0" for op in traced.dynamic.graph.get_operations()}
    for sp in found:
        devices[axis_name(sp.op)] = "/CPU:0"
        for i in range(sp.parts):
            devices.update({n: f"/CPU:{i % 4}" for n in sp.part_nodes(i)})
    variables = {ph: ReplicatedVariable(v.value.read_value(), name=v.name) for ph, v in traced.variables.items()}
    return emit(traced, variables, rewrite_context(traced, devices, splits=split_map(found)),
                shard=lambda v, s: v.shard_on(s)), variables


def _same_step(traced, reference, emitted, variables, optimizer: str, inputs) -> None:
    """One step of ``emitted`` (the split step of ``traced``) gives the loss of one unsplit step of ``reference``
    (a copy of the model) and the same variables after it, the optimizer's included (the split ones gathered
    from their shards)."""
    theirs = trace_training_step(reference, batch_size=int(inputs[0].shape[0]), optimizer=OPTIMIZERS[optimizer]())
    np.testing.assert_allclose(np.asarray(emitted.function(*inputs)), np.asarray(theirs.fixed(*inputs)), rtol=1e-6)
    assert len(traced.variables) == len(theirs.variables)
    for ph, r in zip(traced.variables, theirs.variables.values()):  # captured in the same order
        v = variables[ph]
        v.gather_shards()
        assert v.value.shape == r.shape
        np.testing.assert_allclose(v.value.numpy(), r.numpy(), rtol=1e-5, atol=1e-6)


@settings(max_examples=5, deadline=None)
@given(batch=st.integers(1, 4), length=st.integers(1, 5), rows=st.integers(2, 30), dim=st.integers(1, 6),
       parts=st.integers(2, 4), seed=st.integers(0, 1000), optimizer=st.sampled_from(["momentum", "adam", "adamw"]))
@example(batch=4, length=5, rows=7, dim=3, parts=3, seed=1, optimizer="adam")
@example(batch=2, length=3, rows=9, dim=2, parts=2, seed=2, optimizer="adamw")
def test_a_tables_dense_update_split_equals_the_unsplit_step(batch, length, rows, dim, parts, seed, optimizer):
    """A table whose optimizer updates it densely (Adam's moments, momentum: the sparse gradient summed into a
    table-sized one) splits by rows with its update: each part sums the ids its rows hold and updates its shards
    of the table and its slots; one step gives the same loss, weights and optimizer state (ids repeat)."""
    parts = min(parts, rows)
    keras.utils.set_random_seed(seed)
    model = _table_model(length, rows, dim)
    reference = keras.models.clone_model(model)
    reference.set_weights(model.get_weights())
    traced = trace_training_step(model, batch_size=batch, optimizer=OPTIMIZERS[optimizer]())
    found = [s for s in split_candidates(traced.fixed.graph, traced.variables, parts) if s.kind == "rows"]
    assert len(found) == 1 and found[0].grads is not None and not found[0].updates
    adam = optimizer.startswith("adam")
    assert len(found[0].grads.weight_grads) == (2 if adam else 1)  # Adam sums the squares apart
    assert len(found[0].grads.slots) == (2 if adam else 1)
    emitted, variables = _emitted_step(traced, found)
    nodes = {n.name for n in emitted.graph_def.node}
    assert not {s.variable for s in emitted.shards} & nodes  # neither the table nor a whole slot in the step
    assert sorted((s.start, s.stop) for s in emitted.shards) == sorted(part_bounds(rows, parts) * (
        1 + len(found[0].grads.slots)))
    rng = np.random.default_rng(seed)
    ids = tf.constant(rng.integers(0, rows, (batch, length)).astype("int32"))
    y = tf.constant(rng.standard_normal((batch, 1)).astype("float32"))
    _same_step(traced, reference, emitted, variables, optimizer, (ids, y))


def test_two_tables_looked_up_by_the_same_ids_split_each_with_its_own_update():
    """Two tables Adam trains, looked up by the same ids: each table's split takes its own sums (walked back from
    its writes, not every sum by those ids) and moments; one step equals the unsplit one."""
    keras.utils.set_random_seed(5)
    inp = keras.Input((3,), dtype="int32")
    a = keras.layers.Embedding(12, 4, name="a")(inp)
    b = keras.layers.Embedding(12, 2, name="b")(inp)
    model = keras.Model(inp, keras.layers.Dense(1)(keras.layers.Flatten()(keras.layers.Concatenate()([a, b]))))
    reference = keras.models.clone_model(model)
    reference.set_weights(model.get_weights())
    traced = trace_training_step(model, batch_size=4, optimizer=OPTIMIZERS["adam"]())
    found = [s for s in split_candidates(traced.fixed.graph, traced.variables, 2) if s.kind == "rows"]
    assert len(found) == 2 and all(len(s.grads.weight_grads) == 2 for s in found)
    assert not set(found[0].grads.ops) & set(found[1].grads.ops)
    assert not set(found[0].grads.slots) & set(found[1].grads.slots)
    emitted, variables = _emitted_step(traced, found)
    rng = np.random.default_rng(5)
    ids = tf.constant(rng.integers(0, 12, (4, 3)).astype("int32"))
    y = tf.constant(rng.standard_normal((4, 1)).astype("float32"))
    _same_step(traced, reference, emitted, variables, "adam", (ids, y))


def _split_both_ways(traced, found: list[Split]):
    """``found`` applied to ``traced``'s op graph (:func:`split_graph`) and to its GraphDef (the rewrite): the
    split op graph is acyclic and names exactly the nodes the rewrite makes (its helpers apart). Returns
    ``(op graph, split op graph, split GraphDef, shards)``."""
    og = build_op_graph(traced, {"CPU": {op.name: 10.0 for op in traced.fixed.graph.get_operations()}}).graph
    g = split_graph(og, found)
    assert nx.is_directed_acyclic_graph(g)
    gd, shards = split_graph_def(traced.fixed.graph, traced.variables, found)
    made = {n.name for n in gd.node if is_split_node(n.name) and helper_owner(n.name) is None}
    assert {v for v in g if is_split_node(v)} == made
    return og, g, gd, shards


@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adamw"])
def test_a_products_training_split_in_the_op_graph_matches_the_rewrite(optimizer):
    """The op graph split (:func:`split_graph`) names the nodes the rewrite makes (the parts' ``dy`` slices are
    helpers of their parts), shards the weight's memory and Adam's moments', and sums the input gradient's
    parts."""
    traced = trace_training_step(_sgd_chain(6, 16, 8), batch_size=2, optimizer=optimizer)
    found = split_candidates(traced.fixed.graph, traced.variables, 2)
    og, g, _, _ = _split_both_ways(traced, found)
    second = found[1]
    assert g.nodes[second.grads.input_grad]["op_type"] == "AddN"
    assert sorted(g.predecessors(second.grads.input_grad)) == [split_name(second.grads.input_grad, i) for i in (0, 1)]
    for n in (*second.grads.weight_grads, *second.grads.unused):
        assert n not in g
    # the step with both split, planned: the first run whole again gets a plan of every node of the step with
    # the second alone split, the first's whole ops (its gradients, update, unused readers, slots) on its
    # join's device; split apart again, a plan of every node of the step with both split
    a = {v: "/d:0" for v in g}
    a[found[0].op] = "/d:1"
    one = split_graph(og, [second])
    out = rejoined(a, [found[0]], one.nodes)
    assert out is not None and set(out) == set(one)
    assert {out[n] for n in (found[0].op, found[0].placeholder, *found[0].grads.ops, *found[0].grads.slots)} == {"/d:1"}
    back = split_apart(out, [found[0]], ["/d:0", "/d:1"], g.nodes)
    assert back is not None and set(back) == set(g)
    write = second.grads.update[-1]
    assert g.nodes[write]["op_type"] == "NoOp" and g.nodes[split_name(write, 1)]["colocation"] == \
        split_name(second.placeholder, 1)
    assert len(second.grads.slots) == (0 if optimizer == "sgd" else 2)
    for ph in second.placeholders:
        assert ph not in g
        assert sum(g.nodes[split_name(ph, i)]["memory_bytes"] for i in (0, 1)) == og.nodes[ph]["memory_bytes"]


@pytest.mark.parametrize("optimizer", ["momentum", "adam", "adamw"])
def test_a_tables_dense_update_in_the_op_graph_matches_the_rewrite(optimizer):
    """The op graph's split of a table Adam (or momentum) updates names the nodes the rewrite makes (the parts'
    local ids are helpers), shards the table's and its slots' memory by rows, and gives each part's sum a shard's
    bytes."""
    traced = trace_training_step(_table_model(4, 40, 8), batch_size=2, optimizer=OPTIMIZERS[optimizer]())
    found = [sp for sp in split_candidates(traced.fixed.graph, traced.variables, 2) if sp.kind == "rows"]
    og, g, gd, shards = _split_both_ways(traced, found)
    assert any(helper_owner(n.name) and n.op == "SelectV2" for n in gd.node)  # each part's local ids
    sp = found[0]
    assert {(sh.start, sh.stop, sh.axis) for sh in shards} == {(0, 20, 0), (20, 40, 0)}
    for total in sp.grads.weight_grads:
        assert total not in g
        for i in (0, 1):
            assert g.nodes[split_name(total, i)]["output_bytes"] * 2 == og.nodes[total]["output_bytes"]
    for ph in sp.placeholders:
        assert ph not in g
        assert sum(g.nodes[split_name(ph, i)]["memory_bytes"] for i in (0, 1)) == og.nodes[ph]["memory_bytes"]
    write = next(u for u in sp.grads.update if og.nodes[u]["op_type"].startswith("Assign") and
                 sp.placeholder in og.predecessors(u))  # the table's (Adam subtracts, momentum adds)
    assert g.nodes[write]["op_type"] == "NoOp" and g.nodes[split_name(write, 1)]["colocation"] == \
        split_name(sp.placeholder, 1)


def test_an_update_that_reads_the_whole_gradient_keeps_the_product_whole():
    model = _sgd_chain(6, 16, 8)
    for optimizer in (keras.optimizers.SGD(0.1, global_clipnorm=1.0), keras.optimizers.Adam(clipnorm=1.0)):
        t = trace_training_step(model, batch_size=2, optimizer=optimizer)
        assert split_candidates(t.fixed.graph, t.variables, 2) == []
    t = trace_training_step(model, batch_size=2, optimizer=keras.optimizers.SGD(0.1, momentum=0.9))
    assert [len(s.grads.slots) for s in split_candidates(t.fixed.graph, t.variables, 2)] == [1, 1]


def _wide_sgd(optimizer: keras.optimizers.Optimizer) -> keras.Model:
    """A 64 → 3000 dense layer (a 768,000-byte kernel) between two small ones, seeded, compiled with ``optimizer``."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu", name="a"),
                              keras.layers.Dense(3000, activation="relu", name="wide"),
                              keras.layers.Dense(2, name="b")])
    model.compile(optimizer=optimizer, loss="mse")
    return model


def _trains_as_model_fit(placed, reference, seed: int, rows: int) -> None:
    """Two epochs of ``fit`` (batch 8) on ``rows`` random rows: ``placed``'s losses and weights (gathered from
    any shards) equal ``reference``'s, the same model trained by ``model.fit``, within 1e-5."""
    rng = np.random.default_rng(seed)
    x, y = rng.standard_normal((rows, 32)).astype("float32"), rng.standard_normal((rows, 2)).astype("float32")
    ours = placed.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0).history["loss"]
    theirs = reference.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0).history["loss"]
    np.testing.assert_allclose(ours, theirs, rtol=1e-5)
    for w, r in zip(placed.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(w, r, rtol=1e-5, atol=1e-6)


def test_a_dense_layer_larger_than_every_device_is_split_and_trains_as_model_fit(devices):
    devs = [placer.DeviceSpec(d, memory_bytes=700_000) for d in devices]
    model, reference = _wide_sgd(keras.optimizers.SGD(0.05)), _wide_sgd(keras.optimizers.SGD(0.05))
    placed = placer.autoplace(model, devs, batch_size=8, training=True, time_limit_s=1)
    op = next(iter(placed.plan.splits))
    assert "wide" in op and placed.plan.splits == {op: 4}
    _trains_as_model_fit(placed, reference, seed=0, rows=48)
    step = next(e for e in placed.placement.functions.emitted() if e.step == "train")
    nodes = {n.name: n for n in step.graph_def.node}
    assert {s.variable for s in step.shards}.isdisjoint(nodes)  # no whole kernel in the step
    writes = [n for n in nodes.values() if n.op == "AssignSubVariableOp" and n.input[0] in
              {s.placeholder for s in step.shards}]
    assert len(writes) == 4 and len({n.device for n in writes}) == 4  # each shard updated where it lives
    # a global-norm clip reads every gradient whole: the kernel cannot be split, and the error says why
    with pytest.raises(InsufficientMemoryError, match="global-norm clip"):
        placer.autoplace(_wide_sgd(keras.optimizers.SGD(0.05, global_clipnorm=1.0)), devs, batch_size=8,
                         training=True, time_limit_s=1)


def test_a_step_whose_weights_fit_but_whose_peak_does_not_is_split_to_fit_and_trains_as_model_fit(devices):
    """Every weight fits a device (about 810,000 bytes against 1,200,000), but the step's peak on the wide
    kernel's device (kernel, its gradient and the layer's activations: about 1.7 MB) fits none: refused with
    ``splits="none"`` (the error says splits would be tried), split to fit by default, trained as ``model.fit``."""
    devs = [placer.DeviceSpec(d, memory_bytes=1_200_000) for d in devices]
    model, reference = _wide_sgd(keras.optimizers.SGD(0.05)), _wide_sgd(keras.optimizers.SGD(0.05))
    assert sum(int(np.prod(w.shape)) * 4 for w in model.weights) < 1_200_000
    with pytest.raises(InsufficientMemoryError, match="predicted peak.*splits='none'"):
        placer.autoplace(model, devs, batch_size=8, training=True, time_limit_s=1, splits="none")
    placed = placer.autoplace(model, devs, batch_size=8, training=True, time_limit_s=1)
    assert list(placed.plan.splits.values()) == [4] and "wide" in next(iter(placed.plan.splits))
    assert any("predicted peak under its memory" in line for line in placed.plan.log)
    assert max(d["predicted_peak_memory_bytes"] for d in placed.report_data["devices"]) <= 1_200_000
    _trains_as_model_fit(placed, reference, seed=2, rows=32)


def test_a_peak_that_fits_only_split_is_refused_where_splits_are_off_or_nothing_can_split(devices):
    """The same step (weights fit, peak fits no placement of whole ops) where no split may be tried: one device
    asked for, copies asked for, or no op that a rule can split (a global-norm clip reads every gradient whole):
    each a typed error that says so and what to change."""
    devs = [placer.DeviceSpec(d, memory_bytes=1_200_000) for d in devices]
    with pytest.raises(InsufficientMemoryError, match="with algorithm='single' no layer is split"):
        placer.autoplace(_wide_sgd(keras.optimizers.SGD(0.05)), devs, batch_size=8, training=True,
                         time_limit_s=1, algorithm="single")
    with pytest.raises(InsufficientMemoryError, match="with replicas=2 no layer is split"):
        placer.autoplace(_wide_sgd(keras.optimizers.SGD(0.05)), devs, batch_size=8, training=True,
                         time_limit_s=1, replicas=2)
    with pytest.raises(InsufficientMemoryError, match="No op can be split to lower the peak"):
        placer.autoplace(_wide_sgd(keras.optimizers.SGD(0.05, global_clipnorm=1.0)), devs, batch_size=8,
                         training=True, time_limit_s=1)


def test_a_peak_that_no_split_brings_under_the_devices_memory_is_refused_saying_what_was_tried(devices):
    """The weights fit a device, but at batch 2048 the wide layer's activations alone (about 24 MB) exceed four
    devices of 1.2 MB however it is split: a typed error naming what was tried, before anything runs."""
    devs = [placer.DeviceSpec(d, memory_bytes=1_200_000) for d in devices]
    with pytest.raises(InsufficientMemoryError, match=r"Tried: the \d+ splittable ops' weights split 4 ways"):
        placer.autoplace(_wide_sgd(keras.optimizers.SGD(0.05)), devs, batch_size=2048, training=True,
                         time_limit_s=1)


def test_adams_moments_of_a_split_kernel_are_sharded_with_it_and_train_as_model_fit(devices):
    """The kernel fits a device but not with Adam's two moments (3 × 768,000 bytes against 2,000,000): split with
    its moments, each part updating its shards of the three; ``fit`` and the optimizer's state as ``model.fit``'s."""
    devs = [placer.DeviceSpec(d, memory_bytes=2_000_000) for d in devices]
    model, reference = _wide_sgd(keras.optimizers.Adam(1e-3)), _wide_sgd(keras.optimizers.Adam(1e-3))
    placed = placer.autoplace(model, devs, batch_size=8, training=True, time_limit_s=1)
    assert len(placed.plan.splits) == 1 and "wide" in next(iter(placed.plan.splits))
    assert any("with their optimizer slots" in line for line in placed.plan.log)
    _trains_as_model_fit(placed, reference, seed=1, rows=32)
    sharded = [v for v in placed.optimizer.variables if isinstance(v, ReplicatedVariable)]
    assert sorted(v.path.rsplit("_", 1)[-1] for v in sharded) == ["momentum", "velocity"]
    assert all(len(v.shards) == 4 for v in sharded)
    for p, r in zip(placed.optimizer.variables, reference.optimizer.variables):  # gathered from the shards
        np.testing.assert_allclose(p.numpy(), r.numpy(), rtol=1e-5, atol=1e-7)


# --- a table larger than every device: split to run at all, trained ------------------------------------------

ROWS, DIM = 6000, 32  # a 768,000-byte table; each device declares 500,000 bytes


def _limited(devices, memory=500_000):
    return [placer.DeviceSpec(d, memory_bytes=memory) for d in devices[:2]]


@pytest.fixture(scope="module")
def trained_split(devices):
    model, reference = recommender(ROWS, DIM), recommender(ROWS, DIM)
    placed = placer.autoplace(model, _limited(devices), batch_size=8, training=True, time_limit_s=1)
    rng = np.random.default_rng(0)
    x = rng.integers(0, ROWS, (80, 6)).astype("int32")
    x[:, 0] = rng.integers(0, 40, 80)  # some rows updated by many steps, and twice in one batch
    y = rng.standard_normal((80, 1)).astype("float32")
    ours = placed.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0).history["loss"]
    theirs = reference.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0).history["loss"]
    return placed, reference, x, ours, theirs


def test_a_table_larger_than_every_device_is_split_and_trains_as_model_fit(trained_split, devices):
    placed, reference, x, ours, theirs = trained_split
    plan = placed.plan
    table_op = next(op for op in plan.splits if "items" in op)
    assert plan.splits == {table_op: 2}
    assert any("exceed every device's memory" in line for line in plan.log)
    np.testing.assert_allclose(ours, theirs, rtol=1e-6)
    for w, r in zip(placed.get_weights(), reference.get_weights()):  # the table gathered from its trained shards
        np.testing.assert_allclose(w, r, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(placed.predict(x, verbose=0), reference.predict(x, verbose=0), rtol=1e-6, atol=1e-7)
    # each shard on its device holds its rows; no planned device reads or updates the whole table
    table = next(w for w in placed.weights if isinstance(w, ReplicatedVariable) and w.shards)
    assert sorted(tf.DeviceSpec.from_string(v.device).device_index for v in table.shards) == [0, 1]
    np.testing.assert_array_equal(np.concatenate([v.numpy() for v in table.shards]), reference.weights[0].numpy())
    step = next(e for e in placed.placement.functions.emitted() if e.step == "train")
    nodes = {n.name: n for n in step.graph_def.node}
    scatters = [n for n in nodes.values() if n.op == "ResourceScatterSub"]
    assert len(scatters) == 2 and all(n.input[0] in {s.placeholder for s in step.shards} for n in scatters)
    assert {nodes[n.input[0]].device for n in scatters} == {n.device for n in scatters}
    assert {s.variable for s in step.shards}.isdisjoint(nodes)  # the whole table's handle is not in the step
    # a write through Keras reaches the shards, and the next step trains on it
    placed.set_weights(reference.get_weights())
    np.testing.assert_array_equal(np.concatenate([v.numpy() for v in table.shards]), reference.weights[0].numpy())


def test_a_trained_split_table_saves_loads_and_syncs_whole(trained_split, tmp_path):
    placed, reference, x, _, _ = trained_split
    y = np.ones((8, 1), "float32")
    placed.train_on_batch(x[:8], y)  # the shards move on; the whole table is gathered when read
    trained = [w.copy() for w in placed.get_weights()]
    path = str(tmp_path / "split.weights.h5")
    placed.save_weights(path)
    other = recommender(ROWS, DIM)
    placed.sync_to(other)
    for a, b in zip(other.get_weights(), trained):
        np.testing.assert_array_equal(a, b)
    placed.train_on_batch(x[8:16], y)  # away from the saved weights …
    placed.load_weights(path)  # … and back: the shards hold the loaded rows again
    table = next(w for w in placed.weights if isinstance(w, ReplicatedVariable) and w.shards)
    np.testing.assert_array_equal(np.concatenate([v.numpy() for v in table.shards]), trained[0])
    np.testing.assert_allclose(placed.predict(x, verbose=0), other.predict(x, verbose=0), rtol=1e-6, atol=1e-7)


def test_a_table_adam_updates_is_split_with_its_moments_and_trains_as_model_fit(devices, tmp_path):
    """Adam updates a table densely (its two moments are table-sized): the table with its moments (2,304,000
    bytes) fits no device of 1,500,000, so it is split with them 4 ways; each part sums the gradient of the ids
    its rows hold and updates its shards of the three where they live; ``fit``, the weights and Adam's state as
    ``model.fit``'s; the moments save and load through Keras' weights file."""
    devs = [placer.DeviceSpec(d, memory_bytes=1_500_000) for d in devices]
    model = recommender(ROWS, DIM, optimizer=keras.optimizers.Adam(1e-2))
    reference = recommender(ROWS, DIM, optimizer=keras.optimizers.Adam(1e-2))
    placed = placer.autoplace(model, devs, batch_size=8, training=True, time_limit_s=1)
    assert list(placed.plan.splits.values()) == [4] and "items" in next(iter(placed.plan.splits))
    assert max(d["predicted_peak_memory_bytes"] for d in placed.report_data["devices"]) <= 1_500_000
    rng = np.random.default_rng(3)
    x = rng.integers(0, ROWS, (48, 6)).astype("int32")
    x[:, 0] = rng.integers(0, 40, 48)  # rows updated by many steps, and twice in one batch
    y = rng.standard_normal((48, 1)).astype("float32")
    ours = placed.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0).history["loss"]
    theirs = reference.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0).history["loss"]
    np.testing.assert_allclose(ours, theirs, rtol=1e-5)
    for w, r in zip(placed.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(w, r, rtol=1e-5, atol=1e-6)
    sharded = [v for v in placed.optimizer.variables if isinstance(v, ReplicatedVariable)]
    assert sorted(v.path.rsplit("_", 1)[-1] for v in sharded) == ["momentum", "velocity"]
    for p, r in zip(placed.optimizer.variables, reference.optimizer.variables):  # gathered from the shards
        np.testing.assert_allclose(p.numpy(), r.numpy(), rtol=1e-5, atol=1e-7)
    step = next(e for e in placed.placement.functions.emitted() if e.step == "train")
    nodes = {n.name: n for n in step.graph_def.node}
    assert {s.variable for s in step.shards}.isdisjoint(nodes)  # no whole table or moment in the step
    sums = [n for n in nodes.values() if n.op == "UnsortedSegmentSum"]
    assert len(sums) == 8 and len({n.device for n in sums}) == 4  # values and squares, one of each per shard
    writes = [n for n in nodes.values() if n.op.startswith("Assign") and n.input[0] in
              {s.placeholder for s in step.shards}]
    assert len(writes) == 12 and all(n.device == nodes[n.input[0]].device for n in writes)
    # Keras' weights file holds the moments gathered from their shards; loading it writes the shards again
    saved = [v.numpy().copy() for v in placed.optimizer.variables]
    placed.save_weights(str(tmp_path / "adam.weights.h5"))
    placed.train_on_batch(x[:8], y[:8])
    placed.load_weights(str(tmp_path / "adam.weights.h5"))
    for v, value in zip(placed.optimizer.variables, saved):
        np.testing.assert_array_equal(v.numpy(), value)
    for v in sharded:
        np.testing.assert_array_equal(np.concatenate([s.numpy() for s in v.shards]), v.numpy())


def test_a_table_no_device_holds_is_refused_without_splits(devices):
    with pytest.raises(InsufficientMemoryError, match="items.*splits='auto'"):
        placer.autoplace(recommender(ROWS, DIM), _limited(devices), batch_size=8, training=True, splits="none",
                         time_limit_s=1)


def test_attention_projections_are_split_by_heads(devices):
    # MultiHeadAttention's query/key/value/output projections are EinsumDense layers: the first three split by
    # whole heads, the output projection (kernel (heads, h, d) read as (heads·h, d)) by d
    keras.utils.set_random_seed(3)
    inp = keras.Input((6, 32))
    model = keras.Model(inp, keras.layers.MultiHeadAttention(4, 16, name="mha")(inp, inp))
    placed = placer.autoplace(model, devices[:2], batch_size=2, splits="all", split_min_bytes=1000, time_limit_s=1)
    split = sorted(op.split("/")[-2] for op in placed.plan.splits)
    assert split == ["attention_output_1", "key_1", "query_1", "value_1"], split
    x = np.random.default_rng(4).standard_normal((2, 6, 32)).astype("float32")
    np.testing.assert_allclose(placed(x).numpy(), model(x).numpy(), rtol=1e-5, atol=1e-6)


def test_variables_travel_in_pieces_of_rows(devices, monkeypatch):
    from cost_models import profile
    from placer.tf import remote

    monkeypatch.setattr(profile, "PIECE_BYTES", 64)  # 3 rows of 5 float32 per piece
    assert profile.row_pieces((37, 5), 4)[:2] == [(0, 3), (3, 6)] and profile.row_pieces((37, 5), 4)[-1] == (36, 37)
    rng = np.random.default_rng(7)
    for shape in [(37, 5), (9, 2, 3), (), (2,)]:
        value = tf.constant(rng.standard_normal(shape).astype("float32"))
        v = remote.variable_on(devices[1], value)
        assert tf.DeviceSpec.from_string(v.device).device_index == 1 and not v.trainable
        np.testing.assert_array_equal(v.numpy(), value.numpy())
        np.testing.assert_array_equal(remote.read_rows(v).numpy(), value.numpy())


def test_inconsistent_splits_are_refused():
    # a product split through a reshape that does not feed it alone, and shards that leave rows uncovered
    g = nx.DiGraph()
    for name, kind in [("w", "Placeholder"), ("r", "ReadVariableOp"), ("shape", "Const"), ("rs", "Reshape"),
                       ("m", "BatchMatMulV2"), ("other", "Identity")]:
        g.add_node(name, compute_us=1.0, op_type=kind)
    g.add_edges_from([("w", "r"), ("r", "rs"), ("shape", "rs"), ("rs", "m"), ("r", "other")], bytes=4)
    with pytest.raises(GraphError, match="does not feed rs alone"):
        split_graph(g, [Split("m", read="r", placeholder="w", columns=4, parts=2, reshape="rs")])
    with pytest.raises(GraphError, match="through a reshape"):
        Split("m", read="r", placeholder="w", columns=4, parts=2, kind="rows", reshape="rs")
    grads = Gradients(("gw",), None, ("update",))
    for other in (dict(reshape="rs"), dict(pair=Pair("b", "rb", "pb"))):
        with pytest.raises(GraphError, match=r"only an unpaired product read without a reshape \(or a lookup\)"):
            Split("m", read="r", placeholder="w", columns=4, parts=2, grads=grads, **other)
    with pytest.raises(GraphError, match="a lookup's ids have no gradient"):
        Split("m", read="r", placeholder="w", columns=4, parts=2, kind="rows", grads=Gradients(("gw",), "gx", ()))
    with pytest.raises(GraphError, match="not both"):
        Split("m", read="r", placeholder="w", columns=4, parts=2, kind="rows", grads=grads, updates=("scatter",))
    table = ReplicatedVariable(tf.reshape(tf.range(12.0), (6, 2)), name="t")
    table.shard_on(Shard("p/autoplace_split_0", "p", "/CPU:0", 0, 3, axis=0, pieces=True))
    table.mark_trained()  # one shard of two: its rows 3-5 are nowhere
    for _ in range(2):  # and again: never the stale whole value instead
        with pytest.raises(GraphError, match=r"cover \[\(0, 3\)\] of its 6 entries.*place the model again"):
            table.numpy()
