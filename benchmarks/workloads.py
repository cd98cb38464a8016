"""Real Keras workloads for the benchmarks: model builders and their cost-annotated op graphs.

``op_graph(name, training)`` traces the model's forward pass or full
training step (Adam, MSE), profiles every op on this machine's CPU (median
of ``repeats`` runs, Grappler off) and returns the networkx op graph that
:func:`placer.solve` takes, with timings of each stage.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import keras
import networkx as nx

from placer.tf.costs import ProfileOptions, compute_costs
from placer.tf.opgraph import build_op_graph
from placer.tf.trace import trace_model, trace_training_step


def resnet50(size: int = 224) -> keras.Model:
    return keras.applications.ResNet50(weights=None, input_shape=(size, size, 3), classes=1000)


def inception_v3(size: int = 299) -> keras.Model:
    return keras.applications.InceptionV3(weights=None, input_shape=(size, size, 3), classes=1000)


def mobilenet_v2(size: int = 224) -> keras.Model:
    return keras.applications.MobileNetV2(weights=None, input_shape=(size, size, 3), classes=1000)


def transformer_encoder(seq: int = 128, dim: int = 256, heads: int = 4, layers: int = 4) -> keras.Model:
    inp = keras.Input((seq, dim), name="tokens")
    h = inp
    for i in range(layers):
        a = keras.layers.MultiHeadAttention(heads, dim // heads, name=f"attn{i}")(h, h)
        h = keras.layers.LayerNormalization(name=f"ln{i}a")(h + a)
        f = keras.layers.Dense(4 * dim, activation="gelu", name=f"ff{i}a")(h)
        f = keras.layers.Dense(dim, name=f"ff{i}b")(f)
        h = keras.layers.LayerNormalization(name=f"ln{i}b")(h + f)
    return keras.Model(inp, h, name="transformer_encoder")


def lstm_seq2seq(seq: int = 32, features: int = 64, units: int = 256) -> keras.Model:
    enc_in = keras.Input((seq, features), name="encoder_in")
    dec_in = keras.Input((seq, features), name="decoder_in")
    _, h, c = keras.layers.LSTM(units, return_state=True, unroll=True, name="encoder")(enc_in)
    d = keras.layers.LSTM(units, return_sequences=True, unroll=True, name="decoder")(dec_in, initial_state=[h, c])
    out = keras.layers.Dense(features, name="project")(d)
    return keras.Model([enc_in, dec_in], out, name="lstm_seq2seq")


def multi_tower_mlp(towers: int = 8, width: int = 1024, depth: int = 4) -> keras.Model:
    inp = keras.Input((512,), name="features")
    outs = []
    for t in range(towers):
        h = inp
        for j in range(depth):
            h = keras.layers.Dense(width, activation="relu", name=f"tower{t}_{j}")(h)
        outs.append(h)
    out = keras.layers.Dense(10, name="head")(keras.layers.Concatenate(name="join")(outs))
    return keras.Model(inp, out, name="multi_tower_mlp")


def two_branch_cnn(size: int = 64, width: int = 64, depth: int = 4) -> keras.Model:
    """Two convolutional branches (3x3 and 5x5 kernels) over one image, joined before the classifier."""
    inp = keras.Input((size, size, 3), name="image")
    branches = []
    for b, kernel in enumerate((3, 5)):
        h = inp
        for j in range(depth):
            h = keras.layers.Conv2D(width, kernel, padding="same", activation="relu", name=f"b{b}_conv{j}")(h)
            if j % 2 == 1:
                h = keras.layers.MaxPooling2D(name=f"b{b}_pool{j}")(h)
        branches.append(keras.layers.GlobalAveragePooling2D(name=f"b{b}_gap")(h))
    h = keras.layers.Concatenate(name="join")(branches)
    out = keras.layers.Dense(10, name="classifier")(keras.layers.Dense(256, activation="relu", name="fc")(h))
    return keras.Model(inp, out, name="two_branch_cnn")


def dense_cnn(size: int = 32, blocks: int = 3, layers: int = 6, growth: int = 32) -> keras.Model:
    """Densely connected blocks (DenseNet-style): each layer reads the concatenation of all before it."""
    inp = keras.Input((size, size, 3), name="image")
    h = keras.layers.Conv2D(2 * growth, 3, padding="same", name="stem")(inp)
    for b in range(blocks):
        feats = [h]
        for j in range(layers):
            x = feats[0] if len(feats) == 1 else keras.layers.Concatenate(name=f"d{b}_cat{j}")(feats)
            x = keras.layers.BatchNormalization(name=f"d{b}_bn{j}")(x)
            x = keras.layers.Activation("relu", name=f"d{b}_relu{j}")(x)
            feats.append(keras.layers.Conv2D(growth, 3, padding="same", name=f"d{b}_conv{j}")(x))
        h = keras.layers.Concatenate(name=f"d{b}_out")(feats)
        if b < blocks - 1:
            h = keras.layers.Conv2D(2 * growth, 1, name=f"t{b}_conv")(h)
            h = keras.layers.AveragePooling2D(2, name=f"t{b}_pool")(h)
    h = keras.layers.GlobalAveragePooling2D(name="gap")(h)
    return keras.Model(inp, keras.layers.Dense(10, name="classifier")(h), name="dense_cnn")


#: name -> (builder, batch size)
WORKLOADS: dict[str, tuple[Callable[[], keras.Model], int]] = {
    "resnet50": (resnet50, 8),
    "inception_v3": (inception_v3, 8),
    "mobilenet_v2": (mobilenet_v2, 8),
    "transformer": (transformer_encoder, 8),
    "lstm_seq2seq": (lstm_seq2seq, 16),
    "multi_tower_mlp": (multi_tower_mlp, 64),
    "two_branch_cnn": (two_branch_cnn, 8),
    "dense_cnn": (dense_cnn, 8),
}


@dataclass(frozen=True)
class Workload:
    name: str
    training: bool
    graph: nx.DiGraph
    trace_s: float
    profile_s: float
    build_s: float


def op_graph(name: str, training: bool, repeats: int = 3, batch: int | None = None) -> Workload:
    """Trace, profile and build the op graph of one workload."""
    builder, default_batch = WORKLOADS[name]
    model = builder()
    t0 = time.perf_counter()
    tracer = trace_training_step if training else trace_model
    traced = tracer(model, batch_size=batch or default_batch)
    t1 = time.perf_counter()
    # Every traced op timed on its own (Grappler off), as in the recorded solver tables; the session profile
    # as it is (no runtime factor, which postdates those tables).
    costs = compute_costs(traced, ["CPU"], ProfileOptions(repeats=repeats, seed=0, grappler=False, cache=False,
                                                          runtime=False)).us
    t2 = time.perf_counter()
    og = build_op_graph(traced, costs)
    t3 = time.perf_counter()
    return Workload(name, training, og.graph, t1 - t0, t2 - t1, t3 - t2)
