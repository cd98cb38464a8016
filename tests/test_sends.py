"""Prompt sends (``placer.tf.rewrites.sends``): acknowledgements on random placed graphs, and which transfers get one.

Pure GraphDef rewrites; nothing runs. The two-worker run (losses equal to ``model.fit``, acknowledgements
present with ``sends="prompt"`` and absent with ``"executor"``) is in ``tests/cluster_check.py``.
"""

import networkx as nx
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import placer
from placer.tf.graphdef import ACK_SCOPE, dependency_graph
from placer.tf.graphdef import source as _source
from placer.tf.rewrites.sends import SendRule, prompt_sends

DEVICES = [f"/job:worker/replica:0/task:{i}/device:CPU:0" for i in range(3)]


def graph_def(spec):
    """``spec``: per node (device index, op, inputs as (earlier node index, control?))."""
    gd = tf.compat.v1.GraphDef()
    for i, (dev, op, inputs) in enumerate(spec):
        gd.node.add(name=f"n{i}", op=op, device=DEVICES[dev],
                    input=[f"^n{j}" if control else f"n{j}" for j, control in inputs])
    return gd


@st.composite
def placed_graphs(draw):
    n = draw(st.integers(2, 24))
    spec = []
    for i in range(n):
        op = "Placeholder" if i == 0 else draw(st.sampled_from(["Relu", "Relu", "MatMul", "ReadVariableOp"]))
        inputs = [] if i == 0 else sorted(set(draw(st.lists(
            st.tuples(st.integers(0, i - 1), st.booleans()), min_size=1, max_size=3))))
        spec.append((draw(st.integers(0, 2)), op, inputs))
    seconds = draw(st.lists(st.floats(0.0, 2e-3), min_size=n, max_size=n))
    return spec, seconds


def rewrite(spec, seconds, **rule):
    gd = graph_def(spec)
    done = prompt_sends(gd, lambda name, port: tf.float32,
                        SendRule(seconds=lambda name: seconds[int(name[1:])] if name[1:].isdigit() else 0.0, **rule))
    return gd, done


@settings(max_examples=300, deadline=None)
@given(placed_graphs())
def test_acknowledgements_keep_the_graph_acyclic_and_wait_only_on_the_sender(case):
    spec, seconds = case
    before = dependency_graph(graph_def(spec))
    gd, done = rewrite(spec, seconds)
    assert nx.is_directed_acyclic_graph(dependency_graph(gd))
    nodes = {n.name: n for n in gd.node}
    acks = [n for n in gd.node if n.name.startswith(ACK_SCOPE)]
    assert len(acks) == done.acknowledged
    waits = 0
    for ack in acks:
        (tensor,) = ack.input  # an Identity of the transferred tensor, on the receiving process, kept by Grappler
        producer = nodes[_source(tensor)[0]]
        assert ack.op == "Identity" and ack.device != producer.device and ack.attr["_grappler_do_not_remove"].b
        assert any(tensor in n.input for n in gd.node if n.device == ack.device and n is not ack)
        waiting = [n for n in gd.node if f"^{ack.name}" in n.input]
        waits += len(waiting)
        for n in waiting:  # ops of the sending process that do not feed the producer
            assert n.device == producer.device
            assert n.name not in nx.ancestors(before, producer.name)
    assert waits == done.control_edges
    again, _ = rewrite(spec, seconds)
    assert [(n.name, list(n.input)) for n in again.node] == [(n.name, list(n.input)) for n in gd.node]


@settings(max_examples=100, deadline=None)
@given(placed_graphs())
def test_nothing_is_acknowledged_within_a_process_or_when_the_rule_excludes_it(case):
    spec, seconds = case
    for rule in (dict(crosses=lambda a, b: False), dict(eligible=lambda name: False), dict(min_work_s=1e9)):
        gd, done = rewrite(spec, seconds, **rule)
        assert done.acknowledged == done.control_edges == 0
        assert [(n.name, list(n.input)) for n in gd.node] == [(n.name, list(n.input)) for n in graph_def(spec).node]


def test_a_stage_boundary_is_acknowledged_and_its_siblings_wait():
    # worker 0: x -> a -> b -> act (sent to worker 1); dw reads a beside b (a weight gradient beside the
    # input gradient): it must wait, as must act's local consumer
    spec = [(0, "Placeholder", []), (0, "Relu", [(0, False)]), (0, "Relu", [(1, False)]), (0, "Relu", [(2, False)]),
            (0, "MatMul", [(1, False)]), (0, "Relu", [(3, False)]), (1, "MatMul", [(3, False)]),
            (1, "Relu", [(6, False)])]
    gd, done = rewrite(spec, [0, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3])
    assert done.acknowledged == 1
    waiting = sorted(n.name for n in gd.node if any(x.startswith(f"^{ACK_SCOPE}/n3/") for x in n.input))
    assert waiting == ["n4", "n5"]


def test_work_that_needs_only_variables_does_not_hide_a_stage_boundary():
    """The receiving stage starts with a batch normalisation whose scale (``Rsqrt`` of a variable) is computed
    there from the variable alone: the work after the boundary counts it as ready, so the boundary is
    acknowledged (none of a ResNet50 pipeline's boundaries was, 2026-12-05)."""
    spec = [(0, "Placeholder", []), (0, "Relu", [(0, False)]), (0, "Relu", [(1, False)]),
            (1, "ReadVariableOp", []), (1, "Rsqrt", [(3, False)]), (1, "MatMul", [(2, False), (3, False)]),
            (1, "Mul", [(5, False), (4, False)]), (1, "Relu", [(6, False)])]
    gd, done = rewrite(spec, [0, 1e-3, 1e-3, 0, 1e-5, 0.5e-3, 0.6e-3, 1e-5])
    assert done.acknowledged == 1 and done.transfers[0][0] == "n2"


