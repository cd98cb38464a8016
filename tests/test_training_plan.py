"""A traced training step (forward, loss, gradients, Adam) is planned through the graph API."""

import keras
import numpy as np

import placer
from placer.tf.costs import ProfileOptions, compute_costs
from placer.tf.opgraph import build_op_graph
from placer.tf.trace import trace_training_step


def test_training_step_graph_is_planned_with_optimizer_state_colocated(tmp_path):
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(32, activation="relu"), keras.layers.Dense(4)], name="train_mlp")
    traced = trace_training_step(model, batch_size=8)
    types = {op.type for op in traced.fixed.graph.get_operations()}
    assert {"MatMul", "ResourceApplyAdam"} <= types or "AssignVariableOp" in types
    # kernel + bias per layer, Adam's two slots each, plus the iteration counter and learning rate
    assert len(traced.variables) == 3 * 2 * 3 + 2
    costs = compute_costs(traced, ["CPU"], ProfileOptions(repeats=1, seed=0, cache=False))
    og = build_op_graph(traced, costs.us)
    resident = sum(og.graph.nodes[v]["memory_bytes"] for v in og.graph)
    assert resident >= 3 * sum(int(np.prod(w.shape)) * 4 for w in model.trainable_weights)
    devices = [placer.DeviceSpec(f"/CPU:{i}", memory_bytes=int(0.7 * resident) + 4096) for i in range(2)]
    p = placer.solve(og.graph, devices, objective="throughput", time_limit_s=2)
    assert set(p.assignment) == set(og.graph.nodes)
    # every variable handle shares a device with everything colocated with it (reads, updates, slots)
    for v in og.graph:
        key = og.graph.nodes[v]["colocation"]
        if key is not None:
            assert p.assignment[v] == p.assignment[key]
    assert max(p.device_memory_bytes) <= 0.7 * resident + 4096
    # the same graph round-trips through the JSON format and plans identically
    placer.save_graph(tmp_path / "train.json", og.graph, devices)
    g2, d2 = placer.load_graph(tmp_path / "train.json")
    assert placer.solve(g2, d2, objective="throughput", time_limit_s=2).value == p.value
