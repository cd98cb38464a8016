"""Synthetic cost-annotated graphs for tests and benchmarks (no TensorFlow).

:func:`training_graph` builds the shape of a training step: a chain of
layers (with skip connections), each with a variable, a read, forward ops,
mirrored gradient ops that consume the forward activations, and an
optimizer update colocated with its variable. Costs are drawn from
log-normal distributions; everything is seeded.

Examples
--------
>>> g = training_graph(layers=3, ops_per_layer=2, seed=0)
>>> g.number_of_nodes(), g.number_of_edges()
(21, 25)
>>> sorted({g.nodes[v]["colocation"] for v in g if g.nodes[v].get("colocation")})
['var0', 'var1', 'var2']
"""

from __future__ import annotations

import networkx as nx
import numpy as np

from .attrs import BYTES, COLOCATION, COMPUTE_US, LAYER, MEMORY_BYTES


def training_graph(layers: int, ops_per_layer: int, seed: int = 0, *, compute_us: float = 100.0,
                   activation_bytes: float = 1e6, variable_bytes: float = 4e6, skip_prob: float = 0.2) -> nx.DiGraph:
    """A training-step-shaped DAG with ``layers * (2 * ops_per_layer + 3)`` nodes.

    Parameters
    ----------
    layers, ops_per_layer : int
        Depth and forward ops per layer (the backward pass mirrors them).
    seed : int
        Random seed for costs and skip connections.
    compute_us, activation_bytes, variable_bytes : float
        Medians of the log-normal op times, tensor sizes and variable sizes.
    skip_prob : float
        Chance that a layer also consumes the output of the layer two back.
    """
    rng = np.random.default_rng(seed)
    g = nx.DiGraph()

    def op(name: str, layer: str, scale: float = 1.0, **attrs) -> str:
        g.add_node(name, **{COMPUTE_US: float(compute_us * scale * rng.lognormal(0, 0.8)), LAYER: layer}, **attrs)
        return name

    def edge(u: str, v: str, scale: float = 1.0) -> None:
        g.add_edge(u, v, **{BYTES: float(activation_bytes * scale * rng.lognormal(0, 0.5))})

    outs: list[str] = []
    fwd: list[list[str]] = []
    reads: list[str] = []
    for i in range(layers):
        scope = f"layer{i}"
        var_bytes = float(variable_bytes * rng.lognormal(0, 0.7))
        var = op(f"{scope}/var", scope, 0.0, **{MEMORY_BYTES: var_bytes, COLOCATION: f"var{i}"})
        read = op(f"{scope}/read", scope, 0.01, **{COLOCATION: f"var{i}"})
        g.add_edge(var, read, **{BYTES: 0.0})
        chain = []
        for j in range(ops_per_layer):
            v = op(f"{scope}/op{j}", scope)
            edge(read if j == 0 else chain[-1], v, var_bytes / activation_bytes if j == 0 else 1.0)
            chain.append(v)
        if outs:
            edge(outs[-1], chain[0])
        if len(outs) >= 2 and rng.random() < skip_prob:
            edge(outs[-2], chain[0])
        outs.append(chain[-1])
        fwd.append(chain)
        reads.append(read)
    grad_in = None
    for i in reversed(range(layers)):
        scope = f"gradients/layer{i}"
        prev = grad_in
        for j in reversed(range(ops_per_layer)):
            v = op(f"{scope}/op{j}_grad", scope, 2.0)
            edge(fwd[i][j], v)
            if prev is not None:
                edge(prev, v)
            prev = v
        grad_in = prev
        var_bytes = g.nodes[f"layer{i}/var"][MEMORY_BYTES]
        apply = op(f"layer{i}/apply", f"layer{i}", 0.2, **{MEMORY_BYTES: 2 * var_bytes, COLOCATION: f"var{i}"})
        g.add_edge(prev, apply, **{BYTES: var_bytes})
    return g