def test_a_tensor_whose_receiver_waits_for_more_from_the_sender_is_not_acknowledged():
    # labels (n1) go to worker 1 early, but the loss there (n4) also needs the activation (n2 -> n3):
    # only the activation's transfer is acknowledged, not the labels'
    spec = [(0, "Placeholder", []), (0, "Relu", [(0, False)]), (0, "MatMul", [(0, False)]),
            (1, "Relu", [(2, False)]), (1, "MatMul", [(1, False), (3, False)]), (1, "Relu", [(4, False)]),
            (0, "Relu", [(1, False)]), (0, "Relu", [(2, False)])]
    gd, done = rewrite(spec, [0, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3])
    acked = sorted(_source(n.input[0])[0] for n in gd.node if n.name.startswith(ACK_SCOPE))
    assert acked == ["n2"] and done.acknowledged == 1


def test_a_bad_sends_option_says_what_to_use():
    with pytest.raises(placer.AutoplaceError, match="sends must be one of 'auto', 'prompt', 'executor'"):
        placer.autoplace(None, ["/CPU:0"], sends="always")


def test_the_html_report_says_which_transfers_are_acknowledged():
    from placer.reporting.html import _sends

    worker = "/job:worker/replica:0/task:1/device:CPU:0"
    acked = {"prompt": True, "acknowledged": [{"tensor": "dense/Relu:0", "to": worker}]}
    text = _sends({"sends": acked})
    assert "1 cross-process transfer is acknowledged" in text and "dense/Relu:0" in text and "worker:1" in text
    assert "executor" in _sends({"sends": {"prompt": False, "acknowledged": []}})
    assert _sends({}) == ""  # a graph's report (placer.solve) has no sends


def test_the_simulator_runs_an_acknowledged_send_first_and_charges_the_round_trip():
    import numpy as np

    from cost_models import SimOptions, TensorEdge, simulate

    # device 0: a, then the chain b -> c -> d; x on device 1 needs a. One-thread workers (lifo, transfer ops):
    # TensorFlow's order sends a's tensor when device 0's chain ends; acknowledged, at once, and b waits for
    # the acknowledgement's round trip (send and receive CPU, latency both ways)
    d = np.ones((5, 2))
    es = [TensorEdge(0, (1, 4), 8.0), TensorEdge(1, (2,), 8.0), TensorEdge(2, (3,), 8.0)]
    a = [0, 0, 0, 0, 1]
    options = dict(link_latency_s=np.full((2, 2), 0.1))
    sim = dict(ready_order="lifo", transfer_cpu_s=np.full((2, 2), 0.01))
    deferred = simulate(d, es, a, lambda i, j, b: 0.0, options=SimOptions(**sim), **options)
    prompt = simulate(d, es, a, lambda i, j, b: 0.0, options=SimOptions(acknowledged=((0, 1, (1,)),), **sim),
                      **options)
    start = {v: s for v, _, s, _ in prompt.timeline}
    assert {v: s for v, _, s, _ in deferred.timeline}[4] == pytest.approx(4.12)  # after b, c, d
    assert start[4] == pytest.approx(1.13) and start[1] == pytest.approx(1.24)  # x at once; b after the round trip
    assert prompt.step_time_s == pytest.approx(4.24) and len(prompt.timeline) == 5
    assert [t[0] for t in prompt.transfers] == [0]  # the acknowledgement's own transfer is not listed
    # the receiver's own work may be ready with the acknowledgement: a product whose fused kernel's time sits on
    # the op after it takes 0 s, yet TensorFlow runs the acknowledgement (inexpensive) first, so b does not wait
    # for device 1's chain x -> y (it did in the simulator: the split MLP's Megatron pairs predicted +96%)
    d2 = np.ones((7, 2))
    d2[4] = 0.0  # x: no profiled time of its own
    es2 = [TensorEdge(0, (1, 4), 8.0), TensorEdge(1, (2,), 8.0), TensorEdge(2, (3,), 8.0), TensorEdge(4, (5,), 8.0),
           TensorEdge(5, (6,), 8.0)]
    a2 = [0, 0, 0, 0, 1, 1, 1]
    busy = simulate(d2, es2, a2, lambda i, j, b: 0.0, options=SimOptions(acknowledged=((0, 1, (1,)),), **sim),
                    **options)
    begin = {v: s for v, _, s, _ in busy.timeline}
    assert begin[1] == pytest.approx(1.24) and begin[5] == pytest.approx(1.13)  # side by side, b after the trip
    with pytest.raises(ValueError, match="names a node outside 0..4 or a device outside 0..1"):
        simulate(d, es, a, lambda i, j, b: 0.0, options=SimOptions(acknowledged=((0, 1, (9,)),), **sim), **options)
    with pytest.raises(ValueError, match="sends no tensor to device 0"):
        simulate(d, es, a, lambda i, j, b: 0.0, options=SimOptions(acknowledged=((0, 0, (1,)),), **sim), **options)
